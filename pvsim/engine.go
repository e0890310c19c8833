package pvsim

import (
	"errors"

	fw "github.com/vfrdma/vfrdma/firmware"
)

// The data path on the device goroutine: work requests taken from the
// rings, completions written, QPs failed and flushed.

// alive reports whether q is still the device's (not destroyed).
func (d *Device) alive(q *qp) bool { return d.w.qps[q.handle] == q }

// cqeQP is the CQE's qp field for q: its handle from version 20 on
// (rdma-core's commit 68c623814, Linux's pvrdma_poll_one), its number
// before (the same value there).
func (d *Device) cqeQP(q *qp) uint64 {
	if !d.s.qemu && d.s.version >= VersionQPHandle {
		return uint64(q.handle)
	}
	return uint64(q.qpn)
}

// pumpSQ takes send WQEs from q's send queue and executes them: all of
// them, unless the QP waits (an RNR back-off, a fence).
func (d *Device) pumpSQ(q *qp) {
	if !d.alive(q) || q.stuck {
		return
	}
	if d.s.qemu {
		d.qemuSQ(q)
		return
	}
	switch q.state {
	case stRTS:
	case stErr, stSQE:
		d.flushSQ(q)
		return
	default:
		return // WQEs wait for RTS (posting below RTS is the driver's error)
	}
	var wqe sendWQE
	for q.state == stRTS && !q.rnrWait && !q.failing && d.alive(q) {
		if !d.s.SQConsumeOnCompletion || len(q.inflight) == 0 {
			if cons, _, err := d.pending(&q.sq, fromCons); err == nil {
				q.sqNext = cons
			}
		}
		_, avail, err := d.pending(&q.sq, q.sqNext)
		if err != nil {
			d.ringFault(q, "send queue", err)
			return
		}
		if avail == 0 {
			return
		}
		slot := d.wqe(&q.sq, q.sqNext)
		if slot == nil {
			d.ringFault(q, "send queue", errDMAFault)
			return
		}
		good := decodeSend(slot, q.maxSendSGE, &wqe)
		if wqe.flags&sendFence != 0 && q.readsInFlight() {
			return // resumed when the READs and atomics before it complete
		}
		q.sqNext = (q.sqNext + 1) & ringMask(q.sq.n)
		if !d.s.SQConsumeOnCompletion {
			_ = d.setConsHead(&q.sq, q.sqNext)
		}
		d.ctr.sendWQEs.Add(1)
		op := &sendOp{wrID: wqe.wrID, opcode: wqe.opcode, signaled: wqe.flags&sendSignaled != 0 || q.sqSigAll,
			fence: wqe.flags&sendFence != 0, next: q.sqNext}
		if !good {
			d.failFetched(q, op, wcLocQPOpErr)
			return
		}
		d.execSend(q, op, &wqe)
	}
}

// failFetched fails a WQE the device could not execute. Send completions
// come in order: with RC requests in flight before it, it waits for them
// (and the QP sends nothing more); QEMU completes it at once, ahead of its
// backend's completions.
func (d *Device) failFetched(q *qp, op *sendOp, status uint32) {
	if d.s.qemu || len(q.inflight) == 0 {
		d.failSend(q, op, status)
		return
	}
	op.err = status
	q.inflight = append(q.inflight, op)
	q.failing = true
}

func (q *qp) readsInFlight() bool {
	for _, op := range q.inflight {
		if op.readLike {
			return true
		}
	}
	return false
}

// ringFault handles a ring the device cannot read: an index out of range
// or memory not mapped. A VMware device is modelled to fail the QP with
// QP_FATAL [model choice: the device cannot go on].
func (d *Device) ringFault(q *qp, which string, err error) {
	d.ctr.ringFaults.Add(1)
	if d.s.qemu {
		if errors.Is(err, errRingIndex) {
			return // QEMU takes an invalid index for "nothing there"
		}
		d.hazard("QP %d %s: %v: QEMU 7.2 touches memory it cannot map", q.qpn, which, err)
		q.stuck = true
		return
	}
	d.qpEvent(q, fw.EventQPFatal)
	d.qpError(q)
}

// failSend completes op with an error status and fails the QP: an RC QP
// goes to ERR, a UD QP to SQE (the verbs' rule for a failed datagram:
// only its send queue stops; QEMU's backend does the same).
func (d *Device) failSend(q *qp, op *sendOp, status uint32) {
	d.completeSend(q, op, status)
	if q.typ == fw.QPTypeUD {
		d.sqError(q)
		return
	}
	d.qpError(q)
}

