package wq_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/mmio"
	"github.com/vfrdma/vfrdma/rings"
	"github.com/vfrdma/vfrdma/wq"
)

// newSendQueue is a selective send queue over ordinary memory (a device
// that honours signaling), bound by its ring, with the device's view of
// the ring.
func newSendQueue(t testing.TB, depth int) (*wq.Queue, *rings.Consumer) {
	t.Helper()
	w, c, _ := newSendQueueState(t, depth)
	return w, c
}

// newSendQueueState is newSendQueue with the ring's state, for a device
// that writes its consumer index at will.
func newSendQueueState(t testing.TB, depth int) (*wq.Queue, *rings.Consumer, *rings.State) {
	t.Helper()
	reg, err := mmio.New(make([]byte, doorbell.PageSize))
	require.NoError(t, err)
	state := make([]byte, 8)
	var w wq.Queue
	stride := rings.SendStride(1)
	require.NoError(t, w.Init("QP 1", reg, state, make([]byte, depth*stride), stride, depth, 1, doorbell.OffsetQP, doorbell.QPSend|1))
	w.SetSelective()
	w.SetBoundByRing()
	st, err := rings.NewState(state)
	require.NoError(t, err)
	c, err := rings.NewConsumer(st, depth)
	require.NoError(t, err)
	return &w, c, st
}

// sendReq is a request to post: its wr_id and whether it is signaled.
type sendReq struct {
	id  uint64
	sig bool
}

func u(id uint64) sendReq { return sendReq{id, false} }
func s(id uint64) sendReq { return sendReq{id, true} }

// postSends posts rs as one call; the device consumes them if consume.
func postSends(t testing.TB, w *wq.Queue, c *rings.Consumer, consume bool, rs ...sendReq) {
	t.Helper()
	room, err := w.PostRoom()
	require.NoError(t, err)
	require.GreaterOrEqual(t, room, len(rs), "room for the call")
	for _, r := range rs {
		rings.PutSendWQE(w.ClaimSend(r.id, r.sig), &rings.SendWQE{WRID: r.id, Opcode: rings.WRSend})
	}
	require.NoError(t, w.End(false))
	if consume {
		n, err := c.Ready()
		require.NoError(t, err)
		c.Consume(n)
	}
}

func outstanding(w *wq.Queue) int {
	w.PublishHead()
	return w.Outstanding()
}

// A signaled completion retires every unsignaled request posted before it
// on its send queue (they completed first: SQ completions are in order),
// whatever their wr_ids, and nothing after it.
func TestSignaledCompletionRetiresEarlierUnsignaled(t *testing.T) {
	w, c := newSendQueue(t, 8)
	postSends(t, w, c, true, u(0), u(0), s(0), u(0))
	require.True(t, w.Complete(0), "the signaled send's completion")
	assert.Equal(t, 1, outstanding(w), "the unsignaled send after it")
	assert.False(t, w.Complete(7), "a wr_id never posted")
	// An error completion of it is taken: devices report failures of
	// unsignaled requests.
	assert.True(t, w.CompleteErr(0))
	assert.Zero(t, outstanding(w))
	// So is a success completion of an unsignaled request, when no
	// signaled one has its wr_id: a device that signals regardless.
	postSends(t, w, c, true, u(4), u(5))
	assert.True(t, w.Complete(5))
	assert.Zero(t, outstanding(w), "5 and the unsignaled send before it")
}

// Signaled requests before the one completed stay outstanding (in order):
// completions out of order do not retire what is still to complete.
func TestSelectiveCompletionKeepsEarlierSignaledOutstanding(t *testing.T) {
	w, c := newSendQueue(t, 8)
	postSends(t, w, c, true, s(1), u(2), s(3), u(4), s(5))
	require.True(t, w.Complete(5))
	assert.Equal(t, 2, outstanding(w), "1 and 3 still outstanding")
	assert.Equal(t, []uint64{1, 3}, drainFlush(w), "what is left flushes in posting order")
}

