package srq_test

import (
	"encoding/binary"
	"errors"
	"fmt"
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
	unset  = 0xEE // what ring memory holds where no WQE was written
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
	events []srq.Event // what OnLowWatermark saw
	mr     wq.Region   // lkey 1: 64 KiB of pd, local write
}

// newRig builds the rig; opts may change the Queue's config before New.
func newRig(t testing.TB, slots, depth int, need bool, opts ...func(*srq.Config)) *rig {
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
	for i := range r.data {
		r.data[i] = unset
	}
	cfg := srq.Config{
		Name: "SRQ 3", State: state, Data: r.data, Stride: r.stride, Slots: slots,
		Register: reg, Offset: doorbell.OffsetSRQ, Value: doorbell.SRQRecv | handle,
		Depth: depth, MaxSGE: maxSGE, PD: pd, Keys: r.keys, NeedMember: need,
		OnLowWatermark: func(ev srq.Event) { r.events = append(r.events, ev) },
	}
	for _, o := range opts {
		o(&cfg)
	}
	r.q, err = srq.New(cfg)
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
// It reports errors with t.Fatal, not require: require's t.Helper costs
// more than the device, and benchmarks drain through take.
func (r *rig) take(t testing.TB) (ids []uint64, nsge []int) {
	ready, err := r.cons.Ready()
	if err != nil {
		t.Fatal(err)
	}
	sges := make([]rings.SGE, maxSGE)
	ids, nsge = make([]uint64, 0, ready), make([]int, 0, ready)
	for i := 0; i < ready; i++ {
		s := r.cons.Slot(i)
		id, n, err := rings.DecodeRecvWQE(r.data[s*r.stride:(s+1)*r.stride], sges)
		if err != nil {
			t.Fatalf("slot %d: %v", s, err)
		}
		ids, nsge = append(ids, id), append(nsge, n)
	}
	r.cons.Consume(ready)
	return ids, nsge
}

// nextSlotUnwritten reports whether the ring slot after everything the
// device took still holds what the rig filled the ring with.
func (r *rig) nextSlotUnwritten() bool {
	s := r.cons.Slot(0)
	for _, b := range r.data[s*r.stride : (s+1)*r.stride] {
		if b != unset {
			return false
		}
	}
	return true
}

// doorbellValue reads the SRQ doorbell register; clearDoorbell zeroes it.
func (r *rig) doorbellValue() uint32 {
	return binary.LittleEndian.Uint32(r.uar[doorbell.OffsetSRQ:])
}

func (r *rig) clearDoorbell() { binary.LittleEndian.PutUint32(r.uar[doorbell.OffsetSRQ:], 0) }

// drainEvents empties the low-watermark channel and returns what it held.
func (r *rig) drainEvents() []srq.Event {
	var evs []srq.Event
	for {
		select {
		case ev := <-r.q.LowWatermarkEvents():
			evs = append(evs, ev)
		default:
			return evs
		}
	}
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

// errKinds are the post path's sentinels: a refusal wraps exactly one.
var errKinds = []error{wq.ErrInvalid, wq.ErrProtection, wq.ErrPrivileges, wq.ErrQueueFull, wq.ErrClosed, wq.ErrBusy}

func assertOnlyKind(t *testing.T, err, want error) {
	t.Helper()
	require.ErrorIs(t, err, want)
	for _, k := range errKinds {
		if k != want {
			assert.NotErrorIs(t, err, k)
		}
	}
}

// Each bad receive is refused inline with its own sentinel; the refusal
// writes no WQE and makes no completion, and what came before it in the
// call, and every receive deferred before the call, still reach the device
// with one doorbell.
func TestPostRefusalIsDistinctAndLosesNothing(t *testing.T) {
	r := newRig(t, 16, 8, false) // a slot never reused: the refused one must stay unwritten
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
		{"a segment before its region", []wq.SGE{{Addr: r.mr.Addr - 1, Length: 8, LKey: 1}}, wq.ErrInvalid},
		{"a region of another PD", []wq.SGE{{Addr: 0x90000, Length: 8, LKey: 2}}, wq.ErrProtection},
		{"a region without local write", []wq.SGE{{Addr: 0xa0000, Length: 8, LKey: 3}}, wq.ErrPrivileges},
		{"a key no region has", []wq.SGE{{Addr: 0x10000, Length: 8, LKey: 99}}, wq.ErrPrivileges},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r.clearDoorbell()
			before := r.q.Doorbell()
			n, err := r.q.Post([]wq.RecvWR{{WRID: 10, SGEs: []wq.SGE{good}}}, true)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			assert.Equal(t, before.Doorbells, r.q.Doorbell().Doorbells, "a deferred post rings nothing")
			assert.Zero(t, r.doorbellValue(), "a deferred post rings nothing")
			ready, _ := r.cons.Ready()
			assert.Zero(t, ready, "a deferred post publishes nothing")

			n, err = r.q.Post([]wq.RecvWR{{WRID: 11, SGEs: []wq.SGE{good}}, {WRID: 12, SGEs: tc.sges}, {WRID: 13}}, false)
			assert.Equal(t, 1, n, "receives posted")
			var pe *wq.PostError
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, "SRQ 3", pe.Queue)
			assert.Equal(t, 1, pe.Index)
			assert.Equal(t, uint64(12), pe.WRID)
			assertOnlyKind(t, err, tc.want)

			after := r.q.Doorbell()
			assert.Equal(t, before.Doorbells+1, after.Doorbells, "one doorbell for the deferred and the good")
			assert.Equal(t, before.WQEs+2, after.WQEs, "WQEs handed to the device")
			assert.Equal(t, uint32(doorbell.SRQRecv|handle), r.doorbellValue(), "the doorbell register")
			assert.Equal(t, 2, r.q.Available(), "the refused receive and those after it are not outstanding")
			ids, _ := r.take(t)
			assert.Equal(t, []uint64{10, 11}, ids, "the device got what came before the refusal, no more")
			assert.True(t, r.nextSlotUnwritten(), "the refused receive wrote no WQE")
			assert.False(t, r.q.Complete(m, 12), "the refused receive makes no completion")
			for _, id := range ids {
				require.True(t, r.q.Complete(m, id))
			}
			assert.Zero(t, r.q.Available())
		})
	}
}

