package vfrdma

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/event"
	"github.com/vfrdma/vfrdma/firmware"
)

// A CQ's waiting: Arm, Wait (spin, then the interrupt; or, where CQs are
// never armed, the POLL doorbell and naps) and the CQ's own wait object
// (FD, TryWait). The device's notifications that wake the waiters are
// demultiplexed in notify.go.

// Arm asks the device for an interrupt at the CQ's next completion (on
// QEMU 7.2 only ARM|ARM_SOL arms; Quirks.CQArm picks the bits). It first
// drains the device's CQ-notification ring, which QEMU stops interrupting
// through once it is full. Arm is safe for concurrent use with Poll.
func (cq *CQ) Arm(solicitedOnly bool) error {
	if !cq.enter() {
		return cq.errClosed("arm CQ")
	}
	defer cq.gate.Exit()
	return cq.arm(solicitedOnly)
}

// arm is Arm inside the gate.
func (cq *CQ) arm(solicitedOnly bool) error {
	if cq.d.armBesidePoll() {
		return cq.armBesidePoll(solicitedOnly)
	}
	if cq.pollOnly() {
		return cq.d.opErr("arm CQ", fmt.Errorf("%w: Options.PollDoorbell on QEMU 7.2: its POLL doorbell deadlocks the VM against the completion thread notifying an armed CQ (each holds the lock the other wants), so CQs are not armed; Wait polls instead", ErrNotSupported))
	}
	if err := cq.d.notify.Sync(); err != nil {
		return cq.d.opErr("arm CQ", err)
	}
	cq.arms.Add(1)
	cq.armed.Store(true)
	bits := cq.d.cqArm[0]
	if solicitedOnly {
		bits = cq.d.cqArm[1]
	}
	return cq.d.opErr("arm CQ", doorbell.Ring(cq.d.uar, doorbell.OffsetCQ, bits|cq.handle))
}

// Wait blocks until the CQ has a completion to poll or ctx is done. It
// first spins for Options.Spin, looking at the ring's counters and
// yielding the processor between looks; then it arms the CQ, checks again
// (a completion that raced the arming is not missed), and sleeps until the
// device's CQ interrupt names this CQ. It returns nil when Poll has
// something; ctx's error, wrapped, otherwise. The spin allocates nothing.
func (cq *CQ) Wait(ctx context.Context) error {
	if cq.pollOnly() {
		return cq.pollWait(ctx)
	}
	if spin := cq.d.waitSpin; spin > 0 {
		if ok, err := cq.spin(ctx, spin); ok || err != nil {
			return err
		}
	}
	if err := cq.d.notify.start(); err != nil {
		return cq.d.opErr("wait CQ", err)
	}
	for {
		if ok, err := cq.readyOrArm(); ok || err != nil {
			return err
		}
		select {
		case <-cq.wake:
			cq.interrupts.Add(1)
		case <-cq.done:
			return cq.errClosed("wait CQ")
		case <-ctx.Done():
			return cq.d.opErr("wait CQ", fmt.Errorf("waiting for a completion on CQ %d (MSI-X vector %d): %w", cq.handle, firmware.VectorCQ, ctx.Err()))
		}
	}
}

// spin looks at the ring until it holds something, for at most d: it
// reports whether it does.
func (cq *CQ) spin(ctx context.Context, d time.Duration) (bool, error) {
	ok, err := event.Spin(ctx, d, func() (bool, error) {
		if !cq.enter() {
			return false, ErrClosed
		}
		ok, _ := cq.ready()
		cq.gate.Exit()
		return ok, nil
	})
	switch {
	case errors.Is(err, ErrClosed):
		return false, cq.errClosed("wait CQ")
	case err != nil:
		return false, cq.d.opErr("wait CQ", fmt.Errorf("spinning on CQ %d: %w", cq.handle, err))
	case ok:
		cq.spun.Add(1)
	}
	return ok, nil
}

// Spin returns how long Wait polls before it sleeps (Options.Spin, or its
// default for the device): a wait set with the CQ as a member spins that
// long too, unless told otherwise (event.WaitSet.SetSpin).
func (cq *CQ) Spin() time.Duration { return cq.d.waitSpin }

// Armable reports whether the CQ can be armed for its interrupt: false
// with Options.PollDoorbell on QEMU's device, where CQs are never armed
// (Arm returns ErrNotSupported, Wait polls, and a wait set holding the CQ
// cannot sleep). A poller of such a CQ naps and polls instead.
func (cq *CQ) Armable() bool { return !cq.pollOnly() }

// readyOrArm is one round of Wait inside the gate: it re-checks the ring,
// arms the CQ and checks again.
func (cq *CQ) readyOrArm() (bool, error) {
	if !cq.enter() {
		return false, cq.errClosed("wait CQ")
	}
	defer cq.gate.Exit()
	if ok, err := cq.ready(); ok || err != nil {
		return ok, err
	}
	if err := cq.arm(false); err != nil {
		return false, err
	}
	return cq.ready()
}

