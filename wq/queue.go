package wq

import (
	"errors"
	"math/bits"
	"sync/atomic"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/rings"
)

// Queue is one work queue: a QP's send or receive queue, or an SRQ's ring.
// It holds the ring, its doorbell, and the work requests posted and not yet
// completed, as a multiset of wr_ids in a ring of their own (dense from the
// oldest outstanding to the newest). The zero Queue is an empty queue
// without a ring (a QP that receives from an SRQ): it holds nothing and
// takes no posts.
//
// The poster owns the post side, the poller the completion side; see the
// package documentation.
type Queue struct {
	name   string // "QP 17", "SRQ 3": for errors
	prod   *rings.Producer
	db     *doorbell.Queue
	data   []byte
	stride int
	maxSGE int
	wrids  []uint64 // outstanding wr_ids; len is the ring size
	mask   uint32
	tail   uint32        // pushes (poster); published through tailP
	inCall int           // pushes of the post call under way, not yet advanced
	at     uint32        // the slot the next WQE goes to: prod.Next(inCall)
	tailP  atomic.Uint32 // tail as the poller sees it: stored once per post call
	headC  uint32        // pops, the poller's own count; published through head
	head   atomic.Uint32 // pops as the poster sees them: stored once per poll
	shift  uint          // log2(stride)
}

// Init sets the queue up over its ring: state is the ring's 8-byte state
// (producer tail, consumer head), data its slots of stride bytes, depth
// slots (a power of two); maxSGE is the SGE limit of its requests. Posts
// ring value at offset of reg.
func (w *Queue) Init(name string, reg doorbell.Register, state, data []byte, stride, depth, maxSGE, offset int, value uint32) error {
	if len(data) < depth*stride {
		return Invalidf("%s: %d bytes of ring data hold fewer than %d slots of %d bytes", name, len(data), depth, stride)
	}
	st, err := rings.NewState(state)
	if err != nil {
		return err
	}
	prod, err := rings.NewProducer(st, depth)
	if err != nil {
		return err
	}
	prod.SetName(name)
	db, err := doorbell.NewQueue(reg, offset, value, prod)
	if err != nil {
		return err
	}
	if stride <= 0 || stride&(stride-1) != 0 {
		return Invalidf("%s: WQE stride %d is not a power of two", name, stride)
	}
	*w = Queue{name: name, prod: prod, db: db, data: data, stride: stride, maxSGE: maxSGE,
		wrids: make([]uint64, depth), mask: uint32(depth - 1), shift: uint(bits.TrailingZeros(uint(stride))),
		at: uint32(prod.Next(0))}
	return nil
}

// SetName names the queue in errors (an empty queue, or a renamed one).
func (w *Queue) SetName(name string) { w.name = name }

// Name returns the queue's name.
func (w *Queue) Name() string { return w.name }

// Slots returns the ring size: the most requests it can hold (0 for the
// empty queue).
func (w *Queue) Slots() int { return len(w.wrids) }

// MaxSGE returns the SGE limit of the queue's requests.
func (w *Queue) MaxSGE() int { return w.maxSGE }

// Doorbell returns the queue's doorbell (nil for the empty queue).
func (w *Queue) Doorbell() *doorbell.Queue { return w.db }

// Posted returns how many requests were ever written (the poster's count).
func (w *Queue) Posted() uint32 { return w.tail }

// Outstanding counts requests posted and not completed: the poster's view.
func (w *Queue) Outstanding() int { return int(w.tail - w.head.Load()) }

// OutstandingP is the same count from the published counters, readable
// from any goroutine: posts as of the last post call, completions as of
// the last PublishHead. Both counts come from one moment: it reads the
// completions, the posts, then the completions again, and retries if they
// moved, so the answer is never negative nor more than the ring holds,
// whatever runs meanwhile.
func (w *Queue) OutstandingP() int {
	for {
		head := w.head.Load()
		tail := w.tailP.Load()
		if w.head.Load() == head {
			return int(tail - head)
		}
	}
}

// CheckRing checks the device's consumer index before a post: an index out
// of range is a device fault, and nothing is posted.
func (w *Queue) CheckRing() error {
	_, err := w.prod.Free()
	return err
}

// PutSend writes a send WQE in the next slot and records its wr_id.
func (w *Queue) PutSend(s *rings.SendWQE) { rings.PutSendWQE(w.Claim(s.WRID), s) }

