package vfrdma

import (
	"context"
	"errors"
	"fmt"
	"github.com/vfrdma/vfrdma/internal/lifecycle"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/event"
	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/rings"
	"github.com/vfrdma/vfrdma/srq"
	"github.com/vfrdma/vfrdma/vfio"
	"github.com/vfrdma/vfrdma/wq"
	"golang.org/x/sys/cpu"
)

// QPType is a queue pair's transport.
type QPType uint8

// The transports the device runs.
const (
	RC QPType = QPType(firmware.QPTypeRC) // reliable connected
	UD QPType = QPType(firmware.QPTypeUD) // unreliable datagram
)

func (t QPType) String() string {
	switch t {
	case RC:
		return "RC"
	case UD:
		return "UD"
	}
	return fmt.Sprintf("QPType(%d)", uint8(t))
}

// QPState is a queue pair's state.
type QPState uint32

// QP states (the verbs numbering). The driver moves a QP through RESET,
// INIT, RTR, RTS and ERR; SQD and SQE are states only a device's answer
// to QueryState can name (SQE: a UD QP whose send failed).
const (
	StateReset QPState = QPState(firmware.QPStateReset)
	StateInit  QPState = QPState(firmware.QPStateInit)
	StateRTR   QPState = QPState(firmware.QPStateRTR)
	StateRTS   QPState = QPState(firmware.QPStateRTS)
	StateSQD   QPState = QPState(firmware.QPStateSQD)
	StateSQE   QPState = QPState(firmware.QPStateSQE)
	StateErr   QPState = QPState(firmware.QPStateErr)
)

func (s QPState) String() string {
	switch s {
	case StateReset:
		return "RESET"
	case StateInit:
		return "INIT"
	case StateRTR:
		return "RTR"
	case StateRTS:
		return "RTS"
	case StateSQD:
		return "SQD"
	case StateSQE:
		return "SQE"
	case StateErr:
		return "ERR"
	}
	return fmt.Sprintf("QPState(%d)", uint32(s))
}

// SGE is a scatter/gather element: Length bytes at Addr of the MR whose
// local key is LKey (MR.SGE builds one).
type SGE = rings.SGE

// UDHeaderRoom is what a UD receive buffer holds before the payload: the
// device leaves room for a 40-byte global route header there.
const UDHeaderRoom = 40

// Default queue geometry.
const (
	DefaultQueueDepth = 64
	maxQueuePages     = firmware.MaxRingChunks // per queue, QEMU's limit
)

// QPConfig describes a queue pair. Zero fields mean their defaults.
type QPConfig struct {
	Type      QPType
	SendCQ    *CQ // required
	RecvCQ    *CQ // required
	SendDepth int // send queue entries (rounded up to a power of two; default 64)
	RecvDepth int // receive queue entries (likewise)
	SendSGE   int // SGEs per send (1 to the device's max_sge; default 1)
	RecvSGE   int // SGEs per receive (likewise)
	// QKey is a UD QP's Q_Key: datagrams sent to it must carry it.
	QKey uint32
	// GIDIndex is the source GID index (default 0, the GID Open binds).
	GIDIndex int
	// SRQ, if set, is where the QP's receives come from: the QP has no
	// receive queue of its own (RecvDepth and RecvSGE are ignored) and
	// PostRecv on it is refused.
	SRQ *SRQ
	// SignalAll makes every send complete (sq_sig_all), whatever its
	// SendSignaled flag. Without it, on a device that honours signaling (a
	// VMware device; not QEMU 7.2, where every send completes), only the
	// sends posted with SendSignaled, and those that fail, make a
	// completion; the others are retired, and their queue slots come back,
	// at the first Poll of the send CQ after the device consumed them or
	// after a later send's completion (QP.Outstanding).
	SignalAll bool
	// SendCounter and RecvCounter, if set, count the QP's send and receive
	// completions (success or error value) as CQ.Poll reaps them, flushes
	// included. A counter may serve many QPs; it cannot be closed while a
	// QP counts into it. With an SRQ, RecvCounter counts the receives this
	// QP took from it.
	SendCounter, RecvCounter *event.Counter
}

// Remote addresses the other end of an RC QP.
type Remote struct {
	QPN uint32
	GID GID
	PSN uint32 // its first send PSN (our receive PSN)
}

