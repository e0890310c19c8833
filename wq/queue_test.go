package wq_test

import (
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/mmio"
	"github.com/vfrdma/vfrdma/rings"
	"github.com/vfrdma/vfrdma/wq"
)

// newQueue is a receive queue over ordinary memory, with the device's
// view of its ring (a consumer over the same 8 bytes of state).
func newQueue(t testing.TB, depth int) (*wq.Queue, *rings.Consumer) {
	t.Helper()
	reg, err := mmio.New(make([]byte, doorbell.PageSize))
	require.NoError(t, err)
	state := make([]byte, 8)
	var w wq.Queue
	stride := rings.RecvStride(1)
	require.NoError(t, w.Init("QP 1", reg, state, make([]byte, depth*stride), stride, depth, 1, doorbell.OffsetQP, doorbell.QPRecv|1))
	st, err := rings.NewState(state)
	require.NoError(t, err)
	c, err := rings.NewConsumer(st, depth)
	require.NoError(t, err)
	return &w, c
}

// put posts ids as one call, not deferred.
func put(t testing.TB, w *wq.Queue, ids ...uint64) {
	t.Helper()
	for _, id := range ids {
		w.PutRecv(id, nil)
	}
	require.NoError(t, w.End(false))
}

// drainFlush takes every outstanding request with PopFlush.
func drainFlush(w *wq.Queue) []uint64 {
	var out []uint64
	for id, ok := w.PopFlush(); ok; id, ok = w.PopFlush() {
		out = append(out, id)
	}
	return out
}

// Completions in any order remove one outstanding request each, the
// record stays dense across many laps of the ring, and what is left
// flushes exactly once. Duplicate wr_ids are a multiset: each posting
// completes once.
func TestCompleteOutOfOrderKeepsTheMultisetDense(t *testing.T) {
	const depth = 8
	w, c := newQueue(t, depth)
	rnd := rand.New(rand.NewPCG(7, 7))
	model := map[uint64]int{} // wr_id -> postings outstanding
	out := 0
	next := uint64(0)
	for round := 0; round < 500; round++ {
		// Post up to the room left, with some duplicate wr_ids.
		for n := rnd.IntN(w.Room() + 1); n > 0; n-- {
			id := next
			if rnd.IntN(4) == 0 {
				id = 1 << 50 // a wr_id many requests share
			}
			next++
			w.PutRecv(id, nil)
			model[id]++
			out++
		}
		require.NoError(t, w.End(false))
		if r, _ := c.Ready(); r > 0 {
			c.Consume(r)
		}
		// Complete a random part of what is outstanding, in random order.
		var ids []uint64
		for id, n := range model {
			for ; n > 0; n-- {
				ids = append(ids, id)
			}
		}
		rnd.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		for _, id := range ids[:rnd.IntN(len(ids)+1)] {
			require.True(t, w.Complete(id), "round %d: wr_id %d outstanding", round, id)
			model[id]--
			if model[id] == 0 {
				delete(model, id)
				require.False(t, w.Complete(id), "round %d: wr_id %d completed past its postings", round, id)
			}
			out--
		}
		w.PublishHead()
		require.Equal(t, out, w.Outstanding(), "round %d", round)
		require.Equal(t, out, w.OutstandingP(), "round %d", round)
	}
	assert.False(t, w.Complete(1<<40), "never posted")
	want := []uint64{}
	for id, n := range model {
		for ; n > 0; n-- {
			want = append(want, id)
		}
	}
	assert.ElementsMatch(t, want, drainFlush(w), "the rest flushes once each")
	assert.Zero(t, w.OutstandingP())
	assert.Equal(t, depth, w.Room())
}

