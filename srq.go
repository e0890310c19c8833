package vfrdma

import (
	"context"
	"fmt"
	"math/bits"
	"sync"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/rings"
	"github.com/vfrdma/vfrdma/srq"
	"github.com/vfrdma/vfrdma/vfio"
)

// SRQConfig describes a shared receive queue. Zero fields mean defaults.
type SRQConfig struct {
	// Depth is how many receives it accepts outstanding (SRQ.Outstanding;
	// default 64). Resize changes it.
	Depth int
	// MaxDepth is the most Resize may grow it to: the ring the driver
	// reserves at creation, rounded up to a power of two (default: Depth).
	// The device cannot resize an SRQ (QEMU refuses MODIFY_SRQ max_wr, and
	// so does Linux), so the ring is reserved whole up front.
	MaxDepth int
	// SGE is the SGEs per receive (1 to the device's max_srq_sge; default 1).
	SGE int
	// LowWatermark arms the low watermark at creation (0: disarmed); see
	// SRQ.SetLowWatermark. The new SRQ is empty: it fires with the first
	// completion that leaves fewer available, not at once.
	LowWatermark int
	// OnLowWatermark, if set, receives each low-watermark event, on the
	// goroutine whose CQ.Poll reaped the completion that crossed the line
	// (or that called SetLowWatermark below it).
	// It must not block. SRQ.LowWatermarkEvents is the channel alternative.
	OnLowWatermark func(SRQEvent)
	// CQ is the CQ of the SRQ's receive completions, where its flush
	// completions go when it is closed (default: the receive CQ of the
	// first QP created with it). On QEMU 7.2 every QP of the SRQ must use
	// it as its receive CQ.
	CQ *CQ
}

// SRQEvent is a low-watermark event: the receives available dropped below
// the watermark.
type SRQEvent = srq.Event

// SRQSnapshot is a consistent view of an SRQ (uDAPL dat_srq_query): depth,
// ring size, SGEs, watermark, receives available, and what each QP
// consumed.
type SRQSnapshot = srq.Snapshot

// SRQQPView is one QP's part of an SRQSnapshot.
type SRQQPView = srq.QPView

// SRQ is a shared receive queue (uDAPL's SRQ semantics): receives posted
// once, consumed by any QP created with it (QPConfig.SRQ); each QP's
// receives complete in the order of its peer's sends, with no order across
// QPs. Every receive posted completes exactly once: consumed by a QP, or
// flushed (WR_FLUSH_ERR, QPN 0) on the SRQ's CQ when the SRQ is closed. A
// QP of the SRQ that goes to ERR or is closed leaves the receives it did
// not take on the SRQ, for the other QPs.
//
// An SRQ is safe for concurrent use: many goroutines may post to it while
// CQ pollers report its completions. It follows the lifecycle rule
// (doc.go): a post racing Close completes or is refused with ErrClosed,
// and the ring is freed once no post is inside.
//
// The low watermark is raised by the driver from its own counts, on every
// device, when the CQ poll that reaps the crossing completion runs: QEMU
// 7.2 never sends the device's SRQ-limit event, and the driver's counts are
// exact. The device's own limit is not armed, so the event comes once per
// arming whatever the device does.
//
// QEMU 7.2 stamps the receiving CQ into each SRQ receive when it is posted,
// taking it from the most recently created QP of the SRQ. So on QEMU
// (Quirks.Emulated) receives can be posted only once a QP uses the SRQ, and
// every QP of one SRQ must share its receive CQ.
type SRQ struct {
	pd     *PD
	d      *Device
	handle uint32
	buf    *vfio.DMABuffer
	q      *srq.Queue

	mu     sync.Mutex
	closed bool
	cq     *CQ // the CQ of its receive completions, held; nil until known
}

