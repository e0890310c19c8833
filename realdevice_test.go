package vfrdma

import (
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/hw"
	"github.com/vfrdma/vfrdma/mmio"
	"github.com/vfrdma/vfrdma/rings"
	"github.com/vfrdma/vfrdma/vfio"
)

// The paths a VMware device (interface versions 17 to 20) takes and QEMU
// 7.2 never does (realdevice.md): QP handles distinct from QP numbers,
// unsignaled sends, one-sided operations. rdDevice drives the driver's own
// CreateQP, CreateCQ and AllocMR over a scripted command channel and
// ordinary memory, and plays the device's data path: it reads the WQEs the
// driver posted and writes the CQEs a device that honours signaling would.

// memFunction is a PCI function whose DMA memory is ordinary memory at
// made-up IOVAs: enough for the driver's ring and MR allocations.
type memFunction struct {
	hw.Function // unscripted methods panic
	mu          sync.Mutex
	next        uint64
}

func (f *memFunction) Close() error { return nil }

func (f *memFunction) AllocDMA(size int, _ bool) (*vfio.DMABuffer, error) {
	size = (size + firmware.PageSize - 1) &^ (firmware.PageSize - 1)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next += 1 << 32 // far apart: an IOVA names one buffer
	return vfio.NewDMABuffer(make([]byte, size), f.next, firmware.PageSize, func() error { return nil }), nil
}

// qpAnswer is what the scripted device answers a CREATE_QP with.
type qpAnswer struct{ qpn, handle uint32 }

// rdCmds scripts the commands a real device answers: CREATE_QP with the
// numbers and handles queued in qps, CREATE_CQ and CREATE_MR with fresh
// handles and keys; it records the requests.
type rdCmds struct {
	*fakeCmds
	quirks firmware.Quirks

	mu       sync.Mutex
	qps      []qpAnswer
	createQP []firmware.CreateQPRequest
	modifyQP []firmware.ModifyQPRequest
	createMR []firmware.CreateMRRequest
	nextCQ   uint32
	nextMR   uint32
}

func (c *rdCmds) Quirks() firmware.Quirks     { return c.quirks }
func (c *rdCmds) Reset(context.Context) error { return nil }

func (c *rdCmds) CreateQP(_ context.Context, req firmware.CreateQPRequest) (firmware.CreateQPResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.createQP = append(c.createQP, req)
	a := c.qps[0]
	c.qps = c.qps[1:]
	return firmware.CreateQPResponse{V2: c.quirks.CreateQPV2(), QPN: a.qpn, QPHandle: a.handle,
		MaxSendWR: req.MaxSendWR, MaxRecvWR: req.MaxRecvWR, MaxSendSGE: req.MaxSendSGE, MaxRecvSGE: req.MaxRecvSGE}, nil
}

func (c *rdCmds) ModifyQP(_ context.Context, req firmware.ModifyQPRequest) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.modifyQP = append(c.modifyQP, req)
	return nil
}

func (c *rdCmds) CreateCQ(_ context.Context, req firmware.CreateCQRequest) (firmware.CreateCQResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nextCQ++
	return firmware.CreateCQResponse{CQHandle: c.nextCQ, CQE: req.CQE}, nil
}

func (c *rdCmds) CreateMR(_ context.Context, req firmware.CreateMRRequest) (firmware.CreateMRResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.createMR = append(c.createMR, req)
	c.nextMR++
	// On version 20 the keys are the physical adapter's: unrelated to the
	// handle.
	return firmware.CreateMRResponse{MRHandle: c.nextMR, LKey: 0x5000 + c.nextMR, RKey: 0xA0000 + c.nextMR}, nil
}

// rdConfig is the device rdDevice plays.
type rdConfig struct {
	version  uint32
	emulated bool
	caps     Caps
}

// realV20 is a VMware device at version 20 with atomics.
var realV20 = rdConfig{version: firmware.VersionQPHandle, caps: Caps{
	MaxSGE: 4, MaxSGERD: 2, MaxQPWR: 1024, MaxCQE: 4096, MaxMRSize: 1 << 30,
	AtomicOps: atomicCapCAS | atomicCapFAA, MaxQPRDAtom: 32, MaxQPInitRDAtom: 8,
}}

// qemu17 is QEMU 7.2.
var qemu17 = rdConfig{version: firmware.VersionRoCEv1, emulated: true, caps: Caps{
	MaxSGE: 4, MaxQPWR: 1024, MaxCQE: 4096, MaxMRSize: 1 << 30,
}}

type rdDevice struct {
	*lcDevice
	cmds   *rdCmds
	uarMem []byte
	prods  map[*CQ]*rings.Producer
	upper  uint64 // OR'ed into every CQE's qp field: bits no source defines
}

func newRDDevice(t testing.TB, cfg rdConfig) *rdDevice {
	t.Helper()
	l := newLCDevice(t)
	r := &rdDevice{lcDevice: l, uarMem: make([]byte, doorbell.PageSize), prods: map[*CQ]*rings.Producer{}}
	r.cmds = &rdCmds{fakeCmds: l.cmds, quirks: firmware.Quirks{Version: cfg.version}}
	if cfg.emulated {
		r.cmds.quirks.Emulated, r.cmds.quirks.NoAsyncEvents = true, true
	}
	uar, err := mmio.New(r.uarMem)
	require.NoError(t, err)
	d := l.d
	d.ch, d.fn, d.uar = r.cmds, &memFunction{}, uar
	d.version, d.emulated, d.caps = cfg.version, cfg.emulated, cfg.caps
	return r
}

// answerQPs queues the numbers and handles of the next CREATE_QPs.
func (r *rdDevice) answerQPs(as ...qpAnswer) {
	r.cmds.mu.Lock()
	r.cmds.qps = append(r.cmds.qps, as...)
	r.cmds.mu.Unlock()
}

func (r *rdDevice) cq(t testing.TB, n int) *CQ {
	t.Helper()
	cq, err := r.d.CreateCQ(context.Background(), n)
	require.NoError(t, err)
	return cq
}

// qp creates an RTS QP on cq through the driver's CreateQP, the device
// answering a.
func (r *rdDevice) qp(t testing.TB, cfg QPConfig, a qpAnswer) *QP {
	t.Helper()
	r.answerQPs(a)
	qp, err := r.pd.CreateQP(context.Background(), &cfg)
	require.NoError(t, err)
	qp.state.Store(uint32(StateRTS))
	return qp
}

func (r *rdDevice) rcQP(t testing.TB, cq *CQ, depth int, signalAll bool, a qpAnswer) *QP {
	return r.qp(t, QPConfig{Type: RC, SendCQ: cq, RecvCQ: cq, SendDepth: depth, RecvDepth: depth, SendSGE: 4, SignalAll: signalAll}, a)
}

// sqOf is the device's view of qp's send queue.
func sqOf(t testing.TB, qp *QP) *rings.Consumer {
	t.Helper()
	st, err := rings.NewState(bufPage(qp.buf, ringPgState).Mem[0:8])
	require.NoError(t, err)
	c, err := rings.NewConsumer(st, qp.sq.Slots())
	require.NoError(t, err)
	return c
}

// put writes e on cq's ring and publishes it, as the device does.
func (r *rdDevice) put(t testing.TB, cq *CQ, e rings.CQE) {
	t.Helper()
	p := r.prods[cq]
	if p == nil {
		var err error
		p, err = rings.NewProducer(cq.st, cq.entries)
		require.NoError(t, err)
		r.prods[cq] = p
	}
	e.QP |= r.upper
	rings.PutCQE(cq.data[p.Next(0)*CQESize:], &e)
	p.Advance(1)
	p.Publish()
}

