package vfrdma

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/mmio"
	"github.com/vfrdma/vfrdma/rings"
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
	if err != nil {
		t.Fatal(err)
	}
	d := &Device{name: "fake", opt: (&Options{StateDir: "-"}).withDefaults(), uar: uar, emulated: true, udMax: 4096,
		pds: map[*PD]struct{}{}, cqs: map[*CQ]struct{}{}, mrs: map[*MR]struct{}{}, qps: map[*QP]struct{}{}, srqs: map[*SRQ]struct{}{}, binds: map[uint32]GID{}}
	d.gidSet.set(0, true)
	f.d = d
	f.pd = &PD{d: d, handle: 1}
	f.mr = &MR{pd: f.pd, handle: 3, lkey: 0x77, addr: 0x100000, mem: make([]byte, 1<<16)}
	if err := d.addMR(f.mr); err != nil {
		t.Fatal(err)
	}

	f.cqState = make([]byte, 16)
	st, _ := rings.NewState(f.cqState[8:16])
	cons, err := rings.NewConsumer(st, 4*depth)
	if err != nil {
		t.Fatal(err)
	}
	f.cqProd, _ = rings.NewProducer(st, 4*depth)
	f.cq = &CQ{d: d, handle: 5, entries: 4 * depth, cons: cons, data: make([]byte, 4*depth*CQESize), wake: make(chan struct{}, 1)}

	qpState := make([]byte, 16)
	qp := &QP{pd: f.pd, d: d, typ: typ, qpn: 0x42, handle: 0x42, sendCQ: f.cq, recvCQ: f.cq, udMax: d.udMax, qkey: 9}
	sq := make([]byte, depth*rings.SendStride(4))
	rq := make([]byte, depth*rings.RecvStride(4))
	if err := qp.sq.init(qp, false, qpState[0:8], sq, rings.SendStride(4), depth, 4, doorbell.QPSend); err != nil {
		t.Fatal(err)
	}
	if err := qp.rq.init(qp, true, qpState[8:16], rq, rings.RecvStride(4), depth, 4, doorbell.QPRecv); err != nil {
		t.Fatal(err)
	}
	qp.state.Store(uint32(StateRTS))
	if err := d.addQP(qp); err != nil {
		t.Fatal(err)
	}
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
		c      *rings.Consumer
		data   []byte
		stride int
		recv   bool
	}{{f.sqCons, f.qp.sq.data, f.qp.sq.stride, false}, {f.rqCons, f.qp.rq.data, f.qp.rq.stride, true}} {
		ready, err := q.c.Ready()
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < ready; i++ {
			slot := q.data[q.c.Slot(i)*q.stride:]
			e = rings.CQE{WRID: binary.LittleEndian.Uint64(slot), QP: uint64(f.qp.qpn), Status: st}
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
		if _, err := f.qp.PostSend(wrs, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := f.qp.PostRecv(rwrs, FlagDefer); err != nil {
			t.Fatal(err)
		}
		if err := f.qp.Flush(); err != nil {
			t.Fatal(err)
		}
		f.device(t, 0)
		total := 0
		for total < 33 {
			n, err := f.cq.Poll(wcs)
			if err != nil || n == 0 {
				t.Fatalf("poll: %d, %v", n, err)
			}
			total += n
		}
		if n, _ := f.cq.Poll(wcs); n != 0 { // the empty poll, too
			t.Fatal("extra completions")
		}
	})
	if allocs != 0 {
		t.Fatalf("post+poll allocates %v times per round", allocs)
	}
}