// QP is a queue pair. Posting sends and posting receives may run on two
// goroutines at once, but each is single-owner (one poster per queue); state
// changes and Close are safe for concurrent use with each other and with
// the posters. It follows the lifecycle rule (doc.go): a post racing Close
// completes or is refused with ErrClosed (one racing SetError on QEMU,
// with ErrQPState), and the rings are freed once no post is inside.
//
// Its state has two readings. State is the driver's copy, read without
// asking the device (posts check it): the driver's own transitions set
// it, and it goes to ERR when the driver learns that the device failed the
// QP: an async error event (QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR, and
// DEVICE_FATAL for every QP), or, for an RC QP, a completion with an error
// status polled from its CQs (the verbs' rule: a failed request fails its
// RC QP; on QEMU, GENERAL_ERR excepted, QEMU's own failures, after which
// its QP runs on). QueryState asks the device (QUERY_QP, as
// ibv_query_qp does) and brings State up to date with the answer: it
// learns an ERR that nothing else reported yet, such as a requester's
// remote access error before its completion is polled, or a UD QP's
// failure. ERR is final: no answer takes State out of it.
type QP struct {
	pd                 *PD
	d                  *Device
	typ                QPType
	qpn                uint32
	handle             uint32
	sendCQ             *CQ
	recvCQ             *CQ
	srq                *SRQ
	srqm               *srq.Member // its place in the SRQ's accounting
	sendCntr, recvCntr *event.Counter
	buf                *vfio.DMABuffer
	sq, rq             wq.Queue // rq is the empty queue with an SRQ
	gidIdx             uint8
	qkey               uint32
	udMax              int    // UD payload limit
	key                uint32 // its key in the QP table: the handle, masked (registry.go)
	sigAll             bool   // the driver counts every send signaled: SignalAll, or QEMU
	rdAtomic           uint8  // RDMA READs and atomics in flight it initiates (max_rd_atomic)
	destRDAtomic       uint8  // and it answers (max_dest_rd_atomic)

	state atomic.Uint32 // QPState

	// The lifecycle: each poster is inside its queue's gate, which SetError
	// (on QEMU) holds and Close shuts; closing tells a refused post which
	// error it is. alias is the QP's key in the QPN table once the device
	// has destroyed it (retireQPN).
	sendGate lifecycle.Gate
	_        cpu.CacheLinePad // the two posters do not share a line
	recvGate lifecycle.Gate
	closing  atomic.Bool
	alias    uint32

	mu        sync.Mutex // state changes and Close
	closed    bool
	devicesQP bool // the device still has the QP

	// Under d.mu: leaving is set from before the QP's DESTROY_QP until it
	// has left its handle (closed then), or the device refused the
	// DESTROY (nil again); heirs counts the CreateQPs given the handle
	// meanwhile, waiting for it (registry.go).
	leaving chan struct{}
	heirs   int
}

func pow2(n int) int { return 1 << bits.Len(uint(n-1)) }