// An error completion of an unsignaled request retires it and the
// unsignaled ones before it; the flush of the rest reports every request
// still outstanding exactly once, signaled or not.
func TestErrorCompletionOfUnsignaledAndFlushExactlyOnce(t *testing.T) {
	w, c := newSendQueue(t, 8)
	postSends(t, w, c, true, u(1), u(2), s(3), u(4), u(5))
	require.True(t, w.CompleteErr(2), "the device's error completion of an unsignaled send")
	assert.Equal(t, 3, outstanding(w))
	assert.Equal(t, []uint64{3, 4, 5}, drainFlush(w))
	assert.Empty(t, drainFlush(w), "a second flush finds nothing")
	assert.False(t, w.Complete(3), "a late completion of a flushed request")
}

// Reap frees the slots of every unsignaled request the device has
// consumed, wherever it stands among signaled ones, with no completion at
// all, and never passes the device's consumer index; the signaled ones
// stay outstanding, in posting order, for their completions. The poller
// keeps the queue in its reaps while the device has requests left to
// consume.
func TestReapFreesConsumedUnsignaledSlotsWhereverTheyStand(t *testing.T) {
	w, c := newSendQueue(t, 8)
	postSends(t, w, c, false, u(1), u(2), s(3), u(4), u(5))
	n, keep := w.Reap()
	assert.Zero(t, n, "nothing consumed yet")
	assert.True(t, keep)
	ready, err := c.Ready()
	require.NoError(t, err)
	c.Consume(ready - 1) // all but the last
	n, keep = w.Reap()
	assert.Equal(t, 3, n, "1, 2 and 4: the unsignaled sends consumed, before and after the signaled one")
	assert.True(t, keep, "5 is not consumed")
	assert.Equal(t, 2, outstanding(w), "3, and 5")
	require.True(t, w.Complete(3))
	assert.Equal(t, 1, outstanding(w))
	c.Consume(1)
	n, keep = w.Reap()
	assert.Equal(t, 1, n)
	assert.False(t, keep)
	assert.Zero(t, outstanding(w))

	// Signaled requests among consumed unsignaled ones keep their order.
	postSends(t, w, c, true, s(1), u(2), s(3), u(4), u(5), s(6), u(7))
	n, keep = w.Reap()
	assert.Equal(t, 4, n)
	assert.False(t, keep)
	assert.Equal(t, []uint64{1, 3, 6}, drainFlush(w))
}

// The request for reaps stays the poller's while the device has requests
// to consume: the poster asks nothing new meanwhile. Once the device has
// consumed everything the poller gives it up, and the poster's next
// request is new.
func TestReapIsAskedForAgainUntilTheDeviceConsumedEverything(t *testing.T) {
	w, c := newSendQueue(t, 8)
	postSends(t, w, c, false, u(1), u(2))
	require.True(t, w.WantReap(), "the poster's request")
	_, keep := w.Reap()
	require.True(t, keep, "the poller keeps the queue in its reaps")
	assert.False(t, w.WantReap(), "pending: the poster asks nothing new")
	ready, err := c.Ready()
	require.NoError(t, err)
	c.Consume(ready)
	n, keep := w.Reap()
	assert.Equal(t, 2, n)
	assert.False(t, keep, "all consumed: the request is given up")
	assert.True(t, w.WantReap(), "the next post's request is new")
}

// The poster learns after each post call whether it handed the device an
// unsignaled request (TookUnsignaled), once: a call of signaled requests
// alone asks for no reap. A queue that is not selective never does, and
// its Reap retires nothing and asks for none.
func TestTookUnsignaledReportsEachCallOnce(t *testing.T) {
	w, c := newSendQueue(t, 8)
	postSends(t, w, c, false, s(1), u(2))
	assert.True(t, w.TookUnsignaled())
	assert.False(t, w.TookUnsignaled(), "once")
	postSends(t, w, c, false, s(3))
	assert.False(t, w.TookUnsignaled(), "signaled only")

	plain, pc := newQueue(t, 8)
	plain.ClaimSend(1, false)
	require.NoError(t, plain.End(false))
	assert.False(t, plain.TookUnsignaled(), "not selective")
	ready, err := pc.Ready()
	require.NoError(t, err)
	pc.Consume(ready)
	n, keep := plain.Reap()
	assert.Zero(t, n)
	assert.False(t, keep)
	assert.False(t, plain.WantReap())
}

