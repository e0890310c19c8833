package vfrdma

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/vfrdma/vfrdma/firmware"
)

// AsyncEventType is the kind of an event the device raised on its
// async-event ring (pvrdma_eqe_type, one to one with the verbs' event
// types).
type AsyncEventType = firmware.EventType

// The async event types (the firmware package names them all).
const (
	EventCQErr           = firmware.EventCQErr
	EventQPFatal         = firmware.EventQPFatal
	EventQPReqErr        = firmware.EventQPReqErr
	EventQPAccessErr     = firmware.EventQPAccessErr
	EventCommEst         = firmware.EventCommEst
	EventSQDrained       = firmware.EventSQDrained
	EventDeviceFatal     = firmware.EventDeviceFatal
	EventPortActive      = firmware.EventPortActive
	EventPortErr         = firmware.EventPortErr
	EventSRQErr          = firmware.EventSRQErr
	EventSRQLimitReached = firmware.EventSRQLimitReached
	EventQPLastWQE       = firmware.EventQPLastWQEReached
	EventGIDChange       = firmware.EventGIDChange
)

// ErrDeviceFatal reports a device that raised DEVICE_FATAL: every CQ fails
// with it, every QP is in ERR, and only Close is left to do.
var ErrDeviceFatal = fmt.Errorf("%w: the device raised DEVICE_FATAL", ErrDeviceFault)

// ErrCQOverrun reports a CQ the device failed (CQ_ERR: it overran, or the
// device could not write it): its completions are lost, and Poll returns
// this error from then on.
var ErrCQOverrun = fmt.Errorf("%w: the device reported a CQ error (CQ_ERR)", ErrDeviceFault)

// AsyncEvent is an event the device raised on its async-event ring
// (MSI-X vector 1): an error or state change of a QP, CQ, SRQ, port or the
// device. A real VMware device raises them; QEMU 7.2 never does
// (Quirks.NoAsyncEvents).
//
// The driver acts on each before delivering it: a QP error event
// (QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR) moves the QP to ERR, so its posts
// are refused and its outstanding requests complete with WR_FLUSH_ERR as
// the device flushes them, each once; CQ_ERR fails the CQ (Poll returns
// ErrCQOverrun, its waiters wake); PORT_ERR and PORT_ACTIVE set the port
// state (Device.PortState); SRQ_LIMIT_REACHED is the SRQ's low-watermark
// event if the watermark is armed, and never a second one beside the
// driver's own; DEVICE_FATAL fails every CQ with ErrDeviceFatal and moves
// every QP to ERR.
type AsyncEvent struct {
	Type AsyncEventType
	// Info is the event's raw info field: a QP, CQ or SRQ handle or a
	// port number, by Type.
	Info uint32
	// The object the event names, if the Device has it: nil for an event
	// of another kind, or for a handle the driver does not know (an object
	// already destroyed).
	QP  *QP
	CQ  *CQ
	SRQ *SRQ
	// Port is the port a port event names.
	Port int
}

func (e AsyncEvent) String() string {
	switch {
	case e.QP != nil:
		return fmt.Sprintf("%s on QP %d", e.Type, e.QP.qpn)
	case e.CQ != nil:
		return fmt.Sprintf("%s on CQ %d", e.Type, e.CQ.handle)
	case e.SRQ != nil:
		return fmt.Sprintf("%s on SRQ %d", e.Type, e.SRQ.handle)
	case e.Port != 0:
		return fmt.Sprintf("%s on port %d", e.Type, e.Port)
	}
	return fmt.Sprintf("%s (info %d)", e.Type, e.Info)
}

// AsyncStats count the async events the driver took from the device.
type AsyncStats struct {
	Events  uint64 // events read from the ring
	Dropped uint64 // events the AsyncEvents channel had no room for
	Unknown uint64 // events naming an object the driver does not know
}

// asyncEventsBuffer is the room of the AsyncEvents channel.
const asyncEventsBuffer = 64

// asyncEvents takes the device's async events: a goroutine, started once
// the device is active, waits on vector 1 and drains the ring.
type asyncEvents struct {
	ch      chan AsyncEvent
	cancel  context.CancelFunc
	done    chan struct{}
	stopped sync.Once

	events, dropped, unknown atomic.Uint64
	err                      atomic.Pointer[error] // the ring fault that stopped it
}

// startAsync starts taking async events, unless the device never raises
// them.
func (d *Device) startAsync() {
	d.async.ch = make(chan AsyncEvent, asyncEventsBuffer)
	if d.ch.Quirks().NoAsyncEvents || d.asyncRing == nil || len(d.vectors) <= firmware.VectorAsync {
		return
	}
	vec := d.vectors[firmware.VectorAsync]
	ctx, cancel := context.WithCancel(context.Background())
	d.async.cancel, d.async.done = cancel, make(chan struct{})
	go func() {
		defer close(d.async.done)
		var buf [32]firmware.AsyncEvent
		for {
			for {
				n, err := d.asyncRing.Poll(buf[:])
				if err != nil {
					d.async.err.Store(&err)
					return
				}
				for _, e := range buf[:n] {
					d.dispatch(e)
				}
				if n < len(buf) {
					break
				}
			}
			if _, err := vec.Wait(ctx); err != nil {
				if !errors.Is(err, context.Canceled) {
					d.async.err.Store(&err)
				}
				return
			}
		}
	}()
}

