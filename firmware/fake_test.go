package firmware

import (
	"fmt"
	"syscall"
)

// This file is a scripted stand-in for the device: it implements Regs over
// an in-memory register file and executes commands from the slots the way
// QEMU 7.2's hw/rdma/vmw does (read from its source, not copied): the DSR is
// loaded on DSRHIGH, commands run synchronously inside the REQUEST write,
// handlers are indexed by position (so MODIFY_SRQ and QUERY_SRQ are swapped
// when swapSRQ is set), the header is written for every implemented
// command, ERR carries the handler's return value, and unknown or
// unimplemented codes get ERR 0xFFFF and no response. Anything that would
// crash or corrupt QEMU is recorded in crashes, which tests check is empty.

// fakeMem is DMA memory: 4 KiB pages by address.
type fakeMem struct {
	pages map[uint64][]byte
	next  uint64
}

func newFakeMem() *fakeMem { return &fakeMem{pages: map[uint64][]byte{}, next: 0x1_0000_0000} }

func (m *fakeMem) alloc() Page {
	a := m.next
	m.next += PageSize
	p := make([]byte, PageSize)
	m.pages[a] = p
	return Page{DMA: a, Mem: p}
}

// slice maps n bytes at a, which must lie within one mapped page.
func (m *fakeMem) slice(a uint64, n int) []byte {
	p := m.pages[a&^(PageSize-1)]
	o := int(a % PageSize)
	if p == nil || o+n > PageSize {
		return nil
	}
	return p[o : o+n]
}

const (
	fakeMaxPD  = 1024
	fakeMaxCQ  = 2048
	fakeMaxMR  = 1024
	fakeMaxSRQ = 512
	fakeMaxUC  = 512
)

type fakeRing struct {
	state []byte // the 8-byte ring state
	pages [][]byte
	n     uint32 // elements
	elem  uint32
}

// write produces one element the way QEMU's ring code does; false if full
// or the counters are invalid.
func (r *fakeRing) write(e []byte) bool {
	if r == nil || r.n == 0 {
		return false
	}
	tail, head := le.Uint32(r.state[0:]), le.Uint32(r.state[4:])
	mask := 2*r.n - 1
	if tail&^mask != 0 || head&^mask != 0 || tail == head^r.n {
		return false
	}
	off := (tail & (r.n - 1)) * r.elem
	copy(r.pages[off/PageSize][off%PageSize:], e)
	le.PutUint32(r.state[0:], (tail+1)&mask)
	return true
}

type fakeQP struct {
	qpType   uint8
	state    uint32
	isSRQ    bool
	destQPN  uint32
	qkey     uint32
	sendRing *fakeRing
}

type fakeSRQ struct {
	attr SRQAttr
}

type fakeDev struct {
	mem     *fakeMem
	regs    [64]uint32
	swapSRQ bool // QEMU's handler order
	// spec makes the device answer like the interface says: no swap, no
	// response for the commands Linux expects none from, caps with a vendor.
	spec bool
	// deferred holds responses back until deliver (asynchronous hardware).
	deferred bool
	pending  []byte
	irqs     int

	dsrDMA    uint64
	dsr       []byte
	cmd, resp []byte
	cqRing    *fakeRing
	asyncRing *fakeRing

	pds, cqs, mrs, srqs, ucs map[uint32]bool
	srqAttr                  map[uint32]*fakeSRQ
	qps                      map[uint32]*fakeQP
	gids                     [255][16]byte
	nextQPN                  uint32
	log                      []Cmd
	crashes                  []string

	// hook, if set, runs instead of the command; it may write the
	// response slot and returns ERR.
	hook func(cmd, resp []byte) uint32
}

func newFakeDev(mem *fakeMem, version uint32) *fakeDev {
	d := &fakeDev{
		mem: mem, swapSRQ: true, nextQPN: 0x11,
		pds: map[uint32]bool{}, cqs: map[uint32]bool{}, mrs: map[uint32]bool{},
		srqs: map[uint32]bool{}, ucs: map[uint32]bool{}, srqAttr: map[uint32]*fakeSRQ{},
		qps: map[uint32]*fakeQP{},
	}
	d.regs[RegVersion/4] = version
	d.regs[RegErr/4] = 0xFFFF
	return d
}

