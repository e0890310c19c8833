package vfrdma_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
)

// Wait returns for a CQ whose only completions are the driver's flushes
// (a QP closed with receives outstanding): Poll has them to give, though
// the device wrote nothing to the ring.
func TestWaitReturnsForACQWhoseOnlyCompletionsAreFlushes(t *testing.T) {
	ctx := ctxT(t)
	d, _ := openModel(t, vmware(20), nil)
	p := newRCPair(t, ctx, d, true, vfrdma.AccessLocalWrite)
	for i := range 4 {
		_, err := p.b.PostRecv([]vfrdma.RecvWR{{WRID: uint64(i), SGEs: []vfrdma.SGE{p.mr.SGE(i*64, 64)}}}, 0)
		require.NoError(t, err)
	}
	require.NoError(t, p.b.Close())
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second) // a hang guard
	defer cancel()
	require.NoError(t, p.cq.Wait(wctx), "Wait with four flushes to poll")
	wcs := make([]vfrdma.WC, 8)
	n, err := p.cq.Poll(wcs)
	require.NoError(t, err)
	require.Equal(t, 4, n)
	for _, wc := range wcs[:n] {
		assert.Equal(t, vfrdma.WCFlushErr, wc.Status)
	}
}
