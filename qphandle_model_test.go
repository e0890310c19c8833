package vfrdma

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/pvsim"
)

// A CreateQP racing another QP's Close, on the device model, where the
// device gives the next QP the lowest free handle: the Close's DESTROY_QP
// has freed the handle, but the Close still waits to rekey the old QP's
// CQEs, behind a Poll of its CQ that an SRQ's low-watermark callback
// holds. The CreateQP the device answers with the freed handle waits for
// the Close and gets the handle; the old QP's completions, polled by the
// Poll under way and after it, are its own, once each; the new QP carries
// a send and a receive. At version 20 the handle is a number of its own;
// before, it is the QP number, which the new QP then shares.
func TestCreateQPRacingACloseGetsTheFreedHandleAndCompletionsKeepTheirQP(t *testing.T) {
	for _, v := range []uint32{firmware.VersionQPHandle, firmware.VersionRoCEv1} {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) { testCreateQPRacingAClose(t, v) })
	}
}

func testCreateQPRacingAClose(t *testing.T, version uint32) {
	ctx, cancel := context.WithTimeout(context.Background(), handleWait)
	defer cancel()
	m, err := pvsim.New(pvsim.Config{Version: version})
	require.NoError(t, err)
	d, err := OpenFunction(m, nil)
	if err != nil {
		m.Close()
		require.NoError(t, err)
	}
	t.Cleanup(func() { d.Close() })
	pd, err := d.AllocPD(ctx)
	require.NoError(t, err)
	cq1, err := d.CreateCQ(ctx, 64)
	require.NoError(t, err)
	cq2, err := d.CreateCQ(ctx, 64)
	require.NoError(t, err)
	mr, err := pd.AllocMR(ctx, 1<<16, AccessLocalWrite)
	require.NoError(t, err)

	// The first low-watermark event holds the Poll that raises it.
	entered, release := make(chan struct{}), make(chan struct{})
	var once, released sync.Once
	letGo := func() { released.Do(func() { close(release) }) }
	t.Cleanup(letGo) // before the device's Close: a failed test does not hang
	srq, err := pd.CreateSRQ(ctx, &SRQConfig{Depth: 8, CQ: cq1, OnLowWatermark: func(SRQEvent) {
		once.Do(func() { close(entered); <-release })
	}})
	require.NoError(t, err)
	rc := func(cq *CQ, s *SRQ) *QP {
		qp, err := pd.CreateQP(ctx, &QPConfig{Type: RC, SendCQ: cq, RecvCQ: cq, SRQ: s, SignalAll: true})
		require.NoError(t, err)
		return qp
	}
	connect := func(a, b *QP) {
		require.NoError(t, a.Connect(ctx, Remote{QPN: b.QPN(), GID: d.GID()}, 0))
		require.NoError(t, b.Connect(ctx, Remote{QPN: a.QPN(), GID: d.GID()}, 0))
	}
	sender := rc(cq2, nil)
	old := rc(cq1, srq)
	peer := rc(cq2, nil) // the new QP's, made first: the new QP gets old's handle
	connect(sender, old)

	recvs := make([]RecvWR, 4)
	for i := range recvs {
		recvs[i] = RecvWR{WRID: uint64(100 + i), SGEs: []SGE{mr.SGE(4096+i*256, 256)}}
	}
	_, err = srq.PostRecv(recvs, 0)
	require.NoError(t, err)
	require.NoError(t, srq.SetLowWatermark(4)) // the first receive crosses it
	for i := range 3 {
		_, err := sender.PostSend([]SendWR{{WRID: uint64(i), SGEs: []SGE{mr.SGE(i*64, 64)}}}, 0)
		require.NoError(t, err)
	}
	for _, wc := range pollUntil(t, ctx, cq2, 3) {
		require.Equal(t, WCSuccess, wc.Status, "%+v", wc)
	}
	require.Eventually(t, func() bool {
		return (cq1.st.ProdTail()-cq1.st.ConsHead())&uint32(2*cq1.entries-1) == 3
	}, handleWait, 100*time.Microsecond, "old's three receive completions")

	// A Poll of two: the first raises the watermark and is held.
	polled := make(chan []WC, 1)
	go func() {
		wcs := make([]WC, 2)
		n, err := cq1.Poll(wcs)
		assert.NoError(t, err)
		polled <- wcs[:n]
	}()
	<-entered
	closed := closeAsync(old)
	require.Eventually(t, func() bool { _, ok := m.QP(old.handle); return !ok }, handleWait, 100*time.Microsecond, "DESTROY_QP")
	select {
	case err := <-closed:
		require.Failf(t, "Close returned with its CQEs not rekeyed", "err: %v", err)
	default:
	}
	made := make(chan created, 1)
	go func() {
		qp, err := pd.CreateQP(ctx, &QPConfig{Type: RC, SendCQ: cq1, RecvCQ: cq1, SignalAll: true})
		made <- created{qp, err}
	}()
	if early := awaitHeir(t, d, old, made); early != nil {
		require.Failf(t, "CreateQP returned while the closing QP held the handle", "err: %v", early.err)
	}

	letGo()
	var fromOld []WC
	fromOld = append(fromOld, <-polled...)
	require.Len(t, fromOld, 2, "the held Poll")
	require.NoError(t, <-closed)
	c := <-made
	require.NoError(t, c.err, "CreateQP given the closed QP's handle")
	nu := c.qp
	assert.Equal(t, old.handle, nu.handle, "the new QP has the closed one's handle")
	assert.True(t, d.qpByHandle(nu.handle) == nu, "the QP by its handle")

	connect(nu, peer)
	_, err = nu.PostRecv([]RecvWR{{WRID: 500, SGEs: []SGE{mr.SGE(8192, 256)}}}, 0)
	require.NoError(t, err)
	_, err = peer.PostRecv([]RecvWR{{WRID: 600, SGEs: []SGE{mr.SGE(12288, 256)}}}, 0)
	require.NoError(t, err)
	_, err = peer.PostSend([]SendWR{{WRID: 601, SGEs: []SGE{mr.SGE(0, 64)}}}, 0)
	require.NoError(t, err)
	_, err = nu.PostSend([]SendWR{{WRID: 501, SGEs: []SGE{mr.SGE(0, 64)}}}, 0)
	require.NoError(t, err)

	// cq1: old's third receive (rekeyed), then the new QP's two.
	var fromNew []WC
	for _, wc := range pollUntil(t, ctx, cq1, 3) {
		if wc.WRID >= 500 {
			fromNew = append(fromNew, wc)
		} else {
			fromOld = append(fromOld, wc)
		}
	}
	byWRID := map[uint64]int{}
	for _, wc := range fromOld {
		assert.Equal(t, WCSuccess, wc.Status, "%+v", wc)
		assert.Equal(t, WCRecv, wc.Opcode, "%+v", wc)
		assert.Equal(t, old.QPN(), wc.QPN, "%+v", wc)
		byWRID[wc.WRID]++
	}
	assert.Equal(t, map[uint64]int{100: 1, 101: 1, 102: 1}, byWRID, "old's receives, once each")
	assert.Equal(t, 1, srq.Outstanding(), "old consumed three of the SRQ's four receives")
	require.Len(t, fromNew, 2)
	for _, wc := range fromNew {
		assert.Equal(t, WCSuccess, wc.Status, "%+v", wc)
		assert.Equal(t, nu.QPN(), wc.QPN, "%+v", wc)
	}
	send, recv := nu.Outstanding()
	assert.Zero(t, send)
	assert.Zero(t, recv)
	for _, wc := range pollUntil(t, ctx, cq2, 2) {
		assert.Equal(t, WCSuccess, wc.Status, "%+v", wc)
	}
	assert.Empty(t, poll(t, cq1), "nothing more")
	assert.Zero(t, cq1.Stats().Dropped, "no completion found no QP")
}

// pollUntil polls cq until it has n completions.
func pollUntil(t *testing.T, ctx context.Context, cq *CQ, n int) []WC {
	t.Helper()
	var got []WC
	wcs := make([]WC, 16)
	for len(got) < n {
		k, err := cq.Poll(wcs)
		require.NoError(t, err)
		got = append(got, wcs[:k]...)
		if k == 0 {
			require.NoError(t, ctx.Err(), "%d of %d completions", len(got), n)
			require.NoError(t, cq.Wait(ctx))
		}
	}
	require.Len(t, got, n)
	return got
}
