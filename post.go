package vfrdma

import (
	"errors"
	"fmt"

	"github.com/vfrdma/vfrdma/rings"
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

// RecvWR is a receive work request.
type RecvWR struct {
	WRID uint64
	SGEs []SGE
}

// PostError is the error of a post that refused a work request: the ones
// before it in the call were posted (and, with every earlier deferred one,
// handed to the device); this one and the ones after it were not, and make
// no completion.
type PostError struct {
	Queue string // "QP 17", "SRQ 3"
	Index int    // the refused request's index in the call (-1: the doorbell itself failed)
	WRID  uint64 // its wr_id
	Err   error
}

func (e *PostError) Error() string {
	return fmt.Sprintf("vfrdma post on %s: work request %d (wr_id %#x): %v", e.Queue, e.Index, e.WRID, e.Err)
}

// Unwrap returns the cause.
func (e *PostError) Unwrap() error { return e.Err }

// ErrQueueFull reports a work queue with no room: as many requests are
// outstanding (posted and not yet polled from the CQ) as it holds.
var ErrQueueFull = errors.New("vfrdma: queue full")

// PostSend posts wrs to the send queue, in order, as one chain: unless
// flags has FlagDefer, one doorbell hands the chain, and every request
// deferred before it, to the device. Each request is checked before it
// touches the ring (state, SGE count, keys and bounds, GID index, UD
// address, message size, queue room); a refused request stops the call
// with a *PostError, and what came before it is still handed to the device.
// It returns how many requests were posted. It does not allocate.
func (qp *QP) PostSend(wrs []SendWR, flags PostFlags) (int, error) {
	w := &qp.sq
	if qp.State() != StateRTS {
		return 0, w.fail(0, wrID(wrs, nil, 0), fmt.Errorf("%w: sends need RTS, the QP is %v", ErrQPState, qp.State()))
	}
	if _, err := w.prod.Free(); err != nil {
		return 0, w.fail(0, wrID(wrs, nil, 0), err)
	}
	emulated := qp.d.emulated
	var wqe rings.SendWQE
	var ud rings.UDAddr
	for i := range wrs {
		wr := &wrs[i]
		if err := qp.checkSend(wr, emulated); err != nil {
			return i, w.fail(i, wr.WRID, err)
		}
		if w.outstanding() >= len(w.wrids) {
			return i, w.fail(i, wr.WRID, ErrQueueFull)
		}
		wqe = rings.SendWQE{WRID: wr.WRID, Opcode: wireOpcode[wr.Opcode], Flags: uint32(wr.Flags), Imm: wr.Imm, SGEs: wr.SGEs, GIDIndex: qp.gidIdx}
		if qp.typ == UD {
			ah := wr.AH
			ud = rings.UDAddr{RemoteQPN: wr.RemoteQPN, RemoteQKey: wr.RemoteQKey, PortPD: rings.PortPD(qp.pd.handle, 1),
				DGID: ah.dgid, GIDIndex: ah.sgidIndex, HopLimit: ah.hopLimit, TrafficClass: ah.trafficClass, FlowLabel: ah.flowLabel}
			wqe.UD = &ud
			wqe.GIDIndex = ah.sgidIndex
		}
		w.write(&wqe, nil, wr.WRID)
	}
	return len(wrs), w.end(flags)
}

// PostRecv posts wrs to the receive queue as one chain, like PostSend.
// Receives may be posted from INIT on. A UD receive needs UDHeaderRoom
// bytes before the payload.
func (qp *QP) PostRecv(wrs []RecvWR, flags PostFlags) (int, error) {
	w := &qp.rq
	if qp.srq != nil {
		// No doorbell either: QEMU would index a receive ring that does
		// not exist.
		return 0, &PostError{Queue: w.name, WRID: wrID(nil, wrs, 0), Err: invalidf("the QP receives from SRQ %d: post receives there", qp.srq.handle)}
	}
	switch st := qp.State(); st {
	case StateInit, StateRTR, StateRTS:
	default:
		return 0, w.fail(0, wrID(nil, wrs, 0), fmt.Errorf("%w: receives need INIT, RTR or RTS, the QP is %v", ErrQPState, st))
	}
	if _, err := w.prod.Free(); err != nil {
		return 0, w.fail(0, wrID(nil, wrs, 0), err)
	}
	for i := range wrs {
		wr := &wrs[i]
		total, err := checkSGEs(qp.d, qp.pd, wr.SGEs, w.maxSGE)
		if err == nil && qp.typ == UD && total < UDHeaderRoom {
			err = invalidf("a UD receive of %d bytes cannot hold the %d-byte header room", total, UDHeaderRoom)
		}
		if err != nil {
			return i, w.fail(i, wr.WRID, err)
		}
		if w.outstanding() >= len(w.wrids) {
			return i, w.fail(i, wr.WRID, ErrQueueFull)
		}
		w.write(nil, wr.SGEs, wr.WRID)
	}
	return len(wrs), w.end(flags)
}

// Flush rings the doorbells of whatever deferred requests the QP holds.
func (qp *QP) Flush() error {
	err := qp.sq.db.Flush()
	if qp.rq.db != nil { // nil with an SRQ
		err = errors.Join(err, qp.rq.db.Flush())
	}
	return err
}

// write puts one WQE in the next slot and records its wr_id.
func (w *workQueue) write(s *rings.SendWQE, recv []SGE, wrID uint64) {
	slot := w.prod.Next(0)
	b := w.data[slot*w.stride : (slot+1)*w.stride]
	if s != nil {
		rings.PutSendWQE(b, s)
	} else {
		rings.PutRecvWQE(b, wrID, recv)
	}
	w.wrids[w.tail&w.mask] = wrID
	w.tail++
	w.tailP.Store(w.tail)
	w.prod.Advance(1)
	w.db.Added(1)
}

// end closes a post call that succeeded.
func (w *workQueue) end(flags PostFlags) error {
	if err := w.db.Post(flags&FlagDefer != 0); err != nil {
		return &PostError{Queue: w.name, Index: -1, Err: err}
	}
	return nil
}

// fail closes a post call that refused request i: what is pending
// (earlier deferred calls, this call's requests before i) goes to the
// device.
func (w *workQueue) fail(i int, id uint64, cause error) error {
	err := &PostError{Queue: w.name, Index: i, WRID: id, Err: cause}
	if derr := w.db.Fail(); derr != nil {
		err.Err = errors.Join(cause, derr)
	}
	return err
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

func (qp *QP) checkSend(wr *SendWR, emulated bool) error {
	switch wr.Opcode {
	case OpSend:
	case OpSendWithImm, OpRDMAWrite, OpRDMARead:
		if emulated {
			return fmt.Errorf("%w: opcode %d (QEMU 7.2 runs every send WQE as a plain SEND)", ErrNotSupported, wr.Opcode)
		}
	default:
		return fmt.Errorf("%w: opcode %d", ErrNotSupported, wr.Opcode)
	}
	total, err := checkSGEs(qp.d, qp.pd, wr.SGEs, qp.sq.maxSGE)
	if err != nil {
		return err
	}
	if qp.typ == UD {
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
	} else if !qp.d.gidBound(int(qp.gidIdx)) {
		return invalidf("the QP's source GID index %d is no longer bound", qp.gidIdx)
	}
	return nil
}

// checkSGEs checks the SGE count and that every SGE lies in an MR of pd;
// it returns the total length.
func checkSGEs(d *Device, pd *PD, sges []SGE, maxSGE int) (int, error) {
	if len(sges) > maxSGE {
		return 0, invalidf("%d SGEs: the queue takes at most %d", len(sges), maxSGE)
	}
	total := 0
	for j := range sges {
		s := &sges[j]
		mr := d.lkeys.lookup(s.LKey)
		switch {
		case mr == nil:
			return 0, invalidf("SGE %d: lkey %#x names no registered MR", j, s.LKey)
		case mr.pd != pd:
			return 0, invalidf("SGE %d: lkey %#x belongs to another PD", j, s.LKey)
		case !mr.contains(s.Addr, s.Length):
			return 0, invalidf("SGE %d: %d bytes at %#x fall outside the MR [%#x, %#x)", j, s.Length, s.Addr, mr.addr, mr.addr+uint64(len(mr.mem)))
		}
		total += int(s.Length)
	}
	return total, nil
}
