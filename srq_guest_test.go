//go:build guest

package vfrdma

import (
	"bytes"
	"context"
	"encoding/binary"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// srqRig is an SRQ with n receiving QPs, each connected to a sender QP of
// its own on the same device. The receivers share the SRQ's receive CQ (as
// QEMU 7.2 requires); the senders share another.
type srqRig struct {
	d          *Device
	pd         *PD
	srq        *SRQ
	scq, rcq   *CQ
	senders    []*QP
	receivers  []*QP
	smr, rmr   *MR
	sendSlot   int
	limitCalls atomic.Int32 // OnLowWatermark calls
}

func newSRQRig(t *testing.T, d *Device, n int, cfg SRQConfig, rbytes int) *srqRig {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := &srqRig{d: d, sendSlot: 64 << 10}
	var err error
	r.pd, err = d.AllocPD(ctx)
	require.NoError(t, err)
	r.scq, err = d.CreateCQ(ctx, 1024)
	require.NoError(t, err)
	r.rcq, err = d.CreateCQ(ctx, 1024)
	require.NoError(t, err)
	cfg.OnLowWatermark = func(SRQEvent) { r.limitCalls.Add(1) }
	r.srq, err = r.pd.CreateSRQ(ctx, &cfg)
	require.NoError(t, err)
	r.rmr, err = r.pd.AllocMR(ctx, rbytes, AccessLocalWrite)
	require.NoError(t, err)
	r.smr, err = r.pd.AllocMR(ctx, n*r.sendSlot, AccessLocalWrite)
	require.NoError(t, err)
	for i := 0; i < n; i++ {
		s, err := r.pd.CreateQP(ctx, &QPConfig{Type: RC, SendCQ: r.scq, RecvCQ: r.scq, SendSGE: 4})
		require.NoError(t, err)
		q, err := r.pd.CreateQP(ctx, &QPConfig{Type: RC, SendCQ: r.scq, RecvCQ: r.rcq, SRQ: r.srq})
		require.NoError(t, err)
		require.NoError(t, s.Connect(ctx, Remote{QPN: q.QPN(), GID: d.GID()}, 0))
		require.NoError(t, q.Connect(ctx, Remote{QPN: s.QPN(), GID: d.GID()}, 0))
		r.senders = append(r.senders, s)
		r.receivers = append(r.receivers, q)
	}
	return r
}

// post posts one receive to the SRQ.
func (r *srqRig) post(t *testing.T, id uint64, sges ...SGE) {
	t.Helper()
	_, err := r.srq.PostRecv([]RecvWR{{WRID: id, SGEs: sges}}, 0)
	require.NoError(t, err)
}

// send sends payload on connection i (copied to the sender's slot) and
// waits for its completion; it returns the completion.
func (r *srqRig) send(t *testing.T, i int, id uint64, payload []byte) WC {
	t.Helper()
	b := r.smr.Bytes()[i*r.sendSlot:]
	copy(b, payload)
	var sges []SGE
	if len(payload) > 0 {
		sges = []SGE{r.smr.SGE(i*r.sendSlot, len(payload))}
	}
	_, err := r.senders[i].PostSend([]SendWR{{WRID: id, SGEs: sges}}, 0)
	require.NoError(t, err)
	wcs := make([]WC, 1)
	pollWait(t, r.scq, wcs)
	require.Equal(t, id, wcs[0].WRID, "send completion")
	return wcs[0]
}

// recv waits for one receive completion.
func (r *srqRig) recv(t *testing.T) WC {
	t.Helper()
	wcs := make([]WC, 1)
	pollWait(t, r.rcq, wcs)
	return wcs[0]
}

// Rule 1 (post): a receive posted to the SRQ is consumed by any connected
// QP that uses it, and its cookie comes back; and rule 2 (order): with four
// connections sharing the SRQ, each connection's receives complete in the
// order of its sends, every byte checked, every receive completed once.
func TestSRQConsumedByAnyQPInConnectionOrder(t *testing.T) {
	d := openGuest(t)
	const conns, depth, slot, perConn = 4, 64, 2048, 1000
	r := newSRQRig(t, d, conns, SRQConfig{Depth: depth}, depth*slot)

	// Refused before a ring is touched, with no completion.
	_, err := r.receivers[0].PostRecv([]RecvWR{{WRID: 9, SGEs: []SGE{r.rmr.SGE(0, 64)}}}, 0)
	assert.ErrorIs(t, err, ErrInvalid, "PostRecv on a QP of an SRQ")
	ctx := context.Background()
	_, err = r.pd.CreateQP(ctx, &QPConfig{Type: RC, SendCQ: r.scq, RecvCQ: r.scq, SRQ: r.srq})
	assert.ErrorIs(t, err, ErrNotSupported, "a QP of the SRQ with another receive CQ (QEMU 7.2)")

	for s := 0; s < depth; s++ {
		r.post(t, uint64(s), r.rmr.SGE(s*slot, slot))
	}
	assert.ErrorIs(t, r.srq.Close(), ErrBusy, "closing an SRQ its QPs still use")

	// Messages lead with (connection, sequence) and seed their pattern.
	sent, next := make([]int, conns), make([]int, conns)
	sendsOut, recvd := 0, 0
	seen := map[uint64]bool{}
	wcs := make([]WC, 32)
	swr := make([]SendWR, 1)
	for recvd < conns*perConn {
		for i := range r.senders {
			// A few messages per connection in flight, from slots of
			// their own: the connections interleave at the SRQ.
			if sent[i] < perConn && sent[i]-next[i] < 4 {
				size := 4 + (sent[i]*37+i*11)%(slot-4)
				off := i*r.sendSlot + (sent[i]%4)*slot
				b := r.smr.Bytes()[off : off+size]
				id := uint32(i<<24 | sent[i])
				binary.LittleEndian.PutUint32(b, id)
				fill(b[4:], int(id))
				swr[0] = SendWR{WRID: uint64(id), SGEs: []SGE{r.smr.SGE(off, size)}}
				_, err := r.senders[i].PostSend(swr, 0)
				require.NoError(t, err)
				sent[i]++
				sendsOut++
			}
		}
		k, err := r.scq.Poll(wcs)
		require.NoError(t, err)
		for _, wc := range wcs[:k] {
			require.Equal(t, WCSuccess, wc.Status, "send %+v", wc)
			sendsOut--
		}
		k, err = r.rcq.Poll(wcs)
		require.NoError(t, err)
		if k == 0 && sendsOut == 0 {
			k = pollWait(t, r.rcq, wcs)
		}
		for _, wc := range wcs[:k] {
			require.Equal(t, WCSuccess, wc.Status, "receive %+v", wc)
			require.Equal(t, WCRecv, wc.Opcode)
			require.False(t, seen[wc.WRID], "receive %d completed twice", wc.WRID)
			s := int(wc.WRID)
			b := r.rmr.Bytes()[s*slot : s*slot+int(wc.ByteLen)]
			id := binary.LittleEndian.Uint32(b)
			i, seq := int(id>>24), int(id&0xffffff)
			require.Less(t, i, conns, "message %#x", id)
			require.Equal(t, r.receivers[i].QPN(), wc.QPN, "message %#x arrived on the wrong QP", id)
			require.Equal(t, next[i], seq, "connection %d: order", i)
			require.NoError(t, check(b[4:], int(id)))
			next[i]++
			recvd++
			r.post(t, wc.WRID, r.rmr.SGE(s*slot, slot))
		}
	}
	for sendsOut > 0 {
		sendsOut -= pollWait(t, r.scq, wcs)
	}
	assert.Equal(t, depth, r.srq.Outstanding(), "receives available after the traffic")
	snap := r.srq.Query()
	var consumed uint64
	for _, v := range snap.QPs {
		assert.Equal(t, uint64(perConn), v.Consumed, "QP %d consumed", v.QPN)
		consumed += v.Consumed
	}
	assert.Len(t, snap.QPs, conns)
	assert.Equal(t, uint64(conns*perConn), snap.Consumed)
	assert.Equal(t, uint64(conns*perConn), consumed)
	st := r.srq.DoorbellStats()
	t.Logf("SRQ: %d messages over %d connections, %d receive doorbells", recvd, conns, st.Doorbells)
	quiet(t, r.rcq)
}

// Rule 1 (segments in order): a receive's segments fill in I/O-vector
// order, front segments whole, at most one in part, the rest untouched; a
// message longer than the vector completes with LOC_LEN_ERR.
func TestSRQSegmentsFilledInOrder(t *testing.T) {
	d := openGuest(t)
	const canary = 0xA5
	r := newSRQRig(t, d, 1, SRQConfig{Depth: 8, SGE: 3}, 3*4096)
	// Three segments of 100, 200 and 300 bytes with gaps between them,
	// one receive per page.
	vec := func(page int) []SGE {
		base := page * 4096
		return []SGE{r.rmr.SGE(base+16, 100), r.rmr.SGE(base+200, 200), r.rmr.SGE(base+500, 300)}
	}
	mem := r.rmr.Bytes()
	for i := range mem {
		mem[i] = canary
	}
	payload := make([]byte, 601)
	fill(payload, 77)
	// check compares a page with the message laid over the vector.
	check := func(page, n int) {
		t.Helper()
		want := bytes.Repeat([]byte{canary}, 4096)
		left := payload[:n]
		for _, s := range vec(page) {
			off := int(s.Addr-r.rmr.Addr()) - page*4096
			k := copy(want[off:off+int(s.Length)], left)
			left = left[k:]
		}
		got := mem[page*4096 : (page+1)*4096]
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("page %d, a %d-byte message: byte %d is %#x, want %#x", page, n, i, got[i], want[i])
			}
		}
	}
	for page := 0; page < 3; page++ {
		r.post(t, uint64(page), vec(page)...)
	}
	// Shorter than the vector: the first segment whole, the second in
	// part, the third untouched.
	r.send(t, 0, 1, payload[:250])
	wc := r.recv(t)
	require.Equal(t, WCSuccess, wc.Status)
	assert.Equal(t, uint64(0), wc.WRID)
	assert.Equal(t, uint32(250), wc.ByteLen)
	check(0, 250)
	// Exactly its size: every segment whole.
	r.send(t, 0, 2, payload[:600])
	wc = r.recv(t)
	require.Equal(t, WCSuccess, wc.Status)
	assert.Equal(t, uint64(1), wc.WRID)
	assert.Equal(t, uint32(600), wc.ByteLen)
	check(1, 600)
	// One byte longer: LOC_LEN_ERR at the receiver, an error at the
	// sender.
	swc := r.send(t, 0, 3, payload[:601])
	assert.NotEqual(t, WCSuccess, swc.Status, "a send into a short receive")
	wc = r.recv(t)
	assert.Equal(t, WCLocLenErr, wc.Status, "a message longer than the vector")
	assert.Equal(t, uint64(2), wc.WRID)
	quiet(t, r.rcq)
}

