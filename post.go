package vfrdma

import (
	"errors"
	"fmt"

	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/rings"
	"github.com/vfrdma/vfrdma/wq"
)

// Opcode is a send work request's operation.
type Opcode uint32

// Send opcodes. The device runs only Send on QEMU 7.2, which treats every
// send WQE as a plain SEND; the others are refused there before they reach
// the ring (ErrNotSupported) rather than silently sent as SENDs. On a
// VMware device, UD QPs run Send and SendWithImm; RC QPs all of them: the
// one-sided operations (RDMA WRITE and READ, the atomics) name the peer's
// memory by SendWR.RemoteAddr and RKey.
const (
	OpSend Opcode = iota // the zero value
	OpSendWithImm
	OpRDMAWrite
	OpRDMARead
	OpRDMAWriteWithImm // an RDMA WRITE that also consumes a receive of the peer, which completes with Imm
	OpAtomicCmpSwap    // 8 bytes at RemoteAddr: if equal to CompareAdd, replaced by Swap; the old value lands in the SGE
	OpAtomicFetchAdd   // 8 bytes at RemoteAddr: CompareAdd added; the old value lands in the SGE
	numOpcodes
)

var opcodeNames = [numOpcodes]string{"SEND", "SEND_WITH_IMM", "RDMA_WRITE", "RDMA_READ", "RDMA_WRITE_WITH_IMM", "ATOMIC_CMP_AND_SWP", "ATOMIC_FETCH_AND_ADD"}

func (o Opcode) String() string {
	if o < numOpcodes {
		return opcodeNames[o]
	}
	return fmt.Sprintf("Opcode(%d)", uint32(o))
}

// What an opcode is, for the post path.
const (
	opImm       = 1 << iota // carries immediate data
	opRemote                // one-sided: RC only, RemoteAddr and RKey
	opReadsPeer             // RDMA READ or atomic: the device writes the local SGEs, and needs a read/atomic credit
	opAtomic                // 8 bytes, 8-aligned, one SGE
)

// opcodes maps Opcode to the device's WR opcode (enum pvrdma_wr_opcode, as
// Linux's ib_wr_opcode_to_pvrdma maps the verbs ones; never rdma-core's
// cast of the ibv enum) and what the post path checks.
var opcodes = [numOpcodes]struct {
	wire uint32
	kind uint8
}{
	OpSend:             {rings.WRSend, 0},
	OpSendWithImm:      {rings.WRSendWithImm, opImm},
	OpRDMAWrite:        {rings.WRRDMAWrite, opRemote},
	OpRDMARead:         {rings.WRRDMARead, opRemote | opReadsPeer},
	OpRDMAWriteWithImm: {rings.WRRDMAWriteWithImm, opRemote | opImm},
	OpAtomicCmpSwap:    {rings.WRAtomicCmpAndSwp, opRemote | opReadsPeer | opAtomic},
	OpAtomicFetchAdd:   {rings.WRAtomicFetchAndAdd, opRemote | opReadsPeer | opAtomic},
}

// The device's atomic_ops capability bits (pvrdma_dev_api.h).
const (
	atomicCapCAS = 1 << 0
	atomicCapFAA = 1 << 1
)

// SendFlags modify a send work request.
type SendFlags uint32

// Send flags (the device header's values). QEMU 7.2 ignores them: every
// send completes, signaled or not. A VMware device honours SendSignaled:
// on a QP without QPConfig.SignalAll, a send without it makes no
// completion unless it fails (its queue slot comes back all the same).
const (
	SendSignaled  SendFlags = rings.SendSignaled
	SendSolicited SendFlags = rings.SendSolicited
	SendFence     SendFlags = rings.SendFence

	sendFlagsKnown = SendSignaled | SendSolicited | SendFence
)

// PostFlags modify a post call.
type PostFlags uint32

// FlagDefer queues the call's work requests without a doorbell (Windows
// NDKPI's NDK_OP_FLAG_DEFER): a later post without it, or QP.Ring (SRQ.Ring), rings one
// doorbell for the whole chain. If a later post fails inline, the deferred
// requests before it are still handed to the device and complete.
const FlagDefer PostFlags = 1 << 0