// CreateQP creates a queue pair in RESET; Init, ReadyToReceive and
// ReadyToSend (or Connect) bring it up. If the device gives it the handle
// of a QP whose Close is under way, it waits for that Close to let go of
// the handle (ctx bounds the wait); the handle of a live QP fails it with
// ErrDeviceFault.
func (pd *PD) CreateQP(ctx context.Context, cfg *QPConfig) (*QP, error) {
	d := pd.d
	const op = "create QP"
	if err := pd.enter(); err != nil {
		return nil, d.opErr(op, err)
	}
	defer pd.exit()
	c, err := d.qpGeometry(pd, cfg)
	if err != nil {
		return nil, d.opErr(op, err)
	}
	if err := holdCounters(c.SendCounter, c.RecvCounter); err != nil {
		return nil, d.opErr(op, err)
	}
	created := false
	defer func() {
		if !created {
			releaseCounters(c.SendCounter, c.RecvCounter)
		}
	}()
	sqStride, rqStride := rings.SendStride(c.SendSGE), rings.RecvStride(c.RecvSGE)
	sqPages := (c.SendDepth*sqStride + firmware.PageSize - 1) / firmware.PageSize
	rqPages := (c.RecvDepth*rqStride + firmware.PageSize - 1) / firmware.PageSize
	var srqHandle uint32
	if c.SRQ != nil {
		rqPages = 0 // no receive ring: the SRQ's
		srqHandle = c.SRQ.handle
		if err := c.SRQ.checkAttach(c.RecvCQ); err != nil {
			return nil, d.opErr(op, err)
		}
	}
	buf, err := d.allocRing(sqPages + rqPages)
	if err != nil {
		return nil, d.opErr(op, err)
	}
	resp, err := d.ch.CreateQP(ctx, firmware.CreateQPRequest{
		PDirDMA:      bufPage(buf, ringPgDir).DMA,
		PDHandle:     pd.handle,
		SendCQHandle: c.SendCQ.handle,
		RecvCQHandle: c.RecvCQ.handle,
		MaxSendWR:    uint32(c.SendDepth),
		MaxRecvWR:    uint32(c.RecvDepth),
		MaxSendSGE:   uint32(c.SendSGE),
		MaxRecvSGE:   uint32(c.RecvSGE),
		AccessFlags:  firmware.AccessLocalWrite,
		TotalChunks:  uint16(1 + sqPages + rqPages),
		SendChunks:   uint16(sqPages),
		SQSigAll:     c.SignalAll,
		QPType:       firmware.QPType(c.Type),
		IsSRQ:        c.SRQ != nil,
		SRQHandle:    srqHandle,
	})
	if err != nil {
		buf.Close()
		return nil, d.opErr(op, err)
	}
	qp := &QP{pd: pd, d: d, typ: c.Type, qpn: resp.QPN, handle: resp.QPHandle,
		sendCQ: c.SendCQ, recvCQ: c.RecvCQ, srq: c.SRQ, buf: buf, gidIdx: uint8(c.GIDIndex), qkey: c.QKey,
		udMax: d.udMax, devicesQP: true, sendCntr: c.SendCounter, recvCntr: c.RecvCounter}
	qp.setSignaling(c.SignalAll)
	undo := func(err error) (*QP, error) {
		d.ch.DestroyQP(ctx, qp.handle)
		if qp.srqm != nil {
			qp.srqm.Detach()
		}
		buf.Close()
		return nil, d.opErr(op, err)
	}
	// The ring-state page holds the SQ state at 0 and the RQ state at 8;
	// the send pages come first, then the receive pages.
	state := bufPage(buf, ringPgState).Mem
	sqBytes := buf.Mem[ringPgData*firmware.PageSize:][:sqPages*firmware.PageSize]
	rqBytes := buf.Mem[(ringPgData+sqPages)*firmware.PageSize:][:rqPages*firmware.PageSize]
	if err := qp.initQueue(&qp.sq, state[0:8], sqBytes, sqStride, c.SendDepth, c.SendSGE, doorbell.QPSend); err != nil {
		return undo(err)
	}
	qp.setProgress()
	if c.SRQ == nil {
		if err := qp.initQueue(&qp.rq, state[8:16], rqBytes, rqStride, c.RecvDepth, c.RecvSGE, doorbell.QPRecv); err != nil {
			return undo(err)
		}
	} else {
		qp.rq.SetName(fmt.Sprintf("QP %d", qp.qpn)) // empty: the SRQ receives
		m, err := c.SRQ.attach(qp)
		if err != nil {
			return undo(err)
		}
		qp.srqm = m
	}
	qp.state.Store(uint32(StateReset))
	d.journal.add(kindQP, qp.handle)
	if err := d.addQP(ctx, qp); err != nil {
		d.journal.remove(kindQP, qp.handle)
		return undo(err)
	}
	pd.hold(+1)
	c.SendCQ.hold(+1)
	c.RecvCQ.hold(+1)
	created = true
	return qp, nil
}

// holdCounters marks the QP's counters in use; a closed one is refused.
func holdCounters(cs ...*event.Counter) error {
	for i, c := range cs {
		if c == nil {
			continue
		}
		if err := c.Hold(); err != nil {
			releaseCounters(cs[:i]...)
			return fmt.Errorf("QP counter: %w", err)
		}
	}
	return nil
}

func releaseCounters(cs ...*event.Counter) {
	for _, c := range cs {
		if c != nil {
			c.Release()
		}
	}
}

// setSignaling fixes how the QP's sends complete, and its RDMA READ and
// atomic depths: on QEMU (every send completes, whatever its flags, and
// one READ or atomic in flight, its fixed backend values) the driver
// counts every send signaled; on a device that honours signaling, those
// of SignalAll; the depths are the device's, up to 16.
func (qp *QP) setSignaling(signalAll bool) {
	d := qp.d
	qp.sigAll = signalAll || d.emulated
	if d.emulated {
		qp.rdAtomic, qp.destRDAtomic = 1, 1
		return
	}
	qp.rdAtomic, qp.destRDAtomic = uint8(min(d.caps.MaxQPInitRDAtom, 16)), uint8(min(d.caps.MaxQPRDAtom, 16))
}

// setProgress makes the send queue, once initialised, follow the device's
// progress on a device other than QEMU: its room is bounded by the ring
// (the device's consumer index), and without SignalAll it is selective
// (unsignaled sends make no completion; wq.Queue.SetSelective).
func (qp *QP) setProgress() {
	if qp.d.emulated {
		return
	}
	qp.sq.SetBoundByRing()
	if !qp.sigAll {
		qp.sq.SetSelective()
	}
}