// Rule 1 (zero size): a receive of no segments takes a zero-size message;
// a zero-size message fits any receive too, and leaves it untouched.
func TestSRQZeroSegmentReceives(t *testing.T) {
	d := openGuest(t)
	r := newSRQRig(t, d, 1, SRQConfig{Depth: 8}, 4096)
	mem := r.rmr.Bytes()
	for i := range mem {
		mem[i] = 0x5A
	}
	for i := 0; i < 3; i++ {
		r.post(t, uint64(100+i)) // no SGEs
	}
	for i := 0; i < 3; i++ {
		r.send(t, 0, uint64(i), nil)
		wc := r.recv(t)
		require.Equal(t, WCSuccess, wc.Status, "%+v", wc)
		assert.Equal(t, uint64(100+i), wc.WRID)
		assert.Zero(t, wc.ByteLen)
	}
	r.post(t, 200, r.rmr.SGE(0, 4096))
	r.send(t, 0, 9, nil)
	wc := r.recv(t)
	require.Equal(t, WCSuccess, wc.Status)
	assert.Equal(t, uint64(200), wc.WRID)
	assert.Zero(t, wc.ByteLen)
	assert.Equal(t, bytes.Repeat([]byte{0x5A}, 4096), mem, "a zero-size message wrote to its buffer")
	quiet(t, r.rcq)
}

