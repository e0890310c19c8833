package am

import (
	"fmt"
	"time"
)

// The progress goroutine's scheduler: how it waits when it finds nothing
// to do (idlePolicy, chosen once in New), and the rules that say when a
// packet to a task may go, each a small function of the task's state
// (dataMayGo, acksDue, creditsDue, ctrlMayGo, probeDue) or of the
// goroutine's (repostDue). pump, ctrl, probe and the progress loop act on
// them; schedule_test.go pins each rule with a table of states.

// idlePolicy is how the progress goroutine waits once a poll of the CQ
// finds nothing. New chooses it once (chooseIdle), from Config.Polling,
// the spin and whether the CQ can be armed; ProgressMode reports it.
type idlePolicy uint8

const (
	// idlePoll (Config.Polling): it polls again at once, yielding the
	// processor between polls, and never sleeps: the lowest latency, a
	// CPU spent.
	idlePoll idlePolicy = iota
	// idleSpinSleep: it keeps polling for the spin once the CQ goes
	// empty, then arms the CQ and sleeps on its interrupt (the wait set)
	// until a completion or Wake. Each wake-up that finds nothing spins
	// again.
	idleSpinSleep
	// idleSleep (no spin: a negative Config.Spin, or a device whose
	// CQ.Spin is none): it arms the CQ and sleeps as soon as a poll finds
	// nothing.
	idleSleep
	// idleSpinNap (a CQ that cannot be armed: Options.PollDoorbell on
	// QEMU's device): it keeps polling for the spin (none with a negative
	// Config.Spin), then naps between polls, pauses that double from
	// napMin to napMax, woken early by Wake (work to send). The spin runs
	// once per idle spell: the naps go on until something arrives.
	idleSpinNap
)

// String is the policy as ProgressMode reports it.
func (p idlePolicy) String() string {
	switch p {
	case idlePoll:
		return "polling"
	case idleSpinSleep:
		return "spin, then sleep"
	case idleSleep:
		return "sleep"
	case idleSpinNap:
		return "spin, then nap"
	}
	return fmt.Sprintf("idlePolicy(%d)", uint8(p))
}

// chooseIdle is the idle policy of a context with Config.Polling polling,
// a CQ that can be armed or not, and spin, the context's spin (Config.Spin
// with its default filled in): polling wins, then a CQ that cannot be
// armed naps (whatever the spin), then a positive spin spins before it
// sleeps.
func chooseIdle(polling, armable bool, spin time.Duration) idlePolicy {
	switch {
	case polling:
		return idlePoll
	case !armable:
		return idleSpinNap
	case spin > 0:
		return idleSpinSleep
	}
	return idleSleep
}

// hold is how long a progress goroutine waiting as p, with spin, keeps
// back acknowledgements no one waits for and taken receive buffers, given
// the hold asked for: all of it when polling (it never sleeps); otherwise
// at most half the spin, so that what is held goes within the spin,
// before the goroutine sleeps or naps; none without a spin.
func (p idlePolicy) hold(hold, spin time.Duration) time.Duration {
	if p == idlePoll {
		return hold
	}
	return min(hold, max(spin/2, 0))
}

// ackState is what the acknowledgements queued for a task (conn.acks)
// wait for before they go alone in a control packet; an eager or first
// packet to the task takes them along whatever the state.
type ackState uint8

const (
	// acksNone: no acknowledgement is queued.
	acksNone ackState = iota
	// acksHeld: no origin waits for the queued acknowledgements (their
	// messages had no Cmpl counter): they wait, since conn.ackAt, up to
	// the context's hold for a data packet to ride on.
	acksHeld
	// acksWanted: an origin waits for one of them (a Cmpl counter): they
	// go as soon as the progress goroutine is idle. The state lasts until
	// the queue is empty.
	acksWanted
)

func (s ackState) String() string {
	switch s {
	case acksNone:
		return "none"
	case acksHeld:
		return "held"
	case acksWanted:
		return "wanted"
	}
	return fmt.Sprintf("ackState(%d)", uint8(s))
}