// SendWR is a send work request. The SGEs slice is read during the post
// only; the caller owns it.
type SendWR struct {
	WRID   uint64
	Opcode Opcode // default OpSend
	Flags  SendFlags
	// Imm is the immediate data of OpSendWithImm and OpRDMAWriteWithImm
	// (the peer's WC.Imm); other opcodes do not send it.
	Imm  uint32
	SGEs []SGE
	// UD only: the destination.
	AH         *AH
	RemoteQPN  uint32
	RemoteQKey uint32
	// RC one-sided operations (RDMA WRITE and READ, atomics): the address
	// in the peer's MR and that MR's MR.RKey. An atomic's address is
	// 8-aligned, and its one SGE is 8 bytes, where the old value lands.
	RemoteAddr uint64
	RKey       uint32
	// Atomics: CompareAdd is the value OpAtomicCmpSwap compares and the
	// addend of OpAtomicFetchAdd; Swap is what OpAtomicCmpSwap writes.
	CompareAdd uint64
	Swap       uint64
}

// RecvWR is a receive work request. No SGEs is a zero-size receive.
type RecvWR = wq.RecvWR

// PostError is the error of a post that refused a work request: the ones
// before it in the call were posted (and, with every earlier deferred one,
// handed to the device); this one and the ones after it were not, and make
// no completion.
type PostError = wq.PostError

// PostSend posts wrs to the send queue, in order, as one chain: unless
// flags has FlagDefer, one doorbell hands the chain, and every request
// deferred before it, to the device. Each request is checked before it
// touches the ring (state, opcode and flags on this device and transport,
// SGE count, keys, access and bounds, GID index, UD address, message size,
// an atomic's size and alignment, queue room); a refused request stops the
// call with a *PostError, and what came before it is still handed to the
// device. It returns how many requests were posted. It does not allocate.
//
// On a device that honours signaling (not QEMU) an unsignaled send makes
// no completion unless it fails; its slot comes back at the first Poll of
// the send CQ that finds the device has consumed it (the send queue's
// consumer index is past it), or that returns the completion of a later
// send on the queue, whichever comes first (QP.Outstanding).
func (qp *QP) PostSend(wrs []SendWR, flags PostFlags) (int, error) {
	if !qp.sendGate.Enter() {
		return 0, qp.refused(&qp.sq, wrID(wrs, nil, 0))
	}
	n, err := qp.postSend(wrs, flags)
	qp.sendGate.Exit()
	return n, err
}

// postSend is PostSend inside the send queue's gate.
func (qp *QP) postSend(wrs []SendWR, flags PostFlags) (int, error) {
	w := &qp.sq
	if st := qp.State(); st != StateRTS {
		return 0, w.Fail(0, wrID(wrs, nil, 0), fmt.Errorf("%w: sends need RTS, the QP is %v", ErrQPState, st))
	}
	room, err := w.PostRoom()
	if err != nil {
		return 0, w.Fail(0, wrID(wrs, nil, 0), err)
	}
	// What holds for the whole chain is checked once.
	if qp.typ == RC && !qp.d.gidBound(int(qp.gidIdx)) {
		return 0, w.Fail(0, wrID(wrs, nil, 0), invalidf("the QP's source GID index %d is no longer bound", qp.gidIdx))
	}
	emulated := qp.d.emulated
	sigAll := uint32(0) // the driver counts every request signaled
	if qp.sigAll {
		sigAll = rings.SendSignaled
	}
	sges := wq.NewSGEChecker(&qp.d.lkeys, qp.pd.handle, w.MaxSGE(), false)
	wqe := rings.SendWQE{GIDIndex: qp.gidIdx}
	var ud rings.UDAddr
	if qp.typ == UD {
		ud.PortPD = rings.PortPD(qp.pd.handle, 1)
		wqe.UD = &ud
	}
	for i := range wrs {
		wr := &wrs[i]
		if err := qp.checkSend(wr, &sges, emulated); err != nil {
			return i, qp.failSend(i, wr.WRID, err)
		}
		if i >= room {
			return i, qp.failSend(i, wr.WRID, ErrQueueFull)
		}
		op := &opcodes[wr.Opcode] // checked
		wqe.WRID, wqe.Opcode, wqe.Flags, wqe.SGEs = wr.WRID, op.wire, uint32(wr.Flags)|sigAll, wr.SGEs
		wqe.Imm = 0
		if op.kind&opImm != 0 {
			wqe.Imm = wr.Imm
		}
		if ah := wr.AH; qp.typ == UD {
			ud.RemoteQPN, ud.RemoteQKey = wr.RemoteQPN, wr.RemoteQKey
			ud.DGID, ud.GIDIndex, ud.HopLimit, ud.TrafficClass, ud.FlowLabel = ah.dgid, ah.sgidIndex, ah.hopLimit, ah.trafficClass, ah.flowLabel
			wqe.GIDIndex = ah.sgidIndex
		} else {
			wqe.RemoteAddr, wqe.RKey, wqe.CompareAdd, wqe.Swap = wr.RemoteAddr, wr.RKey, wr.CompareAdd, wr.Swap
		}
		rings.PutSendWQE(w.ClaimSend(wr.WRID, wqe.Flags&rings.SendSignaled != 0), &wqe)
	}
	err = w.End(flags&FlagDefer != 0)
	if w.TookUnsignaled() {
		qp.askReap()
	}
	return len(wrs), err
}

