package vfrdma_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/pvsim"
)

// readWithABadRKey posts on p.a an RDMA READ of p.b's memory with an rkey
// the peer never issued, and waits until the device has failed p.a (a
// requester's failure raises no event: the driver is not told).
func readWithABadRKey(t *testing.T, m *pvsim.Device, p *rcPair) {
	t.Helper()
	_, err := p.a.PostSend([]vfrdma.SendWR{{WRID: 7, Opcode: vfrdma.OpRDMARead, SGEs: []vfrdma.SGE{p.mr.SGE(0, 64)},
		RemoteAddr: p.mr.Addr() + 4096, RKey: p.mr.RKey() ^ 0x5A5A}}, 0)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, ok := m.QPByNumber(p.a.QPN())
		return ok && info.State == firmware.QPStateErr
	}, time.Minute, time.Millisecond, "the device never failed the requester")
}

// At v20, where the model runs one-sided operations, an RDMA READ refused
// with a remote access error moves the requester to ERR on the device;
// QueryState reports it, and State has it from then on, before the
// completion is polled; posts are refused. The responder's QP_ACCESS_ERR
// moves it to ERR as the event arrives.
func TestQueryStateReportsERRAfterAReadsRemoteAccessErrorAndStateFollows(t *testing.T) {
	ctx := ctxT(t)
	d, m := openModel(t, vmware(20), nil)
	p := newRCPair(t, ctx, d, true, vfrdma.AccessLocalWrite|vfrdma.AccessRemoteRead)
	readWithABadRKey(t, m, p)
	require.Equal(t, vfrdma.StateRTS, p.a.State(), "nothing told the driver yet (no event, no completion polled)")

	st, err := p.a.QueryState(ctx)
	require.NoError(t, err)
	assert.Equal(t, vfrdma.StateErr, st, "the device's answer")
	assert.Equal(t, vfrdma.StateErr, p.a.State(), "State after the query")
	_, err = p.a.PostSend([]vfrdma.SendWR{{WRID: 8, SGEs: []vfrdma.SGE{p.mr.SGE(0, 8)}}}, 0)
	assert.ErrorIs(t, err, vfrdma.ErrQPState, "a send on a QP in ERR")

	wc := waitWCs(t, ctx, p.cq, 1)[0]
	assert.Equal(t, uint64(7), wc.WRID)
	assert.Equal(t, vfrdma.WCRemAccessErr, wc.Status, "%+v", wc)

	var ev vfrdma.AsyncEvent
	select {
	case ev = <-d.AsyncEvents():
	case <-ctx.Done():
		require.FailNow(t, "no QP_ACCESS_ERR for the responder")
	}
	assert.Equal(t, vfrdma.EventQPAccessErr, ev.Type)
	assert.Same(t, p.b, ev.QP)
	assert.Equal(t, vfrdma.StateErr, p.b.State(), "the responder after its event")
	st, err = p.b.QueryState(ctx)
	require.NoError(t, err)
	assert.Equal(t, vfrdma.StateErr, st, "the responder on the device")
}

// The same failure, told by its completion: once polled, the requester's
// State is ERR without a query, and its posts are refused.
func TestAPolledErrorCompletionPutsTheRCQPInERR(t *testing.T) {
	ctx := ctxT(t)
	d, m := openModel(t, vmware(20), nil)
	p := newRCPair(t, ctx, d, true, vfrdma.AccessLocalWrite|vfrdma.AccessRemoteRead)
	readWithABadRKey(t, m, p)
	wc := waitWCs(t, ctx, p.cq, 1)[0]
	require.Equal(t, vfrdma.WCRemAccessErr, wc.Status, "%+v", wc)
	assert.Equal(t, vfrdma.StateErr, p.a.State())
	_, err := p.a.PostSend([]vfrdma.SendWR{{WRID: 8, SGEs: []vfrdma.SGE{p.mr.SGE(0, 8)}}}, 0)
	assert.ErrorIs(t, err, vfrdma.ErrQPState)
}

// An ERR the driver learned from an event is final: a device answering
// RTS afterwards (the model raised QP_FATAL and left its QP running) is
// reported as it answered, and State stays ERR.
func TestQueryStateNeverTakesAQPOutOfAnERRLearnedFromAnEvent(t *testing.T) {
	ctx := ctxT(t)
	d, m := openModel(t, vmware(20), nil)
	p := newRCPair(t, ctx, d, true, vfrdma.AccessLocalWrite)
	info, ok := m.QPByNumber(p.a.QPN())
	require.True(t, ok)
	require.NoError(t, m.Raise(firmware.EventQPFatal, info.Handle))
	select {
	case ev := <-d.AsyncEvents():
		require.Equal(t, vfrdma.EventQPFatal, ev.Type)
	case <-ctx.Done():
		require.FailNow(t, "no QP_FATAL")
	}
	require.Equal(t, vfrdma.StateErr, p.a.State())
	st, err := p.a.QueryState(ctx)
	require.NoError(t, err)
	assert.Equal(t, vfrdma.StateRTS, st, "the device's answer")
	assert.Equal(t, vfrdma.StateErr, p.a.State())
}

// A transition whose command is under way when an error event arrives
// leaves the QP in ERR: the device answers late (CommandDelay), and the
// event, raised once the command reached it, is taken meanwhile.
func TestATransitionKeepsAnERRLearnedWhileItsCommandRan(t *testing.T) {
	ctx := ctxT(t)
	cfg := vmware(20)
	cfg.CommandDelay = 200 * time.Millisecond
	d, m := openModel(t, cfg, nil)
	pd, err := d.AllocPD(ctx)
	require.NoError(t, err)
	cq, err := d.CreateCQ(ctx, 16)
	require.NoError(t, err)
	qp, err := pd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.UD, SendCQ: cq, RecvCQ: cq, QKey: 1})
	require.NoError(t, err)
	require.NoError(t, qp.Init(ctx))
	require.NoError(t, qp.ReadyToReceive(ctx, vfrdma.Remote{}))
	info, ok := m.QPByNumber(qp.QPN())
	require.True(t, ok)

	sent := m.Stats().Commands
	done := make(chan error, 1)
	go func() { done <- qp.ReadyToSend(ctx, 0) }()
	require.Eventually(t, func() bool { return m.Stats().Commands > sent }, time.Minute, time.Millisecond, "MODIFY_QP never reached the device")
	require.NoError(t, m.Raise(firmware.EventQPFatal, info.Handle))
	require.NoError(t, <-done)
	assert.Equal(t, vfrdma.StateErr, qp.State())
}
