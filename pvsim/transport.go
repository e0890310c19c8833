package pvsim

import (
	"encoding/binary"
	"time"

	fw "github.com/vfrdma/vfrdma/firmware"
)

// The transport between QPs: the model's stand-in for RoCE. A request is
// a packet from the requester's device to the device that holds its
// destination GID (Fabric), handled there on that device's goroutine; the
// response goes back the same way. RC requests carry PSNs: the responder
// executes only the one it expects, answers each with an ACK, a NAK (RNR,
// invalid request, remote access, remote operational error) or the READ
// or atomic data, and drops the rest; the requester completes its
// requests in order as the answers come, goes back to the first
// unanswered one after an RNR NAK (once the responder's RNR timer has run)
// or after its local ACK timeout, and gives up after rnr_retry RNR NAKs
// (7: never) or retry_cnt timeouts. The fabric loses nothing, so a
// timeout means the responder dropped the request: it was not ready (not
// yet in RTR), misaddressed, or gone; or the fabric was told to lose the
// answer (LoseAnswers). A timeout that comes due while the request or its
// answer is still inside the model is no loss and waits (ackTimeout).

type pktKind uint8

const (
	pktSend   pktKind = iota // SEND, SEND with immediate (RC or UD)
	pktWrite                 // RDMA WRITE (with immediate)
	pktRead                  // RDMA READ request
	pktAtomic                // compare-and-swap, fetch-and-add
	pktAck
	pktNak
	pktReadResp
	pktAtomicResp
)

type nakKind uint8

const (
	nakRNR nakKind = iota + 1
	nakInvReq
	nakAccess
	nakRemOp
)

// packet is a message on the fabric. It is not changed once sent (a
// retransmission sends the same one).
type packet struct {
	kind      pktKind
	from      endpoint // where answers go: the sending device, or the connection from its process
	ud        bool
	srcGID    [16]byte
	dstGID    [16]byte
	gidType   uint8
	srcQPN    uint32
	dstQPN    uint32
	psn       uint32
	payload   []byte
	imm       uint32
	withImm   bool
	solicited bool
	raddr     uint64
	rkey      uint32
	length    uint32
	cmp, swap uint64
	fetchAdd  bool
	qkey      uint32
	tclass    uint8
	hopLimit  uint8
	flow      uint32
	nak       nakKind
	rnrTimer  uint8
	orig      uint64
	token     uint64 // a request's or a notice's, across processes only (fabricdir.go)
	// inModel is the requester QP's count of its packets inside the model
	// (qp.inModel), on RC requests and their answers; nil on datagrams. A
	// request from another process carries its origin's count by proxy
	// (fabricdir.go: remoteCount).
	inModel modelCount
}

// modelCount counts a QP's packets inside the model: *atomic.Int64, or a
// peer process's count by proxy.
type modelCount interface {
	Add(delta int64) int64
}

// endpoint is where a packet's answers go: a Device, or a peer process's
// connection (fabricdir.go).
type endpoint interface {
	push(ev event) bool
}

// PSNs are 24 bits.
const psnMask = 1<<24 - 1

// psnBefore reports whether a comes before b in PSN order.
func psnBefore(a, b uint32) bool {
	d := (b - a) & psnMask
	return d != 0 && d < 1<<23
}

// udMax is the port's active MTU (QUERY_PORT), the largest UD message:
// 4096 bytes in QEMU mode (QEMU passes the bench backend's through), 1024
// on a VMware device.
func (d *Device) udMax() int {
	if d.s.qemu {
		return 4096
	}
	return 1024
}