// stopAsync stops the goroutine and closes the AsyncEvents channel (no
// event is sent after); Close calls it before the ring goes.
func (d *Device) stopAsync() {
	d.async.stopped.Do(func() {
		if d.async.cancel != nil {
			d.async.cancel()
			<-d.async.done
		}
		if d.async.ch != nil {
			close(d.async.ch)
		}
	})
}

// AsyncEvents returns the channel of the device's async events, after the
// driver acted on each (see AsyncEvent). It holds the latest 64 events not
// yet received; the ones it has no room for are dropped and counted
// (AsyncStats). Options.OnAsyncEvent is the callback alternative. On a
// device that raises none (QEMU 7.2: Quirks.NoAsyncEvents) nothing ever
// arrives. Close closes it, once the events before it are in.
func (d *Device) AsyncEvents() <-chan AsyncEvent { return d.async.ch }

// AsyncStats returns the async-event counters, and the ring fault that
// stopped the driver taking them, if one did.
func (d *Device) AsyncStats() (AsyncStats, error) {
	var err error
	if p := d.async.err.Load(); p != nil {
		err = d.opErr("async events", *p)
	}
	return AsyncStats{Events: d.async.events.Load(), Dropped: d.async.dropped.Load(), Unknown: d.async.unknown.Load()}, err
}

// PortState returns port 1's state as the driver last learned it: from
// QUERY_PORT at Open, then from the device's PORT_ACTIVE and PORT_ERR
// events (firmware.PortActive, firmware.PortDown, ...).
func (d *Device) PortState() uint32 { return d.portState.Load() }

// dispatch acts on one event and delivers it.
func (d *Device) dispatch(e firmware.AsyncEvent) {
	d.async.events.Add(1)
	ev := AsyncEvent{Type: e.Type, Info: e.Info}
	known := true
	switch e.Type {
	case firmware.EventQPFatal, firmware.EventQPReqErr, firmware.EventQPAccessErr:
		if ev.QP = d.qpByHandle(e.Info); ev.QP != nil {
			ev.QP.state.Store(uint32(StateErr))
		}
		known = ev.QP != nil
	case firmware.EventCommEst, firmware.EventSQDrained, firmware.EventPathMig,
		firmware.EventPathMigErr, firmware.EventQPLastWQEReached:
		ev.QP = d.qpByHandle(e.Info)
		known = ev.QP != nil
	case firmware.EventCQErr:
		if ev.CQ = d.cqByHandle(e.Info); ev.CQ != nil {
			ev.CQ.fail(ErrCQOverrun)
		}
		known = ev.CQ != nil
	case firmware.EventSRQErr, firmware.EventSRQLimitReached:
		ev.SRQ = d.srqByHandle(e.Info)
		known = ev.SRQ != nil
		if ev.SRQ != nil && e.Type == firmware.EventSRQLimitReached {
			// The driver raises the watermark event from its own counts;
			// the device's is the same event: it fires only while the
			// watermark is armed, and whichever comes first disarms it.
			ev.SRQ.q.RaiseLowWatermark()
		}
	case firmware.EventPortActive, firmware.EventPortErr, firmware.EventLIDChange,
		firmware.EventPKeyChange, firmware.EventSMChange, firmware.EventClientReregister,
		firmware.EventGIDChange:
		ev.Port = int(e.Info)
		if e.Info != 1 { // the device has one port
			known = false
			break
		}
		switch e.Type {
		case firmware.EventPortActive:
			d.portState.Store(firmware.PortActive)
		case firmware.EventPortErr:
			d.portState.Store(firmware.PortDown)
		}
	case firmware.EventDeviceFatal:
		d.failAll()
	default:
		known = false
	}
	if !known {
		d.async.unknown.Add(1)
	}
	if f := d.opt.OnAsyncEvent; f != nil {
		f(ev)
	}
	select {
	case d.async.ch <- ev:
	default:
		d.async.dropped.Add(1)
	}
}

// failAll is DEVICE_FATAL: every CQ fails, every QP is in ERR.
func (d *Device) failAll() {
	d.mu.Lock()
	cqs, qps := mapKeys(d.cqs), mapKeys(d.qps)
	d.mu.Unlock()
	for _, qp := range qps {
		qp.state.Store(uint32(StateErr))
	}
	for _, cq := range cqs {
		cq.fail(ErrDeviceFatal)
	}
}

// cqByHandle and srqByHandle find a live object by its device handle
// (events are rare: a scan is enough; QPs have their table, qpByHandle).
func (d *Device) cqByHandle(h uint32) *CQ {
	d.mu.Lock()
	defer d.mu.Unlock()
	for cq := range d.cqs {
		if cq.handle == h {
			return cq
		}
	}
	return nil
}

func (d *Device) srqByHandle(h uint32) *SRQ {
	d.mu.Lock()
	defer d.mu.Unlock()
	for s := range d.srqs {
		if s.handle == h {
			return s
		}
	}
	return nil
}

// fail makes every later Poll return err and wakes the CQ's waiter and
// watchers, which find it ready (Poll then reports the error).
func (cq *CQ) fail(err error) {
	cq.failErr.CompareAndSwap(nil, &err)
	cq.d.notify.signal(cq)
}
