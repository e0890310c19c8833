package vfrdma

import (
	"context"
	"fmt"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/event"
	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/internal/lifecycle"
	"github.com/vfrdma/vfrdma/rings"
	"github.com/vfrdma/vfrdma/vfio"
	"github.com/vfrdma/vfrdma/wq"
)

// CQESize is the size of one completion-queue element.
const CQESize = 64

// maxCQEntries is the largest power-of-two CQ the device can hold: a CQ has
// at most firmware.MaxRingChunks pages, one of them the ring state.
const maxCQEntries = 1 << 12 // 64 data pages; 127 fit, 4096 is the power of two below 8128

// CQ is a completion queue: a ring of CQEs the device writes in DMA memory.
// Poll, Wait and SetMode are single-owner (one goroutine polls a CQ); Arm
// and the event source's calls (Source) may run beside them. Close is safe
// for concurrent use with every method: it follows the lifecycle rule
// (doc.go), so a Poll, Arm, Wait or source call racing it completes or
// returns ErrClosed, a Wait asleep is woken with ErrClosed, and the ring
// is freed only once no call is inside.
//
// Its mode (CQMode) says who takes its completions: its owner's Poll
// (CQPolled, a new CQ's), or the counters that drive it (CQCounted).
// Source gives it to poll sets, wait sets and counters; FD and TryWait
// give it a wait object of its own.
type CQ struct {
	d       *Device
	handle  uint32
	entries int
	buf     *vfio.DMABuffer
	st      *rings.State // the ring's counters, for Ready beside Poll
	cons    *rings.Consumer
	data    []byte
	wake    chan struct{} // the notifier's signal: a CQE arrived while armed
	stats   CQStats
	qpMask  uint32 // the bits of a CQE's qp field that key the QP table (Device.qpHandleMask)

	// The lifecycle: every call that reads the ring, the device's
	// registers or its control pages is inside gate; shut closes it, and
	// done, for the waiters asleep. rekey holds it for a moment.
	gate     lifecycle.Gate
	done     chan struct{}
	shutOnce sync.Once

	// The queues whose completions this poll counted, to publish once at
	// its end (wq.Queue.PublishHead).
	touched  [8]*wq.Queue
	nTouched int

	// Events: the arm state as the driver knows it (set when it rings an
	// arm doorbell, cleared when the device names the CQ), who watches
	// it, who takes its completions (mode), and CQSource.Progress's
	// scratch for counted CQs (pmu also orders SetMode after Progress).
	armed atomic.Bool
	arms  atomic.Uint64
	// devArmed and armProd (under d.armedMu, ArmBesidePollDoorbell): the
	// CQ is armed on the device until its producer index moves past
	// armProd, read after the arm doorbell (armProdSet once it is read),
	// and a grace more from armSpentAt, the first look that saw it moved.
	devArmed, armProdSet bool
	armProd              uint32
	armSpentAt           time.Time
	interrupts           atomic.Uint64 // Wait's wake-ups (Stats), counted outside the gate
	spun                 atomic.Uint64 // Waits the spin answered (Stats)
	lastPoll             time.Time     // the last POLL doorbell of Poll (Options.PollPace); Poll's own
	watchers             event.Watchers
	mode                 atomic.Uint32 // CQMode
	pmu                  sync.Mutex
	scratch              [32]WC
	sinceSync            int // CQEs since Poll last looked at the notification ring

	flushPending atomic.Bool
	failErr      atomic.Pointer[error] // set by a CQ_ERR or DEVICE_FATAL event: every Poll returns it
	fmu          sync.Mutex
	flushing     []flushSource // queues whose rest this CQ completes with WR_FLUSH_ERR

	// Reaps: the QPs whose selective send queues' posters asked the polls
	// to retire the unsignaled sends the device consumed (wq.Queue.Reap);
	// each stays until the device has consumed every send posted. A poll
	// holds rmu while it reaps; a QP's Close takes it out (dropReap) before
	// its ring goes.
	reapPending atomic.Bool
	rmu         sync.Mutex
	reaps       []*QP

	// quietWait's clock (QP.awaitQuietCQs, QEMU 7.2): the producer index
	// last seen, and since when it has not moved.
	qmu        sync.Mutex
	quietProd  uint32
	quietSince time.Time

	mu     sync.Mutex
	closed bool
	users  int            // QPs using the CQ
	own    *event.WaitSet // its own wait object (FD, TryWait), made on first use
}

