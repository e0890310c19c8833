package pvsim

import (
	"syscall"

	fw "github.com/vfrdma/vfrdma/firmware"
)

// Command handlers. Each reads the request (184 bytes, header included)
// and writes its payload into the response (176 bytes; the header is
// written by runCommand), and returns the error the device reports: the
// response's error byte, and on QEMU ERR = -errno. Layouts are the facts
// sheet's §4 (pvrdma_dev_api.h).

const (
	ok      = syscall.Errno(0)
	eINVAL  = syscall.EINVAL
	eNOMEM  = syscall.ENOMEM
	eBUSY   = syscall.EBUSY
	eIO     = syscall.EIO
	ePERM   = syscall.EPERM
	eNOTSUP = syscall.EOPNOTSUPP
)

// exec runs one command and returns its acknowledgement code, its error,
// and whether it is answered at all (QEMU answers nothing for a code it
// has no handler for).
func (d *Device) exec(code fw.Cmd, req, resp []byte) (uint32, syscall.Errno, bool) {
	ack := code.Ack()
	q := d.s.qemu
	switch code {
	case fw.CmdQueryPort:
		return ack, d.cmdQueryPort(req, resp), true
	case fw.CmdQueryPKey:
		return ack, d.cmdQueryPKey(req, resp), true
	case fw.CmdCreatePD:
		return ack, d.cmdCreatePD(req, resp), true
	case fw.CmdDestroyPD:
		return ack, d.cmdDestroyPD(req), true
	case fw.CmdCreateMR:
		return ack, d.cmdCreateMR(req, resp), true
	case fw.CmdDestroyMR:
		return ack, d.cmdDestroyMR(req), true
	case fw.CmdCreateCQ:
		return ack, d.cmdCreateCQ(req, resp), true
	case fw.CmdResizeCQ:
		if q {
			return 0, 0, false // QEMU 7.2 has no handler
		}
		return ack, d.cmdResizeCQ(req, resp), true
	case fw.CmdDestroyCQ:
		return ack, d.cmdDestroyCQ(req), true
	case fw.CmdCreateQP:
		return ack, d.cmdCreateQP(req, resp), true
	case fw.CmdModifyQP:
		return ack, d.cmdModifyQP(req), true
	case fw.CmdQueryQP:
		return ack, d.cmdQueryQP(req, resp), true
	case fw.CmdDestroyQP:
		return ack, d.cmdDestroyQP(req, resp), true
	case fw.CmdCreateUC:
		return ack, d.cmdCreateUC(req, resp), true
	case fw.CmdDestroyUC:
		return ack, d.cmdDestroyUC(req), true
	case fw.CmdCreateBind:
		return ack, d.cmdCreateBind(req), true
	case fw.CmdDestroyBind:
		return ack, d.cmdDestroyBind(req), true
	case fw.CmdCreateSRQ:
		return ack, d.cmdCreateSRQ(req, resp), true
	case fw.CmdModifySRQ:
		if q {
			// QEMU's handler table lists QUERY_SRQ before MODIFY_SRQ and
			// is indexed by code: 18 runs the query (facts sheet §9).
			return fw.CmdQuerySRQ.Ack(), d.cmdQuerySRQ(req, resp), true
		}
		return ack, d.cmdModifySRQ(req), true
	case fw.CmdQuerySRQ:
		if q {
			return fw.CmdModifySRQ.Ack(), d.cmdQEMUModifySRQ(req), true
		}
		return ack, d.cmdQuerySRQ(req, resp), true
	case fw.CmdDestroySRQ:
		return ack, d.cmdDestroySRQ(req), true
	}
	return 0, 0, false
}

// handleBase is the first handle a table hands out: QEMU's bitmaps start
// at 0; a VMware device is modelled with handles from 1 (rdma-core takes a
// QP handle of 0 for "absent", so a real device does not hand it out, and
// the model keeps every table alike).
func (d *Device) handleBase() uint32 {
	if d.s.qemu {
		return 0
	}
	return 1
}

// alloc hands out a handle in m below limit; at the limit QEMU's bitmap
// check is off by one and corrupts memory (facts sheet §11 item 9), so the
// model records the hazard and refuses.
func allocIn[T any](d *Device, what string, m map[uint32]T, s *handleSpace, limit uint32) (uint32, bool) {
	h, ok := allocHandle(m, s, d.handleBase(), limit)
	if !ok && d.s.qemu {
		d.hazard("%s beyond the device's %d: QEMU 7.2's bitmap check is off by one and corrupts memory", what, limit)
	}
	return h, ok
}

// Port attributes.
const (
	portDown   = fw.PortDown
	portActive = fw.PortActive
	physUp     = 5 // LinkUp
	physDown   = 3 // Disabled
)

func (d *Device) portState() (state, phys uint32) {
	if d.w.portUp && !d.w.quiesced {
		return portActive, physUp
	}
	return portDown, physDown
}

func (d *Device) cmdQueryPort(req, resp []byte) syscall.Errno {
	port := req[16]
	if d.s.qemu && port > 1 || !d.s.qemu && port != 1 {
		return eINVAL
	}
	state, phys := d.portState()
	r := resp[16:]
	le.PutUint32(r[0:], state)
	le.PutUint32(r[4:], fw.MTU4096)
	// QEMU 7.2 passes its backend's port through: the bench's backend
	// runs at 4096. A VMware device's active MTU follows its vmxnet3's
	// (1500 bytes: 1024) [unverified].
	active := uint32(fw.MTU1024)
	if d.s.qemu {
		active = fw.MTU4096
	}
	le.PutUint32(r[8:], active)
	le.PutUint32(r[12:], d.s.caps.GIDTblLen)
	le.PutUint32(r[28:], uint32(d.ctr.qkeyViolations.Load()))
	le.PutUint16(r[32:], 1) // pkey_tbl_len
	if d.s.qemu {
		le.PutUint32(r[20:], qemuMaxMsg) // hard-coded by QEMU 7.2
		r[43], r[44] = 1, 1              // 1X, SDR
	} else {
		le.PutUint32(r[20:], vmwMaxMsg)
		r[43], r[44] = 1, 32 // 1X, EDR [unverified]
	}
	r[45] = uint8(phys)
	return ok
}