// initQueue sets one of the QP's queues up over its ring.
func (qp *QP) initQueue(w *wq.Queue, state, data []byte, stride, depth, maxSGE int, bit uint32) error {
	return w.Init(fmt.Sprintf("QP %d", qp.qpn), qp.d.uar, state, data, stride, depth, maxSGE, doorbell.OffsetQP, bit|qp.handle&doorbell.HandleMask)
}

// qpGeometry validates cfg and fills in the defaults.
func (d *Device) qpGeometry(pd *PD, cfg *QPConfig) (QPConfig, error) {
	if cfg == nil {
		return QPConfig{}, invalidf("no QP configuration")
	}
	c := *cfg
	if c.Type != RC && c.Type != UD {
		return c, fmt.Errorf("%w: QP type %v (the device runs RC and UD)", ErrNotSupported, c.Type)
	}
	if c.SendCQ == nil || c.RecvCQ == nil {
		return c, invalidf("a QP needs a send CQ and a receive CQ")
	}
	if c.SendCQ.d != d || c.RecvCQ.d != d {
		return c, invalidf("the CQs belong to another device")
	}
	maxSGE := int(d.caps.MaxSGE)
	for _, f := range []struct {
		name string
		v    *int
		def  int
		max  int
	}{
		{"send depth", &c.SendDepth, DefaultQueueDepth, maxQueuePages * firmware.PageSize / rings.SendStride(max(1, c.SendSGE))},
		{"receive depth", &c.RecvDepth, DefaultQueueDepth, maxQueuePages * firmware.PageSize / rings.RecvStride(max(1, c.RecvSGE))},
		{"send SGEs", &c.SendSGE, 1, maxSGE},
		{"receive SGEs", &c.RecvSGE, 1, maxSGE},
	} {
		if *f.v == 0 {
			*f.v = f.def
		}
		if *f.v < 1 || *f.v > f.max {
			return c, invalidf("%s %d: want 1 to %d", f.name, *f.v, f.max)
		}
	}
	c.SendDepth, c.RecvDepth = pow2(c.SendDepth), pow2(c.RecvDepth)
	// The device's own depth limits.
	if lim := int(d.caps.MaxQPWR); c.SendDepth > lim || c.RecvDepth > lim {
		return c, invalidf("queue depth %d/%d: the device allows %d", c.SendDepth, c.RecvDepth, lim)
	}
	if !d.gidBound(c.GIDIndex) {
		return c, invalidf("source GID index %d is not bound (BindGID)", c.GIDIndex)
	}
	if c.SRQ != nil {
		if c.SRQ.pd != pd {
			return c, invalidf("the SRQ belongs to another PD")
		}
		c.RecvDepth, c.RecvSGE = 1, 1
	}
	return c, nil
}

// QPN returns the queue pair number peers address.
func (qp *QP) QPN() uint32 { return qp.qpn }

// Type returns the transport.
func (qp *QP) Type() QPType { return qp.typ }

// State returns the QP's state as the driver knows it, without asking the
// device: see QP for what keeps it up to date, and QueryState.
func (qp *QP) State() QPState { return QPState(qp.state.Load()) }

// failedBy notes a completion with error status st polled for the QP: an
// RC QP is in ERR (the device flushes its other requests), unless st is
// QEMU's GENERAL_ERR (facts sheet §11 item 19: QEMU fails the request
// itself and its QP runs on). A UD QP's failure is the device's to tell
// (QueryState): a failed send moves it to SQE, not ERR.
func (qp *QP) failedBy(st uint32) {
	if qp.typ != RC || st == uint32(WCGeneral) && qp.d.emulated {
		return
	}
	qp.state.Store(uint32(StateErr))
}

// learn brings State up to date with the device's answer now to a query
// sent when State was before: ERR is taken at once; another state replaces
// before unless State has moved meanwhile (an ERR learned while the
// command ran stays) or before is ERR (final: the driver knows the QP
// failed, whatever a device says).
func (qp *QP) learn(before, now QPState) {
	switch {
	case now == StateErr:
		qp.state.Store(uint32(StateErr))
	case before != StateErr:
		qp.state.CompareAndSwap(uint32(before), uint32(now))
	}
}

// SendDepth returns the send queue's size.
func (qp *QP) SendDepth() int { return qp.sq.Slots() }

// RecvDepth returns the receive queue's size (0 for a QP with an SRQ).
func (qp *QP) RecvDepth() int { return qp.rq.Slots() }

