package pvsim

import (
	"fmt"
	"time"
)

// The device goroutine: its inbox of doorbells, packets, calls and
// commands, the loop that handles them one at a time with the memory lock
// held, and the timers it fires between passes.

// Event kinds of the device goroutine's inbox.
type evKind uint8

const (
	evDoorbell evKind = iota
	evPacket
	evCall
	evCmd
)

type event struct {
	kind evKind
	off  int
	val  uint32
	pkt  *packet
	fn   func()
	cmd  *command
}

// push queues ev for the device goroutine; false once the device stopped.
// It never blocks for long: the inbox is a slice under a small lock.
func (d *Device) push(ev event) bool {
	d.imu.Lock()
	if d.stopped {
		d.imu.Unlock()
		return false
	}
	if ev.pkt != nil && ev.pkt.inModel != nil {
		ev.pkt.inModel.Add(1) // before the event can be handled
	}
	d.inbox = append(d.inbox, ev)
	d.imu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
	return true
}

// handled ends an event's stay in the model, once the device handled it
// or discarded it unhandled.
func (ev *event) handled() {
	if ev.pkt != nil && ev.pkt.inModel != nil {
		ev.pkt.inModel.Add(-1)
	}
}

// discardInbox drops what the stopped device goroutine left unread: a
// packet for a device that has gone is lost.
func (d *Device) discardInbox() {
	d.imu.Lock()
	evs := d.inbox
	d.inbox, d.spare = nil, nil
	d.imu.Unlock()
	for i := range evs {
		if evs[i].kind == evPacket {
			d.ctr.packetsDropped.Add(1)
		}
		evs[i].handled()
	}
}

func (d *Device) takeInbox() []event {
	d.imu.Lock()
	defer d.imu.Unlock()
	evs := d.inbox
	d.inbox, d.spare = d.spare[:0], nil
	return evs
}

func (d *Device) recycle(evs []event) {
	clear(evs)
	d.imu.Lock()
	if d.spare == nil || cap(evs) > cap(d.spare) {
		d.spare = evs[:0]
	}
	d.imu.Unlock()
}

// run is the device goroutine.
func (d *Device) run() {
	defer close(d.done)
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		evs := d.takeInbox()
		for i := range evs {
			d.mem.mu.Lock()
			d.handle(&evs[i])
			d.mem.mu.Unlock()
			evs[i].handled()
		}
		d.recycle(evs)
		d.runTimers()
		if len(evs) > 0 {
			select {
			case <-d.quit:
				return
			default:
			}
			continue
		}
		var tc <-chan time.Time
		if when, ok := d.w.next(); ok {
			t.Reset(time.Until(when))
			tc = t.C
		}
		select {
		case <-d.wake:
		case <-tc:
		case <-d.quit:
			return
		}
	}
}

// runTimers fires the timers due when it starts, and no more: a timer a
// timer re-arms is due a timeout later, after the inbox has been read
// again.
func (d *Device) runTimers() {
	now := time.Now()
	for {
		d.mem.mu.Lock()
		tm := d.w.due(now)
		if tm != nil {
			tm.fn()
		}
		d.mem.mu.Unlock()
		if tm == nil {
			return
		}
	}
}

func (d *Device) handle(ev *event) {
	switch ev.kind {
	case evDoorbell:
		d.doorbell(ev.off, ev.val)
	case evPacket:
		d.receive(ev.pkt)
	case evCall:
		ev.fn()
	case evCmd:
		d.runCommand(ev.cmd)
	}
}

// call runs fn on the device goroutine (with the memory lock held) and
// waits for it.
func (d *Device) call(fn func()) error {
	done := make(chan struct{})
	if !d.push(event{kind: evCall, fn: func() { fn(); close(done) }}) {
		return fmt.Errorf("%s: %w", d.s.Name, ErrClosed)
	}
	select {
	case <-done:
		return nil
	case <-d.done:
		select {
		case <-done:
			return nil
		default:
		}
		return fmt.Errorf("%s: %w", d.s.Name, ErrClosed)
	}
}

// callAsync queues fn for the device goroutine without waiting.
func (d *Device) callAsync(fn func()) error {
	if !d.push(event{kind: evCall, fn: fn}) {
		return fmt.Errorf("%s: %w", d.s.Name, ErrClosed)
	}
	return nil
}