// execSend runs a send WQE the device fetched (op holds its completion).
func (d *Device) execSend(q *qp, op *sendOp, w *sendWQE) {
	switch q.typ {
	case fw.QPTypeUD:
		d.sendUD(q, op, w)
		return
	case fw.QPTypeRC:
	default:
		// GSI: MADs are not modelled (QEMU sends them to its MAD mux).
		op.vendorErr = vendorMADSend
		d.failFetched(q, op, d.pick(wcGeneralErr, wcLocQPOpErr))
		return
	}
	sg := q.attr.sgidIndex()
	if int(sg) >= len(d.w.gids) || !d.w.gids[sg].valid {
		d.failFetched(q, op, wcLocQPOpErr)
		return
	}
	p := &packet{from: d, srcGID: d.w.gids[sg].gid, gidType: d.w.gids[sg].typ, dstGID: q.attr.dgid(),
		srcQPN: q.qpn, dstQPN: q.attr.destQPN, solicited: w.flags&sendSolicited != 0, inModel: &q.inModel}
	st := uint32(wcSuccess)
	switch w.opcode {
	case wrSend, wrSendWithImm, wrRDMAWrite, wrRDMAWriteWithImm:
		p.kind = pktSend
		if w.opcode == wrRDMAWrite || w.opcode == wrRDMAWriteWithImm {
			p.kind, p.raddr, p.rkey = pktWrite, w.raddr, w.rkey
		}
		p.withImm = w.opcode == wrSendWithImm || w.opcode == wrRDMAWriteWithImm
		p.imm = w.imm
		p.payload, st = d.gather(q, w.sges, vmwMaxMsg)
		op.length = uint32(len(p.payload))
	case wrRDMARead:
		var n uint64
		n, st = d.checkLocal(q, w.sges)
		if st == wcSuccess && n > vmwMaxMsg {
			st = wcLocLenErr
		}
		p.kind, p.raddr, p.rkey, p.length = pktRead, w.raddr, w.rkey, uint32(n)
		op.local, op.length, op.readLike = append([]sge(nil), w.sges...), uint32(n), true
	case wrAtomicCmpSwp, wrAtomicFetchAdd:
		bit := uint8(atomicCAS)
		if w.opcode == wrAtomicFetchAdd {
			bit = atomicFAA
		}
		if d.s.caps.AtomicOps&bit == 0 {
			st = wcLocQPOpErr
			break
		}
		var n uint64
		n, st = d.checkLocal(q, w.sges)
		if st == wcSuccess && n != 8 {
			st = wcLocLenErr
		}
		p.kind, p.raddr, p.rkey, p.cmp, p.swap = pktAtomic, w.raddr, w.atomRKey, w.cmpAdd, w.swap
		p.fetchAdd = w.opcode == wrAtomicFetchAdd
		op.local, op.length, op.readLike = append([]sge(nil), w.sges...), 8, true
	default:
		st = wcLocQPOpErr // LSO, invalidate, fast-register, masked atomics, MW: not run
	}
	if st != wcSuccess {
		d.failFetched(q, op, st)
		return
	}
	op.psn = q.nextPSN
	p.psn = op.psn
	q.nextPSN = (q.nextPSN + 1) & psnMask
	op.pkt = p
	q.inflight = append(q.inflight, op)
	d.transmit(p)
	d.armAck(q)
}

// pick returns the QEMU value or the VMware one.
func (d *Device) pick(qemu, vmw uint32) uint32 {
	if d.s.qemu {
		return qemu
	}
	return vmw
}

// sendUD sends a datagram: it completes when it leaves (the verbs' UD
// rule), whether or not anyone receives it.
func (d *Device) sendUD(q *qp, op *sendOp, w *sendWQE) {
	if w.opcode != wrSend && w.opcode != wrSendWithImm {
		d.failSend(q, op, wcLocQPOpErr)
		return
	}
	g := w.gidIndex
	if int(g) >= len(d.w.gids) || !d.w.gids[g].valid {
		d.failSend(q, op, wcLocQPOpErr)
		return
	}
	payload, st := d.gather(q, w.sges, uint64(d.udMax()))
	if st != wcSuccess {
		d.failSend(q, op, st)
		return
	}
	p := &packet{kind: pktSend, ud: true, from: d, srcGID: d.w.gids[g].gid, gidType: d.w.gids[g].typ,
		dstGID: w.dgid, srcQPN: q.qpn, dstQPN: w.remoteQPN, qkey: w.remoteQKey, payload: payload,
		withImm: w.opcode == wrSendWithImm, imm: w.imm, solicited: w.flags&sendSolicited != 0,
		tclass: uint8(w.tclassFlow >> 20), flow: w.tclassFlow & 0xFFFFF, hopLimit: w.hopLimit}
	if d.s.qemu {
		p.tclass, p.flow, p.hopLimit = 0, 0, 1 // QEMU's backend AH: hop limit 1, nothing else
	}
	d.transmit(p)
	op.length = uint32(len(payload))
	d.completeSend(q, op, wcSuccess)
}