// pollOnly reports a CQ that must not be armed: Options.PollDoorbell on
// QEMU. QEMU 7.2's POLL doorbell takes the RDMA backend's lock (one for the
// device) while the vCPU holds the big lock; its completion thread holds
// the backend's lock when it raises an armed CQ's interrupt, which wants
// the big lock: a POLL doorbell beside any armed CQ can deadlock the VM.
// rdma-core's provider polls with that doorbell and its programs never
// arm unless asked to (-e).
func (cq *CQ) pollOnly() bool {
	return cq.d.emulated && cq.d.pollsWithDoorbell() && !cq.d.opt.ArmBesidePollDoorbell
}

// armBesidePoll reports whether arms and POLL doorbells take turns
// (Options.ArmBesidePollDoorbell on QEMU, the doorbell not stopped).
func (d *Device) armBesidePoll() bool {
	return d.emulated && d.opt.ArmBesidePollDoorbell && d.pollsWithDoorbell()
}

// armBesidePoll is arm with Options.ArmBesidePollDoorbell: the CQ joins
// the device's armed CQs before its arm doorbell, the POLL doorbells
// ringing are waited out (an empty poll that starts later sees the CQ
// armed and rings none), and the producer index read after the arm
// doorbell marks where the arm ends: the device disarms the CQ when it
// writes a CQE after the arm, so a later index says the arm is spent. A
// CQE written between the arm doorbell and that read keeps the CQ counted
// armed until the next one: the safe side.
func (cq *CQ) armBesidePoll(solicitedOnly bool) error {
	d := cq.d
	if err := d.notify.Sync(); err != nil {
		return d.opErr("arm CQ", err)
	}
	d.armedMu.Lock()
	if !cq.devArmed {
		cq.devArmed = true
		d.armedCQs = append(d.armedCQs, cq)
		d.nArmed.Add(1)
	}
	cq.armProdSet, cq.armSpentAt = false, time.Time{}
	d.armedMu.Unlock()
	for d.pollRinging.Load() != 0 {
		runtime.Gosched()
	}
	cq.arms.Add(1)
	cq.armed.Store(true)
	bits := d.cqArm[0]
	if solicitedOnly {
		bits = d.cqArm[1]
	}
	if err := doorbell.Ring(d.uar, doorbell.OffsetCQ, bits|cq.handle); err != nil {
		d.disarmed(cq)
		return d.opErr("arm CQ", err)
	}
	d.armedMu.Lock()
	if cq.devArmed {
		cq.armProd, cq.armProdSet = cq.st.ProdTail(), true
	}
	d.armedMu.Unlock()
	return nil
}

// noneArmedOnDevice drops from the armed CQs those whose arm the device
// has spent and reports whether none is left. An empty poll calls it
// while some CQ is counted armed. An arm is spent drainGrace after the
// first look that finds a CQE written since it: QEMU writes the CQE
// before it raises the interrupt, and raising it wants the big lock, so
// for a moment after the CQE the completion thread still holds the
// backend's lock and waits for the big one, as in the deadlock above. As
// with QP.awaitQuietCQs, the grace narrows that window; nothing the
// device shows closes it.
//
// A spinning poller calls it on every empty poll while a CQ waits for its
// completion: that case reads the producer indices only; the clock and
// the grace are read once a CQE has come.
func (d *Device) noneArmedOnDevice() bool {
	d.armedMu.Lock()
	defer d.armedMu.Unlock()
	var now time.Time
	var grace time.Duration
	kept := d.armedCQs[:0]
	for _, c := range d.armedCQs {
		if c.armProdSet && c.st.ProdTail() != c.armProd {
			if now.IsZero() {
				now, grace = time.Now(), d.armSpentGrace()
			}
			if c.armSpentAt.IsZero() {
				c.armSpentAt = now
			}
			if now.Sub(c.armSpentAt) >= grace {
				c.devArmed = false
				continue
			}
		}
		kept = append(kept, c)
	}
	clear(d.armedCQs[len(kept):])
	d.armedCQs = kept
	d.nArmed.Store(int32(len(kept)))
	return len(kept) == 0
}

// armSpentGrace is how long an arm stays pending after its CQE
// (noneArmedOnDevice): drainGrace, or a test's (SetArmSpentGrace).
func (d *Device) armSpentGrace() time.Duration {
	if h := d.hooks(); h != nil && h.armGraceSet.Load() {
		return time.Duration(h.armGrace.Load())
	}
	return drainGrace
}

// disarmed forgets cq's arm on the device: its destroy (the device
// forgets the CQ), or an arm doorbell that failed.
func (d *Device) disarmed(cq *CQ) {
	d.armedMu.Lock()
	defer d.armedMu.Unlock()
	if !cq.devArmed {
		return
	}
	cq.devArmed = false
	d.armedCQs = slices.DeleteFunc(d.armedCQs, func(c *CQ) bool { return c == cq })
	d.nArmed.Store(int32(len(d.armedCQs)))
}

