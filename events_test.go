package vfrdma

import (
	"context"
	"encoding/binary"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/mmio"
)

// newAsyncDevice is the host device with the async-event channel a real
// Open makes.
func newAsyncDevice(t *testing.T) *lcDevice {
	l := newLCDevice(t)
	l.d.async.ch = make(chan AsyncEvent, asyncEventsBuffer)
	return l
}

func nextEvent(t *testing.T, d *Device) AsyncEvent {
	t.Helper()
	select {
	case ev := <-d.AsyncEvents():
		return ev
	case <-time.After(5 * time.Second):
		require.FailNow(t, "no async event delivered")
	}
	return AsyncEvent{}
}

// A QP error event (QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR, by QP handle)
// moves the QP to ERR: posts are refused with ErrQPState, and the event
// reaches the user naming the QP.
func TestQPFatalEventMovesTheQPToErr(t *testing.T) {
	for _, typ := range []AsyncEventType{EventQPFatal, EventQPReqErr, EventQPAccessErr} {
		t.Run(typ.String(), func(t *testing.T) {
			l := newAsyncDevice(t)
			cq, _ := l.addCQ(t, 5, 64)
			qp, _ := l.addQP(t, 0x40, cq, 16)
			l.d.dispatch(firmware.AsyncEvent{Type: typ, Info: qp.handle}, 0)
			assert.Equal(t, StateErr, qp.State())
			_, err := qp.PostSend(l.send(1), 0)
			assert.ErrorIs(t, err, ErrQPState)
			ev := nextEvent(t, l.d)
			assert.Equal(t, typ, ev.Type)
			assert.Same(t, qp, ev.QP)
			select {
			case extra := <-l.d.AsyncEvents():
				assert.Fail(t, "a second event delivered", "%v", extra)
			default:
			}
		})
	}
}

// CQ_ERR fails the CQ: every Poll returns ErrCQOverrun, and a waiter
// asleep on it wakes.
func TestCQErrEventFailsTheCQAndWakesItsWaiter(t *testing.T) {
	l := newAsyncDevice(t)
	cq, _ := l.addCQ(t, 5, 64)
	woke := make(chan error, 1)
	go func() { woke <- cq.Wait(context.Background()) }()
	time.Sleep(10 * time.Millisecond) // asleep, most likely; either way it must return
	l.d.dispatch(firmware.AsyncEvent{Type: EventCQErr, Info: cq.handle}, 0)
	select {
	case err := <-woke:
		assert.NoError(t, err, "Wait returns: the CQ is ready (Poll reports the error)")
	case <-time.After(5 * time.Second):
		require.FailNow(t, "the waiter was not woken")
	}
	for range 2 {
		_, err := cq.Poll(make([]WC, 4))
		assert.ErrorIs(t, err, ErrCQOverrun)
		assert.ErrorIs(t, err, ErrDeviceFault)
	}
	assert.Same(t, cq, nextEvent(t, l.d).CQ)
}

// PORT_ERR and PORT_ACTIVE (port 1) set the port state; an event naming
// a port the device does not have is delivered and counted unknown.
func TestPortEventsSetThePortState(t *testing.T) {
	l := newAsyncDevice(t)
	l.d.portState.Store(firmware.PortActive)
	l.d.dispatch(firmware.AsyncEvent{Type: EventPortErr, Info: 1}, 0)
	assert.Equal(t, PortDown, l.d.PortState())
	assert.Equal(t, 1, nextEvent(t, l.d).Port)
	l.d.dispatch(firmware.AsyncEvent{Type: EventPortActive, Info: 1}, 0)
	assert.Equal(t, PortActive, l.d.PortState())
	nextEvent(t, l.d)
	l.d.dispatch(firmware.AsyncEvent{Type: EventPortErr, Info: 7}, 0)
	assert.Equal(t, PortActive, l.d.PortState(), "port 7 is not ours")
	assert.Equal(t, 7, nextEvent(t, l.d).Port)
	st, err := l.d.AsyncStats()
	require.NoError(t, err)
	assert.Equal(t, AsyncStats{Events: 3, Unknown: 1}, st)
}

