package vfrdma

import (
	"errors"
	"fmt"

	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/vfio"
	"github.com/vfrdma/vfrdma/wq"
)

// Sentinel errors, matched with errors.Is.
var (
	// ErrClosed reports use of a closed Device or object.
	ErrClosed = wq.ErrClosed
	// ErrNotSupported reports something the device does not do.
	ErrNotSupported = firmware.ErrNotSupported
	// ErrDeviceFault reports a device that broke its protocol: an index out
	// of range, a response that does not match its request.
	ErrDeviceFault = firmware.ErrDeviceFault
	// ErrInvalid reports a bad argument; the error says which and why.
	ErrInvalid = wq.ErrInvalid
	// ErrBusy reports an object that other live objects, or work still
	// outstanding, use.
	ErrBusy = wq.ErrBusy
	// ErrQueueFull reports a work queue with no room: as many requests are
	// outstanding (posted and not yet polled from the CQ) as it accepts.
	ErrQueueFull = wq.ErrQueueFull
	// ErrProtection reports a work request naming an MR of another
	// protection domain than its queue's.
	ErrProtection = wq.ErrProtection
	// ErrPrivileges reports a work request naming a local key that no MR
	// has, or a receive naming an MR without AccessLocalWrite.
	ErrPrivileges = wq.ErrPrivileges
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

func invalidf(format string, args ...any) error { return wq.Invalidf(format, args...) }