func (d *Device) cmdQueryPKey(req, resp []byte) syscall.Errno {
	port, index := req[16], req[17]
	if d.s.qemu && (port > 1 || index > 1) || !d.s.qemu && (port != 1 || uint16(index) >= d.s.caps.MaxPKeys) {
		return eINVAL
	}
	le.PutUint16(resp[16:], 0xFFFF)
	return ok
}

func (d *Device) cmdCreatePD(req, resp []byte) syscall.Errno {
	ctx := le.Uint32(req[16:])
	if !d.s.qemu && ctx != 0 && !d.w.ucs[ctx] {
		return eINVAL
	}
	h, okh := allocIn(d, "PD", d.w.pds, &d.w.pdH, d.s.caps.MaxPD)
	if !okh {
		return eNOMEM
	}
	d.w.pds[h] = &pd{handle: h}
	le.PutUint32(resp[16:], h)
	return ok
}

func (d *Device) cmdDestroyPD(req []byte) syscall.Errno {
	h := le.Uint32(req[16:])
	p := d.w.pds[h]
	if d.s.qemu {
		freeHandle(d.w.pds, &d.w.pdH, h) // always "succeeds" (facts sheet §11 item 11)
		return ok
	}
	if p == nil {
		return eINVAL
	}
	if p.users > 0 {
		return eBUSY
	}
	freeHandle(d.w.pds, &d.w.pdH, h)
	return ok
}

// MR access flags (the verbs values) and flags.
const (
	accLocalWrite   = fw.AccessLocalWrite
	accRemoteWrite  = fw.AccessRemoteWrite
	accRemoteRead   = fw.AccessRemoteRead
	accRemoteAtomic = fw.AccessRemoteAtomic
	accAll          = 1<<7 - 1
)

func (d *Device) cmdCreateMR(req, resp []byte) syscall.Errno {
	start, length, pdir := le.Uint64(req[16:]), le.Uint64(req[24:]), le.Uint64(req[32:])
	pdh, access, flags, nch := le.Uint32(req[40:]), le.Uint32(req[44:]), le.Uint32(req[48:]), le.Uint32(req[52:])
	w := &d.w
	p := w.pds[pdh]
	if p == nil {
		return eINVAL
	}
	m := &mr{pd: p, start: start, length: length, access: access, offset: start % pageSize}
	if d.s.qemu {
		switch {
		case flags&fw.MRFlagDMA != 0:
			m.dma = true // nothing registered on the backend: lkey 0, unusable
		case flags&fw.MRFlagFRMR != 0:
			return eINVAL
		default:
			if uint64(nch)*pageSize != (length+pageSize-1)&^(pageSize-1) || length == 0 {
				return eINVAL
			}
			if length > d.s.caps.MaxMRSize {
				return eINVAL
			}
			if m.offset+length > uint64(nch)*pageSize {
				d.hazard("CREATE_MR: start %#x + length %d overruns its %d pages: QEMU registers past its mapping", start, length, nch)
				return eINVAL
			}
			if start == 0 {
				d.hazard("CREATE_MR with start 0: QEMU 7.2 skips the unmap on destroy (a leak)")
			}
			if access&(accRemoteWrite|accRemoteAtomic) != 0 && access&accLocalWrite == 0 {
				return eINVAL // the backend's ibv_reg_mr refuses it
			}
			pages, err := d.pageList(pdir, int(nch), false)
			if err != nil {
				return eINVAL
			}
			m.pages = pages
		}
	} else {
		if access&^accAll != 0 || access&(accRemoteWrite|accRemoteAtomic) != 0 && access&accLocalWrite == 0 {
			return eINVAL
		}
		switch {
		case flags&fw.MRFlagDMA != 0:
			// Linux's DMA MR: local write only, every address an IOVA.
			if access&^accLocalWrite != 0 {
				return eINVAL
			}
			m.dma = true
		case flags&fw.MRFlagFRMR != 0:
			// Usable once a fast-register WR maps it, which the model does
			// not run (caps.bmme_flags is 0): every access then fails.
			if nch == 0 || nch > d.s.caps.MaxFastRegPageListLen {
				return eINVAL
			}
			m.frmr = true
		default:
			if length == 0 || length > d.s.caps.MaxMRSize {
				return eINVAL
			}
			need := (m.offset + length + pageSize - 1) / pageSize
			if uint64(nch) < need {
				return eINVAL
			}
			pages, err := d.pageList(pdir, int(nch), false)
			if err != nil {
				return eINVAL
			}
			m.pages = pages
		}
	}
	h, okh := allocIn(d, "MR", w.mrs, &w.mrH, d.s.caps.MaxMR)
	if !okh {
		return eNOMEM
	}
	m.handle = h
	switch {
	case d.s.qemu:
		// The backend's keys: rxe's index << 8 | an 8-bit key; rkey is
		// always 0xFFFFFFFF (no remote access is emulated).
		m.rkey = 0xFFFFFFFF
		if !m.dma {
			for {
				m.lkey = (h+1)<<8 | uint32(w.rng.IntN(256))
				if w.lkeys[m.lkey] == nil {
					break
				}
			}
		}
	case d.s.version >= VersionQPHandle:
		// Version 20: the physical HCA's keys, unrelated to the handle
		// (P-qph). The model picks distinct random ones.
		m.lkey = d.freshKey()
		m.rkey = d.freshKey()
	default:
		// Before version 20 the keys are virtual, derived from the handle
		// [the derivation is unverified].
		m.lkey = h
		m.rkey = h | 0x80000000
	}
	w.mrs[h] = m
	if m.lkey != 0 {
		w.lkeys[m.lkey] = m
	}
	if m.rkey != 0xFFFFFFFF {
		w.rkeys[m.rkey] = m
	}
	p.users++
	le.PutUint32(resp[16:], h)
	le.PutUint32(resp[20:], m.lkey)
	le.PutUint32(resp[24:], m.rkey)
	return ok
}