// queues is a set of a task's queue pairs, by role.
type queues uint8

const (
	outQueue queues = 1 << iota // conn.out: data packets and probes
	inQueue                     // conn.in: acknowledgements and credits
)

// dataMayGo reports whether the next data packet to cn may go: data is
// queued, the task is not purged, it holds two credits or more (a data
// packet leaves the last credit to a packet that returns credits, so
// that two tasks can never both wait for the other's), and more send
// slots are free than there are tasks (a data packet leaves one per task
// to control packets). Under mu.
func (c *Context) dataMayGo(cn *conn) bool {
	return len(cn.sendq) > 0 && cn.err == nil && cn.credits >= 2 && len(c.free) > c.cfg.Tasks
}

// creditStalled reports whether data to cn waits for credits: it is
// queued, the task is not purged, and the task has fewer than the two
// credits a data packet needs (Stats.CreditStalls counts each spell).
// Under mu.
func creditStalled(cn *conn) bool {
	return len(cn.sendq) > 0 && cn.err == nil && cn.credits < 2
}

// acksDue reports whether cn's acknowledgements are due in a control
// packet of their own: half a packet of them has gathered, the context
// is closing (it holds nothing back then), or the
// progress goroutine is idle (it found nothing more to do, at now) and
// they are wanted, or have been held for the context's hold. Under mu.
func (c *Context) acksDue(cn *conn, idle bool, now time.Time) bool {
	switch {
	case len(cn.acks) >= c.maxAcks/2:
		return true
	case c.leaving && len(cn.acks) > 0:
		return true // Close lingers for them (linger)
	case !idle:
		return false
	}
	switch cn.ackState {
	case acksWanted:
		return true
	case acksHeld:
		return now.Sub(cn.ackAt) >= c.ackHold
	}
	return false
}

// creditsDue reports whether cn is owed enough credits to be worth a
// control packet of their own: half the task's credits. Fewer go only
// with another packet (data, acknowledgements, a probe), busy or idle.
// Under mu.
func (c *Context) creditsDue(cn *conn) bool {
	return cn.owed >= c.cfg.Credits/2
}

// ctrlMayGo reports whether a control packet to cn can go: a send slot is
// free (data leaves one per task for it), and the task has a credit to
// spend on it, the last one only if the packet returns credits. Under mu.
func (c *Context) ctrlMayGo(cn *conn) bool {
	return len(c.free) > 0 && (cn.credits > 1 || cn.credits == 1 && cn.owed > 0)
}

// ctrlDue reports whether a control packet (acknowledgements, credits)
// to cn goes now: its acknowledgements or its credits are due, and it can
// go. Under mu.
func (c *Context) ctrlDue(cn *conn, idle bool, now time.Time) bool {
	return (c.acksDue(cn, idle, now) || c.creditsDue(cn)) && c.ctrlMayGo(cn)
}

// probeDue reports whether to probe cn at this look of the ticker: the
// task has said nothing since the last look (heard is still heardSeen),
// no probe to it is on its way, it is not purged, it owes this task
// something (an acknowledgement of a message sent, credits for data
// queued, or its message for a Barrier that waits), and a send slot is
// free (a probe goes even without a credit). Under mu.
func (c *Context) probeDue(cn *conn) bool {
	silent := cn.heard == cn.heardSeen
	owes := len(cn.sendq) > 0 || len(cn.sent) > 0 || c.barriers > 0 && cn.barrier < c.epoch
	return silent && !cn.probing && cn.err == nil && owes && len(c.free) > 0
}

// repostDue reports whether the n receive buffers the progress goroutine
// holds back, since heldAt, go back to the SRQ now: a batch
// (repostBatch) has gathered, or the goroutine is idle (at now) and has
// held them for the context's hold. Progress goroutine only.
func (c *Context) repostDue(n int, idle bool, now, heldAt time.Time) bool {
	return n >= c.repostBatch || n > 0 && idle && now.Sub(heldAt) >= c.ackHold
}
