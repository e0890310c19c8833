package wq_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/mmio"
	"github.com/vfrdma/vfrdma/rings"
	"github.com/vfrdma/vfrdma/wq"
)

func newQueue(t testing.TB, depth int) (*wq.Queue, *rings.Consumer) {
	t.Helper()
	reg, err := mmio.New(make([]byte, doorbell.PageSize))
	require.NoError(t, err)
	state := make([]byte, 8)
	var w wq.Queue
	stride := rings.RecvStride(1)
	require.NoError(t, w.Init("QP 1", reg, state, make([]byte, depth*stride), stride, depth, 1, doorbell.OffsetQP, doorbell.QPRecv|1))
	st, _ := rings.NewState(state)
	c, err := rings.NewConsumer(st, depth)
	require.NoError(t, err)
	return &w, c
}

func put(t testing.TB, w *wq.Queue, ids ...uint64) {
	for _, id := range ids {
		w.PutRecv(id, nil)
	}
	require.NoError(t, w.End(false))
}

// Completions in any order remove each outstanding request once; the
// record stays dense, so flushing what is left returns exactly the rest.
func TestCompleteOutOfOrderThenFlushTheRest(t *testing.T) {
	w, _ := newQueue(t, 8)
	put(t, w, 1, 2, 3, 4, 5, 6)
	for _, id := range []uint64{4, 1, 6} {
		require.True(t, w.Complete(id), "wr_id %d", id)
	}
	assert.False(t, w.Complete(4), "twice")
	assert.False(t, w.Complete(9), "never posted")
	assert.Equal(t, 6, w.Outstanding(), "the poster sees completions once published")
	w.PublishHead()
	assert.Equal(t, 3, w.Outstanding())
	assert.Equal(t, 3, w.OutstandingP())
	var rest []uint64
	for id, ok := w.PopFlush(); ok; id, ok = w.PopFlush() {
		rest = append(rest, id)
	}
	assert.ElementsMatch(t, []uint64{2, 3, 5}, rest)
	assert.Zero(t, w.OutstandingP())
	assert.Equal(t, 8, w.Room())
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
	assert.Equal(t, uint64(1), w.Doorbell().Stats().Doorbells)
	ready, err := c.Ready()
	require.NoError(t, err)
	assert.Equal(t, 2, ready)
	assert.Equal(t, 2, w.OutstandingP())
}

// OutstandingP is never negative while a poster and a poller run.
func TestOutstandingPNeverNegative(t *testing.T) {
	const n = 20000
	w, c := newQueue(t, 64)
	ids := make(chan uint64, 64)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // poster
		defer wg.Done()
		for i := uint64(0); i < n; {
			if w.Room() == 0 {
				continue
			}
			w.PutRecv(i, nil)
			if err := w.End(false); err != nil {
				t.Error(err)
				return
			}
			ids <- i
			i++
		}
		close(ids)
	}()
	go func() { // device and poller
		defer wg.Done()
		for id := range ids {
			if r, _ := c.Ready(); r > 0 {
				c.Consume(r)
			}
			if !w.Complete(id) {
				t.Errorf("wr_id %d not outstanding", id)
			}
			w.PublishHead()
		}
	}()
	for i := 0; i < n; i++ {
		if o := w.OutstandingP(); o < 0 || o > 64 {
			t.Fatalf("OutstandingP %d", o)
		}
	}
	wg.Wait()
	assert.Zero(t, w.OutstandingP())
}

// Each SGE check has its own error.
func TestCheckSGEsErrors(t *testing.T) {
	keys := &wq.Keys{}
	keys.Set(1, &wq.Region{PD: 1, Addr: 0x1000, Len: 0x1000, Access: wq.AccessLocalWrite})
	keys.Set(2, &wq.Region{PD: 2, Addr: 0x8000, Len: 0x1000, Access: wq.AccessLocalWrite})
	keys.Set(0x4000_0003, &wq.Region{PD: 1, Addr: 0x9000, Len: 0x1000}) // read only, hashed key
	ok := wq.SGE{Addr: 0x1000, Length: 0x1000, LKey: 1}
	total, err := wq.CheckSGEs(keys, 1, []wq.SGE{ok, ok}, 2, true)
	require.NoError(t, err)
	assert.Equal(t, 0x2000, total)
	_, err = wq.CheckSGEs(keys, 1, []wq.SGE{{Addr: 0x9000, Length: 8, LKey: 0x4000_0003}}, 1, false)
	assert.NoError(t, err, "a send reads a read-only MR")
	for _, tc := range []struct {
		name string
		sges []wq.SGE
		want error
	}{
		{"too many", []wq.SGE{ok, ok, ok}, wq.ErrInvalid},
		{"past the end", []wq.SGE{{Addr: 0x1ff8, Length: 9, LKey: 1}}, wq.ErrInvalid},
		{"before the start", []wq.SGE{{Addr: 0xfff, Length: 1, LKey: 1}}, wq.ErrInvalid},
		{"another PD", []wq.SGE{{Addr: 0x8000, Length: 1, LKey: 2}}, wq.ErrProtection},
		{"unknown key", []wq.SGE{{Addr: 0x1000, Length: 1, LKey: 7}}, wq.ErrPrivileges},
		{"no local write", []wq.SGE{{Addr: 0x9000, Length: 1, LKey: 0x4000_0003}}, wq.ErrPrivileges},
	} {
		_, err := wq.CheckSGEs(keys, 1, tc.sges, 2, true)
		assert.ErrorIs(t, err, tc.want, tc.name)
	}
}

// The table maps small and large keys, replaces and removes only what
// still maps to the value given.
func TestTable(t *testing.T) {
	var tb wq.Table[*int]
	a, b, c := new(int), new(int), new(int)
	assert.Nil(t, tb.Lookup(5))
	tb.Set(5, a)
	tb.Set(0xabcdef, b)
	for k := uint32(2000); k < 2100; k++ { // past the direct range, many probes
		tb.Set(k, c)
	}
	assert.Equal(t, a, tb.Lookup(5))
	assert.Equal(t, b, tb.Lookup(0xabcdef))
	assert.Equal(t, c, tb.Lookup(2050))
	assert.Nil(t, tb.Lookup(6))
	assert.Equal(t, 102, tb.Len())
	tb.Remove(5, b) // not what 5 maps to
	assert.Equal(t, a, tb.Lookup(5))
	tb.Remove(5, a)
	assert.Nil(t, tb.Lookup(5))
	tb.Set(0xabcdef, a)
	assert.Equal(t, a, tb.Lookup(0xabcdef))
	assert.Equal(t, 101, tb.Len())
	assert.Zero(t, testing.AllocsPerRun(100, func() { tb.Lookup(2050); tb.Lookup(7) }))
}