// qemuZero zeroes a new ring's data pages, as QEMU does at CREATE (its
// ring init); a VMware device is not known to.
func (d *Device) qemuZero(pages []uint64) {
	if !d.s.qemu {
		return
	}
	for _, p := range pages {
		if b := d.dmaBytes(p, pageSize); b != nil {
			clear(b)
		}
	}
}

// freshKey returns a random memory key used by no MR (not 0, not all ones).
func (d *Device) freshKey() uint32 {
	for {
		k := d.w.rng.Uint32()
		if k != 0 && k != 0xFFFFFFFF && d.w.lkeys[k] == nil && d.w.rkeys[k] == nil {
			return k
		}
	}
}

func (d *Device) cmdDestroyMR(req []byte) syscall.Errno {
	h := le.Uint32(req[16:])
	m := d.w.mrs[h]
	if m == nil {
		if d.s.qemu {
			return ok
		}
		return eINVAL
	}
	d.dropMR(m)
	return ok
}

func (d *Device) dropMR(m *mr) {
	w := &d.w
	freeHandle(w.mrs, &w.mrH, m.handle)
	if w.lkeys[m.lkey] == m {
		delete(w.lkeys, m.lkey)
	}
	if w.rkeys[m.rkey] == m {
		delete(w.rkeys, m.rkey)
	}
	m.pd.users--
}

func isPow2(v uint64) bool { return v != 0 && v&(v-1) == 0 }

// maxRingPages bounds a ring object's pages on QEMU (its state page
// included for CQs and SRQs; per queue for QPs).
const maxRingPages = fw.MaxRingChunks

func (d *Device) cmdCreateCQ(req, resp []byte) syscall.Errno {
	pdir, ctx, cqe, nch := le.Uint64(req[16:]), le.Uint32(req[24:]), le.Uint32(req[28:]), le.Uint32(req[32:])
	fits := nch >= 2 && uint64(cqe)*64 <= uint64(nch-1)*pageSize
	if d.s.qemu {
		if nch < 1 || nch > maxRingPages {
			return eINVAL
		}
		if !fits || !isPow2(uint64(cqe)) {
			d.hazard("CREATE_CQ of %d CQEs in %d chunks: QEMU 7.2 does not check the ring fits its pages (or is a power of two) and overruns it", cqe, nch)
			return eINVAL
		}
	} else {
		if ctx != 0 && !d.w.ucs[ctx] {
			return eINVAL
		}
		if !isPow2(uint64(cqe)) || cqe > d.s.caps.MaxCQE || !fits {
			return eINVAL
		}
	}
	pages, err := d.pageList(pdir, int(nch), d.s.qemu)
	if err != nil {
		if d.s.qemu {
			d.hazard("CREATE_CQ page directory: %v (QEMU crashes when it touches it)", err)
		}
		return eINVAL
	}
	h, okh := allocIn(d, "CQ", d.w.cqs, &d.w.cqH, d.s.caps.MaxCQ)
	if !okh {
		return eNOMEM
	}
	d.qemuZero(pages[1:])
	d.w.cqs[h] = &cq{handle: h, ring: devRing{state: pages[0] + 8, pages: pages[1:], n: cqe, elem: cqeSize}}
	le.PutUint32(resp[16:], h)
	le.PutUint32(resp[20:], cqe)
	return ok
}

// cmdResizeCQ resizes a CQ within the pages it was created with. Linux
// never sends RESIZE_CQ and QEMU has no handler; the model takes it only
// on an empty ring and restarts both counters at 0 (the driver must
// restart its consumer) [model choice].
func (d *Device) cmdResizeCQ(req, resp []byte) syscall.Errno {
	h, cqe := le.Uint32(req[16:]), le.Uint32(req[20:])
	c := d.w.cqs[h]
	if c == nil || !isPow2(uint64(cqe)) || cqe > d.s.caps.MaxCQE || uint64(cqe)*cqeSize > uint64(len(c.ring.pages))*pageSize {
		return eINVAL
	}
	prod, cons, err := d.counters(c.ring.state)
	if err != nil {
		return eINVAL
	}
	if prod != cons {
		return eBUSY
	}
	if d.setCounter(c.ring.state, prodTailOff, 0) != nil || d.setCounter(c.ring.state, consHeadOff, 0) != nil {
		return eINVAL
	}
	c.ring.n = cqe
	c.overflowed = false
	le.PutUint32(resp[16:], cqe)
	return ok
}

func (d *Device) cmdDestroyCQ(req []byte) syscall.Errno {
	h := le.Uint32(req[16:])
	c := d.w.cqs[h]
	if c == nil {
		return eINVAL
	}
	if c.users > 0 {
		if !d.s.qemu {
			return eBUSY
		}
		d.hazard("DESTROY_CQ %d while %d QPs use it: QEMU 7.2 leaves them dangling", h, c.users)
	}
	freeHandle(d.w.cqs, &d.w.cqH, h)
	return ok
}

// WQE strides (facts sheet §6): the smallest power of two that holds the
// header and the SGEs. A stride that would pass 2^31 (an SGE count no
// device takes) comes out as 2^31: callers refuse it by size.
func pow2ceil(n uint64) uint32 {
	s := uint64(1)
	for s < n && s < 1<<31 {
		s <<= 1
	}
	return uint32(s)
}

func sqStride(sges uint32) uint32 { return pow2ceil(sqHeaderSize + sgeSize*uint64(sges)) }
func rqStride(sges uint32) uint32 { return pow2ceil(rqHeaderSize + sgeSize*uint64(sges)) }