func (d *fakeDev) crash(format string, args ...any) {
	d.crashes = append(d.crashes, fmt.Sprintf(format, args...))
}

func (d *fakeDev) Load32(off int) (uint32, error) {
	if off < 0 || off+4 > 256 || off%4 != 0 {
		return 0, fmt.Errorf("fake: bad register offset %#x", off)
	}
	return d.regs[off/4], nil
}

func (d *fakeDev) Store32(off int, v uint32) error {
	if off < 0 || off+4 > 256 || off%4 != 0 {
		return fmt.Errorf("fake: bad register offset %#x", off)
	}
	d.regs[off/4] = v
	switch off {
	case RegDSRLow:
		d.dsrDMA = uint64(v)
	case RegDSRHigh:
		d.dsrDMA |= uint64(v) << 32
		d.loadDSR()
	case RegRequest:
		if v == 0 {
			d.execute()
		}
	case RegCtl:
		if v == CtlActivate {
			d.regs[RegErr/4] = 0
		}
	}
	return nil
}

// deliver writes a deferred response, as an asynchronous device would.
func (d *fakeDev) deliver() {
	if d.pending != nil {
		copy(d.resp, d.pending)
		d.pending = nil
	}
}

// mapRing maps a single-table ring: the ring state at stateOff of the table's
// entry 0, data pages from entry first on.
func (d *fakeDev) mapRing(pdir uint64, stateOff int, first, npages int, elems, elem uint32) (*fakeRing, []uint64, bool) {
	dir := d.mem.slice(pdir, PageSize)
	if dir == nil {
		return nil, nil, false
	}
	tbl := d.mem.slice(le.Uint64(dir), PageSize)
	if tbl == nil {
		return nil, nil, false
	}
	if first+npages > EntriesPerPage {
		d.crash("ring of %d pages from entry %d reads past the page table", npages, first)
		return nil, nil, false
	}
	st := d.mem.slice(le.Uint64(tbl), PageSize)
	if st == nil {
		return nil, nil, false
	}
	r := &fakeRing{state: st[stateOff : stateOff+8], n: elems, elem: elem}
	var addrs []uint64
	for i := range npages {
		a := le.Uint64(tbl[8*(first+i):])
		addrs = append(addrs, a)
		if a == 0 {
			d.crash("zero page-table entry %d", first+i)
			r.pages = append(r.pages, nil)
			continue
		}
		p := d.mem.slice(a, PageSize)
		if p == nil {
			return nil, nil, false
		}
		clear(p)
		r.pages = append(r.pages, p)
	}
	if uint64(elems)*uint64(elem) > uint64(npages)*PageSize {
		d.crash("ring of %d x %d bytes overruns its %d pages", elems, elem, npages)
	}
	return r, addrs, true
}

func (d *fakeDev) loadDSR() {
	d.dsr, d.cmd, d.resp, d.cqRing, d.asyncRing = nil, nil, nil, nil, nil
	dsr := d.mem.slice(d.dsrDMA, DSRSize)
	if dsr == nil {
		return
	}
	cmd := d.mem.slice(le.Uint64(dsr[16:]), CmdSlotSize)
	resp := d.mem.slice(le.Uint64(dsr[24:]), RespSlotSize)
	if cmd == nil || resp == nil {
		return
	}
	rings := [2]*fakeRing{}
	for i, off := range []int{48, 32} { // CQ ring, then async ring
		np := le.Uint32(dsr[off:])
		if np == 0 || np > MaxDeviceRingPages {
			return
		}
		elems := (np - 1) * PageSize / CQNotifySize
		elem := uint32(CQNotifySize)
		if off == 32 { // the async ring as a device following Linux fills it
			elems, elem = (np-1)*PageSize/AsyncEventSize, AsyncEventSize
		}
		r, _, ok := d.mapRing(le.Uint64(dsr[off+8:]), 8, 1, int(np-1), elems, elem)
		if !ok {
			return
		}
		rings[i] = r
	}
	d.dsr, d.cmd, d.resp, d.cqRing, d.asyncRing = dsr, cmd, resp, rings[0], rings[1]
	c := dsr[CapsOffset:]
	le.PutUint64(c[0:], 14)
	copy(c[8:16], []byte{0x52, 0x54, 0x00, 0xff, 0xfe, 0x12, 0x34, 0x56})
	le.PutUint64(c[24:], 1<<27)
	le.PutUint32(c[76:], 1024)
	le.PutUint32(c[80:], 10467)
	le.PutUint32(c[88:], 4)
	le.PutUint32(c[96:], fakeMaxCQ)
	le.PutUint32(c[100:], 28672)
	le.PutUint32(c[104:], fakeMaxMR)
	le.PutUint32(c[108:], fakeMaxPD)
	le.PutUint32(c[164:], 64)
	le.PutUint32(c[176:], fakeMaxSRQ)
	le.PutUint32(c[180:], 12288)
	le.PutUint32(c[184:], 4)
	le.PutUint32(c[188:], 0x200000)
	le.PutUint32(c[192:], 255)
	le.PutUint16(c[196:], 1)
	c[199] = 1
	c[200] = ModeRoCE
	c[203] |= GIDTypeRoCEv1
	if d.spec {
		le.PutUint32(c[64:], 0x15ad)
		le.PutUint32(c[68:], 0x0820)
		le.PutUint64(c[32:], PageSize)
	}
}