// A post while no QP is attached, where one is needed (QEMU), is refused
// with ErrInvalid and reaches nothing; attached, it goes; detached again,
// it is refused again.
func TestPostNeedsAMemberWhenConfigured(t *testing.T) {
	r := newRig(t, 8, 8, true)
	_, err := r.q.Post([]wq.RecvWR{{WRID: 1, SGEs: []wq.SGE{r.sge(0, 64)}}}, false)
	assertOnlyKind(t, err, wq.ErrInvalid)
	assert.Zero(t, r.q.Doorbell().Doorbells)
	assert.Zero(t, r.q.Available())
	assert.True(t, r.nextSlotUnwritten())
	m, err := r.q.Attach(0x42)
	require.NoError(t, err)
	assert.Equal(t, 1, r.q.Members())
	post(t, r, 2)
	m.Detach()
	m.Detach() // twice is harmless
	assert.Zero(t, r.q.Members())
	_, err = r.q.Post([]wq.RecvWR{{WRID: 3}}, false)
	assertOnlyKind(t, err, wq.ErrInvalid)
	ids, _ := r.take(t)
	assert.Equal(t, []uint64{2}, ids)
	assert.True(t, r.q.Complete(m, 2), "a detached QP's completion still counts")
	assert.Equal(t, uint64(1), r.q.Query().Consumed)

	free := newRig(t, 8, 8, false)
	_, err = free.q.Post([]wq.RecvWR{{WRID: 1}}, false)
	assert.NoError(t, err, "no member needed")
}

// At the depth, the receive past it is refused with ErrQueueFull; those
// before it in the chain, and the deferred ones, go out with one doorbell.
func TestPostPastTheDepthIsQueueFull(t *testing.T) {
	r := newRig(t, 8, 4, false)
	post(t, r, 1)
	_, err := r.q.Post([]wq.RecvWR{{WRID: 2}}, true) // deferred
	require.NoError(t, err)
	before := r.q.Doorbell()
	n, err := r.q.Post([]wq.RecvWR{{WRID: 3}, {WRID: 4}, {WRID: 5}}, false)
	assert.Equal(t, 2, n)
	var pe *wq.PostError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, 2, pe.Index)
	assert.Equal(t, uint64(5), pe.WRID)
	assertOnlyKind(t, err, wq.ErrQueueFull)
	assert.Equal(t, before.Doorbells+1, r.q.Doorbell().Doorbells)
	assert.Equal(t, 4, r.q.Available())
	ids, _ := r.take(t)
	assert.Equal(t, []uint64{1, 2, 3, 4}, ids)
	assert.True(t, r.nextSlotUnwritten(), "the refused receive wrote no WQE")
	// Still full until a completion: the device taking them is not enough.
	_, err = r.q.Post([]wq.RecvWR{{WRID: 6}}, false)
	assert.ErrorIs(t, err, wq.ErrQueueFull)
	m, _ := r.q.Attach(1)
	require.True(t, r.q.Complete(m, 3))
	post(t, r, 6)
}

// After Close every post is refused with ErrClosed (an invalid handle) and
// writes nothing; so are Attach, SetLowWatermark and Resize.
func TestClosedRefusesWithErrClosed(t *testing.T) {
	r := newRig(t, 8, 8, false)
	post(t, r, 1)
	r.take(t)
	r.q.Close()
	before := r.q.Doorbell()
	n, err := r.q.Post([]wq.RecvWR{{WRID: 6, SGEs: []wq.SGE{r.sge(0, 8)}}}, false)
	assert.Zero(t, n)
	assertOnlyKind(t, err, wq.ErrClosed)
	assert.Equal(t, before.Doorbells, r.q.Doorbell().Doorbells)
	assert.True(t, r.nextSlotUnwritten())
	assert.Equal(t, 1, r.q.Available())
	_, err = r.q.Attach(1)
	assert.ErrorIs(t, err, wq.ErrClosed)
	assert.ErrorIs(t, r.q.SetLowWatermark(1), wq.ErrClosed)
	assert.ErrorIs(t, r.q.Resize(4), wq.ErrClosed)
}

