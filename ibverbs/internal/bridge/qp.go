package bridge

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/vfrdma/vfrdma"
)

// The verbs' QP types, states and ibv_qp_attr_mask bits.
const (
	QPTypeRC = 2
	QPTypeUC = 3
	QPTypeUD = 4

	StateReset = 0
	StateInit  = 1
	StateRTR   = 2
	StateRTS   = 3
	StateSQD   = 4
	StateSQE   = 5
	StateErr   = 6

	MaskState           = 1 << 0
	MaskCurState        = 1 << 1
	MaskAccessFlags     = 1 << 3
	MaskPKeyIndex       = 1 << 4
	MaskPort            = 1 << 5
	MaskQKey            = 1 << 6
	MaskAV              = 1 << 7
	MaskPathMTU         = 1 << 8
	MaskTimeout         = 1 << 9
	MaskRetryCnt        = 1 << 10
	MaskRNRRetry        = 1 << 11
	MaskRQPSN           = 1 << 12
	MaskMaxQPRDAtomic   = 1 << 13
	MaskMinRNRTimer     = 1 << 15
	MaskSQPSN           = 1 << 16
	MaskMaxDestRDAtomic = 1 << 17
	MaskDestQPN         = 1 << 20
)

// The attributes the verbs require for each transition (as the kernel's
// ib_modify_qp_is_ok table says for RC and UD); others are optional.
var required = map[[3]int]int{
	{QPTypeRC, StateReset, StateInit}: MaskPKeyIndex | MaskPort | MaskAccessFlags,
	{QPTypeUD, StateReset, StateInit}: MaskPKeyIndex | MaskPort | MaskQKey,
	{QPTypeRC, StateInit, StateInit}:  0,
	{QPTypeUD, StateInit, StateInit}:  0,
	{QPTypeRC, StateInit, StateRTR}:   MaskAV | MaskPathMTU | MaskDestQPN | MaskRQPSN | MaskMaxDestRDAtomic | MaskMinRNRTimer,
	{QPTypeUD, StateInit, StateRTR}:   0,
	{QPTypeRC, StateRTR, StateRTS}:    MaskSQPSN | MaskTimeout | MaskRetryCnt | MaskRNRRetry | MaskMaxQPRDAtomic,
	{QPTypeUD, StateRTR, StateRTS}:    MaskSQPSN,
	{QPTypeRC, StateRTS, StateRTS}:    0,
	{QPTypeUD, StateRTS, StateRTS}:    0,
}

// QPCap is struct ibv_qp_cap.
type QPCap struct {
	MaxSendWR, MaxRecvWR, MaxSendSGE, MaxRecvSGE, MaxInlineData int
}

// QPInit is the part of struct ibv_qp_init_attr the device uses.
type QPInit struct {
	Type           int
	SendCQ, RecvCQ *CQ
	SRQ            *SRQ
	Cap            QPCap
	SignalAll      bool
}

// QPAttr is struct ibv_qp_attr's fields the drop-in keeps.
type QPAttr struct {
	State, CurState int
	PathMTU         int
	QKey            uint32
	RQPSN, SQPSN    uint32
	DestQPN         uint32
	AccessFlags     int
	PKeyIndex       int
	Port            int
	Timeout         uint8
	RetryCnt        uint8
	RNRRetry        uint8
	MinRNRTimer     uint8
	MaxRDAtomic     uint8
	MaxDestRDAtomic uint8
	AH              AHAttr
	Cap             QPCap
}