// CQStats count what a CQ's poller saw.
type CQStats struct {
	Polls      uint64 // Poll calls
	Empty      uint64 // Poll calls that found nothing
	CQEs       uint64 // completions the device wrote
	Flushed    uint64 // completions the driver made for flushed requests
	Dropped    uint64 // device completions for requests already completed (late, after a flush) or unknown; not the error completion of an unsignaled send retired once consumed, which Poll returns
	Doorbells  uint64 // POLL and ARM doorbells rung
	Interrupts uint64 // wake-ups by the CQ vector
	Spun       uint64 // Waits a completion answered while they spun (Options.Spin): no arm, no sleep
}

// CreateCQ creates a completion queue of at least entries CQEs (rounded up
// to a power of two; at most 4096 and the device's max_cqe).
func (d *Device) CreateCQ(ctx context.Context, entries int) (*CQ, error) {
	const op = "create CQ"
	if err := d.enter(); err != nil {
		return nil, d.opErr(op, err)
	}
	defer d.exit() // Close waits for the CQ to be registered, then destroys it
	limit := min(maxCQEntries, int(d.caps.MaxCQE))
	if entries < 1 || entries > limit {
		return nil, d.opErr(op, invalidf("%d CQ entries: want 1 to %d", entries, limit))
	}
	n := 1 << bits.Len(uint(entries-1))
	dataPages := (n*CQESize + firmware.PageSize - 1) / firmware.PageSize
	buf, err := d.allocRing(dataPages)
	if err != nil {
		return nil, d.opErr(op, err)
	}
	resp, err := d.ch.CreateCQ(ctx, firmware.CreateCQRequest{
		PDirDMA: bufPage(buf, ringPgDir).DMA,
		CQE:     uint32(n),
		NChunks: uint32(1 + dataPages),
	})
	if err != nil {
		buf.Close()
		return nil, d.opErr(op, err)
	}
	st, err := rings.NewState(bufPage(buf, ringPgState).Mem[8:16])
	if err != nil {
		d.ch.DestroyCQ(ctx, resp.CQHandle)
		buf.Close()
		return nil, d.opErr(op, err)
	}
	cons, err := rings.NewConsumer(st, n)
	if err != nil {
		d.ch.DestroyCQ(ctx, resp.CQHandle)
		buf.Close()
		return nil, d.opErr(op, err)
	}
	cons.SetName(fmt.Sprintf("CQ %d", resp.CQHandle))
	cq := newCQ(d, resp.CQHandle, n, buf, st, cons, buf.Mem[ringPgData*firmware.PageSize:])
	d.journal.add(kindCQ, cq.handle)
	d.mu.Lock()
	d.cqs[cq] = struct{}{}
	d.mu.Unlock()
	d.notify.add(cq)
	return cq, nil
}

// newCQ makes the CQ over its ring (buf is nil in the host tests).
func newCQ(d *Device, handle uint32, entries int, buf *vfio.DMABuffer, st *rings.State, cons *rings.Consumer, data []byte) *CQ {
	return &CQ{d: d, handle: handle, entries: entries, buf: buf, st: st, cons: cons, data: data,
		wake: make(chan struct{}, 1), done: make(chan struct{}), qpMask: d.qpHandleMask()}
}

// shut refuses the CQ's calls from now on, wakes its waiter and waits for
// the calls inside to leave: then nothing touches the ring. Destroy calls
// it once the device has forgotten the ring, Device.Close for every CQ.
func (cq *CQ) shut() {
	cq.shutOnce.Do(func() {
		cq.gate.Close()
		close(cq.done)
	})
}

// errClosed is the error of a call on a shut CQ.
func (cq *CQ) errClosed(op string) error {
	return cq.d.opErr(op, fmt.Errorf("%w: CQ %d", ErrClosed, cq.handle))
}

// Handle returns the device's handle of the CQ.
func (cq *CQ) Handle() uint32 { return cq.handle }

