package vfrdma

import (
	"errors"
	"fmt"

	"github.com/vfrdma/vfrdma/rings"
	"github.com/vfrdma/vfrdma/wq"
)

// Opcode is a send work request's operation.
type Opcode uint32

// Send opcodes. The device runs only Send on QEMU 7.2, which treats every
// send WQE as a plain SEND; the others are refused there before they reach
// the ring (ErrNotSupported) rather than silently sent as SENDs.
const (
	OpSend Opcode = iota // the zero value
	OpSendWithImm
	OpRDMAWrite
	OpRDMARead
)

// wireOpcode maps Opcode to the device's WR opcode.
var wireOpcode = [...]uint32{OpSend: rings.WRSend, OpSendWithImm: rings.WRSendWithImm, OpRDMAWrite: rings.WRRDMAWrite, OpRDMARead: rings.WRRDMARead}

// SendFlags modify a send work request.
type SendFlags uint32

// Send flags (the device header's values). QEMU 7.2 ignores them: every
// send completes, signaled or not.
const (
	SendSignaled  SendFlags = rings.SendSignaled
	SendSolicited SendFlags = rings.SendSolicited
	SendFence     SendFlags = rings.SendFence
)

// PostFlags modify a post call.
type PostFlags uint32

// FlagDefer queues the call's work requests without a doorbell (Windows
// NDKPI's NDK_OP_FLAG_DEFER): a later post without it, or Flush, rings one
// doorbell for the whole chain. If a later post fails inline, the deferred
// requests before it are still handed to the device and complete.
const FlagDefer PostFlags = 1 << 0

// SendWR is a send work request. The SGEs slice is read during the post
// only; the caller owns it.
type SendWR struct {
	WRID   uint64
	Opcode Opcode // default OpSend
	Flags  SendFlags
	Imm    uint32
	SGEs   []SGE
	// UD only: the destination.
	AH         *AH
	RemoteQPN  uint32
	RemoteQKey uint32
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
// touches the ring (state, SGE count, keys and bounds, GID index, UD
// address, message size, queue room); a refused request stops the call
// with a *PostError, and what came before it is still handed to the device.
// It returns how many requests were posted. It does not allocate.
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
	if err := w.CheckRing(); err != nil {
		return 0, w.Fail(0, wrID(wrs, nil, 0), err)
	}
	// What holds for the whole chain is checked once.
	if qp.typ == RC && !qp.d.gidBound(int(qp.gidIdx)) {
		return 0, w.Fail(0, wrID(wrs, nil, 0), invalidf("the QP's source GID index %d is no longer bound", qp.gidIdx))
	}
	room := w.Room()
	emulated := qp.d.emulated
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
			return i, w.Fail(i, wr.WRID, err)
		}
		if i >= room {
			return i, w.Fail(i, wr.WRID, ErrQueueFull)
		}
		wqe.WRID, wqe.Opcode, wqe.Flags, wqe.Imm, wqe.SGEs = wr.WRID, wireOpcode[wr.Opcode], uint32(wr.Flags), wr.Imm, wr.SGEs
		if ah := wr.AH; qp.typ == UD {
			ud.RemoteQPN, ud.RemoteQKey = wr.RemoteQPN, wr.RemoteQKey
			ud.DGID, ud.GIDIndex, ud.HopLimit, ud.TrafficClass, ud.FlowLabel = ah.dgid, ah.sgidIndex, ah.hopLimit, ah.trafficClass, ah.flowLabel
			wqe.GIDIndex = ah.sgidIndex
		}
		rings.PutSendWQE(w.Claim(wr.WRID), &wqe)
	}
	return len(wrs), w.End(flags&FlagDefer != 0)
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
	case StateInit, StateRTR, StateRTS:
	default:
		return 0, w.Fail(0, wrID(nil, wrs, 0), fmt.Errorf("%w: receives need INIT, RTR or RTS, the QP is %v", ErrQPState, st))
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

// Flush rings the doorbells of whatever deferred requests the QP holds.
// It is a post for the lifecycle: each queue's poster calls it (or one
// goroutine posting to both), and on a closed QP it returns ErrClosed.
func (qp *QP) Flush() error {
	var errs [2]error
	if !qp.sendGate.Enter() {
		errs[0] = qp.refused(&qp.sq, 0)
	} else {
		errs[0] = qp.sq.Flush()
		qp.sendGate.Exit()
	}
	if !qp.recvGate.Enter() {
		errs[1] = qp.refused(&qp.rq, 0)
	} else {
		errs[1] = qp.rq.Flush()
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
	if wr.Opcode != OpSend {
		if err := checkOpcode(wr.Opcode, emulated); err != nil {
			return err
		}
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

// checkOpcode refuses what the device does not run.
func checkOpcode(op Opcode, emulated bool) error {
	switch op {
	case OpSend:
	case OpSendWithImm, OpRDMAWrite, OpRDMARead:
		if emulated {
			return fmt.Errorf("%w: opcode %d (QEMU 7.2 runs every send WQE as a plain SEND)", ErrNotSupported, op)
		}
	default:
		return fmt.Errorf("%w: opcode %d", ErrNotSupported, op)
	}
	return nil
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
