package wq

import (
	"errors"
	"fmt"
	"github.com/vfrdma/vfrdma/internal/lifecycle"
)

// Sentinel errors of the post path, matched with errors.Is. The root
// package re-exports them.
var (
	// ErrClosed reports use of a closed object: for a post, an invalid
	// handle.
	ErrClosed = lifecycle.ErrClosed
	// ErrInvalid reports a bad argument: a segment outside its MR, too many
	// SGEs, a bad size.
	ErrInvalid = errors.New("vfrdma: invalid argument")
	// ErrQueueFull reports a work queue with no room (insufficient
	// resources): as many requests are outstanding as it accepts.
	ErrQueueFull = errors.New("vfrdma: queue full")
	// ErrProtection reports a protection violation: an SGE's MR belongs to
	// another protection domain than the queue.
	ErrProtection = errors.New("vfrdma: protection violation")
	// ErrPrivileges reports a privileges violation: an SGE's local key
	// names no registered MR, or a receive names an MR without local write.
	ErrPrivileges = errors.New("vfrdma: privileges violation")
	// ErrBusy reports an object that other live objects or outstanding
	// work still use.
	ErrBusy = errors.New("vfrdma: in use")
)

// Invalidf returns an error wrapping ErrInvalid.
func Invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// PostError is the error of a post that refused a work request: the ones
// before it in the call were posted (and, with every earlier deferred one,
// handed to the device); this one and the ones after it were not, and make
// no completion.
type PostError struct {
	Queue string // "QP 17", "SRQ 3"
	Index int    // the refused request's index in the call (-1: the doorbell itself failed)
	WRID  uint64 // its wr_id
	Err   error
}

func (e *PostError) Error() string {
	return fmt.Sprintf("vfrdma post on %s: work request %d (wr_id %#x): %v", e.Queue, e.Index, e.WRID, e.Err)
}

// Unwrap returns the cause.
func (e *PostError) Unwrap() error { return e.Err }