// Entries returns the number of CQEs the ring holds.
func (cq *CQ) Entries() int { return cq.entries }

// Close destroys the CQ and frees its ring, once the calls inside it have
// returned; a CQ.Wait asleep returns ErrClosed. It is idempotent. If the
// device refuses the DESTROY, Close returns its error and the CQ stays
// open and usable.
func (cq *CQ) Close() error {
	return cq.d.closeObject("destroy CQ", func(ctx context.Context) error { return cq.destroy(ctx, false) })
}

// destroy destroys the CQ on the device and frees its ring. Device.Close
// forces it: a CQ still in sets is destroyed all the same, and its
// watchers are woken to find it closed. If the device refuses the
// DESTROY, the CQ stays as it was: open, registered, usable.
func (cq *CQ) destroy(ctx context.Context, force bool) error {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.closed {
		return nil
	}
	if cq.users > 0 {
		return fmt.Errorf("%w: %d QPs still use CQ %d; close them first", ErrBusy, cq.users, cq.handle)
	}
	watched := cq.watchers.Len()
	if cq.own != nil {
		watched--
	}
	if watched > 0 && !force {
		return fmt.Errorf("%w: CQ %d is in %d poll sets, wait sets or counters; remove it first", ErrBusy, cq.handle, watched)
	}
	if err := cq.d.ch.DestroyCQ(ctx, cq.handle); err != nil {
		return err
	}
	cq.d.disarmed(cq) // the device has forgotten it, and its arm
	// The device has forgotten the ring: refuse the calls, wait out those
	// inside, then let the memory go.
	cq.shut()
	if own := cq.own; own != nil {
		_ = own.Remove(cq.Source())
		_ = own.Close() // releases a goroutine waiting on it
	}
	cq.closed = true
	cq.d.journal.remove(kindCQ, cq.handle)
	cq.d.mu.Lock()
	delete(cq.d.cqs, cq)
	cq.d.mu.Unlock()
	cq.d.notify.forget(cq)
	cq.watchers.Wake() // a set still holding it (Device.Close) learns it is gone
	return cq.d.freeRing(cq.buf, cq.data)
}

// fail makes every later Poll return err and wakes the CQ's waiter and
// watchers, which find it ready (Poll then reports the error).
func (cq *CQ) fail(err error) {
	cq.failErr.CompareAndSwap(nil, &err)
	cq.d.notify.signal(cq)
}

// rekey gives the CQEs of the QP keyed key (its handle, masked) that the
// ring holds, unpolled, the key alias (a number no device QP has, tagged
// aliasTag) instead: they are a destroyed QP's, and the device may give
// its handle to the next QP created. It holds the gate while it scans: the
// poller waits a moment.
func (cq *CQ) rekey(key, alias uint32) {
	cq.gate.Hold()
	defer cq.gate.Unhold()
	if cq.gate.IsShut() {
		return
	}
	ready, err := cq.cons.Ready()
	if err != nil {
		return // the poller reports the fault
	}
	var e rings.CQE
	for i := 0; i < ready; i++ {
		slot := cq.data[cq.cons.Slot(i)*CQESize:]
		rings.DecodeCQE(slot, &e)
		if cq.cqeKey(e.QP) != key || e.QP>>32 == aliasTag {
			continue
		}
		e.QP = aliasTag<<32 | uint64(alias)
		rings.PutCQE(slot, &e)
	}
}

// cqeKey returns the QP table key of a CQE's qp field: the device's QP
// handle, masked; or an alias rekey wrote, whole.
func (cq *CQ) cqeKey(qp uint64) uint32 {
	if qp>>32 == aliasTag {
		return uint32(qp)
	}
	return uint32(qp) & cq.qpMask
}

func (cq *CQ) hold(n int) {
	cq.mu.Lock()
	cq.users += n
	cq.mu.Unlock()
}

