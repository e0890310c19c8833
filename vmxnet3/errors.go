package vmxnet3

import (
	"errors"
	"fmt"
	"github.com/vfrdma/vfrdma/internal/lifecycle"
)

// Sentinel errors, matched with errors.Is.
var (
	// ErrInvalid reports a bad argument or option.
	ErrInvalid = errors.New("vmxnet3: invalid argument")
	// ErrFrameSize reports a frame shorter than an Ethernet header or
	// longer than MaxFrame.
	ErrFrameSize = errors.New("vmxnet3: bad frame size")
	// ErrRingFull reports a transmit ring with every descriptor in flight.
	ErrRingFull = errors.New("vmxnet3: transmit ring full")
	// ErrShortBuffer reports a receive buffer smaller than the frame due
	// in it; the frame stays queued.
	ErrShortBuffer = errors.New("vmxnet3: receive buffer too small")
	// ErrLinkDown reports a link that is down.
	ErrLinkDown = errors.New("vmxnet3: link down")
	// ErrUnsupported reports what the device or this NIC does not offer.
	ErrUnsupported = errors.New("vmxnet3: not supported")
	// ErrDevice reports a command the device refused.
	ErrDevice = errors.New("vmxnet3: device refused")
	// ErrDeviceFault reports a value the device wrote that cannot be right
	// (a completion out of order, an index out of range).
	ErrDeviceFault = errors.New("vmxnet3: device fault")
	// ErrClosed reports use of a closed NIC. It is the driver's one
	// ErrClosed (vfrdma.ErrClosed matches it).
	ErrClosed = lifecycle.ErrClosed
)

// OpError is the error of a NIC operation: which function, what it was
// doing, and why.
type OpError struct {
	Op  string
	Dev string
	Err error
}

func (e *OpError) Error() string { return fmt.Sprintf("vmxnet3 %s: %s: %v", e.Dev, e.Op, e.Err) }

// Unwrap returns the cause.
func (e *OpError) Unwrap() error { return e.Err }

func (n *NIC) opErr(op string, err error) error {
	if err == nil {
		return nil
	}
	return &OpError{Op: op, Dev: n.name, Err: err}
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}