// wcOpcodeOf is the completion opcode of a WR opcode.
var wcOpcodeOf = map[uint32]uint32{
	rings.WRSend: rings.WCSend, rings.WRSendWithImm: rings.WCSend,
	rings.WRRDMAWrite: rings.WCRDMAWrite, rings.WRRDMAWriteWithImm: rings.WCRDMAWrite,
	rings.WRRDMARead: rings.WCRDMARead, rings.WRAtomicCmpAndSwp: rings.WCCompSwap, rings.WRAtomicFetchAndAdd: rings.WCFetchAdd,
}

// execute is the device taking every WQE published on qp's send queue
// (sq, its view): a CQE on the send CQ for each signaled one (the WQE's
// SIGNALED flag; every one where signalsAll: QEMU, or sq_sig_all), with
// status fail[wr_id] (a failed WQE completes signaled or not); the
// consumer index moves past each. It returns the WQEs taken.
func (r *rdDevice) execute(t testing.TB, qp *QP, sq *rings.Consumer, signalsAll bool, fail map[uint64]uint32) []rings.SendWQE {
	t.Helper()
	ready, err := sq.Ready()
	require.NoError(t, err)
	var out []rings.SendWQE
	for i := 0; i < ready; i++ {
		w := rings.SendWQE{SGEs: make([]rings.SGE, 0, 4)}
		require.NoError(t, rings.DecodeSendWQE(qp.sq.Slot(sq.Slot(i)), &w))
		out = append(out, w)
		st, failed := fail[w.WRID]
		if signalsAll || w.Flags&rings.SendSignaled != 0 || failed {
			r.put(t, qp.sendCQ, rings.CQE{WRID: w.WRID, QP: uint64(qp.handle), Opcode: wcOpcodeOf[w.Opcode], Status: st})
		}
	}
	sq.Consume(ready)
	return out
}

func poll(t testing.TB, cq *CQ) []WC {
	t.Helper()
	wcs := make([]WC, 64)
	n, err := cq.Poll(wcs)
	require.NoError(t, err)
	return wcs[:n]
}

func sends(n int, first uint64, flags SendFlags, sge SGE) []SendWR {
	wrs := make([]SendWR, n)
	for i := range wrs {
		wrs[i] = SendWR{WRID: first + uint64(i), Flags: flags, SGEs: []SGE{sge}}
	}
	return wrs
}

func (r *rdDevice) lastQPDoorbell() uint32 {
	return binary.LittleEndian.Uint32(r.uarMem[doorbell.OffsetQP:])
}

// --- Version 20: QP handles and QP numbers ---

// At version 20 the device names a QP by its handle in CQEs (and in
// doorbells), a number of its own; the application sees the QP number:
// completions reach the QP by handle, WC.QPN is the number, and bits of
// the CQE's qp field above the 16 Linux reads are ignored. A CQE naming
// the QP number is no completion of the QP. (Before: every completion was
// dropped, the table being keyed by number.)
func TestV20CompletionsFindTheQPByHandleAndReportItsNumber(t *testing.T) {
	r := newRDDevice(t, realV20)
	r.upper = 0xBEEF0000 // bits 16..31: defined by no source
	cq := r.cq(t, 64)
	qp := r.rcQP(t, cq, 16, true, qpAnswer{qpn: 0xABCDE, handle: 3})
	assert.Equal(t, uint32(0xABCDE), qp.QPN())
	sq := sqOf(t, qp)

	n, err := qp.PostSend(sends(2, 10, 0, r.mr.SGE(0, 64)), 0)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	assert.Equal(t, uint32(doorbell.QPSend|3), r.lastQPDoorbell(), "the doorbell names the handle")
	r.execute(t, qp, sq, false, nil)
	wcs := poll(t, cq)
	require.Len(t, wcs, 2)
	for i, wc := range wcs {
		assert.Equal(t, uint64(10+i), wc.WRID)
		assert.Equal(t, uint32(0xABCDE), wc.QPN, "WC.QPN is the QP number")
		assert.Equal(t, WCSuccess, wc.Status)
	}
	send, _ := qp.Outstanding()
	assert.Zero(t, send)

	// A receive completion naming the QP by its number is not the QP's.
	_, err = qp.PostRecv([]RecvWR{{WRID: 77, SGEs: []SGE{r.mr.SGE(0, 64)}}}, 0)
	require.NoError(t, err)
	r.put(t, cq, rings.CQE{WRID: 77, QP: 0xABCDE, Opcode: rings.WCRecv})
	assert.Empty(t, poll(t, cq))
	assert.Equal(t, uint64(1), cq.Stats().Dropped)
	r.put(t, cq, rings.CQE{WRID: 77, QP: 3, Opcode: rings.WCRecv})
	wcs = poll(t, cq)
	require.Len(t, wcs, 1)
	assert.Equal(t, uint32(0xABCDE), wcs[0].QPN)
	assert.Equal(t, qp, r.d.qpByHandle(3), "the QP by the handle the device names it by")
}

// A QP whose handle is another QP's number gets its own completions, not
// the other's (on QEMU one number served as both, which hid the mix-up).
func TestV20HandleThatIsAnotherQPsNumberCompletesTheRightQP(t *testing.T) {
	r := newRDDevice(t, realV20)
	cq := r.cq(t, 64)
	a := r.rcQP(t, cq, 8, true, qpAnswer{qpn: 5, handle: 9})
	b := r.rcQP(t, cq, 8, true, qpAnswer{qpn: 9, handle: 5})
	sa := sqOf(t, a)
	_, err := a.PostSend(sends(1, 1, 0, r.mr.SGE(0, 8)), 0)
	require.NoError(t, err)
	_, err = b.PostSend(sends(1, 1, 0, r.mr.SGE(0, 8)), 0)
	require.NoError(t, err)
	r.execute(t, a, sa, false, nil) // CQE qp = 9: a's handle, b's number
	wcs := poll(t, cq)
	require.Len(t, wcs, 1)
	assert.Equal(t, uint32(5), wcs[0].QPN)
	sendA, _ := a.Outstanding()
	sendB, _ := b.Outstanding()
	assert.Zero(t, sendA, "a's send completed")
	assert.Equal(t, 1, sendB, "b's send is still outstanding")
}

// A destroyed QP's CQEs still in the ring complete its own requests, never
// those of the next QP the device gives its handle (with another number).
func TestV20DestroyedQPsLateCQEsNeverReachTheNextQPWithItsHandle(t *testing.T) {
	r := newRDDevice(t, realV20)
	r.upper = 0x00010000
	cq := r.cq(t, 64)
	old := r.rcQP(t, cq, 8, true, qpAnswer{qpn: 0x100, handle: 3})
	sq := sqOf(t, old)
	_, err := old.PostSend(sends(2, 0, 0, r.mr.SGE(0, 8)), 0)
	require.NoError(t, err)
	r.execute(t, old, sq, false, nil)
	require.NoError(t, old.Close()) // its two CQEs are in the ring
	nu := r.rcQP(t, cq, 8, true, qpAnswer{qpn: 0x200, handle: 3})
	_, err = nu.PostSend(sends(2, 0, 0, r.mr.SGE(0, 8)), 0)
	require.NoError(t, err)
	wcs := poll(t, cq)
	require.Len(t, wcs, 2, "the old QP's completions")
	for _, wc := range wcs {
		assert.Equal(t, uint32(0x100), wc.QPN)
		assert.Equal(t, WCSuccess, wc.Status)
	}
	send, _ := nu.Outstanding()
	assert.Equal(t, 2, send, "the new QP's sends are still outstanding")
	assert.Equal(t, nu, r.d.qpByHandle(3))
	assert.Nil(t, r.d.qpns.Lookup(old.alias), "the drained old QP left the table")
}