// qemuSQ is QEMU 7.2's send loop (pvrdma_qp_send, facts sheet §6, §7,
// §11): each WQE is handed to the backend as a signaled SEND of its SGEs,
// whatever its opcode and flags; cons_head advances as it is posted; a
// bad num_sge or an unresolvable GID index makes QEMU complete it in error
// and then spin on it forever; a QP below RTS fails the post.
func (d *Device) qemuSQ(q *qp) {
	var w sendWQE
	for !q.stuck && d.alive(q) {
		cons, avail, err := d.pending(&q.sq, fromCons)
		if err != nil || avail == 0 {
			return
		}
		slot := d.wqe(&q.sq, cons)
		if slot == nil {
			d.hazard("QP %d send queue memory not mapped", q.qpn)
			q.stuck = true
			return
		}
		good := decodeSend(slot, d.s.caps.MaxSGE, &w)
		op := &sendOp{wrID: w.wrID, opcode: wrSend, signaled: true, next: cons + 1}
		if !good {
			d.hazard("send WQE with %d SGEs (max %d): QEMU 7.2 completes it in error and spins on it forever", w.numSGE, d.s.caps.MaxSGE)
			op.vendorErr = vendorBadNumSGE
			d.completeSend(q, op, wcGeneralErr)
			q.stuck = true
			return
		}
		if int(w.gidIndex) >= len(d.w.gids) || !d.w.gids[w.gidIndex].valid {
			d.hazard("send WQE with GID index %d, not bound: QEMU 7.2 completes it in error and spins on it forever", w.gidIndex)
			op.vendorErr = vendorGIDIndex
			d.completeSend(q, op, wcGeneralErr)
			q.stuck = true
			return
		}
		_ = d.setConsHead(&q.sq, cons+1)
		d.ctr.sendWQEs.Add(1)
		switch q.state {
		case stRTS:
		case stErr, stSQE:
			d.completeSend(q, op, wcWRFlushErr)
			continue
		default:
			op.vendorErr = vendorPostFailed
			d.completeSend(q, op, wcGeneralErr)
			continue
		}
		w.opcode, w.flags = wrSend, sendSignaled
		d.execSend(q, op, &w)
	}
}

// transmit puts a packet on the fabric (nothing leaves a port that is
// down).
func (d *Device) transmit(p *packet) {
	d.ctr.packets.Add(1)
	if !d.w.portUp || !d.fab.deliver(p) {
		d.ctr.packetsDropped.Add(1)
	}
}

// reply answers request p.
func (d *Device) reply(p *packet, r *packet) {
	r.from, r.srcQPN, r.dstQPN, r.psn, r.inModel = d, p.dstQPN, p.srcQPN, p.psn, p.inModel
	r.srcGID, r.dstGID = p.dstGID, p.srcGID // an answer from another process finds its device by GID
	d.ctr.packets.Add(1)
	if !d.w.portUp || d.fab.loseAnswer() || !p.from.push(event{kind: evPacket, pkt: r}) {
		d.ctr.packetsDropped.Add(1)
	}
}

func (d *Device) ack(p *packet) { d.reply(p, &packet{kind: pktAck}) }

func (d *Device) nak(q *qp, p *packet, k nakKind) {
	d.reply(p, &packet{kind: pktNak, nak: k, rnrTimer: q.attr.minRNRTimer})
}

// receive handles a packet from the fabric.
func (d *Device) receive(p *packet) {
	if d.fatal.Load() || !d.w.portUp {
		d.ctr.packetsDropped.Add(1)
		return
	}
	switch p.kind {
	case pktAck, pktNak, pktReadResp, pktAtomicResp:
		d.requesterIn(p)
	default:
		d.responderIn(p)
	}
}