// A receive with no SGEs is posted with num_sge 0 (a zero-size message).
func TestZeroSegmentReceive(t *testing.T) {
	r := newRig(t, 8, 8, false)
	_, err := r.q.Post([]wq.RecvWR{{WRID: 1}, {WRID: 2, SGEs: []wq.SGE{}}, {WRID: 3, SGEs: []wq.SGE{r.sge(0, 8), r.sge(8, 8)}}}, false)
	require.NoError(t, err)
	ids, nsge := r.take(t)
	assert.Equal(t, []uint64{1, 2, 3}, ids)
	assert.Equal(t, []int{0, 0, 2}, nsge)
	m, _ := r.q.Attach(1)
	assert.True(t, r.q.Complete(m, 2))
}

// Completions of different QPs come in any order; the accounting counts
// each receive once, per QP, and the rest flush once each.
func TestOutOfOrderCompletionsCountExactly(t *testing.T) {
	r := newRig(t, 16, 16, false)
	a, _ := r.q.Attach(1)
	b, _ := r.q.Attach(2)
	post(t, r, 10, 11, 12, 13, 14, 15)
	r.take(t)
	for _, c := range []struct {
		m  *srq.Member
		id uint64
	}{{b, 14}, {a, 10}, {b, 12}, {a, 15}, {b, 11}} {
		require.True(t, r.q.Complete(c.m, c.id), "wr_id %d", c.id)
	}
	assert.False(t, r.q.Complete(a, 14), "a second completion of 14")
	s := r.q.Query()
	assert.Equal(t, 1, s.Available)
	assert.Equal(t, uint64(5), s.Consumed)
	require.Len(t, s.QPs, 2)
	assert.Equal(t, srq.QPView{QPN: 1, Consumed: 2, Allocated: srq.Unknown, Span: srq.Unknown}, s.QPs[0])
	assert.Equal(t, srq.QPView{QPN: 2, Consumed: 3, Allocated: srq.Unknown, Span: srq.Unknown}, s.QPs[1])
	assert.Equal(t, s.QPs[1], b.Query())
	assert.False(t, r.q.PerQPAllocationKnown())
	// Reposting into the freed slots, across the ring's wrap.
	post(t, r, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34)
	ids, _ := r.take(t)
	for i := len(ids) - 1; i >= 0; i-- {
		require.True(t, r.q.Complete(a, ids[i]))
	}
	require.True(t, r.q.Complete(b, 13))
	assert.Zero(t, r.q.Available())
	assert.Equal(t, uint64(21), r.q.Query().Consumed)
}

// Complete of a wr_id not outstanding returns false and changes nothing:
// no count, no watermark event.
func TestCompleteOfUnknownWRIDChangesNothing(t *testing.T) {
	r := newRig(t, 8, 8, false)
	m, _ := r.q.Attach(1)
	post(t, r, 1, 2, 3)
	r.take(t)
	require.NoError(t, r.q.SetLowWatermark(3)) // any completion crosses it
	assert.False(t, r.q.Complete(m, 99), "never posted")
	assert.Empty(t, r.events, "no event from a completion of nothing")
	require.True(t, r.q.Complete(m, 1))
	require.Len(t, r.events, 1)
	require.NoError(t, r.q.SetLowWatermark(2)) // the next completion crosses it
	before := r.q.Query()
	assert.False(t, r.q.Complete(m, 1), "already completed")
	assert.False(t, r.q.Complete(m, 99), "never posted")
	assert.Equal(t, before, r.q.Query())
	assert.Equal(t, before.QPs[0], m.Query())
	assert.Len(t, r.events, 1, "no event from a completion of nothing")
}

// The completion that leaves fewer receives available than the armed
// watermark raises one event, to the callback and to the channel, and
// disarms it; more completions raise nothing until it is armed again.
func TestLowWatermarkFiresOncePerArming(t *testing.T) {
	r := newRig(t, 16, 16, false)
	m, _ := r.q.Attach(1)
	post(t, r, 0, 1, 2, 3, 4, 5, 6, 7)
	r.take(t)
	require.NoError(t, r.q.SetLowWatermark(5))
	assert.Equal(t, 5, r.q.Query().LowWatermark)
	for id := uint64(0); id < 3; id++ { // 7, 6, 5 left
		require.True(t, r.q.Complete(m, id))
	}
	assert.Empty(t, r.events, "5 available, watermark 5: not below")
	assert.Empty(t, r.drainEvents())
	require.True(t, r.q.Complete(m, 3)) // 4 < 5
	want := srq.Event{Available: 4, Watermark: 5}
	assert.Equal(t, []srq.Event{want}, r.events, "the callback")
	assert.Equal(t, []srq.Event{want}, r.drainEvents(), "the channel")
	s := r.q.Query()
	assert.Zero(t, s.LowWatermark, "disarmed")
	assert.Equal(t, uint64(1), s.Events)
	require.True(t, r.q.Complete(m, 4))
	require.True(t, r.q.Complete(m, 5))
	assert.Len(t, r.events, 1, "not armed again")
	assert.Empty(t, r.drainEvents())

	post(t, r, 8, 9) // 4 available
	r.take(t)
	require.NoError(t, r.q.SetLowWatermark(4)) // armed again
	require.True(t, r.q.Complete(m, 8))        // 3 < 4
	want = srq.Event{Available: 3, Watermark: 4}
	assert.Equal(t, want, r.events[len(r.events)-1], "re-armed: fires again")
	assert.Equal(t, []srq.Event{want}, r.drainEvents())
	assert.Equal(t, uint64(2), r.q.Query().Events)

	require.NoError(t, r.q.SetLowWatermark(3))
	require.NoError(t, r.q.SetLowWatermark(0)) // disarmed
	require.True(t, r.q.Complete(m, 9))
	assert.Len(t, r.events, 2, "disarmed with 0")
	assert.ErrorIs(t, r.q.SetLowWatermark(17), wq.ErrInvalid, "above the depth")
	assert.ErrorIs(t, r.q.SetLowWatermark(-1), wq.ErrInvalid)
}

