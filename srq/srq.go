// Package srq holds the semantics of a shared receive queue, after uDAPL's
// dat_srq_post_recv, dat_ep_recv_query, dat_srq_query, dat_srq_resize and
// dat_srq_set_lw: receives posted once and consumed by any QP attached to
// it, the accounting of what is posted and what each QP consumed, the low
// watermark, resizing within a ring reserved at creation, and exactly-once
// completion of every receive (consumed, or flushed when the queue closes).
//
// A Queue works over any ring memory: the root package gives it the
// device's SRQ ring in DMA memory, the tests an in-memory one. It issues no
// device command; the root package creates and destroys the device's SRQ
// and feeds the Queue the completions it polls.
//
// # Concurrency
//
// A Queue is safe for concurrent use: many goroutines may post to it (a
// service refills one SRQ from many connections), while one poller per CQ
// reports completions. Post, Complete, Query and the setters serialise on
// one mutex, so a Query is one consistent snapshot.
//
// # What the device cannot tell
//
// The pvrdma device reports a receive only when it completes, naming the QP
// that took it. How many buffers a QP has taken and not completed is
// therefore not known at any cost, nor the span of completions it could
// still generate: a Member's query answers Unknown for both, and
// Queue.PerQPAllocationKnown says so up front. What each QP consumed is
// counted exactly.
package srq

import (
	"fmt"
	"sync"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/rings"
	"github.com/vfrdma/vfrdma/wq"
)

// Unknown is the value of a count the device cannot tell
// (DAT_VALUE_UNKNOWN).
const Unknown = -1

// Config sets a Queue up. Every field is required unless said otherwise.
type Config struct {
	Name string // "SRQ 3", for errors

	// The ring: its state (8 bytes), data (Slots slots of Stride bytes),
	// and the doorbell that hands posts to the device.
	State, Data []byte
	Stride      int
	Slots       int // a power of two: the most receives the SRQ can ever hold
	Register    doorbell.Register
	Offset      int    // doorbell.OffsetSRQ
	Value       uint32 // doorbell.SRQRecv | handle

	// Depth is how many receives it accepts now (1 to Slots; Resize changes
	// it). MaxSGE is the SGE limit of a receive.
	Depth  int
	MaxSGE int

	// PD is the protection domain's handle; Keys resolves local keys.
	PD   uint32
	Keys *wq.Keys

	// NeedMember refuses posts while no QP is attached (QEMU 7.2 stamps a
	// receive with the receive CQ of the newest QP when it is posted).
	NeedMember bool

	// LowWatermark arms the low watermark from the start (0: disarmed).
	// The new Queue is empty: the event comes with the first completion
	// that leaves fewer available, not at once.
	LowWatermark int

	// OnLowWatermark, if set, is called with each low-watermark event, on
	// the goroutine that reported the completion that crossed the line (a
	// CQ's poller) or armed the watermark below it. It must not block; it
	// may call the Queue's methods.
	OnLowWatermark func(Event)
}

// Event is a low-watermark event: the receives available (posted and not
// consumed) dropped below the watermark that was armed.
type Event struct {
	Available int
	Watermark int
}

// Queue is a shared receive queue's semantics over its ring. See the
// package documentation.
type Queue struct {
	mu       sync.Mutex
	w        wq.Queue
	pd       uint32
	keys     *wq.Keys
	depth    int
	lw       int // armed watermark; 0: disarmed
	closed   bool
	stopped  bool // StopPosts: posts refused, the queue not yet closed
	need     bool
	members  []*Member // in attach order; nil where one detached (holes)
	holes    int
	consumed uint64 // completions by QPs, over the queue's life
	flushed  uint64 // flush completions after Close
	events   uint64 // low-watermark events raised
	onLW     func(Event)
	lwC      chan Event
}

// Member is a QP attached to the Queue. Its counts are the Queue's, read
// under its mutex.
type Member struct {
	q        *Queue
	qpn      uint32
	consumed uint64
	attached bool
	idx      int // in q.members
}