// QP is a queue pair (struct ibv_qp), with the scratch its posts
// translate work requests into.
type QP struct {
	ID    uint32
	User  unsafe.Pointer
	ctx   *Context
	pd    *PD
	qp    *vfrdma.QP
	typ   int
	send  *CQ
	recv  *CQ
	srq   *SRQ
	cap   QPCap
	mu    sync.Mutex // attr, modify
	attr  QPAttr
	sends sendScratch
	recvs recvScratch
	// the scratch's locks: the verbs let many threads post to one QP,
	// the driver takes one poster per queue
	sendMu, recvMu sync.Mutex

	// inline data: a registered ring of one slot per send queue entry,
	// where IBV_SEND_INLINE requests' bytes are copied at post
	inl     *vfrdma.MR
	inlMem  []byte
	inlSlot int // slot size (the QP's max_inline_data)
	inlNext int // the next slot, counted over the requests posted

	// sig records the sends in flight where the device completes every
	// send and the QP signals selectively (signal.go); nil otherwise.
	sig *sigRing
}

// MaxInline is the most inline data a QP takes per send.
const MaxInline = 512

// CreateQP makes an RC or UD queue pair. Other types are EOPNOTSUPP. The
// device has no inline data: a QP asking for max_inline_data (up to
// MaxInline) gets a registered ring of one slot per send queue entry,
// rounded up to 64 bytes, and an inline send's bytes are copied there at
// post.
func (pd *PD) CreateQP(in QPInit) (*QP, error) {
	var typ vfrdma.QPType
	switch in.Type {
	case QPTypeRC:
		typ = vfrdma.RC
	case QPTypeUD:
		typ = vfrdma.UD
	default:
		return nil, fmt.Errorf("%w: QP type %d (RC and UD are)", ErrUnsupported, in.Type)
	}
	if in.SendCQ == nil || in.RecvCQ == nil {
		return nil, fmt.Errorf("%w: a QP needs a send and a receive CQ", errInvalid)
	}
	if in.Cap.MaxInlineData < 0 || in.Cap.MaxInlineData > MaxInline {
		return nil, fmt.Errorf("%w: max_inline_data %d (the drop-in takes up to %d)", errInvalid, in.Cap.MaxInlineData, MaxInline)
	}
	caps := pd.ctx.Dev.Caps()
	c := in.Cap
	if c.MaxSendWR < 1 || uint32(c.MaxSendWR) > caps.MaxQPWR || c.MaxSendSGE > int(caps.MaxSGE) ||
		(in.SRQ == nil && (c.MaxRecvWR < 1 || uint32(c.MaxRecvWR) > caps.MaxQPWR || c.MaxRecvSGE > int(caps.MaxSGE))) {
		return nil, fmt.Errorf("%w: QP capabilities %+v beyond the device's (max_qp_wr %d, max_sge %d)",
			errInvalid, c, caps.MaxQPWR, caps.MaxSGE)
	}
	cfg := &vfrdma.QPConfig{Type: typ, SendCQ: in.SendCQ.cq, RecvCQ: in.RecvCQ.cq,
		SendDepth: c.MaxSendWR, RecvDepth: c.MaxRecvWR, SendSGE: max(c.MaxSendSGE, 1), RecvSGE: max(c.MaxRecvSGE, 1),
		SignalAll: in.SignalAll}
	if in.SRQ != nil {
		cfg.SRQ = in.SRQ.srq
		cfg.RecvDepth, cfg.RecvSGE = 0, 0
	}
	ctx, cancel := cmdCtx()
	defer cancel()
	q, err := pd.pd.CreateQP(ctx, cfg)
	if err != nil {
		return nil, err
	}
	qp := &QP{ctx: pd.ctx, pd: pd, qp: q, typ: in.Type, send: in.SendCQ, recv: in.RecvCQ, srq: in.SRQ}
	qp.cap = QPCap{MaxSendWR: q.SendDepth(), MaxSendSGE: cfg.SendSGE}
	if in.SRQ == nil {
		qp.cap.MaxRecvWR, qp.cap.MaxRecvSGE = q.RecvDepth(), cfg.RecvSGE
	}
	if c.MaxInlineData > 0 {
		qp.inlSlot = (c.MaxInlineData + 63) &^ 63
		mr, err := pd.pd.AllocMR(ctx, qp.inlSlot*qp.cap.MaxSendWR, vfrdma.AccessLocalWrite)
		if err != nil {
			return nil, joinClose(err, q.Close)
		}
		qp.inl, qp.inlMem = mr, mr.Bytes()
		qp.cap.MaxInlineData = qp.inlSlot
	}
	qp.attr = QPAttr{State: StateReset, Port: 1, PathMTU: 3, Cap: qp.cap}
	qp.sends.init(qp.cap.MaxSendWR, qp.cap.MaxSendSGE)
	if in.SRQ == nil {
		qp.recvs.init(qp.cap.MaxRecvWR, qp.cap.MaxRecvSGE)
	}
	pd.refs.Add(1)
	in.SendCQ.refs.Add(1)
	in.RecvCQ.refs.Add(1)
	if in.SRQ != nil {
		in.SRQ.refs.Add(1)
	}
	pd.ctx.objMu.Lock()
	pd.ctx.qpOf[q] = qp
	if !in.SignalAll && pd.ctx.Dev.Quirks().Emulated {
		qp.sig = newSigRing(q.QPN(), qp.cap.MaxSendWR)
		in.SendCQ.addSig(qp.sig)
	}
	pd.ctx.objMu.Unlock()
	qp.ID = qps.put(qp)
	return qp, nil
}

