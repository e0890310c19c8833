package vfrdma

import (
	"time"

	"github.com/vfrdma/vfrdma/event"
)

// CQSource is a CQ as the event package sees it: the member that poll sets
// and wait sets take (event.PollSet.Add, event.WaitSet.Add), and the
// source a counter drives (event.Counter.Drive, on a CQ in CQCounted
// mode). CQ.Source returns it; its methods are the event package's
// interfaces (event.Source, event.Synced, event.Driven, event.Spinner),
// which the sets and counters call: a CQ's user calls none of them.
//
// A *CQSource is the *CQ itself under another type: a set holding it
// reaches the CQ's fields with no further load.
type CQSource CQ

var (
	_ event.Source  = (*CQSource)(nil)
	_ event.Synced  = (*CQSource)(nil)
	_ event.Driven  = (*CQSource)(nil)
	_ event.Spinner = (*CQSource)(nil)
)

// Source returns the CQ as an event source. It returns the same value
// every time, so that a set finds the member it was given (Remove); a nil
// CQ's is nil.
func (cq *CQ) Source() *CQSource { return (*CQSource)(cq) }

// CQ returns the CQ the source is.
func (s *CQSource) CQ() *CQ { return (*CQ)(s) }

// Ready reports whether the CQ holds completions (event.Source). With arm
// set, it first arms the CQ unless the driver knows it is armed, so that
// its next completion wakes its watchers. It is safe for concurrent use
// with Poll, and allocates nothing.
func (s *CQSource) Ready(arm bool, _ *uint64) (bool, error) {
	cq := (*CQ)(s)
	if !cq.enter() {
		return false, cq.errClosed("CQ ready")
	}
	defer cq.gate.Exit()
	if arm && !cq.armed.Load() {
		if err := cq.arm(false); err != nil {
			return false, err
		}
	}
	return cq.ready()
}

// Watch makes the CQ wake w whenever the device names it in a
// notification, and whenever the driver has flush completions for it
// (event.Source). It starts the goroutine that takes the CQ interrupt.
func (s *CQSource) Watch(w event.Waker) error {
	cq := (*CQ)(s)
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.closed {
		return cq.d.opErr("watch CQ", ErrClosed)
	}
	if err := cq.d.notify.start(); err != nil {
		return cq.d.opErr("watch CQ", err)
	}
	return cq.watchers.Add(w)
}

// Unwatch stops the wake-ups of w (event.Source).
func (s *CQSource) Unwatch(w event.Waker) { s.CQ().watchers.Remove(w) }

// Syncer returns what delivers the CQ's wake-ups: the device's
// notification ring (event.Synced), so that poll sets can leave the CQ
// idle until it is named.
func (s *CQSource) Syncer() event.Syncer { return &s.CQ().d.notify }

// Spin returns how long a wait set holding the CQ looks at it before it
// sleeps (event.Spinner): CQ.Spin.
func (s *CQSource) Spin() time.Duration { return s.CQ().Spin() }

// Progress polls the CQ and drops its completions, having counted them on
// the counters of their QPs (event.Driven: event.Counter's reads and
// waits call it). The CQ must be in CQCounted mode (CQ.SetMode): on a
// CQ its owner polls it is refused with an error wrapping ErrBusy.
// Progress is safe for concurrent use with itself and allocates nothing.
func (s *CQSource) Progress() (int, error) {
	cq := (*CQ)(s)
	cq.pmu.Lock()
	defer cq.pmu.Unlock()
	if !cq.enter() {
		return 0, cq.errClosed("progress CQ")
	}
	defer cq.gate.Exit()
	if m := cq.Mode(); m != CQCounted {
		return 0, cq.d.opErr("progress CQ", cq.wrongMode(m, "its owner polls it; CQ.SetMode(CQCounted) before a counter drives it"))
	}
	total := 0
	for {
		n, err := cq.poll(cq.scratch[:])
		total += n
		if err != nil || n < len(cq.scratch) {
			return total, err
		}
	}
}
