package vfrdma

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/rings"
)

// A QP handle passing from a QP being destroyed to the next QP created
// (registry.go), on the host over the scripted device: a CreateQP the
// device answers with the handle while the DESTROY_QP of the QP holding
// it is still in flight waits for the destroy's outcome.

// stalledDestroy is the scripted device with its first DESTROY_QP
// stalled: the device has done it (or refused it: answer's error), and
// the driver learns so only when the test sends on answer. Later
// DESTROY_QPs go straight through.
type stalledDestroy struct {
	*rdCmds
	once    sync.Once
	started chan struct{}
	answer  chan error
	quit    chan struct{} // closed at the test's end: a failed test does not hang
}

func stallDestroy(t *testing.T, r *rdDevice) *stalledDestroy {
	s := &stalledDestroy{rdCmds: r.cmds, started: make(chan struct{}), answer: make(chan error), quit: make(chan struct{})}
	r.d.ch = s
	t.Cleanup(func() { close(s.quit) })
	return s
}

func (s *stalledDestroy) DestroyQP(ctx context.Context, h uint32) error {
	first := false
	s.once.Do(func() { first = true })
	if !first {
		return s.rdCmds.DestroyQP(ctx, h)
	}
	close(s.started)
	var err error
	select {
	case err = <-s.answer:
	case <-s.quit:
	}
	if err != nil {
		return err
	}
	return s.rdCmds.DestroyQP(ctx, h)
}

// handleWait is a bound only a hang reaches.
const handleWait = 20 * time.Second

type created struct {
	qp  *QP
	err error
}

// createAsync runs the CreateQP the device answers with a, on cq.
func (r *rdDevice) createAsync(ctx context.Context, cq *CQ, a qpAnswer) <-chan created {
	r.answerQPs(a)
	ch := make(chan created, 1)
	go func() {
		qp, err := r.pd.CreateQP(ctx, &QPConfig{Type: RC, SendCQ: cq, RecvCQ: cq, SendDepth: 8, RecvDepth: 8, SignalAll: true})
		ch <- created{qp, err}
	}()
	return ch
}

// awaitHeir waits until a CreateQP waits for old's handle, or has
// returned (then its result is given back).
func awaitHeir(t *testing.T, d *Device, old *QP, ch <-chan created) *created {
	t.Helper()
	var early *created
	require.Eventually(t, func() bool {
		select {
		case c := <-ch:
			early = &c
			return true
		default:
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		return old.heirs == 1
	}, handleWait, 100*time.Microsecond, "CreateQP neither returned nor waited for the handle")
	return early
}

func closeAsync(qp *QP) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- qp.Close() }()
	return ch
}

// A CreateQP the device answers with the handle of a QP whose DESTROY_QP
// has completed on the device, before the driver has seen it complete,
// waits for the destroy and gets the handle; the old QP's completion still
// in the CQ is its own, the new QP's are the new one's.
func TestCreateQPGivenTheHandleOfAQPMidDestroyWaitsAndTakesIt(t *testing.T) {
	r := newRDDevice(t, realV20)
	cq := r.cq(t, 64)
	old := r.rcQP(t, cq, 8, true, qpAnswer{qpn: 0x100, handle: 4})
	sq := sqOf(t, old)
	_, err := old.PostSend(sends(1, 7, 0, r.mr.SGE(0, 8)), 0)
	require.NoError(t, err)
	r.execute(t, old, sq, true, nil) // old's CQE is in the ring
	s := stallDestroy(t, r)

	closed := closeAsync(old)
	<-s.started
	ch := r.createAsync(context.Background(), cq, qpAnswer{qpn: 0x200, handle: 4})
	if early := awaitHeir(t, r.d, old, ch); early != nil {
		require.Failf(t, "CreateQP returned while the QP holding its handle was being destroyed", "err: %v", early.err)
	}
	s.answer <- nil
	require.NoError(t, <-closed)
	c := <-ch
	require.NoError(t, c.err, "the handle was free once the destroy completed")
	nu := c.qp
	nu.state.Store(uint32(StateRTS))
	assert.Equal(t, uint32(4), nu.handle)
	assert.True(t, r.d.qpByHandle(4) == nu, "the QP by its handle")

	_, err = nu.PostSend(sends(1, 7, 0, r.mr.SGE(0, 8)), 0)
	require.NoError(t, err)
	r.put(t, cq, rings.CQE{WRID: 7, QP: 4, Opcode: rings.WCSend})
	wcs := poll(t, cq)
	require.Len(t, wcs, 2)
	assert.Equal(t, uint32(0x100), wcs[0].QPN, "old's completion, in the ring before the destroy")
	assert.Equal(t, uint32(0x200), wcs[1].QPN, "the new QP's")
	for _, wc := range wcs {
		assert.Equal(t, WCSuccess, wc.Status)
		assert.Equal(t, uint64(7), wc.WRID)
	}
	send, _ := nu.Outstanding()
	assert.Zero(t, send)
	assert.Zero(t, cq.Stats().Dropped)
}