// Rule 1 (errors): every refusal is inline and distinct, writes no WQE,
// makes no completion, and loses nothing posted before it: receives
// deferred before a refused one still reach the device and are consumed.
func TestSRQPostErrorsInline(t *testing.T) {
	d := openGuest(t)
	ctx := context.Background()

	// Before any QP uses it (QEMU 7.2 stamps the receive CQ at post).
	pd, err := d.AllocPD(ctx)
	require.NoError(t, err)
	lone, err := pd.CreateSRQ(ctx, &SRQConfig{Depth: 4})
	require.NoError(t, err)
	mr, err := pd.AllocMR(ctx, 4096, AccessLocalWrite)
	require.NoError(t, err)
	_, err = lone.PostRecv([]RecvWR{{WRID: 1, SGEs: []SGE{mr.SGE(0, 64)}}}, 0)
	assert.ErrorIs(t, err, ErrInvalid, "a post before any QP uses the SRQ")
	assert.Zero(t, lone.Outstanding())
	require.NoError(t, lone.Close())

	const depth = 8
	r := newSRQRig(t, d, 1, SRQConfig{Depth: depth, SGE: 2}, depth*1024)
	other, err := d.AllocPD(ctx)
	require.NoError(t, err)
	otherMR, err := other.AllocMR(ctx, 4096, AccessLocalWrite)
	require.NoError(t, err)
	readOnly, err := r.pd.AllocMR(ctx, 4096, 0)
	require.NoError(t, err)
	good := r.rmr.SGE(0, 1024)

	for _, tc := range []struct {
		name string
		sges []SGE
		want error
	}{
		{"a segment outside its MR", []SGE{r.rmr.SGE(depth*1024-8, 16)}, ErrInvalid},
		{"more SGEs than the SRQ takes", []SGE{good, good, good}, ErrInvalid},
		{"an MR of another PD", []SGE{otherMR.SGE(0, 64)}, ErrProtection},
		{"an MR without local write", []SGE{readOnly.SGE(0, 64)}, ErrPrivileges},
		{"a key no MR has", []SGE{{Addr: r.rmr.Addr(), Length: 64, LKey: 0xdead}}, ErrPrivileges},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := r.srq.DoorbellStats()
			out := r.srq.Outstanding()
			// One good receive deferred, then the bad one in another call.
			_, err := r.srq.PostRecv([]RecvWR{{WRID: 1, SGEs: []SGE{good}}}, FlagDefer)
			require.NoError(t, err)
			n, err := r.srq.PostRecv([]RecvWR{{WRID: 2, SGEs: tc.sges}}, 0)
			assert.Zero(t, n)
			var pe *PostError
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, uint64(2), pe.WRID)
			assert.ErrorIs(t, err, tc.want)
			after := r.srq.DoorbellStats()
			assert.Equal(t, before.Doorbells+1, after.Doorbells, "the deferred receive's doorbell")
			assert.Equal(t, before.WQEs+1, after.WQEs, "WQEs handed to the device")
			assert.Equal(t, out+1, r.srq.Outstanding())
			// The deferred one is consumed; the refused one never completes.
			r.send(t, 0, 7, []byte("hello"))
			wc := r.recv(t)
			assert.Equal(t, WCSuccess, wc.Status)
			assert.Equal(t, uint64(1), wc.WRID)
			quiet(t, r.rcq)
		})
	}

	// Full: depth receives outstanding.
	for i := 0; i < depth; i++ {
		r.post(t, uint64(10+i), r.rmr.SGE(i*1024, 1024))
	}
	_, err = r.srq.PostRecv([]RecvWR{{WRID: 99, SGEs: []SGE{good}}}, 0)
	assert.ErrorIs(t, err, ErrQueueFull, "a post past the depth")
	assert.Equal(t, depth, r.srq.Outstanding())

	// Closed: an invalid handle. Its receives flush, once each.
	for _, q := range append(r.receivers, r.senders...) {
		require.NoError(t, q.Close())
	}
	require.NoError(t, r.srq.Close())
	_, err = r.srq.PostRecv([]RecvWR{{WRID: 98, SGEs: []SGE{good}}}, 0)
	assert.ErrorIs(t, err, ErrClosed, "a post to a closed SRQ")
	flushed := map[uint64]bool{}
	wcs := make([]WC, 16)
	for len(flushed) < depth {
		n := pollWait(t, r.rcq, wcs)
		for _, wc := range wcs[:n] {
			assert.Equal(t, WCFlushErr, wc.Status)
			assert.False(t, flushed[wc.WRID], "wr_id %d flushed twice", wc.WRID)
			flushed[wc.WRID] = true
		}
	}
	quiet(t, r.rcq)
}

