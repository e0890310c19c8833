package vfrdma

import (
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/event"
	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/mmio"
	"github.com/vfrdma/vfrdma/rings"
)

// fakeCmds is a scripted command channel for the control path on the host:
// the DESTROY commands succeed (and tell forget, the fake device's hook,
// to let go of the object) unless fail names them; CREATE_PD hands out
// handles. A command it does not script panics (the nil embedded
// interface).
type fakeCmds struct {
	commands

	mu        sync.Mutex
	fail      map[string]error    // by kind: "qp", "cq", "srq", "mr", "pd", "bind"
	destroyed map[string][]uint32 // what the device confirmed destroyed
	created   []uint32            // PD handles given out
	next      uint32
	createPD  chan struct{} // if set, CREATE_PD waits for it
	forget    func(kind string, h uint32)
}

func newFakeCmds() *fakeCmds {
	return &fakeCmds{fail: map[string]error{}, destroyed: map[string][]uint32{}, next: 100}
}

func (f *fakeCmds) destroy(kind string, h uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail[kind]; err != nil {
		return err
	}
	f.destroyed[kind] = append(f.destroyed[kind], h)
	if f.forget != nil {
		f.forget(kind, h)
	}
	return nil
}

func (f *fakeCmds) setFail(kind string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[kind] = err
}

func (f *fakeCmds) destroyedOf(kind string) []uint32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]uint32(nil), f.destroyed[kind]...)
}

func (f *fakeCmds) Close() error            { return nil }
func (f *fakeCmds) Quirks() firmware.Quirks { return firmware.Quirks{Emulated: true} }
func (f *fakeCmds) SetInterruptMask(context.Context, uint32) error {
	return nil
}
func (f *fakeCmds) DestroyQP(_ context.Context, h uint32) error  { return f.destroy(kindQP, h) }
func (f *fakeCmds) DestroyCQ(_ context.Context, h uint32) error  { return f.destroy(kindCQ, h) }
func (f *fakeCmds) DestroySRQ(_ context.Context, h uint32) error { return f.destroy(kindSRQ, h) }
func (f *fakeCmds) DestroyMR(_ context.Context, h uint32) error  { return f.destroy(kindMR, h) }
func (f *fakeCmds) DestroyPD(_ context.Context, h uint32) error  { return f.destroy(kindPD, h) }
func (f *fakeCmds) DestroyBind(_ context.Context, r firmware.DestroyBindRequest) error {
	return f.destroy(kindBind, r.Index)
}
func (f *fakeCmds) ModifyQP(context.Context, firmware.ModifyQPRequest) error { return nil }
func (f *fakeCmds) QueryPort(context.Context, uint8) (firmware.PortAttr, error) {
	return firmware.PortAttr{}, nil
}