// DEVICE_FATAL fails every CQ (ErrDeviceFatal), moves every QP to ERR and
// releases every waiter.
func TestDeviceFatalFailsEveryObjectAndReleasesEveryWaiter(t *testing.T) {
	l := newAsyncDevice(t)
	cq1, _ := l.addCQ(t, 5, 64)
	cq2, _ := l.addCQ(t, 6, 64)
	qp, _ := l.addQP(t, 0x40, cq1, 16)
	woke := make(chan error, 2)
	for _, cq := range []*CQ{cq1, cq2} {
		go func() { woke <- cq.Wait(context.Background()) }()
	}
	l.d.dispatch(firmware.AsyncEvent{Type: EventDeviceFatal}, 0)
	for range 2 {
		select {
		case err := <-woke:
			assert.NoError(t, err)
		case <-time.After(5 * time.Second):
			require.FailNow(t, "a waiter was not released")
		}
	}
	for _, cq := range []*CQ{cq1, cq2} {
		_, err := cq.Poll(make([]WC, 4))
		assert.ErrorIs(t, err, ErrDeviceFatal)
	}
	assert.Equal(t, StateErr, qp.State())
	assert.Equal(t, EventDeviceFatal, nextEvent(t, l.d).Type)
}

// An event naming a handle the driver does not know (an object already
// destroyed) is delivered with no object and counted; a full channel
// drops and counts instead of blocking the device's events.
func TestUnknownHandlesAndAFullChannelAreCounted(t *testing.T) {
	l := newAsyncDevice(t)
	l.d.dispatch(firmware.AsyncEvent{Type: EventQPFatal, Info: 999}, 0)
	ev := nextEvent(t, l.d)
	assert.Nil(t, ev.QP)
	assert.EqualValues(t, 999, ev.Info)
	for range asyncEventsBuffer + 3 {
		l.d.dispatch(firmware.AsyncEvent{Type: EventGIDChange, Info: 1}, 0)
	}
	st, err := l.d.AsyncStats()
	require.NoError(t, err)
	assert.EqualValues(t, 3, st.Dropped)
	assert.EqualValues(t, 1, st.Unknown)
}

// orderFake is a command channel whose DESTROY_QP waits until it is let
// go, and which notes a CREATE_QP sent while a DESTROY_QP is in flight.
type orderFake struct {
	commands
	destroying atomic.Bool
	entered    chan struct{} // a DESTROY_QP is in flight
	release    chan struct{}
	overlapped atomic.Bool
}

func (f *orderFake) DestroyQP(ctx context.Context, qp uint32) error {
	f.destroying.Store(true)
	close(f.entered)
	<-f.release
	f.destroying.Store(false)
	return nil
}

func (f *orderFake) CreateQP(ctx context.Context, req firmware.CreateQPRequest) (firmware.CreateQPResponse, error) {
	if f.destroying.Load() {
		f.overlapped.Store(true)
	}
	return firmware.CreateQPResponse{QPN: 7, QPHandle: 7}, nil
}

// A QP CREATE is not sent while a DESTROY is in flight, and the position
// it records for the new QP is past every event the device wrote before
// the DESTROY was answered: the destroyed QP's event, written while its
// DESTROY ran, is stale for the new QP with its handle; the next event is
// the new QP's.
func TestACreateWaitsForADestroyInFlightAndComesAfterItsEvents(t *testing.T) {
	state, data := make([]byte, firmware.PageSize), make([]byte, firmware.PageSize)
	regs, err := mmio.New(state)
	require.NoError(t, err)
	ring, err := firmware.NewAsyncRing(regs, [][]byte{data})
	require.NoError(t, err)
	d := &Device{asyncRing: ring}
	f := &orderFake{entered: make(chan struct{}), release: make(chan struct{})}
	o := d.orderCommands(f)
	ctx := context.Background()

	destroyed := make(chan error, 1)
	go func() { destroyed <- o.DestroyQP(ctx, 7) }()
	<-f.entered
	created := make(chan error, 1)
	go func() {
		_, err := o.CreateQP(ctx, firmware.CreateQPRequest{})
		created <- err
	}()
	time.Sleep(20 * time.Millisecond) // a CREATE not held back reaches the device meanwhile
	// The device writes the old QP's QP_FATAL (element, then prod_tail),
	// then answers the DESTROY.
	binary.LittleEndian.PutUint32(data[0:], uint32(EventQPFatal))
	binary.LittleEndian.PutUint32(data[4:], 7)
	binary.LittleEndian.PutUint32(state[8:], 1)
	close(f.release)
	require.NoError(t, <-destroyed)
	require.NoError(t, <-created)

	assert.False(t, f.overlapped.Load(), "CREATE_QP sent while a DESTROY_QP was in flight")
	assert.True(t, d.async.staleAt(kindQP, 7, 0), "the old QP's event, at position 0")
	assert.False(t, d.async.staleAt(kindQP, 7, 1), "the next event, at position 1")
	assert.EqualValues(t, 1, d.async.stale.Load())
}