// Rule 3 (receive query): a QP with its own receive queue reports its
// buffers allocated at post and the same span, from one read; a QP of an
// SRQ reports UnknownCount for both (the device names the QP only in a
// completion), says so up front, and the SRQ counts what each consumed.
func TestSRQRecvQuery(t *testing.T) {
	d := openGuest(t)
	p := newPair(t, d, RC, 16, 1024)
	require.True(t, p.b.CanQueryRecv())
	assert.Equal(t, RecvQuery{Allocated: 0, Span: 0}, p.b.RecvQuery())
	for i := 0; i < 5; i++ {
		_, err := p.b.PostRecv([]RecvWR{{WRID: uint64(i), SGEs: []SGE{p.bmr.SGE(i*1024, 1024)}}}, 0)
		require.NoError(t, err)
	}
	assert.Equal(t, RecvQuery{Allocated: 5, Span: 5}, p.b.RecvQuery())
	for i := 0; i < 2; i++ {
		_, err := p.a.PostSend([]SendWR{{WRID: uint64(i), SGEs: []SGE{p.amr.SGE(0, 100)}}}, 0)
		require.NoError(t, err)
	}
	wcs := make([]WC, 4)
	for got := 0; got < 2; {
		got += pollWait(t, p.bcq, wcs[:2-got])
	}
	q := p.b.RecvQuery()
	assert.Equal(t, RecvQuery{Allocated: 3, Span: 3}, q)
	assert.GreaterOrEqual(t, q.Span, q.Allocated)

	r := newSRQRig(t, d, 2, SRQConfig{Depth: 8}, 8*1024)
	for _, qp := range r.receivers {
		assert.False(t, qp.CanQueryRecv())
		assert.Equal(t, RecvQuery{Allocated: UnknownCount, Span: UnknownCount}, qp.RecvQuery())
	}
	for i := 0; i < 8; i++ {
		r.post(t, uint64(i), r.rmr.SGE(i*1024, 1024))
	}
	for _, i := range []int{0, 1, 1, 1} {
		r.send(t, i, 1, []byte("x"))
		require.Equal(t, WCSuccess, r.recv(t).Status)
	}
	views := map[uint32]SRQQPView{}
	for _, v := range r.srq.Query().QPs {
		views[v.QPN] = v
	}
	assert.Equal(t, SRQQPView{QPN: r.receivers[0].QPN(), Consumed: 1, Allocated: UnknownCount, Span: UnknownCount}, views[r.receivers[0].QPN()])
	assert.Equal(t, SRQQPView{QPN: r.receivers[1].QPN(), Consumed: 3, Allocated: UnknownCount, Span: UnknownCount}, views[r.receivers[1].QPN()])
}