// Before version 20 the handle is the QP number, of up to 24 bits on
// QEMU's backends: the whole of it keys the table.
func TestV17CompletionsKeyByTheWholeQPNumber(t *testing.T) {
	r := newRDDevice(t, qemu17)
	cq := r.cq(t, 64)
	qp := r.rcQP(t, cq, 8, false, qpAnswer{qpn: 0x12345, handle: 0x12345})
	other := r.rcQP(t, cq, 8, false, qpAnswer{qpn: 0x2345, handle: 0x2345}) // the same low 16 bits
	sq := sqOf(t, qp)
	_, err := qp.PostSend(sends(1, 1, 0, r.mr.SGE(0, 8)), 0)
	require.NoError(t, err)
	r.execute(t, qp, sq, true, nil)
	wcs := poll(t, cq)
	require.Len(t, wcs, 1)
	assert.Equal(t, uint32(0x12345), wcs[0].QPN)
	assert.Equal(t, other, r.d.qpByHandle(0x2345))
}

// A device that hands out the handle of a live QP (the same low 16 bits at
// version 20) broke its contract: CreateQP fails with ErrDeviceFault and
// gives the new QP back; the live one keeps its completions.
func TestV20HandleOfALiveQPIsADeviceFault(t *testing.T) {
	r := newRDDevice(t, realV20)
	cq := r.cq(t, 64)
	live := r.rcQP(t, cq, 8, true, qpAnswer{qpn: 0x100, handle: 4})
	r.answerQPs(qpAnswer{qpn: 0x200, handle: 0x10004})
	_, err := r.pd.CreateQP(context.Background(), &QPConfig{Type: RC, SendCQ: cq, RecvCQ: cq})
	assert.ErrorIs(t, err, ErrDeviceFault)
	assert.Contains(t, r.cmds.destroyedOf(kindQP), uint32(0x10004), "the new QP was destroyed")
	assert.Equal(t, live, r.d.qpByHandle(4))
}

// --- Unsignaled sends ---

// SignalAll reaches the device as sq_sig_all, and every WQE carries
// SIGNALED: each send completes. Without it, CREATE_QP asks for selective
// signaling.
func TestSignalAllReachesCreateQPAndSignalsEverySend(t *testing.T) {
	r := newRDDevice(t, realV20)
	cq := r.cq(t, 64)
	all := r.rcQP(t, cq, 8, true, qpAnswer{qpn: 0x10, handle: 1})
	sel := r.rcQP(t, cq, 8, false, qpAnswer{qpn: 0x11, handle: 2})
	require.Len(t, r.cmds.createQP, 2)
	assert.True(t, r.cmds.createQP[0].SQSigAll)
	assert.False(t, r.cmds.createQP[1].SQSigAll)
	sq := sqOf(t, all)
	_, err := all.PostSend(sends(4, 0, 0, r.mr.SGE(0, 8)), 0)
	require.NoError(t, err)
	for _, w := range r.execute(t, all, sq, false, nil) {
		assert.NotZero(t, w.Flags&rings.SendSignaled, "wr %d", w.WRID)
	}
	assert.Len(t, poll(t, cq), 4)
	assert.False(t, all.sq.Selective())
	assert.True(t, sel.sq.Selective())
}

// On a device that honours signaling an unsignaled send makes no
// completion; the signaled send after it, completing, retires it too: its
// slot is free, and nothing is left outstanding. (Before: each unsignaled
// send stayed outstanding for good.)
func TestUnsignaledSendsAreRetiredByTheSignaledCompletionAfterThem(t *testing.T) {
	r := newRDDevice(t, realV20)
	cq := r.cq(t, 64)
	qp := r.rcQP(t, cq, 8, false, qpAnswer{qpn: 0x10, handle: 1})
	sq := sqOf(t, qp)
	for round := range 10 {
		wrs := sends(8, uint64(round*8), 0, r.mr.SGE(0, 8))
		wrs[7].Flags = SendSignaled
		n, err := qp.PostSend(wrs, 0)
		require.NoError(t, err, "round %d", round)
		require.Equal(t, 8, n)
		r.execute(t, qp, sq, false, nil)
		wcs := poll(t, cq)
		require.Len(t, wcs, 1, "round %d: one completion, the signaled send's", round)
		assert.Equal(t, uint64(round*8+7), wcs[0].WRID)
		send, _ := qp.Outstanding()
		require.Zero(t, send, "round %d", round)
	}
}

// Unsignaled sends with no signaled one after them never fill the queue
// for good: the post that finds it full asks the send CQ's next Poll,
// which hands back the slots of those the device has consumed; a slot the
// device has not consumed stays taken.
func TestUnsignaledSendsComeBackThroughTheDevicesProgress(t *testing.T) {
	r := newRDDevice(t, realV20)
	cq := r.cq(t, 64)
	qp := r.rcQP(t, cq, 8, false, qpAnswer{qpn: 0x10, handle: 1})
	sq := sqOf(t, qp)
	for round := range 10 {
		n, err := qp.PostSend(sends(9, 0, 0, r.mr.SGE(0, 8)), 0)
		require.Equal(t, 8, n, "round %d", round)
		require.ErrorIs(t, err, ErrQueueFull)
		assert.Empty(t, poll(t, cq), "nothing consumed yet, nothing to give back")
		_, err = qp.PostSend(sends(1, 0, 0, r.mr.SGE(0, 8)), 0)
		require.ErrorIs(t, err, ErrQueueFull, "round %d: still full", round)
		r.execute(t, qp, sq, false, nil)
		assert.Empty(t, poll(t, cq), "no completion: the sends were unsignaled")
		send, _ := qp.Outstanding()
		require.Zero(t, send, "round %d: every slot is back", round)
	}
}

// Closing a QP with sends outstanding completes each with WR_FLUSH_ERR
// exactly once, signaled or not; a late CQE of one is dropped.
func TestFlushReportsEveryOutstandingSendOnceSignaledOrNot(t *testing.T) {
	r := newRDDevice(t, realV20)
	cq := r.cq(t, 64)
	qp := r.rcQP(t, cq, 8, false, qpAnswer{qpn: 0x10, handle: 1})
	wrs := sends(4, 1, 0, r.mr.SGE(0, 8))
	wrs[2].Flags = SendSignaled
	_, err := qp.PostSend(wrs, 0)
	require.NoError(t, err)
	require.NoError(t, qp.Close())
	wcs := poll(t, cq)
	require.Len(t, wcs, 4)
	for i, wc := range wcs {
		assert.Equal(t, uint64(i+1), wc.WRID)
		assert.Equal(t, WCFlushErr, wc.Status)
		assert.Equal(t, uint32(0x10), wc.QPN)
	}
	assert.Empty(t, poll(t, cq), "each once")
}