// QPN is the QP's number; Cap what it was created with.
// UD reports whether the QP is a UD QP: only a UD send's request carries
// an address handle, a remote QPN and a Q_Key (the union holds the RDMA
// address and rkey otherwise).
func (qp *QP) UD() bool { return qp.typ == QPTypeUD }

func (qp *QP) QPN() uint32    { return qp.qp.QPN() }
func (qp *QP) Cap() QPCap     { return qp.cap }
func (qp *QP) Handle() uint32 { return qp.QPN() }

// State is the QP's state as the driver knows it, in the verbs' numbering.
func (qp *QP) State() int { return int(qp.qp.State()) }

// Modify runs ibv_modify_qp: RESET→INIT (for UD with its Q_Key), INIT→
// INIT, INIT→RTR (RC: connected to the AV's GID, DEST_QPN, RQ_PSN),
// RTR→RTS (SQ_PSN), RTS→RTS, and any state→ERR (outstanding requests
// flush). A transition the verbs do not allow, or one missing a required
// attribute, is EINVAL; →RESET, SQD and SQE are EOPNOTSUPP. A mask without
// IBV_QP_STATE keeps the state (an attribute change, accepted in RTS).
func (qp *QP) Modify(a *QPAttr, mask int) error {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	cur := qp.State()
	if mask&MaskCurState != 0 && a.CurState != cur {
		return fmt.Errorf("%w: cur_qp_state %d but the QP is in %d", errInvalid, a.CurState, cur)
	}
	to := cur
	if mask&MaskState != 0 {
		to = a.State
	}
	if mask&MaskPort != 0 && a.Port != 1 {
		return fmt.Errorf("%w: port %d (the device has port 1)", errInvalid, a.Port)
	}
	ctx, cancel := cmdCtx()
	defer cancel()
	switch {
	case to == StateErr:
		if err := qp.qp.SetError(ctx); err != nil {
			return err
		}
		return nil
	case to == StateReset:
		if cur == StateReset {
			return nil
		}
		return fmt.Errorf("%w: a move back to RESET", ErrUnsupported)
	case to == StateSQD || to == StateSQE:
		return fmt.Errorf("%w: QP state %d", ErrUnsupported, to)
	}
	req, ok := required[[3]int{qp.typ, cur, to}]
	if !ok {
		return fmt.Errorf("%w: QP %d cannot go from state %d to %d", errInvalid, qp.QPN(), cur, to)
	}
	if mask&req != req {
		return fmt.Errorf("%w: the move from state %d to %d needs attribute mask %#x (given %#x)", errInvalid, cur, to, req, mask)
	}
	var err error
	switch to {
	case StateInit:
		if qp.typ == QPTypeUD && mask&MaskQKey != 0 {
			if err := qp.qp.SetQKey(a.QKey); err != nil {
				return err
			}
		}
		err = qp.qp.Init(ctx)
	case StateRTR:
		r := vfrdma.Remote{QPN: a.DestQPN, GID: a.AH.DGID, PSN: a.RQPSN}
		if qp.typ == QPTypeRC && !a.AH.IsGlobal {
			return fmt.Errorf("%w: a RoCE QP's address needs a GRH (ah_attr.is_global)", errInvalid)
		}
		err = qp.qp.ReadyToReceive(ctx, r)
	case StateRTS:
		if cur == StateRTS {
			break
		}
		err = qp.qp.ReadyToSend(ctx, a.SQPSN)
	}
	if err != nil {
		return err
	}
	qp.remember(a, mask)
	return nil
}

