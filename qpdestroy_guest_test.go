//go:build guest

package vfrdma

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// QEMU 7.2 aborts (qemu_mutex_lock_impl: Assertion `mutex->initialized')
// when a QP is destroyed while its completion thread is still handling one
// of the QP's completions: the thread writes the CQE, raises an armed CQ's
// interrupt (which waits for QEMU's big lock) and only then unlinks the
// request from the QP's list, which the destroy has freed. A program sees
// the CQE first, so it can destroy the QP at once. Each round here does
// that on purpose, on both sides: the receiver's QP goes the moment its
// receive is polled, the sender's the moment its send is, each CQ armed
// (Wait) so that the thread has an interrupt to raise. The VM surviving
// every round is the test (QP.awaitQuietCQs).
func TestDestroyingAQPTheMomentItsCompletionIsPolledKeepsQEMUAlive(t *testing.T) {
	d := openGuest(t)
	// Without QP.awaitQuietCQs, 1 000 rounds aborted QEMU in 2 of 3 runs.
	const rounds = 1000
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	pd, err := d.AllocPD(ctx)
	require.NoError(t, err)
	acq, err := d.CreateCQ(ctx, 64)
	require.NoError(t, err)
	bcq, err := d.CreateCQ(ctx, 64)
	require.NoError(t, err)
	mr, err := pd.AllocMR(ctx, 8192, AccessLocalWrite)
	require.NoError(t, err)
	gid := d.GID()
	wcs := make([]WC, 4)
	waitOne := func(cq *CQ) WC {
		for {
			n, err := cq.Poll(wcs)
			require.NoError(t, err)
			if n > 0 {
				return wcs[0]
			}
			wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
			err = cq.Wait(wctx)
			wcancel()
			require.NoError(t, err, "no completion on CQ %d", cq.handle)
		}
	}
	for i := range rounds {
		a, err := pd.CreateQP(ctx, &QPConfig{Type: RC, SendCQ: acq, RecvCQ: acq, SendDepth: 4, RecvDepth: 4, SignalAll: true})
		require.NoError(t, err)
		b, err := pd.CreateQP(ctx, &QPConfig{Type: RC, SendCQ: bcq, RecvCQ: bcq, SendDepth: 4, RecvDepth: 4, SignalAll: true})
		require.NoError(t, err)
		require.NoError(t, a.Connect(ctx, Remote{QPN: b.QPN(), GID: gid}, 0))
		require.NoError(t, b.Connect(ctx, Remote{QPN: a.QPN(), GID: gid}, 0))
		_, err = b.PostRecv([]RecvWR{{WRID: uint64(i), SGEs: []SGE{mr.SGE(4096, 64)}}}, 0)
		require.NoError(t, err)
		_, err = a.PostSend([]SendWR{{WRID: uint64(i), SGEs: []SGE{mr.SGE(0, 64)}}}, 0)
		require.NoError(t, err)
		wc := waitOne(bcq)
		require.Equal(t, WCSuccess, wc.Status, "round %d: receive %+v", i, wc)
		require.NoError(t, b.Close(), "round %d", i)
		wc = waitOne(acq)
		require.Equal(t, WCSuccess, wc.Status, "round %d: send %+v", i, wc)
		require.NoError(t, a.Close(), "round %d", i)
	}
}