// A device reports a failed send whether or not it was signaled: the
// completion reaches the application, and the unsignaled sends before it,
// which completed, are retired without one. The failure put the RC QP in
// ERR, so the send after it is not retired by the poll: it is the flush's.
func TestFailedUnsignaledSendIsReported(t *testing.T) {
	r := newRDDevice(t, realV20)
	cq := r.cq(t, 64)
	qp := r.rcQP(t, cq, 8, false, qpAnswer{qpn: 0x10, handle: 1})
	sq := sqOf(t, qp)
	_, err := qp.PostSend(sends(3, 1, 0, r.mr.SGE(0, 8)), 0)
	require.NoError(t, err)
	r.execute(t, qp, sq, false, map[uint64]uint32{2: rings.WCRemAccessErr})
	wcs := poll(t, cq)
	require.Len(t, wcs, 1)
	assert.Equal(t, uint64(2), wcs[0].WRID)
	assert.Equal(t, WCRemAccessErr, wcs[0].Status)
	send, _ := qp.Outstanding()
	assert.Equal(t, StateErr, qp.State())
	assert.Equal(t, 1, send, "the send after it, left to the flush of the QP in ERR")
}

// An unsignaled send is retired by the first poll of the send CQ after the
// device consumed it, though no signaled send follows and the queue is far
// from full: QP.Outstanding counts only what the device has not consumed,
// and Close flushes nothing. (Fault caught: slots handed back only when a
// post found the queue short of room, the last sends flushed at Close.)
func TestUnsignaledSendsAreRetiredByThePollAfterTheDeviceConsumedThem(t *testing.T) {
	r := newRDDevice(t, realV20)
	cq := r.cq(t, 64)
	qp := r.rcQP(t, cq, 64, false, qpAnswer{qpn: 0x10, handle: 1})
	sq := sqOf(t, qp)
	wrs := sends(3, 0, 0, r.mr.SGE(0, 8))
	wrs[0].Flags = SendSignaled
	_, err := qp.PostSend(wrs, 0)
	require.NoError(t, err)
	assert.Empty(t, poll(t, cq), "nothing consumed")
	send, _ := qp.Outstanding()
	assert.Equal(t, 3, send)
	ready, err := sq.Ready()
	require.NoError(t, err)
	sq.Consume(ready - 1) // wr 0 (signaled, its completion not yet written) and wr 1
	assert.Empty(t, poll(t, cq))
	send, _ = qp.Outstanding()
	assert.Equal(t, 2, send, "wr 1 retired; wr 0 waits for its completion, wr 2 for the device")
	r.put(t, cq, rings.CQE{WRID: 0, QP: 1})
	sq.Consume(1)
	wcs := poll(t, cq)
	require.Len(t, wcs, 1)
	assert.Equal(t, uint64(0), wcs[0].WRID)
	send, _ = qp.Outstanding()
	assert.Zero(t, send, "wr 2, the last, retired by the same poll")
	assert.Empty(t, poll(t, cq))
	assert.Empty(t, cq.reaps, "nothing left to reap: the CQ stops reaping the QP")
	assert.False(t, cq.reapPending.Load(), "and its polls look for no reap")
	require.NoError(t, qp.Close())
	assert.Empty(t, poll(t, cq), "nothing to flush")
	assert.Zero(t, cq.Stats().Flushed)
}

// The unsignaled sends a post call handed the device before a request it
// refused are retired like any other, at the first poll after the device
// consumed them. (Fault caught: only calls that posted every request asked
// the send CQ's polls to retire them.)
func TestUnsignaledSendsBeforeARefusedRequestAreRetiredOnTime(t *testing.T) {
	r := newRDDevice(t, realV20)
	cq := r.cq(t, 64)
	qp := r.rcQP(t, cq, 64, false, qpAnswer{qpn: 0x10, handle: 1})
	sq := sqOf(t, qp)
	wrs := sends(3, 0, 0, r.mr.SGE(0, 8))
	wrs[2].SGEs = []SGE{{Addr: r.mr.Addr(), Length: 8, LKey: r.mr.LKey() ^ 0x5a5a}}
	n, err := qp.PostSend(wrs, 0)
	var pe *PostError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, 2, n)
	require.Equal(t, 2, pe.Index)
	ready, err := sq.Ready()
	require.NoError(t, err)
	require.Equal(t, 2, ready)
	sq.Consume(ready)
	assert.Empty(t, poll(t, cq))
	send, _ := qp.Outstanding()
	assert.Zero(t, send, "both consumed: retired by the poll")
}

// A device's error completion of a send no longer outstanding is dropped,
// not reported, where it can only be a late one: on a queue whose every
// send is signaled (its request completed or was flushed), and on a
// selective queue once its flush has begun (the flush reported it). Only
// on a selective queue before any flush is it an unsignaled send retired
// once consumed, which is reported. (Fault caught: unmatched error
// completions returned on every queue, or after the flush too.)
func TestALateErrorCompletionOfASendIsDroppedNotReportedTwice(t *testing.T) {
	t.Run("every send signaled", func(t *testing.T) {
		r := newRDDevice(t, realV20)
		cq := r.cq(t, 64)
		qp := r.rcQP(t, cq, 8, true, qpAnswer{qpn: 0x10, handle: 1})
		sq := sqOf(t, qp)
		_, err := qp.PostSend(sends(1, 7, 0, r.mr.SGE(0, 8)), 0)
		require.NoError(t, err)
		r.execute(t, qp, sq, false, map[uint64]uint32{7: rings.WCRemAccessErr})
		require.Len(t, poll(t, cq), 1)
		r.put(t, cq, rings.CQE{WRID: 7, QP: 1, Status: rings.WCRemAccessErr})
		assert.Empty(t, poll(t, cq), "the same failure again")
		assert.Equal(t, uint64(1), cq.Stats().Dropped)
	})
	t.Run("selective, flushing", func(t *testing.T) {
		r := newRDDevice(t, realV20)
		cq := r.cq(t, 64)
		qp := r.rcQP(t, cq, 8, false, qpAnswer{qpn: 0x10, handle: 1})
		_, err := qp.PostSend(sends(2, 7, 0, r.mr.SGE(0, 8)), 0)
		require.NoError(t, err)
		require.NoError(t, qp.Close())
		wcs := make([]WC, 1)
		n, err := cq.Poll(wcs)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, WCFlushErr, wcs[0].Status)
		require.Equal(t, uint64(7), wcs[0].WRID)
		// A completion of 7 under the destroyed QP's alias (a device
		// would write none after the DESTROY; one rekeyed is polled
		// before the flushes): the flush reported 7 already.
		r.put(t, cq, rings.CQE{WRID: 7, QP: aliasTag<<32 | uint64(qp.alias), Status: rings.WCRemAccessErr})
		rest := poll(t, cq)
		require.Len(t, rest, 1, "8's flush only")
		assert.Equal(t, uint64(8), rest[0].WRID)
		assert.Equal(t, WCFlushErr, rest[0].Status)
		assert.Equal(t, uint64(1), cq.Stats().Dropped)
	})
}