// Armed while fewer receives than the watermark are available, the event
// is raised at once, by SetLowWatermark itself (dat_srq_set_lw: "This can
// occur during the current call"; "If the new low watermark value is below
// the current number of free Receive DTOs posted to the SRQ, an asynchronous
// event will be generated immediately"), and only once for that arming.
func TestLowWatermarkArmedBelowFiresAtOnce(t *testing.T) {
	r := newRig(t, 16, 16, false)
	m, _ := r.q.Attach(1)
	post(t, r, 0, 1, 2)
	r.take(t)
	require.NoError(t, r.q.SetLowWatermark(6)) // 3 available
	want := srq.Event{Available: 3, Watermark: 6}
	assert.Equal(t, []srq.Event{want}, r.events, "the callback, during SetLowWatermark")
	assert.Equal(t, []srq.Event{want}, r.drainEvents(), "the channel, during SetLowWatermark")
	assert.Zero(t, r.q.Query().LowWatermark, "disarmed by its event")
	require.True(t, r.q.Complete(m, 0))
	assert.Len(t, r.events, 1, "one event per arming")
}

// A watermark given at creation is armed on the empty Queue without
// firing: the first completion that leaves fewer available raises it, once.
// One outside 0 to the depth is refused.
func TestCreationWatermarkWaitsForTheFirstCrossing(t *testing.T) {
	r := newRig(t, 16, 8, false, func(c *srq.Config) { c.LowWatermark = 4 })
	assert.Empty(t, r.events, "nothing at creation, though 0 < 4 are available")
	assert.Empty(t, r.drainEvents())
	assert.Equal(t, 4, r.q.Query().LowWatermark, "armed")
	m, _ := r.q.Attach(1)
	post(t, r, 1, 2, 3, 4, 5, 6)
	r.take(t)
	require.True(t, r.q.Complete(m, 1))
	require.True(t, r.q.Complete(m, 2)) // 4 available: not below
	assert.Empty(t, r.events)
	require.True(t, r.q.Complete(m, 3)) // 3 < 4
	assert.Equal(t, []srq.Event{{Available: 3, Watermark: 4}}, r.events)
	require.True(t, r.q.Complete(m, 4))
	assert.Len(t, r.events, 1, "once")

	for _, lw := range []int{-1, 9} {
		reg, err := mmio.New(make([]byte, doorbell.PageSize))
		require.NoError(t, err)
		_, err = srq.New(srq.Config{Name: "SRQ 1", State: make([]byte, 8), Data: make([]byte, 8*32), Stride: 32, Slots: 8,
			Register: reg, Offset: doorbell.OffsetSRQ, Value: doorbell.SRQRecv | 1, Depth: 8, MaxSGE: 1, PD: 1, Keys: &wq.Keys{},
			LowWatermark: lw})
		assert.ErrorIs(t, err, wq.ErrInvalid, "creation watermark %d with depth 8", lw)
	}
}

// The callback runs on the completing goroutine without the Queue's lock:
// it may re-arm the watermark and query the Queue without deadlock.
func TestLowWatermarkCallbackMayRearm(t *testing.T) {
	var q *srq.Queue
	var seen []srq.Event
	r := newRig(t, 8, 8, false, func(c *srq.Config) {
		c.OnLowWatermark = func(ev srq.Event) {
			seen = append(seen, ev)
			_ = q.Query()
			if err := q.SetLowWatermark(ev.Available); err != nil { // not below: fires with the next completion
				t.Error(err)
			}
		}
	})
	q = r.q
	m, _ := q.Attach(1)
	post(t, r, 1, 2, 3)
	r.take(t)
	require.NoError(t, q.SetLowWatermark(3))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for id := uint64(1); id <= 3; id++ {
			q.Complete(m, id)
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Complete did not return: the callback deadlocked on the Queue")
	}
	assert.Equal(t, []srq.Event{{Available: 2, Watermark: 3}, {Available: 1, Watermark: 2}, {Available: 0, Watermark: 1}}, seen)
	assert.Zero(t, q.Query().LowWatermark, "re-armed at 0 by the last event: disarmed")
}

