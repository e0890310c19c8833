package bridge

import (
	"sync/atomic"

	"github.com/vfrdma/vfrdma"
)

// Selective signaling on a device that completes every send.
//
// The verbs' rule: on a QP created with sq_sig_all 0, a send posted
// without IBV_SEND_SIGNALED makes a completion only if it fails. QEMU's
// device completes every send whatever its flags (the driver hands every
// one back: vfrdma's doc, "Signaling"), and programs count on the rule:
// perftest signals one send in cq_mod and counts cq_mod sends per
// completion, so extra completions push its count past what it posted and
// it stops posting. There the drop-in keeps, per such QP, the signaled
// flag of each send in flight, in posting order (the device completes a
// QP's sends in that order, and the driver flushes them in it), and Poll
// drops the successful completions of the unsignaled ones.

// sigRing is a QP's record of its sends in flight: their wr_ids and
// whether each was signaled. One poster (under the QP's sendMu) pushes,
// one poller (under the send CQ's mu) pops; tail and head are published
// with atomics. Pushes come before the requests reach the device (a
// completion can be polled before PostSend returns), and those the device
// refused are taken back at once: the poller pops only on completions,
// which only posted requests make, and those are older.
type sigRing struct {
	qpn    uint32
	wrid   []uint64
	sig    []bool
	mask   uint32
	head   atomic.Uint32 // pops (poller)
	tail   atomic.Uint32 // pushes (poster)
	hidden atomic.Uint64 // completions dropped: for tests
}

func newSigRing(qpn uint32, depth int) *sigRing {
	n := 1
	for n < 2*depth { // in flight (at most depth) and one post call's pushes
		n <<= 1
	}
	return &sigRing{qpn: qpn, wrid: make([]uint64, n), sig: make([]bool, n), mask: uint32(n - 1)}
}

// push records the k-th request of a post call (poster side; published by
// publish).
func (r *sigRing) push(k int, wrid uint64, signaled bool) {
	i := (r.tail.Load() + uint32(k)) & r.mask
	r.wrid[i], r.sig[i] = wrid, signaled
}

// publish makes the post call's first n pushes visible to the poller.
func (r *sigRing) publish(n int) { r.tail.Add(uint32(n)) }

// hide reports whether the completion of wrid with status st is an
// unsignaled send's success, which the program must not see, and retires
// its record (poller side). A completion whose wr_id is not the oldest's
// retires the records before the first that has it (the device completed
// those without a word); one no record has is shown.
func (r *sigRing) hide(wrid uint64, st vfrdma.WCStatus) bool {
	h, t := r.head.Load(), r.tail.Load()
	for k := h; k != t; k++ {
		if r.wrid[k&r.mask] != wrid {
			continue
		}
		sig := r.sig[k&r.mask]
		r.head.Store(k + 1)
		if !sig && st == vfrdma.WCSuccess {
			r.hidden.Add(1)
			return true
		}
		return false
	}
	return false
}

// sigRings maps a CQ's selective QPs (send CQ this one) by number; it is
// replaced whole when a QP comes or goes, so Poll reads it without a lock.
type sigRings = map[uint32]*sigRing

// addSig adds r to the CQ's selective QPs (under the context's objMu).
func (cq *CQ) addSig(r *sigRing) {
	m := sigRings{r.qpn: r}
	if old := cq.sig.Load(); old != nil {
		for k, v := range *old {
			m[k] = v
		}
	}
	cq.sig.Store(&m)
}

// dropSig removes QP qpn from them (under the context's objMu).
func (cq *CQ) dropSig(qpn uint32) {
	old := cq.sig.Load()
	if old == nil {
		return
	}
	m := sigRings{}
	for k, v := range *old {
		if k != qpn {
			m[k] = v
		}
	}
	if len(m) == 0 {
		cq.sig.Store(nil)
		return
	}
	cq.sig.Store(&m)
}

// filterSig drops from wcs the successful completions of unsignaled sends
// of the CQ's selective QPs and returns how many are left, in order.
func (cq *CQ) filterSig(wcs []vfrdma.WC) int {
	p := cq.sig.Load()
	if p == nil {
		return len(wcs)
	}
	m := *p
	n := 0
	for i := range wcs {
		w := &wcs[i]
		if w.Opcode&vfrdma.WCRecv == 0 {
			if r := m[w.QPN]; r != nil && r.hide(w.WRID, w.Status) {
				continue
			}
		}
		if n != i {
			wcs[n] = *w
		}
		n++
	}
	return n
}