// Reap reads the consumer index at its limits: a full queue the device
// has consumed nothing of is valid (requests pending), and an index out of
// range, beyond the ring's counters or ahead of the posts, retires
// nothing and asks for no more reaps (the next post reports the fault).
func TestReapAtTheConsumerIndexLimits(t *testing.T) {
	const depth = 8
	w, c, st := newSendQueueState(t, depth)
	wrs := make([]sendReq, depth)
	for i := range wrs {
		wrs[i] = u(uint64(i))
	}
	postSends(t, w, c, false, wrs...)
	n, keep := w.Reap()
	assert.Zero(t, n)
	assert.True(t, keep, "the whole queue posted, none consumed: a valid index")
	good := st.ConsHead()
	for _, bad := range []uint32{good + 2*depth, good + depth + 1} {
		st.SetConsHead(bad)
		n, keep = w.Reap()
		assert.Zero(t, n, "cons_head %d", bad)
		assert.False(t, keep, "cons_head %d: no more reaps", bad)
	}
	st.SetConsHead(good + depth)
	n, keep = w.Reap()
	assert.Equal(t, depth, n, "all consumed, at the exact limit")
	assert.False(t, keep)
}

// BeginFlush, once the device is done with the queue, retires the
// unsignaled requests it consumed, wherever they stand, and only those:
// the flush completes the signaled ones and the unconsumed ones, in order.
// A consumer index out of range retires nothing; the queue reports that
// it is flushing either way.
func TestBeginFlushFlushesOnlyWhatTheDeviceDidNotConsume(t *testing.T) {
	for _, tc := range []struct {
		name    string
		consume int
		cons    func(valid uint32) uint32
		retired int
		flushed []uint64
	}{
		{"two of seven consumed", 2, func(v uint32) uint32 { return v }, 1, []uint64{1, 3, 4, 5, 6, 7}},
		{"five of seven consumed", 5, func(v uint32) uint32 { return v }, 3, []uint64{1, 4, 6, 7}},
		{"all consumed", 7, func(v uint32) uint32 { return v }, 5, []uint64{1, 4}},
		{"none consumed", 0, func(v uint32) uint32 { return v }, 0, []uint64{1, 2, 3, 4, 5, 6, 7}},
		{"index out of range", 7, func(v uint32) uint32 { return v + 1<<20 }, 0, []uint64{1, 2, 3, 4, 5, 6, 7}},
		{"index ahead of the posts", 5, func(v uint32) uint32 { return v + 3 }, 0, []uint64{1, 2, 3, 4, 5, 6, 7}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, c := newSendQueue(t, 8)
			postSends(t, w, c, false, s(1), u(2), u(3), s(4), u(5), u(6), u(7))
			_, err := c.Ready()
			require.NoError(t, err)
			c.Consume(tc.consume)
			assert.False(t, w.Flushing())
			assert.Equal(t, tc.retired, w.BeginFlush(tc.cons(w.ConsHead())))
			assert.True(t, w.Flushing())
			assert.Equal(t, len(tc.flushed), w.OutstandingP(), "published")
			assert.Equal(t, tc.flushed, drainFlush(w))
			assert.Zero(t, w.BeginFlush(w.ConsHead()), "again: nothing more")
		})
	}
}

