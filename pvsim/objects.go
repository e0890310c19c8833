package pvsim

import (
	"container/heap"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/vfrdma/vfrdma/firmware"
)

// worker is the device's state. Only the model's goroutine touches it
// (commands, doorbells, packets, timers and test calls all run there, one
// at a time, with the memory table's lock held), so it needs no locks.
type worker struct {
	rng *rand.Rand

	// The DSR as loaded (dsrLoaded is mirrored in Device.loaded for the
	// REQUEST path).
	dsrLoaded bool
	async     devRing // the async-event ring: 8-byte elements
	cqn       devRing // the CQ-notification ring: 4-byte elements
	uarPFN    uint64
	resp      uint64 // the response slot's device address
	ucPFN     uint64 // the UAR page of the last CREATE_UC
	nextQPN   uint32 // QEMU: the backend's next QP number
	activated bool
	quiesced  bool
	portUp    bool

	pds   map[uint32]*pd
	mrs   map[uint32]*mr
	lkeys map[uint32]*mr
	rkeys map[uint32]*mr
	cqs   map[uint32]*cq
	qps   map[uint32]*qp // by handle
	qpns  map[uint32]*qp // by QP number
	srqs  map[uint32]*srq
	ucs   map[uint32]bool
	gids  []gidEntry

	// The lowest free handle of each kind, found in O(log n).
	pdH, mrH, cqH, qpH, srqH, ucH handleSpace

	timers   timerHeap
	timerSeq uint64

	// The command answered last (async mode) and the commands waiting for
	// their delay.
	events  []firmware.AsyncEvent // every event written to the ring, in order
	hazards []string
}

type gidEntry struct {
	gid   [16]byte
	typ   uint8
	valid bool
}

type pd struct {
	handle uint32
	users  int // MRs, QPs, SRQs
}

type mr struct {
	handle uint32
	pd     *pd
	start  uint64 // the MR's address space base
	length uint64
	access uint32
	lkey   uint32
	rkey   uint32
	pages  []uint64 // page IOVAs; nil for a DMA MR
	offset uint64   // start's offset in the first page
	dma    bool     // a DMA MR: addresses are IOVAs
	frmr   bool     // a fast-register MR: no pages until registered
}

// Arm states of a CQ. QEMU has clear, armed-once and always (GSI).
const (
	armNone = iota
	armNext
	armSolicited
)

type cq struct {
	handle     uint32
	ring       devRing // state at offset 8 of the state page; 64-byte CQEs
	arm        int
	overflowed bool // a VMware device's CQ in error after an overflow
	users      int
}

// qpAttr is the QP attribute block of MODIFY_QP and QUERY_QP (160 bytes).
type qpAttr struct {
	state, curState uint32
	pathMTU         uint32
	pathMigState    uint32
	qkey            uint32
	rqPSN, sqPSN    uint32
	destQPN         uint32
	access          uint32
	pkeyIndex       uint16
	altPKeyIndex    uint16
	enSQDAsync      uint8
	sqDraining      uint8
	maxRDAtomic     uint8
	maxDestRDAtomic uint8
	minRNRTimer     uint8
	port            uint8
	timeout         uint8
	retryCnt        uint8
	rnrRetry        uint8
	altPort         uint8
	altTimeout      uint8
	capSendWR       uint32
	capRecvWR       uint32
	capSendSGE      uint32
	capRecvSGE      uint32
	capInline       uint32
	ah, altAH       [40]byte
}

func (a *qpAttr) dgid() (g [16]byte) { copy(g[:], a.ah[0:16]); return }
func (a *qpAttr) sgidIndex() uint8   { return a.ah[20] }

type qp struct {
	handle   uint32
	qpn      uint32
	typ      firmware.QPType
	pd       *pd
	scq      uint32 // CQ handles, looked up when a CQE is written
	rcq      uint32
	srq      *srq
	sqSigAll bool

	sq         wqRing // send queue: state at offset 0 of the state page
	rq         wqRing // receive queue: state at offset 8 (none with an SRQ)
	maxSendWR  uint32
	maxRecvWR  uint32
	maxSendSGE uint32
	maxRecvSGE uint32
	maxInline  uint32

	// state is the QP's state; in QEMU mode the backend's (QEMU forwards
	// only INIT, RTR and RTS), with recorded the state MODIFY_QP set.
	state    uint32
	recorded uint32
	attr     qpAttr

	// Requester.
	sqNext      uint32 // next send WQE to fetch (== cons_head unless consumed on completion)
	nextPSN     uint32
	inflight    []*sendOp
	retries     int
	rnrRetries  int
	rnrWait     bool
	failing     bool // a WQE failed at fetch behind requests in flight
	ackTimer    *timer
	ackDeadline time.Time
	// inModel counts the QP's requests and their answers inside the
	// model: queued in a device's inbox or being handled. Devices add to
	// it as they queue such a packet and take from it once they handled
	// or discarded it, so a request on its way or an answer not yet read
	// keeps it above 0 (see ackTimeout).
	inModel  atomic.Int64
	rnrTimer *timer
	stuck    bool // QEMU mode: spinning on a bad WQE (the hang of facts §11 item 6)

	// Responder.
	epsn    uint32
	atomics [8]atomicResult // the last atomic results, for duplicates

	// QEMU mode: receives QEMU handed to its backend at doorbell time.
	fifo []recvWQE

	eventsReported uint32
}