// WC is a work completion.
type WC struct {
	WRID   uint64
	Status WCStatus
	// Opcode is the completed operation, as the device reports it: WCSend,
	// WCRDMAWrite, WCRDMARead, WCCompSwap, WCFetchAdd on the send queue;
	// WCRecv, or WCRecvRDMAWithImm for a receive an RDMA WRITE WITH IMM
	// consumed. QEMU 7.2 reports WCSend and WCRecv only. Flush completions
	// (WCFlushErr) carry WCSend or WCRecv.
	Opcode    WCOpcode
	ByteLen   uint32 // received bytes (UD: UDHeaderRoom included)
	QPN       uint32 // the QP's number (QP.QPN), whatever handle the device named it by
	SrcQP     uint32 // receives: the sender's QPN
	Flags     uint32 // WC flags (WCFlagGRH, WCFlagWithImm, ...)
	VendorErr uint32 // the device's detail for an error status
	Imm       uint32 // with WCFlagWithImm: the sender's SendWR.Imm
}

// HasImm reports whether the completion carries immediate data in Imm (a
// receive of a SEND or RDMA WRITE with immediate).
func (w *WC) HasImm() bool { return w.Flags&WCFlagWithImm != 0 }

// WCStatus is a completion's status; WCOpcode its operation.
type (
	WCStatus = rings.WCStatus
	WCOpcode = rings.WCOpcode
)

// Completion statuses, opcodes and flags callers branch on (rings has
// them all).
const (
	WCSuccess      WCStatus = rings.WCSuccess
	WCLocLenErr    WCStatus = rings.WCLocLenErr
	WCProtErr      WCStatus = rings.WCLocProtErr
	WCFlushErr     WCStatus = rings.WCWRFlushErr
	WCLocAccessErr WCStatus = rings.WCLocAccessErr
	WCRemInvReq    WCStatus = rings.WCRemInvReqErr
	WCRemAccessErr WCStatus = rings.WCRemAccessErr // the peer's rkey, bounds or MR rights refused a one-sided operation
	WCRemOpErr     WCStatus = rings.WCRemOpErr
	WCGeneral      WCStatus = rings.WCGeneralErr

	WCSend            WCOpcode = rings.WCSend
	WCRDMAWrite       WCOpcode = rings.WCRDMAWrite
	WCRDMARead        WCOpcode = rings.WCRDMARead
	WCCompSwap        WCOpcode = rings.WCCompSwap
	WCFetchAdd        WCOpcode = rings.WCFetchAdd
	WCRecv            WCOpcode = rings.WCRecv
	WCRecvRDMAWithImm WCOpcode = rings.WCRecvRDMAWithImm

	WCFlagGRH     = rings.WCFlagGRH
	WCFlagWithImm = rings.WCFlagWithImm
)

// Poll moves up to len(wcs) completions into wcs and returns how many. It
// reads the device's index once, validates it (an index out of range is an
// error wrapping ErrDeviceFault, and nothing is consumed), decodes the
// CQEs, accounts each to its QP's queue, and consumes them with one store.
// Completions the driver makes for flushed requests follow once the ring
// holds nothing more. On a device that honours signaling, Poll also
// retires the unsignaled sends the device has consumed on the QPs it is
// the send CQ of (QP.Outstanding): one read of each such send queue's
// consumer index, while the device has sends of it to consume. An empty
// poll rings no doorbell (Options.PollDoorbell restores the reference
// provider's POLL doorbell there). Poll does not allocate. A CQ in
// CQCounted mode refuses Poll with an error wrapping ErrBusy.
func (cq *CQ) Poll(wcs []WC) (int, error) {
	if m := cq.Mode(); m != CQPolled {
		return 0, cq.d.opErr("poll CQ", cq.wrongMode(m, "the counters driving it take its completions; CQ.SetMode(CQPolled) to poll it"))
	}
	if !cq.gate.Enter() && !cq.enterSlow() {
		return 0, cq.errClosed("poll CQ")
	}
	n, err := cq.poll(wcs)
	cq.gate.Exit()
	return n, err
}

// enterSlow waits out a holder of the gate (rekey: a moment) and reports
// false once the CQ is shut.
//
//go:noinline
func (cq *CQ) enterSlow() bool { return cq.gate.EnterWait() }

// enter admits a call other than Poll.
func (cq *CQ) enter() bool { return cq.gate.Enter() || cq.enterSlow() }

// syncEvery is how many CQEs a CQ consumes between looks at the
// notification ring's fill.
const syncEvery = 64