// Outstanding returns how many sends and receives are outstanding on the
// QP (doc.go: posted and not yet handed back by a Poll). A request is
// handed back by the Poll of its CQ that returns its completion, whether
// or not the device consumed it long before. On a device that honours
// signaling (not QEMU) an unsignaled send makes no completion unless it
// fails: it is handed back by the first Poll of the send CQ that finds the
// device has consumed it (the send queue's consumer index is past it) or
// that returns the completion of a later send on the queue, whichever
// comes first; every one the peer received is gone once the send CQ has
// been polled after. Consumed is not completed on a device that advances
// its index when it fetches a request: an unsignaled send it consumed may
// still be in flight, and if it then fails, its error completion is
// returned all the same. A queue's room for posts is its depth less its
// outstanding requests. With an SRQ, recv is 0: see SRQ.Outstanding and
// RecvQuery.
func (qp *QP) Outstanding() (send, recv int) { return qp.sq.Outstanding(), qp.rq.Outstanding() }

// DoorbellStats returns the send and receive queues' post and doorbell
// counts (receive: zero with an SRQ; see SRQ.DoorbellStats).
func (qp *QP) DoorbellStats() (send, recv doorbell.Stats) {
	if db := qp.rq.Doorbell(); db != nil {
		recv = db.Stats()
	}
	return qp.sq.Doorbell().Stats(), recv
}

// UnknownCount is the value of a receive count the device cannot tell
// (uDAPL's DAT_VALUE_UNKNOWN): RecvQuery's and SRQQPView's Allocated and
// Span for a QP of an SRQ.
const UnknownCount = srq.Unknown

// RecvQuery is a QP's receive accounting (uDAPL dat_ep_recv_query).
type RecvQuery struct {
	// Allocated counts receive buffers the QP holds whose completions are
	// not yet generated: without an SRQ, those posted and not completed;
	// with an SRQ, UnknownCount (the device names a QP only in the
	// completion).
	Allocated int
	// Span is how many more completions the QP can generate if every
	// message it is receiving completes. It is never less than Allocated;
	// UnknownCount with an SRQ.
	Span int
}

// CanQueryRecv reports whether RecvQuery answers with counts rather than
// UnknownCount: true for a QP with its own receive queue, false for a QP
// of an SRQ (SRQ.Query has what each of those consumed).
func (qp *QP) CanQueryRecv() bool { return qp.srq == nil }

// RecvQuery returns the QP's receive accounting from one read of its
// counters. Without an SRQ a buffer is allocated when posted; receives
// complete in order, so the span is the allocation.
func (qp *QP) RecvQuery() RecvQuery {
	if qp.srq != nil {
		return RecvQuery{Allocated: UnknownCount, Span: UnknownCount}
	}
	n := qp.rq.OutstandingP()
	return RecvQuery{Allocated: n, Span: n}
}

// attrs returns a complete attribute block: QEMU takes the values it needs
// from it whatever the mask says, so every call fills every field.
func (qp *QP) attrs(state QPState, r *Remote, sqPSN uint32) firmware.QPAttr {
	access := uint32(firmware.AccessLocalWrite | firmware.AccessRemoteWrite | firmware.AccessRemoteRead)
	if !qp.d.emulated && qp.d.caps.AtomicOps&(atomicCapCAS|atomicCapFAA) != 0 {
		access |= firmware.AccessRemoteAtomic // the MRs' own rights decide
	}
	a := firmware.QPAttr{
		QPState:         firmware.QPState(state),
		CurQPState:      firmware.QPState(qp.State()),
		PathMTU:         firmware.MTU1024,
		QKey:            qp.qkey,
		SQPSN:           sqPSN,
		QPAccessFlags:   access,
		PortNum:         1,
		Timeout:         14,
		RetryCnt:        7,
		RNRRetry:        7,
		MinRNRTimer:     12,
		MaxRDAtomic:     qp.rdAtomic,
		MaxDestRDAtomic: qp.destRDAtomic,
		Cap: firmware.QPCap{
			MaxSendWR: uint32(qp.sq.Slots()), MaxRecvWR: uint32(qp.rq.Slots()),
			MaxSendSGE: uint32(qp.sq.MaxSGE()), MaxRecvSGE: uint32(qp.rq.MaxSGE()),
		},
		AH: firmware.AHAttr{
			GRH:     firmware.GlobalRoute{SGIDIndex: qp.gidIdx, HopLimit: 1},
			AHFlags: firmware.AHFlagGRH,
			PortNum: 1,
		},
	}
	if r != nil {
		a.DestQPNum = r.QPN
		a.RQPSN = r.PSN
		a.AH.GRH.DGID = r.GID
	}
	return a
}

