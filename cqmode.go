package vfrdma

import "fmt"

// CQMode says who takes a CQ's completions. A new CQ is in CQPolled mode;
// SetMode changes it, Mode reads it.
type CQMode uint32

const (
	// CQPolled: the CQ's owner takes its completions with Poll, and waits
	// for them with Wait, a wait set or a poll set (CQ.Source). Counters
	// bound to its QPs count what Poll reaps.
	CQPolled CQMode = iota
	// CQCounted: the counters bound to the CQ's QPs take its completions
	// (QPConfig.SendCounter, RecvCounter): an event.Counter drives the CQ
	// (Counter.Drive(cq.Source())), and its reads and waits poll it and
	// drop what they counted. Poll is refused: nothing is left for it.
	CQCounted
)

func (m CQMode) String() string {
	switch m {
	case CQPolled:
		return "CQPolled"
	case CQCounted:
		return "CQCounted"
	}
	return fmt.Sprintf("CQMode(%d)", uint32(m))
}

// Mode returns the CQ's mode: who takes its completions.
func (cq *CQ) Mode() CQMode { return CQMode(cq.mode.Load()) }

// SetMode sets who takes the CQ's completions (CQMode): CQCounted before
// a counter drives the CQ, CQPolled to poll it again. In the other mode,
// Poll (on a CQCounted CQ) and the counters' progress (on a CQPolled one)
// are refused with an error wrapping ErrBusy that says so. SetMode waits
// for a counter's progress under way; like Poll it is the owner's, and
// must not run beside a Poll of the CQ. On a closed CQ it returns
// ErrClosed; a mode other than the two, ErrInvalid.
func (cq *CQ) SetMode(m CQMode) error {
	if m != CQPolled && m != CQCounted {
		return cq.d.opErr("set CQ mode", invalidf("CQ %d: %v is no CQ mode", cq.handle, m))
	}
	cq.pmu.Lock()
	defer cq.pmu.Unlock()
	if !cq.enter() {
		return cq.errClosed("set CQ mode")
	}
	defer cq.gate.Exit()
	cq.mode.Store(uint32(m))
	return nil
}

// wrongMode is the error of a call the CQ's mode m refuses.
func (cq *CQ) wrongMode(m CQMode, why string) error {
	return fmt.Errorf("%w: CQ %d is in %v mode: %s", ErrBusy, cq.handle, m, why)
}