// An unsignaled send a poll retired once the device consumed it that then
// fails (a device that advances its index when it fetches) still reports
// its failure: the error completion reaches the application, not the
// dropped count. (Fault caught: the completion dropped as one of nothing
// outstanding.)
func TestAConsumedUnsignaledSendThatFailsLaterIsReported(t *testing.T) {
	r := newRDDevice(t, realV20)
	cq := r.cq(t, 64)
	qp := r.rcQP(t, cq, 8, false, qpAnswer{qpn: 0x10, handle: 1})
	sq := sqOf(t, qp)
	_, err := qp.PostSend(sends(2, 1, 0, r.mr.SGE(0, 8)), 0)
	require.NoError(t, err)
	ready, err := sq.Ready()
	require.NoError(t, err)
	sq.Consume(ready)
	assert.Empty(t, poll(t, cq))
	send, _ := qp.Outstanding()
	require.Zero(t, send, "both consumed: retired")
	r.put(t, cq, rings.CQE{WRID: 2, QP: 1, Opcode: rings.WCRDMAWrite, Status: rings.WCRemAccessErr})
	wcs := poll(t, cq)
	require.Len(t, wcs, 1)
	assert.Equal(t, uint64(2), wcs[0].WRID)
	assert.Equal(t, WCRemAccessErr, wcs[0].Status)
	assert.Equal(t, uint32(0x10), wcs[0].QPN)
	assert.Zero(t, cq.Stats().Dropped)
}

// Close flushes only the sends the device did not consume: a signaled
// send it consumed and never completed is flushed, an unsignaled one it
// consumed is not (it made no completion and will make none), and every
// send it did not consume is, in posting order; with one send
// outstanding and with the queue's depth, each across Poll slices of one.
// (Fault caught: every send outstanding flushed, consumed unsignaled ones
// too.)
func TestCloseFlushesOnlyTheSendsTheDeviceDidNotConsume(t *testing.T) {
	const depth = 8
	for _, tc := range []struct {
		name     string
		signaled []bool // the sends posted, in order
		consume  int
		flushed  []uint64
	}{
		{"one unsignaled, not consumed", []bool{false}, 0, []uint64{0}},
		{"one unsignaled, consumed", []bool{false}, 1, nil},
		{"one signaled, consumed, no completion", []bool{true}, 1, []uint64{0}},
		{"a mix, some consumed", []bool{false, false, true, false, false, false}, 5, []uint64{2, 5}},
		{"the depth unsignaled, none consumed", make([]bool, depth), 0, []uint64{0, 1, 2, 3, 4, 5, 6, 7}},
		{"the depth unsignaled, all consumed", make([]bool, depth), depth, nil},
		{"the depth, a mix, all but one consumed", []bool{true, false, false, true, false, false, false, false}, depth - 1, []uint64{0, 3, 7}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRDDevice(t, realV20)
			cq := r.cq(t, 64)
			qp := r.rcQP(t, cq, depth, false, qpAnswer{qpn: 0x10, handle: 1})
			sq := sqOf(t, qp)
			wrs := sends(len(tc.signaled), 0, 0, r.mr.SGE(0, 8))
			for i, sig := range tc.signaled {
				if sig {
					wrs[i].Flags = SendSignaled
				}
			}
			n, err := qp.PostSend(wrs, 0)
			require.NoError(t, err)
			require.Equal(t, len(wrs), n)
			if n == depth {
				_, err := qp.PostSend(sends(1, 99, 0, r.mr.SGE(0, 8)), 0)
				require.ErrorIs(t, err, ErrQueueFull, "one past the depth")
			}
			_, err = sq.Ready()
			require.NoError(t, err)
			sq.Consume(tc.consume)
			require.NoError(t, qp.Close())
			var got []uint64
			wcs := make([]WC, 1)
			for range depth + 2 {
				k, err := cq.Poll(wcs)
				require.NoError(t, err)
				for _, wc := range wcs[:k] {
					assert.Equal(t, WCFlushErr, wc.Status)
					got = append(got, wc.WRID)
				}
			}
			assert.Equal(t, tc.flushed, got)
			assert.Equal(t, uint64(len(tc.flushed)), cq.Stats().Flushed)
		})
	}
}

// On a QP closed with device completions in its send CQ, an unsignaled
// send among them, the flushes of what is left come after the device's
// completions across short polls, and a failed unsignaled send's
// completion is reported before them. (Fault caught: flushes emitted
// ahead of the ring's completions.)
func TestFlushesOfASelectiveQueueFollowTheDevicesCompletionsAcrossShortPolls(t *testing.T) {
	r := newRDDevice(t, realV20)
	cq := r.cq(t, 64)
	qp := r.rcQP(t, cq, 16, false, qpAnswer{qpn: 0x10, handle: 1})
	sq := sqOf(t, qp)
	wrs := sends(10, 0, 0, r.mr.SGE(0, 8))
	for _, i := range []int{1, 3, 6, 8} {
		wrs[i].Flags = SendSignaled
	}
	_, err := qp.PostSend(wrs, 0)
	require.NoError(t, err)
	// The device consumes 0..7: completes 1 and 3, fails 4 (unsignaled);
	// 6 is in flight, 8 and 9 not consumed.
	_, err = sq.Ready()
	require.NoError(t, err)
	sq.Consume(8)
	r.put(t, cq, rings.CQE{WRID: 1, QP: 1})
	r.put(t, cq, rings.CQE{WRID: 3, QP: 1})
	r.put(t, cq, rings.CQE{WRID: 4, QP: 1, Status: rings.WCRemAccessErr})
	require.NoError(t, qp.Close())
	var got []WC
	buf := make([]WC, 2)
	for i := range 12 {
		k, err := cq.Poll(buf[:1+i%2])
		require.NoError(t, err)
		got = append(got, buf[:k]...)
	}
	type c struct {
		id uint64
		st WCStatus
	}
	var seen []c
	for _, wc := range got {
		seen = append(seen, c{wc.WRID, wc.Status})
	}
	assert.Equal(t, []c{{1, WCSuccess}, {3, WCSuccess}, {4, WCRemAccessErr}, {6, WCFlushErr}, {8, WCFlushErr}, {9, WCFlushErr}}, seen)
}

// On QEMU, which completes every send whatever its flags, the driver
// counts every send signaled (and marks it so): unsignaled posts complete
// once each, as before.
func TestQEMUCountsEverySendSignaled(t *testing.T) {
	r := newRDDevice(t, qemu17)
	cq := r.cq(t, 64)
	qp := r.rcQP(t, cq, 8, false, qpAnswer{qpn: 0x10, handle: 0x10})
	assert.False(t, r.cmds.createQP[0].SQSigAll, "sq_sig_all as asked (QEMU ignores it)")
	assert.False(t, qp.sq.Selective())
	sq := sqOf(t, qp)
	for range 5 {
		_, err := qp.PostSend(sends(8, 0, 0, r.mr.SGE(0, 8)), 0)
		require.NoError(t, err)
		for _, w := range r.execute(t, qp, sq, true, nil) {
			assert.NotZero(t, w.Flags&rings.SendSignaled)
		}
		assert.Len(t, poll(t, cq), 8)
	}
}

// Closing a QP whose poster asked for a reap takes the request back before
// its ring goes: the next Poll touches no freed memory (the host tests
// poison it; -race would report the read).
func TestQPCloseDropsItsReapRequest(t *testing.T) {
	r := newRDDevice(t, realV20)
	cq := r.cq(t, 64)
	qp := r.rcQP(t, cq, 8, false, qpAnswer{qpn: 0x10, handle: 1})
	_, err := qp.PostSend(sends(9, 0, 0, r.mr.SGE(0, 8)), 0)
	require.ErrorIs(t, err, ErrQueueFull)
	require.True(t, cq.reapPending.Load())
	require.NoError(t, qp.Close())
	assert.Empty(t, cq.reaps)
	assert.Len(t, poll(t, cq), 8, "the flushes")
}

