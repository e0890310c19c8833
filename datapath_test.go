package vfrdma

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/mmio"
	"github.com/vfrdma/vfrdma/rings"
	"github.com/vfrdma/vfrdma/wq"
)

// fixture is a QP and a CQ over ordinary memory, with a fake device that
// takes the posted WQEs and completes them: the data path without a VM.
type fixture struct {
	d       *Device
	pd      *PD
	qp      *QP
	cq      *CQ
	mr      *MR
	uarMem  []byte
	cqState []byte
	sqCons  *rings.Consumer // the device's view of the send queue
	rqCons  *rings.Consumer
	cqProd  *rings.Producer
}

func newFixture(t testing.TB, typ QPType, depth int) *fixture {
	t.Helper()
	f := &fixture{uarMem: make([]byte, 4096)}
	uar, err := mmio.New(f.uarMem)
	require.NoError(t, err)
	d := &Device{name: "fake", opt: (&Options{StateDir: "-"}).withDefaults(), uar: uar, emulated: true, udMax: 4096,
		pds: map[*PD]struct{}{}, cqs: map[*CQ]struct{}{}, mrs: map[*MR]struct{}{}, qps: map[*QP]struct{}{}, srqs: map[*SRQ]struct{}{}, binds: map[uint32]GID{}}
	d.gidSet.set(0, true)
	d.notify.d = d
	f.d = d
	f.pd = &PD{d: d, handle: 1}
	f.mr = &MR{pd: f.pd, handle: 3, lkey: 0x77, access: AccessLocalWrite, addr: 0x100000, mem: make([]byte, 1<<16)}
	require.NoError(t, d.addMR(f.mr))

	f.cqState = make([]byte, 16)
	st, _ := rings.NewState(f.cqState[8:16])
	cons, err := rings.NewConsumer(st, 4*depth)
	require.NoError(t, err)
	f.cqProd, _ = rings.NewProducer(st, 4*depth)
	f.cq = newCQ(d, 5, 4*depth, nil, st, cons, make([]byte, 4*depth*CQESize))
	d.cqs[f.cq] = struct{}{}

	qpState := make([]byte, 16)
	qp := &QP{pd: f.pd, d: d, typ: typ, qpn: 0x42, handle: 0x42, sendCQ: f.cq, recvCQ: f.cq, udMax: d.udMax, qkey: 9}
	sq := make([]byte, depth*rings.SendStride(4))
	rq := make([]byte, depth*rings.RecvStride(4))
	require.NoError(t, qp.initQueue(&qp.sq, qpState[0:8], sq, rings.SendStride(4), depth, 4, doorbell.QPSend))
	require.NoError(t, qp.initQueue(&qp.rq, qpState[8:16], rq, rings.RecvStride(4), depth, 4, doorbell.QPRecv))
	qp.state.Store(uint32(StateRTS))
	require.NoError(t, d.addQP(context.Background(), qp))
	f.qp = qp
	s1, _ := rings.NewState(qpState[0:8])
	s2, _ := rings.NewState(qpState[8:16])
	f.sqCons, _ = rings.NewConsumer(s1, depth)
	f.rqCons, _ = rings.NewConsumer(s2, depth)
	return f
}

// doorbells reads the last value written to the QP doorbell.
func (f *fixture) lastDoorbell() uint32 {
	return binary.LittleEndian.Uint32(f.uarMem[doorbell.OffsetQP:])
}

// device consumes every published WQE of both queues and completes each
// with a CQE (status st), as the device would after a doorbell.
func (f *fixture) device(t testing.TB, st uint32) int {
	n := 0
	var e rings.CQE
	for _, q := range []struct {
		c    *rings.Consumer
		w    *wq.Queue
		recv bool
	}{{f.sqCons, &f.qp.sq, false}, {f.rqCons, &f.qp.rq, true}} {
		ready, err := q.c.Ready()
		if err != nil { // not require: its t.Helper costs more than the device
			t.Fatal(err)
		}
		for i := 0; i < ready; i++ {
			slot := q.w.Slot(q.c.Slot(i))
			e = rings.CQE{WRID: binary.LittleEndian.Uint64(slot), QP: uint64(f.qp.handle), Status: st}
			if q.recv {
				e.Opcode = rings.WCRecv
			}
			rings.PutCQE(f.cq.data[f.cqProd.Next(0)*CQESize:], &e)
			f.cqProd.Advance(1)
		}
		q.c.Consume(ready)
		n += ready
	}
	f.cqProd.Publish()
	return n
}

func (f *fixture) sge(off, n int) SGE { return f.mr.SGE(off, n) }