// pollsWithDoorbell reports whether an empty poll rings the POLL
// doorbell: Options.PollDoorbell, until StopPollDoorbell.
func (d *Device) pollsWithDoorbell() bool { return d.opt.PollDoorbell && !d.pollStopped.Load() }

// StopPollDoorbell ends Options.PollDoorbell for the device, for good:
// once it returns no empty poll rings the POLL doorbell (it waits for
// those ringing it now), so on QEMU's device CQs may be armed from then
// on (CQ.Armable). For a program that polls until it first wants an
// interrupt, as the libibverbs drop-in's programs do: the doorbell until
// ibv_req_notify_cq, interrupts after. Safe for concurrent use.
func (d *Device) StopPollDoorbell() {
	d.pollStopped.Store(true)
	for d.pollRinging.Load() != 0 {
		runtime.Gosched()
	}
}

// pollWait is Wait without the interrupt: the POLL doorbell, then a pause
// that doubles from 20 µs to 1 ms, until the CQ holds something or ctx is
// done.
func (cq *CQ) pollWait(ctx context.Context) error {
	pause := 20 * time.Microsecond
	for {
		if ok, err := cq.readyOrPoll(); ok || err != nil {
			return err
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-cq.done:
			t.Stop()
			return cq.errClosed("wait CQ")
		case <-ctx.Done():
			t.Stop()
			return cq.d.opErr("wait CQ", fmt.Errorf("polling CQ %d (Options.PollDoorbell: no interrupt): %w", cq.handle, ctx.Err()))
		}
		pause = min(2*pause, time.Millisecond)
	}
}

// readyOrPoll is one round of pollWait inside the gate.
func (cq *CQ) readyOrPoll() (bool, error) {
	if !cq.enter() {
		return false, cq.errClosed("wait CQ")
	}
	defer cq.gate.Exit()
	if ok, err := cq.ready(); ok || err != nil {
		return ok, err
	}
	if err := doorbell.Ring(cq.d.uar, doorbell.OffsetCQ, doorbell.CQPoll|cq.handle); err != nil {
		return false, cq.d.opErr("wait CQ", err)
	}
	cq.arms.Add(1) // counted with the doorbells (Stats); Wait may run beside Poll
	return cq.ready()
}

// ready reports whether Poll would return something now.
// It reads the ring's two counters as published (prod_tail by the
// device, cons_head by Poll) and nothing of the poller's own state: Ready
// calls it beside Poll. An index out of range reads as ready: Poll reports
// the fault.
func (cq *CQ) ready() (bool, error) {
	return cq.st.ProdTail() != cq.st.ConsHead() || cq.flushPending.Load() || cq.failErr.Load() != nil, nil
}

// FD returns a descriptor for the CQ's own eventfd, for the per-CQ style
// of waiting: it is readable when the CQ may hold completions, until
// TryWait succeeds. Each call returns a new dup that is the caller's to
// close (take it out of epoll first: epoll watches until every descriptor
// of the file is closed); closing it never affects the CQ. Do not read or
// write it. After the CQ is closed, TryWait and Poll return ErrClosed.
func (cq *CQ) FD() (int, error) {
	ws, err := cq.ownSet()
	if err != nil {
		return -1, err
	}
	return ws.FD()
}

// TryWait arms the CQ and its own wait object (FD) and reports whether it
// is safe to sleep on the fd: nil when the CQ is empty, event.ErrAgain when
// completions are queued (poll them, then try again).
func (cq *CQ) TryWait() error {
	ws, err := cq.ownSet()
	if err != nil {
		return err
	}
	return ws.TryWait()
}

func (cq *CQ) ownSet() (*event.WaitSet, error) {
	cq.mu.Lock()
	own, closed := cq.own, cq.closed
	cq.mu.Unlock()
	if closed {
		return nil, cq.d.opErr("CQ wait object", ErrClosed)
	}
	if own != nil {
		return own, nil
	}
	ws, err := event.NewWaitSet(event.FD)
	if err != nil {
		return nil, cq.d.opErr("CQ wait object", err)
	}
	if err := ws.Add(cq.Source()); err != nil {
		_ = ws.Close()
		return nil, err
	}
	cq.mu.Lock()
	if cq.own == nil && !cq.closed {
		cq.own, ws = ws, nil
	}
	own, closed = cq.own, cq.closed
	cq.mu.Unlock()
	if ws != nil { // another goroutine won, or Close came first
		_ = ws.Remove(cq.Source())
		_ = ws.Close()
	}
	if closed {
		return nil, cq.d.opErr("CQ wait object", ErrClosed)
	}
	return own, nil
}
