package vfrdma

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// streamMessages is how many messages the stream cases send: 100k on the
// device; the host run on the model, which copies every byte under the
// race detector, sends fewer (the sizes and checks are the same).
var streamMessages = 100000

// dataPathSuite is the data-path suite: it runs in the guest on QEMU
// (datapath_guest_test.go) and on the host on the device model's QEMU 7.2
// mode (datapath_model_test.go), and both must pass: what keeps the model
// honest.
var dataPathSuite = []struct {
	name string
	run  func(t *testing.T, d *Device)
}{
	{"RCStream", suiteRCStream},
	{"UDStream", suiteUDStream},
	{"DeferredPosts", suiteDeferredPosts},
	{"ExactlyOnce", suiteExactlyOnce},
	{"WaitCQ", suiteWaitCQ},
	{"AFailedRCQPIsInERRInStateAndOnTheDevice", suiteAFailedRCQPIsInERRInStateAndOnTheDevice},
	{"UnsignaledSendsCompleteOnTime", suiteUnsignaledSendsCompleteOnTime},
	{"FlushesFollowTheDevicesCompletionsAcrossShortPolls", suiteFlushesFollowTheDevicesCompletionsAcrossShortPolls},
	{"CloseFlushesEachSendOutstandingOnceFromOneToTheQueueDepth", suiteCloseFlushesEachSendOutstandingOnceFromOneToTheQueueDepth},
	{"RegisterMRAtCarriesUnalignedMemoryByteForByte", suiteRegisterMRAtCarriesUnalignedMemoryByteForByte},
}

// pair is two connected QPs of one device with their CQs and buffers.
type pair struct {
	d        *Device
	pd       *PD
	a, b     *QP
	acq, bcq *CQ
	amr, bmr *MR
	slot     int
	ahB      *AH // UD: a's handle for b
	qkey     uint32
	typ      QPType
	depth    int
}

func newPair(t testing.TB, d *Device, typ QPType, depth, slot int) *pair {
	t.Helper()
	return newPairSignaling(t, d, typ, depth, slot, true)
}

