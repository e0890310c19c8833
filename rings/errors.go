package rings

import (
	"errors"
	"fmt"

	"github.com/vfrdma/vfrdma/internal/devfault"
)

// ErrDeviceFault reports a ring counter the device wrote that cannot be
// right (see IndexError). It is the same error as firmware.ErrDeviceFault
// (and vfrdma.ErrDeviceFault): errors.Is matches either.
var ErrDeviceFault = devfault.Err

// ErrInvalid reports a bad argument to a constructor: a state buffer too
// short or misaligned, an element count that is not a power of two, a
// counter the driver owns already out of range.
var ErrInvalid = errors.New("rings: invalid argument")

// IndexError reports a ring counter the device wrote that cannot be right. It
// wraps ErrDeviceFault, so errors.Is(err, ErrDeviceFault) holds. Nothing was
// produced or consumed when it is returned.
type IndexError struct {
	// Ring names the ring ("SQ", "CQ", ...; see SetName).
	Ring string
	// Field is the counter the device wrote: "cons_head" or "prod_tail".
	Field string
	// Value is what the device wrote.
	Value uint32
	// Slots is the ring's element count n.
	Slots uint32
	// Peer is the driver's own counter the value was checked against: the
	// published prod_tail for a cons_head, the local cons_head for a
	// prod_tail.
	Peer uint32
}

func (e *IndexError) Error() string {
	peer := "prod_tail"
	if e.Field == "prod_tail" {
		peer = "cons_head"
	}
	if e.Value&^(2*e.Slots-1) != 0 {
		return fmt.Sprintf("rings: %s: device wrote %s %#x with bits outside %#x (%d slots): %v",
			e.Ring, e.Field, e.Value, 2*e.Slots-1, e.Slots, ErrDeviceFault)
	}
	return fmt.Sprintf("rings: %s: device wrote %s %#x, more than %d slots from %s %#x: %v",
		e.Ring, e.Field, e.Value, e.Slots, peer, e.Peer, ErrDeviceFault)
}

// Unwrap returns ErrDeviceFault.
func (e *IndexError) Unwrap() error { return ErrDeviceFault }

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}