type fakeHandler struct {
	ack uint32
	fn  func(d *fakeDev, cmd, resp []byte) int32
}

func (d *fakeDev) table() []fakeHandler {
	t := []fakeHandler{
		{CmdQueryPort.Ack(), (*fakeDev).queryPort},
		{CmdQueryPKey.Ack(), (*fakeDev).queryPKey},
		{CmdCreatePD.Ack(), (*fakeDev).createPD},
		{CmdDestroyPD.Ack(), (*fakeDev).destroyPD},
		{CmdCreateMR.Ack(), (*fakeDev).createMR},
		{CmdDestroyMR.Ack(), (*fakeDev).destroyMR},
		{CmdCreateCQ.Ack(), (*fakeDev).createCQ},
		{CmdResizeCQ.Ack(), nil},
		{CmdDestroyCQ.Ack(), (*fakeDev).destroyCQ},
		{CmdCreateQP.Ack(), (*fakeDev).createQP},
		{CmdModifyQP.Ack(), (*fakeDev).modifyQP},
		{CmdQueryQP.Ack(), (*fakeDev).queryQP},
		{CmdDestroyQP.Ack(), (*fakeDev).destroyQP},
		{CmdCreateUC.Ack(), (*fakeDev).createUC},
		{CmdDestroyUC.Ack(), (*fakeDev).destroyUC},
		{CmdCreateBind.Ack(), (*fakeDev).createBind},
		{CmdDestroyBind.Ack(), (*fakeDev).destroyBind},
		{CmdCreateSRQ.Ack(), (*fakeDev).createSRQ},
		{CmdModifySRQ.Ack(), (*fakeDev).modifySRQ},
		{CmdQuerySRQ.Ack(), (*fakeDev).querySRQ},
		{CmdDestroySRQ.Ack(), (*fakeDev).destroySRQ},
	}
	if d.swapSRQ {
		t[18], t[19] = t[19], t[18]
	}
	return t
}

// silent lists the commands a spec device does not answer.
var silent = map[Cmd]bool{
	CmdDestroyPD: true, CmdDestroyMR: true, CmdDestroyCQ: true, CmdDestroyQP: true,
	CmdDestroyUC: true, CmdCreateBind: true, CmdDestroyBind: true,
	CmdModifySRQ: true, CmdDestroySRQ: true,
}