// sqError moves a UD QP to SQE: what is left in its send queue completes
// with WR_FLUSH_ERR, and so does what is posted later, until a MODIFY_QP
// to RTS; its receive queue goes on receiving.
func (d *Device) sqError(q *qp) {
	if !d.alive(q) || q.state == stErr {
		return
	}
	q.state = stSQE
	if !d.s.qemu {
		q.recorded = stSQE
	}
	q.failing = false
	d.flushSQ(q)
}

// wcOpcode is the completion opcode of a WR opcode.
func (d *Device) wcOpcode(op uint32) uint32 {
	if d.s.qemu {
		return wcSend
	}
	switch op {
	case wrRDMAWrite, wrRDMAWriteWithImm:
		return wcRDMAWrite
	case wrRDMARead:
		return wcRDMARead
	case wrAtomicCmpSwp:
		return wcCompSwap
	case wrAtomicFetchAdd:
		return wcFetchAdd
	}
	return wcSend
}

// completeSend writes op's completion: always on QEMU (it posts every WQE
// signaled) and for an error, else only for a signaled WQE (or a QP with
// sq_sig_all). With SQConsumeOnCompletion the WQE's slot goes back to the
// driver now.
func (d *Device) completeSend(q *qp, op *sendOp, status uint32) {
	if d.s.SQConsumeOnCompletion && !d.s.qemu {
		_ = d.setConsHead(&q.sq, op.next)
	}
	if status == wcSuccess && !op.signaled && !d.s.qemu {
		d.ctr.unsignaled.Add(1)
		return
	}
	e := cqe{wrID: op.wrID, qp: d.cqeQP(q), opcode: d.wcOpcode(op.opcode), status: status, byteLen: op.length}
	if !d.s.qemu {
		e.portNum = 1
	}
	if status == wcGeneralErr {
		e.vendorErr = op.vendorErr
	}
	d.postCQE(q.scq, &e, false)
}

// postCQE writes a completion into CQ h, then the CQ notification: on
// QEMU a notification entry for every CQE and the interrupt if the CQ is
// armed (the arm then spent); on a VMware device the entry and the
// interrupt when the CQE fires the arm (any CQE for ARM, a solicited or
// error one for ARM_SOL), or the entry for every CQE with CQNotifyAll.
// A full CQ drops the CQE: QEMU silently, a VMware device with a CQ_ERR
// event, after which its CQ takes no more CQEs (it is in error).
func (d *Device) postCQE(h uint32, e *cqe, solicited bool) {
	c := d.w.cqs[h]
	if c == nil {
		d.ctr.cqesDropped.Add(1)
		return
	}
	if c.overflowed {
		d.ctr.cqesDropped.Add(1)
		return
	}
	err := d.put(&c.ring, e.put)
	if err != nil {
		d.ctr.cqesDropped.Add(1)
		if errors.Is(err, errDMAFault) && d.s.qemu {
			d.hazard("CQ %d: ring memory not mapped: QEMU 7.2 writes through its old mapping", h)
		}
		if !d.s.qemu && (errors.Is(err, errRingFull) || errors.Is(err, errRingIndex)) {
			c.overflowed = true
			d.ctr.cqOverflows.Add(1)
			d.raise(fw.EventCQErr, h)
		}
		if d.s.qemu && errors.Is(err, errRingFull) {
			d.ctr.cqOverflows.Add(1) // QEMU logs "CQ is full"
		}
		return
	}
	d.ctr.cqes.Add(1)
	if d.s.qemu {
		if !d.notifyCQ(h) {
			return
		}
		if c.arm != armNone {
			c.arm = armNone
			d.interrupt(vecCQ)
		}
		return
	}
	fire := c.arm == armNext || c.arm == armSolicited && (solicited || e.status != wcSuccess)
	if fire || d.s.CQNotifyAll {
		if !d.notifyCQ(h) {
			return
		}
	}
	if fire {
		c.arm = armNone
		d.interrupt(vecCQ)
	}
}

// notifyCQ writes h into the CQ-notification ring; false if it is full
// (then QEMU skips the interrupt too).
func (d *Device) notifyCQ(h uint32) bool {
	if !d.w.dsrLoaded {
		return false
	}
	if err := d.put(&d.w.cqn, func(b []byte) { le.PutUint32(b, h) }); err != nil {
		d.ctr.cqnDropped.Add(1)
		return false
	}
	d.ctr.cqNotifications.Add(1)
	return true
}

