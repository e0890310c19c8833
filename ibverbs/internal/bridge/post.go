package bridge

import (
	"errors"
	"fmt"
	"math/bits"
	"unsafe"

	"github.com/vfrdma/vfrdma"
)

// The verbs' send opcodes (enum ibv_wr_opcode) and send flags.
const (
	WRRDMAWrite        = 0
	WRRDMAWriteWithImm = 1
	WRSend             = 2
	WRSendWithImm      = 3
	WRRDMARead         = 4
	WRAtomicCmpSwp     = 5
	WRAtomicFetchAdd   = 6

	SendFence     = 1 << 0
	SendSignaled  = 1 << 1
	SendSolicited = 1 << 2
	SendInline    = 1 << 3
)

var opcodeOf = [...]vfrdma.Opcode{
	WRRDMAWrite:        vfrdma.OpRDMAWrite,
	WRRDMAWriteWithImm: vfrdma.OpRDMAWriteWithImm,
	WRSend:             vfrdma.OpSend,
	WRSendWithImm:      vfrdma.OpSendWithImm,
	WRRDMARead:         vfrdma.OpRDMARead,
	WRAtomicCmpSwp:     vfrdma.OpAtomicCmpSwap,
	WRAtomicFetchAdd:   vfrdma.OpAtomicFetchAdd,
}

// SendReq is struct ibv_send_wr as the cgo layer copies it: SGEs is the
// QP's scratch for this request (capacity: the QP's max_send_sge), NumSGE
// what the program asked for (more than the capacity is EINVAL at post).
type SendReq struct {
	WRID       uint64
	Opcode     uint32
	Flags      uint32
	ImmBE      uint32 // imm_data as the program stored it (network order)
	NumSGE     int
	SGEs       []vfrdma.SGE
	RemoteAddr uint64
	RKey       uint32
	CompareAdd uint64
	Swap       uint64
	AH         uint32 // UD: the AH's id
	RemoteQPN  uint32
	RemoteQKey uint32
}

// RecvReq is struct ibv_recv_wr as the cgo layer copies it.
type RecvReq struct {
	WRID   uint64
	NumSGE int
	SGEs   []vfrdma.SGE
}

type sendScratch struct {
	reqs []SendReq
	wrs  []vfrdma.SendWR
}

func (s *sendScratch) init(n, sge int) {
	s.reqs = make([]SendReq, n)
	s.wrs = make([]vfrdma.SendWR, n)
	back := make([]vfrdma.SGE, n*sge)
	for i := range s.reqs {
		s.reqs[i].SGEs = back[i*sge : (i+1)*sge : (i+1)*sge]
	}
}

type recvScratch struct {
	reqs []RecvReq
	wrs  []vfrdma.RecvWR
}

func (s *recvScratch) init(n, sge int) {
	s.reqs = make([]RecvReq, n)
	s.wrs = make([]vfrdma.RecvWR, n)
	back := make([]vfrdma.SGE, n*sge)
	for i := range s.reqs {
		s.reqs[i].SGEs = back[i*sge : (i+1)*sge : (i+1)*sge]
	}
}

// BeginSend takes the QP's send scratch, which the cgo layer fills before
// PostSend: at most len of it per call (the send queue's depth, the most
// one post can take). The verbs let many threads post to one QP and the
// driver takes one poster per queue, so BeginSend locks the scratch and
// PostSend, which must follow, unlocks it.
func (qp *QP) BeginSend() []SendReq {
	qp.sendMu.Lock()
	return qp.sends.reqs
}

// BeginRecv takes the receive scratch for PostRecv likewise (empty for a
// QP of an SRQ).
func (qp *QP) BeginRecv() []RecvReq {
	qp.recvMu.Lock()
	return qp.recvs.reqs
}