// New returns a Queue over cfg's ring.
func New(cfg Config) (*Queue, error) {
	if cfg.Keys == nil {
		return nil, wq.Invalidf("%s: no key table", cfg.Name)
	}
	if cfg.Depth < 1 || cfg.Depth > cfg.Slots {
		return nil, wq.Invalidf("%s: depth %d: want 1 to %d", cfg.Name, cfg.Depth, cfg.Slots)
	}
	if cfg.LowWatermark < 0 || cfg.LowWatermark > cfg.Depth {
		return nil, wq.Invalidf("%s: low watermark %d: want 0 to the depth, %d", cfg.Name, cfg.LowWatermark, cfg.Depth)
	}
	if min := rings.RecvStride(cfg.MaxSGE); cfg.Stride < min {
		return nil, wq.Invalidf("%s: stride %d cannot hold %d SGEs (%d bytes)", cfg.Name, cfg.Stride, cfg.MaxSGE, min)
	}
	q := &Queue{pd: cfg.PD, keys: cfg.Keys, depth: cfg.Depth, lw: cfg.LowWatermark, need: cfg.NeedMember,
		onLW: cfg.OnLowWatermark, lwC: make(chan Event, 1)}
	if err := q.w.Init(cfg.Name, cfg.Register, cfg.State, cfg.Data, cfg.Stride, cfg.Slots, cfg.MaxSGE, cfg.Offset, cfg.Value); err != nil {
		return nil, err
	}
	return q, nil
}

// Post posts wrs as one chain: each receive is checked before it touches
// the ring, and unless deferred one doorbell hands the chain, with every
// receive deferred before it, to the device. A refused receive stops the
// call with a *wq.PostError (what came before it still goes to the device)
// wrapping a distinct sentinel: ErrClosed (the queue is closed: an invalid
// handle), ErrQueueFull (as many receives posted and not consumed as the
// depth), ErrInvalid (too many SGEs, a segment outside its MR, no QP yet
// where one is needed), ErrProtection (an MR of another PD),
// ErrPrivileges (an unknown key, an MR without local write). A receive
// with no SGEs takes a zero-size message. Post does not allocate or block
// (beyond the queue's mutex).
func (q *Queue) Post(wrs []wq.RecvWR, deferred bool) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	w := &q.w
	switch {
	case q.closed || q.stopped:
		return 0, w.Fail(0, firstID(wrs), wq.ErrClosed)
	case q.need && len(q.members) == q.holes:
		return 0, w.Fail(0, firstID(wrs), errNoMember(w.Name()))
	}
	if err := w.CheckRing(); err != nil {
		return 0, w.Fail(0, firstID(wrs), err)
	}
	room := q.depth - w.Outstanding()
	sges := wq.NewSGEChecker(q.keys, q.pd, w.MaxSGE(), true)
	for i := range wrs {
		wr := &wrs[i]
		if _, err := sges.Check(wr.SGEs); err != nil {
			return i, w.Fail(i, wr.WRID, err)
		}
		if i >= room {
			return i, w.Fail(i, wr.WRID, wq.ErrQueueFull)
		}
		w.PutRecv(wr.WRID, wr.SGEs)
	}
	return len(wrs), w.End(deferred)
}

func errNoMember(name string) error {
	return wq.Invalidf("no QP uses %s yet: QEMU 7.2 takes the receiving CQ from its newest QP when a receive is posted", name)
}

func firstID(wrs []wq.RecvWR) uint64 {
	if len(wrs) > 0 {
		return wrs[0].WRID
	}
	return 0
}

// Ring rings the doorbell for receives posted deferred. Once posts are
// stopped or the Queue is closed it rings nothing and returns ErrClosed.
func (q *Queue) Ring() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || q.stopped {
		return fmt.Errorf("%s: %w", q.w.Name(), wq.ErrClosed)
	}
	return q.w.Ring()
}

// Attach records a QP that takes receives from the Queue. It fails with
// ErrClosed once the Queue is closed.
func (q *Queue) Attach(qpn uint32) (*Member, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, wq.ErrClosed
	}
	m := &Member{q: q, qpn: qpn, attached: true, idx: len(q.members)}
	q.members = append(q.members, m)
	return m, nil
}