// Rule 4 (low watermark): when the receives available drop below the
// watermark one event is raised, by the driver, when it reaps the crossing
// completion; it fires once per setting, and again only once set again
// (during the call if the SRQ is below it already). A watermark given at
// creation waits for the first crossing.
func TestSRQLowWatermarkOncePerSetting(t *testing.T) {
	d := openGuest(t)
	const depth = 16
	r := newSRQRig(t, d, 1, SRQConfig{Depth: depth, LowWatermark: 8}, depth*256)
	for i := 0; i < depth; i++ {
		r.post(t, uint64(i), r.rmr.SGE(i*256, 256))
	}
	events := r.srq.LowWatermarkEvents()
	consume := func(n int) {
		t.Helper()
		for i := 0; i < n; i++ {
			r.send(t, 0, uint64(i), []byte("m"))
			require.Equal(t, WCSuccess, r.recv(t).Status)
		}
	}
	noEvent := func(what string) {
		t.Helper()
		select {
		case ev := <-events:
			t.Fatalf("%s: an event %+v", what, ev)
		default:
		}
	}
	consume(8) // 8 available: not below 8
	noEvent("8 of 16 available, watermark 8")
	assert.Equal(t, int32(0), r.limitCalls.Load())
	consume(1) // 7 < 8: the crossing
	select {
	case ev := <-events:
		assert.Equal(t, SRQEvent{Available: 7, Watermark: 8}, ev)
	default:
		t.Fatal("no event once 7 of 16 were available, watermark 8")
	}
	assert.Equal(t, int32(1), r.limitCalls.Load())
	assert.Zero(t, r.srq.Query().LowWatermark, "the watermark disarms when it fires")
	consume(3)
	noEvent("below the watermark, not set again")
	assert.Equal(t, int32(1), r.limitCalls.Load())

	// Set again above what is available (4): it fires during the call
	// (dat_srq_set_lw), once.
	require.NoError(t, r.srq.SetLowWatermark(6))
	select {
	case ev := <-events:
		assert.Equal(t, SRQEvent{Available: 4, Watermark: 6}, ev)
	default:
		t.Fatal("no event when armed at 6 with 4 available")
	}
	consume(1)
	noEvent("the next completion, after the event of this arming")
	assert.Equal(t, int32(2), r.limitCalls.Load())

	// Refill to 15, set at 10, consume across it: once more, and only once.
	for i := 0; i < 12; i++ {
		r.post(t, uint64(100+i), r.rmr.SGE(i*256, 256))
	}
	require.NoError(t, r.srq.SetLowWatermark(10))
	consume(5)
	noEvent("10 available, watermark 10")
	consume(3)
	assert.Equal(t, SRQEvent{Available: 9, Watermark: 10}, <-events)
	noEvent("after the third firing")
	assert.Equal(t, int32(3), r.limitCalls.Load())
	assert.Equal(t, uint64(3), r.srq.Query().Events)
	assert.ErrorIs(t, r.srq.SetLowWatermark(depth+1), ErrInvalid, "a watermark above the depth")
}