// Posting and polling allocate nothing.
func TestDataPathAllocs(t *testing.T) {
	f := newFixture(t, RC, 64)
	wrs := make([]SendWR, 32)
	sges := make([]SGE, 32)
	for i := range wrs {
		sges[i] = f.sge(i*64, 64)
		wrs[i] = SendWR{WRID: uint64(i), SGEs: sges[i : i+1]}
	}
	rwrs := []RecvWR{{WRID: 1000, SGEs: sges[:1]}}
	wcs := make([]WC, 64)
	allocs := testing.AllocsPerRun(200, func() {
		_, err := f.qp.PostSend(wrs, 0)
		require.NoError(t, err)
		_, err = f.qp.PostRecv(rwrs, FlagDefer)
		require.NoError(t, err)
		require.NoError(t, f.qp.Ring())
		f.device(t, 0)
		total := 0
		for total < 33 {
			n, err := f.cq.Poll(wcs)
			require.NoError(t, err)
			require.NotZero(t, n, "poll found nothing")
			total += n
		}
		n, _ := f.cq.Poll(wcs) // the empty poll, too
		require.Zero(t, n, "extra completions")
	})
	assert.Zero(t, allocs, "post+poll allocations per round")
}

// Every request is checked before it touches the ring; a refused one stops
// the call, makes no completion, and what came before it still goes out.
func TestPostValidation(t *testing.T) {
	f := newFixture(t, RC, 8)
	good := []SGE{f.sge(0, 16)}
	other := &MR{pd: &PD{d: f.d, handle: 2}, lkey: 0x99, addr: 0x900000, mem: make([]byte, 4096)}
	require.NoError(t, f.d.addMR(other))
	for _, tc := range []struct {
		name string
		wr   SendWR
		want error
	}{
		{"bad lkey", SendWR{SGEs: []SGE{{Addr: f.mr.Addr(), Length: 8, LKey: 0x1234}}}, ErrPrivileges},
		{"outside the MR", SendWR{SGEs: []SGE{f.sge(1<<16-8, 16)}}, ErrInvalid},
		{"before the MR", SendWR{SGEs: []SGE{{Addr: f.mr.Addr() - 1, Length: 8, LKey: f.mr.LKey()}}}, ErrInvalid},
		{"another PD's MR", SendWR{SGEs: []SGE{{Addr: other.addr, Length: 8, LKey: other.lkey}}}, ErrProtection},
		{"five SGEs", SendWR{SGEs: []SGE{good[0], good[0], good[0], good[0], good[0]}}, ErrInvalid},
		{"RDMA write on QEMU", SendWR{Opcode: OpRDMAWrite, SGEs: good}, ErrNotSupported},
		{"unknown opcode", SendWR{Opcode: 77, SGEs: good}, ErrNotSupported},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := f.qp.sq.Posted()
			wrs := []SendWR{{WRID: 1, SGEs: good}, tc.wr}
			wrs[1].WRID = 2
			n, err := f.qp.PostSend(wrs, FlagDefer)
			assert.Equal(t, 1, n, "requests posted")
			var pe *PostError
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, 1, pe.Index)
			assert.Equal(t, uint64(2), pe.WRID)
			assert.ErrorIs(t, err, tc.want)
			assert.Equal(t, before+1, f.qp.sq.Posted(), "WQEs written")
			// The deferred request went to the device with the failure.
			assert.Zero(t, f.qp.sq.Doorbell().Pending(), "pending after the failure")
			assert.Equal(t, uint32(doorbell.QPSend|0x42), f.lastDoorbell())
			require.Equal(t, 1, f.device(t, 0), "WQEs the device got")
			wcs := make([]WC, 4)
			n, _ = f.cq.Poll(wcs)
			require.Equal(t, 1, n)
			assert.Equal(t, uint64(1), wcs[0].WRID)
		})
	}
	// A receive needs local write on its MR; a send does not.
	ro := &MR{pd: f.pd, lkey: 0x55, addr: 0x700000, mem: make([]byte, 4096)}
	require.NoError(t, f.d.addMR(ro))
	_, err := f.qp.PostRecv([]RecvWR{{SGEs: []SGE{ro.SGE(0, 64)}}}, 0)
	assert.ErrorIs(t, err, ErrPrivileges, "receive into an MR without local write")
	_, err = f.qp.PostSend([]SendWR{{WRID: 7, SGEs: []SGE{ro.SGE(0, 64)}}}, 0)
	assert.NoError(t, err, "send from an MR without local write")
	f.device(t, 0)
	n, _ := f.cq.Poll(make([]WC, 4))
	require.Equal(t, 1, n)
	// State and room.
	f.qp.state.Store(uint32(StateInit))
	_, err = f.qp.PostSend([]SendWR{{SGEs: good}}, 0)
	assert.ErrorIs(t, err, ErrQPState, "send in INIT")
	f.qp.state.Store(uint32(StateRTS))
	wrs := make([]SendWR, 9)
	for i := range wrs {
		wrs[i] = SendWR{WRID: uint64(100 + i), SGEs: good}
	}
	n, err = f.qp.PostSend(wrs, 0)
	assert.Equal(t, 8, n, "nine sends into a queue of eight")
	assert.ErrorIs(t, err, ErrQueueFull)
	f.qp.state.Store(uint32(StateErr))
	_, err = f.qp.PostRecv([]RecvWR{{SGEs: good}}, 0)
	assert.ErrorIs(t, err, ErrQPState, "receive in ERR")
}

