package srq_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/srq"
	"github.com/vfrdma/vfrdma/wq"
)

// Tests that pin down rules no other test guards: each one fails when the
// fault its comment names ("Fault caught: ...") is planted in the
// package's code.

// Rule: a low watermark equal to the depth is accepted, at creation and by
// SetLowWatermark; only one above the depth is refused (ErrInvalid).
// dat_srq_set_lw refuses a watermark that "exceeds the value of
// max_recv_dtos" (the depth), no other, and one equal to it has a use: on a
// full SRQ it is not crossed (the event fires when fewer than the
// watermark are posted), and the first receive any QP takes fires it, once
// per arming, so a service learns when a full SRQ starts to drain. (IB
// drivers such as mlx4 refuse an srq_limit equal to max_wr, but this
// package follows uDAPL, and the device never sees the watermark: the
// driver raises the event from its own counts.) (Faults caught: the
// creation check or SetLowWatermark's check refusing the depth itself.)
func TestALowWatermarkEqualToTheDepthIsAcceptedAndFiresAsTheFullQueueDrains(t *testing.T) {
	const depth = 8
	r := newRig(t, 16, depth, false, func(c *srq.Config) { c.LowWatermark = depth })
	assert.Equal(t, depth, r.q.Query().LowWatermark, "armed at the depth")
	assert.Empty(t, r.events, "nothing at creation")
	m, err := r.q.Attach(1)
	require.NoError(t, err)
	post(t, r, 0, 1, 2, 3, 4, 5, 6, 7) // full: 8 available, not below 8
	r.take(t)
	assert.Empty(t, r.events)
	require.True(t, r.q.Complete(m, 0)) // 7 < 8
	want := srq.Event{Available: depth - 1, Watermark: depth}
	assert.Equal(t, []srq.Event{want}, r.events)
	assert.Equal(t, []srq.Event{want}, r.drainEvents())
	require.True(t, r.q.Complete(m, 1))
	assert.Len(t, r.events, 1, "once per arming")

	post(t, r, 8, 9) // full again
	r.take(t)
	require.NoError(t, r.q.SetLowWatermark(depth), "SetLowWatermark at the depth")
	assert.Len(t, r.events, 1, "a full queue is not below its depth")
	assert.Equal(t, depth, r.q.Query().LowWatermark)
	require.True(t, r.q.Complete(m, 2))
	assert.Equal(t, want, r.events[len(r.events)-1], "re-armed at the depth: fires again")
	assert.ErrorIs(t, r.q.SetLowWatermark(depth+1), wq.ErrInvalid, "above the depth")
}

// An empty post refused before any request is looked at (a closed SRQ, or
// one that needs a member and has none) is an error, not a panic: there is
// no first request to name.
func TestAnEmptyPostToARefusingSRQIsAnErrorNotAPanic(t *testing.T) {
	r := newRig(t, 16, 8, true) // needs a member, has none
	var err error
	require.NotPanics(t, func() { _, err = r.q.Post(nil, false) })
	assert.Error(t, err)
	r.q.Close()
	require.NotPanics(t, func() { _, err = r.q.Post(nil, false) })
	assert.ErrorIs(t, err, wq.ErrClosed)
}

// New and Resize take any depth from 1 to the ring reserved at creation:
// an SRQ of one buffer is made, holds one receive and refuses a second.
// (Fault caught: New refusing a depth of 1.)
func TestNewTakesADepthOfOne(t *testing.T) {
	r := newRig(t, 1, 1, false)
	assert.Equal(t, 1, r.q.Query().Depth)
	post(t, r, 0)
	_, err := r.q.Post([]wq.RecvWR{{WRID: 1, SGEs: []wq.SGE{r.sge(0, 8)}}}, false)
	assert.ErrorIs(t, err, wq.ErrQueueFull, "a second receive in an SRQ of depth 1")
}

// Resize takes any depth from 1 to the ring reserved at creation.
func TestResizeTakesADepthOfOne(t *testing.T) {
	r := newRig(t, 16, 8, false)
	require.NoError(t, r.q.Resize(1))
	assert.Equal(t, 1, r.q.Query().Depth)
	assert.ErrorIs(t, r.q.Resize(0), wq.ErrInvalid)
}