// newPairSignaling is newPair with QPConfig.SignalAll as given.
func newPairSignaling(t testing.TB, d *Device, typ QPType, depth, slot int, signalAll bool) *pair {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := &pair{d: d, typ: typ, depth: depth, slot: slot, qkey: 0x11111111}
	var err error
	if p.pd, err = d.AllocPD(ctx); err != nil {
		t.Fatal(err)
	}
	if p.acq, err = d.CreateCQ(ctx, 2*depth); err != nil {
		t.Fatal(err)
	}
	if p.bcq, err = d.CreateCQ(ctx, 2*depth); err != nil {
		t.Fatal(err)
	}
	mk := func(cq *CQ) *QP {
		qp, err := p.pd.CreateQP(ctx, &QPConfig{Type: typ, SendCQ: cq, RecvCQ: cq, SendDepth: depth, RecvDepth: depth, QKey: p.qkey, SignalAll: signalAll})
		if err != nil {
			t.Fatal(err)
		}
		return qp
	}
	p.a, p.b = mk(p.acq), mk(p.bcq)
	if p.amr, err = p.pd.AllocMR(ctx, depth*slot, AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	if p.bmr, err = p.pd.AllocMR(ctx, depth*slot, AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	gid := d.GID()
	if typ == RC {
		if err := p.a.Connect(ctx, Remote{QPN: p.b.QPN(), GID: gid}, 0); err != nil {
			t.Fatal(err)
		}
		if err := p.b.Connect(ctx, Remote{QPN: p.a.QPN(), GID: gid}, 0); err != nil {
			t.Fatal(err)
		}
	} else {
		for _, qp := range []*QP{p.a, p.b} {
			if err := qp.Connect(ctx, Remote{}, 0); err != nil {
				t.Fatal(err)
			}
		}
		if p.ahB, err = p.pd.CreateAH(AHAttr{DGID: gid}); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func fill(b []byte, seq int) {
	for i := range b {
		b[i] = byte(seq*131 + i*7 + i>>8)
	}
}

func check(b []byte, seq int) error {
	for i := range b {
		if want := byte(seq*131 + i*7 + i>>8); b[i] != want {
			return fmt.Errorf("message %d byte %d: %#x, want %#x", seq, i, b[i], want)
		}
	}
	return nil
}

// pollWait polls cq into wcs, waiting on its interrupt when it is empty.
func pollWait(t testing.TB, cq *CQ, wcs []WC) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for spins := 0; ; spins++ {
		n, err := cq.Poll(wcs)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return n
		}
		if spins < 64 {
			continue
		}
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		err = cq.Wait(ctx)
		cancel()
		if err != nil {
			t.Fatalf("no completion on CQ %d: %v", cq.handle, err)
		}
	}
}

// stream sends count messages a→b with sizes from sizes, batch at a time
// (deferred chains), and checks every received byte and every completion.
func (p *pair) stream(t testing.TB, count, batch int, sizes []int) (doorbells uint64) {
	t.Helper()
	hdr := 0
	if p.typ == UD {
		hdr = UDHeaderRoom
	}
	rwr := make([]RecvWR, 1)
	post := func(slot int) {
		rwr[0] = RecvWR{WRID: uint64(slot), SGEs: []SGE{p.bmr.SGE(slot*p.slot, p.slot)}}
		if _, err := p.b.PostRecv(rwr, 0); err != nil {
			t.Fatal(err)
		}
	}
	for s := 0; s < p.depth; s++ {
		post(s)
	}
	swr := make([]SendWR, batch)
	sge := make([]SGE, batch)
	wcs := make([]WC, 64)
	sent, recvd, sendDone := 0, 0, 0
	inflight := 0
	recvSeq := make([]int, p.depth) // message seq expected in each receive slot, FIFO order
	nextRecvSlot := 0
	_ = recvSeq
	for recvd < count {
		// Send while the window allows: a batch, deferred but for the last.
		// Both windows: receives posted at b, and a's send queue (sends
		// stay in it until their completions are polled).
		if n := min(batch, count-sent, p.depth-inflight, p.depth-(sent-sendDone)); n > 0 {
			for i := 0; i < n; i++ {
				seq := sent + i
				size := sizes[seq%len(sizes)]
				slot := seq % p.depth
				fill(p.amr.Bytes()[slot*p.slot:slot*p.slot+size], seq)
				sge[i] = p.amr.SGE(slot*p.slot, size)
				swr[i] = SendWR{WRID: uint64(seq), SGEs: sge[i : i+1], AH: p.ahB, RemoteQPN: p.b.QPN(), RemoteQKey: p.qkey}
				if size == 0 {
					swr[i].SGEs = nil
				}
			}
			if _, err := p.a.PostSend(swr[:n], 0); err != nil {
				t.Fatal(err)
			}
			sent += n
			inflight += n
		}
		// Reap sends.
		k, err := p.acq.Poll(wcs)
		if err != nil {
			t.Fatal(err)
		}
		for _, wc := range wcs[:k] {
			if wc.Status != WCSuccess || wc.Opcode != WCSend || wc.WRID != uint64(sendDone) {
				t.Fatalf("send completion %+v, want success of wr_id %d", wc, sendDone)
			}
			sendDone++
		}
		// Receives: check, repost.
		if k, err = p.bcq.Poll(wcs); err != nil {
			t.Fatal(err)
		}
		if k == 0 && sendDone == sent && recvd < sent {
			if k, err = p.bcq.Poll(wcs); err == nil && k == 0 {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				err = p.bcq.Wait(ctx)
				cancel()
				if err != nil {
					so, ro := p.a.Outstanding()
					bso, bro := p.b.Outstanding()
					t.Fatalf("stalled: sent %d, sends done %d, received %d; a outstanding %d/%d, b %d/%d; a CQ %+v, b CQ %+v: %v",
						sent, sendDone, recvd, so, ro, bso, bro, p.acq.Stats(), p.bcq.Stats(), err)
				}
				k, err = p.bcq.Poll(wcs)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		for _, wc := range wcs[:k] {
			seq := recvd
			size := sizes[seq%len(sizes)]
			slot := int(wc.WRID)
			if wc.Status != WCSuccess || wc.Opcode != WCRecv || slot != nextRecvSlot || int(wc.ByteLen) != size+hdr || wc.QPN != p.b.QPN() {
				t.Fatalf("receive completion %+v for message %d: want success in slot %d of %d bytes", wc, seq, nextRecvSlot, size+hdr)
			}
			buf := p.bmr.Bytes()[slot*p.slot+hdr : slot*p.slot+hdr+size]
			if err := check(buf, seq); err != nil {
				t.Fatal(err)
			}
			recvd++
			inflight--
			nextRecvSlot = (nextRecvSlot + 1) % p.depth
			post(slot)
		}
	}
	for sendDone < sent {
		k := pollWait(t, p.acq, wcs)
		for _, wc := range wcs[:k] {
			if wc.Status != WCSuccess || wc.WRID != uint64(sendDone) {
				t.Fatalf("send completion %+v, want success of wr_id %d", wc, sendDone)
			}
			sendDone++
		}
	}
	st, _ := p.a.DoorbellStats()
	return st.Doorbells
}

func rcSizes(max int) []int {
	return []int{0, 1, 2, 3, 7, 8, 63, 64, 65, 100, 255, 256, 512, 1000, 1023, 1024, 1025, 2048, 4095, 4096, 4097, 8192, 16384, 32768, max}
}

// streamMessages RC messages of mixed sizes between two QPs of one device, every
// byte checked, plus a few of the largest size.
func suiteRCStream(t *testing.T, d *Device) {
	p := newPair(t, d, RC, 64, 64<<10)
	start := time.Now()
	n := streamMessages
	db := p.stream(t, n, 32, rcSizes(64<<10))
	el := time.Since(start)
	t.Logf("RC: %d messages in %v (%.0f msg/s), %d doorbells (%.3f per message)", n, el, float64(n)/el.Seconds(), db, float64(db)/float64(n))

	big := newPair(t, d, RC, 4, 4<<20)
	big.stream(t, 8, 1, []int{4 << 20, 1 << 20, 4<<20 - 1})
}

// streamMessages UD datagrams of mixed sizes up to the path MTU.
func suiteUDStream(t *testing.T, d *Device) {
	mtu := d.udMax
	p := newPair(t, d, UD, 64, mtu+UDHeaderRoom)
	start := time.Now()
	n := streamMessages
	var sizes []int
	for _, size := range []int{0, 1, 2, 40, 100, 512, 1000, 1024, 2047, 2048, 4000} {
		if size < mtu-1 {
			sizes = append(sizes, size)
		}
	}
	db := p.stream(t, n, 32, append(sizes, mtu-1, mtu))
	el := time.Since(start)
	t.Logf("UD: %d datagrams in %v (%.0f msg/s), %d doorbells (%.3f per message)", n, el, float64(n)/el.Seconds(), db, float64(db)/float64(n))
}

// The deferred-post rules, with doorbells counted.
func suiteDeferredPosts(t *testing.T, d *Device) {
	p := newPair(t, d, RC, 64, 256)
	for s := 0; s < 32; s++ {
		_, err := p.b.PostRecv([]RecvWR{{WRID: uint64(s), SGEs: []SGE{p.bmr.SGE(s*256, 256)}}}, 0)
		require.NoError(t, err)
	}
	send := func(id uint64, flags PostFlags, sges []SGE) error {
		_, err := p.a.PostSend([]SendWR{{WRID: id, SGEs: sges}}, flags)
		return err
	}
	ok := []SGE{p.amr.SGE(0, 16)}
	doorbells := func() uint64 { s, _ := p.a.DoorbellStats(); return s.Doorbells }

	// Ten deferred posts ring nothing; the eleventh rings once for all.
	for i := 0; i < 10; i++ {
		require.NoError(t, send(uint64(i), FlagDefer, ok))
	}
	assert.Zero(t, doorbells(), "doorbells after ten deferred posts")
	require.NoError(t, send(10, 0, ok))
	assert.Equal(t, uint64(1), doorbells(), "doorbells after the chain ended")
	// Deferred posts, then one that fails inline: the deferred ones still
	// go (one doorbell); the failed one is not posted.
	for i := 11; i < 14; i++ {
		require.NoError(t, send(uint64(i), FlagDefer, ok))
	}
	bad := []SGE{{Addr: p.amr.Addr(), Length: 16, LKey: p.amr.LKey() ^ 0x5a5a}}
	err := send(99, 0, bad)
	var pe *PostError
	require.ErrorAs(t, err, &pe, "post with a bad key")
	assert.ErrorIs(t, err, ErrPrivileges, "a key no MR has")
	assert.Equal(t, uint64(99), pe.WRID)
	assert.Equal(t, uint64(2), doorbells(), "doorbells after the failed post")
	// Too many SGEs: refused before the ring.
	five := []SGE{ok[0], ok[0], ok[0], ok[0], ok[0]}
	assert.ErrorIs(t, send(98, 0, five), ErrInvalid, "five SGEs")
	// A deferred post and Ring.
	require.NoError(t, send(14, FlagDefer, ok))
	require.NoError(t, p.a.Ring())
	assert.Equal(t, uint64(3), doorbells(), "doorbells after Ring")
	// Exactly 15 sends complete, 0..14, in order; 98 and 99 never do.
	wcs := make([]WC, 32)
	got := 0
	for got < 15 {
		n := pollWait(t, p.acq, wcs)
		for _, wc := range wcs[:n] {
			require.Equal(t, WCSuccess, wc.Status, "%+v", wc)
			require.Equal(t, uint64(got), wc.WRID, "completion order")
			got++
		}
	}
	quiet(t, p.acq)
}

// Every posted request completes exactly once, through a receive too small,
// a QP moved to ERR and QPs destroyed with work outstanding.
func suiteExactlyOnce(t *testing.T, d *Device) {
	ctx := context.Background()
	seen := map[uint64]WC{}
	// reap polls cq until every id in ids has completed, failing on a
	// second completion of any wr_id.
	reap := func(cq *CQ, ids ...uint64) {
		t.Helper()
		wcs := make([]WC, 16)
		missing := func() bool {
			for _, id := range ids {
				if _, ok := seen[id]; !ok {
					return true
				}
			}
			return false
		}
		for missing() {
			n := pollWait(t, cq, wcs)
			for _, wc := range wcs[:n] {
				if prev, dup := seen[wc.WRID]; dup {
					t.Fatalf("wr_id %#x completed twice: %+v then %+v", wc.WRID, prev, wc)
				}
				seen[wc.WRID] = wc
			}
		}
	}
	ids := func(base uint64, n int) []uint64 {
		out := make([]uint64, n)
		for i := range out {
			out[i] = base + uint64(i)
		}
		return out
	}

	// A receive too small: the receiver's completes with LOC_LEN_ERR, the
	// sender's with an error; the other receives flush.
	p := newPair(t, d, RC, 16, 4096)
	for i := 0; i < 4; i++ {
		size := 4096
		if i == 0 {
			size = 64
		}
		if _, err := p.b.PostRecv([]RecvWR{{WRID: 0x100 + uint64(i), SGEs: []SGE{p.bmr.SGE(i*4096, size)}}}, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.a.PostSend([]SendWR{{WRID: 0x200, SGEs: []SGE{p.amr.SGE(0, 1000)}}}, 0); err != nil {
		t.Fatal(err)
	}
	reap(p.bcq, 0x100)
	if wc := seen[0x100]; wc.Status != WCLocLenErr {
		t.Fatalf("receive into 64 bytes of a 1000-byte message: %+v, want LOC_LEN_ERR", wc)
	}
	reap(p.acq, 0x200)
	if wc := seen[0x200]; wc.Status == WCSuccess {
		t.Fatalf("send into a short receive succeeded: %+v", wc)
	}
	// The receiver's QP is in error now (the device may have flushed its
	// other receives already): they complete with WR_FLUSH_ERR, once.
	if err := p.b.SetError(ctx); err != nil {
		t.Fatal(err)
	}
	reap(p.bcq, ids(0x101, 3)...)
	for i := 1; i < 4; i++ {
		if wc := seen[0x100+uint64(i)]; wc.Status != WCFlushErr {
			t.Fatalf("receive %d after ERR: %+v, want WR_FLUSH_ERR", i, wc)
		}
	}
	if _, err := p.b.PostRecv([]RecvWR{{WRID: 0x1ff, SGEs: []SGE{p.bmr.SGE(0, 64)}}}, 0); !errors.Is(err, ErrQPState) {
		t.Fatalf("post to a QP in ERR: %v, want ErrQPState", err)
	}

	// QPs destroyed with work outstanding: receives nobody sends to, and
	// RC sends to a peer with no receives (it waits for one forever).
	q := newPair(t, d, RC, 16, 1024)
	for i := 0; i < 8; i++ {
		if _, err := q.b.PostRecv([]RecvWR{{WRID: 0x300 + uint64(i), SGEs: []SGE{q.bmr.SGE(i*1024, 1024)}}}, 0); err != nil {
			t.Fatal(err)
		}
	}
	r := newPair(t, d, RC, 16, 1024)
	for i := 0; i < 4; i++ {
		if _, err := r.a.PostSend([]SendWR{{WRID: 0x400 + uint64(i), SGEs: []SGE{r.amr.SGE(0, 100)}}}, 0); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	if n, _ := r.acq.Poll(make([]WC, 4)); n != 0 {
		t.Fatalf("sends completed without a receive at the peer")
	}
	if err := q.b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.a.Close(); err != nil {
		t.Fatal(err)
	}
	reap(q.bcq, ids(0x300, 8)...)
	reap(r.acq, ids(0x400, 4)...)
	for id, wc := range seen {
		if id >= 0x300 && wc.Status != WCFlushErr {
			t.Fatalf("wr_id %#x after destroy: %+v, want WR_FLUSH_ERR", id, wc)
		}
	}
	time.Sleep(200 * time.Millisecond)
	for _, cq := range []*CQ{p.acq, p.bcq, q.acq, q.bcq, r.acq, r.bcq} {
		if n, _ := cq.Poll(make([]WC, 8)); n != 0 {
			t.Fatalf("CQ %d: completions after all were counted", cq.handle)
		}
	}
}

// Wait sleeps on the CQ interrupt and wakes for a completion; it gives up
// at its deadline.
func suiteWaitCQ(t *testing.T, d *Device) {
	p := newPair(t, d, RC, 16, 1024)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	err := p.bcq.Wait(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait on an idle CQ: %v, want a deadline error", err)
	}
	if _, err := p.b.PostRecv([]RecvWR{{WRID: 1, SGEs: []SGE{p.bmr.SGE(0, 1024)}}}, 0); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		done <- p.bcq.Wait(ctx)
	}()
	time.Sleep(100 * time.Millisecond)
	if _, err := p.a.PostSend([]SendWR{{WRID: 2, SGEs: []SGE{p.amr.SGE(0, 10)}}}, 0); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Wait: %v", err)
	}
	wcs := make([]WC, 2)
	if n, err := p.bcq.Poll(wcs); n != 1 || err != nil || wcs[0].WRID != 1 {
		t.Fatalf("after Wait: %d %v %+v", n, err, wcs[:n])
	}
	if st := p.bcq.Stats(); st.Interrupts == 0 {
		t.Fatalf("Wait returned without an interrupt: %+v", st)
	}
}

// An RC message longer than the receive it lands in fails both QPs (the
// error QEMU's device can produce: it runs no one-sided operation): the
// receiver's LOC_LEN_ERR, once polled, puts it in ERR in State, and the
// device agrees; the sender, whose completion is not polled, is in ERR
// on the device, which QueryState reports and State follows. Posts on
// either are refused.
func suiteAFailedRCQPIsInERRInStateAndOnTheDevice(t *testing.T, d *Device) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := newPair(t, d, RC, 16, 4096)
	_, err := p.b.PostRecv([]RecvWR{{WRID: 0x10, SGEs: []SGE{p.bmr.SGE(0, 64)}}}, 0)
	require.NoError(t, err)
	_, err = p.a.PostSend([]SendWR{{WRID: 0x20, SGEs: []SGE{p.amr.SGE(0, 1000)}}}, 0)
	require.NoError(t, err)

	wcs := make([]WC, 4)
	n := pollWait(t, p.bcq, wcs)
	require.Equal(t, 1, n)
	require.Equal(t, WCLocLenErr, wcs[0].Status, "%+v", wcs[0])
	assert.Equal(t, StateErr, p.b.State(), "the receiver once its error is polled")
	st, err := p.b.QueryState(ctx)
	require.NoError(t, err)
	assert.Equal(t, StateErr, st, "the receiver on the device")
	_, err = p.b.PostRecv([]RecvWR{{WRID: 0x11, SGEs: []SGE{p.bmr.SGE(0, 64)}}}, 0)
	assert.ErrorIs(t, err, ErrQPState, "a receive on the receiver")

	// The sender fails when the receiver's answer reaches it.
	for {
		st, err = p.a.QueryState(ctx)
		require.NoError(t, err)
		if st == StateErr {
			break
		}
		require.NoError(t, ctx.Err(), "the device never reported the sender in ERR (last %v)", st)
		time.Sleep(time.Millisecond)
	}
	assert.Equal(t, StateErr, p.a.State(), "the sender after the query")
	_, err = p.a.PostSend([]SendWR{{WRID: 0x21, SGEs: []SGE{p.amr.SGE(0, 8)}}}, 0)
	assert.ErrorIs(t, err, ErrQPState, "a send on the sender")
	n = pollWait(t, p.acq, wcs)
	require.Equal(t, 1, n)
	assert.Equal(t, uint64(0x20), wcs[0].WRID)
	assert.NotEqual(t, WCSuccess, wcs[0].Status, "%+v", wcs[0])
	quiet(t, p.acq, p.bcq)
}

// quiet asserts that cq has nothing more to poll, after a pause.
func quiet(t *testing.T, cqs ...*CQ) {
	t.Helper()
	time.Sleep(100 * time.Millisecond)
	for _, cq := range cqs {
		n, err := cq.Poll(make([]WC, 8))
		require.NoError(t, err)
		assert.Zero(t, n, "CQ %d: unexpected completions", cq.Handle())
	}
}

// Unsignaled sends the peer received are not outstanding once the send CQ
// has been polled, those after the last signaled one too: with the send
// queue's depth 64 and every 63rd send signaled, 640 sends through, the
// peer receiving each, the sender's QP.Outstanding is 0 after its send CQ
// is polled, and closing it flushes nothing. On QEMU every send completes;
// on a device that honours signaling the signaled ones alone do.
func suiteUnsignaledSendsCompleteOnTime(t *testing.T, d *Device) {
	const depth, total, every, size = 64, 640, 63, 64
	p := newPairSignaling(t, d, RC, depth, size, false)
	for s := 0; s < depth; s++ {
		_, err := p.b.PostRecv([]RecvWR{{WRID: uint64(s), SGEs: []SGE{p.bmr.SGE(s*size, size)}}}, 0)
		require.NoError(t, err)
	}
	wantSendWCs := total / every
	if d.Quirks().Emulated {
		wantSendWCs = total
	}
	swr := make([]SendWR, 8)
	sge := make([]SGE, len(swr))
	wcs := make([]WC, 64)
	sent, recvd, sendWCs := 0, 0, 0
	lastSendWC := -1
	pollSends := func() {
		t.Helper()
		n, err := p.acq.Poll(wcs)
		require.NoError(t, err)
		for _, wc := range wcs[:n] {
			require.Equal(t, WCSuccess, wc.Status, "%+v", wc)
			require.Greater(t, int(wc.WRID), lastSendWC, "send completions in order, once each")
			if !d.Quirks().Emulated {
				require.Equal(t, every-1, int(wc.WRID)%every, "only signaled sends complete: %+v", wc)
			}
			lastSendWC = int(wc.WRID)
			sendWCs++
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for recvd < total {
		require.True(t, time.Now().Before(deadline), "stalled: sent %d, received %d, send completions %d", sent, recvd, sendWCs)
		// Sends within the receives the peer has posted.
		if k := min(len(swr), total-sent, depth-(sent-recvd)); k > 0 {
			for i := range k {
				seq := sent + i
				slot := seq % depth
				fill(p.amr.Bytes()[slot*size:][:size], seq)
				sge[i] = p.amr.SGE(slot*size, size)
				swr[i] = SendWR{WRID: uint64(seq), SGEs: sge[i : i+1]}
				if seq%every == every-1 {
					swr[i].Flags = SendSignaled
				}
			}
			n, err := p.a.PostSend(swr[:k], 0)
			if err != nil {
				require.ErrorIs(t, err, ErrQueueFull, "only the send queue's room may refuse")
			}
			sent += n
		}
		pollSends()
		n, err := p.bcq.Poll(wcs)
		require.NoError(t, err)
		for _, wc := range wcs[:n] {
			slot := recvd % depth
			require.Equal(t, WCSuccess, wc.Status, "%+v", wc)
			require.Equal(t, uint64(slot), wc.WRID, "receives in order")
			require.NoError(t, check(p.bmr.Bytes()[slot*size:][:size], recvd))
			recvd++
			_, err := p.b.PostRecv([]RecvWR{{WRID: uint64(slot), SGEs: []SGE{p.bmr.SGE(slot*size, size)}}}, 0)
			require.NoError(t, err)
		}
		if n == 0 {
			time.Sleep(100 * time.Microsecond)
		}
	}
	// Every send was received: the send CQ's polls account for all of them.
	for {
		pollSends()
		if send, _ := p.a.Outstanding(); send == 0 && sendWCs == wantSendWCs {
			break
		}
		send, _ := p.a.Outstanding()
		require.True(t, time.Now().Before(deadline), "after the peer received all %d: %d sends outstanding, %d send completions of %d", total, send, sendWCs, wantSendWCs)
		time.Sleep(time.Millisecond)
	}
	require.NoError(t, p.a.Close())
	quiet(t, p.acq)
	assert.Zero(t, p.acq.Stats().Flushed, "nothing flushed: every send was delivered")
	assert.Equal(t, wantSendWCs, sendWCs)
}

// When a QP is closed with device completions still in its send CQ, the
// flush completions of what is left come after them, however short the
// Poll slices: each send completes once, the device's in posting order
// and then the flushed, in posting order; nothing is lost or doubled
// across the short polls. (RC sends beyond the receives the peer posted
// wait for one forever.)
func suiteFlushesFollowTheDevicesCompletionsAcrossShortPolls(t *testing.T, d *Device) {
	const delivered, stuck = 5, 7
	p := newPairSignaling(t, d, RC, 16, 256, true)
	for s := range delivered {
		_, err := p.b.PostRecv([]RecvWR{{WRID: uint64(s), SGEs: []SGE{p.bmr.SGE(s*256, 256)}}}, 0)
		require.NoError(t, err)
	}
	n, err := p.a.PostSend(sends(delivered+stuck, 0, 0, p.amr.SGE(0, 100)), 0)
	require.NoError(t, err)
	require.Equal(t, delivered+stuck, n)
	deadline := time.Now().Add(30 * time.Second)
	for p.acq.pendingSends(p.a.handle) < delivered { // the device's completions, unpolled
		require.True(t, time.Now().Before(deadline), "the device completed %d sends of %d", p.acq.pendingSends(p.a.handle), delivered)
		time.Sleep(time.Millisecond)
	}
	require.NoError(t, p.a.Close())
	var got []WC
	buf := make([]WC, 3)
	for i := 0; len(got) < delivered+stuck; i++ {
		require.True(t, time.Now().Before(deadline), "completions so far: %+v", got)
		k, err := p.acq.Poll(buf[:1+i%3]) // slices of 1, 2 and 3
		require.NoError(t, err)
		got = append(got, buf[:k]...)
	}
	for i, wc := range got {
		assert.Equal(t, uint64(i), wc.WRID, "completion %d: posting order", i)
		want := WCSuccess
		if i >= delivered {
			want = WCFlushErr
		}
		assert.Equal(t, want, wc.Status, "completion %d (wr %d): the device's first, then the flushed", i, wc.WRID)
	}
	quiet(t, p.acq)
	st := p.acq.Stats()
	assert.Equal(t, uint64(stuck), st.Flushed)
	assert.Zero(t, st.Dropped)
}

// Closing a QP flushes each send outstanding exactly once: one send, and
// a full send queue (its depth; one more is refused with ErrQueueFull),
// with no receive at the peer (RC: they wait for one forever).
func suiteCloseFlushesEachSendOutstandingOnceFromOneToTheQueueDepth(t *testing.T, d *Device) {
	const depth = 16
	for _, outstanding := range []int{1, depth} {
		t.Run(fmt.Sprint(outstanding), func(t *testing.T) {
			p := newPairSignaling(t, d, RC, depth, 256, true)
			n, err := p.a.PostSend(sends(outstanding, 100, 0, p.amr.SGE(0, 64)), 0)
			require.NoError(t, err)
			require.Equal(t, outstanding, n)
			if outstanding == depth {
				_, err := p.a.PostSend(sends(1, 999, 0, p.amr.SGE(0, 64)), 0)
				require.ErrorIs(t, err, ErrQueueFull, "one past the depth")
			}
			send, _ := p.a.Outstanding()
			require.Equal(t, outstanding, send)
			require.NoError(t, p.a.Close())
			var got []WC
			buf := make([]WC, depth+4)
			deadline := time.Now().Add(30 * time.Second)
			for len(got) < outstanding {
				require.True(t, time.Now().Before(deadline), "completions so far: %+v", got)
				k, err := p.acq.Poll(buf)
				require.NoError(t, err)
				got = append(got, buf[:k]...)
			}
			require.Len(t, got, outstanding)
			for i, wc := range got {
				assert.Equal(t, uint64(100+i), wc.WRID, "posting order")
				assert.Equal(t, WCFlushErr, wc.Status)
				assert.Equal(t, p.a.QPN(), wc.QPN)
			}
			quiet(t, p.acq)
			assert.Equal(t, uint64(outstanding), p.acq.Stats().Flushed)
		})
	}
}
