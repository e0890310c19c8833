package srq_test

import (
	"bytes"
	"encoding/binary"
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
// handed over, and no later Post or Flush publishes the ring's producer
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
	if err := q.Flush(); err != nil {
		assert.ErrorIs(t, err, wq.ErrClosed)
	}
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
