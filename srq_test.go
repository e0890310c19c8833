package vfrdma

import (
	"context"
	"encoding/binary"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/rings"
	"github.com/vfrdma/vfrdma/srq"
)

// srqFixture is an SRQ over ordinary memory on the data-path fixture's
// device, with the fixture's QP attached (the fixture's CQ receives), and
// the device's view of the SRQ ring.
type srqFixture struct {
	*fixture
	s    *SRQ
	data []byte
	cons *rings.Consumer
	sges []SGE // the device's decoding room
}

// newSRQFixture builds the SRQ by hand, as CreateSRQ would without the
// device command: its Queue over an in-memory ring whose doorbell is the
// fixture's UAR page, on QEMU's rules (a QP must be attached to post).
func newSRQFixture(t testing.TB, slots int, cfg SRQConfig) *srqFixture {
	t.Helper()
	f := &srqFixture{fixture: newFixture(t, RC, max(64, slots)), sges: make([]SGE, 4)}
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

// addQP attaches another RC QP, on the same CQ, to the SRQ; its own
// receive queue is the empty one, as with an SRQ.
func (f *srqFixture) addQP(t testing.TB, qpn uint32) *QP {
	t.Helper()
	qp := &QP{pd: f.pd, d: f.d, typ: RC, qpn: qpn, handle: qpn, sendCQ: f.cq, recvCQ: f.cq, udMax: f.d.udMax, srq: f.s}
	qp.rq.SetName("QP " + strconv.Itoa(int(qpn)))
	qp.state.Store(uint32(StateRTS))
	require.NoError(t, f.d.addQP(context.Background(), qp))
	var err error
	qp.srqm, err = f.s.attach(qp)
	require.NoError(t, err)
	return qp
}

// take is the device taking n published SRQ receives, in ring order: it
// returns their wr_ids.
func (f *srqFixture) take(t testing.TB, n int) []uint64 {
	ready, err := f.cons.Ready()
	if err != nil || ready < n {
		t.Fatalf("the device sees %d receives, want %d: %v", ready, n, err)
	}
	ids := make([]uint64, n)
	for i := range ids {
		ids[i], _, err = rings.DecodeRecvWQE(f.data[f.cons.Slot(i)*rings.RecvStride(4):], f.sges)
		if err != nil {
			t.Fatal(err)
		}
	}
	f.cons.Consume(n)
	return ids
}

// complete writes a receive CQE of wr_id id for the QP qpn.
func (f *srqFixture) complete(qpn uint32, id uint64) {
	e := rings.CQE{WRID: id, QP: uint64(qpn), Opcode: rings.WCRecv}
	rings.PutCQE(f.cq.data[f.cqProd.Next(0)*CQESize:], &e)
	f.cqProd.Advance(1)
}

// deliver is the device: it takes n published SRQ receives, in ring
// order, and completes them on the fixture QP's receive CQ. It does not
// allocate.
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
		f.complete(f.qp.qpn, id)
	}
	f.cons.Consume(n)
	f.cqProd.Publish()
}

func (f *srqFixture) srqDoorbell() uint32 {
	return binary.LittleEndian.Uint32(f.uarMem[doorbell.OffsetSRQ:])
}