// PopFlush takes the oldest outstanding request first: with completions in
// order, the rest flushes in posting order; an out-of-order completion
// moves the oldest into its place, and each still flushes once.
func TestPopFlushTakesTheOldestFirst(t *testing.T) {
	w, _ := newQueue(t, 8)
	put(t, w, 1, 2, 3, 4, 5, 6)
	require.True(t, w.Complete(1))
	require.True(t, w.Complete(2))
	assert.Equal(t, []uint64{3, 4, 5, 6}, drainFlush(w))
	_, ok := w.PopFlush()
	assert.False(t, ok, "nothing left")

	put(t, w, 11, 12, 13, 14)
	require.True(t, w.Complete(13)) // 11 moves into 13's place
	assert.Equal(t, []uint64{12, 11, 14}, drainFlush(w))
	assert.Zero(t, w.Outstanding(), "PopFlush shows the poster at once")
}

// The poster learns of completions only at PublishHead: until then it sees
// fewer free slots than there are, never more.
func TestCompletionsReachThePosterAtPublishHead(t *testing.T) {
	w, _ := newQueue(t, 8)
	put(t, w, 1, 2, 3)
	require.True(t, w.Complete(2))
	require.True(t, w.Complete(3))
	assert.Equal(t, 3, w.Outstanding())
	assert.Equal(t, 3, w.OutstandingP())
	assert.Equal(t, 5, w.Room())
	w.PublishHead()
	assert.Equal(t, 1, w.Outstanding())
	assert.Equal(t, 1, w.OutstandingP())
	assert.Equal(t, 7, w.Room())
	assert.Equal(t, uint32(3), w.Posted())
}

// A deferred call publishes nothing and rings nothing; the next doorbell
// (End without defer, or Ring) hands everything pending over at once.
func TestDeferredCallsWaitForOneDoorbell(t *testing.T) {
	w, c := newQueue(t, 8)
	w.PutRecv(1, nil)
	require.NoError(t, w.End(true))
	w.PutRecv(2, nil)
	w.PutRecv(3, nil)
	require.NoError(t, w.End(true))
	ready, err := c.Ready()
	require.NoError(t, err)
	assert.Zero(t, ready, "the device sees nothing deferred")
	assert.Zero(t, w.Doorbell().Stats().Doorbells)
	assert.Equal(t, 3, w.OutstandingP(), "the poller sees deferred requests")
	require.NoError(t, w.Ring())
	ready, err = c.Ready()
	require.NoError(t, err)
	assert.Equal(t, 3, ready)
	st := w.Doorbell().Stats()
	assert.Equal(t, uint64(1), st.Doorbells)
	assert.Equal(t, uint64(3), st.WQEs)
	require.NoError(t, w.Ring())
	assert.Equal(t, uint64(1), w.Doorbell().Stats().Doorbells, "a Ring with nothing pending rings nothing")
}

// A refused post still hands what was pending to the device, with one
// doorbell, and reports the request it refused.
func TestFailHandsThePendingToTheDevice(t *testing.T) {
	w, c := newQueue(t, 8)
	w.PutRecv(1, nil)
	require.NoError(t, w.End(true)) // deferred
	w.PutRecv(2, nil)
	err := w.Fail(1, 3, wq.ErrQueueFull)
	var pe *wq.PostError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, wq.PostError{Queue: "QP 1", Index: 1, WRID: 3, Err: wq.ErrQueueFull}, *pe)
	assert.ErrorIs(t, err, wq.ErrQueueFull)
	st := w.Doorbell().Stats()
	assert.Equal(t, uint64(1), st.Doorbells)
	assert.Equal(t, uint64(1), st.FailedPosts)
	assert.Equal(t, uint64(2), st.WQEs)
	ready, err := c.Ready()
	require.NoError(t, err)
	assert.Equal(t, 2, ready)
	assert.Equal(t, 2, w.OutstandingP())
}

// The zero Queue (the receive queue of a QP on an SRQ) holds nothing, and
// a refusal on it rings nothing and does not panic.
func TestEmptyQueueHoldsNothing(t *testing.T) {
	var w wq.Queue
	w.SetName("QP 9")
	assert.Zero(t, w.Slots())
	assert.Zero(t, w.Outstanding())
	assert.Zero(t, w.OutstandingP())
	assert.Nil(t, w.Doorbell())
	assert.False(t, w.Complete(0))
	_, ok := w.PopFlush()
	assert.False(t, ok)
	assert.NoError(t, w.Ring())
	err := w.Fail(0, 5, wq.ErrInvalid)
	var pe *wq.PostError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, "QP 9", pe.Queue)
	assert.ErrorIs(t, err, wq.ErrInvalid)
}