func (d *Device) cmdCreateQP(req, resp []byte) syscall.Errno {
	w := &d.w
	caps := &d.s.caps
	pdir := le.Uint64(req[16:])
	pdh, scq, rcq, srqh := le.Uint32(req[24:]), le.Uint32(req[28:]), le.Uint32(req[32:]), le.Uint32(req[36:])
	msw, mrw, mss, mrs, inl := le.Uint32(req[40:]), le.Uint32(req[44:]), le.Uint32(req[48:]), le.Uint32(req[52:]), le.Uint32(req[56:])
	total, send := uint32(le.Uint16(req[68:])), uint32(le.Uint16(req[70:]))
	sigAll, typ, isSRQ := req[74] != 0, fw.QPType(req[75]), req[76] != 0

	p := w.pds[pdh]
	if p == nil || w.cqs[scq] == nil || w.cqs[rcq] == nil {
		return eINVAL
	}
	switch typ {
	case fw.QPTypeRC, fw.QPTypeUD, fw.QPTypeGSI:
	default:
		if d.s.qemu {
			return eIO
		}
		return eINVAL
	}
	var s *srq
	if isSRQ {
		if s = w.srqs[srqh]; s == nil || caps.MaxSRQ == 0 {
			return eINVAL
		}
	}
	if mss > caps.MaxSGE || mrs > caps.MaxSGE || msw > caps.MaxQPWR || mrw > caps.MaxQPWR {
		return eINVAL
	}
	if total < 1+send {
		return eINVAL
	}
	rpages := total - 1 - send
	ss, rs := sqStride(mss), rqStride(mrs)
	sqFits := isPow2(uint64(msw)) && uint64(msw)*uint64(ss) <= uint64(send)*pageSize
	rqFits := isSRQ || isPow2(uint64(mrw)) && uint64(mrw)*uint64(rs) <= uint64(rpages)*pageSize
	if d.s.qemu {
		if send < 1 || send > maxRingPages || !isSRQ && (rpages < 1 || rpages > maxRingPages) {
			return eINVAL
		}
		if !sqFits || !rqFits {
			d.hazard("CREATE_QP rings (SQ %d x %d B in %d pages, RQ %d x %d B in %d pages) do not fit: QEMU 7.2 does not check and overruns them", msw, ss, send, mrw, rs, rpages)
			return eINVAL
		}
	} else if send < 1 || msw < 1 || !sqFits || !rqFits || !isSRQ && mrw < 1 {
		return eINVAL
	}
	pages, err := d.pageList(pdir, int(total), d.s.qemu)
	if err != nil {
		if d.s.qemu {
			d.hazard("CREATE_QP page directory: %v (QEMU crashes when it touches it)", err)
		}
		return eINVAL
	}
	q := &qp{
		typ: typ, pd: p, scq: scq, rcq: rcq, srq: s,
		sq:        wqRing{state: pages[0], pages: pages[1 : 1+send], n: msw, stride: ss},
		maxSendWR: msw, maxRecvWR: mrw, maxSendSGE: mss, maxRecvSGE: mrs,
		state: uint32(fw.QPStateReset), recorded: uint32(fw.QPStateReset),
	}
	if !isSRQ {
		q.rq = wqRing{state: pages[0] + 8, pages: pages[1+send:], n: mrw, stride: rs}
	}
	if !d.s.qemu {
		q.sqSigAll = sigAll // QEMU ignores it: every send completes
	} else {
		q.maxInline = inl // QEMU echoes it
	}
	if !d.allocQP(q) {
		return eNOMEM
	}
	d.qemuZero(pages[1:])
	p.users++
	w.cqs[scq].users++
	w.cqs[rcq].users++
	if s != nil {
		s.users++
		s.recvCQ = rcq // QEMU: SRQ completions go to the newest QP's receive CQ
	}
	r := resp[16:]
	le.PutUint32(r[0:], q.qpn)
	if d.s.version >= VersionQPHandle && !d.s.qemu {
		le.PutUint32(r[4:], q.handle)
		r = r[8:]
	} else {
		r = r[4:]
	}
	le.PutUint32(r[0:], msw)
	le.PutUint32(r[4:], mrw)
	le.PutUint32(r[8:], mss)
	le.PutUint32(r[12:], mrs)
	le.PutUint32(r[16:], q.maxInline)
	return ok
}

// allocQP gives q its handle and number:
//   - QEMU: the backend's QP number (sequential from 0x11, like rxe's; QP1
//     for GSI), and the handle is that number;
//   - VMware, version < 20: a small handle from 1, which is the number;
//   - VMware, version 20: a small handle from 1 (Linux's QP table is
//     indexed by handle % max_qp) and a QP number from the physical HCA,
//     modelled as 0x10000 + a random 16-bit value, never the handle.
func (d *Device) allocQP(q *qp) bool {
	w := &d.w
	limit := d.s.caps.MaxQP
	if uint32(len(w.qps)) >= limit {
		if d.s.qemu {
			d.hazard("QP beyond the device's %d: QEMU 7.2's bitmap check is off by one", limit)
		}
		return false
	}
	switch {
	case d.s.qemu:
		if q.typ == fw.QPTypeGSI {
			if w.qpns[1] != nil {
				return false
			}
			q.qpn = 1
		} else {
			if w.nextQPN < 0x11 {
				w.nextQPN = 0x11
			}
			for w.qpns[w.nextQPN] != nil {
				w.nextQPN = max((w.nextQPN+1)&dbHandleMask, 0x11)
			}
			q.qpn = w.nextQPN
			w.nextQPN = max((w.nextQPN+1)&dbHandleMask, 0x11)
		}
		q.handle = q.qpn
	case d.s.version < VersionQPHandle:
		h, _ := allocHandle(w.qps, &w.qpH, 1, limit)
		q.handle, q.qpn = h, h
	default:
		h, _ := allocHandle(w.qps, &w.qpH, 1, limit)
		q.handle = h
		q.qpn = 0
		for range 64 {
			if n := 0x10000 + uint32(w.rng.IntN(0x10000)); w.qpns[n] == nil {
				q.qpn = n
				break
			}
		}
		for n := uint32(0x10000); q.qpn == 0 && n <= dbHandleMask; n++ {
			if w.qpns[n] == nil && w.qps[n] == nil {
				q.qpn = n
			}
		}
		if q.qpn == 0 {
			return false
		}
	}
	w.qps[q.handle] = q
	w.qpns[q.qpn] = q
	return true
}