// qpError moves q to ERR and flushes it: what it has in flight, what is
// left in its send queue and its receive queue complete with
// WR_FLUSH_ERR (unsignaled or not), and so does what is posted later. A
// QP of an SRQ leaves the SRQ's receives alone and raises
// QP_LAST_WQE_REACHED (the verbs' rule). On QEMU this is the backend QP
// going to error (the recorded state is unchanged).
func (d *Device) qpError(q *qp) {
	if !d.alive(q) {
		return
	}
	first := q.state != stErr
	q.state = stErr
	if !d.s.qemu {
		q.recorded = stErr
	}
	d.stopTimers(q)
	q.rnrWait, q.failing = false, false
	ops := q.inflight
	q.inflight = nil
	for _, op := range ops {
		d.completeSend(q, op, wcWRFlushErr)
	}
	d.flushSQ(q)
	d.flushRQ(q)
	if first && q.srq != nil && !d.s.qemu {
		d.qpEvent(q, fw.EventQPLastWQEReached)
	}
}

// flushSQ completes every WQE left in q's send queue with WR_FLUSH_ERR.
func (d *Device) flushSQ(q *qp) {
	// Nothing is in flight any more: the fetch position is cons_head.
	if cons, _, err := d.pending(&q.sq, fromCons); err == nil {
		q.sqNext = cons
	}
	var wqe sendWQE
	for {
		_, avail, err := d.pending(&q.sq, q.sqNext)
		if err != nil || avail == 0 {
			return
		}
		slot := d.wqe(&q.sq, q.sqNext)
		if slot == nil {
			return
		}
		decodeSend(slot, 0, &wqe) // the header only
		q.sqNext = (q.sqNext + 1) & ringMask(q.sq.n)
		op := &sendOp{wrID: wqe.wrID, opcode: wqe.opcode, next: q.sqNext}
		_ = d.setConsHead(&q.sq, q.sqNext)
		d.completeSend(q, op, wcWRFlushErr)
	}
}

// flushRQ completes q's receives with WR_FLUSH_ERR: those QEMU handed its
// backend, and those in the receive queue.
func (d *Device) flushRQ(q *qp) {
	fifo := q.fifo
	q.fifo = nil
	for _, r := range fifo {
		d.completeRecv(q, &r, wcWRFlushErr, 0, nil)
	}
	if q.srq != nil || q.rq.n == 0 {
		return
	}
	for {
		cons, avail, err := d.pending(&q.rq, fromCons)
		if err != nil || avail == 0 {
			return
		}
		slot := d.wqe(&q.rq, cons)
		if slot == nil {
			return
		}
		r, _, _ := decodeRecv(slot, 0)
		_ = d.setConsHead(&q.rq, cons+1)
		d.completeRecv(q, &r, wcWRFlushErr, 0, nil)
	}
}

// resetQP takes q back to RESET: what it had in flight or queued inside
// the device is forgotten without completions (the verbs' rule); the
// driver zeroes the ring counters.
func (d *Device) resetQP(q *qp) {
	d.stopTimers(q)
	q.inflight, q.fifo = nil, nil
	q.rnrWait, q.failing, q.retries, q.rnrRetries = false, false, 0, 0
	q.sqNext = 0
}

func (d *Device) stopTimers(q *qp) {
	q.ackTimer.stop()
	q.rnrTimer.stop()
	q.ackTimer, q.rnrTimer = nil, nil
}

// completeRecv writes a receive completion to q's receive CQ (a QEMU SRQ
// receive: to the CQ stamped at post).
func (d *Device) completeRecv(q *qp, r *recvWQE, status, byteLen uint32, p *packet) {
	e := cqe{wrID: r.wrID, qp: d.cqeQP(q), opcode: wcRecv, status: status, byteLen: byteLen}
	solicited := false
	if p != nil && status == wcSuccess {
		e.srcQP = p.srcQPN
		solicited = p.solicited
		if p.ud {
			e.wcFlags |= wcFlagGRH
		}
		if !d.s.qemu {
			if p.withImm {
				e.imm = p.imm
				e.wcFlags |= wcFlagWithImm
			}
			if p.kind == pktWrite {
				e.opcode = wcRecvRDMAWithImm
			}
			if p.gidType == fw.GIDTypeRoCEv2 {
				e.netHdr = netHdrType(p.srcGID)
				e.wcFlags |= wcFlagNetworkHdrTyp
			}
		}
	}
	if !d.s.qemu {
		e.portNum = 1
	}
	cqh := q.rcq
	if d.s.qemu && q.srq != nil {
		cqh = r.cq
	}
	d.postCQE(cqh, &e, solicited)
}