// failSend closes a send post call that refused request i (wr_id id) for
// cause, as wq.Queue.Fail does, and asks for reaps if the requests it
// posted before i include unsignaled ones.
func (qp *QP) failSend(i int, id uint64, cause error) error {
	err := qp.sq.Fail(i, id, cause)
	if qp.sq.TookUnsignaled() {
		qp.askReap()
	}
	return err
}

// askReap asks the send CQ's Polls to retire the unsignaled sends the
// device has consumed (and hand back their slots), from the next Poll on
// until the device has consumed every send posted: on a selective send
// queue (a device that honours signaling, a QP without SignalAll), after a
// post call that handed the device unsignaled sends, once per request
// pending. The CQ keeps the QP in its reaps meanwhile, so a queue whose
// slots unsignaled sends hold never waits for another post to get them
// back.
func (qp *QP) askReap() {
	if qp.sq.WantReap() {
		qp.sendCQ.addReap(qp)
	}
}

// PostRecv posts wrs to the receive queue as one chain, like PostSend.
// Receives may be posted from INIT on. A UD receive needs UDHeaderRoom
// bytes before the payload.
func (qp *QP) PostRecv(wrs []RecvWR, flags PostFlags) (int, error) {
	if !qp.recvGate.Enter() {
		return 0, qp.refused(&qp.rq, wrID(nil, wrs, 0))
	}
	n, err := qp.postRecv(wrs, flags)
	qp.recvGate.Exit()
	return n, err
}

// postRecv is PostRecv inside the receive queue's gate.
func (qp *QP) postRecv(wrs []RecvWR, flags PostFlags) (int, error) {
	w := &qp.rq
	if qp.srq != nil {
		// No doorbell either: QEMU would index a receive ring that does
		// not exist.
		return 0, &PostError{Queue: w.Name(), WRID: wrID(nil, wrs, 0), Err: invalidf("the QP receives from SRQ %d: post receives there", qp.srq.handle)}
	}
	switch st := qp.State(); st {
	case StateInit, StateRTR, StateRTS, StateSQD, StateSQE:
		// SQD and SQE stop the send queue only: receives go on.
	default:
		return 0, w.Fail(0, wrID(nil, wrs, 0), fmt.Errorf("%w: receives need INIT, RTR, RTS, SQD or SQE, the QP is %v", ErrQPState, st))
	}
	if err := w.CheckRing(); err != nil {
		return 0, w.Fail(0, wrID(nil, wrs, 0), err)
	}
	room := w.Room()
	sges := wq.NewSGEChecker(&qp.d.lkeys, qp.pd.handle, w.MaxSGE(), true)
	for i := range wrs {
		wr := &wrs[i]
		total, err := sges.Check(wr.SGEs)
		if err == nil && qp.typ == UD && total < UDHeaderRoom {
			err = invalidf("a UD receive of %d bytes cannot hold the %d-byte header room", total, UDHeaderRoom)
		}
		if err != nil {
			return i, w.Fail(i, wr.WRID, err)
		}
		if i >= room {
			return i, w.Fail(i, wr.WRID, ErrQueueFull)
		}
		rings.PutRecvWQE(w.Claim(wr.WRID), wr.WRID, wr.SGEs)
	}
	return len(wrs), w.End(flags&FlagDefer != 0)
}

// Ring rings the doorbells for the requests posted with FlagDefer and not
// yet handed to the device, on both queues. It is a post for the
// lifecycle: each queue's poster calls it (or one goroutine posting to
// both), and on a closed QP it returns ErrClosed. A doorbell store that
// fails is its error, and the requests stay deferred for the next ring.
func (qp *QP) Ring() error {
	var errs [2]error
	if !qp.sendGate.Enter() {
		errs[0] = qp.refused(&qp.sq, 0)
	} else {
		errs[0] = qp.sq.Ring()
		qp.sendGate.Exit()
	}
	if !qp.recvGate.Enter() {
		errs[1] = qp.refused(&qp.rq, 0)
	} else {
		errs[1] = qp.rq.Ring()
		qp.recvGate.Exit()
	}
	return errors.Join(errs[0], errs[1])
}

// wrID returns the wr_id of request i of a call, or 0.
func wrID(swrs []SendWR, rwrs []RecvWR, i int) uint64 {
	switch {
	case i < len(swrs):
		return swrs[i].WRID
	case i < len(rwrs):
		return rwrs[i].WRID
	}
	return 0
}