func (d *Device) drop() { d.ctr.packetsDropped.Add(1) }

// qpEvent raises a QP's async event (its handle in info).
func (d *Device) qpEvent(q *qp, t fw.EventType) {
	if d.s.qemu {
		return
	}
	q.eventsReported++
	d.raise(t, q.handle)
}

// responderIn handles a request.
func (d *Device) responderIn(p *packet) {
	q := d.w.qpns[p.dstQPN]
	if q == nil {
		d.drop()
		return
	}
	if p.ud {
		d.recvUD(q, p)
		return
	}
	if q.typ != fw.QPTypeRC || p.srcQPN != q.attr.destQPN || p.srcGID != q.attr.dgid() {
		d.drop() // not for this QP's connection
		return
	}
	switch q.state {
	case stRTR, stRTS, stSQD, stSQE:
	default:
		d.drop() // not ready (or failed): the requester retries
		return
	}
	if p.psn != q.epsn {
		if psnBefore(p.psn, q.epsn) {
			d.duplicate(q, p)
		} else {
			d.drop() // after one it NAKed, or out of sequence
		}
		return
	}
	switch p.kind {
	case pktSend:
		d.recvSend(q, p)
	case pktWrite:
		d.recvWrite(q, p)
	case pktRead:
		d.recvRead(q, p)
	case pktAtomic:
		d.recvAtomic(q, p)
	}
}

// responderFail ends a request the responder cannot execute: the NAK,
// an async event for errors no receive WQE reports, and the QP in ERR.
func (d *Device) responderFail(q *qp, p *packet, k nakKind, ev fw.EventType, withEvent bool) {
	d.nak(q, p, k)
	if withEvent {
		d.qpEvent(q, ev)
	}
	d.qpError(q)
}

// takeFor takes a receive for request p, answering it when there is none
// (RNR) or the ring cannot be read. ok is false when p is answered.
func (d *Device) takeFor(q *qp, p *packet) (recvWQE, bool) {
	r, good, err := d.takeRecv(q)
	switch {
	case err == errNoRecv:
		d.ctr.rnrNaks.Add(1)
		d.nak(q, p, nakRNR)
		return r, false
	case err != nil:
		d.nak(q, p, nakRemOp)
		d.ringFault(q, "receive queue", err)
		return r, false
	case !good:
		d.completeRecv(q, &r, wcLocQPOpErr, 0, nil)
		d.responderFail(q, p, nakRemOp, 0, false)
		return r, false
	}
	return r, true
}

func (d *Device) recvSend(q *qp, p *packet) {
	r, okr := d.takeFor(q, p)
	if !okr {
		return
	}
	total, st := d.checkLocal(q, r.sges)
	if st == wcSuccess && uint64(len(p.payload)) > total {
		st = wcLocLenErr
	}
	if st == wcSuccess {
		st = d.scatter(q, r.sges, p.payload)
	}
	if st != wcSuccess {
		d.completeRecv(q, &r, st, 0, nil)
		k := nakRemOp
		if st == wcLocLenErr {
			k = nakInvReq
		}
		d.responderFail(q, p, k, 0, false)
		return
	}
	q.epsn = (q.epsn + 1) & psnMask
	d.completeRecv(q, &r, wcSuccess, uint32(len(p.payload)), p)
	d.ack(p)
}

// remoteMR checks a one-sided request's rkey and range for q: the QP must
// allow the operation (else an invalid request, QP_REQ_ERR), the MR must
// exist in the QP's PD, grant it and hold the range (else a remote access
// error, QP_ACCESS_ERR).
func (d *Device) remoteMR(q *qp, p *packet, qpRight, mrRight uint32, n uint64) *mr {
	if q.attr.access&qpRight == 0 {
		d.responderFail(q, p, nakInvReq, fw.EventQPReqErr, true)
		return nil
	}
	m := d.w.rkeys[p.rkey]
	if m == nil || m.pd != q.pd || m.access&mrRight == 0 || !d.mrAccess(m, p.raddr, n, func([]byte) {}) {
		d.responderFail(q, p, nakAccess, fw.EventQPAccessErr, true)
		return nil
	}
	return m
}

