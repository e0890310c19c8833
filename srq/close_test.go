package srq_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/mmio"
	"github.com/vfrdma/vfrdma/srq"
	"github.com/vfrdma/vfrdma/wq"
)

// After Close the device's SRQ is gone: the root package destroys it, then
// unmaps its ring. Receives posted deferred before Close are flushed, never
// handed over, and no later Post or Ring publishes the ring's producer
// index (a store into unmapped memory, in the root package) or rings the
// SRQ's doorbell (a handle the device may have given to another SRQ).
func TestAfterCloseNothingReachesTheRingOrTheDoorbell(t *testing.T) {
	keys := &wq.Keys{}
	keys.Set(1, &wq.Region{PD: 7, Addr: 0x10000, Len: 1 << 16, Access: wq.AccessLocalWrite})
	uar := make([]byte, doorbell.PageSize)
	reg, err := mmio.New(uar)
	require.NoError(t, err)
	state := make([]byte, 8)
	q, err := srq.New(srq.Config{Name: "SRQ 5", State: state, Data: make([]byte, 8*32), Stride: 32, Slots: 8,
		Register: reg, Offset: doorbell.OffsetSRQ, Value: doorbell.SRQRecv | 5, Depth: 8, MaxSGE: 1, PD: 7, Keys: keys})
	require.NoError(t, err)
	sge := []wq.SGE{{Addr: 0x10000, Length: 64, LKey: 1}}
	_, err = q.Post([]wq.RecvWR{{WRID: 1, SGEs: sge}}, false) // handed over
	require.NoError(t, err)
	_, err = q.Post([]wq.RecvWR{{WRID: 2, SGEs: sge}, {WRID: 3, SGEs: sge}}, true) // deferred
	require.NoError(t, err)
	require.Equal(t, 3, q.Close())

	published := bytes.Clone(state)
	clear(uar)
	rung := q.Doorbell().Doorbells
	n, err := q.Post([]wq.RecvWR{{WRID: 4, SGEs: sge}}, false)
	assert.Zero(t, n)
	assert.ErrorIs(t, err, wq.ErrClosed)
	assert.ErrorIs(t, q.Ring(), wq.ErrClosed, "Ring after Close")
	assert.Equal(t, published, state, "the ring's producer index was published after Close")
	assert.Zero(t, binary.LittleEndian.Uint32(uar[doorbell.OffsetSRQ:]), "a doorbell was rung after Close")
	assert.Equal(t, rung, q.Doorbell().Doorbells, "doorbells after Close")

	// Every receive still completes once: flushed.
	var flushed []uint64
	for id, ok := q.PopFlush(); ok; id, ok = q.PopFlush() {
		flushed = append(flushed, id)
	}
	assert.ElementsMatch(t, []uint64{1, 2, 3}, flushed)
}

// CloseAfter runs the device's DESTROY with no post under way and none
// starting: a post racing it completes before or is refused after (-race
// checks that the destroy never overlaps a post's ring writes). A DESTROY
// that fails leaves the queue open: posts go on.
func TestCloseAfterExcludesPostsAndKeepsTheQueueIfDestroyFails(t *testing.T) {
	keys := &wq.Keys{}
	keys.Set(1, &wq.Region{PD: 7, Addr: 0x10000, Len: 1 << 16, Access: wq.AccessLocalWrite})
	reg, err := mmio.New(make([]byte, doorbell.PageSize))
	require.NoError(t, err)
	data := make([]byte, 64*32)
	q, err := srq.New(srq.Config{Name: "SRQ 5", State: make([]byte, 8), Data: data, Stride: 32, Slots: 64,
		Register: reg, Offset: doorbell.OffsetSRQ, Value: doorbell.SRQRecv | 5, Depth: 64, MaxSGE: 1, PD: 7, Keys: keys})
	require.NoError(t, err)
	sge := []wq.SGE{{Addr: 0x10000, Length: 64, LKey: 1}}

	_, err = q.CloseAfter(func() error { return errors.New("EIO") })
	require.Error(t, err)
	n, err := q.Post([]wq.RecvWR{{WRID: 1, SGEs: sge}}, false)
	require.NoError(t, err, "a post after a failed destroy")
	require.Equal(t, 1, n)

	done := make(chan error, 1)
	go func() {
		for id := uint64(2); ; id++ {
			_, err := q.Post([]wq.RecvWR{{WRID: id, SGEs: sge}}, false)
			if errors.Is(err, wq.ErrClosed) {
				done <- nil
				return
			}
			if err != nil && !errors.Is(err, wq.ErrQueueFull) {
				done <- err
				return
			}
		}
	}()
	left, err := q.CloseAfter(func() error {
		clear(data) // the device forgets the ring; a post writing it now is a race
		return nil
	})
	require.NoError(t, err)
	require.NoError(t, <-done)
	assert.Positive(t, left)
}

// StopPosts refuses posts with ErrClosed, even where the queue has no QP
// left (a device closing everything takes its QPs off first), writing
// nothing; the queue can still be closed after it.
func TestStopPostsRefusesWithErrClosed(t *testing.T) {
	r := newRig(t, 8, 8, true)
	m, err := r.q.Attach(0x42)
	require.NoError(t, err)
	r.q.StopPosts()
	m.Detach()
	before := r.q.Doorbell()
	n, err := r.q.Post([]wq.RecvWR{{WRID: 1, SGEs: []wq.SGE{r.sge(0, 8)}}}, false)
	assert.Zero(t, n)
	assertOnlyKind(t, err, wq.ErrClosed)
	assert.Equal(t, before.Doorbells, r.q.Doorbell().Doorbells)
	assert.True(t, r.nextSlotUnwritten())
	r.q.Close()
}
