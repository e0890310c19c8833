package vfrdma

import (
	"context"
	"errors"
	"fmt"
	"github.com/vfrdma/vfrdma/internal/lifecycle"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/vfrdma/vfrdma/wq"
)

// irqWaiter is the CQ vector as the notifier uses it (a *vfio.Vector).
type irqWaiter interface {
	Wait(ctx context.Context) (uint64, error)
}

// notifier turns the device's CQ notifications into wake-ups of the CQs
// they name: the CQ's own waiter (Wait) and its watchers (wait sets, poll
// sets, counters). The device raises one vector (2) for all CQs and writes
// the handle of each CQ with a new completion into the CQ-notification
// ring (QEMU 7.2 writes one for every CQE, armed or not; it interrupts
// only for armed CQs). A goroutine, started by the first Wait or Watch,
// waits on the vector and drains the ring; Sync (poll sets), Arm and
// CQ.Poll drain it too, so that it never fills (QEMU stops notifying, and
// interrupting, once it is full).
type notifier struct {
	d *Device

	// gate admits the calls that read the notification ring (Sync, from
	// poll sets among others); stop shuts it before Device.Close unmaps
	// the ring.
	gate lifecycle.Gate

	mu      sync.Mutex
	started bool
	stopped bool
	cancel  context.CancelFunc
	done    chan struct{}
	cqs     wq.Table[CQ]          // by handle; written under mu, read without a lock
	all     atomic.Pointer[[]*CQ] // the same CQs, for wakeArmed; copied on write
	err     error                 // the first ring fault, reported by Wait and Sync

	drainMu sync.Mutex
	buf     [256]uint32
}

func (n *notifier) add(cq *CQ) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cqs.Set(cq.handle, cq)
	var old []*CQ
	if p := n.all.Load(); p != nil {
		old = *p
	}
	next := append(slices.Clip(old), cq)
	n.all.Store(&next)
}

func (n *notifier) forget(cq *CQ) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cqs.Remove(cq.handle, cq)
	if p := n.all.Load(); p != nil {
		next := slices.DeleteFunc(slices.Clone(*p), func(c *CQ) bool { return c == cq })
		n.all.Store(&next)
	}
}

// wakeArmed signals every CQ the driver believes armed, and forgets that
// belief, after an interrupt. The device disarms a CQ when it checks the
// arm after writing a CQE and its notification; that check can come after
// an arm doorbell that followed the CQE, and after the driver drained the
// notification (Sync runs outside the interrupt too). Then the interrupt
// finds no entry to name the CQ, whose arm is spent: without this, its
// waiter would sleep through its next completion. An interrupt does not
// say which CQ it is for, so every armed CQ is told; each re-arms when its
// waiter next tries to wait. The cost is one wake-up per armed CQ per
// interrupt, and interrupts come only from armed CQs.
func (n *notifier) wakeArmed() {
	p := n.all.Load()
	if p == nil {
		return
	}
	for _, cq := range *p {
		if cq.armed.Load() && cq.armed.Swap(false) {
			n.signal(cq)
		}
	}
}

// signal wakes cq's waiter and watchers; a wake-up already pending is
// enough for the waiter.
func (n *notifier) signal(cq *CQ) {
	select {
	case cq.wake <- struct{}{}:
	default:
	}
	cq.watchers.Wake()
}

// start runs the interrupt goroutine once.
func (n *notifier) start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.err != nil {
		return n.err
	}
	if n.started {
		return nil
	}
	d := n.d
	if n.stopped || d.gate.IsShut() {
		return fmt.Errorf("%w: device %s", ErrClosed, d.name)
	}
	if d.cqIRQ == nil {
		return errors.New("the device has no CQ interrupt")
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.started, n.cancel, n.done = true, cancel, make(chan struct{})
	go func() {
		defer close(n.done)
		for {
			if _, err := d.cqIRQ.Wait(ctx); err != nil {
				if !errors.Is(err, context.Canceled) {
					n.fail(err)
				}
				return
			}
			_ = n.Sync()
			n.wakeArmed()
		}
	}()
	return nil
}

func (n *notifier) fail(err error) {
	n.mu.Lock()
	if n.err == nil {
		n.err = err
	}
	n.mu.Unlock()
}

// Sync empties the CQ-notification ring and wakes the CQs it names. It
// implements event.Syncer: once it returns, every notification the device
// wrote before the call has been delivered.
func (n *notifier) Sync() error {
	if !n.gate.Enter() {
		return fmt.Errorf("%w: device %s", ErrClosed, n.d.name)
	}
	defer n.gate.Exit()
	if n.d.cqNotify == nil {
		return nil // a device without the ring (the host tests' fakes)
	}
	n.drainMu.Lock()
	defer n.drainMu.Unlock()
	return n.syncLocked()
}

func (n *notifier) syncLocked() error {
	for {
		k, err := n.d.cqNotify.Poll(n.buf[:])
		for _, h := range n.buf[:k] {
			if cq := n.cqs.Lookup(h); cq != nil {
				// The device disarms a CQ when it notifies; it is armed
				// again by whoever needs it next.
				cq.armed.Store(false)
				n.signal(cq)
			}
		}
		if err != nil {
			n.fail(err)
			return err
		}
		if k < len(n.buf) {
			return nil
		}
	}
}

// syncIfFilling drains the ring when it is at least half full: CQ.Poll
// calls it now and then, so that busy CQs nobody waits on do not fill the
// ring and silence the notifications of the CQs someone does wait on.
// If another goroutine is draining, there is nothing to do.
func (n *notifier) syncIfFilling() {
	if n.d.cqNotify == nil || !n.gate.Enter() {
		return
	}
	defer n.gate.Exit()
	if !n.drainMu.TryLock() {
		return
	}
	r := n.d.cqNotify
	if k, err := r.Pending(); err == nil && k >= r.Slots()/2 {
		_ = n.syncLocked()
	}
	n.drainMu.Unlock()
}

// stop ends the interrupt goroutine and shuts the gate (Device.Close,
// before the vectors and the ring go): Sync then returns ErrClosed.
func (n *notifier) stop() {
	n.mu.Lock()
	n.stopped = true
	started, cancel, done := n.started, n.cancel, n.done
	n.mu.Unlock()
	if started {
		cancel()
		<-done
	}
	n.gate.Close()
}