// Detach forgets the member: its QP was destroyed. Completions it reports
// later still count.
func (m *Member) Detach() {
	q := m.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if !m.attached {
		return
	}
	m.attached = false
	// A hole, not a shift: detaching n QPs costs O(n), not O(n²). The
	// holes go once they are half the slice.
	q.members[m.idx] = nil
	q.holes++
	if 2*q.holes < len(q.members) {
		return
	}
	kept := q.members[:0]
	for _, o := range q.members {
		if o != nil {
			o.idx = len(kept)
			kept = append(kept, o)
		}
	}
	clear(q.members[len(kept):])
	q.members, q.holes = kept, 0
}

// Members returns how many QPs are attached.
func (q *Queue) Members() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.members) - q.holes
}

// Complete reports that m's QP consumed the receive with wr_id id (its
// completion was polled, successful or not). It returns false, changing
// nothing, when no such receive is outstanding. Completions of different
// QPs come in any order. If the receives available drop below the armed
// watermark, the low-watermark event is raised here, once, and the
// watermark disarmed.
func (q *Queue) Complete(m *Member, id uint64) bool {
	q.mu.Lock()
	if !q.w.Complete(id) {
		q.mu.Unlock()
		return false
	}
	q.w.PublishHead()
	m.consumed++
	q.consumed++
	ev, fire := q.checkLW()
	q.mu.Unlock()
	if fire {
		q.raise(ev)
	}
	return true
}

// checkLW disarms the watermark and returns its event if the available
// receives are below it; the caller holds mu and raises the event after
// unlocking.
func (q *Queue) checkLW() (Event, bool) {
	avail := q.w.Outstanding()
	if q.lw == 0 || avail >= q.lw {
		return Event{}, false
	}
	ev := Event{Available: avail, Watermark: q.lw}
	q.lw = 0
	q.events++
	return ev, true
}

// RaiseLowWatermark is the device's SRQ_LIMIT_REACHED event: it raises
// the low-watermark event, once, if the watermark is armed, and disarms
// it. The driver's own count raises the same event (Complete): whichever
// comes first fires, and the other finds the watermark disarmed. It
// reports whether an event was raised.
func (q *Queue) RaiseLowWatermark() bool {
	q.mu.Lock()
	if q.lw == 0 {
		q.mu.Unlock()
		return false
	}
	ev := Event{Available: q.w.Outstanding(), Watermark: q.lw}
	q.lw = 0
	q.events++
	q.mu.Unlock()
	q.raise(ev)
	return true
}

func (q *Queue) raise(ev Event) {
	select {
	case q.lwC <- ev:
	default: // the previous event is still unread: the reader learns of this one from it
	}
	if q.onLW != nil {
		q.onLW(ev)
	}
}

// LowWatermarkEvents returns the channel that receives each low-watermark
// event (one slot: read it before arming again, or use
// Config.OnLowWatermark).
func (q *Queue) LowWatermarkEvents() <-chan Event { return q.lwC }

// SetLowWatermark arms the low watermark at n receives (0 disarms it): the
// first time fewer than n receives are available, one event is raised and
// the watermark disarms; it must be set again to fire again. As
// dat_srq_set_lw says, that can happen during this call: armed while fewer
// than n are available, it fires here, on the caller's goroutine.
func (q *Queue) SetLowWatermark(n int) error {
	q.mu.Lock()
	if n < 0 || n > q.depth {
		q.mu.Unlock()
		return wq.Invalidf("%s: low watermark %d: want 0 to the depth, %d", q.w.Name(), n, q.depth)
	}
	if q.closed {
		q.mu.Unlock()
		return wq.ErrClosed
	}
	q.lw = n
	ev, fire := q.checkLW()
	q.mu.Unlock()
	if fire {
		q.raise(ev)
	}
	return nil
}

// Resize sets how many receives the Queue accepts, from 1 to the ring's
// size fixed at creation. Shrinking below the receives posted and not
// consumed is refused with an error wrapping ErrBusy, and changes nothing.
func (q *Queue) Resize(n int) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return wq.ErrClosed
	}
	if n < 1 || n > q.w.Slots() {
		return wq.Invalidf("%s: depth %d: want 1 to %d (the ring reserved at creation)", q.w.Name(), n, q.w.Slots())
	}
	if out := q.w.Outstanding(); n < out {
		return fmt.Errorf("%w: %s holds %d receives posted and not consumed: cannot shrink to %d", wq.ErrBusy, q.w.Name(), out, n)
	}
	q.depth = n
	return nil
}

