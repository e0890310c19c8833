package vfrdma

import (
	"context"
	"fmt"
	"sync"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/rings"
	"github.com/vfrdma/vfrdma/vfio"
)

// SRQConfig describes a shared receive queue. Zero fields mean defaults.
type SRQConfig struct {
	Depth int // receive entries (rounded up to a power of two; default 64)
	SGE   int // SGEs per receive (1 to the device's max_srq_sge; default 1)
}

// SRQ is a shared receive queue: receives posted once, consumed by any QP
// created with it (QPConfig.SRQ). PostRecv is single-owner; Close is safe
// for concurrent use with other objects' methods.
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
	wq     workQueue

	mu     sync.Mutex
	closed bool
	qps    int // QPs using it
	recvCQ *CQ // their receive CQ
}

// CreateSRQ creates a shared receive queue.
func (pd *PD) CreateSRQ(ctx context.Context, cfg *SRQConfig) (*SRQ, error) {
	d := pd.d
	const op = "create SRQ"
	if err := pd.check(); err != nil {
		return nil, d.opErr(op, err)
	}
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
	if c.SGE == 0 {
		c.SGE = 1
	}
	if c.SGE < 1 || c.SGE > int(d.caps.MaxSRQSGE) {
		return nil, d.opErr(op, invalidf("%d SGEs per receive: want 1 to %d", c.SGE, d.caps.MaxSRQSGE))
	}
	stride := rings.RecvStride(c.SGE)
	limit := min(int(d.caps.MaxSRQWR), (maxQueuePages-1)*firmware.PageSize/stride)
	if c.Depth < 1 || c.Depth > limit {
		return nil, d.opErr(op, invalidf("SRQ depth %d: want 1 to %d", c.Depth, limit))
	}
	c.Depth = pow2(c.Depth)
	pages := (c.Depth*stride + firmware.PageSize - 1) / firmware.PageSize
	buf, err := d.allocRing(pages)
	if err != nil {
		return nil, d.opErr(op, err)
	}
	h, err := d.ch.CreateSRQ(ctx, firmware.CreateSRQRequest{
		PDirDMA:  bufPage(buf, ringPgDir).DMA,
		PDHandle: pd.handle,
		NChunks:  uint32(1 + pages),
		Attr:     firmware.SRQAttr{MaxWR: uint32(c.Depth), MaxSGE: uint32(c.SGE)},
	})
	if err != nil {
		buf.Close()
		return nil, d.opErr(op, err)
	}
	s := &SRQ{pd: pd, d: d, handle: h, buf: buf}
	// The SRQ's ring state sits at offset 8 of its state page.
	state := bufPage(buf, ringPgState).Mem[8:16]
	data := buf.Mem[ringPgData*firmware.PageSize:][:pages*firmware.PageSize]
	if err := s.wq.initQueue(fmt.Sprintf("SRQ %d", h), d, state, data, stride, c.Depth, c.SGE, doorbell.OffsetSRQ, doorbell.SRQRecv|h&doorbell.HandleMask); err != nil {
		d.ch.DestroySRQ(ctx, h)
		buf.Close()
		return nil, d.opErr(op, err)
	}
	s.wq.recv = true
	d.journal.add(kindSRQ, h)
	d.mu.Lock()
	d.srqs[s] = struct{}{}
	d.mu.Unlock()
	pd.hold(+1)
	return s, nil
}

// Handle returns the device's handle of the SRQ.
func (s *SRQ) Handle() uint32 { return s.handle }

// Depth returns the number of receives the SRQ holds.
func (s *SRQ) Depth() int { return len(s.wq.wrids) }

// Outstanding returns how many receives are posted and not yet completed.
func (s *SRQ) Outstanding() int { return s.wq.outstanding() }

// DoorbellStats returns the SRQ's post and doorbell counts.
func (s *SRQ) DoorbellStats() doorbell.Stats { return s.wq.db.Stats() }

// attach records a QP created with the SRQ; see the type's doc for QEMU's
// rule on receive CQs.
func (s *SRQ) attach(cq *CQ) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.d.emulated && s.qps > 0 && s.recvCQ != cq {
		return fmt.Errorf("%w: the QPs of SRQ %d must share a receive CQ on QEMU 7.2 (it sends every SRQ completion to the CQ of the newest QP)", ErrNotSupported, s.handle)
	}
	s.qps++
	s.recvCQ = cq
	return nil
}

func (s *SRQ) detach() {
	s.mu.Lock()
	s.qps--
	s.mu.Unlock()
}

// PostRecv posts receives to the SRQ as one chain, like QP.PostRecv: each
// is checked before it touches the ring, and unless flags has FlagDefer
// one doorbell hands the chain to the device.
func (s *SRQ) PostRecv(wrs []RecvWR, flags PostFlags) (int, error) {
	w := &s.wq
	s.mu.Lock()
	closed, qps := s.closed, s.qps
	s.mu.Unlock()
	switch {
	case closed:
		return 0, w.fail(0, wrID(nil, wrs, 0), ErrClosed)
	case s.d.emulated && qps == 0:
		return 0, w.fail(0, wrID(nil, wrs, 0), invalidf("no QP uses SRQ %d yet: QEMU 7.2 takes the receiving CQ from its newest QP when a receive is posted", s.handle))
	}
	if _, err := w.prod.Free(); err != nil {
		return 0, w.fail(0, wrID(nil, wrs, 0), err)
	}
	for i := range wrs {
		wr := &wrs[i]
		if _, err := checkSGEs(s.d, s.pd, wr.SGEs, w.maxSGE); err != nil {
			return i, w.fail(i, wr.WRID, err)
		}
		if w.outstanding() >= len(w.wrids) {
			return i, w.fail(i, wr.WRID, ErrQueueFull)
		}
		w.write(nil, wr.SGEs, wr.WRID)
	}
	return len(wrs), w.end(flags)
}

// Flush rings the doorbell for receives posted with FlagDefer.
func (s *SRQ) Flush() error { return s.wq.db.Flush() }

// Close destroys the SRQ. The QPs using it must be closed first (ErrBusy
// otherwise). As with verbs, receives still posted are discarded: they make
// no completion. It is idempotent.
func (s *SRQ) Close() error {
	return s.d.closeObject("destroy SRQ", s.destroy)
}

func (s *SRQ) destroy(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	if s.qps > 0 {
		return fmt.Errorf("%w: %d QPs still use SRQ %d; close them first", ErrBusy, s.qps, s.handle)
	}
	if err := s.d.ch.DestroySRQ(ctx, s.handle); err != nil {
		return err
	}
	s.closed = true
	s.d.journal.remove(kindSRQ, s.handle)
	s.d.mu.Lock()
	delete(s.d.srqs, s)
	s.d.mu.Unlock()
	s.pd.hold(-1)
	return s.buf.Close()
}
