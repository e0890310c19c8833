package vfrdma

import (
	"context"
	"errors"
	"sync"

	"github.com/vfrdma/vfrdma/firmware"
)

// notifier turns the device's CQ interrupts into wake-ups of the CQs they
// name. The device raises one vector (2) for all CQs and writes the handle
// of each CQ with a new completion into the CQ-notification ring; a single
// goroutine, started by the first Wait, waits on the vector, drains the
// ring and signals the CQs. Arm drains the ring too, so that it never fills
// (QEMU stops notifying once it is full).
type notifier struct {
	mu       sync.Mutex
	started  bool
	cancel   context.CancelFunc
	done     chan struct{}
	byHandle map[uint32]*CQ

	drainMu sync.Mutex
	buf     [256]uint32
	err     error // the first ring fault, reported by Wait
}

func (n *notifier) add(cq *CQ) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.byHandle == nil {
		n.byHandle = map[uint32]*CQ{}
	}
	n.byHandle[cq.handle] = cq
}

func (n *notifier) forget(cq *CQ) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.byHandle[cq.handle] == cq {
		delete(n.byHandle, cq.handle)
	}
}

// signal wakes cq's waiter, if any; a wake-up already pending is enough.
func (n *notifier) signal(cq *CQ) {
	select {
	case cq.wake <- struct{}{}:
	default:
	}
}

// start runs the interrupt goroutine once.
func (n *notifier) start(d *Device) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.err != nil {
		return n.err
	}
	if n.started {
		return nil
	}
	if err := d.check(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.started, n.cancel, n.done = true, cancel, make(chan struct{})
	vec := d.vectors[firmware.VectorCQ]
	go func() {
		defer close(n.done)
		for {
			if _, err := vec.Wait(ctx); err != nil {
				if !errors.Is(err, context.Canceled) {
					n.mu.Lock()
					n.err = err
					n.mu.Unlock()
				}
				return
			}
			n.drain(d)
		}
	}()
	return nil
}

// drain empties the CQ-notification ring and wakes the CQs it names.
func (n *notifier) drain(d *Device) {
	n.drainMu.Lock()
	defer n.drainMu.Unlock()
	for {
		k, err := d.cqNotify.Poll(n.buf[:])
		if err != nil {
			n.mu.Lock()
			if n.err == nil {
				n.err = err
			}
			n.mu.Unlock()
			return
		}
		if k == 0 {
			return
		}
		n.mu.Lock()
		for _, h := range n.buf[:k] {
			if cq := n.byHandle[h]; cq != nil {
				n.signal(cq)
			}
		}
		n.mu.Unlock()
	}
}

// stop ends the interrupt goroutine (Device.Close, before the vectors go).
func (n *notifier) stop() {
	n.mu.Lock()
	started, cancel, done := n.started, n.cancel, n.done
	n.mu.Unlock()
	if started {
		cancel()
		<-done
	}
}