// Snapshot is a consistent view of a Queue (dat_srq_query).
type Snapshot struct {
	Depth        int // receives it accepts
	Slots        int // the most Resize allows
	MaxSGE       int
	LowWatermark int // armed; 0: none
	Available    int // receives posted and not consumed
	Consumed     uint64
	Flushed      uint64
	Events       uint64 // low-watermark events raised
	QPs          []QPView
}

// QPView is one attached QP's part (dat_ep_recv_query for a QP of an
// SRQ): what it consumed, and its allocation, which the device cannot tell.
type QPView struct {
	QPN       uint32
	Consumed  uint64 // receives it completed
	Allocated int    // buffers taken and not completed: Unknown
	Span      int    // completions it could still generate: Unknown
}

// Query returns a snapshot taken under one lock.
func (q *Queue) Query() Snapshot {
	q.mu.Lock()
	defer q.mu.Unlock()
	s := Snapshot{Depth: q.depth, Slots: q.w.Slots(), MaxSGE: q.w.MaxSGE(), LowWatermark: q.lw,
		Available: q.w.Outstanding(), Consumed: q.consumed, Flushed: q.flushed, Events: q.events,
		QPs: make([]QPView, 0, len(q.members)-q.holes)}
	for _, m := range q.members {
		if m != nil {
			s.QPs = append(s.QPs, m.view())
		}
	}
	return s
}

func (m *Member) view() QPView {
	return QPView{QPN: m.qpn, Consumed: m.consumed, Allocated: Unknown, Span: Unknown}
}

// Query returns the member's view.
func (m *Member) Query() QPView {
	m.q.mu.Lock()
	defer m.q.mu.Unlock()
	return m.view()
}

// PerQPAllocationKnown reports whether a QP's Allocated and Span are known
// (never, on this device: see the package documentation).
func (q *Queue) PerQPAllocationKnown() bool { return false }

// Available returns the receives posted and not consumed.
func (q *Queue) Available() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.w.Outstanding()
}

// Depth returns how many receives the Queue accepts.
func (q *Queue) Depth() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.depth
}

// Slots returns the ring's size, the most Resize allows.
func (q *Queue) Slots() int { return q.w.Slots() }

// Doorbell returns the ring's doorbell counts.
func (q *Queue) Doorbell() doorbell.Stats {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.w.Doorbell().Stats()
}

// Close refuses further posts; the receives still outstanding are then
// taken one by one with PopFlush, for flush completions. The device must
// take no more of them (its SRQ is destroyed). It reports how many are
// outstanding.
// StopPosts refuses posts from now on with ErrClosed, before the queue is
// closed: a closer that first takes the QPs off the queue (a device closing
// everything) keeps a post racing it from seeing "no QP uses the queue".
func (q *Queue) StopPosts() {
	q.mu.Lock()
	q.stopped = true
	q.mu.Unlock()
}

func (q *Queue) Close() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.closeLocked()
}

// CloseAfter runs destroy (the device's DESTROY_SRQ) with the queue's lock
// held, so that no post writes the ring or rings the doorbell meanwhile,
// and closes the queue as Close does if destroy succeeds. If it fails, the
// queue is left as it was. It returns Close's count and destroy's error.
func (q *Queue) CloseAfter(destroy func() error) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := destroy(); err != nil {
		return 0, err
	}
	return q.closeLocked(), nil
}

func (q *Queue) closeLocked() int {
	q.closed = true
	q.lw = 0
	q.w.Doorbell().Reset() // deferred receives are flushed, never handed to a destroyed SRQ
	return q.w.Outstanding()
}

// PopFlush takes the oldest receive outstanding after Close, for its flush
// completion.
func (q *Queue) PopFlush() (uint64, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	id, ok := q.w.PopFlush()
	if ok {
		q.flushed++
	}
	return id, ok
}
