package doorbell_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/doorbell"
)

// model is a device and a ring behind a Queue: it sees publishes and
// doorbell stores in order and drains, on each doorbell, everything
// published, as QEMU does.
type model struct {
	t         testing.TB
	written   int   // WQEs the poster wrote (sum of Added)
	published int   // prod_tail as last published
	drained   int   // WQEs handed to the device
	handed    []int // times each WQE was handed over
	lastPub   bool  // the previous event was a publish
	failNext  bool
	doorbells int
}

func (m *model) Publish() {
	require.LessOrEqual(m.t, m.published, m.written, "published beyond what was written")
	m.published = m.written
	m.lastPub = true
}

func (m *model) Store32(off int, v uint32) error {
	require.Equal(m.t, doorbell.OffsetQP, off, "store offset")
	require.Equal(m.t, uint32(qpValue), v, "store value")
	require.True(m.t, m.lastPub, "doorbell not immediately preceded by a publish")
	require.Equal(m.t, m.written, m.published, "doorbell with WQEs written but not published")
	m.lastPub = false
	if m.failNext {
		m.failNext = false
		return errStore
	}
	require.NotEqual(m.t, m.drained, m.published, "doorbell with nothing new to drain")
	for i := m.drained; i < m.published; i++ {
		m.handed[i]++
	}
	m.drained = m.published
	m.doorbells++
	return nil
}

// checkSequence runs ops (one byte per operation) against a Queue and the
// model, checking after each step:
//   - Added and deferred posts write nothing;
//   - Post(false), Fail and Ring write nothing when nothing is pending, and
//     otherwise exactly one publish followed by one doorbell, after which
//     nothing is pending (unless the store failed: then everything stays
//     pending and the next ring retries);
//   - the Queue's Pending and Stats agree with the model;
//
// and at the end, after a final Ring, that every WQE was handed to the
// device exactly once.
func checkSequence(t testing.TB, ops []byte) {
	m := &model{t: t}
	q, err := doorbell.NewQueue(m, doorbell.OffsetQP, qpValue, m)
	require.NoError(t, err)
	var want doorbell.Stats
	step := func(op byte) {
		before, drainedBefore := m.doorbells, m.drained
		pendingBefore := m.written - m.drained
		fail := op&0x80 != 0 && pendingBefore > 0
		m.failNext = fail
		var err error
		ring := false // this op should publish and ring
		switch op % 6 {
		case 0, 1:
			k := 1 + int(op>>3)%4
			m.written += k
			m.handed = append(m.handed, make([]int, k)...)
			q.Added(k)
			m.failNext = false
			fail = false
		case 2:
			err = q.Post(true)
			want.Posts++
			want.DeferredPosts++
			fail = false
			m.failNext = false
		case 3:
			err = q.Post(false)
			want.Posts++
			ring = pendingBefore > 0
		case 4:
			err = q.Fail()
			want.FailedPosts++
			ring = pendingBefore > 0
		case 5:
			err = q.Ring()
			ring = pendingBefore > 0
			if ring && !fail {
				want.Rings++
			}
		}
		if fail {
			require.ErrorIs(t, err, errStore, "op %d: the injected store failure", op)
		} else {
			require.NoError(t, err, "op %d", op)
		}
		switch {
		case ring && !fail:
			require.Equal(t, before+1, m.doorbells, "op %d: doorbells", op)
			require.Equal(t, m.written, m.drained, "op %d: drained", op)
			want.Doorbells++
			want.WQEs += uint64(pendingBefore)
		default:
			require.Equal(t, before, m.doorbells, "op %d: rang the doorbell", op)
			require.Equal(t, drainedBefore, m.drained, "op %d: handed WQEs to the device", op)
		}
		require.Equal(t, m.written-m.drained, q.Pending(), "op %d: Pending", op)
		require.Equal(t, want, q.Stats(), "op %d: stats", op)
	}
	for _, op := range ops {
		step(op)
	}
	step(5) // Ring
	require.Equal(t, m.written, m.drained, "after Ring: drained")
	for i, n := range m.handed {
		require.Equal(t, 1, n, "WQE %d: times handed to the device", i)
	}
}

func TestQueueProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for range 3000 {
		ops := make([]byte, rng.IntN(64))
		for i := range ops {
			ops[i] = byte(rng.Uint32())
		}
		checkSequence(t, ops)
	}
}

func FuzzQueue(f *testing.F) {
	f.Add([]byte{0, 2, 0, 2, 0, 3})
	f.Add([]byte{0, 2, 8, 4, 5, 5})
	f.Add([]byte{0, 0x83, 5, 0x85, 0x84, 3})
	f.Fuzz(func(t *testing.T, ops []byte) { checkSequence(t, ops) })
}