// Flushed requests complete once each, after the device's own completions;
// a late device completion of a flushed request is dropped.
func TestFlushExactlyOnce(t *testing.T) {
	f := newFixture(t, RC, 16)
	good := []SGE{f.sge(0, 16)}
	for i := 0; i < 6; i++ {
		_, err := f.qp.PostSend([]SendWR{{WRID: uint64(i), SGEs: good}}, 0)
		require.NoError(t, err)
	}
	// The device completes the first two; then the QP is destroyed.
	var e rings.CQE
	for i := 0; i < 2; i++ {
		e = rings.CQE{WRID: uint64(i), QP: uint64(f.qp.qpn)}
		rings.PutCQE(f.cq.data[f.cqProd.Next(0)*CQESize:], &e)
		f.cqProd.Advance(1)
	}
	f.cqProd.Publish()
	f.qp.state.Store(uint32(StateErr))
	f.qp.startFlush()
	wcs := make([]WC, 16)
	n, err := f.cq.Poll(wcs)
	require.NoError(t, err)
	require.Equal(t, 6, n, "completions after the flush")
	for i, wc := range wcs[:n] {
		wantSt := WCSuccess
		if i >= 2 {
			wantSt = WCFlushErr
		}
		assert.Equal(t, uint64(i), wc.WRID, "completion %d", i)
		assert.Equal(t, wantSt, wc.Status, "completion %d", i)
	}
	// A late completion of a flushed request: dropped, counted.
	e = rings.CQE{WRID: 4, QP: uint64(f.qp.qpn)}
	rings.PutCQE(f.cq.data[f.cqProd.Next(0)*CQESize:], &e)
	f.cqProd.Advance(1)
	f.cqProd.Publish()
	n, _ = f.cq.Poll(wcs)
	assert.Zero(t, n, "a late completion is not returned")
	assert.Equal(t, uint64(1), f.cq.Stats().Dropped, "late completions dropped")
	assert.Nil(t, f.d.qpns.Lookup(f.qp.qpn), "the drained QP is still in the QPN table")
}

// A device index out of range is a typed fault, and nothing is consumed.
func TestPollDeviceFault(t *testing.T) {
	f := newFixture(t, RC, 8)
	// Corrupt prod_tail: far beyond the ring.
	binary.LittleEndian.PutUint32(f.cqState[8:], 0xdead)
	_, err := f.cq.Poll(make([]WC, 4))
	assert.ErrorIs(t, err, ErrDeviceFault, "poll of a corrupt index")
}

// BenchmarkPostPoll times the driver's whole data path per message on
// in-memory rings: PostSend of a batch (one doorbell), the fake device
// taking the WQEs and writing CQEs (a few ns a message), and Poll.
func BenchmarkPostPoll(b *testing.B) {
	for _, batch := range []int{1, 32} {
		b.Run(map[int]string{1: "batch1", 32: "batch32"}[batch], func(b *testing.B) {
			f := newFixture(b, RC, 256)
			wrs := make([]SendWR, batch)
			sges := make([]SGE, batch)
			for i := range wrs {
				sges[i] = f.sge(i*64, 64)
				wrs[i] = SendWR{WRID: uint64(i), SGEs: sges[i : i+1]}
			}
			wcs := make([]WC, 64)
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if _, err := f.qp.PostSend(wrs, 0); err != nil {
					b.Fatal(err)
				}
				f.device(b, 0)
				for got := 0; got < batch; {
					n, _ := f.cq.Poll(wcs)
					got += n
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/msg")
			st, _ := f.qp.DoorbellStats()
			b.ReportMetric(float64(st.Doorbells)/float64(b.N*batch), "doorbells/msg")
		})
	}
}

func BenchmarkPollEmpty(b *testing.B) {
	f := newFixture(b, RC, 64)
	wcs := make([]WC, 16)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		f.cq.Poll(wcs)
	}
}

// With Options.PollDoorbell on QEMU a CQ is never armed (QEMU 7.2 deadlocks
// a POLL doorbell against its completion thread raising an armed CQ's
// interrupt): Arm is refused with ErrNotSupported, and Wait polls with the
// doorbell instead, returning when the CQ holds something or ctx ends.
func TestPollDoorbellCQsAreNeverArmed(t *testing.T) {
	f := newFixture(t, RC, 16)
	f.d.opt.PollDoorbell = true
	cqDoorbell := func() uint32 { return binary.LittleEndian.Uint32(f.uarMem[doorbell.OffsetCQ:]) }
	err := f.cq.Arm(false)
	assert.ErrorIs(t, err, ErrNotSupported)
	assert.Zero(t, cqDoorbell(), "no arm doorbell written")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, f.cq.Wait(ctx), context.DeadlineExceeded)
	assert.Equal(t, uint32(doorbell.CQPoll|f.cq.handle), cqDoorbell(), "Wait polled")

	wrs := []SendWR{{WRID: 1, SGEs: []SGE{f.sge(0, 64)}}}
	_, err = f.qp.PostSend(wrs, 0)
	require.NoError(t, err)
	require.Equal(t, 1, f.device(t, 0))
	require.NoError(t, f.cq.Wait(context.Background()), "a CQE is there")
}
