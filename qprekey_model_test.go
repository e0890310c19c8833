package vfrdma_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
)

// A QP closed with completions still in its CQs keeps them when the
// device gives its handle to the next QP at once, in a receive CQ of its
// own as in its send CQ: polled after, they are the closed QP's, with its
// wr_ids and QP number, and none is taken for the new QP's.
func TestCompletionsOfAClosedQPInItsOwnReceiveCQStayItsOnceItsHandleIsReused(t *testing.T) {
	ctx := ctxT(t)
	d, _ := openModel(t, vmware(20), nil)
	pd, err := d.AllocPD(ctx)
	require.NoError(t, err)
	scq, err := d.CreateCQ(ctx, 64)
	require.NoError(t, err)
	rcq, err := d.CreateCQ(ctx, 64)
	require.NoError(t, err)
	mk := func() *vfrdma.QP {
		qp, err := pd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: scq, RecvCQ: rcq, SendDepth: 8, RecvDepth: 8, SignalAll: true})
		require.NoError(t, err)
		return qp
	}
	a, b := mk(), mk()
	require.NoError(t, a.Connect(ctx, vfrdma.Remote{QPN: b.QPN(), GID: d.GID()}, 0))
	require.NoError(t, b.Connect(ctx, vfrdma.Remote{QPN: a.QPN(), GID: d.GID()}, 0))
	mr, err := pd.AllocMR(ctx, 4096, vfrdma.AccessLocalWrite)
	require.NoError(t, err)
	for i := range 2 {
		_, err = b.PostRecv([]vfrdma.RecvWR{{WRID: 0x10 + uint64(i), SGEs: []vfrdma.SGE{mr.SGE(1024+i*64, 64)}}}, 0)
		require.NoError(t, err)
	}
	for i := range 2 {
		_, err = a.PostSend([]vfrdma.SendWR{{WRID: 0x20 + uint64(i), SGEs: []vfrdma.SGE{mr.SGE(0, 64)}}}, 0)
		require.NoError(t, err)
	}
	// Both sends acknowledged: both receives are in rcq, unpolled.
	waitWCs(t, ctx, scq, 2)
	bQPN := b.QPN()
	require.NoError(t, b.Close())
	c := mk() // the device's lowest free handle: b's
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.Connect(ctx, vfrdma.Remote{QPN: a.QPN(), GID: d.GID()}, 0))
	_, err = c.PostRecv([]vfrdma.RecvWR{{WRID: 0x30, SGEs: []vfrdma.SGE{mr.SGE(2048, 64)}}}, 0)
	require.NoError(t, err)

	wcs := waitWCs(t, ctx, rcq, 2)
	require.Len(t, wcs, 2)
	for i, wc := range wcs {
		assert.Equal(t, vfrdma.WCSuccess, wc.Status, "%+v", wc)
		assert.EqualValues(t, 0x10+i, wc.WRID, "the closed QP's receive")
		assert.Equal(t, bQPN, wc.QPN)
	}
	_, recv := c.Outstanding()
	assert.Equal(t, 1, recv, "the new QP's receive is still its own")
}
