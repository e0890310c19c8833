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
// A send queue on a device that honours signaling is selective
// (SetSelective): a request posted unsignaled makes no completion unless it
// fails. Its record is retired by the IB rule (a completion retires every
// unsignaled request before it, SQ completions being in order) or by the
// device's progress (Reap: every unsignaled request behind the ring's
// consumer index), whichever comes first, and its room is bounded by the
// ring's too (SetBoundByRing).
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

	// Selective queues (SetSelective): unsig marks the outstanding
	// requests posted unsignaled, by record slot (nil: every request is
	// signaled); st is the ring state, whose cons_head Reap reads;
	// ringBase maps record counts to ring counters (prod_tail at Init), and
	// ctrMask is the ring counters' mask (2n-1). bound makes PostRoom count
	// the ring's free slots too. reapWanted is the request for Reaps
	// (WantReap), which the poller keeps while the device has requests to
	// consume (Reap); unsigCall marks a post call with an unsignaled
	// request (the poster's).
	unsig      []bool
	st         *rings.State
	ringBase   uint32
	ctrMask    uint32
	bound      bool
	reapWanted atomic.Bool
	unsigCall  bool

	// The poller's: every record in [headC, scanned) is signaled (a Reap
	// looked at it), so the next Reap starts at scanned; flushing is set
	// once BeginFlush has run (the driver completes the rest itself).
	scanned  uint32
	flushing bool
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
		at: uint32(prod.Next(0)), st: st, ringBase: st.ProdTail(), ctrMask: uint32(2*depth - 1)}
	return nil
}

// SetSelective makes the queue selective: a send queue whose device
// honours send_flags and sq_sig_all, so that a request claimed unsignaled
// (ClaimSend) makes no completion unless it fails. Call it after Init,
// before the first post.
func (w *Queue) SetSelective() {
	if len(w.wrids) > 0 {
		w.unsig = make([]bool, len(w.wrids))
	}
}

// Selective reports whether the queue is selective.
func (w *Queue) Selective() bool { return w.unsig != nil }

// SetBoundByRing makes PostRoom count the ring's free slots (from the
// device's consumer index) as well as the record's: on a device that may
// complete a request before it advances its index, or that consumes
// unsignaled requests without a word. Call it after Init, before the first
// post.
func (w *Queue) SetBoundByRing() { w.bound = true }

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

// PutSend writes a send WQE in the next slot and records its wr_id (and,
// on a selective queue, whether its flags signal it).
func (w *Queue) PutSend(s *rings.SendWQE) {
	rings.PutSendWQE(w.ClaimSend(s.WRID, s.Flags&rings.SendSignaled != 0), s)
}

// PutRecv writes a receive WQE in the next slot and records its wr_id.
func (w *Queue) PutRecv(wrID uint64, sges []SGE) { rings.PutRecvWQE(w.Claim(wrID), wrID, sges) }

// Claim records the next request's wr_id and returns the slot its WQE goes
// to, for the caller to write before the call ends (End or Fail). On a
// selective queue use ClaimSend. The
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

// TookUnsignaled reports whether the last post call (End or Fail) handed
// the device an unsignaled request on a selective queue, and forgets it:
// the poster asks for reaps after such calls (WantReap). Poster side.
func (w *Queue) TookUnsignaled() bool {
	u := w.unsigCall
	w.unsigCall = false
	return u
}

// Room returns how many more requests the queue takes now: its slots less
// those outstanding. A post call reads it once.
func (w *Queue) Room() int { return len(w.wrids) - w.Outstanding() }

// PostRoom is CheckRing and Room in one read of the device's consumer
// index: an index out of range is a device fault; a queue bound by its
// ring (SetBoundByRing) takes no more than the ring's free slots either.
// A post call reads it once.
func (w *Queue) PostRoom() (int, error) {
	free, err := w.prod.Free()
	if err != nil {
		return 0, err
	}
	room := len(w.wrids) - w.Outstanding()
	if w.bound && free < room {
		room = free
	}
	return room, nil
}