func (qp *QP) modify(ctx context.Context, to QPState, mask uint32, r *Remote, sqPSN uint32, from ...QPState) error {
	if err := qp.d.enter(); err != nil {
		return err
	}
	defer qp.d.exit()
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if qp.closed {
		return qp.errClosed()
	}
	cur := qp.State()
	legal := false
	for _, f := range from {
		legal = legal || f == cur
	}
	if !legal {
		return fmt.Errorf("%w: %v QP %d cannot go from %v to %v", ErrQPState, qp.typ, qp.qpn, cur, to)
	}
	if err := qp.d.ch.ModifyQP(ctx, firmware.ModifyQPRequest{
		QPHandle: qp.handle, AttrMask: firmware.QPAttrState | mask, Attr: qp.attrs(to, r, sqPSN),
	}); err != nil {
		return err
	}
	// An ERR learned while the command ran (an event, an error
	// completion) stays.
	qp.state.CompareAndSwap(uint32(cur), uint32(to))
	return nil
}

// Init moves the QP from RESET to INIT: port 1, P_Key index 0, and for UD
// its Q_Key. Receives may be posted from INIT on.
func (qp *QP) Init(ctx context.Context) error {
	mask := uint32(firmware.QPAttrPKeyIndex | firmware.QPAttrPort)
	if qp.typ == UD {
		mask |= firmware.QPAttrQKey
	} else {
		mask |= firmware.QPAttrAccessFlags
	}
	return qp.d.opErr("modify QP", qp.modify(ctx, StateInit, mask, nil, 0, StateReset, StateInit))
}

// SetQKey sets a UD QP's Q_Key (QPConfig.QKey) while it is in RESET or
// INIT; Init takes it to the device. It is how libibverbs' order is
// served, where the Q_Key comes with the move to INIT, after creation.
func (qp *QP) SetQKey(qkey uint32) error {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if qp.closed {
		return qp.d.opErr("modify QP", qp.errClosed())
	}
	if st := qp.State(); qp.typ != UD || (st != StateReset && st != StateInit) {
		return qp.d.opErr("modify QP", fmt.Errorf("%w: %v QP %d in %v takes no Q_Key (UD, in RESET or INIT, does)", ErrQPState, qp.typ, qp.qpn, st))
	}
	qp.qkey = qkey
	return nil
}

// ReadyToReceive moves the QP from INIT to RTR. An RC QP is connected to
// r here; a UD QP takes no remote (r is ignored).
func (qp *QP) ReadyToReceive(ctx context.Context, r Remote) error {
	mask := uint32(0)
	var rp *Remote
	if qp.typ == RC {
		if r.QPN == 0 {
			return qp.d.opErr("modify QP", invalidf("RC QP %d: no remote QPN", qp.qpn))
		}
		mask = firmware.QPAttrAV | firmware.QPAttrPathMTU | firmware.QPAttrDestQPN | firmware.QPAttrRQPSN |
			firmware.QPAttrMaxDestRDAtomic | firmware.QPAttrMinRNRTimer
		rp = &r
	}
	return qp.d.opErr("modify QP", qp.modify(ctx, StateRTR, mask, rp, 0, StateInit))
}

// ReadyToSend moves the QP from RTR to RTS with first send PSN psn.
func (qp *QP) ReadyToSend(ctx context.Context, psn uint32) error {
	mask := uint32(firmware.QPAttrSQPSN)
	if qp.typ == RC {
		mask |= firmware.QPAttrTimeout | firmware.QPAttrRetryCnt | firmware.QPAttrRNRRetry | firmware.QPAttrMaxQPRDAtomic
	}
	return qp.d.opErr("modify QP", qp.modify(ctx, StateRTS, mask, nil, psn, StateRTR))
}

// Connect brings a QP in RESET or INIT to RTS: INIT, RTR with r, RTS with
// first send PSN psn.
func (qp *QP) Connect(ctx context.Context, r Remote, psn uint32) error {
	if qp.State() == StateReset {
		if err := qp.Init(ctx); err != nil {
			return err
		}
	}
	if err := qp.ReadyToReceive(ctx, r); err != nil {
		return err
	}
	return qp.ReadyToSend(ctx, psn)
}

// SetError moves the QP to ERR: the work requests outstanding on it
// complete with WR_FLUSH_ERR, exactly once each, and later posts fail with
// ErrQPState. On QEMU (Quirks.Emulated), which records ERR without telling
// its backend and so would still complete them, the driver destroys the
// device's QP here and generates the flush completions itself; posts
// racing it there complete first or are refused with ErrQPState. On a QP
// whose State is ERR already it does nothing: the device that failed the
// QP flushes its requests.
func (qp *QP) SetError(ctx context.Context) error {
	if err := qp.d.enter(); err != nil {
		return qp.d.opErr("modify QP", err)
	}
	defer qp.d.exit()
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if qp.closed {
		return qp.d.opErr("modify QP", qp.errClosed())
	}
	if qp.State() == StateErr {
		return nil
	}
	var err error
	if qp.d.emulated {
		// The posters are waited out and held off (their posts are
		// refused with ErrQPState meanwhile): the device's QP goes, and
		// with it the doorbells pending, which only a poster may touch.
		qp.holdPosters()
		err = qp.destroyOnDevice(ctx)
		if err == nil {
			qp.state.Store(uint32(StateErr))
		}
		qp.unholdPosters()
	} else {
		err = qp.d.ch.ModifyQP(ctx, firmware.ModifyQPRequest{
			QPHandle: qp.handle, AttrMask: firmware.QPAttrState, Attr: qp.attrs(StateErr, nil, 0),
		})
	}
	if err != nil {
		return qp.d.opErr("modify QP", err)
	}
	qp.state.Store(uint32(StateErr))
	if !qp.devicesQP {
		qp.startFlush()
	}
	return nil
}