// poll is Poll inside the gate.
func (cq *CQ) poll(wcs []WC) (int, error) {
	cq.stats.Polls++
	if e := cq.failErr.Load(); e != nil {
		return 0, cq.d.opErr("poll CQ", fmt.Errorf("CQ %d: %w", cq.handle, *e))
	}
	ready, err := cq.cons.Ready()
	if err != nil {
		return 0, cq.d.opErr("poll CQ", err)
	}
	if ready == 0 && cq.d.pollsWithDoorbell() {
		if ready, err = cq.pollDoorbell(); err != nil {
			return 0, err
		}
	}
	take := min(ready, len(wcs))
	n := 0
	var e rings.CQE
	// The QP of the last CQE and the queue it touched: a run of CQEs of
	// one QP looks it up once per call. The CQE names the QP by handle
	// (the QPN below version 20); WC.QPN is its number.
	var qp *QP
	var key uint32
	var last *wq.Queue
	for i := 0; i < take; i++ {
		rings.DecodeCQEWork(cq.data[cq.cons.Slot(i)*CQESize:], &e)
		if k := cq.cqeKey(e.QP); qp == nil || k != key {
			qp, key = cq.d.qpns.Lookup(k), k
		}
		if qp == nil || !cq.account(qp, &e, &last) {
			cq.stats.Dropped++
			continue
		}
		if e.Status != rings.WCSuccess {
			qp.failedBy(e.Status)
		}
		// Field by field: a composite literal is built on the stack and
		// copied in 16-byte moves that stall on the 4-byte stores.
		w := &wcs[n]
		w.WRID, w.Status, w.Opcode, w.ByteLen = e.WRID, WCStatus(e.Status), WCOpcode(e.Opcode), e.ByteLen
		w.QPN, w.SrcQP, w.Flags, w.VendorErr, w.Imm = qp.qpn, e.SrcQP, e.WCFlags, e.VendorErr, e.Imm
		n++
	}
	cq.publishHeads()
	if cq.reapPending.Load() {
		cq.reap()
	}
	if take > 0 {
		cq.cons.Consume(take)
		cq.stats.CQEs += uint64(take)
		if cq.sinceSync += take; cq.sinceSync >= syncEvery {
			cq.sinceSync = 0
			cq.d.notify.syncIfFilling()
		}
	}
	if take == ready && n < len(wcs) && cq.flushPending.Load() {
		n += cq.emitFlushes(wcs[n:])
	}
	if n == 0 {
		cq.stats.Empty++
	}
	return n, nil
}

// account removes the completed request from what its queue (of qp) has
// outstanding. It reports false for a completion of nothing outstanding: a
// late one for a request already flushed. *last is the queue the call's
// previous completion touched.
func (cq *CQ) account(qp *QP, e *rings.CQE, last **wq.Queue) bool {
	w, c := &qp.sq, qp.sendCntr
	if e.Opcode&rings.WCRecv != 0 {
		c = qp.recvCntr
		if qp.srqm != nil {
			if !qp.srq.q.Complete(qp.srqm, e.WRID) { // shared: published under its lock
				return false
			}
			if c != nil {
				countOn(c, e.Status)
			}
			return true
		}
		w = &qp.rq
	}
	ok := false
	if e.Status == rings.WCSuccess {
		ok = w.Complete(e.WRID)
	} else if ok = w.CompleteErr(e.WRID); !ok && w.Selective() && !w.Flushing() { // unsignaled sends fail with a completion too
		// An unsignaled send a poll handed back once the device had
		// consumed it, failing after (a device that advances its index
		// when it fetches): its failure is reported all the same.
		ok = true
	}
	if !ok {
		return false
	}
	if w != *last {
		cq.touch(w)
		*last = w
	}
	if c != nil {
		countOn(c, e.Status)
	}
	return true
}

// addReap asks the CQ's next poll to reap qp's send queue.
func (cq *CQ) addReap(qp *QP) {
	cq.rmu.Lock()
	cq.reaps = append(cq.reaps, qp)
	cq.reapPending.Store(true)
	cq.rmu.Unlock()
}

