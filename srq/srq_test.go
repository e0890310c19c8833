package srq_test

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/mmio"
	"github.com/vfrdma/vfrdma/rings"
	"github.com/vfrdma/vfrdma/srq"
	"github.com/vfrdma/vfrdma/wq"
)

const (
	pd     = 7
	handle = 3
	maxSGE = 4
)

// rig is a Queue over ordinary memory with a fake device that reads what
// was published and hands the wr_ids back, in an order the test chooses.
type rig struct {
	q      *srq.Queue
	keys   *wq.Keys
	uar    []byte
	data   []byte
	stride int
	cons   *rings.Consumer
	events []srq.Event
	mr     wq.Region // lkey 1: 64 KiB of pd, local write
}

func newRig(t testing.TB, slots, depth int, need bool) *rig {
	t.Helper()
	r := &rig{keys: &wq.Keys{}, uar: make([]byte, doorbell.PageSize), stride: rings.RecvStride(maxSGE)}
	r.mr = wq.Region{PD: pd, Addr: 0x10000, Len: 1 << 16, Access: wq.AccessLocalWrite}
	r.keys.Set(1, &r.mr)
	r.keys.Set(2, &wq.Region{PD: pd + 1, Addr: 0x90000, Len: 4096, Access: wq.AccessLocalWrite}) // another PD
	r.keys.Set(3, &wq.Region{PD: pd, Addr: 0xa0000, Len: 4096})                                  // no local write
	reg, err := mmio.New(r.uar)
	require.NoError(t, err)
	state := make([]byte, 8)
	r.data = make([]byte, slots*r.stride)
	r.q, err = srq.New(srq.Config{
		Name: "SRQ 3", State: state, Data: r.data, Stride: r.stride, Slots: slots,
		Register: reg, Offset: doorbell.OffsetSRQ, Value: doorbell.SRQRecv | handle,
		Depth: depth, MaxSGE: maxSGE, PD: pd, Keys: r.keys, NeedMember: need,
		OnLowWatermark: func(ev srq.Event) { r.events = append(r.events, ev) },
	})
	require.NoError(t, err)
	st, err := rings.NewState(state)
	require.NoError(t, err)
	r.cons, err = rings.NewConsumer(st, slots)
	require.NoError(t, err)
	return r
}

func (r *rig) sge(off, n int) wq.SGE {
	return wq.SGE{Addr: r.mr.Addr + uint64(off), Length: uint32(n), LKey: 1}
}

// take is the device: it reads every published receive WQE and returns the
// wr_ids, with their SGE counts, in ring order.
func (r *rig) take(t testing.TB) (ids []uint64, nsge []int) {
	ready, err := r.cons.Ready()
	require.NoError(t, err)
	sges := make([]rings.SGE, maxSGE)
	for i := 0; i < ready; i++ {
		s := r.cons.Slot(i)
		id, n, err := rings.DecodeRecvWQE(r.data[s*r.stride:(s+1)*r.stride], sges)
		require.NoError(t, err)
		ids, nsge = append(ids, id), append(nsge, n)
	}
	r.cons.Consume(ready)
	return ids, nsge
}

func (r *rig) doorbellValue() uint32 {
	return binary.LittleEndian.Uint32(r.uar[doorbell.OffsetSRQ:])
}

func post(t testing.TB, r *rig, ids ...uint64) {
	t.Helper()
	wrs := make([]wq.RecvWR, len(ids))
	for i, id := range ids {
		wrs[i] = wq.RecvWR{WRID: id, SGEs: []wq.SGE{r.sge(int(id%64)*1024, 1024)}}
	}
	n, err := r.q.Post(wrs, false)
	require.NoError(t, err)
	require.Equal(t, len(ids), n)
}