func (d *fakeDev) execute() {
	d.irqs++
	if d.dsr == nil {
		d.crash("REQUEST with no DSR loaded (CVE-2022-1050)")
		d.regs[RegErr/4] = 0xFFFF
		return
	}
	code := le.Uint32(d.cmd[8:])
	d.log = append(d.log, Cmd(code))
	if d.hook != nil {
		d.regs[RegErr/4] = d.hook(d.cmd, d.resp)
		return
	}
	t := d.table()
	if code >= uint32(len(t)) || t[code].fn == nil {
		d.regs[RegErr/4] = 0xFFFF
		return
	}
	resp := d.resp
	if d.deferred {
		resp = make([]byte, RespSlotSize)
	}
	rc := t[code].fn(d, d.cmd, resp)
	if !(d.spec && silent[Cmd(code)]) {
		le.PutUint64(resp[0:], le.Uint64(d.cmd[0:]))
		le.PutUint32(resp[8:], t[code].ack)
		resp[12] = 0
		if rc < 0 {
			resp[12] = uint8(-rc)
		}
		if d.deferred {
			d.pending = resp
		}
	}
	d.regs[RegErr/4] = uint32(rc)
}

const (
	eINVAL = -int32(syscall.EINVAL)
	eIO    = -int32(syscall.EIO)
	eNOMEM = -int32(syscall.ENOMEM)
)

func alloc(m map[uint32]bool, limit uint32) (uint32, bool) {
	for h := range limit {
		if !m[h] {
			m[h] = true
			return h, true
		}
	}
	return 0, false
}

func (d *fakeDev) queryPort(cmd, resp []byte) int32 {
	if cmd[16] > 1 {
		return eINVAL
	}
	clear(resp[:64])
	le.PutUint32(resp[16:], PortActive)
	le.PutUint32(resp[20:], MTU1024)
	le.PutUint32(resp[24:], MTU1024)
	le.PutUint32(resp[28:], 255)
	le.PutUint32(resp[36:], 1024)
	le.PutUint16(resp[48:], 1)
	resp[59], resp[60], resp[61] = 1, 1, 5
	return 0
}

func (d *fakeDev) queryPKey(cmd, resp []byte) int32 {
	if cmd[16] > 1 || cmd[17] > 1 {
		return eINVAL
	}
	clear(resp[:24])
	le.PutUint16(resp[16:], 0xFFFF)
	return 0
}

func (d *fakeDev) createPD(cmd, resp []byte) int32 {
	clear(resp[:24])
	h, ok := alloc(d.pds, fakeMaxPD)
	if !ok {
		return eNOMEM
	}
	le.PutUint32(resp[16:], h)
	return 0
}

func (d *fakeDev) destroyPD(cmd, _ []byte) int32 {
	delete(d.pds, le.Uint32(cmd[16:]))
	return 0
}

func (d *fakeDev) createMR(cmd, resp []byte) int32 {
	clear(resp[:32])
	length, pdir := le.Uint64(cmd[24:]), le.Uint64(cmd[32:])
	flags, nchunks := le.Uint32(cmd[48:]), le.Uint32(cmd[52:])
	if flags&MRFlagDMA == 0 {
		if nchunks == 0 || uint64(nchunks)*PageSize != (length+PageSize-1)&^(PageSize-1) {
			return eINVAL
		}
		dir := d.mem.slice(pdir, PageSize)
		if dir == nil {
			return eINVAL
		}
		for i := range nchunks {
			tbl := d.mem.slice(le.Uint64(dir[8*(i/EntriesPerPage):]), PageSize)
			if tbl == nil {
				return eINVAL
			}
			a := le.Uint64(tbl[8*(i%EntriesPerPage):])
			if a == 0 || d.mem.slice(a, PageSize) == nil {
				d.crash("MR page %d unmappable (%#x)", i, a)
				return eINVAL
			}
		}
	}
	if !d.pds[le.Uint32(cmd[40:])] {
		return eINVAL
	}
	if flags&MRFlagFRMR != 0 && flags&MRFlagDMA == 0 {
		return eINVAL
	}
	h, ok := alloc(d.mrs, fakeMaxMR)
	if !ok {
		return eNOMEM
	}
	le.PutUint32(resp[16:], h)
	le.PutUint32(resp[20:], h) // legacy reg_mr build: lkey = handle
	le.PutUint32(resp[24:], 0xFFFFFFFF)
	return 0
}

func (d *fakeDev) destroyMR(cmd, _ []byte) int32 {
	delete(d.mrs, le.Uint32(cmd[16:]))
	return 0
}