// dropReap forgets qp's reap requests; a reap under way finishes first.
func (cq *CQ) dropReap(qp *QP) {
	cq.rmu.Lock()
	defer cq.rmu.Unlock()
	kept := cq.reaps[:0]
	for _, q := range cq.reaps {
		if q != qp {
			kept = append(kept, q)
		}
	}
	clear(cq.reaps[len(kept):])
	cq.reaps = kept
}

// reap hands back, for the QPs that asked, the send slots of the
// unsignaled sends the device consumed (poller side: it touches the send
// queues' records). A QP stays in the reaps while the device has sends of
// it to consume, so every poll reaps it until then. A QP out of RTS is
// left alone: a device that fails or flushes it completes its sends
// itself, and Close flushes the rest.
func (cq *CQ) reap() {
	cq.rmu.Lock()
	defer cq.rmu.Unlock()
	kept := cq.reaps[:0]
	for _, qp := range cq.reaps {
		if qp.State() != StateRTS {
			continue
		}
		n, keep := qp.sq.Reap()
		if n != 0 {
			qp.sq.PublishHead()
		}
		if keep {
			kept = append(kept, qp) // in place: no allocation
		}
	}
	clear(cq.reaps[len(kept):])
	cq.reaps = kept
	if len(kept) == 0 {
		cq.reapPending.Store(false)
	}
}

// countOn counts a completion on a QP's counter.
func countOn(c *event.Counter, status uint32) {
	if status == uint32(WCSuccess) {
		c.Count(1)
	} else {
		c.CountErr(1)
	}
}

// touch notes a queue whose completions the poll counted. A poll usually
// touches one or two; past the room kept, the oldest is published now.
func (cq *CQ) touch(w *wq.Queue) {
	for i := 0; i < cq.nTouched; i++ {
		if cq.touched[i] == w {
			return
		}
	}
	if cq.nTouched == len(cq.touched) {
		cq.publishHeads()
	}
	cq.touched[cq.nTouched] = w
	cq.nTouched++
}

// publishHeads shows the posters of the touched queues their completions.
func (cq *CQ) publishHeads() {
	for i := 0; i < cq.nTouched; i++ {
		cq.touched[i].PublishHead()
		cq.touched[i] = nil
	}
	cq.nTouched = 0
}

// flushSource is a queue whose outstanding requests a CQ completes with
// WR_FLUSH_ERR: a destroyed (or failed) QP's send or receive queue, or a
// destroyed SRQ's receives (srq set, qp nil).
type flushSource struct {
	qp  *QP
	w   *wq.Queue
	srq *SRQ
	op  WCOpcode
	// cons is the device's last consumer index of a QP's send queue,
	// which wq.Queue.BeginFlush takes before the first pop: the
	// unsignaled sends the device consumed are retired, not flushed.
	cons uint32
}

func (f *flushSource) pop() (uint64, bool) {
	if f.srq != nil {
		return f.srq.q.PopFlush()
	}
	if !f.w.Flushing() {
		f.w.BeginFlush(f.cons)
	}
	return f.w.PopFlush()
}

func (f *flushSource) remaining() int {
	if f.srq != nil {
		return f.srq.q.Available()
	}
	return f.w.OutstandingP()
}

// addFlush makes the CQ complete f's outstanding requests with
// WR_FLUSH_ERR.
func (cq *CQ) addFlush(f flushSource) {
	cq.fmu.Lock()
	cq.flushing = append(cq.flushing, f)
	cq.fmu.Unlock()
	cq.flushPending.Store(true)
	cq.d.notify.signal(cq) // a waiter or watcher has something to poll
}

// emitFlushes fills wcs with flush completions.
func (cq *CQ) emitFlushes(wcs []WC) int {
	cq.fmu.Lock()
	defer cq.fmu.Unlock()
	n := 0
	for len(cq.flushing) > 0 && n < len(wcs) {
		f := &cq.flushing[0]
		var qpn uint32
		if f.qp != nil {
			qpn = f.qp.qpn
		}
		n0 := n
		for n < len(wcs) {
			id, ok := f.pop()
			if !ok {
				break
			}
			wcs[n] = WC{WRID: id, Status: WCFlushErr, Opcode: f.op, QPN: qpn}
			n++
		}
		if f.qp != nil && n > n0 {
			c := f.qp.sendCntr
			if f.op == WCRecv {
				c = f.qp.recvCntr
			}
			if c != nil {
				c.CountErr(uint64(n - n0))
			}
		}
		if f.remaining() > 0 {
			break
		}
		qp := f.qp
		cq.flushing = cq.flushing[1:]
		if qp != nil && qp.sq.OutstandingP() == 0 && qp.rq.OutstandingP() == 0 && qp.State() == StateErr {
			cq.d.forgetQPN(qp)
		}
	}
	if len(cq.flushing) == 0 {
		cq.flushPending.Store(false)
	}
	cq.stats.Flushed += uint64(n)
	return n
}