// QueryState asks the device for the QP's state (QUERY_QP) and returns its
// answer, which State reflects from then on, unless State is ERR already
// (see QP). It is how the driver learns of a failure no event or polled
// completion reported: a device that moved the QP to ERR says so here.
// On QEMU the answer is its backend QP's state. On QEMU after SetError,
// which destroyed the device's QP, it returns ERR without a command.
func (qp *QP) QueryState(ctx context.Context) (QPState, error) {
	if err := qp.d.enter(); err != nil {
		return 0, qp.d.opErr("query QP", err)
	}
	defer qp.d.exit()
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if qp.closed {
		return 0, qp.d.opErr("query QP", qp.errClosed())
	}
	if !qp.devicesQP {
		return qp.State(), nil
	}
	before := qp.State()
	r, err := qp.d.ch.QueryQP(ctx, qp.handle, firmware.QPAttrState)
	if err != nil {
		return 0, qp.d.opErr("query QP", err)
	}
	st := QPState(r.QPState)
	qp.learn(before, st)
	return st, nil
}

// destroyOnDevice destroys the device's QP; called with qp.mu and the
// posters' gates held.
func (qp *QP) destroyOnDevice(ctx context.Context) error {
	if !qp.devicesQP {
		return nil
	}
	qp.awaitSends(ctx)
	qp.awaitQuietCQs(ctx)
	// The handle is marked leaving before the command: the device may give
	// it to a QP created as soon as the command completes (registry.go).
	qp.d.leaveQPN(qp)
	if err := qp.d.ch.DestroyQP(ctx, qp.handle); err != nil {
		qp.d.keepQPN(qp)
		return err
	}
	qp.devicesQP = false
	// What was deferred and not rung is flushed with the rest; a doorbell
	// for it now would name a handle the device may give another QP, or
	// write a ring that Close frees. The posters are held off: the
	// doorbells are this goroutine's for now.
	if db := qp.sq.Doorbell(); db != nil {
		db.Reset()
	}
	if db := qp.rq.Doorbell(); db != nil {
		db.Reset()
	}
	qp.d.journal.remove(kindQP, qp.handle)
	qp.d.retireQPN(qp)
	return nil
}

// holdPosters waits out the posts under way and refuses the next ones
// until unholdPosters.
func (qp *QP) holdPosters() {
	qp.sendGate.Hold()
	qp.recvGate.Hold()
}

func (qp *QP) unholdPosters() {
	qp.recvGate.Unhold()
	qp.sendGate.Unhold()
}

// shut refuses the QP's posts from now on and waits out those under way:
// Device.Close, for a QP whatever its DESTROY answered.
func (qp *QP) shut() {
	qp.closing.Store(true)
	qp.sendGate.Close()
	qp.recvGate.Close()
}

// errClosed is the error of a call on a closed QP.
func (qp *QP) errClosed() error { return fmt.Errorf("%w: QP %d", ErrClosed, qp.qpn) }

// refused is the error of a post its queue's gate refused: the QP is
// closed (ErrClosed), or on its way to ERR (ErrQPState, SetError).
//
//go:noinline
func (qp *QP) refused(w *wq.Queue, id uint64) error {
	err := qp.errClosed()
	if !qp.closing.Load() {
		err = fmt.Errorf("%w: QP %d is going to ERR", ErrQPState, qp.qpn)
	}
	return &PostError{Queue: w.Name(), WRID: id, Err: err}
}

// startFlush hands the QP's outstanding work requests to their CQs, which
// complete them with WR_FLUSH_ERR once the device's own completions for
// the QP have been polled.
func (qp *QP) startFlush() {
	qp.sendCQ.addFlush(flushSource{qp: qp, w: &qp.sq, op: WCSend, cons: qp.sq.ConsHead()})
	if qp.srq == nil {
		qp.recvCQ.addFlush(flushSource{qp: qp, w: &qp.rq, op: WCRecv})
	}
}