// MODIFY_QP attribute mask bits.
const (
	maState           = fw.QPAttrState
	maCurState        = fw.QPAttrCurState
	maEnSQDAsync      = fw.QPAttrEnSQDAsync
	maAccess          = fw.QPAttrAccessFlags
	maPKeyIndex       = fw.QPAttrPKeyIndex
	maPort            = fw.QPAttrPort
	maQKey            = fw.QPAttrQKey
	maAV              = fw.QPAttrAV
	maPathMTU         = fw.QPAttrPathMTU
	maTimeout         = fw.QPAttrTimeout
	maRetryCnt        = fw.QPAttrRetryCnt
	maRNRRetry        = fw.QPAttrRNRRetry
	maRQPSN           = fw.QPAttrRQPSN
	maMaxQPRDAtomic   = fw.QPAttrMaxQPRDAtomic
	maAltPath         = fw.QPAttrAltPath
	maMinRNRTimer     = fw.QPAttrMinRNRTimer
	maSQPSN           = fw.QPAttrSQPSN
	maMaxDestRDAtomic = fw.QPAttrMaxDestRDAtomic
	maPathMigState    = fw.QPAttrPathMigState
	maCap             = fw.QPAttrCap
	maDestQPN         = fw.QPAttrDestQPN
	maAll             = fw.QPAttrAll
)

// QP states.
const (
	stReset = uint32(fw.QPStateReset)
	stInit  = uint32(fw.QPStateInit)
	stRTR   = uint32(fw.QPStateRTR)
	stRTS   = uint32(fw.QPStateRTS)
	stSQD   = uint32(fw.QPStateSQD)
	stSQE   = uint32(fw.QPStateSQE)
	stErr   = uint32(fw.QPStateErr)
)

func decodeAttr(b []byte) qpAttr {
	var a qpAttr
	a.state, a.curState = le.Uint32(b[0:]), le.Uint32(b[4:])
	a.pathMTU, a.pathMigState = le.Uint32(b[8:]), le.Uint32(b[12:])
	a.qkey, a.rqPSN, a.sqPSN = le.Uint32(b[16:]), le.Uint32(b[20:]), le.Uint32(b[24:])
	a.destQPN, a.access = le.Uint32(b[28:]), le.Uint32(b[32:])
	a.pkeyIndex, a.altPKeyIndex = le.Uint16(b[36:]), le.Uint16(b[38:])
	a.enSQDAsync, a.sqDraining, a.maxRDAtomic, a.maxDestRDAtomic = b[40], b[41], b[42], b[43]
	a.minRNRTimer, a.port, a.timeout, a.retryCnt = b[44], b[45], b[46], b[47]
	a.rnrRetry, a.altPort, a.altTimeout = b[48], b[49], b[50]
	a.capSendWR, a.capRecvWR = le.Uint32(b[56:]), le.Uint32(b[60:])
	a.capSendSGE, a.capRecvSGE, a.capInline = le.Uint32(b[64:]), le.Uint32(b[68:]), le.Uint32(b[72:])
	copy(a.ah[:], b[80:120])
	copy(a.altAH[:], b[120:160])
	return a
}

func (a *qpAttr) encode(b []byte) {
	le.PutUint32(b[0:], a.state)
	le.PutUint32(b[4:], a.curState)
	le.PutUint32(b[8:], a.pathMTU)
	le.PutUint32(b[12:], a.pathMigState)
	le.PutUint32(b[16:], a.qkey)
	le.PutUint32(b[20:], a.rqPSN)
	le.PutUint32(b[24:], a.sqPSN)
	le.PutUint32(b[28:], a.destQPN)
	le.PutUint32(b[32:], a.access)
	le.PutUint16(b[36:], a.pkeyIndex)
	le.PutUint16(b[38:], a.altPKeyIndex)
	b[40], b[41], b[42], b[43] = a.enSQDAsync, a.sqDraining, a.maxRDAtomic, a.maxDestRDAtomic
	b[44], b[45], b[46], b[47] = a.minRNRTimer, a.port, a.timeout, a.retryCnt
	b[48], b[49], b[50] = a.rnrRetry, a.altPort, a.altTimeout
	le.PutUint32(b[56:], a.capSendWR)
	le.PutUint32(b[60:], a.capRecvWR)
	le.PutUint32(b[64:], a.capSendSGE)
	le.PutUint32(b[68:], a.capRecvSGE)
	le.PutUint32(b[72:], a.capInline)
	copy(b[80:120], a.ah[:])
	copy(b[120:160], a.altAH[:])
}

// transition is one legal QP state change (the verbs' table, as
// ib_modify_qp_is_ok has it, for RC and UD): the attributes it needs and
// those it may carry.
type transition struct {
	req, opt [2]uint32 // [0] RC, [1] UD (and GSI)
}

var transitions = map[[2]uint32]transition{
	{stReset, stInit}: {req: [2]uint32{maPKeyIndex | maPort | maAccess, maPKeyIndex | maPort | maQKey}},
	{stInit, stInit}:  {opt: [2]uint32{maPKeyIndex | maPort | maAccess, maPKeyIndex | maPort | maQKey}},
	{stInit, stRTR}: {
		req: [2]uint32{maAV | maPathMTU | maDestQPN | maRQPSN | maMaxDestRDAtomic | maMinRNRTimer, 0},
		opt: [2]uint32{maAltPath | maAccess | maPKeyIndex, maPKeyIndex | maQKey},
	},
	{stRTR, stRTS}: {
		req: [2]uint32{maSQPSN | maTimeout | maRetryCnt | maRNRRetry | maMaxQPRDAtomic, maSQPSN},
		opt: [2]uint32{maCurState | maAltPath | maAccess | maMinRNRTimer | maPathMigState, maCurState | maQKey},
	},
	{stRTS, stRTS}: {opt: [2]uint32{maCurState | maAccess | maAltPath | maPathMigState | maMinRNRTimer, maCurState | maQKey}},
	{stRTS, stSQD}: {opt: [2]uint32{maEnSQDAsync, maEnSQDAsync}},
	{stSQD, stRTS}: {opt: [2]uint32{maCurState | maAccess | maAltPath | maPathMigState | maMinRNRTimer, maCurState | maQKey}},
	{stSQD, stSQD}: {opt: [2]uint32{
		maPKeyIndex | maPort | maAV | maAltPath | maAccess | maTimeout | maRetryCnt | maRNRRetry | maMaxQPRDAtomic | maMaxDestRDAtomic | maMinRNRTimer | maPathMigState,
		maPKeyIndex | maQKey,
	}},
	{stSQE, stRTS}: {opt: [2]uint32{maCurState | maAccess, maCurState | maQKey}},
}