// pollDoorbell is an empty poll's POLL doorbell (Options.PollDoorbell),
// when due, and the ring's fill after it. StopPollDoorbell waits for the
// polls counted in pollRinging: one that finds the doorbell stopped rings
// nothing.
func (cq *CQ) pollDoorbell() (int, error) {
	d := cq.d
	d.pollRinging.Add(1)
	defer d.pollRinging.Add(-1)
	if !d.pollsWithDoorbell() || d.nArmed.Load() != 0 && !d.noneArmedOnDevice() || !cq.pollDue() {
		return 0, nil
	}
	cq.stats.Doorbells++
	if err := doorbell.Ring(d.uar, doorbell.OffsetCQ, doorbell.CQPoll|cq.handle); err != nil {
		return 0, d.opErr("poll CQ", err)
	}
	ready, err := cq.cons.Ready()
	if err != nil {
		return 0, d.opErr("poll CQ", err)
	}
	return ready, nil
}

// pollDue reports whether an empty poll rings the POLL doorbell now: on
// every one, or once per the device's pace (Options.PollPace).
func (cq *CQ) pollDue() bool {
	pace := cq.d.pollPace
	if pace <= 0 {
		return true
	}
	now := time.Now()
	if now.Sub(cq.lastPoll) < pace {
		return false
	}
	cq.lastPoll = now
	return true
}

// Stats returns the poller's counts. It is safe for concurrent use with
// Poll, Wait and the rest: it holds the CQ's gate for the copy (a Poll
// starting meanwhile waits that long), so the poll path pays nothing for
// it. Do not call it from a callback that Poll runs (OnLowWatermark).
func (cq *CQ) Stats() CQStats {
	cq.gate.Hold()
	st := cq.stats
	cq.gate.Unhold()
	st.Doorbells += cq.arms.Load()
	st.Interrupts = cq.interrupts.Load()
	st.Spun = cq.spun.Load()
	return st
}

// quietWait is how much longer a QP's destroy waits for the CQ to have
// had no CQE written for grace (QP.awaitQuietCQs): zero or less when it
// has. A producer index that moved, or the first look, restarts the
// clock. A nil CQ is quiet.
func (cq *CQ) quietWait(grace time.Duration) time.Duration {
	if cq == nil {
		return 0
	}
	cq.qmu.Lock()
	defer cq.qmu.Unlock()
	now := time.Now()
	if p := cq.st.ProdTail(); cq.quietSince.IsZero() || p != cq.quietProd {
		cq.quietProd, cq.quietSince = p, now
	}
	return grace - now.Sub(cq.quietSince)
}

// pendingSends counts the send completions of the QP with handle h that
// the device has written and no Poll has consumed yet: a look at the ring
// from the published counters, beside a poller, for QP.awaitSends. A CQ
// being closed counts as holding them all.
func (cq *CQ) pendingSends(h uint32) int {
	if !cq.enter() {
		return math.MaxInt
	}
	defer cq.gate.Exit()
	n := uint32(cq.entries)
	cons := cq.st.ConsHead()
	avail := (cq.st.ProdTail() - cons) & (2*n - 1)
	if avail > n {
		return math.MaxInt // an index out of range: Poll reports it; do not wait
	}
	var e rings.CQE
	count := 0
	for i := range avail {
		rings.DecodeCQEWork(cq.data[((cons+i)%n)*CQESize:], &e)
		if uint32(e.QP) == h && rings.WCOpcode(e.Opcode) != rings.WCRecv && rings.WCOpcode(e.Opcode) != rings.WCRecvRDMAWithImm {
			count++
		}
	}
	return count
}