// postedRecv handles a receive doorbell. A VMware device takes receives
// from the ring when messages arrive; on a QP in ERR it flushes them now.
// QEMU hands each to its backend at once (facts sheet §7): a bad num_sge
// makes it spin on the WQE forever, a QP in RESET fails the post.
func (d *Device) postedRecv(q *qp) {
	if q.srq != nil {
		if d.s.qemu {
			d.hazard("receive doorbell on QP %d, which uses SRQ %d: QEMU 7.2 indexes a receive ring that does not exist", q.qpn, q.srq.handle)
		}
		return
	}
	if !d.s.qemu {
		if q.state == stErr {
			d.flushRQ(q)
		}
		return
	}
	if q.stuck {
		return
	}
	for {
		cons, avail, err := d.pending(&q.rq, fromCons)
		if err != nil || avail == 0 {
			return
		}
		slot := d.wqe(&q.rq, cons)
		if slot == nil {
			d.hazard("QP %d receive queue memory not mapped", q.qpn)
			return
		}
		r, n, good := decodeRecv(slot, d.s.caps.MaxSGE)
		if !good {
			d.hazard("receive WQE with %d SGEs (max %d): QEMU 7.2 spins on it forever", n, d.s.caps.MaxSGE)
			d.completeRecv(q, &r, wcGeneralErr, 0, nil)
			q.stuck = true
			return
		}
		_ = d.setConsHead(&q.rq, cons+1)
		d.ctr.recvWQEs.Add(1)
		switch q.state {
		case stReset:
			e := cqe{wrID: r.wrID, qp: uint64(q.qpn), opcode: wcRecv, status: wcGeneralErr, vendorErr: vendorPostFailed}
			d.postCQE(q.rcq, &e, false)
		case stErr:
			d.completeRecv(q, &r, wcWRFlushErr, 0, nil)
		default:
			q.fifo = append(q.fifo, r)
		}
	}
}

// postedSRQ handles an SRQ doorbell: QEMU hands the receives to its
// backend at once, each stamped with the receive CQ of the QP that
// attached last; a VMware device takes them when messages arrive.
func (d *Device) postedSRQ(s *srq) {
	if !d.s.qemu {
		return
	}
	for {
		cons, avail, err := d.pending(&s.ring, fromCons)
		if err != nil || avail == 0 {
			return
		}
		slot := d.wqe(&s.ring, cons)
		if slot == nil {
			d.hazard("SRQ %d memory not mapped", s.handle)
			return
		}
		r, n, good := decodeRecv(slot, d.s.caps.MaxSGE)
		if !good {
			d.hazard("SRQ WQE with %d SGEs (max %d): QEMU 7.2 spins on it forever", n, d.s.caps.MaxSGE)
			return
		}
		if s.users == 0 {
			d.hazard("SRQ %d receive posted before any QP uses it: QEMU 7.2 stamps it with CQ %d", s.handle, s.recvCQ)
		}
		_ = d.setConsHead(&s.ring, cons+1)
		d.ctr.recvWQEs.Add(1)
		r.cq = s.recvCQ
		s.fifo = append(s.fifo, r)
	}
}

// errNoRecv: no receive WQE is posted.
var errNoRecv = errors.New("no receive posted")

// takeRecv takes the next receive for q: from its receive queue or its
// SRQ (on QEMU, from what the backend was handed). On a VMware device an
// SRQ armed with a limit raises SRQ_LIMIT_REACHED (and disarms) when the
// receives left fall below it. A WQE that cannot be decoded comes back
// with ok false and its wr_id.
func (d *Device) takeRecv(q *qp) (r recvWQE, good bool, err error) {
	if d.s.qemu {
		fifo := &q.fifo
		if q.srq != nil {
			fifo = &q.srq.fifo
		}
		if len(*fifo) == 0 {
			return r, false, errNoRecv
		}
		r = (*fifo)[0]
		*fifo = (*fifo)[1:]
		return r, true, nil
	}
	ring, maxSGE := &q.rq, q.maxRecvSGE
	if q.srq != nil {
		ring, maxSGE = &q.srq.ring, q.srq.maxSGE
	}
	cons, avail, err := d.pending(ring, fromCons)
	if err != nil {
		return r, false, err
	}
	if avail == 0 {
		return r, false, errNoRecv
	}
	slot := d.wqe(ring, cons)
	if slot == nil {
		return r, false, errDMAFault
	}
	r, _, good = decodeRecv(slot, maxSGE)
	_ = d.setConsHead(ring, cons+1)
	d.ctr.recvWQEs.Add(1)
	if s := q.srq; s != nil && s.limit > 0 && avail-1 < s.limit {
		s.limit = 0
		d.raise(fw.EventSRQLimitReached, s.handle)
	}
	return r, good, nil
}