// checkSend checks a send request, its SGEs with the call's checker.
func (qp *QP) checkSend(wr *SendWR, sges *wq.SGEChecker, emulated bool) error {
	if wr.Opcode != OpSend || wr.Flags&^sendFlagsKnown != 0 {
		return qp.checkOp(wr, sges, emulated)
	}
	total, err := sges.Check(wr.SGEs)
	if err != nil {
		return err
	}
	if qp.typ == UD {
		return qp.checkUD(wr, total)
	}
	return nil
}

// checkOp checks a request other than a plain SEND (or one with flags the
// driver does not post): what the device and the transport run, then the
// operation's own rules, then the SGEs.
//
//go:noinline
func (qp *QP) checkOp(wr *SendWR, sges *wq.SGEChecker, emulated bool) error {
	if f := wr.Flags &^ sendFlagsKnown; f != 0 {
		return fmt.Errorf("%w: send flags %#x (the driver posts SendSignaled, SendSolicited and SendFence)", ErrNotSupported, uint32(f))
	}
	op := wr.Opcode
	if op >= numOpcodes {
		return fmt.Errorf("%w: opcode %d", ErrNotSupported, uint32(op))
	}
	if emulated && op != OpSend {
		return fmt.Errorf("%w: %v (QEMU 7.2 runs every send WQE as a plain SEND, without immediate data)", ErrNotSupported, op)
	}
	kind := opcodes[op].kind
	if kind&opRemote != 0 {
		if qp.typ != RC {
			return invalidf("%v on a %v QP: one-sided operations need RC", op, qp.typ)
		}
		if err := qp.checkRemote(wr, kind); err != nil {
			return err
		}
	}
	var total int
	var err error
	if kind&opReadsPeer != 0 {
		total, err = sges.CheckWrite(wr.SGEs) // the device writes what it fetched
	} else {
		total, err = sges.Check(wr.SGEs)
	}
	if err != nil {
		return err
	}
	if qp.typ == UD {
		return qp.checkUD(wr, total)
	}
	return nil
}

// checkRemote checks an RC one-sided request against the device's
// capabilities and the operation's shape.
func (qp *QP) checkRemote(wr *SendWR, kind uint8) error {
	op := wr.Opcode
	d := qp.d
	if kind&opReadsPeer != 0 && qp.rdAtomic == 0 {
		return fmt.Errorf("%w: %v: the device allows no RDMA READ or atomic in flight (max_qp_init_rd_atom %d)", ErrNotSupported, op, d.caps.MaxQPInitRDAtom)
	}
	if kind&opAtomic != 0 {
		need := uint8(atomicCapCAS)
		if op == OpAtomicFetchAdd {
			need = atomicCapFAA
		}
		switch {
		case d.caps.AtomicOps&need == 0:
			return fmt.Errorf("%w: %v: the device's atomic_ops %#x lack it", ErrNotSupported, op, d.caps.AtomicOps)
		case len(wr.SGEs) != 1 || wr.SGEs[0].Length != 8:
			return invalidf("%v takes one SGE of 8 bytes, for the old value", op)
		case wr.RemoteAddr%8 != 0:
			return invalidf("%v at %#x: the remote address must be 8-aligned", op, wr.RemoteAddr)
		}
	}
	if op == OpRDMARead {
		if lim := qp.d.maxSGERd(); len(wr.SGEs) > lim {
			return invalidf("an RDMA READ of %d SGEs: the device reads into at most %d (max_sge_rd)", len(wr.SGEs), lim)
		}
	}
	return nil
}

// maxSGERd is the SGE limit of an RDMA READ: caps.max_sge_rd from version
// 18 on (when set), else max_sge (Linux's PVRDMA_GET_CAP).
func (d *Device) maxSGERd() int {
	if d.version >= firmware.VersionRoCEv2 && d.caps.MaxSGERD != 0 {
		return int(d.caps.MaxSGERD)
	}
	return int(d.caps.MaxSGE)
}

// checkUD checks a UD send's address and size.
func (qp *QP) checkUD(wr *SendWR, total int) error {
	switch {
	case wr.AH == nil:
		return invalidf("a UD send needs an address handle")
	case wr.AH.pd != qp.pd:
		return invalidf("the address handle belongs to another PD")
	case !qp.d.gidBound(int(wr.AH.sgidIndex)):
		return invalidf("the address handle's source GID index %d is not bound", wr.AH.sgidIndex)
	case total > qp.udMax:
		return invalidf("a UD message of %d bytes exceeds the path MTU of %d", total, qp.udMax)
	}
	return nil
}