func (d *Device) recvWrite(q *qp, p *packet) {
	n := uint64(len(p.payload))
	m := d.remoteMR(q, p, accRemoteWrite, accRemoteWrite, n)
	if m == nil {
		return
	}
	if p.withImm && !d.hasRecv(q) {
		d.ctr.rnrNaks.Add(1)
		d.nak(q, p, nakRNR)
		return
	}
	data := p.payload
	d.mrAccess(m, p.raddr, n, func(b []byte) { data = data[copy(b, data):] })
	if p.withImm {
		r, okr := d.takeFor(q, p)
		if !okr {
			return
		}
		q.epsn = (q.epsn + 1) & psnMask
		d.completeRecv(q, &r, wcSuccess, uint32(n), p)
	} else {
		q.epsn = (q.epsn + 1) & psnMask
	}
	d.ack(p)
}

func (d *Device) recvRead(q *qp, p *packet) {
	if data, okr := d.readFor(q, p); okr {
		q.epsn = (q.epsn + 1) & psnMask
		d.reply(p, &packet{kind: pktReadResp, payload: data})
	}
}

func (d *Device) readFor(q *qp, p *packet) ([]byte, bool) {
	m := d.remoteMR(q, p, accRemoteRead, accRemoteRead, uint64(p.length))
	if m == nil {
		return nil, false
	}
	data := make([]byte, 0, p.length)
	d.mrAccess(m, p.raddr, uint64(p.length), func(b []byte) { data = append(data, b...) })
	return data, true
}

func (d *Device) recvAtomic(q *qp, p *packet) {
	if q.attr.access&accRemoteAtomic == 0 || p.raddr%8 != 0 {
		d.responderFail(q, p, nakInvReq, fw.EventQPReqErr, true)
		return
	}
	m := d.remoteMR(q, p, accRemoteAtomic, accRemoteAtomic, 8)
	if m == nil {
		return
	}
	var orig uint64
	done := false
	d.mrAccess(m, p.raddr, 8, func(b []byte) {
		if len(b) == 8 && addrOf(b)%8 == 0 {
			if p.fetchAdd {
				orig = fetchAdd64(b, p.cmp)
			} else {
				orig = compareSwap64(b, p.cmp, p.swap)
			}
			done = true
		}
	})
	if !done {
		d.responderFail(q, p, nakAccess, fw.EventQPAccessErr, true)
		return
	}
	q.atomics[p.psn%uint32(len(q.atomics))] = atomicResult{psn: p.psn, orig: orig, valid: true}
	q.epsn = (q.epsn + 1) & psnMask
	d.reply(p, &packet{kind: pktAtomicResp, orig: orig})
}

// duplicate answers a request executed already (its answer was lost to a
// retransmission): SENDs and WRITEs are acknowledged again, a READ is read
// again, an atomic's first result is sent again (never re-executed).
func (d *Device) duplicate(q *qp, p *packet) {
	switch p.kind {
	case pktSend, pktWrite:
		d.ack(p)
	case pktRead:
		if data, okr := d.readFor(q, p); okr {
			d.reply(p, &packet{kind: pktReadResp, payload: data})
		}
	case pktAtomic:
		if a := q.atomics[p.psn%uint32(len(q.atomics))]; a.valid && a.psn == p.psn {
			d.reply(p, &packet{kind: pktAtomicResp, orig: a.orig})
		}
	}
}