// Unsignaled sends alone, with no completion ever, never fill the queue
// for good: every lap, the device consumes them and Reap hands their
// slots back; the ring's own room bounds the posts meanwhile.
func TestUnsignaledOnlySendsNeverLeakSlots(t *testing.T) {
	const depth = 8
	w, c := newSendQueue(t, depth)
	for lap := range 100 {
		room, err := w.PostRoom()
		require.NoError(t, err)
		require.Equal(t, depth, room, "lap %d: the whole queue", lap)
		for i := range depth {
			rings.PutSendWQE(w.ClaimSend(uint64(i), false), &rings.SendWQE{})
		}
		require.NoError(t, w.End(false))
		room, err = w.PostRoom()
		require.NoError(t, err)
		require.Zero(t, room, "full")
		assert.True(t, w.WantReap(), "the poster asks for a reap")
		assert.False(t, w.WantReap(), "once")
		n, err := c.Ready()
		require.NoError(t, err)
		c.Consume(n)
		n, _ = w.Reap()
		require.Equal(t, depth, n)
		w.PublishHead()
	}
}

// A queue bound by its ring takes no more than the device has consumed
// room for, whatever the record says: a completion the device wrote before
// advancing its consumer index frees no slot yet.
func TestBoundQueueRoomFollowsTheConsumerIndex(t *testing.T) {
	w, c := newSendQueue(t, 4)
	postSends(t, w, c, false, s(1), s(2), s(3), s(4))
	for id := uint64(1); id <= 4; id++ {
		require.True(t, w.Complete(id))
	}
	w.PublishHead()
	assert.Equal(t, 4, w.Room(), "the record is empty")
	room, err := w.PostRoom()
	require.NoError(t, err)
	assert.Zero(t, room, "the ring is not")
	n, err := c.Ready()
	require.NoError(t, err)
	c.Consume(n)
	room, err = w.PostRoom()
	require.NoError(t, err)
	assert.Equal(t, 4, room)
}

// A random mix of signaled and unsignaled sends, consumed and completed as
// a device that honours signaling would (consumed in order, a CQE for each
// signaled one, in order), with reaps at random moments: every signaled
// request completes exactly once, a reap retires exactly the consumed
// unsignaled requests, what is outstanding always matches, a flush at the
// end reports the rest in posting order, and the queue never fills for
// good over many laps.
func TestSelectiveQueueModel(t *testing.T) {
	const depth = 16
	w, c := newSendQueue(t, depth)
	rnd := rand.New(rand.NewPCG(3, 9))
	type rec struct {
		sendReq
		consumed bool
	}
	var posted []rec // outstanding, in posting order
	next := uint64(0)
	for round := range 3000 {
		room, err := w.PostRoom()
		require.NoError(t, err)
		k := rnd.IntN(room + 1)
		for range k {
			r := sendReq{id: next % 5, sig: rnd.IntN(3) == 0} // wr_ids repeat
			next++
			rings.PutSendWQE(w.ClaimSend(r.id, r.sig), &rings.SendWQE{})
			posted = append(posted, rec{sendReq: r})
		}
		require.NoError(t, w.End(false))
		if n, _ := c.Ready(); n > 0 { // the device consumes some, in order
			n = rnd.IntN(n + 1)
			c.Consume(n)
			for i := 0; n > 0; i++ {
				if !posted[i].consumed {
					posted[i].consumed = true
					n--
				}
			}
		}
		switch rnd.IntN(3) {
		case 0: // the device completes, in order, some consumed signaled requests
			for i := 0; i < len(posted) && posted[i].consumed; i++ {
				if !posted[i].sig {
					continue
				}
				require.True(t, w.Complete(posted[i].id), "round %d", round)
				kept := posted[:0]
				for j, r := range posted {
					if j > i || j < i && r.sig { // the unsignaled before it go with it
						kept = append(kept, r)
					}
				}
				posted, i = kept, -1
				if rnd.IntN(2) == 0 {
					break
				}
			}
		case 1:
			want := 0
			kept := posted[:0]
			for _, r := range posted {
				if r.consumed && !r.sig {
					want++
				} else {
					kept = append(kept, r)
				}
			}
			n, keep := w.Reap()
			require.Equal(t, want, n, "round %d: the consumed unsignaled sends", round)
			posted = kept
			require.Equal(t, len(posted) > 0 && !posted[len(posted)-1].consumed, keep, "round %d", round)
		}
		w.PublishHead()
		require.Equal(t, len(posted), w.Outstanding(), "round %d", round)
	}
	var want []uint64
	for _, r := range posted {
		if r.sig || !r.consumed {
			want = append(want, r.id)
		}
	}
	w.BeginFlush(w.ConsHead())
	assert.Equal(t, want, drainFlush(w))
	assert.Zero(t, outstanding(w))
}