// A device that refuses the DESTROY_QP keeps the QP live on its handle: a
// CreateQP it answered with that handle meanwhile fails with
// ErrDeviceFault (the device gave out a live QP's handle), as does the
// next one, and the live QP keeps its handle and its completions.
func TestCreateQPGivenTheHandleOfAQPWhoseDestroyIsRefusedIsADeviceFault(t *testing.T) {
	r := newRDDevice(t, realV20)
	cq := r.cq(t, 64)
	live := r.rcQP(t, cq, 8, true, qpAnswer{qpn: 0x100, handle: 4})
	s := stallDestroy(t, r)

	closed := closeAsync(live)
	<-s.started
	ch := r.createAsync(context.Background(), cq, qpAnswer{qpn: 0x200, handle: 4})
	early := awaitHeir(t, r.d, live, ch)
	refused := errors.New("refused")
	s.answer <- refused
	assert.ErrorIs(t, <-closed, refused)
	if early == nil {
		c := <-ch
		early = &c
	}
	assert.ErrorIs(t, early.err, ErrDeviceFault)
	assert.True(t, early.qp == nil, "no QP")

	r.answerQPs(qpAnswer{qpn: 0x300, handle: 4})
	_, err := r.pd.CreateQP(context.Background(), &QPConfig{Type: RC, SendCQ: cq, RecvCQ: cq})
	assert.ErrorIs(t, err, ErrDeviceFault, "the handle of a QP not being destroyed")
	assert.True(t, r.d.qpByHandle(4) == live, "the live QP keeps its handle")
	sq := sqOf(t, live)
	_, err = live.PostSend(sends(1, 9, 0, r.mr.SGE(0, 8)), 0)
	require.NoError(t, err, "the QP is live")
	r.execute(t, live, sq, true, nil)
	wcs := poll(t, cq)
	require.Len(t, wcs, 1)
	assert.Equal(t, uint32(0x100), wcs[0].QPN)
}

// A CreateQP waiting for the handle of a QP being destroyed gives up with
// its context; the new QP is destroyed on the device, and the handle,
// once free, goes to the next CreateQP.
func TestCreateQPWaitingForAHandleEndsWithItsContext(t *testing.T) {
	r := newRDDevice(t, realV20)
	cq := r.cq(t, 64)
	old := r.rcQP(t, cq, 8, true, qpAnswer{qpn: 0x100, handle: 4})
	s := stallDestroy(t, r)

	closed := closeAsync(old)
	<-s.started
	ctx, cancel := context.WithCancel(context.Background())
	ch := r.createAsync(ctx, cq, qpAnswer{qpn: 0x200, handle: 4})
	if early := awaitHeir(t, r.d, old, ch); early != nil {
		require.Failf(t, "CreateQP returned while the QP holding its handle was being destroyed", "err: %v", early.err)
	}
	cancel()
	c := <-ch
	assert.ErrorIs(t, c.err, context.Canceled)
	assert.True(t, c.qp == nil, "no QP")
	assert.Equal(t, []uint32{4}, r.cmds.destroyedOf(kindQP), "the new QP, destroyed")
	r.d.mu.Lock()
	assert.Zero(t, old.heirs)
	r.d.mu.Unlock()

	s.answer <- nil
	require.NoError(t, <-closed)
	c = <-r.createAsync(context.Background(), cq, qpAnswer{qpn: 0x300, handle: 4})
	require.NoError(t, c.err)
	assert.True(t, r.d.qpByHandle(4) == c.qp, "the QP by its handle")
}