// legal checks a VMware device's transition and its attribute mask.
func legal(typ fw.QPType, cur, next, mask uint32) bool {
	if next == stReset || next == stErr {
		return mask&^(maState|maCurState) == 0
	}
	t, okt := transitions[[2]uint32{cur, next}]
	if !okt {
		return false
	}
	i := 0
	if typ != fw.QPTypeRC {
		i = 1
	}
	m := mask &^ maState
	return m&t.req[i] == t.req[i] && m&^(t.req[i]|t.opt[i]) == 0
}

func (d *Device) cmdModifyQP(req []byte) syscall.Errno {
	h, mask := le.Uint32(req[16:]), le.Uint32(req[20:])
	q := d.w.qps[h]
	if q == nil {
		return eINVAL
	}
	a := decodeAttr(req[24:184])
	if d.s.qemu {
		return d.qemuModifyQP(q, mask, &a)
	}
	cur := q.state
	next := cur
	if mask&maState != 0 {
		next = a.state
	}
	if mask&^maAll != 0 || next > stErr || mask&maCurState != 0 && a.curState != cur {
		return eINVAL
	}
	if !legal(q.typ, cur, next, mask) {
		return eINVAL
	}
	// The values the mask names, checked before anything changes.
	if mask&maPort != 0 && a.port != 1 ||
		mask&maPKeyIndex != 0 && a.pkeyIndex >= d.s.caps.MaxPKeys ||
		mask&maMinRNRTimer != 0 && a.minRNRTimer > 31 ||
		mask&maAccess != 0 && a.access&^(accLocalWrite|accRemoteWrite|accRemoteRead|accRemoteAtomic) != 0 ||
		mask&maPathMTU != 0 && (a.pathMTU < fw.MTU256 || a.pathMTU > fw.MTU4096) ||
		mask&maMaxQPRDAtomic != 0 && uint32(a.maxRDAtomic) > d.s.caps.MaxQPInitRDAtom ||
		mask&maMaxDestRDAtomic != 0 && uint32(a.maxDestRDAtomic) > d.s.caps.MaxQPRDAtom ||
		mask&maRetryCnt != 0 && a.retryCnt > 7 || mask&maRNRRetry != 0 && a.rnrRetry > 7 ||
		mask&maDestQPN != 0 && a.destQPN > dbHandleMask {
		return eINVAL
	}
	if mask&maAV != 0 {
		if g := int(a.sgidIndex()); g >= len(d.w.gids) || !d.w.gids[g].valid {
			return eINVAL
		}
	}
	q.attr.merge(&a, mask)
	switch {
	case next == cur && next != stErr && next != stReset:
	case next == stReset:
		d.resetQP(q)
	case next == stErr:
		q.state = stErr
		d.qpError(q)
	case next == stRTR:
		q.epsn = q.attr.rqPSN & psnMask
	case next == stRTS && cur == stRTR:
		q.nextPSN = q.attr.sqPSN & psnMask
	}
	q.state, q.recorded = next, next
	q.attr.state, q.attr.curState = next, next
	if next == stRTS {
		d.pumpSQ(q) // WQEs posted before RTS, or held in SQD
	}
	return ok
}

// merge takes the attributes mask names.
func (a *qpAttr) merge(b *qpAttr, mask uint32) {
	if mask&maPathMTU != 0 {
		a.pathMTU = b.pathMTU
	}
	if mask&maPathMigState != 0 {
		a.pathMigState = b.pathMigState
	}
	if mask&maQKey != 0 {
		a.qkey = b.qkey
	}
	if mask&maRQPSN != 0 {
		a.rqPSN = b.rqPSN
	}
	if mask&maSQPSN != 0 {
		a.sqPSN = b.sqPSN
	}
	if mask&maDestQPN != 0 {
		a.destQPN = b.destQPN
	}
	if mask&maAccess != 0 {
		a.access = b.access
	}
	if mask&maPKeyIndex != 0 {
		a.pkeyIndex = b.pkeyIndex
	}
	if mask&maEnSQDAsync != 0 {
		a.enSQDAsync = b.enSQDAsync
	}
	if mask&maMaxQPRDAtomic != 0 {
		a.maxRDAtomic = b.maxRDAtomic
	}
	if mask&maMaxDestRDAtomic != 0 {
		a.maxDestRDAtomic = b.maxDestRDAtomic
	}
	if mask&maMinRNRTimer != 0 {
		a.minRNRTimer = b.minRNRTimer
	}
	if mask&maPort != 0 {
		a.port = b.port
	}
	if mask&maTimeout != 0 {
		a.timeout = b.timeout
	}
	if mask&maRetryCnt != 0 {
		a.retryCnt = b.retryCnt
	}
	if mask&maRNRRetry != 0 {
		a.rnrRetry = b.rnrRetry
	}
	if mask&maAV != 0 {
		a.ah = b.ah
	}
	if mask&maAltPath != 0 {
		a.altAH, a.altPKeyIndex, a.altPort, a.altTimeout = b.altAH, b.altPKeyIndex, b.altPort, b.altTimeout
	}
}

