package bridge

import (
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/rings"
)

// pollScratch is how many completions one driver poll takes: a larger
// ibv_poll_cq polls again while each poll fills it.
const pollScratch = 64

// WC is a work completion with struct ibv_wc's meanings: the status and
// opcode numbering are the verbs' (the device's are the same), ImmBE is
// imm_data as the program reads it (network order in memory).
type WC struct {
	WRID      uint64
	Status    uint32
	Opcode    uint32
	VendorErr uint32
	ByteLen   uint32
	ImmBE     uint32
	QPN       uint32
	SrcQP     uint32
	Flags     uint32
}

// The ibv_wc_flags the device reports (the same bits).
const wcFlagsKnown = rings.WCFlagGRH | rings.WCFlagWithImm

// CQ is a completion queue (struct ibv_cq).
type CQ struct {
	ID   uint32
	User unsafe.Pointer // the C structure
	ctx  *Context
	cq   *vfrdma.CQ
	ch   *Channel
	fd   int // the CQ's own fd in its channel's epoll set, -1 without
	wcs  []vfrdma.WC
	out  []WC
	mu   sync.Mutex   // the scratch's: the verbs let many threads poll one CQ
	refs atomic.Int32 // QPs and SRQs using it

	// completion events handed out (ibv_get_cq_event) and acknowledged
	// (ibv_ack_cq_events)
	events, acked atomic.Uint32

	// sig holds the selective QPs whose send CQ this is, on a device
	// that completes every send (signal.go); nil when there are none.
	sig atomic.Pointer[sigRings]
}

// CreateCQ makes a CQ of at least cqe entries, with its events on ch if
// ch is not nil.
func (c *Context) CreateCQ(cqe int, ch *Channel) (*CQ, error) {
	caps := c.Dev.Caps()
	if cqe < 1 || uint32(cqe) > caps.MaxCQE {
		return nil, fmt.Errorf("%w: %d CQ entries (the device takes 1 to %d)", errInvalid, cqe, caps.MaxCQE)
	}
	ctx, cancel := cmdCtx()
	defer cancel()
	q, err := c.Dev.CreateCQ(ctx, cqe)
	if err != nil {
		return nil, err
	}
	cq := &CQ{ctx: c, cq: q, fd: -1, wcs: make([]vfrdma.WC, pollScratch), out: make([]WC, pollScratch)}
	if ch != nil {
		if err := ch.add(cq); err != nil {
			return nil, joinClose(err, q.Close)
		}
	}
	c.objMu.Lock()
	c.cqOf[q] = cq
	c.objMu.Unlock()
	cq.ID = cqs.put(cq)
	return cq, nil
}

// Entries is the CQ's capacity (ibv_cq.cqe).
func (cq *CQ) Entries() int { return cq.cq.Entries() }

// Handle is the device's handle of the CQ.
func (cq *CQ) Handle() uint32 { return cq.cq.Handle() }

// Poll polls at most max completions (at most pollScratch) and returns
// them in the CQ's scratch, which stays locked (the verbs let many threads
// poll one CQ) until EndPoll, which must follow. It allocates nothing.
func (cq *CQ) Poll(max int) ([]WC, error) {
	cq.mu.Lock()
	if max > len(cq.wcs) {
		max = len(cq.wcs)
	}
	if max <= 0 {
		return cq.out[:0], nil
	}
	n, err := cq.cq.Poll(cq.wcs[:max])
	for n > 0 {
		got := n
		if n = cq.filterSig(cq.wcs[:n]); n > 0 || got < max || err != nil {
			break
		}
		n, err = cq.cq.Poll(cq.wcs[:max]) // every one hidden: more may wait
	}
	for i := range n {
		w, o := &cq.wcs[i], &cq.out[i]
		o.WRID = w.WRID
		o.Status = uint32(w.Status)
		o.Opcode = uint32(w.Opcode)
		o.VendorErr = w.VendorErr
		o.ByteLen = w.ByteLen
		o.QPN = w.QPN
		o.SrcQP = w.SrcQP
		o.Flags = w.Flags & wcFlagsKnown
		o.ImmBE = 0
		if w.Flags&rings.WCFlagWithImm != 0 {
			o.ImmBE = bits.ReverseBytes32(w.Imm) // network order in memory (little-endian host)
		}
	}
	return cq.out[:n], err
}

// EndPoll gives the scratch of the last Poll back.
func (cq *CQ) EndPoll() { cq.mu.Unlock() }

// Capacity is the most one Poll returns.
func (cq *CQ) Capacity() int { return len(cq.wcs) }

// ReqNotify arms the CQ (ibv_req_notify_cq); on QEMU's device the POLL
// doorbell then waits until the arm is spent
// (Options.ArmBesidePollDoorbell). On a CQ with a channel the
// channel's next event for it comes with the next completion, or at once
// if completions are queued already; solicitedOnly then wakes for any
// completion (a spurious event, which the verbs allow).
func (cq *CQ) ReqNotify(solicitedOnly bool) error {
	if cq.ch != nil {
		return cq.ch.arm(cq)
	}
	return cq.cq.Arm(solicitedOnly)
}

// Destroy destroys the CQ; one QPs or SRQs use is EBUSY.
func (cq *CQ) Destroy() error {
	if cq.refs.Load() > 0 {
		return fmt.Errorf("%w: QPs use the CQ", vfrdma.ErrBusy)
	}
	if cq.ch != nil {
		cq.ch.remove(cq)
	}
	if err := cq.cq.Close(); err != nil {
		return err
	}
	cq.ctx.objMu.Lock()
	delete(cq.ctx.cqOf, cq.cq)
	cq.ctx.objMu.Unlock()
	cqs.del(cq.ID)
	return nil
}

// AckEvents acknowledges n completion events (ibv_ack_cq_events).
func (cq *CQ) AckEvents(n uint32) { cq.acked.Add(n) }

// Events returns the events handed out and those acknowledged.
func (cq *CQ) Events() (handed, acked uint32) { return cq.events.Load(), cq.acked.Load() }

func (cq *CQ) dropFD() {
	if cq.ch != nil {
		cq.ch.remove(cq)
	}
}

func joinClose(err error, close func() error) error {
	if cerr := close(); cerr != nil {
		return fmt.Errorf("%w (and undoing: %v)", err, cerr)
	}
	return err
}
