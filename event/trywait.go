package event

import "errors"

// A Waiter has its own wait object and a TryWait that arms it: a
// *WaitSet, a *Counter (its FD), a *vfrdma.CQ (its FD).
type Waiter interface {
	TryWait() error
}

// TryWait tries each waiter (fi_trywait over several objects): nil when it
// is safe to sleep on all their wait objects, ErrAgain as soon as one has
// events queued, or the first other error. It tries them all even after
// ErrAgain, so that each is armed and its wait object left right.
func TryWait(ws ...Waiter) error {
	var first error
	for _, w := range ws {
		err := w.TryWait()
		if err == nil {
			continue
		}
		// The first error that is not ErrAgain wins; an ErrAgain only
		// until one comes (every Waiter returns the bare sentinel).
		if first == nil || (errors.Is(first, ErrAgain) && !errors.Is(err, ErrAgain)) {
			first = err
		}
	}
	return first
}