// ClaimSend is Claim for a send queue: on a selective queue it records
// whether the request was posted signaled.
func (w *Queue) ClaimSend(wrID uint64, signaled bool) []byte {
	if w.unsig != nil {
		w.unsig[w.tail&w.mask] = !signaled
		w.unsigCall = w.unsigCall || !signaled
	}
	return w.Claim(wrID)
}

// WantReap asks the poller for a Reap (a selective queue that took
// unsignaled requests: TookUnsignaled), after the post call's End or Fail.
// It reports whether the request is new: false if one is pending, or if
// the queue is not selective; the caller hands a new one to its poller.
// Poster side.
func (w *Queue) WantReap() bool {
	return w.unsig != nil && !w.reapWanted.Load() && !w.reapWanted.Swap(true)
}

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

// Ring rings the doorbell for deferred requests, if any.
func (w *Queue) Ring() error {
	if w.db == nil {
		return nil
	}
	return w.db.Ring()
}

// Complete removes one outstanding request with wr_id id, for a
// successful completion, and reports whether there was one: false for a
// completion of nothing outstanding (a late one for a request already
// flushed, say). Completions may come in any order; the oldest is found at
// once, others by a scan from it, and the record stays dense: the
// completed entry trades places with the oldest. Poller side.
//
// On a selective queue the completion is a signaled request's: the oldest
// signaled request with wr_id id (an unsignaled one if none is signaled: a
// device that signals regardless) is retired together with every
// unsignaled request before it, which the device completed first; the
// signaled ones before it stay outstanding.
//
// The poster learns of it at the next PublishHead: the poller calls that
// once per poll rather than paying an atomic store for each completion.
func (w *Queue) Complete(id uint64) bool {
	head := w.headC
	if head != w.tailP.Load() && w.wrids[head&w.mask] == id && (w.unsig == nil || !w.unsig[head&w.mask]) { // in order: the usual case
		w.headC = head + 1
		return true
	}
	if w.unsig != nil {
		return w.completeSelective(id, false) || w.completeSelective(id, true)
	}
	return w.completeOutOfOrder(id)
}