// qemuModifyQP is QEMU 7.2's modify_qp (facts sheet §8): only the STATE
// and QKEY bits matter, the values it needs come from the attribute block
// whatever the mask says, INIT/RTR/RTS reach the backend with QEMU's fixed
// RC values, and the other states are only recorded.
func (d *Device) qemuModifyQP(q *qp, mask uint32, a *qpAttr) syscall.Errno {
	switch q.typ {
	case fw.QPTypeSMI:
		return ePERM
	case fw.QPTypeGSI:
		return ok
	}
	if mask&maState == 0 {
		if mask&maQKey != 0 {
			q.attr.qkey = a.qkey
		}
		return ok
	}
	b := &q.attr
	switch a.state {
	case stInit:
		if q.state != stReset && q.state != stInit {
			return eIO // the backend QP is not reset by RESET (§8)
		}
		b.pkeyIndex, b.port = 0, 1
		if q.typ == fw.QPTypeUD {
			b.qkey = a.qkey
		} else {
			b.access = 0
		}
		q.state = stInit
	case stRTR:
		sg := int(a.sgidIndex())
		if sg >= len(d.w.gids) || !d.w.gids[sg].valid {
			return eIO // the source GID does not resolve on the backend
		}
		if q.state != stInit && q.state != stRTR {
			return eIO
		}
		if q.typ == fw.QPTypeRC {
			b.destQPN, b.rqPSN, b.ah = a.destQPN, a.rqPSN, a.ah
			b.ah[21] = 1 // hop limit
			b.pathMTU, b.maxDestRDAtomic, b.minRNRTimer = fw.MTU1024, 1, 12
			q.epsn = b.rqPSN & psnMask
		} else if mask&maQKey != 0 {
			b.qkey = a.qkey
		}
		q.state = stRTR
	case stRTS:
		if q.state != stRTR && q.state != stRTS {
			return eIO
		}
		if q.state == stRTR {
			b.sqPSN = a.sqPSN
			q.nextPSN = b.sqPSN & psnMask
		}
		if q.typ == fw.QPTypeRC {
			b.timeout, b.retryCnt, b.rnrRetry, b.maxRDAtomic = 14, 7, 7, 1
		} else if mask&maQKey != 0 {
			b.qkey = a.qkey
		}
		q.state = stRTS
	}
	q.recorded = a.state
	if q.state == stRTS {
		d.pumpSQ(q)
	}
	return ok
}

func (d *Device) cmdQueryQP(req, resp []byte) syscall.Errno {
	q := d.w.qps[le.Uint32(req[16:])]
	if q == nil {
		return eINVAL
	}
	a := q.attr
	a.state, a.curState = q.state, q.state
	if d.s.qemu {
		// QEMU writes the backend's struct ibv_qp_attr over the block: it
		// agrees with the device layout up to qp_access_flags, and the
		// model leaves the rest zero (facts sheet §8).
		var full [160]byte
		a.encode(full[:])
		copy(resp[16:52], full[:36])
		return ok
	}
	a.capSendWR, a.capRecvWR = q.maxSendWR, q.maxRecvWR
	a.capSendSGE, a.capRecvSGE, a.capInline = q.maxSendSGE, q.maxRecvSGE, q.maxInline
	a.encode(resp[16:176])
	return ok
}

func (d *Device) cmdDestroyQP(req, resp []byte) syscall.Errno {
	q := d.w.qps[le.Uint32(req[16:])]
	if q == nil {
		return eINVAL
	}
	d.dropQP(q)
	if !d.s.qemu {
		le.PutUint32(resp[16:], q.eventsReported)
	}
	return ok
}

// dropQP forgets a QP: what it had in flight is discarded without
// completions (a destroyed QP completes nothing more).
func (d *Device) dropQP(q *qp) {
	w := &d.w
	d.stopTimers(q)
	q.inflight, q.fifo = nil, nil
	freeHandle(w.qps, &w.qpH, q.handle)
	delete(w.qpns, q.qpn)
	q.pd.users--
	if c := w.cqs[q.scq]; c != nil {
		c.users--
	}
	if c := w.cqs[q.rcq]; c != nil {
		c.users--
	}
	if q.srq != nil {
		q.srq.users--
	}
	q.state = stErr
	q.handle = ^uint32(0)
}

func (d *Device) cmdCreateUC(req, resp []byte) syscall.Errno {
	var pfn uint64
	if d.s.version >= VersionPPN64 {
		pfn = le.Uint64(req[16:])
	} else {
		pfn = uint64(le.Uint32(req[16:]))
	}
	limit := uint32(qemuMaxUC)
	if !d.s.qemu {
		limit = d.s.caps.MaxUAR
	}
	h, okh := allocIn(d, "UC", d.w.ucs, &d.w.ucH, limit)
	if !okh {
		return eNOMEM
	}
	d.w.ucs[h] = true
	d.w.ucPFN = pfn
	le.PutUint32(resp[16:], h)
	return ok
}

func (d *Device) cmdDestroyUC(req []byte) syscall.Errno {
	h := le.Uint32(req[16:])
	if !d.w.ucs[h] && !d.s.qemu {
		return eINVAL
	}
	freeHandle(d.w.ucs, &d.w.ucH, h)
	return ok
}

func (d *Device) cmdCreateBind(req []byte) syscall.Errno {
	idx, typ := le.Uint32(req[24:]), req[44]
	var g [16]byte
	copy(g[:], req[28:44])
	if d.s.qemu {
		if idx >= qemuGIDTblLen || int(idx) >= len(d.w.gids) {
			return eINVAL
		}
		typ = fw.GIDTypeRoCEv1 // QEMU ignores the type; its GIDs are RoCE v1
	} else {
		if int(idx) >= len(d.w.gids) || typ != fw.GIDTypeRoCEv1 && typ != fw.GIDTypeRoCEv2 {
			return eINVAL
		}
		if typ != d.s.gidType && !d.s.AcceptAnyGIDType {
			return eINVAL
		}
	}
	old := d.w.gids[idx]
	d.w.gids[idx] = gidEntry{gid: g, typ: typ, valid: true}
	if old.valid && old.gid != g {
		d.unregisterGID(old.gid)
	}
	d.fab.bind(g, d)
	return ok
}

func (d *Device) cmdDestroyBind(req []byte) syscall.Errno {
	idx := le.Uint32(req[16:])
	if d.s.qemu {
		if idx >= qemuGIDTblLen || int(idx) >= len(d.w.gids) {
			return eINVAL
		}
		e := d.w.gids[idx]
		if le.Uint64(e.gid[8:]) == 0 {
			return ok // a zero interface id: a no-op
		}
	} else if int(idx) >= len(d.w.gids) || !d.w.gids[idx].valid {
		return eINVAL
	}
	old := d.w.gids[idx]
	d.w.gids[idx] = gidEntry{}
	if old.valid {
		d.unregisterGID(old.gid)
	}
	return ok
}

