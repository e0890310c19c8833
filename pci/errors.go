package pci

import (
	"errors"
	"fmt"
	"io/fs"
)

// Sentinel errors, matched with errors.Is. The *OpError that carries one
// says what to do about it.
var (
	// ErrInvalidAddr reports a string that is not a PCI address.
	ErrInvalidAddr = errors.New("pci: invalid address")
	// ErrNotFound reports a PCI function that does not exist. The message
	// lists the VMware functions that do.
	ErrNotFound = errors.New("pci: device not found")
	// ErrNoIOMMUGroup reports a function without an IOMMU group: the kernel
	// runs without an IOMMU, so VFIO cannot isolate the device.
	ErrNoIOMMUGroup = errors.New("pci: no IOMMU group (boot the kernel with intel_iommu=on or amd_iommu=on; in a VM give it a vIOMMU, e.g. QEMU -device intel-iommu,intremap=on)")
	// ErrGroupNotViable reports an IOMMU group with a member bound to a
	// driver other than a VFIO one. The message names the member and its
	// driver.
	ErrGroupNotViable = errors.New("pci: IOMMU group not viable")
	// ErrDriverNotLoaded reports that the driver to bind to is not
	// registered with the PCI bus; the message says which module to load.
	ErrDriverNotLoaded = errors.New("pci: driver not loaded")
	// ErrPermission reports that sysfs refused a write: binding needs root
	// (CAP_SYS_ADMIN). The wrapped errno matches fs.ErrPermission too.
	ErrPermission = errors.New("pci: permission denied (binding drivers needs root)")
	// ErrBind reports that the kernel accepted the bind request but the
	// driver did not take the function (its probe refused the device).
	ErrBind = errors.New("pci: driver did not bind")
)

// OpError is the error type of this package: which operation failed on which
// function, and why.
type OpError struct {
	Op  string // "lookup", "bind group", "restore group", ...
	Dev string // the function's address, or the sysfs path when no function applies
	Err error  // wraps a sentinel and/or the errno
}

func (e *OpError) Error() string {
	s := "pci: " + e.Op
	if e.Dev != "" {
		s += " " + e.Dev
	}
	return s + ": " + e.Err.Error()
}

func (e *OpError) Unwrap() error { return e.Err }

// classify wraps err with ErrPermission when it is a permission error, so
// that errors.Is finds both the sentinel and the errno.
func classify(err error) error {
	if errors.Is(err, fs.ErrPermission) && !errors.Is(err, ErrPermission) {
		return fmt.Errorf("%w: %w", ErrPermission, err)
	}
	return err
}