// Rule 1: every refusal is inline, distinct, writes no WQE, makes no
// completion, and what was deferred before it still reaches the device.
func TestPostErrorsAreDistinctAndLoseNothing(t *testing.T) {
	r := newRig(t, 8, 4, true)
	m0 := wq.RecvWR{WRID: 1, SGEs: []wq.SGE{r.sge(0, 64)}}
	_, err := r.q.Post([]wq.RecvWR{m0}, false)
	assert.ErrorIs(t, err, wq.ErrInvalid, "a post with no QP attached where one is needed")
	m, err := r.q.Attach(0x42)
	require.NoError(t, err)

	good := r.sge(0, 64)
	for _, tc := range []struct {
		name string
		sges []wq.SGE
		want error
	}{
		{"too many SGEs", []wq.SGE{good, good, good, good, good}, wq.ErrInvalid},
		{"a segment outside its region", []wq.SGE{r.sge(1<<16-8, 16)}, wq.ErrInvalid},
		{"a region of another PD", []wq.SGE{{Addr: 0x90000, Length: 8, LKey: 2}}, wq.ErrProtection},
		{"a region without local write", []wq.SGE{{Addr: 0xa0000, Length: 8, LKey: 3}}, wq.ErrPrivileges},
		{"a key no region has", []wq.SGE{{Addr: 0x10000, Length: 8, LKey: 99}}, wq.ErrPrivileges},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := r.q.Doorbell()
			_, err := r.q.Post([]wq.RecvWR{{WRID: 10, SGEs: []wq.SGE{good}}}, true)
			require.NoError(t, err)
			assert.Equal(t, before.Doorbells, r.q.Doorbell().Doorbells, "a deferred post rings nothing")
			n, err := r.q.Post([]wq.RecvWR{{WRID: 11, SGEs: []wq.SGE{good}}, {WRID: 12, SGEs: tc.sges}}, false)
			assert.Equal(t, 1, n)
			var pe *wq.PostError
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, 1, pe.Index)
			assert.Equal(t, uint64(12), pe.WRID)
			assert.ErrorIs(t, err, tc.want)
			for _, other := range []error{wq.ErrInvalid, wq.ErrProtection, wq.ErrPrivileges, wq.ErrQueueFull, wq.ErrClosed} {
				if other != tc.want {
					assert.NotErrorIs(t, err, other)
				}
			}
			after := r.q.Doorbell()
			assert.Equal(t, before.Doorbells+1, after.Doorbells, "one doorbell for the deferred and the good")
			assert.Equal(t, uint32(doorbell.SRQRecv|handle), r.doorbellValue())
			ids, _ := r.take(t)
			assert.Equal(t, []uint64{10, 11}, ids, "the device got what came before the refusal, no more")
			for _, id := range ids {
				require.True(t, r.q.Complete(m, id))
			}
			assert.Zero(t, r.q.Available())
		})
	}
	// Full at the depth.
	post(t, r, 1, 2, 3, 4)
	_, err = r.q.Post([]wq.RecvWR{{WRID: 5, SGEs: []wq.SGE{good}}}, false)
	assert.ErrorIs(t, err, wq.ErrQueueFull)
	ids, _ := r.take(t)
	assert.Len(t, ids, 4)
	// Closed: an invalid handle.
	assert.Equal(t, 4, r.q.Close())
	_, err = r.q.Post([]wq.RecvWR{{WRID: 6, SGEs: []wq.SGE{good}}}, false)
	assert.ErrorIs(t, err, wq.ErrClosed)
	ids, _ = r.take(t)
	assert.Empty(t, ids)
}

// Rule 1 (zero size): a receive with no SGEs is posted with num_sge 0.
func TestZeroSegmentReceive(t *testing.T) {
	r := newRig(t, 8, 8, false)
	_, err := r.q.Post([]wq.RecvWR{{WRID: 1}, {WRID: 2, SGEs: []wq.SGE{}}}, false)
	require.NoError(t, err)
	ids, nsge := r.take(t)
	assert.Equal(t, []uint64{1, 2}, ids)
	assert.Equal(t, []int{0, 0}, nsge)
}

// Rule 7: completions of different QPs come in any order; the accounting
// counts each receive once, per QP, and refuses what is not outstanding.
func TestOutOfOrderCompletionsCountExactly(t *testing.T) {
	r := newRig(t, 16, 16, false)
	a, _ := r.q.Attach(1)
	b, _ := r.q.Attach(2)
	post(t, r, 10, 11, 12, 13, 14, 15)
	r.take(t)
	for _, c := range []struct {
		m  *srq.Member
		id uint64
	}{{b, 14}, {a, 10}, {b, 12}, {a, 15}} {
		require.True(t, r.q.Complete(c.m, c.id), "wr_id %d", c.id)
	}
	assert.False(t, r.q.Complete(a, 14), "a second completion of 14")
	assert.False(t, r.q.Complete(a, 99), "a completion of nothing posted")
	s := r.q.Query()
	assert.Equal(t, 2, s.Available)
	assert.Equal(t, uint64(4), s.Consumed)
	require.Len(t, s.QPs, 2)
	assert.Equal(t, srq.QPView{QPN: 1, Consumed: 2, Allocated: srq.Unknown, Span: srq.Unknown}, s.QPs[0])
	assert.Equal(t, srq.QPView{QPN: 2, Consumed: 2, Allocated: srq.Unknown, Span: srq.Unknown}, s.QPs[1])
	assert.False(t, r.q.PerQPAllocationKnown())
	// The rest flush, once each.
	r.q.Close()
	var flushed []uint64
	for {
		id, ok := r.q.PopFlush()
		if !ok {
			break
		}
		flushed = append(flushed, id)
	}
	assert.ElementsMatch(t, []uint64{11, 13}, flushed)
	assert.Equal(t, uint64(2), r.q.Query().Flushed)
}