// The depth moves within the ring reserved at creation: posts past it are
// ErrQueueFull; shrinking below what is outstanding is refused with ErrBusy
// and changes nothing; to exactly what is outstanding is allowed.
func TestResizeWithinTheReservedRing(t *testing.T) {
	r := newRig(t, 16, 4, false)
	m, _ := r.q.Attach(1)
	post(t, r, 0, 1, 2, 3)
	_, err := r.q.Post([]wq.RecvWR{{WRID: 4}}, false)
	assert.ErrorIs(t, err, wq.ErrQueueFull, "past 4")
	require.NoError(t, r.q.Resize(12), "up")
	post(t, r, 4, 5, 6, 7, 8, 9, 10, 11)
	_, err = r.q.Post([]wq.RecvWR{{WRID: 12}}, false)
	assert.ErrorIs(t, err, wq.ErrQueueFull, "past 12")
	err = r.q.Resize(8)
	assertOnlyKind(t, err, wq.ErrBusy)
	assert.Equal(t, 12, r.q.Depth(), "a refused resize changes nothing")
	assert.ErrorIs(t, r.q.Resize(17), wq.ErrInvalid, "past the ring")
	assert.ErrorIs(t, r.q.Resize(0), wq.ErrInvalid)
	assert.Equal(t, 12, r.q.Depth())
	r.take(t)
	for id := uint64(0); id < 6; id++ {
		require.True(t, r.q.Complete(m, id))
	}
	require.NoError(t, r.q.Resize(6), "down to the 6 outstanding")
	_, err = r.q.Post([]wq.RecvWR{{WRID: 12}}, false)
	assert.ErrorIs(t, err, wq.ErrQueueFull, "past 6")
	require.True(t, r.q.Complete(m, 6))
	post(t, r, 12)
	require.NoError(t, r.q.Resize(16), "up to the whole ring")
	post(t, r, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22)
	assert.Equal(t, 16, r.q.Available())
	_, err = r.q.Post([]wq.RecvWR{{WRID: 23}}, false)
	assert.ErrorIs(t, err, wq.ErrQueueFull, "past the ring")
	s := r.q.Query()
	assert.Equal(t, 16, s.Depth)
	assert.Equal(t, 16, s.Slots)
	assert.Equal(t, 16, r.q.Slots())
}

// Detaching QPs in any order, with others attaching meanwhile, leaves the
// rest in the view in attach order, and Members counts them.
func TestDetachLeavesTheOthersInAttachOrder(t *testing.T) {
	r := newRig(t, 16, 10, false)
	type att struct {
		qpn uint32
		m   *srq.Member
	}
	var live []att
	rng := rand.New(rand.NewPCG(7, 8))
	next := uint32(1)
	for step := 0; step < 3000; step++ {
		if len(live) == 0 || rng.IntN(5) < 3 {
			m, err := r.q.Attach(next)
			require.NoError(t, err)
			live = append(live, att{next, m})
			next++
		} else {
			i := rng.IntN(len(live))
			live[i].m.Detach()
			live = append(live[:i], live[i+1:]...)
		}
		require.Equal(t, len(live), r.q.Members(), "step %d", step)
		if step%50 == 0 || len(live) < 3 {
			qps := r.q.Query().QPs
			require.Len(t, qps, len(live), "step %d", step)
			for i, a := range live {
				require.Equal(t, a.qpn, qps[i].QPN, "step %d, member %d", step, i)
			}
		}
	}
	for _, a := range live {
		a.m.Detach()
	}
	assert.Zero(t, r.q.Members())
	assert.Empty(t, r.q.Query().QPs)
}

// Query is one snapshot of every count.
func TestQuerySnapshotFields(t *testing.T) {
	r := newRig(t, 16, 10, false)
	assert.Equal(t, srq.Snapshot{Depth: 10, Slots: 16, MaxSGE: maxSGE, QPs: []srq.QPView{}}, r.q.Query(), "new")
	a, _ := r.q.Attach(0x11)
	b, _ := r.q.Attach(0x22)
	post(t, r, 1, 2, 3, 4, 5, 6)
	r.take(t)
	require.True(t, r.q.Complete(a, 2))
	require.True(t, r.q.Complete(b, 1))
	require.True(t, r.q.Complete(b, 5))
	require.NoError(t, r.q.SetLowWatermark(3)) // 3 available: not below
	require.True(t, r.q.Complete(a, 6))        // 2 < 3: an event
	require.NoError(t, r.q.SetLowWatermark(1))
	assert.Equal(t, srq.Snapshot{
		Depth: 10, Slots: 16, MaxSGE: maxSGE, LowWatermark: 1, Available: 2, Consumed: 4, Events: 1,
		QPs: []srq.QPView{
			{QPN: 0x11, Consumed: 2, Allocated: srq.Unknown, Span: srq.Unknown},
			{QPN: 0x22, Consumed: 2, Allocated: srq.Unknown, Span: srq.Unknown},
		},
	}, r.q.Query())
	a.Detach()
	s := r.q.Query()
	assert.Equal(t, []srq.QPView{{QPN: 0x22, Consumed: 2, Allocated: srq.Unknown, Span: srq.Unknown}}, s.QPs, "a detached QP leaves the view")
	assert.Equal(t, uint64(4), s.Consumed, "its consumption stays counted")
	assert.Equal(t, 2, r.q.Close())
	r.q.PopFlush()
	s = r.q.Query()
	assert.Equal(t, uint64(1), s.Flushed)
	assert.Equal(t, 1, s.Available)
	assert.Zero(t, s.LowWatermark, "Close disarms")
}

