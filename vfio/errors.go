package vfio

import (
	"errors"
	"fmt"
	"io/fs"

	"golang.org/x/sys/unix"
)

// Sentinel errors, matched with errors.Is.
var (
	// ErrClosed reports use of a closed Container, Group, Device, Vector or
	// buffer.
	ErrClosed = errors.New("vfio: closed")
	// ErrNotSupported reports something the kernel or the device does not
	// offer: an API version or IOMMU model, a reset, mmap of a region.
	ErrNotSupported = errors.New("vfio: not supported")
	// ErrNoVFIO reports that the VFIO device nodes are missing: the VFIO
	// modules are not loaded.
	ErrNoVFIO = errors.New("vfio: VFIO not available (load the modules: modprobe vfio-pci)")
	// ErrNoIOMMUFD reports that iommufd's node (/dev/iommu) is missing:
	// the kernel lacks CONFIG_IOMMUFD (Linux 6.2+) or the module is not
	// loaded (modprobe iommufd).
	ErrNoIOMMUFD = errors.New("vfio: iommufd not available (/dev/iommu: a kernel with CONFIG_IOMMUFD, modprobe iommufd)")
	// ErrNoCDev reports a function without a VFIO device cdev: the kernel
	// lacks CONFIG_VFIO_DEVICE_CDEV (Linux 6.6+) or the function is not
	// bound to vfio-pci.
	ErrNoCDev = errors.New("vfio: no VFIO device cdev")
	// ErrGroupNotViable reports an IOMMU group with a member bound to a
	// non-VFIO driver; the message names it.
	ErrGroupNotViable = errors.New("vfio: IOMMU group not viable")
	// ErrNotBound reports a PCI function that is not bound to vfio-pci.
	ErrNotBound = errors.New("vfio: device not bound to vfio-pci")
	// ErrBusy reports a group or device already in use (by another
	// process, or already open here).
	ErrBusy = errors.New("vfio: busy")
	// ErrMemlock reports that memory could not be locked or pinned for DMA
	// within RLIMIT_MEMLOCK; the message says how much to allow.
	ErrMemlock = errors.New("vfio: locked-memory limit too low")
	// ErrRange reports an offset, size or IOVA outside what it must lie in.
	ErrRange = errors.New("vfio: out of range")
	// ErrAlignment reports an address or size not aligned as required.
	ErrAlignment = errors.New("vfio: misaligned")
	// ErrIOVASpace reports that the IOVA allocator has no free range large
	// enough.
	ErrIOVASpace = errors.New("vfio: IOVA space exhausted")
)

// OpError is the error type of this package.
type OpError struct {
	Op  string // what was being done: "open group", "map DMA", "wait", ...
	Dev string // "container", "group 5", "0000:00:10.1", ...
	Err error  // the cause; wraps a sentinel and/or an errno
}

func (e *OpError) Error() string {
	s := "vfio: " + e.Op
	if e.Dev != "" {
		s += " " + e.Dev
	}
	return s + ": " + e.Err.Error()
}

func (e *OpError) Unwrap() error { return e.Err }

func opErr(op, dev string, err error) error {
	if err == nil {
		return nil
	}
	return &OpError{Op: op, Dev: dev, Err: err}
}

// wrapf returns an error wrapping both sentinel and cause, with a message.
func wrapf(sentinel, cause error, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if cause == nil {
		return fmt.Errorf("%w: %s", sentinel, msg)
	}
	return fmt.Errorf("%w: %s: %w", sentinel, msg, cause)
}

// permission adds a hint to permission errors from opening VFIO nodes.
func permission(err error, path string) error {
	if errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("%w (opening %s needs root, or ownership of the group node)", err, path)
	}
	return err
}

// isMemErr reports errnos that mean "over the locked-memory limit".
func isMemErr(err error) bool {
	return errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EPERM)
}