func (d *fakeDev) createCQ(cmd, resp []byte) int32 {
	clear(resp[:24])
	cqe, nchunks := le.Uint32(cmd[28:]), le.Uint32(cmd[32:])
	le.PutUint32(resp[20:], cqe)
	if nchunks == 0 || nchunks > MaxRingChunks {
		return eINVAL
	}
	if _, _, ok := d.mapRing(le.Uint64(cmd[16:]), 8, 1, int(nchunks-1), cqe, CQESize); !ok {
		return eINVAL
	}
	h, ok := alloc(d.cqs, fakeMaxCQ)
	if !ok {
		return eNOMEM
	}
	le.PutUint32(resp[16:], h)
	return 0
}

func (d *fakeDev) destroyCQ(cmd, _ []byte) int32 {
	h := le.Uint32(cmd[16:])
	if !d.cqs[h] {
		return eINVAL
	}
	delete(d.cqs, h)
	return 0
}

func (d *fakeDev) createQP(cmd, resp []byte) int32 {
	clear(resp[:40])
	total, send := le.Uint16(cmd[68:]), le.Uint16(cmd[70:])
	isSRQ := cmd[76] != 0
	rpages := int(total) - int(send) - 1
	if send == 0 || send > MaxRingChunks {
		return eINVAL
	}
	if !isSRQ && (rpages < 1 || rpages > MaxRingChunks) {
		return eINVAL
	}
	maxSendWR, maxRecvWR := le.Uint32(cmd[40:]), le.Uint32(cmd[44:])
	sq, _, ok := d.mapRing(le.Uint64(cmd[16:]), 0, 1, int(send), maxSendWR, uint32(wqeStride(sqWQEHeader, le.Uint32(cmd[48:]))))
	if !ok {
		return eINVAL
	}
	if !isSRQ {
		if _, _, ok := d.mapRing(le.Uint64(cmd[16:]), 8, 1+int(send), rpages, maxRecvWR, uint32(wqeStride(rqWQEHeader, le.Uint32(cmd[52:])))); !ok {
			return eINVAL
		}
	}
	if !d.pds[le.Uint32(cmd[24:])] || !d.cqs[le.Uint32(cmd[28:])] || !d.cqs[le.Uint32(cmd[32:])] {
		return eINVAL
	}
	if isSRQ && !d.srqs[le.Uint32(cmd[36:])] {
		return eINVAL
	}
	qpType := cmd[75]
	if qpType != uint8(QPTypeGSI) && qpType != uint8(QPTypeRC) && qpType != uint8(QPTypeUD) {
		return eIO
	}
	qpn := d.nextQPN
	if qpType == uint8(QPTypeGSI) {
		qpn = 1
	} else {
		d.nextQPN++
	}
	handle := qpn
	if d.regs[RegVersion/4] >= VersionQPHandle {
		handle = qpn + 0x1000
	}
	d.qps[handle] = &fakeQP{qpType: qpType, isSRQ: isSRQ, sendRing: sq}
	le.PutUint32(resp[16:], qpn)
	off := 20
	if d.regs[RegVersion/4] >= VersionQPHandle {
		le.PutUint32(resp[20:], handle)
		off = 24
	}
	copy(resp[off:off+20], cmd[40:60]) // the capacities, echoed
	return 0
}

func (d *fakeDev) modifyQP(cmd, resp []byte) int32 {
	clear(resp[:RespSlotSize])
	qp := d.qps[le.Uint32(cmd[16:])]
	if qp == nil {
		return eINVAL
	}
	switch qp.qpType {
	case uint8(QPTypeSMI):
		return -int32(syscall.EPERM)
	case uint8(QPTypeGSI):
		return 0
	}
	state := le.Uint32(cmd[24:])
	if state == uint32(QPStateRTR) {
		var zero [16]byte
		if sgid := cmd[124]; sgid == 0 || d.gids[sgid] == zero {
			return eIO
		}
		qp.destQPN = le.Uint32(cmd[52:])
	}
	qp.qkey = le.Uint32(cmd[40:])
	qp.state = state
	return 0
}