// CreateSRQ creates a shared receive queue.
func (pd *PD) CreateSRQ(ctx context.Context, cfg *SRQConfig) (*SRQ, error) {
	d := pd.d
	const op = "create SRQ"
	if err := pd.enter(); err != nil {
		return nil, d.opErr(op, err)
	}
	defer pd.exit()
	var c SRQConfig
	if cfg != nil {
		c = *cfg
	}
	if d.caps.MaxSRQ == 0 {
		return nil, d.opErr(op, fmt.Errorf("%w: the device has no SRQs", ErrNotSupported))
	}
	if c.Depth == 0 {
		c.Depth = DefaultQueueDepth
	}
	if c.MaxDepth == 0 {
		c.MaxDepth = c.Depth
	}
	if c.SGE == 0 {
		c.SGE = 1
	}
	if c.SGE < 1 || c.SGE > int(d.caps.MaxSRQSGE) {
		return nil, d.opErr(op, invalidf("%d SGEs per receive: want 1 to %d", c.SGE, d.caps.MaxSRQSGE))
	}
	stride := rings.RecvStride(c.SGE)
	limit := d.MaxSRQDepth(c.SGE)
	if c.MaxDepth < 1 || c.MaxDepth > limit {
		return nil, d.opErr(op, invalidf("SRQ maximum depth %d: want 1 to %d", c.MaxDepth, limit))
	}
	if c.Depth < 1 || c.Depth > c.MaxDepth {
		return nil, d.opErr(op, invalidf("SRQ depth %d: want 1 to the maximum depth, %d", c.Depth, c.MaxDepth))
	}
	if c.LowWatermark < 0 || c.LowWatermark > c.Depth {
		return nil, d.opErr(op, invalidf("low watermark %d: want 0 to the depth, %d", c.LowWatermark, c.Depth))
	}
	if c.CQ != nil && c.CQ.d != d {
		return nil, d.opErr(op, invalidf("the CQ belongs to another device"))
	}
	slots := pow2(c.MaxDepth)
	pages := (slots*stride + firmware.PageSize - 1) / firmware.PageSize
	buf, err := d.allocRing(pages)
	if err != nil {
		return nil, d.opErr(op, err)
	}
	h, err := d.ch.CreateSRQ(ctx, firmware.CreateSRQRequest{
		PDirDMA:  bufPage(buf, ringPgDir).DMA,
		PDHandle: pd.handle,
		NChunks:  uint32(1 + pages),
		Attr:     firmware.SRQAttr{MaxWR: uint32(slots), MaxSGE: uint32(c.SGE)},
	})
	if err != nil {
		buf.Close()
		return nil, d.opErr(op, err)
	}
	name := fmt.Sprintf("SRQ %d", h)
	q, err := srq.New(srq.Config{
		Name: name,
		// The SRQ's ring state sits at offset 8 of its state page.
		State:          bufPage(buf, ringPgState).Mem[8:16],
		Data:           buf.Mem[ringPgData*firmware.PageSize:][:pages*firmware.PageSize],
		Stride:         stride,
		Slots:          slots,
		Register:       d.uar,
		Offset:         doorbell.OffsetSRQ,
		Value:          doorbell.SRQRecv | h&doorbell.HandleMask,
		Depth:          c.Depth,
		MaxSGE:         c.SGE,
		PD:             pd.handle,
		Keys:           &d.lkeys,
		NeedMember:     d.emulated || c.CQ == nil,
		LowWatermark:   c.LowWatermark,
		OnLowWatermark: c.OnLowWatermark,
	})
	if err != nil {
		d.ch.DestroySRQ(ctx, h)
		buf.Close()
		return nil, d.opErr(op, err)
	}
	s := &SRQ{pd: pd, d: d, handle: h, buf: buf, q: q, cq: c.CQ}
	d.journal.add(kindSRQ, h)
	d.mu.Lock()
	d.srqs[s] = struct{}{}
	d.mu.Unlock()
	pd.hold(+1)
	if s.cq != nil {
		s.cq.hold(+1)
	}
	return s, nil
}

// MaxSRQDepth returns the largest SRQ ring the driver creates for receives
// of sge SGEs: the device's max_srq_wr, within the pages one SRQ ring may
// span (127 data pages on QEMU 7.2), as a power of two.
func (d *Device) MaxSRQDepth(sge int) int {
	n := min(int(d.caps.MaxSRQWR), (maxQueuePages-1)*firmware.PageSize/rings.RecvStride(sge))
	if n < 1 {
		return 0
	}
	return 1 << (bits.Len(uint(n)) - 1)
}

// Handle returns the device's handle of the SRQ.
func (s *SRQ) Handle() uint32 { return s.handle }

// Depth returns how many receives the SRQ accepts.
func (s *SRQ) Depth() int { return s.q.Depth() }

// MaxDepth returns the most Resize allows: the ring reserved at creation.
func (s *SRQ) MaxDepth() int { return s.q.Slots() }

// Outstanding returns how many receives are outstanding on the SRQ
// (doc.go: posted and not yet handed back by a Poll): a receive a QP
// consumed counts until the Poll that returns its completion, and after
// Close until the Poll that returns its WR_FLUSH_ERR. PostRecv refuses a
// receive with ErrQueueFull once Outstanding reaches Depth; it is the
// count SRQSnapshot.Available and the low watermark look at.
func (s *SRQ) Outstanding() int { return s.q.Available() }

// DoorbellStats returns the SRQ's post and doorbell counts.
func (s *SRQ) DoorbellStats() doorbell.Stats { return s.q.Doorbell() }

// Query returns a snapshot of the SRQ, taken under one lock. Each QP's
// Allocated and Span are UnknownCount (QP.CanQueryRecv): the device names
// the QP that took a receive only in its completion.
func (s *SRQ) Query() SRQSnapshot { return s.q.Query() }