// recvUD delivers a datagram: dropped unless the QP is a UD QP in RTR or
// RTS with the packet's qkey and a receive posted; the receive gets the
// 40-byte GRH, then the payload.
func (d *Device) recvUD(q *qp, p *packet) {
	if q.typ != fw.QPTypeUD || q.state != stRTR && q.state != stRTS && q.state != stSQE {
		d.drop()
		return
	}
	if p.qkey != q.attr.qkey {
		d.ctr.qkeyViolations.Add(1)
		d.drop()
		return
	}
	r, good, err := d.takeRecv(q)
	switch {
	case err == errNoRecv:
		d.ctr.udNoRecv.Add(1)
		d.drop()
		return
	case err != nil:
		d.ringFault(q, "receive queue", err)
		return
	case !good:
		d.completeRecv(q, &r, wcLocQPOpErr, 0, nil)
		d.qpError(q)
		return
	}
	total, st := d.checkLocal(q, r.sges)
	msg := append(grh(p), p.payload...)
	if st == wcSuccess && uint64(len(msg)) > total {
		st = wcLocLenErr
	}
	if st == wcSuccess {
		st = d.scatter(q, r.sges, msg)
	}
	if st != wcSuccess {
		d.completeRecv(q, &r, st, 0, nil)
		d.qpError(q)
		return
	}
	d.completeRecv(q, &r, wcSuccess, uint32(len(msg)), p)
}

// grh builds the 40 bytes a UD receive gets before the payload: RoCE v1
// and RoCE v2 over IPv6 an IPv6-style header (next header 0x1B for the IB
// transport, 17 for UDP), RoCE v2 over IPv4 20 unused bytes and the IPv4
// header (the verbs' convention).
func grh(p *packet) []byte {
	g := make([]byte, 40, 40+len(p.payload))
	be := binary.BigEndian
	if p.gidType == fw.GIDTypeRoCEv2 && isV4Mapped(p.srcGID) {
		h := g[20:]
		h[0], h[1] = 0x45, p.tclass
		be.PutUint16(h[2:], uint16(20+8+12+8+len(p.payload)+4))
		h[6], h[8], h[9] = 0x40, p.hopLimit, 17
		copy(h[12:16], p.srcGID[12:])
		copy(h[16:20], p.dstGID[12:])
		var sum uint32
		for i := 0; i < 20; i += 2 {
			sum += uint32(be.Uint16(h[i:]))
		}
		for sum > 0xffff {
			sum = sum&0xffff + sum>>16
		}
		be.PutUint16(h[10:], ^uint16(sum))
		return g
	}
	g[0] = 6<<4 | p.tclass>>4
	g[1] = p.tclass<<4 | uint8(p.flow>>16&0xF)
	be.PutUint16(g[2:], uint16(p.flow))
	be.PutUint16(g[4:], uint16(12+8+len(p.payload)+4))
	g[6] = 0x1B
	if p.gidType == fw.GIDTypeRoCEv2 {
		g[6] = 17
	}
	g[7] = p.hopLimit
	copy(g[8:24], p.srcGID[:])
	copy(g[24:40], p.dstGID[:])
	return g
}

// requesterIn handles an answer to one of the device's RC requests.
func (d *Device) requesterIn(p *packet) {
	q := d.w.qpns[p.dstQPN]
	if q == nil || q.typ != fw.QPTypeRC || len(q.inflight) == 0 || q.inflight[0].psn != p.psn {
		d.drop() // stale: answered already, flushed, or never ours
		return
	}
	switch q.state {
	case stRTS, stSQD, stSQE:
	default:
		d.drop()
		return
	}
	op := q.inflight[0]
	st := uint32(wcSuccess)
	switch p.kind {
	case pktReadResp:
		if _, st = d.checkLocal(q, op.local); st == wcSuccess {
			st = d.scatter(q, op.local, p.payload)
		}
	case pktAtomicResp:
		var b [8]byte
		le.PutUint64(b[:], p.orig)
		if _, st = d.checkLocal(q, op.local); st == wcSuccess {
			st = d.scatter(q, op.local, b[:])
		}
	case pktNak:
		switch p.nak {
		case nakRNR:
			d.rnr(q, p)
			return
		case nakInvReq:
			st = wcRemInvReqErr
		case nakAccess:
			st = wcRemAccessErr
		default:
			st = wcRemOpErr
		}
	}
	q.inflight = q.inflight[1:]
	q.retries, q.rnrRetries = 0, 0
	if st != wcSuccess {
		d.failSend(q, op, st)
		return
	}
	d.completeSend(q, op, wcSuccess)
	if len(q.inflight) > 0 && q.inflight[0].err != 0 {
		op := q.inflight[0]
		q.inflight = q.inflight[1:]
		d.failSend(q, op, op.err)
		return
	}
	if len(q.inflight) == 0 {
		q.ackTimer.stop()
		q.ackTimer = nil
	} else {
		d.armAck(q)
	}
	d.pumpSQ(q) // a fenced WQE may go now
}