// SRQ.PostRecv refuses inline with the root's sentinels, in a *PostError;
// the deferred receives before the refusal still reach the device, with
// one SRQ doorbell, and the refused one writes nothing.
func TestSRQPostRecvRefusalsLoseNothing(t *testing.T) {
	f := newSRQFixture(t, 16, SRQConfig{Depth: 8})
	other := &MR{pd: &PD{d: f.d, handle: 2}, lkey: 0x99, addr: 0x900000, mem: make([]byte, 4096), access: AccessLocalWrite}
	require.NoError(t, f.d.addMR(other))
	ro := &MR{pd: f.pd, lkey: 0x55, addr: 0x700000, mem: make([]byte, 4096)}
	require.NoError(t, f.d.addMR(ro))
	good := []SGE{f.sge(0, 64)}
	for _, tc := range []struct {
		name string
		sges []SGE
		want error
	}{
		{"an unknown lkey", []SGE{{Addr: f.mr.Addr(), Length: 8, LKey: 0x1234}}, ErrPrivileges},
		{"an MR without local write", []SGE{ro.SGE(0, 64)}, ErrPrivileges},
		{"another PD's MR", []SGE{other.SGE(0, 8)}, ErrProtection},
		{"outside the MR", []SGE{f.sge(1<<16-8, 16)}, ErrInvalid},
		{"five SGEs", []SGE{good[0], good[0], good[0], good[0], good[0]}, ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			binary.LittleEndian.PutUint32(f.uarMem[doorbell.OffsetSRQ:], 0)
			before := f.s.DoorbellStats()
			_, err := f.s.PostRecv([]RecvWR{{WRID: 1, SGEs: good}}, FlagDefer)
			require.NoError(t, err)
			assert.Zero(t, f.srqDoorbell(), "deferred")
			n, err := f.s.PostRecv([]RecvWR{{WRID: 2, SGEs: good}, {WRID: 3, SGEs: tc.sges}}, 0)
			assert.Equal(t, 1, n)
			var pe *PostError
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, PostError{Queue: "SRQ 3", Index: 1, WRID: 3, Err: pe.Err}, *pe)
			assert.ErrorIs(t, err, tc.want)
			after := f.s.DoorbellStats()
			assert.Equal(t, before.Doorbells+1, after.Doorbells)
			assert.Equal(t, before.WQEs+2, after.WQEs)
			assert.Equal(t, uint32(doorbell.SRQRecv|3), f.srqDoorbell())
			assert.Zero(t, f.lastDoorbell(), "no QP doorbell")
			assert.Equal(t, []uint64{1, 2}, f.take(t, 2))
			ready, _ := f.cons.Ready()
			assert.Zero(t, ready, "the refused receive was not published")
			for _, id := range []uint64{2, 1} {
				f.complete(f.qp.qpn, id)
			}
			f.cqProd.Publish()
			wcs := make([]WC, 4)
			n, err = f.cq.Poll(wcs)
			require.NoError(t, err)
			assert.Equal(t, 2, n, "no completion for the refused receive")
		})
	}
	// Full at the depth.
	wrs := make([]RecvWR, 9)
	for i := range wrs {
		wrs[i] = RecvWR{WRID: uint64(100 + i), SGEs: good}
	}
	n, err := f.s.PostRecv(wrs, 0)
	assert.Equal(t, 8, n)
	assert.ErrorIs(t, err, ErrQueueFull)
	assert.Equal(t, 8, f.s.Outstanding())
}

// A QP of an SRQ has no receive queue of its own: its PostRecv is refused
// and rings nothing.
func TestQPOfAnSRQRefusesItsOwnPostRecv(t *testing.T) {
	f := newSRQFixture(t, 16, SRQConfig{Depth: 8})
	n, err := f.qp.PostRecv([]RecvWR{{WRID: 1, SGEs: []SGE{f.sge(0, 64)}}}, 0)
	assert.Zero(t, n)
	assert.ErrorIs(t, err, ErrInvalid)
	assert.Zero(t, f.lastDoorbell())
	assert.Zero(t, f.srqDoorbell())
	assert.False(t, f.qp.CanQueryRecv())
}

