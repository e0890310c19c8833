package vfrdma

import (
	"errors"
	"fmt"

	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/vfio"
)

// Sentinel errors, matched with errors.Is.
var (
	// ErrClosed reports use of a closed Device or object.
	ErrClosed = errors.New("vfrdma: closed")
	// ErrNotSupported reports something the device does not do.
	ErrNotSupported = firmware.ErrNotSupported
	// ErrDeviceFault reports a device that broke its protocol: an index out
	// of range, a response that does not match its request.
	ErrDeviceFault = firmware.ErrDeviceFault
	// ErrInvalid reports a bad argument; the error says which and why.
	ErrInvalid = errors.New("vfrdma: invalid argument")
	// ErrBusy reports an object that other live objects still use.
	ErrBusy = errors.New("vfrdma: in use")
	// ErrMemlock reports that pinning DMA memory exceeded RLIMIT_MEMLOCK.
	ErrMemlock = vfio.ErrMemlock
)

// OpError is the error type of this package.
type OpError struct {
	Op  string // "open", "create CQ", ...
	Dev string // the PCI address
	Err error
}

func (e *OpError) Error() string { return fmt.Sprintf("vfrdma %s %s: %v", e.Op, e.Dev, e.Err) }

// Unwrap returns the cause.
func (e *OpError) Unwrap() error { return e.Err }

func (d *Device) opErr(op string, err error) error {
	if err == nil {
		return nil
	}
	var oe *OpError
	if errors.As(err, &oe) && oe.Dev == d.name {
		return err
	}
	return &OpError{Op: op, Dev: d.name, Err: err}
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}