// hasRecv reports whether q has a receive to take.
func (d *Device) hasRecv(q *qp) bool {
	if d.s.qemu {
		if q.srq != nil {
			return len(q.srq.fifo) > 0
		}
		return len(q.fifo) > 0
	}
	ring := &q.rq
	if q.srq != nil {
		ring = &q.srq.ring
	}
	_, avail, err := d.pending(ring, fromCons)
	return err == nil && avail > 0
}

// mrAccess runs fn over the host memory of n bytes at addr of MR m, piece
// by piece; false if the range is not all in the MR or not mapped.
func (d *Device) mrAccess(m *mr, addr, n uint64, fn func([]byte)) bool {
	if m.frmr {
		return false
	}
	if n == 0 {
		return true
	}
	if m.dma {
		for n > 0 {
			chunk := min(n, pageSize-addr%pageSize)
			b := d.dmaBytes(addr, int(chunk))
			if b == nil {
				return false
			}
			fn(b)
			addr, n = addr+chunk, n-chunk
		}
		return true
	}
	if addr < m.start || n > m.length || addr-m.start > m.length-n {
		return false
	}
	off := addr - m.start + m.offset
	for n > 0 {
		pg := off / pageSize
		if pg >= uint64(len(m.pages)) {
			return false
		}
		chunk := min(n, pageSize-off%pageSize)
		b := d.dmaBytes(m.pages[pg]+off%pageSize, int(chunk))
		if b == nil {
			return false
		}
		fn(b)
		off, n = off+chunk, n-chunk
	}
	return true
}

// localMR resolves an SGE's lkey for q: the MR must exist and be in q's
// PD, and, for the device to write to it, grant local write.
func (d *Device) localMR(q *qp, s *sge, write bool) *mr {
	m := d.w.lkeys[s.lkey]
	if m == nil || m.pd != q.pd || write && m.access&accLocalWrite == 0 {
		return nil
	}
	return m
}

// gather reads the bytes the SGEs name (a send's payload). Status
// LOC_PROT_ERR for an SGE outside an MR of the QP's PD, LOC_LEN_ERR for a
// message over the size limit. The SGEs are checked before anything is
// allocated: what the driver wrote sizes nothing by itself.
func (d *Device) gather(q *qp, sges []sge, limit uint64) ([]byte, uint32) {
	var total uint64
	for _, s := range sges {
		total += uint64(s.length)
	}
	if total > limit {
		return nil, wcLocLenErr
	}
	for i := range sges {
		s := &sges[i]
		if s.length == 0 {
			continue
		}
		if m := d.localMR(q, s, false); m == nil || !d.mrAccess(m, s.addr, uint64(s.length), func([]byte) {}) {
			return nil, wcLocProtErr
		}
	}
	buf := make([]byte, 0, total)
	for i := range sges {
		s := &sges[i]
		if s.length == 0 {
			continue
		}
		d.mrAccess(d.localMR(q, s, false), s.addr, uint64(s.length), func(b []byte) { buf = append(buf, b...) })
	}
	return buf, wcSuccess
}

// checkLocal validates SGEs the device will write (receive buffers, READ
// and atomic results) and returns their total length.
func (d *Device) checkLocal(q *qp, sges []sge) (uint64, uint32) {
	var total uint64
	for i := range sges {
		s := &sges[i]
		total += uint64(s.length)
		if s.length == 0 {
			continue
		}
		m := d.localMR(q, s, true)
		if m == nil || !d.mrAccess(m, s.addr, uint64(s.length), func([]byte) {}) {
			return total, wcLocProtErr
		}
	}
	return total, wcSuccess
}

// scatter writes data across the SGEs, in order (checked by checkLocal).
func (d *Device) scatter(q *qp, sges []sge, data []byte) uint32 {
	for i := range sges {
		if len(data) == 0 {
			break
		}
		s := &sges[i]
		n := min(uint64(s.length), uint64(len(data)))
		if n == 0 {
			continue
		}
		m := d.localMR(q, s, true)
		if m == nil || !d.mrAccess(m, s.addr, n, func(b []byte) { data = data[copy(b, data):] }) {
			return wcLocProtErr
		}
	}
	return wcSuccess
}

// netHdrType is the CQE network_hdr_type of a RoCE v2 packet from g:
// IPv4 for an IPv4-mapped GID, IPv6 otherwise (pvrdma_network_type).
func netHdrType(g [16]byte) uint8 {
	if isV4Mapped(g) {
		return 1
	}
	return 2
}

func isV4Mapped(g [16]byte) bool {
	for _, b := range g[:10] {
		if b != 0 {
			return false
		}
	}
	return g[10] == 0xff && g[11] == 0xff
}
