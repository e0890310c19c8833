package firmware

import (
	"errors"
	"fmt"
	"strings"
	"syscall"

	"github.com/vfrdma/vfrdma/internal/devfault"
)

// Sentinel errors, matched with errors.Is.
var (
	// ErrNotSupported reports a device, command or feature the device (or
	// this driver) does not support, including a command the device answers
	// with status 0xFFFF (unknown or unimplemented command).
	ErrNotSupported = errors.New("firmware: not supported")
	// ErrDeviceFault reports something the device wrote that cannot be
	// right: a response with the wrong cookie or acknowledgement, a handle
	// or ring index out of range, capabilities that make no sense. It is
	// the same error as rings.ErrDeviceFault, so errors.Is matches a ring
	// index fault against it too.
	ErrDeviceFault = devfault.Err
	// ErrClosed reports use of a Channel after Close.
	ErrClosed = errors.New("firmware: channel closed")
	// ErrInvalid reports a request the driver must not send: a field out of
	// the device's limits, a zero or unaligned DMA address, a slot too small.
	ErrInvalid = errors.New("firmware: invalid argument")
	// ErrDSRNotLoaded reports that the device has not loaded the Device
	// Shared Region: it wrote no capabilities after DSRHIGH, or a command
	// was attempted before LoadDSR.
	ErrDSRNotLoaded = errors.New("firmware: device shared region not loaded")
)

// OpError is the error of a device operation: a command or a bring-up step.
// It wraps a sentinel (ErrDeviceFault, ErrNotSupported, ...), a
// [syscall.Errno] decoded from the device status, a context error, or a
// register access error, so errors.Is and errors.As work through it.
type OpError struct {
	// Op is the operation: a command name ("CREATE_QP") or a step
	// ("load DSR", "CTL ACTIVATE").
	Op string
	// Device names the device (Options.Device); it may be empty.
	Device string
	// Status is the value of the ERR register when the device reported a
	// failure through it, else zero.
	Status Status
	// Err is the underlying error.
	Err error
}

func (e *OpError) Error() string {
	var b strings.Builder
	b.WriteString("pvrdma")
	if e.Device != "" {
		b.WriteString(" ")
		b.WriteString(e.Device)
	}
	b.WriteString(": ")
	b.WriteString(e.Op)
	if e.Status != 0 {
		fmt.Fprintf(&b, ": device status %s", e.Status)
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

func (e *OpError) Unwrap() error { return e.Err }

// FieldError reports one field holding a value the driver cannot accept:
// in the device capabilities, in a response, in a ring index the device
// wrote, or in a request the caller built.
type FieldError struct {
	// Where names the structure: "caps", "CREATE_QP response", "CQ
	// notification ring", "CREATE_CQ request", ...
	Where string
	// Field is the field's name as the device header spells it.
	Field string
	// Value is the offending value.
	Value uint64
	// Want says what was expected.
	Want string
	// Err is ErrNotSupported, ErrDeviceFault or ErrInvalid.
	Err error
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("%s.%s = %#x, want %s: %v", e.Where, e.Field, e.Value, e.Want, e.Err)
}

func (e *FieldError) Unwrap() error { return e.Err }

func invalid(where, field string, v uint64, want string) error {
	return &FieldError{Where: where, Field: field, Value: v, Want: want, Err: ErrInvalid}
}

func fault(where, field string, v uint64, want string) error {
	return &FieldError{Where: where, Field: field, Value: v, Want: want, Err: ErrDeviceFault}
}

// Status is the value the device leaves in the ERR register after a
// command: 0 on success, a negative errno as a 32-bit two's-complement
// value, or 0xFFFF for an unknown or unimplemented command (QEMU). A few
// QEMU paths pass a positive errno through.
type Status uint32

// StatusUnsupported is the status of an unknown or unimplemented command.
const StatusUnsupported Status = 0xFFFF

// maxErrno bounds the values read as an errno (Linux's MAX_ERRNO).
const maxErrno = 4095

// Errno returns the errno the status carries, or 0 if it carries none.
func (s Status) Errno() syscall.Errno {
	switch v := int32(s); {
	case v < 0 && v >= -maxErrno:
		return syscall.Errno(-v)
	case v > 0 && v <= maxErrno:
		return syscall.Errno(v)
	}
	return 0
}

func (s Status) String() string {
	switch {
	case s == 0:
		return "0 (ok)"
	case s == StatusUnsupported:
		return "0xffff (unknown or unimplemented command)"
	case s.Errno() != 0:
		return fmt.Sprintf("%#x (errno %d)", uint32(s), int(s.Errno()))
	}
	return fmt.Sprintf("%#x", uint32(s))
}

// err returns the error the status stands for; s must not be 0.
func (s Status) err() error {
	if s == StatusUnsupported {
		return ErrNotSupported
	}
	if e := s.Errno(); e != 0 {
		return e
	}
	return fmt.Errorf("%w: status %#x is neither an errno nor 0xffff", ErrDeviceFault, uint32(s))
}