// Every request is checked before it touches the ring; a refused one stops
// the call, makes no completion, and what came before it still goes out.
func TestPostValidation(t *testing.T) {
	f := newFixture(t, RC, 8)
	good := []SGE{f.sge(0, 16)}
	other := &MR{pd: &PD{d: f.d, handle: 2}, lkey: 0x99, addr: 0x900000, mem: make([]byte, 4096)}
	f.d.addMR(other)
	for _, tc := range []struct {
		name string
		wr   SendWR
		want error
	}{
		{"bad lkey", SendWR{SGEs: []SGE{{Addr: f.mr.Addr(), Length: 8, LKey: 0x1234}}}, ErrInvalid},
		{"outside the MR", SendWR{SGEs: []SGE{f.sge(1<<16-8, 16)}}, ErrInvalid},
		{"before the MR", SendWR{SGEs: []SGE{{Addr: f.mr.Addr() - 1, Length: 8, LKey: f.mr.LKey()}}}, ErrInvalid},
		{"another PD's MR", SendWR{SGEs: []SGE{{Addr: other.addr, Length: 8, LKey: other.lkey}}}, ErrInvalid},
		{"five SGEs", SendWR{SGEs: []SGE{good[0], good[0], good[0], good[0], good[0]}}, ErrInvalid},
		{"RDMA write on QEMU", SendWR{Opcode: OpRDMAWrite, SGEs: good}, ErrNotSupported},
		{"unknown opcode", SendWR{Opcode: 77, SGEs: good}, ErrNotSupported},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := f.qp.sq.tail
			wrs := []SendWR{{WRID: 1, SGEs: good}, tc.wr}
			wrs[1].WRID = 2
			n, err := f.qp.PostSend(wrs, FlagDefer)
			var pe *PostError
			if n != 1 || !errors.As(err, &pe) || pe.Index != 1 || pe.WRID != 2 || !errors.Is(err, tc.want) {
				t.Fatalf("PostSend = %d, %v; want 1 posted and a PostError for request 1 wrapping %v", n, err, tc.want)
			}
			if f.qp.sq.tail != before+1 {
				t.Fatalf("%d WQEs written, want 1", f.qp.sq.tail-before)
			}
			// The deferred request went to the device with the failure.
			if f.qp.sq.db.Pending() != 0 || f.lastDoorbell() != doorbell.QPSend|0x42 {
				t.Fatalf("after the failure: %d pending, doorbell %#x", f.qp.sq.db.Pending(), f.lastDoorbell())
			}
			if got := f.device(t, 0); got != 1 {
				t.Fatalf("the device got %d WQEs, want 1", got)
			}
			wcs := make([]WC, 4)
			if n, _ := f.cq.Poll(wcs); n != 1 || wcs[0].WRID != 1 {
				t.Fatalf("completions %+v", wcs[:n])
			}
		})
	}
	// State and room.
	f.qp.state.Store(uint32(StateInit))
	if _, err := f.qp.PostSend([]SendWR{{SGEs: good}}, 0); !errors.Is(err, ErrQPState) {
		t.Fatalf("send in INIT: %v", err)
	}
	f.qp.state.Store(uint32(StateRTS))
	wrs := make([]SendWR, 9)
	for i := range wrs {
		wrs[i] = SendWR{WRID: uint64(100 + i), SGEs: good}
	}
	if n, err := f.qp.PostSend(wrs, 0); n != 8 || !errors.Is(err, ErrQueueFull) {
		t.Fatalf("nine sends into a queue of eight: %d, %v", n, err)
	}
	f.qp.state.Store(uint32(StateErr))
	if _, err := f.qp.PostRecv([]RecvWR{{SGEs: good}}, 0); !errors.Is(err, ErrQPState) {
		t.Fatalf("receive in ERR: %v", err)
	}
}

// Flushed requests complete once each, after the device's own completions;
// a late device completion of a flushed request is dropped.
func TestFlushExactlyOnce(t *testing.T) {
	f := newFixture(t, RC, 16)
	good := []SGE{f.sge(0, 16)}
	for i := 0; i < 6; i++ {
		if _, err := f.qp.PostSend([]SendWR{{WRID: uint64(i), SGEs: good}}, 0); err != nil {
			t.Fatal(err)
		}
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
	if err != nil || n != 6 {
		t.Fatalf("poll after the flush: %d, %v", n, err)
	}
	for i, wc := range wcs[:n] {
		wantSt := WCSuccess
		if i >= 2 {
			wantSt = WCFlushErr
		}
		if wc.WRID != uint64(i) || wc.Status != wantSt {
			t.Fatalf("completion %d: %+v, want wr_id %d %v", i, wc, i, wantSt)
		}
	}
	// A late completion of a flushed request: dropped, counted.
	e = rings.CQE{WRID: 4, QP: uint64(f.qp.qpn)}
	rings.PutCQE(f.cq.data[f.cqProd.Next(0)*CQESize:], &e)
	f.cqProd.Advance(1)
	f.cqProd.Publish()
	if n, _ := f.cq.Poll(wcs); n != 0 || f.cq.Stats().Dropped != 1 {
		t.Fatalf("late completion: %d returned, stats %+v", n, f.cq.Stats())
	}
	if f.d.qpns.lookup(f.qp.qpn) != nil {
		t.Fatal("the drained QP is still in the QPN table")
	}
}

// A device index out of range is a typed fault, and nothing is consumed.
func TestPollDeviceFault(t *testing.T) {
	f := newFixture(t, RC, 8)
	// Corrupt prod_tail: far beyond the ring.
	binary.LittleEndian.PutUint32(f.cqState[8:], 0xdead)
	if _, err := f.cq.Poll(make([]WC, 4)); !errors.Is(err, ErrDeviceFault) {
		t.Fatalf("poll of a corrupt index: %v, want ErrDeviceFault", err)
	}
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
