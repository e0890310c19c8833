package pvsim_test

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/hw"
	"github.com/vfrdma/vfrdma/mmio"
	"github.com/vfrdma/vfrdma/pvsim"
	"github.com/vfrdma/vfrdma/rings"
	"github.com/vfrdma/vfrdma/vfio"
)

// raw drives a model directly through the firmware and rings packages,
// the driver's own layers below its verbs: every field of every command
// and WQE is the test's to set, one-sided operations included, and CQEs
// are read as the device wrote them (the qp field as it is, handle or
// QPN). It polls; interrupts are the tests' to wait for.
type raw struct {
	t     testing.TB
	m     *pvsim.Device
	ch    *firmware.Channel
	regs  hw.Registers
	uar   hw.Doorbells
	vecs  []hw.Vector
	ctl   *vfio.DMABuffer
	async *firmware.AsyncRing
	cqn   *firmware.CQNotifyRing
	ver   uint32
	caps  firmware.Caps
	gid   [16]byte
	kept  []firmware.AsyncEvent // events drained by waitEvent and not returned yet
}

// Control pages: DSR, command, response, then two device rings of
// directory, table, state and one data page each.
const (
	rpDSR = iota
	rpCmd
	rpResp
	rpAsyncDir
	rpAsyncTable
	rpAsyncState
	rpAsyncData
	rpCQNDir
	rpCQNTable
	rpCQNState
	rpCQNData
	rpPages
)

func page(b *vfio.DMABuffer, i int) firmware.Page {
	return firmware.Page{DMA: b.IOVA + uint64(i*4096), Mem: b.Mem[i*4096 : (i+1)*4096]}
}

func region(t testing.TB, b []byte) *mmio.Region {
	r, err := mmio.New(b)
	require.NoError(t, err)
	return r
}

// newRaw starts a model and brings it up as Linux's probe does; the model
// is closed at the end of the test.
func newRaw(t testing.TB, cfg pvsim.Config) *raw {
	t.Helper()
	m, err := pvsim.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	return attachRaw(t, m, m)
}

// attachRaw brings the device up through fn.
func attachRaw(t testing.TB, m *pvsim.Device, fn hw.Function) *raw {
	t.Helper()
	r := &raw{t: t, m: m}
	regs, err := fn.Registers()
	require.NoError(t, err)
	r.regs = regs
	r.uar, err = fn.Doorbells()
	require.NoError(t, err)
	r.vecs, err = fn.EnableVectors(3)
	require.NoError(t, err)
	r.ctl, err = fn.AllocDMA(rpPages*4096, false)
	require.NoError(t, err)
	for _, ring := range [][4]int{{rpAsyncDir, rpAsyncTable, rpAsyncState, rpAsyncData}, {rpCQNDir, rpCQNTable, rpCQNState, rpCQNData}} {
		require.NoError(t, firmware.WriteRingPageDir(page(r.ctl, ring[0]), page(r.ctl, ring[1]), page(r.ctl, ring[2]).DMA, []uint64{page(r.ctl, ring[3]).DMA}))
	}
	r.async, err = firmware.NewAsyncRing(region(t, page(r.ctl, rpAsyncState).Mem), [][]byte{page(r.ctl, rpAsyncData).Mem})
	require.NoError(t, err)
	r.cqn, err = firmware.NewCQNotifyRing(region(t, page(r.ctl, rpCQNState).Mem), [][]byte{page(r.ctl, rpCQNData).Mem})
	require.NoError(t, err)
	vec0 := r.vecs[0]
	r.ch, err = firmware.NewChannel(regs, page(r.ctl, rpCmd).Mem, page(r.ctl, rpResp).Mem, &firmware.Options{
		Device: m.Name(), Timeout: 2 * time.Second,
		Wait: func(ctx context.Context) error { _, err := vec0.Wait(ctx); return err },
	})
	require.NoError(t, err)
	t.Cleanup(func() { r.ch.Close() })
	pfn := uint64(0x2345)
	if m.Version() >= firmware.VersionPPN64 {
		pfn = 0x1_2345_6789
	}
	r.ver, r.caps, err = r.ch.Start(r.ctx(), &firmware.StartConfig{
		DSR: firmware.DSR{
			GOS:         firmware.GOSInfo{Bits: firmware.GOSBits64, Type: firmware.GOSTypeLinux},
			CmdSlotDMA:  page(r.ctl, rpCmd).DMA,
			RespSlotDMA: page(r.ctl, rpResp).DMA,
			AsyncRing:   firmware.RingPageInfo{NumPages: 2, PDirDMA: page(r.ctl, rpAsyncDir).DMA},
			CQRing:      firmware.RingPageInfo{NumPages: 2, PDirDMA: page(r.ctl, rpCQNDir).DMA},
			UARPFN:      pfn,
		},
		DSRMem: page(r.ctl, rpDSR).Mem, DSRDMA: page(r.ctl, rpDSR).DMA, Interrupts: true,
	})
	require.NoError(t, err)
	binary.BigEndian.PutUint64(r.gid[8:], r.caps.NodeGUID)
	r.gid[0], r.gid[1] = 0xfe, 0x80
	typ := uint8(firmware.GIDTypeRoCEv1)
	if r.caps.GIDTypes == firmware.GIDTypeRoCEv2 {
		typ = firmware.GIDTypeRoCEv2
	}
	require.NoError(t, r.ch.CreateBind(r.ctx(), firmware.CreateBindRequest{MTU: 1024, VLAN: 0xFFF, Index: 0, GID: r.gid, GIDType: typ}))
	return r
}