// PutRecv writes a receive WQE in the next slot and records its wr_id.
func (w *Queue) PutRecv(wrID uint64, sges []SGE) { rings.PutRecvWQE(w.Claim(wrID), wrID, sges) }

// Claim records the next request's wr_id and returns the slot its WQE goes
// to, for the caller to write before the call ends (End or Fail). The
// queue keeps the slot index itself (the producer's, plus the call's
// requests) rather than asking the producer for each WQE; Claim is small
// enough to be inlined into a post loop.
func (w *Queue) Claim(wrID uint64) []byte {
	off := int(w.at) << w.shift
	w.wrids[w.tail&w.mask] = wrID
	w.tail++
	w.inCall++
	w.at = (w.at + 1) & w.mask
	return w.data[off : off+w.stride : off+w.stride]
}

// endCall hands the call's WQEs to the ring and the doorbell's count, and
// shows them to the poller: once per post call.
func (w *Queue) endCall() {
	if w.inCall > 0 {
		w.prod.Advance(w.inCall)
		w.db.Added(w.inCall)
		w.inCall = 0
	}
	w.tailP.Store(w.tail)
}

// Room returns how many more requests the queue takes now: its slots less
// those outstanding. A post call reads it once.
func (w *Queue) Room() int { return len(w.wrids) - w.Outstanding() }

// End closes a post call that succeeded: the poller is shown the call's
// requests (one store, before the device can see them), then, unless
// deferred, one doorbell hands everything pending to the device.
func (w *Queue) End(deferred bool) error {
	w.endCall()
	if err := w.db.Post(deferred); err != nil {
		return &PostError{Queue: w.name, Index: -1, Err: err}
	}
	return nil
}

// Fail closes a post call that refused request i (wr_id id) for cause:
// what is pending (earlier deferred calls, this call's requests before i)
// still goes to the device. It returns the *PostError.
func (w *Queue) Fail(i int, id uint64, cause error) error {
	err := &PostError{Queue: w.name, Index: i, WRID: id, Err: cause}
	if w.db == nil {
		return err
	}
	w.endCall()
	if derr := w.db.Fail(); derr != nil {
		err.Err = errors.Join(cause, derr)
	}
	return err
}

// Flush rings the doorbell for deferred requests, if any.
func (w *Queue) Flush() error {
	if w.db == nil {
		return nil
	}
	return w.db.Flush()
}

// Complete removes one outstanding request with wr_id id and reports
// whether there was one: false for a completion of nothing outstanding (a
// late one for a request already flushed, say). Completions may come in
// any order; the oldest is found at once, others by a scan from it, and the
// record stays dense: the completed entry trades places with the oldest.
// Poller side.
//
// The poster learns of it at the next PublishHead: the poller calls that
// once per poll rather than paying an atomic store for each completion.
func (w *Queue) Complete(id uint64) bool {
	head := w.headC
	if head != w.tailP.Load() && w.wrids[head&w.mask] == id { // in order: the usual case
		w.headC = head + 1
		return true
	}
	return w.completeOutOfOrder(id)
}

func (w *Queue) completeOutOfOrder(id uint64) bool {
	head := w.headC
	out := w.tailP.Load() - head
	for k := uint32(1); k < out; k++ {
		if w.wrids[(head+k)&w.mask] == id {
			i, j := (head+k)&w.mask, head&w.mask
			w.wrids[i], w.wrids[j] = w.wrids[j], w.wrids[i]
			w.headC = head + 1
			return true
		}
	}
	return false
}

// PublishHead shows the poster (Outstanding, Room) and OutstandingP the
// completions counted since the last call. Poller side. Until it runs the
// poster sees fewer free slots than there are, never more.
func (w *Queue) PublishHead() { w.head.Store(w.headC) }

// PopFlush removes the oldest outstanding request, for a flush completion
// once the device will complete no more of them. Poller side.
func (w *Queue) PopFlush() (uint64, bool) {
	head := w.headC
	if w.tailP.Load() == head {
		return 0, false
	}
	id := w.wrids[head&w.mask]
	w.headC = head + 1
	w.head.Store(head + 1)
	return id, true
}

// Data returns the ring's slots (nil for the empty queue).
func (w *Queue) Data() []byte { return w.data }

// Slot returns the bytes of ring slot i (what a device reads there).
func (w *Queue) Slot(i int) []byte { return w.data[i<<w.shift:][:w.stride:w.stride] }
