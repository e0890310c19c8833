package vfrdma

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/rings"
	"github.com/vfrdma/vfrdma/srq"
)

// srqFixture is an SRQ over ordinary memory on the data-path fixture's
// device, with its QP attached (the fixture's CQ receives), and the
// device's view of the SRQ ring.
type srqFixture struct {
	*fixture
	s    *SRQ
	data []byte
	cons *rings.Consumer
	sges []SGE // the device's decoding room
}

func newSRQFixture(t testing.TB, slots int, cfg SRQConfig) *srqFixture {
	t.Helper()
	f := &srqFixture{fixture: newFixture(t, RC, 64), sges: make([]SGE, 4)}
	state := make([]byte, 8)
	stride := rings.RecvStride(4)
	f.data = make([]byte, slots*stride)
	q, err := srq.New(srq.Config{Name: "SRQ 3", State: state, Data: f.data, Stride: stride, Slots: slots,
		Register: f.d.uar, Offset: doorbell.OffsetSRQ, Value: doorbell.SRQRecv | 3, Depth: cfg.Depth, MaxSGE: 4,
		PD: f.pd.handle, Keys: &f.d.lkeys, NeedMember: true, OnLowWatermark: cfg.OnLowWatermark})
	require.NoError(t, err)
	f.s = &SRQ{pd: f.pd, d: f.d, handle: 3, q: q}
	// The fixture's QP receives from the SRQ now.
	f.qp.srq = f.s
	f.qp.srqm, err = f.s.attach(f.qp)
	require.NoError(t, err)
	st, err := rings.NewState(state)
	require.NoError(t, err)
	f.cons, err = rings.NewConsumer(st, slots)
	require.NoError(t, err)
	return f
}

// deliver is the device: it takes n published SRQ receives, in ring
// order, and completes them on the QP's receive CQ.
func (f *srqFixture) deliver(t testing.TB, n int) {
	ready, err := f.cons.Ready()
	if err != nil || ready < n {
		t.Fatalf("the device sees %d receives, want %d: %v", ready, n, err)
	}
	for i := 0; i < n; i++ {
		id, _, err := rings.DecodeRecvWQE(f.data[f.cons.Slot(i)*rings.RecvStride(4):], f.sges)
		if err != nil {
			t.Fatal(err)
		}
		e := rings.CQE{WRID: id, QP: uint64(f.qp.qpn), Opcode: rings.WCRecv}
		rings.PutCQE(f.cq.data[f.cqProd.Next(0)*CQESize:], &e)
		f.cqProd.Advance(1)
	}
	f.cons.Consume(n)
	f.cqProd.Publish()
}

// CQ.Poll accounts SRQ receives to the SRQ and its QP, and raises the low
// watermark when it reaps the completion that crosses it.
func TestPollAccountsSRQReceivesAndRaisesTheWatermark(t *testing.T) {
	var events []SRQEvent
	f := newSRQFixture(t, 16, SRQConfig{Depth: 8, OnLowWatermark: func(ev SRQEvent) { events = append(events, ev) }})
	wrs := make([]RecvWR, 8)
	for i := range wrs {
		wrs[i] = RecvWR{WRID: uint64(100 + i), SGEs: []SGE{f.sge(i*1024, 1024)}}
	}
	n, err := f.s.PostRecv(wrs, 0)
	require.NoError(t, err)
	require.Equal(t, 8, n)
	require.NoError(t, f.s.SetLowWatermark(6))
	f.deliver(t, 3)
	wcs := make([]WC, 8)
	n, err = f.cq.Poll(wcs)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	assert.Equal(t, uint64(100), wcs[0].WRID)
	assert.Equal(t, []SRQEvent{{Available: 5, Watermark: 6}}, events, "one event, at the crossing completion")
	assert.Equal(t, 5, f.s.Outstanding())
	assert.Equal(t, RecvQuery{Allocated: Unknown, Span: Unknown}, f.qp.RecvQuery())
	snap := f.s.Query()
	require.Len(t, snap.QPs, 1)
	assert.Equal(t, uint64(3), snap.QPs[0].Consumed)
}