func (r *raw) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	r.t.Cleanup(cancel)
	return ctx
}

func (r *raw) pd() uint32 {
	h, err := r.ch.CreatePD(r.ctx(), 0)
	require.NoError(r.t, err)
	return h
}

type rawMR struct {
	buf        *vfio.DMABuffer
	handle     uint32
	lkey, rkey uint32
}

func (m *rawMR) addr(off int) uint64 { return m.buf.IOVA + uint64(off) }

func (m *rawMR) sge(off, n int) rings.SGE {
	return rings.SGE{Addr: m.addr(off), Length: uint32(n), LKey: m.lkey}
}

func (r *raw) mr(pd uint32, size int, access uint32) *rawMR {
	t := r.t
	buf, err := r.m.AllocDMA(size, false)
	require.NoError(t, err)
	n := (size + 4095) / 4096
	dir, err := r.m.AllocDMA((1+firmware.TablesFor(n))*4096, false)
	require.NoError(t, err)
	pages := make([]uint64, n)
	for i := range pages {
		pages[i] = buf.IOVA + uint64(i*4096)
	}
	var tables []firmware.Page
	for i := range firmware.TablesFor(n) {
		tables = append(tables, page(dir, 1+i))
	}
	require.NoError(t, firmware.WritePageDir(page(dir, 0), tables, pages))
	resp, err := r.ch.CreateMR(r.ctx(), firmware.CreateMRRequest{Start: buf.IOVA, Length: uint64(size), PDirDMA: dir.IOVA,
		PDHandle: pd, AccessFlags: access, NChunks: uint32(n)})
	require.NoError(t, err)
	return &rawMR{buf: buf, handle: resp.MRHandle, lkey: resp.LKey, rkey: resp.RKey}
}

// ring allocates a ring object's pages: directory, table, state, data.
func (r *raw) ring(data int) (*vfio.DMABuffer, []byte, []byte) {
	buf, err := r.m.AllocDMA((3+data)*4096, false)
	require.NoError(r.t, err)
	var dma []uint64
	for i := range data {
		dma = append(dma, page(buf, 3+i).DMA)
	}
	require.NoError(r.t, firmware.WriteRingPageDir(page(buf, 0), page(buf, 1), page(buf, 2).DMA, dma))
	return buf, page(buf, 2).Mem, buf.Mem[3*4096:]
}