// unregisterGID takes g off the fabric unless another index still holds it.
func (d *Device) unregisterGID(g [16]byte) {
	for _, e := range d.w.gids {
		if e.valid && e.gid == g {
			return
		}
	}
	d.fab.unbind(g, d)
}

func (d *Device) cmdCreateSRQ(req, resp []byte) syscall.Errno {
	w := &d.w
	caps := &d.s.caps
	pdir, pdh, nch := le.Uint64(req[16:]), le.Uint32(req[24:]), le.Uint32(req[28:])
	maxWR, maxSGE, limit, typ := le.Uint32(req[32:]), le.Uint32(req[36:]), le.Uint32(req[40:]), req[48]
	p := w.pds[pdh]
	if p == nil {
		return eINVAL
	}
	stride := rqStride(maxSGE)
	fits := nch >= 2 && isPow2(uint64(maxWR)) && uint64(maxWR)*uint64(stride) <= uint64(nch-1)*pageSize
	if d.s.qemu {
		if nch < 1 || nch > maxRingPages || maxSGE > caps.MaxSRQSGE {
			return eINVAL
		}
		if !fits {
			d.hazard("CREATE_SRQ of %d WQEs x %d B in %d chunks: QEMU 7.2 does not check the ring fits its pages", maxWR, stride, nch)
			return eINVAL
		}
	} else {
		if caps.MaxSRQ == 0 {
			return eNOTSUP
		}
		if typ != 0 || maxWR > caps.MaxSRQWR || maxSGE < 1 || maxSGE > caps.MaxSRQSGE || !fits {
			return eINVAL
		}
		// The verbs ignore srq_limit at creation (ibv_create_srq(3):
		// "irrelevant for ibv_create_srq"): the SRQ starts disarmed.
		limit = 0
	}
	pages, err := d.pageList(pdir, int(nch), d.s.qemu)
	if err != nil {
		if d.s.qemu {
			d.hazard("CREATE_SRQ page directory: %v (QEMU crashes when it touches it)", err)
		}
		return eINVAL
	}
	h, okh := allocIn(d, "SRQ", w.srqs, &w.srqH, caps.MaxSRQ)
	if !okh {
		return eNOMEM
	}
	d.qemuZero(pages[1:])
	w.srqs[h] = &srq{handle: h, pd: p, maxWR: maxWR, maxSGE: maxSGE, limit: limit,
		ring: wqRing{state: pages[0] + 8, pages: pages[1:], n: maxWR, stride: stride}}
	p.users++
	le.PutUint32(resp[16:], h)
	return ok
}

// cmdModifySRQ is MODIFY_SRQ as the interface defines it: only the limit
// may change (Linux refuses MAX_WR, and so does the model); setting it
// arms the SRQ_LIMIT_REACHED event, 0 disarms it.
func (d *Device) cmdModifySRQ(req []byte) syscall.Errno {
	s := d.w.srqs[le.Uint32(req[16:])]
	mask, limit := le.Uint32(req[20:]), le.Uint32(req[32:])
	if s == nil || mask&^(fw.SRQAttrMaxWR|fw.SRQAttrLimit) != 0 || mask&fw.SRQAttrMaxWR != 0 {
		return eINVAL
	}
	if mask&fw.SRQAttrLimit != 0 {
		if limit > s.maxWR {
			return eINVAL
		}
		s.limit = limit
	}
	return ok
}

// cmdQEMUModifySRQ is QEMU's modify handler, which code 19 runs: it takes
// only the LIMIT bit, without MAX_WR, and a non-zero limit.
func (d *Device) cmdQEMUModifySRQ(req []byte) syscall.Errno {
	s := d.w.srqs[le.Uint32(req[16:])]
	mask, limit := le.Uint32(req[20:]), le.Uint32(req[32:])
	if mask&fw.SRQAttrLimit == 0 || mask&fw.SRQAttrMaxWR != 0 || limit == 0 || s == nil {
		return eINVAL
	}
	s.limit = limit
	return ok
}

func (d *Device) cmdQuerySRQ(req, resp []byte) syscall.Errno {
	s := d.w.srqs[le.Uint32(req[16:])]
	if s == nil {
		return eINVAL
	}
	le.PutUint32(resp[16:], s.maxWR)
	le.PutUint32(resp[20:], s.maxSGE)
	le.PutUint32(resp[24:], s.limit)
	return ok
}

func (d *Device) cmdDestroySRQ(req []byte) syscall.Errno {
	s := d.w.srqs[le.Uint32(req[16:])]
	if s == nil {
		return eINVAL
	}
	if s.users > 0 {
		if !d.s.qemu {
			return eBUSY
		}
		d.hazard("DESTROY_SRQ %d while %d QPs use it: QEMU 7.2 leaves them dangling", s.handle, s.users)
	}
	freeHandle(d.w.srqs, &d.w.srqH, s.handle)
	s.pd.users--
	return ok
}

// resetAll forgets every object, as a VMware device's CTL RESET is
// modelled to: QPs, SRQs, CQs, MRs, PDs, contexts, GIDs, and the DSR.
func (d *Device) resetAll() {
	w := &d.w
	for _, q := range w.qps {
		d.stopTimers(q)
	}
	for _, e := range w.gids {
		if e.valid {
			d.fab.unbind(e.gid, d)
		}
	}
	clear(w.qps)
	clear(w.qpns)
	clear(w.srqs)
	clear(w.cqs)
	clear(w.mrs)
	clear(w.lkeys)
	clear(w.rkeys)
	clear(w.pds)
	clear(w.ucs)
	clear(w.gids)
	w.pdH, w.mrH, w.cqH, w.qpH, w.srqH, w.ucH = handleSpace{}, handleSpace{}, handleSpace{}, handleSpace{}, handleSpace{}, handleSpace{}
	w.dsrLoaded = false
	d.loaded.Store(false)
}