// --- One-sided operations ---

// The one-sided opcodes go out as the device's WR opcodes (Linux's
// mapping), with the remote address and rkey in wr.rdma, the atomic
// operands in wr.atomic, and immediate data only where the opcode has it.
func TestOneSidedWQEsCarryTheirRemoteSide(t *testing.T) {
	r := newRDDevice(t, realV20)
	cq := r.cq(t, 64)
	qp := r.rcQP(t, cq, 16, true, qpAnswer{qpn: 0x10, handle: 1})
	sq := sqOf(t, qp)
	s8 := []SGE{r.mr.SGE(64, 8)}
	wrs := []SendWR{
		{WRID: 1, Opcode: OpRDMAWrite, SGEs: []SGE{r.mr.SGE(0, 64)}, RemoteAddr: 0x7000, RKey: 0xAB, Imm: 0xFF},
		{WRID: 2, Opcode: OpRDMAWriteWithImm, SGEs: []SGE{r.mr.SGE(0, 64)}, RemoteAddr: 0x7040, RKey: 0xAB, Imm: 0x1234},
		{WRID: 3, Opcode: OpRDMARead, SGEs: []SGE{r.mr.SGE(128, 32), r.mr.SGE(256, 32)}, RemoteAddr: 0x7080, RKey: 0xAC},
		{WRID: 4, Opcode: OpAtomicCmpSwap, SGEs: s8, RemoteAddr: 0x7100, RKey: 0xAD, CompareAdd: 5, Swap: 6},
		{WRID: 5, Opcode: OpAtomicFetchAdd, SGEs: s8, RemoteAddr: 0x7108, RKey: 0xAE, CompareAdd: 7},
		{WRID: 6, Opcode: OpSendWithImm, SGEs: s8, Imm: 0x99, RemoteAddr: 0x1, RKey: 0x1},
	}
	n, err := qp.PostSend(wrs, 0)
	require.NoError(t, err)
	require.Equal(t, len(wrs), n)
	got := r.execute(t, qp, sq, false, nil)
	require.Len(t, got, len(wrs))
	want := []struct {
		op        uint32
		addr      uint64
		rkey      uint32
		cmp, swap uint64
		imm       uint32
	}{
		{rings.WRRDMAWrite, 0x7000, 0xAB, 0, 0, 0},
		{rings.WRRDMAWriteWithImm, 0x7040, 0xAB, 0, 0, 0x1234},
		{rings.WRRDMARead, 0x7080, 0xAC, 0, 0, 0},
		{rings.WRAtomicCmpAndSwp, 0x7100, 0xAD, 5, 6, 0},
		{rings.WRAtomicFetchAndAdd, 0x7108, 0xAE, 7, 0, 0},
		{rings.WRSendWithImm, 0, 0, 0, 0, 0x99},
	}
	for i, w := range want {
		g := got[i]
		assert.Equal(t, w.op, g.Opcode, "wr %d opcode", i+1)
		assert.Equal(t, w.addr, g.RemoteAddr, "wr %d remote address", i+1)
		assert.Equal(t, w.rkey, g.RKey, "wr %d rkey", i+1)
		assert.Equal(t, w.cmp, g.CompareAdd, "wr %d compare/add", i+1)
		assert.Equal(t, w.swap, g.Swap, "wr %d swap", i+1)
		assert.Equal(t, w.imm, g.Imm, "wr %d immediate", i+1)
	}
	assert.Len(t, got[2].SGEs, 2, "the READ's two SGEs")
	wcs := poll(t, cq)
	require.Len(t, wcs, len(wrs))
	for i, op := range []WCOpcode{WCRDMAWrite, WCRDMAWrite, WCRDMARead, WCCompSwap, WCFetchAdd, WCSend} {
		assert.Equal(t, op, wcs[i].Opcode, "wc %d", i)
	}
}

// Each one-sided request is checked before it touches the ring: RC only,
// an atomic's one 8-byte SGE and 8-aligned address, local write on the MR
// a READ or an atomic fills, the device's atomic_ops and READ/atomic
// depth, max_sge_rd; send flags the driver does not post. A refused
// request makes no WQE and no completion; the one before it goes out.
func TestOneSidedValidationBeforeTheRing(t *testing.T) {
	r := newRDDevice(t, realV20)
	cq := r.cq(t, 64)
	rc := r.rcQP(t, cq, 16, true, qpAnswer{qpn: 0x10, handle: 1})
	ud := r.qp(t, QPConfig{Type: UD, SendCQ: cq, RecvCQ: cq, SignalAll: true}, qpAnswer{qpn: 0x11, handle: 2})
	ro := &MR{pd: r.pd, handle: 40, lkey: 0x66, access: AccessRemoteRead, addr: 0x900000, mem: make([]byte, 4096)}
	require.NoError(t, r.d.addMR(ro))
	s8 := []SGE{r.mr.SGE(0, 8)}
	noAtomics := realV20.caps
	noAtomics.AtomicOps = 0
	noReads := realV20.caps
	noReads.MaxQPInitRDAtom = 0
	for _, tc := range []struct {
		name string
		qp   *QP
		caps *Caps
		wr   SendWR
		want error
	}{
		{"RDMA WRITE on UD", ud, nil, SendWR{Opcode: OpRDMAWrite, SGEs: s8}, ErrInvalid},
		{"atomic on UD", ud, nil, SendWR{Opcode: OpAtomicFetchAdd, SGEs: s8}, ErrInvalid},
		{"atomic of 4 bytes", rc, nil, SendWR{Opcode: OpAtomicCmpSwap, SGEs: []SGE{r.mr.SGE(0, 4)}}, ErrInvalid},
		{"atomic of two SGEs", rc, nil, SendWR{Opcode: OpAtomicFetchAdd, SGEs: []SGE{r.mr.SGE(0, 4), r.mr.SGE(8, 4)}}, ErrInvalid},
		{"atomic without an SGE", rc, nil, SendWR{Opcode: OpAtomicFetchAdd}, ErrInvalid},
		{"atomic at a misaligned address", rc, nil, SendWR{Opcode: OpAtomicCmpSwap, SGEs: s8, RemoteAddr: 0x1004}, ErrInvalid},
		{"READ into an MR without local write", rc, nil, SendWR{Opcode: OpRDMARead, SGEs: []SGE{ro.SGE(0, 64)}}, ErrPrivileges},
		{"atomic into an MR without local write", rc, nil, SendWR{Opcode: OpAtomicCmpSwap, SGEs: []SGE{ro.SGE(0, 8)}}, ErrPrivileges},
		{"READ of more SGEs than max_sge_rd", rc, nil, SendWR{Opcode: OpRDMARead, SGEs: []SGE{s8[0], s8[0], s8[0]}}, ErrInvalid},
		{"atomic without atomic_ops", rc, &noAtomics, SendWR{Opcode: OpAtomicCmpSwap, SGEs: s8}, ErrNotSupported},
		{"READ without max_qp_init_rd_atom", rc, &noReads, SendWR{Opcode: OpRDMARead, SGEs: s8}, ErrNotSupported},
		{"inline flag", rc, nil, SendWR{Flags: rings.SendInline, SGEs: s8}, ErrNotSupported},
		{"unknown opcode", rc, nil, SendWR{Opcode: numOpcodes, SGEs: s8}, ErrNotSupported},
	} {
		t.Run(tc.name, func(t *testing.T) {
			qp := tc.qp
			if tc.caps != nil {
				saved, savedRD := r.d.caps, qp.rdAtomic
				r.d.caps = *tc.caps
				qp.setSignaling(true)
				defer func() { r.d.caps, qp.rdAtomic = saved, savedRD }()
			}
			before := qp.sq.Posted()
			good := SendWR{WRID: 1, SGEs: s8}
			if qp.typ == UD {
				ah := &AH{pd: r.pd}
				good.AH, tc.wr.AH = ah, ah
			}
			tc.wr.WRID = 2
			n, err := qp.PostSend([]SendWR{good, tc.wr}, 0)
			assert.Equal(t, 1, n)
			var pe *PostError
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, 1, pe.Index)
			assert.ErrorIs(t, err, tc.want)
			assert.Equal(t, before+1, qp.sq.Posted(), "WQEs written")
			require.Len(t, r.execute(t, qp, sqOf(t, qp), false, nil), 1)
			wcs := poll(t, cq)
			require.Len(t, wcs, 1)
			assert.Equal(t, uint64(1), wcs[0].WRID)
		})
	}
}