// Posting to and completing on a selective queue allocates nothing.
func TestSelectiveQueueAllocatesNothing(t *testing.T) {
	w, c := newSendQueue(t, 64)
	wqe := rings.SendWQE{}
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := w.PostRoom(); err != nil {
			t.Fatal(err)
		}
		for i := range 32 {
			rings.PutSendWQE(w.ClaimSend(uint64(i), i%8 == 7), &wqe)
		}
		if err := w.End(false); err != nil {
			t.Fatal(err)
		}
		n, _ := c.Ready()
		c.Consume(n)
		for i := 7; i < 32; i += 8 {
			w.Complete(uint64(i))
		}
		w.Reap()
		w.PublishHead()
	})
	assert.Zero(t, allocs)
}

// CheckWrite asks local write of every MR the request names, on a send
// queue's checker too, and a region it resolved for reading only is
// looked at again.
func TestCheckWriteNeedsLocalWrite(t *testing.T) {
	var keys wq.Keys
	ro := &wq.Region{PD: 1, Addr: 0x1000, Len: 4096}
	rw := &wq.Region{PD: 1, Addr: 0x9000, Len: 4096, Access: wq.AccessLocalWrite}
	keys.Set(1, ro)
	keys.Set(2, rw)
	c := wq.NewSGEChecker(&keys, 1, 4, false)
	_, err := c.Check([]wq.SGE{{Addr: 0x1000, Length: 8, LKey: 1}})
	require.NoError(t, err, "a send reads a read-only MR")
	_, err = c.CheckWrite([]wq.SGE{{Addr: 0x1000, Length: 8, LKey: 1}})
	assert.ErrorIs(t, err, wq.ErrPrivileges, "a READ into a read-only MR")
	n, err := c.CheckWrite([]wq.SGE{{Addr: 0x9000, Length: 8, LKey: 2}})
	require.NoError(t, err)
	assert.Equal(t, 8, n)
	_, err = c.Check([]wq.SGE{{Addr: 0x1000, Length: 8, LKey: 1}})
	assert.NoError(t, err, "the checker reads again after a CheckWrite")
}

// Rule: PostRoom reads the device's consumer index once and refuses one out
// of range as a device fault, with no room: a post call that went on would
// write over WQEs the device has not read. (Fault caught: PostRoom
// ignoring the index check and reporting the room it computed anyway.)
func TestPostRoomRefusesAConsumerIndexOutOfRange(t *testing.T) {
	reg, err := mmio.New(make([]byte, doorbell.PageSize))
	require.NoError(t, err)
	state := make([]byte, 8)
	var w wq.Queue
	stride := rings.SendStride(1)
	require.NoError(t, w.Init("QP 1", reg, state, make([]byte, 4*stride), stride, 4, 1, doorbell.OffsetQP, doorbell.QPSend|1))
	st, err := rings.NewState(state)
	require.NoError(t, err)
	for _, head := range []uint32{1 << 20, 3} { // beyond twice the ring; ahead of what was posted
		st.SetConsHead(head)
		room, err := w.PostRoom()
		require.ErrorIs(t, err, rings.ErrDeviceFault, "cons_head %d", head)
		assert.Zero(t, room)
		assert.ErrorIs(t, w.CheckRing(), rings.ErrDeviceFault)
	}
	st.SetConsHead(0)
	room, err := w.PostRoom()
	require.NoError(t, err)
	assert.Equal(t, 4, room)
}