// PostSend posts BeginSend()[:n], unlocks the scratch, and returns how
// many were posted: the
// requests before the first refused one. A refusal (too many SGEs, an
// opcode the QP's type does not run, an AH of another PD, a bad key, the
// wrong state, a full queue) is the error, with Errno's value. It
// allocates nothing.
func (qp *QP) PostSend(n int) (int, error) {
	defer qp.sendMu.Unlock()
	s := &qp.sends
	ok, err := n, error(nil)
	inl := 0
	for i := range n {
		r, w := &s.reqs[i], &s.wrs[i]
		if err = qp.checkSend(r); err != nil {
			ok = i
			break
		}
		if r.Flags&SendInline != 0 {
			if err = qp.inline(r, inl); err != nil {
				ok = i
				break
			}
			inl++
		}
		w.WRID = r.WRID
		w.Opcode = opcodeOf[r.Opcode]
		w.Flags = 0
		if r.Flags&SendSignaled != 0 {
			w.Flags |= vfrdma.SendSignaled
		}
		if qp.sig != nil {
			qp.sig.push(i, r.WRID, r.Flags&SendSignaled != 0)
		}
		if r.Flags&SendSolicited != 0 {
			w.Flags |= vfrdma.SendSolicited
		}
		if r.Flags&SendFence != 0 {
			w.Flags |= vfrdma.SendFence
		}
		w.Imm = bits.ReverseBytes32(r.ImmBE)
		w.SGEs = r.SGEs[:r.NumSGE]
		w.RemoteAddr = r.RemoteAddr
		w.RKey, w.CompareAdd, w.Swap = r.RKey, r.CompareAdd, r.Swap
		w.AH, w.RemoteQPN, w.RemoteQKey = nil, 0, 0
		if qp.typ == QPTypeUD {
			w.AH = ahs.get(r.AH).ah
			w.RemoteQPN = r.RemoteQPN
			w.RemoteQKey = r.RemoteQKey
			if int32(r.RemoteQKey) < 0 { // the high bit: the QP's own Q_Key
				w.RemoteQKey = qp.attr.QKey
			}
		}
	}
	if ok == 0 {
		return 0, err
	}
	if qp.sig != nil {
		qp.sig.publish(ok) // before the device can complete them
	}
	posted, perr := qp.qp.PostSend(s.wrs[:ok], 0)
	if qp.sig != nil && posted < ok {
		qp.sig.tail.Add(^uint32(ok - posted - 1)) // the refused ones: never completed
	}
	if inl > 0 {
		for i := range posted {
			if s.reqs[i].Flags&SendInline != 0 {
				qp.inlNext++
			}
		}
	}
	if perr != nil {
		return posted, perr
	}
	return posted, err
}

// inline copies an inline request's bytes (its SGEs name the program's
// memory, keys ignored) into its slot of the QP's ring, the k-th of the
// call, and makes the slot its one SGE. A slot is used again only
// max_send_wr inline requests later, when its request has left the
// queue.
func (qp *QP) inline(r *SendReq, k int) error {
	total := 0
	for _, g := range r.SGEs[:r.NumSGE] {
		total += int(g.Length)
	}
	if qp.inl == nil || total > qp.inlSlot {
		return fmt.Errorf("%w: %d bytes of inline data (the QP takes %d)", errInvalid, total, qp.inlSlot)
	}
	if r.Opcode == WRRDMARead || r.Opcode == WRAtomicCmpSwp || r.Opcode == WRAtomicFetchAdd {
		return fmt.Errorf("%w: inline data on opcode %d", errInvalid, r.Opcode)
	}
	slot := (qp.inlNext + k) % qp.cap.MaxSendWR
	dst := qp.inlMem[slot*qp.inlSlot : (slot+1)*qp.inlSlot]
	off := 0
	for _, g := range r.SGEs[:r.NumSGE] {
		if g.Length == 0 {
			continue
		}
		src := unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&g.Addr))), g.Length)
		off += copy(dst[off:], src)
	}
	r.SGEs[0] = qp.inl.SGE(slot*qp.inlSlot, total)
	r.NumSGE = 1
	return nil
}

func (qp *QP) checkSend(r *SendReq) error {
	if r.NumSGE < 0 || r.NumSGE > len(r.SGEs) {
		return fmt.Errorf("%w: %d SGEs (the QP takes %d)", errInvalid, r.NumSGE, len(r.SGEs))
	}
	if int(r.Opcode) >= len(opcodeOf) {
		return fmt.Errorf("%w: send opcode %d", errInvalid, r.Opcode)
	}
	if qp.typ == QPTypeUD {
		if r.Opcode != WRSend && r.Opcode != WRSendWithImm {
			return fmt.Errorf("%w: UD runs SEND and SEND_WITH_IMM, not opcode %d", errInvalid, r.Opcode)
		}
		ah := ahs.get(r.AH)
		if ah == nil || ah.pd.ctx != qp.ctx {
			return fmt.Errorf("%w: a UD send without a valid AH", errInvalid)
		}
	}
	return nil
}

// PostRecv posts BeginRecv()[:n] with PostSend's rules, and unlocks the
// scratch.
func (qp *QP) PostRecv(n int) (int, error) {
	defer qp.recvMu.Unlock()
	if qp.srq != nil {
		return 0, fmt.Errorf("%w: the QP takes its receives from an SRQ", errInvalid)
	}
	return postRecv(&qp.recvs, n, qp.qp.PostRecv)
}

func postRecv(s *recvScratch, n int, post func([]vfrdma.RecvWR, vfrdma.PostFlags) (int, error)) (int, error) {
	ok, err := n, error(nil)
	for i := range n {
		r, w := &s.reqs[i], &s.wrs[i]
		if r.NumSGE < 0 || r.NumSGE > len(r.SGEs) {
			ok, err = i, fmt.Errorf("%w: %d SGEs (the queue takes %d)", errInvalid, r.NumSGE, len(r.SGEs))
			break
		}
		w.WRID = r.WRID
		w.SGEs = r.SGEs[:r.NumSGE]
	}
	if ok == 0 {
		return 0, err
	}
	posted, perr := post(s.wrs[:ok], 0)
	if perr != nil {
		return posted, perr
	}
	return posted, err
}

// IsPostError reports whether err refused a request (rather than the
// call): for tests.
func IsPostError(err error) bool {
	var pe *vfrdma.PostError
	return errors.As(err, &pe)
}