// After Close, PopFlush returns each receive still outstanding exactly once
// (deferred ones included), then nothing; a late completion of a flushed
// receive finds nothing, one polled before its flush still counts.
func TestCloseThenPopFlushReturnsEachOutstandingOnce(t *testing.T) {
	r := newRig(t, 16, 16, false)
	m, _ := r.q.Attach(1)
	post(t, r, 1, 2, 3, 4, 5, 6, 7)
	_, err := r.q.Post([]wq.RecvWR{{WRID: 8}, {WRID: 9}}, true) // deferred, never rung
	require.NoError(t, err)
	r.take(t)
	for _, id := range []uint64{6, 2, 4} {
		require.True(t, r.q.Complete(m, id))
	}
	assert.Equal(t, 6, r.q.Close(), "outstanding at close")
	require.True(t, r.q.Complete(m, 7), "the device's completion, polled after Close")
	var flushed []uint64
	for id, ok := r.q.PopFlush(); ok; id, ok = r.q.PopFlush() {
		flushed = append(flushed, id)
		require.LessOrEqual(t, len(flushed), 5, "PopFlush does not stop")
	}
	assert.ElementsMatch(t, []uint64{1, 3, 5, 8, 9}, flushed)
	_, ok := r.q.PopFlush()
	assert.False(t, ok)
	assert.False(t, r.q.Complete(m, 3), "a late completion of a flushed receive")
	s := r.q.Query()
	assert.Equal(t, uint64(5), s.Flushed)
	assert.Equal(t, uint64(4), s.Consumed)
	assert.Zero(t, s.Available)
	assert.Zero(t, r.q.Close(), "Close is idempotent")
}

// New refuses a config it cannot work with.
func TestNewChecksTheConfig(t *testing.T) {
	reg, err := mmio.New(make([]byte, doorbell.PageSize))
	require.NoError(t, err)
	base := srq.Config{Name: "SRQ 1", State: make([]byte, 8), Data: make([]byte, 8*32), Stride: 32, Slots: 8,
		Register: reg, Offset: doorbell.OffsetSRQ, Value: doorbell.SRQRecv | 1, Depth: 8, MaxSGE: 1, PD: 1, Keys: &wq.Keys{}}
	_, err = srq.New(base)
	require.NoError(t, err)
	for name, mod := range map[string]func(*srq.Config){
		"no keys":         func(c *srq.Config) { c.Keys = nil },
		"depth 0":         func(c *srq.Config) { c.Depth = 0 },
		"depth past ring": func(c *srq.Config) { c.Depth = 9 },
		"short data":      func(c *srq.Config) { c.Data = c.Data[:7*32] },
	} {
		c := base
		c.State = make([]byte, 8)
		mod(&c)
		_, err := srq.New(c)
		assert.ErrorIs(t, err, wq.ErrInvalid, name)
	}
}

// Posting a chain and completing it, out of order, allocate nothing.
func TestPostAndCompleteAllocateNothing(t *testing.T) {
	events := 0
	r := newRig(t, 64, 64, false, func(c *srq.Config) { c.OnLowWatermark = func(srq.Event) { events++ } })
	m, _ := r.q.Attach(1)
	wrs := make([]wq.RecvWR, 32)
	for i := range wrs {
		wrs[i] = wq.RecvWR{WRID: uint64(i), SGEs: []wq.SGE{r.sge(i*1024, 1024)}}
	}
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := r.q.Post(wrs, false); err != nil {
			t.Fatal(err)
		}
		if err := r.q.SetLowWatermark(1); err != nil { // the last completion raises it
			t.Fatal(err)
		}
		ready, _ := r.cons.Ready() // the device takes them
		r.cons.Consume(ready)
		for i := range wrs {
			if !r.q.Complete(m, wrs[len(wrs)-1-i].WRID) { // out of order
				t.Fatal("not outstanding")
			}
		}
	})
	assert.Zero(t, allocs, "allocations per Post of 32 and their 32 Completes")
	assert.Equal(t, 101, events, "the watermark path ran in every round")
}