func (d *fakeDev) queryQP(cmd, resp []byte) int32 {
	clear(resp[:RespSlotSize])
	qp := d.qps[le.Uint32(cmd[16:])]
	if qp == nil {
		return eINVAL
	}
	// libibverbs' ibv_qp_attr over the attribute block: the first nine
	// fields agree, the rest does not.
	le.PutUint32(resp[16:], qp.state)
	le.PutUint32(resp[20:], qp.state)
	le.PutUint32(resp[24:], MTU1024)
	le.PutUint32(resp[32:], qp.qkey)
	le.PutUint32(resp[44:], qp.destQPN)
	for i := 52; i < RespSlotSize; i++ {
		resp[i] = 0xEE
	}
	return 0
}

func (d *fakeDev) destroyQP(cmd, _ []byte) int32 {
	h := le.Uint32(cmd[16:])
	if d.qps[h] == nil {
		return eINVAL
	}
	delete(d.qps, h)
	return 0
}

func (d *fakeDev) createUC(_, resp []byte) int32 {
	clear(resp[:24])
	h, ok := alloc(d.ucs, fakeMaxUC)
	if !ok {
		return eNOMEM
	}
	le.PutUint32(resp[16:], h)
	return 0
}

func (d *fakeDev) destroyUC(cmd, _ []byte) int32 {
	delete(d.ucs, le.Uint32(cmd[16:]))
	return 0
}

func (d *fakeDev) createBind(cmd, _ []byte) int32 {
	i := le.Uint32(cmd[24:])
	if i >= 255 {
		return eINVAL
	}
	copy(d.gids[i][:], cmd[28:44])
	return 0
}

func (d *fakeDev) destroyBind(cmd, _ []byte) int32 {
	i := le.Uint32(cmd[16:])
	if i >= 255 {
		return eINVAL
	}
	d.gids[i] = [16]byte{}
	return 0
}

func (d *fakeDev) createSRQ(cmd, resp []byte) int32 {
	clear(resp[:24])
	nchunks := le.Uint32(cmd[28:])
	if nchunks == 0 || nchunks > MaxRingChunks {
		return eINVAL
	}
	var a SRQAttr
	a.decode(cmd[32:48])
	if _, _, ok := d.mapRing(le.Uint64(cmd[16:]), 8, 1, int(nchunks-1), a.MaxWR, uint32(wqeStride(rqWQEHeader, a.MaxSGE))); !ok {
		return eINVAL
	}
	if !d.pds[le.Uint32(cmd[24:])] {
		return eINVAL
	}
	h, ok := alloc(d.srqs, fakeMaxSRQ)
	if !ok {
		return eNOMEM
	}
	d.srqAttr[h] = &fakeSRQ{attr: a}
	le.PutUint32(resp[16:], h)
	return 0
}

func (d *fakeDev) querySRQ(cmd, resp []byte) int32 {
	clear(resp[:32])
	s := d.srqAttr[le.Uint32(cmd[16:])]
	if s == nil {
		return eINVAL
	}
	s.attr.encode(resp[16:32])
	return 0
}

func (d *fakeDev) modifySRQ(cmd, _ []byte) int32 {
	mask := le.Uint32(cmd[20:])
	if mask&SRQAttrLimit == 0 || mask&SRQAttrMaxWR != 0 {
		return eINVAL
	}
	s := d.srqAttr[le.Uint32(cmd[16:])]
	if s == nil {
		return eINVAL
	}
	limit := le.Uint32(cmd[32:])
	if limit == 0 {
		return eINVAL
	}
	s.attr.SRQLimit = limit
	return 0
}

func (d *fakeDev) destroySRQ(cmd, _ []byte) int32 {
	h := le.Uint32(cmd[16:])
	if !d.srqs[h] {
		return eINVAL
	}
	delete(d.srqs, h)
	delete(d.srqAttr, h)
	return 0
}

// notifyCQ produces a CQ-notification element.
func (d *fakeDev) notifyCQ(h uint32) bool {
	var e [4]byte
	le.PutUint32(e[:], h)
	return d.cqRing.write(e[:])
}

// postEvent produces an async event (QEMU never does; a real device does).
func (d *fakeDev) postEvent(t EventType, info uint32) bool {
	var e [8]byte
	le.PutUint32(e[0:], uint32(t))
	le.PutUint32(e[4:], info)
	return d.asyncRing.write(e[:])
}
