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

// A UD QP whose send the device fails goes to SQE, not ERR (the verbs'
// rule for datagrams, and what QEMU's backend does): the device flushes
// the sends behind the failed one, QueryState reports SQE, and the QP
// still receives: PostRecv takes receives in SQE and a datagram from
// another QP lands in one.
func TestAFailedUDSendPutsTheQPInSQEAndItStillReceives(t *testing.T) {
	ctx := ctxT(t)
	d, m := openModel(t, vmware(20), nil)
	p := newRCPair(t, ctx, d, true, vfrdma.AccessLocalWrite)
	ud := make([]*vfrdma.QP, 2)
	for i := range ud {
		var err error
		ud[i], err = p.pd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.UD, SendCQ: p.cq, RecvCQ: p.cq, QKey: 0x11111111, SignalAll: true})
		require.NoError(t, err)
		require.NoError(t, ud[i].Connect(ctx, vfrdma.Remote{}, 0))
	}
	// A send whose source GID goes away between its post and its doorbell:
	// the driver's checks passed, the device fails it; the second one,
	// behind it, is flushed.
	g := d.GID()
	g[15] ^= 0x77
	require.NoError(t, d.BindGID(ctx, 1, g))
	ah1, err := p.pd.CreateAH(vfrdma.AHAttr{DGID: d.GID(), SGIDIndex: 1})
	require.NoError(t, err)
	send := func(id uint64) vfrdma.SendWR {
		return vfrdma.SendWR{WRID: id, SGEs: []vfrdma.SGE{p.mr.SGE(8192, 8)}, AH: ah1, RemoteQPN: ud[1].QPN(), RemoteQKey: 0x11111111}
	}
	_, err = ud[0].PostSend([]vfrdma.SendWR{send(1), send(2)}, vfrdma.FlagDefer)
	require.NoError(t, err)
	require.NoError(t, d.UnbindGID(ctx, 1))
	require.NoError(t, ud[0].Ring())
	wcs := waitWCs(t, ctx, p.cq, 2)
	assert.Equal(t, uint64(1), wcs[0].WRID)
	assert.NotEqual(t, vfrdma.WCSuccess, wcs[0].Status, "the send whose GID is gone fails")
	assert.NotEqual(t, vfrdma.WCFlushErr, wcs[0].Status)
	assert.Equal(t, uint64(2), wcs[1].WRID)
	assert.Equal(t, vfrdma.WCFlushErr, wcs[1].Status, "the send behind it is flushed")

	st, err := ud[0].QueryState(ctx)
	require.NoError(t, err)
	assert.Equal(t, vfrdma.StateSQE, st)
	info, ok := m.QPByNumber(ud[0].QPN())
	require.True(t, ok)
	assert.Equal(t, firmware.QPStateSQE, info.State)

	// Its receive queue goes on: a receive is taken and a datagram from
	// the other QP lands in it.
	copy(p.mr.Bytes()[8192:], "datagram")
	_, err = ud[0].PostRecv([]vfrdma.RecvWR{{WRID: 3, SGEs: []vfrdma.SGE{p.mr.SGE(12288, 1024)}}}, 0)
	require.NoError(t, err, "receives in SQE")
	ah0, err := p.pd.CreateAH(vfrdma.AHAttr{DGID: d.GID()})
	require.NoError(t, err)
	_, err = ud[1].PostSend([]vfrdma.SendWR{{WRID: 4, SGEs: []vfrdma.SGE{p.mr.SGE(8192, 8)}, AH: ah0, RemoteQPN: ud[0].QPN(), RemoteQKey: 0x11111111}}, 0)
	require.NoError(t, err)
	for _, wc := range waitWCs(t, ctx, p.cq, 2) {
		require.Equal(t, vfrdma.WCSuccess, wc.Status, "%+v", wc)
		if wc.WRID == 3 {
			assert.Equal(t, ud[1].QPN(), wc.SrcQP)
		}
	}
	assert.Equal(t, "datagram", string(p.mr.Bytes()[12288+vfrdma.UDHeaderRoom:12288+vfrdma.UDHeaderRoom+8]))
}