// On QEMU, which would send any WQE as a plain SEND, every one-sided,
// atomic and immediate opcode is refused with ErrNotSupported before
// anything is posted: no WQE, no doorbell.
func TestQEMURefusesEveryOpcodeButSendBeforePosting(t *testing.T) {
	r := newRDDevice(t, qemu17)
	cq := r.cq(t, 64)
	qp := r.rcQP(t, cq, 8, true, qpAnswer{qpn: 0x10, handle: 0x10})
	s8 := []SGE{r.mr.SGE(0, 8)}
	for _, op := range []Opcode{OpSendWithImm, OpRDMAWrite, OpRDMARead, OpRDMAWriteWithImm, OpAtomicCmpSwap, OpAtomicFetchAdd} {
		n, err := qp.PostSend([]SendWR{{WRID: 1, Opcode: op, SGEs: s8, RKey: 1, RemoteAddr: 8}}, 0)
		assert.Zero(t, n, "%v", op)
		assert.ErrorIs(t, err, ErrNotSupported, "%v", op)
		assert.Zero(t, qp.sq.Posted(), "%v: no WQE", op)
		assert.Zero(t, r.lastQPDoorbell(), "%v: no doorbell", op)
	}
}

// A completion reports the operation the device ran and, with
// WCFlagWithImm, its immediate data: RDMA READ, WRITE and the atomics on
// the send side; a receive an RDMA WRITE WITH IMM consumed.
func TestWCReportsTheDevicesOpcodeAndImmediate(t *testing.T) {
	r := newRDDevice(t, realV20)
	cq := r.cq(t, 64)
	qp := r.rcQP(t, cq, 8, true, qpAnswer{qpn: 0x77, handle: 2})
	_, err := qp.PostRecv([]RecvWR{{WRID: 50, SGEs: []SGE{r.mr.SGE(0, 64)}}, {WRID: 51, SGEs: []SGE{r.mr.SGE(64, 64)}}}, 0)
	require.NoError(t, err)
	r.put(t, cq, rings.CQE{WRID: 50, QP: 2, Opcode: rings.WCRecvRDMAWithImm, WCFlags: rings.WCFlagWithImm, Imm: 0xCAFEF00D, ByteLen: 0, SrcQP: 0x99})
	r.put(t, cq, rings.CQE{WRID: 51, QP: 2, Opcode: rings.WCRecv, WCFlags: rings.WCFlagWithImm, Imm: 7, ByteLen: 64, SrcQP: 0x99})
	wcs := poll(t, cq)
	require.Len(t, wcs, 2)
	assert.Equal(t, WCRecvRDMAWithImm, wcs[0].Opcode)
	assert.True(t, wcs[0].HasImm())
	assert.Equal(t, uint32(0xCAFEF00D), wcs[0].Imm)
	assert.Equal(t, uint32(0x99), wcs[0].SrcQP)
	assert.Equal(t, WCRecv, wcs[1].Opcode)
	assert.True(t, wcs[1].HasImm())
	assert.Equal(t, uint32(7), wcs[1].Imm)
	assert.Zero(t, qp.rq.Outstanding(), "both receives completed")
}

// MRs take the remote rights to CREATE_MR, verbs' rule holds (remote
// write or atomic need local write), flags the driver does not register
// are refused, and RKey is the device's.
func TestMRRemoteAccessRights(t *testing.T) {
	r := newRDDevice(t, realV20)
	ctx := context.Background()
	rights := AccessLocalWrite | AccessRemoteRead | AccessRemoteWrite | AccessRemoteAtomic
	mr, err := r.pd.AllocMR(ctx, 4096, rights)
	require.NoError(t, err)
	require.Len(t, r.cmds.createMR, 1)
	assert.Equal(t, uint32(rights), r.cmds.createMR[0].AccessFlags)
	assert.Equal(t, rights, mr.Access())
	assert.Equal(t, uint32(0xA0001), mr.RKey(), "the device's rkey")
	assert.NotEqual(t, mr.Handle(), mr.LKey(), "v20 keys are not handles")

	_, err = r.pd.AllocMR(ctx, 4096, AccessRemoteWrite)
	assert.ErrorIs(t, err, ErrInvalid, "remote write without local write")
	_, err = r.pd.AllocMR(ctx, 4096, AccessRemoteAtomic)
	assert.ErrorIs(t, err, ErrInvalid, "remote atomic without local write")
	_, err = r.pd.AllocMR(ctx, 4096, AccessLocalWrite|16) // memory-window bind
	assert.ErrorIs(t, err, ErrNotSupported)
	_, err = r.pd.AllocMR(ctx, 4096, AccessRemoteRead)
	assert.NoError(t, err, "remote read alone")
	assert.Len(t, r.cmds.createMR, 2, "the refused ones reached no command")
}

// On a real device the QP accepts remote atomics when the device runs
// them and asks for its READ/atomic depths (capped at 16); on QEMU the
// attributes stay what QEMU's backend takes.
func TestQPAttributesFollowTheDevicesAtomicCaps(t *testing.T) {
	for _, tc := range []struct {
		name       string
		cfg        rdConfig
		atomic     bool
		init, dest uint8
	}{
		{"v20", realV20, true, 8, 16},
		{"QEMU", qemu17, false, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRDDevice(t, tc.cfg)
			cq := r.cq(t, 16)
			r.answerQPs(qpAnswer{qpn: 0x10, handle: 0x10})
			qp, err := r.pd.CreateQP(context.Background(), &QPConfig{Type: RC, SendCQ: cq, RecvCQ: cq})
			require.NoError(t, err)
			require.NoError(t, qp.Connect(context.Background(), Remote{QPN: 0x20}, 1))
			require.NotEmpty(t, r.cmds.modifyQP)
			a := r.cmds.modifyQP[len(r.cmds.modifyQP)-1].Attr
			assert.Equal(t, tc.atomic, a.QPAccessFlags&firmware.AccessRemoteAtomic != 0)
			assert.Equal(t, tc.init, a.MaxRDAtomic)
			assert.Equal(t, tc.dest, a.MaxDestRDAtomic)
		})
	}
}

