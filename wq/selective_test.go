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
	return &w, c
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

// Reap frees the slots of unsignaled requests the device has consumed,
// with no completion at all; it stops at a signaled request (its
// completion retires it) and never passes the device's consumer index.
func TestReapFreesConsumedUnsignaledSlots(t *testing.T) {
	w, c := newSendQueue(t, 8)
	postSends(t, w, c, false, u(1), u(2), s(3), u(4), u(5))
	assert.Zero(t, w.Reap(), "nothing consumed yet")
	n, err := c.Ready()
	require.NoError(t, err)
	c.Consume(n - 1) // all but the last
	assert.Equal(t, 2, w.Reap(), "the unsignaled sends before the signaled one")
	assert.Equal(t, 3, outstanding(w))
	require.True(t, w.Complete(3))
	assert.Equal(t, 1, w.Reap(), "4 is consumed; 5 is not")
	assert.Equal(t, 1, outstanding(w))
	c.Consume(1)
	assert.Equal(t, 1, w.Reap())
	assert.Zero(t, outstanding(w))
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
		require.Equal(t, depth, w.Reap())
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

// A random mix of signaled and unsignaled sends, completed as a device
// that honours signaling would (in order, a CQE for each signaled one),
// with reaps at random moments: every signaled request completes exactly
// once, nothing is left outstanding at the end, and the queue never
// fills for good over many laps.
func TestSelectiveQueueModel(t *testing.T) {
	const depth = 16
	w, c := newSendQueue(t, depth)
	rnd := rand.New(rand.NewPCG(3, 9))
	var posted []sendReq // consumed by the device, not yet completed or reaped, in order
	next := uint64(0)
	for round := range 3000 {
		room, err := w.PostRoom()
		require.NoError(t, err)
		k := rnd.IntN(room + 1)
		for range k {
			r := sendReq{id: next % 5, sig: rnd.IntN(3) == 0} // wr_ids repeat
			next++
			rings.PutSendWQE(w.ClaimSend(r.id, r.sig), &rings.SendWQE{})
			posted = append(posted, r)
		}
		require.NoError(t, w.End(false))
		if n, _ := c.Ready(); n > 0 {
			c.Consume(n)
		}
		switch rnd.IntN(3) {
		case 0: // the device completes, in order, some signaled requests
			for i := 0; i < len(posted); i++ {
				if !posted[i].sig {
					continue
				}
				require.True(t, w.Complete(posted[i].id), "round %d", round)
				posted, i = posted[i+1:], -1
				if rnd.IntN(2) == 0 {
					break
				}
			}
		case 1:
			lead := 0
			for lead < len(posted) && !posted[lead].sig {
				lead++
			}
			require.Equal(t, lead, w.Reap(), "round %d: the leading unsignaled sends", round)
			posted = posted[lead:]
		}
		w.PublishHead()
		require.Equal(t, len(posted), w.Outstanding(), "round %d", round)
	}
	for _, r := range posted {
		if r.sig {
			require.True(t, w.Complete(r.id))
		}
	}
	w.Reap()
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
