package vfrdma_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/pvsim"
)

// With Options.PollDoorbell on QEMU's device an empty poll rings the POLL
// doorbell and CQs cannot be armed; StopPollDoorbell ends that for good:
// empty polls ring nothing, CQs arm, and Wait sleeps on the interrupt
// until a completion comes.
func TestStopPollDoorbellEndsTheDoorbellAndLetsCQsArm(t *testing.T) {
	ctx := ctxT(t)
	d, _ := openModel(t, pvsim.Config{QEMU: true}, &vfrdma.Options{PollDoorbell: true, PollPace: -1})
	p := newRCPair(t, ctx, d, true, vfrdma.AccessLocalWrite)
	wcs := make([]vfrdma.WC, 4)
	assert.False(t, p.cq.Armable())
	assert.ErrorIs(t, p.cq.Arm(false), vfrdma.ErrNotSupported)
	n, err := p.cq.Poll(wcs)
	require.NoError(t, err)
	require.Zero(t, n)
	rung := p.cq.Stats().Doorbells
	assert.NotZero(t, rung, "an empty poll rang the POLL doorbell")

	d.StopPollDoorbell()
	n, err = p.cq.Poll(wcs)
	require.NoError(t, err)
	require.Zero(t, n)
	assert.Equal(t, rung, p.cq.Stats().Doorbells, "no POLL doorbell once stopped")
	assert.True(t, p.cq.Armable())

	_, err = p.b.PostRecv([]vfrdma.RecvWR{{WRID: 1, SGEs: []vfrdma.SGE{p.mr.SGE(4096, 64)}}}, 0)
	require.NoError(t, err)
	_, err = p.a.PostSend([]vfrdma.SendWR{{WRID: 2, Flags: vfrdma.SendSignaled, SGEs: []vfrdma.SGE{p.mr.SGE(0, 8)}}}, 0)
	require.NoError(t, err)
	got := waitWCs(t, ctx, p.cq, 2)
	for _, wc := range got {
		assert.Equal(t, vfrdma.WCSuccess, wc.Status)
	}
	assert.NotZero(t, p.cq.Stats().Interrupts+p.cq.Stats().Spun, "Wait armed the CQ (or its spin found the completion)")
}