// CompleteErr is Complete for a completion with an error status: a device
// reports a failed request whether or not it was signaled, so on a
// selective queue the oldest request with wr_id id is taken, signaled or
// not, with every unsignaled request before it.
func (w *Queue) CompleteErr(id uint64) bool {
	if w.unsig != nil {
		return w.completeSelective(id, true)
	}
	return w.Complete(id)
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

// completeSelective retires, on a selective queue, the oldest request with
// wr_id id (signaled only, unless anyone) and every unsignaled request
// before it. The signaled requests before it keep their order and move up
// next to the ones after it; the record stays dense.
func (w *Queue) completeSelective(id uint64, anyone bool) bool {
	head := w.headC
	out := w.tailP.Load() - head
	for k := uint32(0); k < out; k++ {
		i := (head + k) & w.mask
		if w.wrids[i] != id || (w.unsig[i] && !anyone) {
			continue
		}
		// Slot head+k is free now; walk back to head, moving each
		// signaled (still outstanding) request to the last free slot.
		dst := head + k
		for m := k; m > 0; m-- {
			src := (head + m - 1) & w.mask
			if !w.unsig[src] {
				d := dst & w.mask
				w.wrids[d], w.unsig[d] = w.wrids[src], false
				dst--
			}
		}
		w.headC = dst + 1
		return true
	}
	return false
}

// Reap retires, on a selective queue, every unsignaled request the device
// has consumed (its consumer index is past it), wherever it is among those
// outstanding: it makes no completion, and its slot is the poster's again.
// The signaled requests among them stay outstanding, in order, for their
// completions. It returns how many it retired, and whether the poller
// keeps the queue in its reaps: while the device has requests left to
// consume the request for reaps (WantReap) stays the poller's; once it has
// none, the request is given up, and the poster's next WantReap is new
// (unless a post came meanwhile: then the poller keeps it). A consumer
// index out of range retires nothing and gives the request up (the next
// post reports it). Poller side; call PublishHead after.
func (w *Queue) Reap() (n int, keep bool) {
	if w.unsig == nil {
		return 0, false
	}
	// The consumer index first, then the posts: the device consumes only
	// what was published, after its tail was stored.
	cons := w.st.ConsHead()
	tail := w.tailP.Load()
	done, ok := w.consumed(cons, tail)
	if ok {
		n = w.reapTo(done)
		if done != tail {
			return n, true
		}
	}
	return n, w.giveUpReaps(tail)
}

// giveUpReaps gives the request for reaps up, the device having consumed
// the posts up to tail (or its index being out of range), and reports
// whether the poller keeps the queue all the same. A poster publishes its
// tail, then looks at the request: one that looked before the request was
// given up asked for nothing, and its posts show in the tail read after;
// then the poller takes the request back, unless that poster, looking
// after, has asked anew (its request stands).
func (w *Queue) giveUpReaps(tail uint32) bool {
	w.reapWanted.Store(false)
	return w.tailP.Load() != tail && !w.reapWanted.Swap(true)
}

// consumed converts the consumer index cons to the record count of the
// requests the device has consumed (tail: the posts published); false for
// an index out of range.
func (w *Queue) consumed(cons, tail uint32) (uint32, bool) {
	ahead := (w.ringBase + tail - cons) & w.ctrMask
	if cons&^w.ctrMask != 0 || ahead > uint32(len(w.wrids)) {
		return 0, false
	}
	return tail - ahead, true
}

// reapTo retires the unsignaled requests among those before record count
// done. The records from scanned on are looked at (those before are all
// signaled): walking back from done, the signaled ones move to its end;
// then the signaled ones before scanned move up next to them, and the
// head moves past the slots freed. The record stays dense and in order.
func (w *Queue) reapTo(done uint32) int {
	head := w.headC
	from := head + uint32(max(int32(w.scanned-head), 0))
	if done-from > uint32(len(w.wrids)) { // behind from: an index moved back
		return 0
	}
	dst := done
	for k := done; k != from; {
		k--
		if i := k & w.mask; !w.unsig[i] {
			dst--
			if d := dst & w.mask; d != i {
				w.wrids[d], w.unsig[d] = w.wrids[i], false
			}
		}
	}
	n := dst - from
	w.scanned = done
	if n == 0 {
		return 0
	}
	for k := from; k != head; {
		k--
		dst--
		i, d := k&w.mask, dst&w.mask
		w.wrids[d], w.unsig[d] = w.wrids[i], false
	}
	w.headC = head + n
	return int(n)
}

// ConsHead reads the device's consumer index of the ring, for BeginFlush
// once the device is done with the queue (its QP destroyed, the ring not
// yet freed).
func (w *Queue) ConsHead() uint32 { return w.st.ConsHead() }

// BeginFlush readies the queue for flush completions (PopFlush), once the
// device will complete none of its requests, with cons the device's last
// consumer index (ConsHead): on a selective queue every unsignaled request
// the device consumed is retired first, without a completion. From then on
// Flushing reports true. It returns how many it retired. Poller side;
// calling it again retires nothing more.
func (w *Queue) BeginFlush(cons uint32) int {
	w.flushing = true
	if w.unsig == nil {
		return 0
	}
	tail := w.tailP.Load()
	done, ok := w.consumed(cons, tail)
	if !ok {
		return 0
	}
	n := w.reapTo(done)
	if n != 0 {
		w.PublishHead()
	}
	return n
}

// Flushing reports whether BeginFlush has run: the queue's requests still
// outstanding complete by PopFlush, and a device completion with no record
// is a late one. Poller side.
func (w *Queue) Flushing() bool { return w.flushing }

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