// Close destroys the QP. Work requests still outstanding complete with
// WR_FLUSH_ERR on their CQs (poll them after Close), after the device's
// completions already there; the CQs keep what they need for that. An
// unsignaled send the device had consumed is not flushed: it is retired
// without a completion (Outstanding). Posts racing Close complete first
// or are refused with ErrClosed; the rings are freed once none is inside.
// It is idempotent. If the device refuses the DESTROY, Close returns its
// error and the QP stays as it was.
func (qp *QP) Close() error {
	return qp.d.closeObject("destroy QP", qp.destroy)
}

func (qp *QP) destroy(ctx context.Context) error {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if qp.closed {
		return nil
	}
	// Posts are refused from here on, and those under way waited out,
	// before the device's QP goes; if it does not, the QP is as it was.
	qp.closing.Store(true)
	qp.holdPosters()
	if err := qp.destroyOnDevice(ctx); err != nil {
		qp.closing.Store(false)
		qp.unholdPosters()
		return err
	}
	qp.recvGate.ShutHeld()
	qp.sendGate.ShutHeld()
	qp.closed = true
	qp.state.Store(uint32(StateErr))
	qp.startFlush()
	qp.d.removeQP(qp)
	qp.pd.hold(-1)
	qp.sendCQ.dropReap(qp) // no reap reads the ring after this
	qp.sendCQ.hold(-1)
	qp.recvCQ.hold(-1)
	// The counters are released now, though the flushes still to be
	// polled count on them (a counter is memory, not a device object).
	releaseCounters(qp.sendCntr, qp.recvCntr)
	if qp.srqm != nil {
		qp.srqm.Detach()
	}
	// The rings are the device's no more, and no poster is inside; the
	// FIFOs live on in the CQs' flush lists until drained.
	return qp.d.freeRing(qp.buf, qp.sq.Data(), qp.rq.Data())
}

// ErrQPState reports a post or a state change that the QP's state does not
// allow.
var ErrQPState = errors.New("vfrdma: wrong QP state")

// drainLimit bounds awaitSends and awaitQuietCQs; drainGrace is how long
// the QP's CQs must have had no CQE written before the destroy.
const (
	drainLimit = 500 * time.Millisecond
	drainGrace = 5 * time.Millisecond
)

// awaitSends waits, on QEMU 7.2 (Device.drainSends), until every send
// posted on the QP and not yet polled has its completion in the send CQ's
// ring, for at most drainLimit or ctx: a send that completes after the
// destroy would meet the race awaitQuietCQs describes.
func (qp *QP) awaitSends(ctx context.Context) {
	if !qp.d.drainSends || qp.sendCQ == nil {
		return
	}
	limit := drainLimit
	h := qp.d.hooks()
	if h != nil && h.drainFor != 0 {
		limit = h.drainFor
	}
	deadline := time.Now().Add(limit)
	for {
		want := qp.sq.OutstandingP()
		if want == 0 || qp.sendCQ.pendingSends(qp.handle) >= want {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// awaitQuietCQs waits, on QEMU 7.2 (Device.drainSends), until no CQE has
// been written to the QP's send or receive CQ for drainGrace, for at most
// drainLimit or ctx. QEMU 7.2 aborts (qemu_mutex_lock_impl: Assertion
// mutex->initialized) when a QP is destroyed while its completion thread
// is still handling one of the QP's completions: the thread writes the
// CQE, then, for an armed CQ, raises the interrupt, which waits for
// QEMU's big lock, and only then takes the request off the QP's list,
// which the destroy frees. A program sees the CQE before the thread is
// done, and a DESTROY_QP, run by the vCPU under the big lock, overtakes
// it. The pause hands the thread the lock and the time to finish (the
// destroying goroutine sleeps, touching no register).
// TestDestroyingAQPTheMomentItsCompletionIsPolledKeepsQEMUAlive aborted
// QEMU in 2 of 3 runs of 1 000 rounds without it. It narrows the window,
// it cannot close it: nothing the device shows says that the thread is
// done, and a completion the peer causes during the destroy meets the
// race still. The first look at a CQ starts its clock, so the first
// destroy on it pauses; later ones find a quiet CQ's clock run.
func (qp *QP) awaitQuietCQs(ctx context.Context) {
	if !qp.d.drainSends {
		return
	}
	h := qp.d.hooks()
	deadline := time.Now().Add(drainLimit)
	for {
		wait := max(qp.sendCQ.quietWait(drainGrace), qp.recvCQ.quietWait(drainGrace))
		if wait <= 0 || ctx.Err() != nil || time.Now().After(deadline) {
			return
		}
		if h != nil && h.drainPause != nil {
			h.drainPause(ctx, wait)
			continue
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
}