// The accounting under concurrent posters (chains, some deferred), one
// device and a poller that completes out of order to random QPs, with
// queries and watermark arming all along: every receive completes exactly
// once, and every snapshot is consistent.
func TestConcurrentPostsAndOutOfOrderCompletions(t *testing.T) {
	const (
		slots, posters, each = 256, 4, 5000
		qps                  = 3
		total                = posters * each
	)
	var lwCalls atomic.Uint64
	r := newRig(t, slots, slots, false, func(c *srq.Config) {
		c.OnLowWatermark = func(srq.Event) { lwCalls.Add(1) }
	})
	members := make([]*srq.Member, qps)
	for i := range members {
		members[i], _ = r.q.Attach(uint32(100 + i))
	}
	deadline := time.Now().Add(20 * time.Second)
	var failed atomic.Bool
	fail := func(format string, args ...any) {
		if failed.CompareAndSwap(false, true) {
			t.Errorf(format, args...)
		}
	}

	// Posters: each its own wr_id range, chains of 1 to 8, a third of
	// them deferred; a full queue is retried from the refused receive.
	var posting sync.WaitGroup
	for p := 0; p < posters; p++ {
		posting.Add(1)
		go func(p int) {
			defer posting.Done()
			rnd := rand.New(rand.NewPCG(uint64(p), 7))
			wrs := make([]wq.RecvWR, 8)
			sg := []wq.SGE{r.sge(p*1024, 1024)}
			for next := 0; next < each; {
				if failed.Load() || time.Now().After(deadline) {
					fail("poster %d: stuck at %d of %d", p, next, each)
					return
				}
				k := min(1+rnd.IntN(8), each-next)
				for i := range wrs[:k] {
					wrs[i] = wq.RecvWR{WRID: uint64(p*each + next + i), SGEs: sg}
				}
				n, err := r.q.Post(wrs[:k], rnd.IntN(3) == 0)
				next += n
				if errors.Is(err, wq.ErrQueueFull) {
					time.Sleep(time.Microsecond)
					continue
				}
				if err != nil {
					fail("poster %d: %v", p, err)
					return
				}
			}
			if err := r.q.Ring(); err != nil {
				fail("poster %d: ring: %v", p, err)
			}
		}(p)
	}

	// The device: the only reader of the ring, it sees what was published
	// and hands the wr_ids to the poller.
	taken := make(chan []uint64, 64)
	go func() {
		defer close(taken)
		sges := make([]rings.SGE, maxSGE)
		for got := 0; got < total; {
			if failed.Load() || time.Now().After(deadline) {
				fail("device: stuck at %d of %d", got, total)
				return
			}
			ready, err := r.cons.Ready()
			if err != nil {
				fail("device: %v", err)
				return
			}
			if ready == 0 {
				time.Sleep(10 * time.Microsecond)
				continue
			}
			ids := make([]uint64, ready)
			for i := range ids {
				s := r.cons.Slot(i)
				var n int
				ids[i], n, err = rings.DecodeRecvWQE(r.data[s*r.stride:(s+1)*r.stride], sges)
				if err != nil || n != 1 {
					fail("device: slot %d: %d SGEs, %v", s, n, err)
					return
				}
			}
			r.cons.Consume(ready)
			got += ready
			taken <- ids
		}
	}()

	// The poller: it keeps a pool of what the device took and completes
	// random ones to random QPs, across batches; when nothing new comes,
	// it completes the whole pool.
	seen := make(map[uint64]int, total)
	pollerDone := make(chan struct{})
	go func() {
		defer close(pollerDone)
		rnd := rand.New(rand.NewPCG(1, 2))
		var pool []uint64
		complete := func(n int) {
			for ; n > 0; n-- {
				i := rnd.IntN(len(pool))
				id := pool[i]
				pool[i] = pool[len(pool)-1]
				pool = pool[:len(pool)-1]
				if !r.q.Complete(members[rnd.IntN(qps)], id) {
					fail("wr_id %d: not outstanding", id)
				}
				seen[id]++
			}
		}
		for {
			select {
			case ids, ok := <-taken:
				if !ok {
					complete(len(pool))
					return
				}
				pool = append(pool, ids...)
				complete(len(pool) / 2)
			default:
				complete(len(pool))
				ids, ok := <-taken
				if !ok {
					return
				}
				pool = append(pool, ids...)
			}
		}
	}()

	// Queries all along, and watermark arming.
	var done atomic.Bool
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
					fail("QP %d: allocated %d, span %d; want Unknown", v.QPN, v.Allocated, v.Span)
				}
			}
			if s.Available < 0 || s.Available > s.Depth || sum > s.Consumed || s.Consumed > total {
				fail("inconsistent snapshot %+v (QPs consumed %d)", s, sum)
			}
			if n%16 == 0 {
				if err := r.q.SetLowWatermark(slots / 4); err != nil {
					fail("arm: %v", err)
				}
			}
			n++
		}
	}()
	posting.Wait()
	<-pollerDone
	done.Store(true)
	assert.Positive(t, <-queries, "queries taken during the run")
	require.False(t, failed.Load())

	assert.Len(t, seen, total, "every receive completed")
	for id, n := range seen {
		if n != 1 || id >= total {
			t.Fatalf("wr_id %d completed %d times", id, n)
		}
	}
	s := r.q.Query()
	assert.Equal(t, uint64(total), s.Consumed, "consumed == posted")
	var sum uint64
	for _, v := range s.QPs {
		sum += v.Consumed
	}
	assert.Equal(t, s.Consumed, sum, "the QPs' counts add up")
	assert.Zero(t, s.Available)
	assert.Equal(t, s.Events, lwCalls.Load(), "every event reached the callback")
	st := r.q.Doorbell()
	assert.Equal(t, uint64(total), st.WQEs, "every WQE handed to the device")
	assert.LessOrEqual(t, st.Doorbells, st.WQEs)
}