func (f *fakeCmds) CreatePD(ctx context.Context, _ uint32) (uint32, error) {
	if f.createPD != nil {
		<-f.createPD
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	f.created = append(f.created, f.next)
	return f.next, nil
}

// fakeIRQ is the CQ vector: the fake device raises it, the notifier waits
// on it.
type fakeIRQ chan struct{}

func (c fakeIRQ) Wait(ctx context.Context) (uint64, error) {
	select {
	case <-c:
		return 1, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func (c fakeIRQ) raise() {
	select {
	case c <- struct{}{}:
	default:
	}
}

// lcDevice is a Device on the host: the scripted command channel, a CQ
// vector, and memory poisoned where the driver frees it, so that a call
// touching freed memory is a data race (-race) or reads garbage.
type lcDevice struct {
	d    *Device
	cmds *fakeCmds
	irq  fakeIRQ
	pd   *PD
	mr   *MR
}

func newLCDevice(t testing.TB) *lcDevice {
	t.Helper()
	uar, err := mmio.New(make([]byte, 4096))
	require.NoError(t, err)
	l := &lcDevice{cmds: newFakeCmds(), irq: make(fakeIRQ, 1)}
	d := &Device{name: "fake", opt: (&Options{StateDir: "-"}).withDefaults(), uar: uar, emulated: true, udMax: 4096,
		pds: map[*PD]struct{}{}, cqs: map[*CQ]struct{}{}, mrs: map[*MR]struct{}{}, qps: map[*QP]struct{}{}, srqs: map[*SRQ]struct{}{}, binds: map[uint32]GID{},
		cqArm: [2]uint32{doorbell.CQArm | doorbell.CQArmSol, doorbell.CQArm | doorbell.CQArmSol}}
	d.cqIRQ = l.irq
	d.ch = l.cmds
	d.gidSet.set(0, true)
	d.notify.d = d
	setTestHooks(t, d, &testHooks{onFree: func(mem []byte) {
		for i := range mem {
			mem[i] = 0xAB
		}
	}})
	l.d = d
	l.pd = &PD{d: d, handle: 1}
	d.pds[l.pd] = struct{}{}
	l.mr = &MR{pd: l.pd, handle: 3, lkey: 0x77, access: AccessLocalWrite, addr: 0x100000, mem: make([]byte, 1<<16)}
	require.NoError(t, d.addMR(l.mr))
	l.pd.hold(+1)
	return l
}

// addCQ makes a CQ of n entries as CreateCQ would, without the command;
// it returns the device's producer of its ring.
func (l *lcDevice) addCQ(t testing.TB, handle uint32, n int) (*CQ, *rings.Producer) {
	t.Helper()
	state := make([]byte, 16)
	st, err := rings.NewState(state[8:16])
	require.NoError(t, err)
	cons, err := rings.NewConsumer(st, n)
	require.NoError(t, err)
	prod, err := rings.NewProducer(st, n)
	require.NoError(t, err)
	cq := newCQ(l.d, handle, n, nil, st, cons, make([]byte, n*CQESize))
	l.d.mu.Lock()
	l.d.cqs[cq] = struct{}{}
	l.d.mu.Unlock()
	l.d.notify.add(cq)
	return cq, prod
}

// addQP makes an RTS RC QP on cq as CreateQP would, without the command;
// it returns the device's consumer of its send queue.
func (l *lcDevice) addQP(t testing.TB, qpn uint32, cq *CQ, depth int) (*QP, *rings.Consumer) {
	t.Helper()
	state := make([]byte, 16)
	qp := &QP{pd: l.pd, d: l.d, typ: RC, qpn: qpn, handle: qpn, sendCQ: cq, recvCQ: cq, udMax: 4096, devicesQP: true}
	require.NoError(t, qp.initQueue(&qp.sq, state[0:8], make([]byte, depth*rings.SendStride(1)), rings.SendStride(1), depth, 1, doorbell.QPSend))
	require.NoError(t, qp.initQueue(&qp.rq, state[8:16], make([]byte, depth*rings.RecvStride(1)), rings.RecvStride(1), depth, 1, doorbell.QPRecv))
	qp.state.Store(uint32(StateRTS))
	require.NoError(t, l.d.addQP(context.Background(), qp))
	l.pd.hold(+1)
	cq.hold(+2)
	st, err := rings.NewState(state[0:8])
	require.NoError(t, err)
	sq, err := rings.NewConsumer(st, depth)
	require.NoError(t, err)
	return qp, sq
}

// complete is the device completing every send published on qp (through
// sq, its consumer of the send queue) with a CQE on prod's ring.
func complete(t testing.TB, qp *QP, sq *rings.Consumer, cq *CQ, prod *rings.Producer) int {
	ready, err := sq.Ready()
	require.NoError(t, err)
	for i := 0; i < ready; i++ {
		e := rings.CQE{WRID: binary.LittleEndian.Uint64(qp.sq.Slot(sq.Slot(i))), QP: uint64(qp.handle)}
		rings.PutCQE(cq.data[prod.Next(0)*CQESize:], &e)
		prod.Advance(1)
	}
	sq.Consume(ready)
	prod.Publish()
	return ready
}

func (l *lcDevice) send(id uint64) []SendWR {
	return []SendWR{{WRID: id, SGEs: []SGE{l.mr.SGE(0, 64)}}}
}

// After CQ.Close, every method of the CQ returns an error wrapping
// ErrClosed, and a second Close returns nil; none reads the freed ring (on
// the device that read is a SIGSEGV).
func TestCQCallsAfterCloseReturnErrClosed(t *testing.T) {
	l := newLCDevice(t)
	cq, _ := l.addCQ(t, 5, 64)
	require.NoError(t, cq.Close())
	assert.Equal(t, []uint32{5}, l.cmds.destroyedOf(kindCQ))
	_, err := cq.Poll(make([]WC, 4))
	assert.ErrorIs(t, err, ErrClosed, "Poll")
	assert.ErrorIs(t, cq.Arm(false), ErrClosed, "Arm")
	assert.ErrorIs(t, cq.Wait(context.Background()), ErrClosed, "Wait")
	_, err = cq.Source().Ready(true, nil)
	assert.ErrorIs(t, err, ErrClosed, "CQSource.Ready")
	_, err = cq.Source().Progress()
	assert.ErrorIs(t, err, ErrClosed, "CQSource.Progress")
	assert.ErrorIs(t, cq.SetMode(CQCounted), ErrClosed, "SetMode")
	assert.ErrorIs(t, cq.TryWait(), ErrClosed, "TryWait")
	_, err = cq.FD()
	assert.ErrorIs(t, err, ErrClosed, "FD")
	assert.NoError(t, cq.Close(), "a second Close")
	assert.Len(t, l.cmds.destroyedOf(kindCQ), 1, "DESTROY_CQ sent once")
}

// After Device.Close, every object's methods return errors wrapping
// ErrClosed (the ring memory is poisoned: a call that read it would race
// with the poisoning under -race), object Closes and a second Device.Close
// return nil, and the device was told to destroy everything.
func TestDeviceCallsAfterCloseReturnErrClosed(t *testing.T) {
	l := newLCDevice(t)
	cq, _ := l.addCQ(t, 5, 64)
	qp, _ := l.addQP(t, 0x42, cq, 16)
	ps, ws := setsOf(t, cq)
	require.NoError(t, l.d.Close())
	assert.ElementsMatch(t, []uint32{0x42}, l.cmds.destroyedOf(kindQP))
	assert.ElementsMatch(t, []uint32{5}, l.cmds.destroyedOf(kindCQ))
	assert.ElementsMatch(t, []uint32{3}, l.cmds.destroyedOf(kindMR))
	assert.ElementsMatch(t, []uint32{1}, l.cmds.destroyedOf(kindPD))

	_, err := cq.Poll(make([]WC, 4))
	assert.ErrorIs(t, err, ErrClosed, "CQ.Poll")
	assert.ErrorIs(t, cq.Arm(false), ErrClosed, "CQ.Arm")
	assert.ErrorIs(t, cq.Wait(context.Background()), ErrClosed, "CQ.Wait")
	_, err = qp.PostSend(l.send(1), 0)
	assert.ErrorIs(t, err, ErrClosed, "QP.PostSend")
	_, err = qp.PostRecv([]RecvWR{{WRID: 2}}, 0)
	assert.ErrorIs(t, err, ErrClosed, "QP.PostRecv")
	assert.ErrorIs(t, qp.Ring(), ErrClosed, "QP.Ring")
	assert.ErrorIs(t, qp.Init(context.Background()), ErrClosed, "QP.Init")
	assert.ErrorIs(t, qp.SetError(context.Background()), ErrClosed, "QP.SetError")
	_, err = qp.QueryState(context.Background())
	assert.ErrorIs(t, err, ErrClosed, "QP.QueryState")
	assert.ErrorIs(t, l.d.notify.Sync(), ErrClosed, "the poll sets' Sync")
	_, err = ps.Poll(make([]int, 4))
	assert.ErrorIs(t, err, ErrClosed, "PollSet.Poll")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	assert.ErrorIs(t, ws.Wait(ctx), ErrClosed, "WaitSet.Wait")
	_, err = l.d.AllocPD(context.Background())
	assert.ErrorIs(t, err, ErrClosed, "AllocPD")
	_, err = l.d.CreateCQ(context.Background(), 16)
	assert.ErrorIs(t, err, ErrClosed, "CreateCQ")
	_, err = l.pd.CreateAH(AHAttr{})
	assert.ErrorIs(t, err, ErrClosed, "CreateAH")
	_, err = l.pd.CreateQP(context.Background(), &QPConfig{SendCQ: cq, RecvCQ: cq})
	assert.ErrorIs(t, err, ErrClosed, "CreateQP")
	_, err = l.d.QueryPort(context.Background())
	assert.ErrorIs(t, err, ErrClosed, "QueryPort")
	assert.Nil(t, l.mr.Bytes(), "MR.Bytes of a closed MR")

	assert.NoError(t, qp.Close(), "QP.Close after Device.Close")
	assert.NoError(t, cq.Close(), "CQ.Close after Device.Close")
	assert.NoError(t, l.pd.Close(), "PD.Close after Device.Close")
	assert.NoError(t, l.d.Close(), "a second Device.Close")
}

// setsOf puts cq in a poll set and a wait set, closed at the test's end.
func setsOf(t testing.TB, cq *CQ) (*eventPollSet, *eventWaitSet) {
	t.Helper()
	ps := newEventPollSet()
	require.NoError(t, ps.Add(cq.Source(), 1))
	ws, err := newEventWaitSet()
	require.NoError(t, err)
	require.NoError(t, ws.Add(cq.Source()))
	t.Cleanup(func() { _ = ws.Close() })
	return ps, ws
}

// A CQ.Wait asleep when Device.Close runs (or CQ.Close) returns ErrClosed
// at once, and a goroutine polling in a loop stops with ErrClosed.
func TestCloseReleasesWaitersAndPollers(t *testing.T) {
	for _, how := range []string{"CQ.Close", "Device.Close"} {
		t.Run(how, func(t *testing.T) {
			l := newLCDevice(t)
			cq, _ := l.addCQ(t, 5, 64)
			cq2, _ := l.addCQ(t, 6, 64)
			waitErr := make(chan error, 1)
			go func() { waitErr <- cq.Wait(context.Background()) }()
			pollErr := make(chan error, 1)
			go func() {
				wcs := make([]WC, 8)
				for {
					if _, err := cq2.Poll(wcs); err != nil {
						pollErr <- err
						return
					}
				}
			}()
			// Let the waiter arm and sleep; whether it has yet or not, it
			// must return ErrClosed.
			time.Sleep(10 * time.Millisecond)
			if how == "CQ.Close" {
				require.NoError(t, cq.Close())
				require.NoError(t, cq2.Close())
			} else {
				require.NoError(t, l.d.Close())
			}
			assert.ErrorIs(t, <-waitErr, ErrClosed, "the waiter")
			assert.ErrorIs(t, <-pollErr, ErrClosed, "the poller")
			l.d.notify.stop()
		})
	}
}

// A CQ whose DESTROY_CQ fails stays alive: Close returns the error, and
// the CQ polls, stays registered and closes later.
func TestCQStaysAliveIfDestroyFails(t *testing.T) {
	l := newLCDevice(t)
	cq, prod := l.addCQ(t, 5, 64)
	qp, sq := l.addQP(t, 0x42, cq, 16)
	_, err := qp.PostSend(l.send(7), 0)
	require.NoError(t, err)
	require.NoError(t, qp.Close())
	l.cmds.setFail(kindCQ, syscall.EIO)
	assert.ErrorIs(t, cq.Close(), syscall.EIO)
	wcs := make([]WC, 4)
	n, err := cq.Poll(wcs)
	require.NoError(t, err, "Poll after a failed Close")
	require.Equal(t, 1, n)
	assert.Equal(t, WCFlushErr, wcs[0].Status)
	assert.NoError(t, cq.Arm(false), "Arm after a failed Close")
	l.d.mu.Lock()
	_, registered := l.d.cqs[cq]
	l.d.mu.Unlock()
	assert.True(t, registered, "the CQ is still the device's")
	_ = sq
	_ = prod
	l.cmds.setFail(kindCQ, nil)
	assert.NoError(t, cq.Close())
	_, err = cq.Poll(wcs)
	assert.ErrorIs(t, err, ErrClosed)
}

// A QP whose DESTROY_QP fails stays usable: posts go on.
func TestQPStaysUsableIfDestroyFails(t *testing.T) {
	l := newLCDevice(t)
	cq, _ := l.addCQ(t, 5, 64)
	qp, _ := l.addQP(t, 0x42, cq, 16)
	l.cmds.setFail(kindQP, syscall.EIO)
	assert.ErrorIs(t, qp.Close(), syscall.EIO)
	_, err := qp.PostSend(l.send(1), 0)
	assert.NoError(t, err, "a post after a failed Close")
	l.cmds.setFail(kindQP, nil)
	assert.NoError(t, qp.Close())
	_, err = qp.PostSend(l.send(2), 0)
	assert.ErrorIs(t, err, ErrClosed)
}

// A QP number the device gives again never receives the CQEs of the QP
// that had it: those still in the CQ when it was destroyed complete the
// destroyed QP's requests, and the new QP's requests stay outstanding,
// even those with the same wr_ids.
func TestReusedQPNGetsNoLateCQEs(t *testing.T) {
	l := newLCDevice(t)
	cq, prod := l.addCQ(t, 5, 64)
	old, sq := l.addQP(t, 0x142, cq, 16)
	for id := range uint64(2) {
		_, err := old.PostSend(l.send(id), 0)
		require.NoError(t, err)
	}
	require.Equal(t, 2, complete(t, old, sq, cq, prod), "the device completed both")
	require.NoError(t, old.Close()) // the CQEs are still in the ring
	nu, _ := l.addQP(t, 0x142, cq, 16)
	for id := range uint64(2) {
		_, err := nu.PostSend(l.send(id), 0)
		require.NoError(t, err)
	}
	wcs := make([]WC, 8)
	n, err := cq.Poll(wcs)
	require.NoError(t, err)
	require.Equal(t, 2, n, "the old QP's completions")
	for _, wc := range wcs[:n] {
		assert.Equal(t, WCSuccess, wc.Status)
		assert.Equal(t, uint32(0x142), wc.QPN, "completions carry the QP's number")
	}
	send, _ := nu.Outstanding()
	assert.Equal(t, 2, send, "the new QP's sends are still outstanding")
	assert.Equal(t, nu, l.d.qpns.Lookup(0x142), "the number is the new QP's")
	assert.Nil(t, l.d.qpns.Lookup(old.alias), "the drained old QP left the table")
}

// QP.SetError (QEMU: it destroys the device's QP) and QP.Close beside a
// goroutine posting: the poster's doorbell and ring are never touched by
// the other goroutine while it posts (-race would report it), and each of
// its posts completes or is refused with ErrQPState or ErrClosed.
func TestSetErrorAndCloseBesidePoster(t *testing.T) {
	for _, how := range []string{"SetError", "Close"} {
		t.Run(how, func(t *testing.T) {
			for range 20 {
				l := newLCDevice(t)
				cq, _ := l.addCQ(t, 5, 256)
				qp, _ := l.addQP(t, 0x42, cq, 64)
				done := make(chan error, 1)
				go func() {
					for i := uint64(0); ; i++ {
						flags := PostFlags(0)
						if i%3 != 0 {
							flags = FlagDefer
						}
						_, err := qp.PostSend(l.send(i), flags)
						switch {
						case err == nil, errors.Is(err, ErrQueueFull):
						case errors.Is(err, ErrQPState), errors.Is(err, ErrClosed):
							done <- nil
							return
						default:
							done <- err
							return
						}
					}
				}()
				time.Sleep(time.Millisecond)
				if how == "SetError" {
					require.NoError(t, qp.SetError(context.Background()))
				} else {
					require.NoError(t, qp.Close())
				}
				require.NoError(t, <-done)
				require.NoError(t, l.d.Close())
			}
		})
	}
}

// Device.Close racing AllocPD leaks nothing: the PD is refused, or created
// and destroyed by Close.
func TestDeviceCloseRacingCreateLeaksNothing(t *testing.T) {
	l := newLCDevice(t)
	l.cmds.createPD = make(chan struct{})
	type result struct {
		pd  *PD
		err error
	}
	res := make(chan result, 1)
	go func() {
		pd, err := l.d.AllocPD(context.Background())
		res <- result{pd, err}
	}()
	// Close once the creation is inside (it waits at CREATE_PD), and let
	// the device answer only once Close has shut the gate: whatever the
	// machine's load, the creation is inside when Close begins.
	require.Eventually(t, func() bool { return l.d.gate.Inside() > 0 }, time.Minute, 100*time.Microsecond, "the creation never entered")
	closed := make(chan error, 1)
	go func() { closed <- l.d.Close() }()
	require.Eventually(t, l.d.gate.IsShut, time.Minute, 100*time.Microsecond, "Close never shut the gate")
	close(l.cmds.createPD) // the device answers CREATE_PD now
	r := <-res
	require.NoError(t, <-closed)
	require.NoError(t, r.err, "the creation was inside when Close began: it completes")
	l.cmds.mu.Lock()
	created := append([]uint32(nil), l.cmds.created...)
	l.cmds.mu.Unlock()
	assert.Subset(t, l.cmds.destroyedOf(kindPD), created, "every PD created was destroyed")
	_, err := r.pd.CreateAH(AHAttr{})
	assert.ErrorIs(t, err, ErrClosed)
}

// Recovered counts what the device confirmed destroyed: a journal of
// handles that never existed (each DESTROY answers EINVAL) recovers 0: an
// entry counts only when its DESTROY succeeds.
func TestRecoveredCountsConfirmedDestroys(t *testing.T) {
	left := []journalEntry{{kindQP, 9}, {kindCQ, 8}, {kindMR, 7}, {kindPD, 6}, {kindBind, 5}}
	none := destroyLeftovers(left, func(journalEntry) error { return syscall.EINVAL })
	assert.Zero(t, none, "a journal of handles the device does not know")
	some := destroyLeftovers(left, func(e journalEntry) error {
		if e.Kind == kindCQ || e.Kind == kindPD {
			return nil
		}
		return syscall.EINVAL
	})
	assert.Equal(t, 2, some)
}

// The event package's sets, as the tests here use them.
type (
	eventPollSet = event.PollSet[int]
	eventWaitSet = event.WaitSet
)

func newEventPollSet() *eventPollSet { return event.NewPollSet[int]() }

func newEventWaitSet() (*eventWaitSet, error) { return event.NewWaitSet(event.Chan) }

// CQ.Stats is safe beside the poller: another goroutine reads it while the
// CQ is polled (no data race under -race), and the counts
// it returns never run backwards and end exact.
func TestCQStatsBesidePoller(t *testing.T) {
	f := newFixture(t, RC, 64)
	const rounds = 2000
	done := make(chan struct{})
	go func() {
		defer close(done)
		wrs := []SendWR{{WRID: 1, SGEs: []SGE{f.sge(0, 64)}}}
		wcs := make([]WC, 4)
		for range rounds {
			if _, err := f.qp.PostSend(wrs, 0); err != nil {
				t.Error(err)
				return
			}
			f.device(t, 0)
			for got := 0; got < 1; {
				n, err := f.cq.Poll(wcs)
				if err != nil {
					t.Error(err)
					return
				}
				got += n
			}
		}
	}()
	var last CQStats
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		st := f.cq.Stats()
		require.GreaterOrEqual(t, st.CQEs, last.CQEs, "CQEs ran backwards")
		require.GreaterOrEqual(t, st.Polls, last.Polls, "Polls ran backwards")
		last = st
	}
	assert.Equal(t, uint64(rounds), f.cq.Stats().CQEs)
}

// On QEMU 7.2 a QP is destroyed only once the device has completed its
// outstanding sends (their CQEs are in the ring): QEMU aborts when a QP
// goes while its completion thread still handles one of its completions.
// The fake device completes 50 ms after the post; DESTROY_QP must come
// after that, though nobody polls.
func TestQEMUDestroysAQPOnlyAfterItsSendsCompleted(t *testing.T) {
	l := newLCDevice(t)
	l.d.drainSends = true
	l.d.hooks().drainFor = time.Minute // the fake's 50 ms must not race the bound on a loaded host
	cq, prod := l.addCQ(t, 5, 64)
	qp, sq := l.addQP(t, 0x40, cq, 16)
	_, err := qp.PostSend(l.send(1), 0)
	require.NoError(t, err)
	var completed atomic.Bool
	go func() {
		time.Sleep(50 * time.Millisecond)
		completed.Store(true)
		complete(t, qp, sq, cq, prod)
	}()
	var atDestroy atomic.Bool
	l.cmds.forget = func(kind string, _ uint32) {
		if kind == kindQP {
			atDestroy.Store(completed.Load())
		}
	}
	require.NoError(t, qp.Close())
	assert.True(t, atDestroy.Load(), "DESTROY_QP before the send's completion was in the ring")
}

// Before a QP's destroy on QEMU 7.2, its CQs must have had no CQE written
// for drainGrace (QP.awaitQuietCQs): QEMU's completion thread, having
// written a CQE, may still be raising the CQ's interrupt and unlinking the
// request from the QP, and a destroy that overtakes it aborts QEMU. A CQE
// just written on the receive CQ counts as one on the send CQ does; CQs
// quiet since a look drainGrace ago need no pause.
func TestQEMUDestroyWaitsUntilTheQPsCQsWereQuietForTheGrace(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cqe   string // "send", "recv" or "" (a look a grace ago, nothing since)
		pause bool
	}{
		{"a CQE just written on the send CQ", "send", true},
		{"a CQE just written on the receive CQ", "recv", true},
		{"both CQs quiet for the grace", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLCDevice(t)
			l.d.drainSends = true
			var events []string
			l.d.hooks().drainPause = func(_ context.Context, d time.Duration) {
				assert.LessOrEqual(t, d, drainGrace)
				events = append(events, "pause")
				time.Sleep(d)
			}
			l.cmds.forget = func(kind string, _ uint32) {
				if kind == kindQP {
					events = append(events, "destroy")
				}
			}
			scq, sprod := l.addCQ(t, 5, 64)
			rcq, rprod := l.addCQ(t, 6, 64)
			qp, sq := l.addQP(t, 0x40, scq, 16)
			qp.recvCQ = rcq
			scq.hold(-1)
			rcq.hold(+1)
			// The CQs' clocks start at a first look, a grace before the
			// destroy.
			scq.quietWait(drainGrace)
			rcq.quietWait(drainGrace)
			time.Sleep(drainGrace)
			switch tc.cqe {
			case "send":
				_, err := qp.PostSend(l.send(1), 0)
				require.NoError(t, err)
				complete(t, qp, sq, scq, sprod)
			case "recv":
				rings.PutCQE(rcq.data[rprod.Next(0)*CQESize:], &rings.CQE{WRID: 9, QP: uint64(qp.handle), Opcode: uint32(WCRecv)})
				rprod.Advance(1)
				rprod.Publish()
			}
			require.NoError(t, qp.Close())
			if tc.pause {
				require.GreaterOrEqual(t, len(events), 2)
				assert.Equal(t, "pause", events[0])
				assert.Equal(t, "destroy", events[len(events)-1])
			} else {
				assert.Equal(t, []string{"destroy"}, events)
			}
		})
	}
}

// The wait is bounded: a send the device never completes delays the
// destroy by drainLimit, not for good.
func TestQEMUDestroyWaitIsBounded(t *testing.T) {
	l := newLCDevice(t)
	l.d.drainSends = true
	cq, _ := l.addCQ(t, 5, 64)
	qp, _ := l.addQP(t, 0x40, cq, 16)
	_, err := qp.PostSend(l.send(1), 0)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- qp.Close() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(drainLimit + 10*time.Second):
		require.FailNow(t, "Close waited past its bound")
	}
}

// A CQ whose DESTROY has completed may still be in the device's table
// while the device gives its handle to a new CQ: an event naming the
// handle finds the live CQ, not the one being removed.
func TestAnEventForAReusedCQHandleFindsTheLiveCQNotTheOneBeingRemoved(t *testing.T) {
	l := newLCDevice(t)
	old, _ := l.addCQ(t, 5, 64)
	live, _ := l.addCQ(t, 5, 64)
	old.gate.Close()
	for range 8 { // whichever the table's order gives first
		assert.Same(t, live, l.d.cqByHandle(5))
	}
	assert.Nil(t, l.d.cqByHandle(6), "a handle no CQ has")
}