type atomicResult struct {
	psn   uint32
	orig  uint64
	valid bool
}

type srq struct {
	handle uint32
	pd     *pd
	ring   wqRing // state at offset 8 of the state page
	maxWR  uint32
	maxSGE uint32
	limit  uint32 // armed while non-zero (VMware); QEMU stores it only
	users  int
	recvCQ uint32 // QEMU: the receive CQ of the QP that attached last
	fifo   []recvWQE
}

// recvWQE is a receive work request taken from a ring.
type recvWQE struct {
	wrID uint64
	sges []sge
	cq   uint32 // QEMU SRQ: the CQ stamped at post
}

// sendOp is a send work request the requester has fetched and not yet
// completed.
type sendOp struct {
	wrID      uint64
	opcode    uint32 // the WR opcode as executed
	signaled  bool
	psn       uint32
	pkt       *packet // the request, kept for retransmission
	local     []sge   // where READ and atomic results go
	length    uint32  // bytes moved
	fence     bool
	readLike  bool   // READ or atomic: a later fenced WQE waits for it
	next      uint32 // the send queue counter after this WQE
	vendorErr uint32
	// err is a local error found at fetch while earlier requests were in
	// flight: the WQE completes with it in its turn.
	err uint32
}

// timer is a deadline the model's goroutine acts on.
type timer struct {
	when time.Time
	seq  uint64
	fn   func()
	dead bool
	idx  int
}

func (t *timer) stop() {
	if t != nil {
		t.dead = true
	}
}

type timerHeap []*timer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if !h[i].when.Equal(h[j].when) {
		return h[i].when.Before(h[j].when)
	}
	return h[i].seq < h[j].seq
}
func (h timerHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i]; h[i].idx = i; h[j].idx = j }
func (h *timerHeap) Push(x any)   { t := x.(*timer); t.idx = len(*h); *h = append(*h, t) }
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return t
}

// after runs fn on the model's goroutine d from now.
func (w *worker) after(d time.Duration, fn func()) *timer {
	w.timerSeq++
	t := &timer{when: time.Now().Add(d), seq: w.timerSeq, fn: fn}
	heap.Push(&w.timers, t)
	return t
}

// due pops the next timer due by now, skipping stopped ones.
func (w *worker) due(now time.Time) *timer {
	for len(w.timers) > 0 {
		t := w.timers[0]
		if t.dead {
			heap.Pop(&w.timers)
			continue
		}
		if t.when.After(now) {
			return nil
		}
		heap.Pop(&w.timers)
		return t
	}
	return nil
}

// next returns when the next live timer is due.
func (w *worker) next() (time.Time, bool) {
	for len(w.timers) > 0 {
		if t := w.timers[0]; !t.dead {
			return t.when, true
		}
		heap.Pop(&w.timers)
	}
	return time.Time{}, false
}

// handleSpace keeps, for one kind of object, what finds its lowest free
// handle without a scan from the base: every handle in [base, top) is in
// use or in free, a heap of handles given back (some perhaps taken again
// since: they are dropped when met). So a create and a destroy cost
// O(log n), not O(n), and n objects O(n log n), not O(n²).
type handleSpace struct {
	top    uint32
	free   handleHeap
	probes int // handles looked at (for tests)
}

type handleHeap []uint32

func (h handleHeap) Len() int           { return len(h) }
func (h handleHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h handleHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *handleHeap) Push(x any)        { *h = append(*h, x.(uint32)) }
func (h *handleHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// allocHandle returns the lowest free handle of m from base up to limit
// entries in use, as QEMU's bitmaps hand them out (and a VMware device, by
// the small handles its QP table needs). ok is false when limit are in
// use. The caller puts the handle in m, or not: an unused one is simply
// free again. Every handle m loses goes through freeHandle with s.
func allocHandle[T any](m map[uint32]T, s *handleSpace, base, limit uint32) (uint32, bool) {
	if uint32(len(m)) >= limit {
		return 0, false
	}
	for len(s.free) > 0 {
		s.probes++
		if _, used := m[s.free[0]]; !used {
			return s.free[0], true
		}
		heap.Pop(&s.free)
	}
	s.top = max(s.top, base)
	for {
		s.probes++
		if _, used := m[s.top]; !used {
			return s.top, true
		}
		s.top++
	}
}

// freeHandle removes handle h from m, if it is there, and gives it back to
// s.
func freeHandle[T any](m map[uint32]T, s *handleSpace, h uint32) {
	if _, ok := m[h]; !ok {
		return
	}
	delete(m, h)
	if h <= s.top { // above top: a handle allocHandle did not give (QEMU's QPNs)
		heap.Push(&s.free, h)
	}
}