// Init refuses a ring it cannot lay WQEs out in.
func TestInitRefusesABadRing(t *testing.T) {
	reg, err := mmio.New(make([]byte, doorbell.PageSize))
	require.NoError(t, err)
	for _, tc := range []struct {
		name                string
		data, stride, depth int
	}{
		{"data shorter than the slots", 7 * 32, 32, 8},
		{"a stride not a power of two", 8 * 48, 48, 8},
		{"a zero stride", 8 * 32, 0, 8},
		{"a depth not a power of two", 6 * 32, 32, 6},
	} {
		var w wq.Queue
		err := w.Init("QP 1", reg, make([]byte, 8), make([]byte, tc.data), tc.stride, tc.depth, 1, doorbell.OffsetQP, doorbell.QPRecv|1)
		assert.Error(t, err, tc.name)
	}
}

// runPosterAndPoller runs, for about d, a poster that fills w and a poller
// that is also the device (it completes what it reads from the ring),
// yielding to each other, while the test goroutine calls check without
// yielding (the scheduler preempts it anywhere, between OutstandingP's two
// loads too) until it reports a failure.
func runPosterAndPoller(t *testing.T, w *wq.Queue, c *rings.Consumer, d time.Duration, check func(reads int) bool) {
	var stop, posted atomic.Bool
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // poster
		defer wg.Done()
		defer posted.Store(true)
		for i := uint64(0); !stop.Load(); {
			if w.Room() == 0 {
				runtime.Gosched()
				continue
			}
			w.PutRecv(i, nil)
			if err := w.End(false); err != nil {
				t.Error(err)
				return
			}
			i++
		}
	}()
	go func() { // device and poller
		defer wg.Done()
		for {
			done := posted.Load() // before Ready: nothing is posted after it
			r, err := c.Ready()
			if err != nil {
				t.Error(err)
				return
			}
			if r == 0 {
				if done {
					return
				}
				runtime.Gosched()
				continue
			}
			for i := 0; i < r; i++ {
				id, _, _ := rings.DecodeRecvWQE(w.Slot(c.Slot(i)), nil)
				if !w.Complete(id) {
					t.Errorf("wr_id %d not outstanding", id)
				}
			}
			c.Consume(r)
			w.PublishHead()
		}
	}()
	end := time.Now().Add(d)
	for reads := 0; check(reads); reads++ {
		if reads%1024 == 0 && time.Now().After(end) {
			break
		}
	}
	stop.Store(true)
	wg.Wait()
	assert.Zero(t, w.OutstandingP())
}

// OutstandingP, read from a third goroutine while a poster and a poller
// run, is never negative: it reads the completions before the posts. A
// negative difference of its uint32 counters would show as a wrap, far
// above any ring. (A ring of one slot, so that one post and its completion
// between the two loads would show.)
func TestOutstandingPNeverNegative(t *testing.T) {
	w, c := newQueue(t, 1)
	runPosterAndPoller(t, w, c, 500*time.Millisecond, func(reads int) bool {
		if o := w.OutstandingP(); o < 0 || o > math.MaxInt32 {
			t.Errorf("OutstandingP %d after %d reads", o, reads)
			return false
		}
		return true
	})
}

// OutstandingP never counts more requests than the ring holds, whatever
// the poster and poller do between its two loads (RecvQuery's Allocated
// reads it: a QP cannot hold more buffers than its queue's depth). A ring
// of one slot: one completion and one post between the loads would show.
func TestOutstandingPNeverExceedsTheRing(t *testing.T) {
	w, c := newQueue(t, 1)
	runPosterAndPoller(t, w, c, 500*time.Millisecond, func(reads int) bool {
		if o := w.OutstandingP(); o > w.Slots() {
			t.Errorf("OutstandingP %d in a ring of %d, after %d reads", o, w.Slots(), reads)
			return false
		}
		return true
	})
}