// Rule 5 (query): depth, SGEs per receive, watermark, receives posted and
// not consumed, and the per-QP view, in one snapshot.
func TestSRQQuery(t *testing.T) {
	d := openGuest(t)
	r := newSRQRig(t, d, 2, SRQConfig{Depth: 24, MaxDepth: 100, SGE: 3, LowWatermark: 4}, 32*512)
	for i := 0; i < 10; i++ {
		r.post(t, uint64(i), r.rmr.SGE(i*512, 512))
	}
	r.send(t, 1, 1, []byte("q"))
	require.Equal(t, WCSuccess, r.recv(t).Status)
	s := r.srq.Query()
	assert.Equal(t, 24, s.Depth)
	assert.Equal(t, 128, s.Slots, "the ring reserved: MaxDepth rounded up to a power of two")
	assert.Equal(t, 128, r.srq.MaxDepth())
	assert.Equal(t, 3, s.MaxSGE)
	assert.Equal(t, 4, s.LowWatermark)
	assert.Equal(t, 9, s.Available)
	assert.Equal(t, uint64(1), s.Consumed)
	require.Len(t, s.QPs, 2)
	for _, v := range s.QPs {
		want := uint64(0)
		if v.QPN == r.receivers[1].QPN() {
			want = 1
		}
		assert.Equal(t, want, v.Consumed, "QP %d", v.QPN)
		assert.Equal(t, UnknownCount, v.Allocated)
		assert.Equal(t, UnknownCount, v.Span)
	}
	require.NoError(t, r.receivers[0].Close())
	assert.Len(t, r.srq.Query().QPs, 1, "a closed QP leaves the view")
}