// SetLowWatermark arms the low watermark at n receives (0 disarms it). The
// first time fewer than n receives are available, one SRQEvent is raised
// (to SRQConfig.OnLowWatermark and LowWatermarkEvents) and the watermark
// disarms: it must be set again to fire again. That is when CQ.Poll reaps
// the completion that crosses the line, or, armed while fewer than n are
// available already, during this call (dat_srq_set_lw's rule).
func (s *SRQ) SetLowWatermark(n int) error {
	return s.d.opErr("set SRQ low watermark", s.q.SetLowWatermark(n))
}

// LowWatermarkEvents returns the channel of low-watermark events. It holds
// one: read it before arming the watermark again.
func (s *SRQ) LowWatermarkEvents() <-chan SRQEvent { return s.q.LowWatermarkEvents() }

// Resize sets how many receives the SRQ accepts, from 1 to MaxDepth (the
// ring reserved at creation: the device itself cannot resize). Shrinking
// below the receives outstanding is refused with an error wrapping ErrBusy.
func (s *SRQ) Resize(n int) error {
	return s.d.opErr("resize SRQ", s.q.Resize(n))
}

// checkAttach checks that a QP with receive CQ cq may use the SRQ; see the
// type's doc for QEMU's rule on receive CQs.
func (s *SRQ) checkAttach(cq *CQ) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.d.emulated && s.cq != nil && s.cq != cq {
		return fmt.Errorf("%w: the QPs of SRQ %d must use its receive CQ %d on QEMU 7.2 (it sends every SRQ completion to the CQ of the newest QP)", ErrNotSupported, s.handle, s.cq.handle)
	}
	return nil
}

// attach records a QP created with the SRQ.
func (s *SRQ) attach(qp *QP) (*srq.Member, error) {
	if err := s.checkAttach(qp.recvCQ); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := s.q.Attach(qp.qpn)
	if err != nil {
		return nil, err
	}
	if s.cq == nil {
		s.cq = qp.recvCQ
		s.cq.hold(+1)
	}
	return m, nil
}

// PostRecv posts receives to the SRQ as one chain, like QP.PostRecv: each
// is checked before it touches the ring, and unless flags has FlagDefer one
// doorbell hands the chain to the device. A refused receive stops the call
// with a *PostError wrapping a distinct sentinel: ErrClosed (a closed SRQ),
// ErrQueueFull (Depth receives outstanding), ErrInvalid (too many SGEs, a
// segment outside its MR, no QP yet), ErrProtection (an MR of another PD),
// ErrPrivileges (an unknown lkey, an MR without local write); it makes no
// completion, and what came before it still goes to the device. A receive
// with no SGEs takes a zero-size message. Segments are filled in order:
// front ones whole, at most one in part, the rest untouched. PostRecv does
// not allocate.
func (s *SRQ) PostRecv(wrs []RecvWR, flags PostFlags) (int, error) {
	return s.q.Post(wrs, flags&FlagDefer != 0)
}

// Ring rings the doorbell for the receives posted with FlagDefer and not
// yet handed to the device. On a closed SRQ it returns ErrClosed; a
// doorbell store that fails is its error, and the receives stay deferred
// for the next ring.
func (s *SRQ) Ring() error { return s.q.Ring() }

// Close destroys the SRQ. The QPs using it must be closed first (ErrBusy
// otherwise). The receives still posted complete with WR_FLUSH_ERR on the
// SRQ's CQ (poll them after Close). It is idempotent.
func (s *SRQ) Close() error {
	return s.d.closeObject("destroy SRQ", s.destroy)
}

// shut refuses the SRQ's posts from now on (those under way finish first:
// they hold the queue's lock): Device.Close, whatever its DESTROY answered.
func (s *SRQ) shut() { s.q.Close() }

func (s *SRQ) destroy(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	if n := s.q.Members(); n > 0 {
		return fmt.Errorf("%w: %d QPs still use SRQ %d; close them first", ErrBusy, n, s.handle)
	}
	// No post runs while the device destroys the SRQ: none rings a
	// doorbell for a handle the device may give again, or writes the ring
	// after it is freed. If the device refuses, the SRQ is as it was.
	left, err := s.q.CloseAfter(func() error { return s.d.ch.DestroySRQ(ctx, s.handle) })
	if err != nil {
		return err
	}
	s.closed = true
	s.d.journal.remove(kindSRQ, s.handle)
	s.d.mu.Lock()
	delete(s.d.srqs, s)
	s.d.mu.Unlock()
	s.pd.hold(-1)
	if s.cq != nil {
		if left > 0 {
			s.cq.addFlush(flushSource{srq: s, op: WCRecv})
		}
		s.cq.hold(-1)
	}
	return s.d.freeRing(s.buf)
}