type rawCQ struct {
	r      *raw
	handle uint32
	n      int
	state  *rings.State
	cons   *rings.Consumer
	data   []byte
}

func (r *raw) cq(n int) *rawCQ {
	pages := (n*64 + 4095) / 4096
	buf, state, data := r.ring(pages)
	resp, err := r.ch.CreateCQ(r.ctx(), firmware.CreateCQRequest{PDirDMA: buf.IOVA, CQE: uint32(n), NChunks: uint32(1 + pages)})
	require.NoError(r.t, err)
	st, err := rings.NewState(state[8:16])
	require.NoError(r.t, err)
	cons, err := rings.NewConsumer(st, n)
	require.NoError(r.t, err)
	return &rawCQ{r: r, handle: resp.CQHandle, n: n, state: st, cons: cons, data: data}
}

// poll takes what the CQ holds.
func (c *rawCQ) poll() []rings.CQE {
	ready, err := c.cons.Ready()
	require.NoError(c.r.t, err)
	out := make([]rings.CQE, ready)
	for i := range out {
		rings.DecodeCQE(c.data[c.cons.Slot(i)*64:], &out[i])
	}
	c.cons.Consume(ready)
	return out
}

// wait polls until n CQEs have come (or fails after 5 s).
func (c *rawCQ) wait(n int) []rings.CQE {
	c.r.t.Helper()
	var out []rings.CQE
	deadline := time.Now().Add(5 * time.Second)
	for len(out) < n {
		out = append(out, c.poll()...)
		if len(out) >= n {
			break
		}
		if time.Now().After(deadline) {
			c.r.t.Fatalf("CQ %d: %d CQEs of %d after 5 s: %+v", c.handle, len(out), n, out)
		}
		time.Sleep(100 * time.Microsecond)
	}
	return out
}

// quiet checks that no CQE comes within d.
func (c *rawCQ) quiet(d time.Duration) []rings.CQE {
	time.Sleep(d)
	return c.poll()
}

type rawQP struct {
	r        *raw
	handle   uint32
	qpn      uint32
	typ      firmware.QPType
	sq, rq   *rings.Producer
	sqData   []byte
	rqData   []byte
	sqStride int
	rqStride int
	sqState  *rings.State
	rqState  *rings.State
	depth    int
	gidIndex uint8
}

type qpOpts struct {
	sigAll bool
	srq    uint32
	hasSRQ bool
}

func (r *raw) qp(pd uint32, typ firmware.QPType, scq, rcq *rawCQ, depth int, o qpOpts) *rawQP {
	t := r.t
	ss, rs := rings.SendStride(4), rings.RecvStride(4)
	sp := (depth*ss + 4095) / 4096
	rp := (depth*rs + 4095) / 4096
	if o.hasSRQ {
		rp = 0
	}
	buf, state, data := r.ring(sp + rp)
	resp, err := r.ch.CreateQP(r.ctx(), firmware.CreateQPRequest{
		PDirDMA: buf.IOVA, PDHandle: pd, SendCQHandle: scq.handle, RecvCQHandle: rcq.handle,
		MaxSendWR: uint32(depth), MaxRecvWR: uint32(depth), MaxSendSGE: 4, MaxRecvSGE: 4,
		TotalChunks: uint16(1 + sp + rp), SendChunks: uint16(sp), QPType: typ, SQSigAll: o.sigAll,
		IsSRQ: o.hasSRQ, SRQHandle: o.srq, AccessFlags: firmware.AccessLocalWrite,
	})
	require.NoError(t, err)
	q := &rawQP{r: r, handle: resp.QPHandle, qpn: resp.QPN, typ: typ, sqStride: ss, rqStride: rs, depth: depth,
		sqData: data[:sp*4096], rqData: data[sp*4096:]}
	q.sqState, err = rings.NewState(state[0:8])
	require.NoError(t, err)
	q.rqState, err = rings.NewState(state[8:16])
	require.NoError(t, err)
	q.sq, err = rings.NewProducer(q.sqState, depth)
	require.NoError(t, err)
	if !o.hasSRQ {
		q.rq, err = rings.NewProducer(q.rqState, depth)
		require.NoError(t, err)
	}
	return q
}

