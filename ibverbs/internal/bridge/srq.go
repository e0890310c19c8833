package bridge

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/vfrdma/vfrdma"
)

// SRQ is a shared receive queue (struct ibv_srq).
type SRQ struct {
	ID    uint32
	User  unsafe.Pointer
	ctx   *Context
	pd    *PD
	srq   *vfrdma.SRQ
	sge   int
	refs  atomic.Int32 // QPs using it
	mu    sync.Mutex
	limit int // the armed limit (0: disarmed; the event disarms it)
	recvs recvScratch
	post  sync.Mutex // the scratch's; an SRQ may be posted from many threads
}

// SRQAttr is struct ibv_srq_attr.
type SRQAttr struct{ MaxWR, MaxSGE, Limit int }

// The ibv_srq_attr_mask bits.
const (
	SRQMaskMaxWR = 1 << 0
	SRQMaskLimit = 1 << 1
)

// CreateSRQ makes a shared receive queue of a.MaxWR receives of a.MaxSGE
// SGEs, its limit armed at a.Limit (0: not). Crossing the limit raises
// IBV_EVENT_SRQ_LIMIT_REACHED once and disarms it.
func (pd *PD) CreateSRQ(a SRQAttr) (*SRQ, error) {
	caps := pd.ctx.Dev.Caps()
	if a.MaxWR < 1 || a.MaxWR > pd.ctx.Dev.MaxSRQDepth(max(a.MaxSGE, 1)) || a.MaxSGE > int(caps.MaxSRQSGE) || a.Limit < 0 || a.Limit > a.MaxWR {
		return nil, fmt.Errorf("%w: SRQ of %d receives of %d SGEs, limit %d (the device takes %d of up to %d SGEs)",
			errInvalid, a.MaxWR, a.MaxSGE, a.Limit, pd.ctx.Dev.MaxSRQDepth(max(a.MaxSGE, 1)), caps.MaxSRQSGE)
	}
	s := &SRQ{ctx: pd.ctx, pd: pd, sge: max(a.MaxSGE, 1), limit: a.Limit}
	ctx, cancel := cmdCtx()
	defer cancel()
	q, err := pd.pd.CreateSRQ(ctx, &vfrdma.SRQConfig{Depth: a.MaxWR, SGE: s.sge, LowWatermark: a.Limit,
		OnLowWatermark: func(vfrdma.SRQEvent) { s.limitReached() }})
	if err != nil {
		return nil, err
	}
	s.srq = q
	s.recvs.init(q.Depth(), s.sge)
	pd.refs.Add(1)
	pd.ctx.objMu.Lock()
	pd.ctx.srqOf[q] = s
	pd.ctx.objMu.Unlock()
	s.ID = srqs.put(s)
	return s, nil
}

func (s *SRQ) limitReached() {
	s.mu.Lock()
	s.limit = 0
	s.mu.Unlock()
	s.ctx.pushAsync(AsyncEvent{Type: EventSRQLimitReached, User: s.User})
}

// Modify runs ibv_modify_srq: IBV_SRQ_LIMIT arms the limit (0 disarms);
// IBV_SRQ_MAX_WR resizes it within the ring made at creation.
func (s *SRQ) Modify(a SRQAttr, mask int) error {
	if mask&^(SRQMaskMaxWR|SRQMaskLimit) != 0 {
		return fmt.Errorf("%w: srq_attr_mask %#x", errInvalid, mask)
	}
	if mask&SRQMaskMaxWR != 0 {
		if err := s.srq.Resize(a.MaxWR); err != nil {
			return err
		}
	}
	if mask&SRQMaskLimit != 0 {
		if a.Limit < 0 || a.Limit > s.srq.Depth() {
			return fmt.Errorf("%w: SRQ limit %d beyond its %d receives", errInvalid, a.Limit, s.srq.Depth())
		}
		s.mu.Lock()
		s.limit = a.Limit
		s.mu.Unlock()
		if err := s.srq.SetLowWatermark(a.Limit); err != nil {
			return err
		}
	}
	return nil
}

// Query returns the SRQ's attributes.
func (s *SRQ) Query() SRQAttr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return SRQAttr{MaxWR: s.srq.Depth(), MaxSGE: s.sge, Limit: s.limit}
}

// BeginRecv takes the SRQ's scratch for PostRecv, locked (an SRQ may be
// posted from many threads) until PostRecv.
func (s *SRQ) BeginRecv() []RecvReq {
	s.post.Lock()
	return s.recvs.reqs
}

// PostRecv posts BeginRecv()[:n] with QP.PostSend's rules, and unlocks
// the scratch.
func (s *SRQ) PostRecv(n int) (int, error) {
	defer s.post.Unlock()
	return postRecv(&s.recvs, n, s.srq.PostRecv)
}

// Destroy destroys the SRQ; one QPs use is EBUSY.
func (s *SRQ) Destroy() error {
	if s.refs.Load() > 0 {
		return fmt.Errorf("%w: QPs use the SRQ", vfrdma.ErrBusy)
	}
	if err := s.srq.Close(); err != nil {
		return err
	}
	s.pd.refs.Add(-1)
	s.ctx.objMu.Lock()
	delete(s.ctx.srqOf, s.srq)
	s.ctx.objMu.Unlock()
	s.ctx.purgeAsync(s.User)
	srqs.del(s.ID)
	return nil
}