// Closing the SRQ flushes what is left on its CQ, once each, naming no
// QP.
func TestSRQFlushOnCloseExactlyOnce(t *testing.T) {
	f := newSRQFixture(t, 16, SRQConfig{Depth: 8})
	for i := 0; i < 5; i++ {
		_, err := f.s.PostRecv([]RecvWR{{WRID: uint64(i), SGEs: []SGE{f.sge(0, 64)}}}, 0)
		require.NoError(t, err)
	}
	f.deliver(t, 2)
	// The QP goes; then the SRQ (destroy's device command aside), before
	// the two completions were polled: they come first, then the flushes.
	f.qp.srqm.Detach()
	require.Equal(t, 5, f.s.q.Close(), "outstanding at close")
	f.cq.addFlush(flushSource{srq: f.s, op: WCRecv})
	wcs := make([]WC, 16)
	n, err := f.cq.Poll(wcs)
	require.NoError(t, err)
	require.Equal(t, 5, n)
	got := map[uint64]WCStatus{}
	for _, wc := range wcs[:n] {
		_, dup := got[wc.WRID]
		require.False(t, dup, "wr_id %d twice", wc.WRID)
		got[wc.WRID] = wc.Status
		if wc.Status == WCFlushErr {
			assert.Zero(t, wc.QPN)
		}
	}
	assert.Equal(t, map[uint64]WCStatus{0: WCSuccess, 1: WCSuccess, 2: WCFlushErr, 3: WCFlushErr, 4: WCFlushErr}, got)
	n, _ = f.cq.Poll(wcs)
	assert.Zero(t, n)
}

// SRQ posting and the poll of its completions allocate nothing.
func TestSRQDataPathAllocs(t *testing.T) {
	f := newSRQFixture(t, 64, SRQConfig{Depth: 64})
	wrs := make([]RecvWR, 32)
	for i := range wrs {
		wrs[i] = RecvWR{WRID: uint64(i), SGEs: []SGE{f.sge(i*1024, 1024)}}
	}
	wcs := make([]WC, 32)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := f.s.PostRecv(wrs, 0); err != nil {
			t.Fatal(err)
		}
		f.deliver(t, 32)
		if n, err := f.cq.Poll(wcs); n != 32 || err != nil {
			t.Fatalf("poll: %d, %v", n, err)
		}
	})
	assert.Zero(t, allocs)
}

// BenchmarkPostRecv times a receive chain on an SRQ beside the same on a
// QP's own receive queue; the device takes and completes them outside the
// timer when the queue is full.
func BenchmarkPostRecv(b *testing.B) {
	for _, kind := range []string{"QP", "SRQ"} {
		for _, batch := range []int{1, 32} {
			b.Run(kind+"/batch"+strconv.Itoa(batch), func(b *testing.B) {
				const depth = 64
				f := newSRQFixture(b, depth, SRQConfig{Depth: depth})
				post, room := f.s.PostRecv, f.s.Outstanding
				drain := func() {
					f.deliver(b, f.s.Outstanding())
				}
				if kind == "QP" {
					f.qp.srq, f.qp.srqm = nil, nil
					post = f.qp.PostRecv
					room = func() int { _, r := f.qp.Outstanding(); return r }
					drain = func() { f.device(b, 0) }
				}
				wrs := make([]RecvWR, batch)
				for i := range wrs {
					wrs[i] = RecvWR{WRID: uint64(i), SGEs: []SGE{f.sge(i*1024, 1024)}}
				}
				wcs := make([]WC, 64)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if room()+batch > depth {
						b.StopTimer()
						drain()
						for n, _ := f.cq.Poll(wcs); n > 0; n, _ = f.cq.Poll(wcs) {
						}
						b.StartTimer()
					}
					if _, err := post(wrs, 0); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/WQE")
			})
		}
	}
}
