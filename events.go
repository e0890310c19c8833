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
	// of another kind, for a handle the driver does not know (an object
	// already destroyed), or for an event written before the object that
	// has the handle now was created (a destroyed object's, whose handle
	// the device gave again: AsyncStats.Stale).
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
	// Stale counts, among Unknown, the events the device wrote for a QP,
	// CQ or SRQ destroyed since, whose handle a newer object has: they
	// are not applied to the newer one.
	Stale uint64
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

	events, dropped, unknown, stale atomic.Uint64
	err                             atomic.Pointer[error] // the ring fault that stopped it

	// Positions: every event has its place in the sequence the device
	// wrote since Open (0, 1, ...), and every QP, CQ and SRQ the position
	// the sequence had reached when it was created (orderCommands).
	rmu   sync.Mutex // the goroutine's Poll, and position's read of the ring
	taken uint64     // events taken from the ring: the next one's position
	order chan struct{}
	bmu   sync.Mutex
	born  map[bornKey]uint64 // by live object: the position at its creation
}

// bornKey names a live object by kind and handle (a QP's masked, as the
// QP table keys it).
type bornKey struct {
	kind   string // kindQP, kindCQ, kindSRQ
	handle uint32
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
				d.async.rmu.Lock()
				n, err := d.asyncRing.Poll(buf[:])
				pos := d.async.taken
				d.async.taken += uint64(n)
				d.async.rmu.Unlock()
				if err != nil {
					d.async.err.Store(&err)
					return
				}
				for i, e := range buf[:n] {
					d.dispatch(e, pos+uint64(i))
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
// driver acted on each (see AsyncEvent): the one way they reach the user
// (libibverbs' ibv_get_async_event reads the same stream). It holds 64
// events not yet received; an event that finds it full is dropped and
// counted (AsyncStats): the driver never waits for a reader. On a device
// that raises none (QEMU 7.2: Quirks.NoAsyncEvents) nothing ever arrives.
// Close closes it, once the events before it are in.
func (d *Device) AsyncEvents() <-chan AsyncEvent { return d.async.ch }

// AsyncStats returns the async-event counters, and the ring fault that
// stopped the driver taking them, if one did.
func (d *Device) AsyncStats() (AsyncStats, error) {
	var err error
	if p := d.async.err.Load(); p != nil {
		err = d.opErr("async events", *p)
	}
	return AsyncStats{Events: d.async.events.Load(), Dropped: d.async.dropped.Load(), Unknown: d.async.unknown.Load(),
		Stale: d.async.stale.Load()}, err
}

// dispatch acts on one event, the device's pos'th, and delivers it. An
// event written before the object that now has its handle was created is
// a destroyed object's (orderCommands): it names no object.
func (d *Device) dispatch(e firmware.AsyncEvent, pos uint64) {
	d.async.events.Add(1)
	ev := AsyncEvent{Type: e.Type, Info: e.Info}
	known := true
	switch e.Type {
	case firmware.EventQPFatal, firmware.EventQPReqErr, firmware.EventQPAccessErr:
		if ev.QP = d.qpForEvent(e.Info, pos); ev.QP != nil {
			ev.QP.state.Store(uint32(StateErr))
		}
		known = ev.QP != nil
	case firmware.EventCommEst, firmware.EventSQDrained, firmware.EventPathMig,
		firmware.EventPathMigErr, firmware.EventQPLastWQEReached:
		ev.QP = d.qpForEvent(e.Info, pos)
		known = ev.QP != nil
	case firmware.EventCQErr:
		if !d.async.staleAt(kindCQ, e.Info, pos) {
			ev.CQ = d.cqByHandle(e.Info)
		}
		if ev.CQ != nil {
			ev.CQ.fail(ErrCQOverrun)
		}
		known = ev.CQ != nil
	case firmware.EventSRQErr, firmware.EventSRQLimitReached:
		if !d.async.staleAt(kindSRQ, e.Info, pos) {
			ev.SRQ = d.srqByHandle(e.Info)
		}
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
	if h := d.hooks(); h != nil && h.dispatched != nil {
		h.dispatched(ev)
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

// qpForEvent returns the QP a QP event at pos names: the one the QP table
// has for its handle, unless the event was written before that QP was
// created.
func (d *Device) qpForEvent(info uint32, pos uint64) *QP {
	if d.async.staleAt(kindQP, info&d.qpHandleMask(), pos) {
		return nil
	}
	return d.qpByHandle(info)
}

// The order of events and objects. An event names its object by handle,
// and the device gives a destroyed object's handle to the next object of
// its kind that it creates. An event the device wrote for a QP, CQ or SRQ
// may still wait in the ring while that object is destroyed and a new one
// gets its handle (the goroutine is behind: not yet woken by the vector,
// or not yet scheduled): found by its handle, it would fail the new
// object. Draining the ring when a DESTROY completes is not enough: the
// goroutine may have taken the event from the ring and not yet acted on
// it. So events and objects are placed in one sequence instead: each event has its
// position, the count of events the device wrote before it; each object
// the position the sequence had reached when its CREATE was sent; an
// event before that position is not the object's.
//
// That is exact because the device runs one command at a time, writes an
// object's events only while it has the object, and writes each event
// (the element, then prod_tail) before it answers the command after it;
// its writes to memory are seen in the order it makes them. The driver
// holds order across each CREATE and DESTROY of a QP, CQ or SRQ, until
// the device has answered, and reads the position while it holds it,
// before it sends a CREATE. The handle the CREATE returns was freed by a
// DESTROY the device ran before it: one answered before order was taken,
// so before the position was read, and every event of the destroyed
// object is below the position. Every event of the new object is written
// once the device has run its CREATE, after the position was read: at it
// or above. (A DESTROY the driver gave up waiting for is outside this
// order: it reported it failed and keeps the object.)

// orderCommands returns the device's commands with the QP, CQ and SRQ
// CREATEs and DESTROYs placed among the async events (the order above).
func (d *Device) orderCommands(ch commands) commands {
	d.async.order = make(chan struct{}, 1)
	d.async.born = map[bornKey]uint64{}
	return &orderedCommands{commands: ch, d: d}
}

// orderedCommands are the device's commands, each QP, CQ and SRQ CREATE
// and DESTROY run under order: a CREATE records the position at which the
// object was born, a DESTROY that succeeds forgets it.
type orderedCommands struct {
	commands
	d *Device
}

// position returns the position of the next event the device will write:
// those taken from the ring and those waiting in it. A ring whose
// prod_tail is out of range counts none waiting (the goroutine stops on
// it: no event is dispatched after).
func (d *Device) position() uint64 {
	d.async.rmu.Lock()
	defer d.async.rmu.Unlock()
	if d.asyncRing == nil {
		return d.async.taken
	}
	n, err := d.asyncRing.Pending()
	if err != nil {
		n = 0
	}
	return d.async.taken + uint64(n)
}

// ordered runs a CREATE or DESTROY with order held (bounded by ctx while
// it waits for it, as the command channel is).
func (d *Device) ordered(ctx context.Context, op string, run func() error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: waiting for the command channel: %w", op, err)
	}
	select {
	case d.async.order <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("%s: waiting for the command channel: %w", op, ctx.Err())
	}
	defer func() { <-d.async.order }()
	return run()
}

// orderedCreate runs a CREATE, which returns the new object's key, and records
// its position.
func (d *Device) orderedCreate(ctx context.Context, op, kind string, run func() (uint32, error)) error {
	return d.ordered(ctx, op, func() error {
		pos := d.position()
		key, err := run()
		if err != nil {
			return err
		}
		d.async.bmu.Lock()
		d.async.born[bornKey{kind, key}] = pos
		d.async.bmu.Unlock()
		return nil
	})
}

// orderedDestroy runs a DESTROY of the object keyed key, and forgets its
// position if the device destroyed it.
func (d *Device) orderedDestroy(ctx context.Context, op, kind string, key uint32, run func() error) error {
	return d.ordered(ctx, op, func() error {
		if err := run(); err != nil {
			return err
		}
		d.async.bmu.Lock()
		delete(d.async.born, bornKey{kind, key})
		d.async.bmu.Unlock()
		return nil
	})
}

// staleAt reports whether an event at pos naming the object of kind keyed
// key was written before that object was created: a destroyed object's.
// It counts those.
func (a *asyncEvents) staleAt(kind string, key uint32, pos uint64) bool {
	a.bmu.Lock()
	born, ok := a.born[bornKey{kind, key}]
	a.bmu.Unlock()
	if ok && pos < born {
		a.stale.Add(1)
		return true
	}
	return false
}

func (o *orderedCommands) CreateQP(ctx context.Context, req firmware.CreateQPRequest) (firmware.CreateQPResponse, error) {
	var resp firmware.CreateQPResponse
	err := o.d.orderedCreate(ctx, "create QP", kindQP, func() (uint32, error) {
		var err error
		resp, err = o.commands.CreateQP(ctx, req)
		return resp.QPHandle & o.d.qpHandleMask(), err
	})
	return resp, err
}

func (o *orderedCommands) DestroyQP(ctx context.Context, qp uint32) error {
	return o.d.orderedDestroy(ctx, "destroy QP", kindQP, qp&o.d.qpHandleMask(), func() error { return o.commands.DestroyQP(ctx, qp) })
}

func (o *orderedCommands) CreateCQ(ctx context.Context, req firmware.CreateCQRequest) (firmware.CreateCQResponse, error) {
	var resp firmware.CreateCQResponse
	err := o.d.orderedCreate(ctx, "create CQ", kindCQ, func() (uint32, error) {
		var err error
		resp, err = o.commands.CreateCQ(ctx, req)
		return resp.CQHandle, err
	})
	return resp, err
}

func (o *orderedCommands) DestroyCQ(ctx context.Context, cq uint32) error {
	return o.d.orderedDestroy(ctx, "destroy CQ", kindCQ, cq, func() error { return o.commands.DestroyCQ(ctx, cq) })
}

func (o *orderedCommands) CreateSRQ(ctx context.Context, req firmware.CreateSRQRequest) (uint32, error) {
	var h uint32
	err := o.d.orderedCreate(ctx, "create SRQ", kindSRQ, func() (uint32, error) {
		var err error
		h, err = o.commands.CreateSRQ(ctx, req)
		return h, err
	})
	return h, err
}

func (o *orderedCommands) DestroySRQ(ctx context.Context, srq uint32) error {
	return o.d.orderedDestroy(ctx, "destroy SRQ", kindSRQ, srq, func() error { return o.commands.DestroySRQ(ctx, srq) })
}