// remember keeps what ibv_query_qp reports back.
func (qp *QP) remember(a *QPAttr, mask int) {
	s := &qp.attr
	if mask&MaskQKey != 0 {
		s.QKey = a.QKey
	}
	if mask&MaskAccessFlags != 0 {
		s.AccessFlags = a.AccessFlags
	}
	if mask&MaskPKeyIndex != 0 {
		s.PKeyIndex = a.PKeyIndex
	}
	if mask&MaskPathMTU != 0 {
		s.PathMTU = a.PathMTU
	}
	if mask&MaskAV != 0 {
		s.AH = a.AH
	}
	if mask&MaskDestQPN != 0 {
		s.DestQPN = a.DestQPN
	}
	if mask&MaskRQPSN != 0 {
		s.RQPSN = a.RQPSN
	}
	if mask&MaskSQPSN != 0 {
		s.SQPSN = a.SQPSN
	}
	if mask&MaskTimeout != 0 {
		s.Timeout = a.Timeout
	}
	if mask&MaskRetryCnt != 0 {
		s.RetryCnt = a.RetryCnt
	}
	if mask&MaskRNRRetry != 0 {
		s.RNRRetry = a.RNRRetry
	}
	if mask&MaskMinRNRTimer != 0 {
		s.MinRNRTimer = a.MinRNRTimer
	}
	if mask&MaskMaxQPRDAtomic != 0 {
		s.MaxRDAtomic = a.MaxRDAtomic
	}
	if mask&MaskMaxDestRDAtomic != 0 {
		s.MaxDestRDAtomic = a.MaxDestRDAtomic
	}
}

// Query returns the QP's attributes (ibv_query_qp): its state as the
// device reports it, and the attributes the program set.
func (qp *QP) Query() (QPAttr, error) {
	ctx, cancel := cmdCtx()
	defer cancel()
	st, err := qp.qp.QueryState(ctx)
	if err != nil {
		return QPAttr{}, err
	}
	qp.mu.Lock()
	defer qp.mu.Unlock()
	a := qp.attr
	a.State, a.CurState = int(st), int(st)
	a.Cap = qp.cap
	return a, nil
}

// Destroy destroys the QP.
func (qp *QP) Destroy() error {
	if err := qp.qp.Close(); err != nil {
		return err
	}
	if qp.inl != nil {
		_ = qp.inl.Close()
	}
	qp.pd.refs.Add(-1)
	qp.send.refs.Add(-1)
	qp.recv.refs.Add(-1)
	if qp.srq != nil {
		qp.srq.refs.Add(-1)
	}
	qp.ctx.objMu.Lock()
	delete(qp.ctx.qpOf, qp.qp)
	if qp.sig != nil {
		qp.send.dropSig(qp.sig.qpn)
	}
	qp.ctx.objMu.Unlock()
	qp.ctx.purgeAsync(qp.User)
	qps.del(qp.ID)
	return nil
}