// New refuses a stride too small for MaxSGE SGEs: a receive with them
// would be written past its slot, over the next WQE (or, in the last
// slot, panic inside Post).
func TestNewRefusesAStrideTooSmallForMaxSGE(t *testing.T) {
	reg, err := mmio.New(make([]byte, doorbell.PageSize))
	require.NoError(t, err)
	keys := &wq.Keys{}
	keys.Set(1, &wq.Region{PD: 1, Addr: 0x10000, Len: 1 << 16, Access: wq.AccessLocalWrite})
	data := make([]byte, 4*32)
	q, err := srq.New(srq.Config{Name: "SRQ 1", State: make([]byte, 8), Data: data, Stride: 32, Slots: 4,
		Register: reg, Offset: doorbell.OffsetSRQ, Value: doorbell.SRQRecv | 1, Depth: 4, MaxSGE: maxSGE, PD: 1, Keys: keys})
	if !assert.ErrorIs(t, err, wq.ErrInvalid, "32-byte slots for receives of %d SGEs (%d bytes)", maxSGE, rings.RecvStride(maxSGE)) {
		// What it leads to: the second slot overwritten by the first post.
		s := wq.SGE{Addr: 0x10000, Length: 8, LKey: 1}
		_, err = q.Post([]wq.RecvWR{{WRID: 1, SGEs: []wq.SGE{s, s, s, s}}}, false)
		require.NoError(t, err)
		assert.Equal(t, make([]byte, 32), data[32:64], "the next slot, untouched")
	}
}

// Several goroutines, one per connection of a service, refill one shared
// receive queue: Post is safe for concurrent use, and a full queue is an
// inline ErrQueueFull that loses nothing. The low watermark tells them
// when to refill.
func Example_concurrentRefill() {
	const conns, depth = 4, 64
	keys := &wq.Keys{}
	keys.Set(1, &wq.Region{PD: 7, Addr: 0x10000, Len: 1 << 20, Access: wq.AccessLocalWrite})
	uar, _ := mmio.New(make([]byte, doorbell.PageSize)) // the device's doorbell page, here plain memory
	stride := rings.RecvStride(1)
	state := make([]byte, 8) // the ring's producer and consumer indices
	data := make([]byte, depth*stride)
	q, err := srq.New(srq.Config{
		Name: "SRQ 0", State: state, Data: data, Stride: stride, Slots: depth,
		Register: uar, Offset: doorbell.OffsetSRQ, Value: doorbell.SRQRecv,
		Depth: depth, MaxSGE: 1, PD: 7, Keys: keys,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	qp, _ := q.Attach(0x42) // the QP that takes the receives
	st, _ := rings.NewState(state)
	device, _ := rings.NewConsumer(st, depth) // the NIC's side of the ring

	// refill has each connection's goroutine post n receives, one at a
	// time, and counts those refused because the SRQ was full.
	next := make([]int, conns) // each connection's next wr_id
	refill := func(n int) (refused int) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for c := 0; c < conns; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < n; i++ {
					id := uint64(c<<16 | next[c])
					sge := wq.SGE{Addr: 0x10000 + uint64(c)*0x10000 + uint64(next[c]%64)*1024, Length: 1024, LKey: 1}
					_, err := q.Post([]wq.RecvWR{{WRID: id, SGEs: []wq.SGE{sge}}}, false)
					switch {
					case errors.Is(err, wq.ErrQueueFull):
						mu.Lock()
						refused++
						mu.Unlock()
					case err != nil:
						fmt.Println(err)
					default:
						next[c]++
					}
				}
			}()
		}
		wg.Wait()
		return refused
	}

	refill(16)
	fmt.Printf("%d goroutines posted %d receives\n", conns, q.Available())

	// The QP consumes 40 receives: the NIC takes them from the ring, and
	// the CQ poller reports their completions. The watermark, armed at 32,
	// fires once on the way down.
	if err := q.SetLowWatermark(32); err != nil {
		fmt.Println(err)
		return
	}
	sges := make([]rings.SGE, 1)
	if ready, _ := device.Ready(); ready >= 40 {
		for i := 0; i < 40; i++ {
			id, _, _ := rings.DecodeRecvWQE(data[device.Slot(i)*stride:], sges)
			q.Complete(qp, id)
		}
		device.Consume(40)
	}
	select {
	case ev := <-q.LowWatermarkEvents():
		fmt.Printf("low watermark %d: %d available\n", ev.Watermark, ev.Available)
	default:
		fmt.Println("no low-watermark event")
	}

	refused := refill(12) // 48 wanted, 40 fit
	s := q.Query()
	fmt.Printf("refilled to %d (%d refused as full); consumed %d; %d event\n", s.Available, refused, s.Consumed, s.Events)
	// Output:
	// 4 goroutines posted 64 receives
	// low watermark 32: 31 available
	// refilled to 64 (8 refused as full); consumed 40; 1 event
}

// The device's SRQ_LIMIT_REACHED is the low-watermark event, never a
// second one: it fires only while the watermark is armed, and disarms it,
// so a second device event (or the driver's own count) finds nothing to
// raise.
func TestDeviceLimitEventIsTheWatermarkEventOnce(t *testing.T) {
	r := newRig(t, 8, 8, false)
	q := r.q
	post(t, r, 1, 2, 3, 4, 5, 6)
	require.NoError(t, q.SetLowWatermark(4))
	require.Empty(t, r.events, "6 available: not below 4")
	assert.True(t, q.RaiseLowWatermark(), "armed: the device's event is the watermark event")
	assert.False(t, q.RaiseLowWatermark(), "disarmed: a second device event raises nothing")
	require.Len(t, r.events, 1)
	assert.Equal(t, 4, r.events[0].Watermark)
	require.NoError(t, q.SetLowWatermark(2))
	assert.True(t, q.RaiseLowWatermark())
	assert.Len(t, r.events, 2)
	assert.Len(t, r.drainEvents(), 1, "the channel holds the latest")
}