// Rule 6 (resize): the SRQ grows and shrinks within the ring reserved at
// creation; shrinking below what is outstanding is refused and changes
// nothing; the new depth is what posting enforces.
func TestSRQResize(t *testing.T) {
	d := openGuest(t)
	r := newSRQRig(t, d, 1, SRQConfig{Depth: 16, MaxDepth: 64}, 64*256)
	post := func(from, n int) {
		t.Helper()
		for i := from; i < from+n; i++ {
			r.post(t, uint64(i), r.rmr.SGE(i%64*256, 256))
		}
	}
	post(0, 16)
	_, err := r.srq.PostRecv([]RecvWR{{WRID: 99, SGEs: []SGE{r.rmr.SGE(0, 256)}}}, 0)
	assert.ErrorIs(t, err, ErrQueueFull, "past depth 16")
	require.NoError(t, r.srq.Resize(48))
	assert.Equal(t, 48, r.srq.Depth())
	post(16, 32)
	_, err = r.srq.PostRecv([]RecvWR{{WRID: 99, SGEs: []SGE{r.rmr.SGE(0, 256)}}}, 0)
	assert.ErrorIs(t, err, ErrQueueFull, "past depth 48")

	err = r.srq.Resize(16)
	assert.ErrorIs(t, err, ErrBusy, "shrinking below 48 outstanding")
	assert.Equal(t, 48, r.srq.Depth(), "a refused resize changes nothing")
	assert.ErrorIs(t, r.srq.Resize(65), ErrInvalid, "past the reserved ring")
	assert.ErrorIs(t, r.srq.Resize(0), ErrInvalid)

	for i := 0; i < 40; i++ {
		r.send(t, 0, uint64(i), []byte{byte(i)})
		wc := r.recv(t)
		require.Equal(t, WCSuccess, wc.Status)
		require.Equal(t, uint64(i), wc.WRID, "the SRQ is consumed in posting order")
	}
	require.NoError(t, r.srq.Resize(8), "8 outstanding: shrink to 8")
	_, err = r.srq.PostRecv([]RecvWR{{WRID: 99, SGEs: []SGE{r.rmr.SGE(0, 256)}}}, 0)
	assert.ErrorIs(t, err, ErrQueueFull, "past depth 8")
	require.NoError(t, r.srq.Resize(64))
	post(48, 56)
	assert.Equal(t, 64, r.srq.Outstanding())
	r.send(t, 0, 100, []byte("after"))
	wc := r.recv(t)
	assert.Equal(t, WCSuccess, wc.Status)
	assert.Equal(t, uint64(40), wc.WRID)
}

// Rule 7 (flush): every receive completes exactly once. A QP of the SRQ
// that goes to ERR leaves the receives it did not take on the SRQ, where
// the other QPs consume them; destroying the SRQ flushes the rest, each
// once, on its CQ.
func TestSRQFlushExactlyOnce(t *testing.T) {
	d := openGuest(t)
	ctx := context.Background()
	const posted = 12
	r := newSRQRig(t, d, 2, SRQConfig{Depth: 16}, 16*256)
	for i := 0; i < posted; i++ {
		r.post(t, uint64(i), r.rmr.SGE(i*256, 256))
	}
	seen := map[uint64]WC{}
	note := func(wc WC) {
		t.Helper()
		prev, dup := seen[wc.WRID]
		require.False(t, dup, "wr_id %d completed twice: %+v then %+v", wc.WRID, prev, wc)
		seen[wc.WRID] = wc
	}
	for i := 0; i < 3; i++ {
		r.send(t, 0, uint64(i), []byte("a"))
		note(r.recv(t))
	}
	require.NoError(t, r.receivers[0].SetError(ctx))
	quiet(t, r.rcq)
	assert.Equal(t, posted-3, r.srq.Outstanding(), "a QP in ERR leaves the SRQ's receives on it")
	r.send(t, 1, 10, []byte("b"))
	wc := r.recv(t)
	note(wc)
	assert.Equal(t, r.receivers[1].QPN(), wc.QPN)
	for _, q := range append(r.receivers, r.senders...) {
		require.NoError(t, q.Close())
	}
	flushedBefore := r.rcq.Stats().Flushed
	require.NoError(t, r.srq.Close())
	require.NoError(t, r.srq.Close(), "Close is idempotent")
	wcs := make([]WC, 16)
	for len(seen) < posted {
		n := pollWait(t, r.rcq, wcs)
		for _, wc := range wcs[:n] {
			assert.Equal(t, WCFlushErr, wc.Status, "%+v", wc)
			assert.Zero(t, wc.QPN, "a flushed SRQ receive names no QP")
			note(wc)
		}
	}
	assert.Equal(t, uint64(posted-4), r.rcq.Stats().Flushed-flushedBefore)
	for i := 0; i < posted; i++ {
		_, ok := seen[uint64(i)]
		assert.True(t, ok, "receive %d never completed", i)
	}
	quiet(t, r.rcq, r.scq)
}