// Posting the one-sided opcodes and unsignaled sends, and polling with a
// reap, allocate nothing.
func TestOneSidedAndUnsignaledPathsAllocateNothing(t *testing.T) {
	r := newRDDevice(t, realV20)
	cq := r.cq(t, 256)
	qp := r.rcQP(t, cq, 64, false, qpAnswer{qpn: 0x10, handle: 1})
	sq := sqOf(t, qp)
	prod, err := rings.NewProducer(cq.st, cq.entries)
	require.NoError(t, err)
	s8 := []SGE{r.mr.SGE(0, 8)}
	s64 := []SGE{r.mr.SGE(64, 64)}
	wrs := []SendWR{
		{WRID: 1, Opcode: OpRDMAWrite, SGEs: s64, RemoteAddr: 0x7000, RKey: 1},
		{WRID: 2, Opcode: OpRDMAWriteWithImm, SGEs: s64, RemoteAddr: 0x7000, RKey: 1, Imm: 3},
		{WRID: 3, Opcode: OpRDMARead, SGEs: s64, RemoteAddr: 0x7000, RKey: 1},
		{WRID: 4, Opcode: OpAtomicCmpSwap, SGEs: s8, RemoteAddr: 0x7000, RKey: 1, CompareAdd: 1, Swap: 2},
		{WRID: 5, Opcode: OpAtomicFetchAdd, SGEs: s8, RemoteAddr: 0x7000, RKey: 1, CompareAdd: 1},
		{WRID: 6, SGEs: s64},
		{WRID: 7, Flags: SendSignaled, SGEs: s64},
		{WRID: 8, SGEs: s64},
	}
	wcs := make([]WC, 16)
	var e rings.CQE
	allocs := testing.AllocsPerRun(200, func() {
		n, err := qp.PostSend(wrs, 0)
		if err != nil || n != len(wrs) {
			t.Fatal(n, err)
		}
		// The device: everything consumed, one CQE (wr 7, signaled).
		ready, _ := sq.Ready()
		sq.Consume(ready)
		e = rings.CQE{WRID: 7, QP: 1}
		rings.PutCQE(cq.data[prod.Next(0)*CQESize:], &e)
		prod.Advance(1)
		prod.Publish()
		qp.askReap() // wr 8: unsignaled, after the signaled one
		if n, err := cq.Poll(wcs); err != nil || n != 1 {
			t.Fatal(n, err)
		}
		if s, _ := qp.Outstanding(); s != 0 {
			t.Fatal("outstanding", s)
		}
	})
	assert.Zero(t, allocs)
}

// signalingDevice is rdDevice's data path on a goroutine, for concurrency
// tests: it takes what qp's poster publishes and completes the signaled
// sends only, on the send CQ. It lets go of the QP when its DESTROY
// reaches it, as a device does, and never touches its ring after.
type signalingDevice struct {
	mu    sync.Mutex
	r     *rdDevice
	qp    *QP
	sq    *rings.Consumer
	prod  *rings.Producer
	alive bool
}

func (s *signalingDevice) forget(kind string, h uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if kind == kindQP && s.qp != nil && h == s.qp.handle {
		s.alive = false
	}
}

func (s *signalingDevice) step() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.alive {
		return
	}
	ready, err := s.sq.Ready()
	if err != nil || ready == 0 {
		return
	}
	free, err := s.prod.Free()
	if err != nil {
		return
	}
	k := 0
	for ; k < ready; k++ {
		slot := s.qp.sq.Slot(s.sq.Slot(k))
		if binary.LittleEndian.Uint32(slot[20:])&rings.SendSignaled == 0 {
			continue
		}
		if free == 0 {
			break
		}
		free--
		e := rings.CQE{WRID: binary.LittleEndian.Uint64(slot), QP: uint64(s.qp.handle)}
		rings.PutCQE(s.qp.sendCQ.data[s.prod.Next(0)*CQESize:], &e)
		s.prod.Advance(1)
	}
	s.sq.Consume(k)
	s.prod.Publish()
}

// A poster of signaled and unsignaled sends beside a poller and a device,
// then QP.Close: no race (-race; the freed ring is poisoned), every
// signaled send completes exactly once (by the device or flushed), an
// unsignaled send at most once (only flushed), nothing never posted
// completes, and the poster is never stuck on a full queue: the poller's
// reaps give the unsignaled slots back.
func TestUnsignaledSendsBesidePollerAndClose(t *testing.T) {
	rounds := 30
	if testing.Short() {
		rounds = 5
	}
	for round := range rounds {
		r := newRDDevice(t, realV20)
		cq := r.cq(t, 256)
		qp := r.rcQP(t, cq, 16, false, qpAnswer{qpn: 0x10, handle: 1})
		prod, err := rings.NewProducer(cq.st, cq.entries)
		require.NoError(t, err)
		dev := &signalingDevice{r: r, qp: qp, sq: sqOf(t, qp), prod: prod, alive: true}
		r.cmds.forget = dev.forget

		var mu sync.Mutex
		signaled := map[uint64]bool{} // every wr_id posted: signaled or not
		done := map[uint64]int{}
		var wg sync.WaitGroup
		stop := make(chan struct{})
		wg.Go(func() { // the device
			for {
				select {
				case <-stop:
					return
				default:
				}
				dev.step()
				time.Sleep(5 * time.Microsecond)
			}
		})
		pollerDone := make(chan struct{})
		wg.Go(func() { // the poller, until the flushes are in
			wcs := make([]WC, 16)
			for {
				n, err := cq.Poll(wcs)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for _, wc := range wcs[:n] {
					done[wc.WRID]++
				}
				mu.Unlock()
				select {
				case <-pollerDone:
					if n == 0 {
						return
					}
				default:
				}
				runtime.Gosched()
			}
		})
		posted := make(chan int, 1)
		wg.Go(func() { // the poster
			id, full := uint64(0), 0
			for {
				wrs := sends(4, id, 0, r.mr.SGE(0, 8))
				if id%3 == 0 {
					wrs[3].Flags = SendSignaled
				}
				n, err := qp.PostSend(wrs, FlagDefer*PostFlags(id%2))
				if err == nil {
					err = qp.Ring()
				}
				mu.Lock()
				for _, wr := range wrs[:n] {
					signaled[wr.WRID] = wr.Flags&SendSignaled != 0
				}
				mu.Unlock()
				id += uint64(n)
				switch {
				case err == nil:
					full = 0
				case errors.Is(err, ErrQueueFull):
					if full++; full > 200000 {
						t.Error("the queue stayed full")
						posted <- int(id)
						return
					}
					runtime.Gosched()
				case errors.Is(err, ErrClosed):
					posted <- int(id)
					return
				default:
					t.Error(err)
					posted <- int(id)
					return
				}
			}
		})
		time.Sleep(time.Duration(3+round%5) * time.Millisecond)
		require.NoError(t, qp.Close())
		n := <-posted
		close(pollerDone)
		close(stop)
		wg.Wait()
		// What the poller left: the flushes it had not reached.
		for _, wc := range poll(t, cq) {
			done[wc.WRID]++
		}
		require.Equal(t, n, len(signaled), "round %d", round)
		for id, sig := range signaled {
			if sig {
				require.Equal(t, 1, done[id], "round %d: signaled wr %d", round, id)
			} else {
				require.LessOrEqual(t, done[id], 1, "round %d: unsignaled wr %d", round, id)
			}
		}
		for id := range done {
			_, ok := signaled[id]
			require.True(t, ok, "round %d: wr %d completed, never posted", round, id)
		}
		require.NoError(t, r.d.Close())
	}
}