// rnr handles an RNR NAK: retry once the responder's RNR timer has run,
// up to rnr_retry times (7: for ever), then RNR_RETRY_EXC_ERR.
func (d *Device) rnr(q *qp, p *packet) {
	q.rnrRetries++
	if lim := q.attr.rnrRetry; lim != 7 && q.rnrRetries > int(lim) {
		op := q.inflight[0]
		q.inflight = q.inflight[1:]
		d.failSend(q, op, wcRNRRetryExcErr)
		return
	}
	q.rnrWait = true
	q.ackTimer.stop()
	q.rnrTimer.stop()
	q.ackTimer = nil
	q.rnrTimer = d.w.after(rnrDelay(p.rnrTimer), func() {
		if !d.alive(q) || !q.rnrWait {
			return
		}
		q.rnrTimer, q.rnrWait = nil, false
		d.retransmit(q)
		d.pumpSQ(q)
	})
}

// retransmit sends every request in flight again, from the first.
func (d *Device) retransmit(q *qp) {
	for _, op := range q.inflight {
		if op.pkt == nil {
			break // a local error waiting for its turn
		}
		d.ctr.retransmits.Add(1)
		d.transmit(op.pkt)
	}
	if len(q.inflight) > 0 {
		d.armAck(q)
	}
}

// armAck (re)starts the local ACK timeout: 4.096 µs × 2^timeout; 0 is
// infinite (the verbs' rule). One timer per QP: a later deadline moves it
// when it comes due.
func (d *Device) armAck(q *qp) {
	t := q.attr.timeout
	if t == 0 {
		q.ackTimer.stop()
		q.ackTimer = nil
		return
	}
	dur := 4096 * time.Nanosecond << min(t, 31)
	q.ackDeadline = time.Now().Add(dur)
	if q.ackTimer == nil {
		q.ackTimer = d.w.after(dur, func() { d.ackDue(q) })
	}
}

// ackDue runs when the ACK timer comes due: a timeout, or a deadline moved
// since.
func (d *Device) ackDue(q *qp) {
	q.ackTimer = nil
	if !d.alive(q) {
		return
	}
	if left := time.Until(q.ackDeadline); left > 0 {
		q.ackTimer = d.w.after(left, func() { d.ackDue(q) })
		return
	}
	d.ackTimeout(q)
}

// ackTimeout declares the requests in flight lost and sends them again,
// or fails the first once retry_cnt retries have gone unanswered. It
// declares a loss only where one happened: while a request of q's or an
// answer to one is still inside the model (queued in a device's inbox or
// being handled), the fabric has lost nothing and the model is only
// slower than the timeout (many QPs, a loaded host, the race detector),
// so the timer waits one more timeout instead. A request or an answer the
// model dropped (a responder not ready or gone, a port down, an answer
// LoseAnswers took) leaves nothing inside, and times out as on the wire.
func (d *Device) ackTimeout(q *qp) {
	if !d.alive(q) || len(q.inflight) == 0 || q.rnrWait {
		return
	}
	if q.inModel.Load() > 0 {
		d.ctr.timeoutsHeld.Add(1)
		d.armAck(q)
		return
	}
	d.ctr.timeouts.Add(1)
	q.retries++
	if q.retries > int(q.attr.retryCnt) {
		op := q.inflight[0]
		q.inflight = q.inflight[1:]
		d.failSend(q, op, wcRetryExcErr)
		return
	}
	d.retransmit(q)
}

// rnrDelay decodes an RNR timer value (the IB table: 1 is 0.01 ms, 12 is
// 0.64 ms, 31 is 491.52 ms, 0 is 655.36 ms).
func rnrDelay(v uint8) time.Duration {
	table := [32]time.Duration{
		655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
		2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880,
		163840, 245760, 327680, 491520,
	}
	return table[v&31] * time.Microsecond
}