// CQ.Poll credits each SRQ receive to the QP that took it, in whatever
// order the QPs' completions come, and drops a completion of nothing
// outstanding.
func TestPollCreditsEachSRQReceiveToItsQP(t *testing.T) {
	f := newSRQFixture(t, 16, SRQConfig{Depth: 16})
	qp2 := f.addQP(t, 0x43)
	wrs := make([]RecvWR, 6)
	for i := range wrs {
		wrs[i] = RecvWR{WRID: uint64(10 + i), SGEs: []SGE{f.sge(i*1024, 1024)}}
	}
	_, err := f.s.PostRecv(wrs, 0)
	require.NoError(t, err)
	ids := f.take(t, 6)
	// QP 0x43 took 10, 12, 15; QP 0x42 the rest; completions interleaved
	// out of ring order, and one for a receive never posted.
	for _, c := range []struct {
		qpn uint32
		id  uint64
	}{{0x43, 15}, {0x42, 11}, {0x43, 10}, {0x42, 99}, {0x42, 14}, {0x43, 12}} {
		f.complete(c.qpn, c.id)
	}
	f.cqProd.Publish()
	wcs := make([]WC, 8)
	n, err := f.cq.Poll(wcs)
	require.NoError(t, err)
	require.Equal(t, 5, n)
	got := map[uint64]uint32{}
	for _, wc := range wcs[:n] {
		got[wc.WRID] = wc.QPN
	}
	assert.Equal(t, map[uint64]uint32{15: 0x43, 11: 0x42, 10: 0x43, 14: 0x42, 12: 0x43}, got)
	assert.Equal(t, uint64(1), f.cq.Stats().Dropped, "the completion of nothing posted")
	s := f.s.Query()
	assert.Equal(t, 1, s.Available)
	assert.Equal(t, uint64(5), s.Consumed)
	require.Len(t, s.QPs, 2)
	assert.Equal(t, SRQQPView{QPN: 0x42, Consumed: 2, Allocated: UnknownCount, Span: UnknownCount}, s.QPs[0])
	assert.Equal(t, SRQQPView{QPN: 0x43, Consumed: 3, Allocated: UnknownCount, Span: UnknownCount}, s.QPs[1])
	assert.Equal(t, RecvQuery{Allocated: UnknownCount, Span: UnknownCount}, qp2.RecvQuery())
	assert.Equal(t, []uint64{10, 11, 12, 13, 14, 15}, ids)
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
	assert.Equal(t, WCRecv, wcs[0].Opcode)
	assert.Equal(t, []SRQEvent{{Available: 5, Watermark: 6}}, events, "one event, at the crossing completion")
	assert.Equal(t, SRQEvent{Available: 5, Watermark: 6}, <-f.s.LowWatermarkEvents())
	assert.Equal(t, 5, f.s.Outstanding())
	assert.Equal(t, RecvQuery{Allocated: UnknownCount, Span: UnknownCount}, f.qp.RecvQuery())
	snap := f.s.Query()
	require.Len(t, snap.QPs, 1)
	assert.Equal(t, uint64(3), snap.QPs[0].Consumed)
	f.deliver(t, 2)
	n, _ = f.cq.Poll(wcs)
	require.Equal(t, 2, n)
	assert.Len(t, events, 1, "once per arming")
}

// Resize and SetLowWatermark through the root wrap the srq package's
// sentinels.
func TestSRQResizeAndWatermarkErrors(t *testing.T) {
	f := newSRQFixture(t, 16, SRQConfig{Depth: 4})
	assert.Equal(t, 16, f.s.MaxDepth())
	for i := 0; i < 4; i++ {
		_, err := f.s.PostRecv([]RecvWR{{WRID: uint64(i)}}, 0)
		require.NoError(t, err)
	}
	assert.ErrorIs(t, f.s.Resize(3), ErrBusy)
	assert.ErrorIs(t, f.s.Resize(17), ErrInvalid)
	require.NoError(t, f.s.Resize(16))
	assert.Equal(t, 16, f.s.Depth())
	assert.ErrorIs(t, f.s.SetLowWatermark(17), ErrInvalid)
	require.NoError(t, f.s.Resize(4))
	assert.ErrorIs(t, f.s.SetLowWatermark(5), ErrInvalid, "above the depth")
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
	for i, wc := range wcs[:n] {
		_, dup := got[wc.WRID]
		require.False(t, dup, "wr_id %d twice", wc.WRID)
		got[wc.WRID] = wc.Status
		if i < 2 {
			assert.Equal(t, WCSuccess, wc.Status, "the device's completions come first")
		}
		if wc.Status == WCFlushErr {
			assert.Zero(t, wc.QPN)
			assert.Equal(t, WCRecv, wc.Opcode)
		}
	}
	assert.Equal(t, map[uint64]WCStatus{0: WCSuccess, 1: WCSuccess, 2: WCFlushErr, 3: WCFlushErr, 4: WCFlushErr}, got)
	n, _ = f.cq.Poll(wcs)
	assert.Zero(t, n)
	_, err = f.s.PostRecv([]RecvWR{{WRID: 9}}, 0)
	assert.ErrorIs(t, err, ErrClosed)
	assert.ErrorIs(t, f.s.Ring(), ErrClosed, "SRQ.Ring after Close")
	assert.Equal(t, uint64(3), f.s.Query().Flushed)
}