// modify runs MODIFY_QP.
func (q *rawQP) modify(state firmware.QPState, mask uint32, a firmware.QPAttr) error {
	a.QPState = state
	return q.r.ch.ModifyQP(q.r.ctx(), firmware.ModifyQPRequest{QPHandle: q.handle, AttrMask: firmware.QPAttrState | mask, Attr: a})
}

// rcAttr are the attributes the RC transitions need.
type rcAttr struct {
	access   uint32
	rnrRetry uint8
	retry    uint8
	timeout  uint8
	minRNR   uint8
}

func defaultRC() rcAttr {
	return rcAttr{access: firmware.AccessLocalWrite | firmware.AccessRemoteWrite | firmware.AccessRemoteRead | firmware.AccessRemoteAtomic,
		rnrRetry: 7, retry: 7, timeout: 14, minRNR: 1}
}

// connect brings an RC QP to RTS against (qpn, gid).
func (q *rawQP) connect(qpn uint32, gid [16]byte, ra rcAttr) {
	t := q.r.t
	t.Helper()
	a := firmware.QPAttr{PKeyIndex: 0, PortNum: 1, QPAccessFlags: ra.access, PathMTU: firmware.MTU1024, DestQPNum: qpn,
		RQPSN: 0x100, SQPSN: 0x100, MaxDestRDAtomic: 4, MaxRDAtomic: 4, MinRNRTimer: ra.minRNR,
		Timeout: ra.timeout, RetryCnt: ra.retry, RNRRetry: ra.rnrRetry,
		AH: firmware.AHAttr{GRH: firmware.GlobalRoute{DGID: gid, SGIDIndex: 0, HopLimit: 1}, AHFlags: firmware.AHFlagGRH, PortNum: 1}}
	require.NoError(t, q.modify(firmware.QPStateInit, firmware.QPAttrPKeyIndex|firmware.QPAttrPort|firmware.QPAttrAccessFlags, a))
	require.NoError(t, q.modify(firmware.QPStateRTR, firmware.QPAttrAV|firmware.QPAttrPathMTU|firmware.QPAttrDestQPN|firmware.QPAttrRQPSN|
		firmware.QPAttrMaxDestRDAtomic|firmware.QPAttrMinRNRTimer, a))
	require.NoError(t, q.modify(firmware.QPStateRTS, firmware.QPAttrSQPSN|firmware.QPAttrTimeout|firmware.QPAttrRetryCnt|
		firmware.QPAttrRNRRetry|firmware.QPAttrMaxQPRDAtomic, a))
}

// up brings a UD QP to RTS with qkey.
func (q *rawQP) up(qkey uint32) {
	t := q.r.t
	t.Helper()
	a := firmware.QPAttr{PortNum: 1, QKey: qkey}
	require.NoError(t, q.modify(firmware.QPStateInit, firmware.QPAttrPKeyIndex|firmware.QPAttrPort|firmware.QPAttrQKey, a))
	require.NoError(t, q.modify(firmware.QPStateRTR, 0, a))
	require.NoError(t, q.modify(firmware.QPStateRTS, firmware.QPAttrSQPSN, a))
}

// wr is a send work request with the union fields the rings codec does
// not write.
type wr struct {
	rings.SendWQE
	raddr  uint64
	rkey   uint32
	cmpAdd uint64
	swap   uint64
	atomic bool
}