// Rule 4: the completion that leaves fewer than the watermark available
// raises one event, to the callback and the channel, and disarms it; armed
// while below, it fires with the next completion; the callback may re-arm.
func TestLowWatermarkOncePerArming(t *testing.T) {
	r := newRig(t, 16, 16, false)
	m, _ := r.q.Attach(1)
	post(t, r, 0, 1, 2, 3, 4, 5, 6, 7)
	r.take(t)
	require.NoError(t, r.q.SetLowWatermark(5))
	for id := uint64(0); id < 3; id++ { // 7, 6, 5 left
		r.q.Complete(m, id)
	}
	assert.Empty(t, r.events, "5 available, watermark 5")
	r.q.Complete(m, 3) // 4 < 5
	assert.Equal(t, []srq.Event{{Available: 4, Watermark: 5}}, r.events)
	assert.Equal(t, srq.Event{Available: 4, Watermark: 5}, <-r.q.LowWatermarkEvents())
	assert.Zero(t, r.q.Query().LowWatermark, "disarmed")
	r.q.Complete(m, 4)
	assert.Len(t, r.events, 1, "not armed again")

	require.NoError(t, r.q.SetLowWatermark(6)) // 3 available: armed below
	assert.Len(t, r.events, 1, "arming below the line raises nothing by itself")
	r.q.Complete(m, 5)
	assert.Equal(t, srq.Event{Available: 2, Watermark: 6}, r.events[1])

	// A callback that re-arms (on the poller's goroutine) does not deadlock.
	q2 := newRig(t, 8, 8, false)
	fired := 0
	var q *srq.Queue
	q2.q, _ = srq.New(srq.Config{Name: "SRQ 4", State: make([]byte, 8), Data: make([]byte, 8*q2.stride), Stride: q2.stride, Slots: 8,
		Register: mustReg(t, q2.uar), Offset: doorbell.OffsetSRQ, Value: doorbell.SRQRecv | 4, Depth: 8, MaxSGE: maxSGE,
		PD: pd, Keys: q2.keys, OnLowWatermark: func(srq.Event) {
			fired++
			require.NoError(t, q.SetLowWatermark(1))
		}})
	q = q2.q
	m2, _ := q.Attach(1)
	_, err := q.Post([]wq.RecvWR{{WRID: 1}, {WRID: 2}, {WRID: 3}}, false)
	require.NoError(t, err)
	require.NoError(t, q.SetLowWatermark(3))
	q.Complete(m2, 1) // 2 < 3: fires, re-arms at 1
	q.Complete(m2, 2) // 1: not below 1
	q.Complete(m2, 3) // 0 < 1: fires again
	assert.Equal(t, 2, fired)
	assert.ErrorIs(t, q.SetLowWatermark(9), wq.ErrInvalid, "above the depth")
}

func mustReg(t testing.TB, b []byte) *mmio.Region {
	reg, err := mmio.New(b)
	require.NoError(t, err)
	return reg
}

// Rule 6: the depth moves within the ring reserved at creation; shrinking
// below what is outstanding is refused and changes nothing.
func TestResizeWithinTheReservedRing(t *testing.T) {
	r := newRig(t, 16, 4, false)
	m, _ := r.q.Attach(1)
	post(t, r, 0, 1, 2, 3)
	_, err := r.q.Post([]wq.RecvWR{{WRID: 4}}, false)
	assert.ErrorIs(t, err, wq.ErrQueueFull)
	require.NoError(t, r.q.Resize(12))
	post(t, r, 4, 5, 6, 7, 8, 9, 10, 11)
	_, err = r.q.Post([]wq.RecvWR{{WRID: 12}}, false)
	assert.ErrorIs(t, err, wq.ErrQueueFull, "past 12")
	err = r.q.Resize(8)
	assert.ErrorIs(t, err, wq.ErrBusy, "12 outstanding")
	assert.Equal(t, 12, r.q.Depth(), "a refused resize changes nothing")
	assert.ErrorIs(t, r.q.Resize(17), wq.ErrInvalid, "past the ring")
	assert.ErrorIs(t, r.q.Resize(0), wq.ErrInvalid)
	r.take(t)
	for id := uint64(0); id < 6; id++ {
		r.q.Complete(m, id)
	}
	require.NoError(t, r.q.Resize(6), "6 outstanding")
	_, err = r.q.Post([]wq.RecvWR{{WRID: 12}}, false)
	assert.ErrorIs(t, err, wq.ErrQueueFull, "past 6")
	s := r.q.Query()
	assert.Equal(t, 6, s.Depth)
	assert.Equal(t, 16, s.Slots)
	assert.Equal(t, maxSGE, s.MaxSGE)
}