// SRQ.PostRecv allocates nothing, nor do the device's completions of its
// receives and the poll that accounts them.
func TestSRQDataPathAllocatesNothing(t *testing.T) {
	f := newSRQFixture(t, 64, SRQConfig{Depth: 64})
	wrs := make([]RecvWR, 32)
	for i := range wrs {
		wrs[i] = RecvWR{WRID: uint64(i), SGEs: []SGE{f.sge(i*1024, 1024)}}
	}
	// PostRecv alone: 51 posts of one receive fit the 64.
	post := testing.AllocsPerRun(50, func() {
		if _, err := f.s.PostRecv(wrs[:1], 0); err != nil {
			t.Fatal(err)
		}
	})
	assert.Zero(t, post, "SRQ.PostRecv")
	wcs := make([]WC, 64)
	f.deliver(t, 51)
	n, err := f.cq.Poll(wcs)
	require.NoError(t, err)
	require.Equal(t, 51, n)
	// A chain of 32, the device, the poll.
	all := testing.AllocsPerRun(100, func() {
		if _, err := f.s.PostRecv(wrs, 0); err != nil {
			t.Fatal(err)
		}
		f.deliver(t, 32)
		if n, err := f.cq.Poll(wcs); n != 32 || err != nil {
			t.Fatalf("poll: %d, %v", n, err)
		}
	})
	assert.Zero(t, all, "SRQ.PostRecv of 32, the device, CQ.Poll")
}

// BenchmarkSRQPost times a receive chain posted to an SRQ beside the same
// chain posted to a QP's own receive queue (PostRecv, batch 1 and 32), per
// receive; the device takes and completes them, and the CQ is polled,
// outside the timer when the queue is full (SRQ and QP receive queue of
// 4096, CQ of 16384).
func BenchmarkSRQPost(b *testing.B) {
	for _, kind := range []string{"SRQ", "QP"} {
		for _, batch := range []int{1, 32} {
			b.Run(kind+"/batch"+strconv.Itoa(batch), func(b *testing.B) {
				const depth = 4096 // the QP's receive queue as deep: drained every 4096/batch posts
				f := newSRQFixture(b, depth, SRQConfig{Depth: depth})
				post, outstanding := f.s.PostRecv, f.s.Outstanding
				drain := func() { f.deliver(b, f.s.Outstanding()) }
				if kind == "QP" {
					f.qp.srqm.Detach()
					f.qp.srq, f.qp.srqm = nil, nil
					post = f.qp.PostRecv
					outstanding = func() int { _, r := f.qp.Outstanding(); return r }
					drain = func() { f.device(b, 0) }
				}
				wrs := make([]RecvWR, batch)
				for i := range wrs {
					wrs[i] = RecvWR{WRID: uint64(i), SGEs: []SGE{f.sge(i*1024, 1024)}}
				}
				wcs := make([]WC, 256)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if outstanding()+batch > depth {
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
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/recv")
			})
		}
	}
}