// send writes the WQEs and rings the send doorbell once.
func (q *rawQP) send(ws ...wr) {
	t := q.r.t
	t.Helper()
	free, err := q.sq.Free()
	require.NoError(t, err)
	require.GreaterOrEqual(t, free, len(ws), "send queue room")
	for i := range ws {
		w := &ws[i]
		slot := q.sqData[q.sq.Next(0)*q.sqStride:][:q.sqStride]
		w.GIDIndex = q.gidIndex
		rings.PutSendWQE(slot, &w.SendWQE)
		if w.atomic {
			binary.LittleEndian.PutUint64(slot[32:], w.raddr)
			binary.LittleEndian.PutUint64(slot[40:], w.cmpAdd)
			binary.LittleEndian.PutUint64(slot[48:], w.swap)
			binary.LittleEndian.PutUint32(slot[56:], w.rkey)
		} else if w.UD == nil {
			binary.LittleEndian.PutUint64(slot[32:], w.raddr)
			binary.LittleEndian.PutUint32(slot[40:], w.rkey)
		}
		q.sq.Advance(1)
	}
	q.sq.Publish()
	require.NoError(t, q.r.uar.Store32(doorbell.OffsetQP, doorbell.QPSend|q.handle))
}

// recv posts receives and rings the receive doorbell once.
func (q *rawQP) recv(id uint64, sges ...rings.SGE) {
	t := q.r.t
	t.Helper()
	free, err := q.rq.Free()
	require.NoError(t, err)
	require.Positive(t, free)
	rings.PutRecvWQE(q.rqData[q.rq.Next(0)*q.rqStride:], id, sges)
	q.rq.Advance(1)
	q.rq.Publish()
	require.NoError(t, q.r.uar.Store32(doorbell.OffsetQP, doorbell.QPRecv|q.handle))
}

type rawSRQ struct {
	r      *raw
	handle uint32
	prod   *rings.Producer
	data   []byte
	stride int
}

func (r *raw) srq(pd uint32, depth int) *rawSRQ {
	stride := rings.RecvStride(1)
	pages := (depth*stride + 4095) / 4096
	buf, state, data := r.ring(pages)
	h, err := r.ch.CreateSRQ(r.ctx(), firmware.CreateSRQRequest{PDirDMA: buf.IOVA, PDHandle: pd, NChunks: uint32(1 + pages),
		Attr: firmware.SRQAttr{MaxWR: uint32(depth), MaxSGE: 1}})
	require.NoError(r.t, err)
	st, err := rings.NewState(state[8:16])
	require.NoError(r.t, err)
	p, err := rings.NewProducer(st, depth)
	require.NoError(r.t, err)
	return &rawSRQ{r: r, handle: h, prod: p, data: data, stride: stride}
}

func (s *rawSRQ) recv(id uint64, sg rings.SGE) {
	rings.PutRecvWQE(s.data[s.prod.Next(0)*s.stride:], id, []rings.SGE{sg})
	s.prod.Advance(1)
	s.prod.Publish()
	require.NoError(s.r.t, s.r.uar.Store32(doorbell.OffsetSRQ, doorbell.SRQRecv|s.handle))
}

// events drains the async ring (and what waitEvent kept).
func (r *raw) events() []firmware.AsyncEvent {
	out := r.kept
	r.kept = nil
	evs := make([]firmware.AsyncEvent, 64)
	for {
		n, err := r.async.Poll(evs)
		require.NoError(r.t, err)
		out = append(out, evs[:n]...)
		if n < len(evs) {
			return out
		}
	}
}

// waitEvent waits for async events until one of type typ comes.
func (r *raw) waitEvent(typ firmware.EventType) firmware.AsyncEvent {
	r.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		evs := r.events()
		for i, e := range evs {
			if e.Type == typ {
				r.kept = append(evs[:i:i], evs[i+1:]...)
				return e
			}
		}
		r.kept = evs
		time.Sleep(100 * time.Microsecond)
	}
	r.t.Fatalf("no %v event in 5 s (saw %v)", typ, r.kept)
	return firmware.AsyncEvent{}
}