// Posting and completing allocate nothing.
func TestPostAndCompleteAllocateNothing(t *testing.T) {
	r := newRig(t, 64, 64, false)
	m, _ := r.q.Attach(1)
	wrs := make([]wq.RecvWR, 32)
	for i := range wrs {
		wrs[i] = wq.RecvWR{WRID: uint64(i), SGEs: []wq.SGE{r.sge(i*1024, 1024)}}
	}
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := r.q.Post(wrs, false); err != nil {
			t.Fatal(err)
		}
		ready, _ := r.cons.Ready() // the device takes them
		r.cons.Consume(ready)
		for i := range wrs {
			r.q.Complete(m, wrs[len(wrs)-1-i].WRID) // out of order
		}
	})
	assert.Zero(t, allocs)
}

// The accounting under concurrent posters, a device and a poller that
// completes out of order to random QPs, with queries all along: nothing is
// lost or counted twice, and no snapshot is inconsistent.
func TestConcurrentPostsAndOutOfOrderCompletions(t *testing.T) {
	const (
		slots, posters, each = 256, 4, 5000
		qps                  = 3
	)
	r := newRig(t, slots, slots, false)
	members := make([]*srq.Member, qps)
	for i := range members {
		members[i], _ = r.q.Attach(uint32(100 + i))
	}
	var wg sync.WaitGroup
	var done atomic.Bool
	for p := 0; p < posters; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			sg := []wq.SGE{r.sge(p*1024, 1024)}
			for i := 0; i < each; {
				_, err := r.q.Post([]wq.RecvWR{{WRID: uint64(p*each + i), SGEs: sg}}, false)
				if errors.Is(err, wq.ErrQueueFull) {
					time.Sleep(time.Microsecond)
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				i++
			}
		}(p)
	}
	// The device hands what it takes to the poller, which completes each
	// batch in reverse, to random members.
	taken := make(chan []uint64, 64)
	go func() {
		defer close(taken)
		sges := make([]rings.SGE, maxSGE)
		for got := 0; got < posters*each; {
			ready, err := r.cons.Ready()
			if err != nil {
				t.Error(err)
				return
			}
			if ready == 0 {
				time.Sleep(10 * time.Microsecond)
				continue
			}
			ids := make([]uint64, ready)
			for i := range ids {
				s := r.cons.Slot(i)
				ids[i], _, _ = rings.DecodeRecvWQE(r.data[s*r.stride:(s+1)*r.stride], sges)
			}
			r.cons.Consume(ready)
			got += ready
			taken <- ids
		}
	}()
	seen := make(map[uint64]int, posters*each)
	pollerDone := make(chan struct{})
	go func() {
		defer close(pollerDone)
		rnd := rand.New(rand.NewPCG(1, 2))
		for ids := range taken {
			for i := len(ids) - 1; i >= 0; i-- {
				if !r.q.Complete(members[rnd.IntN(qps)], ids[i]) {
					t.Errorf("wr_id %d: not outstanding", ids[i])
				}
				seen[ids[i]]++
			}
		}
	}()
	queries := make(chan int)
	go func() {
		n := 0
		defer func() { queries <- n }()
		for !done.Load() {
			s := r.q.Query()
			var sum uint64
			for _, v := range s.QPs {
				sum += v.Consumed
				if v.Allocated != srq.Unknown || v.Span != srq.Unknown {
					t.Errorf("QP %d: allocated %d, span %d; want Unknown", v.QPN, v.Allocated, v.Span)
				}
			}
			if s.Available < 0 || s.Available > s.Depth || sum != s.Consumed {
				t.Errorf("inconsistent snapshot %+v", s)
			}
			n++
		}
	}()
	wg.Wait()
	<-pollerDone
	done.Store(true)
	assert.Positive(t, <-queries, "queries taken during the run")
	assert.Len(t, seen, posters*each, "every receive completed")
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("wr_id %d completed %d times", id, n)
		}
	}
	s := r.q.Query()
	assert.Equal(t, uint64(posters*each), s.Consumed)
	assert.Zero(t, s.Available)
}
