//go:build guest

package vfrdma

import (
	"context"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma/event"
)

// eventRig is n RC connections on one device; every QP has a CQ of its
// own, so n connections make 2n CQs: cqs[2i] is sender i's, cqs[2i+1]
// receiver i's.
type eventRig struct {
	d         *Device
	pd        *PD
	senders   []*QP
	receivers []*QP
	cqs       []*CQ
	smr, rmr  *MR
	depth     int
	slot      int
}

func newEventRig(t *testing.T, d *Device, n, depth int, cfg func(i int, send bool, c *QPConfig)) *eventRig {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := &eventRig{d: d, depth: depth, slot: 1024}
	var err error
	r.pd, err = d.AllocPD(ctx)
	require.NoError(t, err)
	r.smr, err = r.pd.AllocMR(ctx, n*depth*r.slot, AccessLocalWrite)
	require.NoError(t, err)
	r.rmr, err = r.pd.AllocMR(ctx, n*depth*r.slot, AccessLocalWrite)
	require.NoError(t, err)
	mk := func(i int, send bool) *QP {
		cq, err := d.CreateCQ(ctx, 2*depth)
		require.NoError(t, err)
		r.cqs = append(r.cqs, cq)
		c := QPConfig{Type: RC, SendCQ: cq, RecvCQ: cq, SendDepth: depth, RecvDepth: depth}
		if cfg != nil {
			cfg(i, send, &c)
		}
		qp, err := r.pd.CreateQP(ctx, &c)
		require.NoError(t, err)
		return qp
	}
	for i := 0; i < n; i++ {
		s, q := mk(i, true), mk(i, false)
		require.NoError(t, s.Connect(ctx, Remote{QPN: q.QPN(), GID: d.GID()}, 0))
		require.NoError(t, q.Connect(ctx, Remote{QPN: s.QPN(), GID: d.GID()}, 0))
		r.senders = append(r.senders, s)
		r.receivers = append(r.receivers, q)
	}
	return r
}

// postRecvs gives receiver i k buffers, ids base..base+k-1.
func (r *eventRig) postRecvs(t *testing.T, i, k int, base uint64) {
	t.Helper()
	wrs := make([]RecvWR, k)
	for j := range wrs {
		s := (int(base) + j) % r.depth
		wrs[j] = RecvWR{WRID: base + uint64(j), SGEs: []SGE{r.rmr.SGE((i*r.depth+s)*r.slot, r.slot)}}
	}
	_, err := r.receivers[i].PostRecv(wrs, 0)
	require.NoError(t, err)
}

// send posts k messages on connection i as one chain, ids base..,
// each filled with its id's pattern.
func (r *eventRig) send(t *testing.T, i, k int, base uint64) {
	t.Helper()
	require.NoError(t, r.sendErr(i, k, base))
}

func (r *eventRig) sendErr(i, k int, base uint64) error {
	wrs := make([]SendWR, k)
	for j := range wrs {
		id := base + uint64(j)
		off := (i*r.depth + int(id)%r.depth) * r.slot
		fill(r.smr.Bytes()[off:off+100], int(id))
		wrs[j] = SendWR{WRID: id, SGEs: []SGE{r.smr.SGE(off, 100)}}
	}
	_, err := r.senders[i].PostSend(wrs, 0)
	return err
}

func (r *eventRig) waitSet(t *testing.T, kind event.Kind) *event.WaitSet {
	t.Helper()
	ws, err := event.NewWaitSet(kind)
	require.NoError(t, err)
	for _, cq := range r.cqs {
		require.NoError(t, ws.Add(cq.Source()))
	}
	t.Cleanup(func() {
		for _, cq := range r.cqs {
			_ = ws.Remove(cq.Source())
		}
		_ = ws.Close()
	})
	return ws
}

// Rule 3 (wait set) with real interrupts: a wait set over the 16 CQs of 8
// connections sleeps when all are idle and wakes for every burst, on any
// connection; the poll set beside it names exactly the two CQs of the
// burst's connection (no false negative, and no CQ left with work), and
// every completion and byte arrives.
func TestWaitSetWakesForEveryBurstAcross16CQs(t *testing.T) {
	d := openGuest(t)
	const conns, depth, bursts = 8, 32, 48
	r := newEventRig(t, d, conns, depth, nil)
	ws := r.waitSet(t, event.FD)
	ps := event.NewPollSet[int]()
	for i, cq := range r.cqs {
		require.NoError(t, ps.Add(cq.Source(), i))
	}
	for i := 0; i < conns; i++ {
		r.postRecvs(t, i, depth, 0)
	}
	sent := make([]uint64, conns)
	wcs := make([]WC, 16)
	ready := make([]int, 16)
	var lat []time.Duration
	sleeps := 0
	for b := 0; b < bursts; b++ {
		i, k := (b*5)%conns, 1+b%4
		// Quiet: nothing pending, so the Wait below must sleep.
		require.NoError(t, ws.TryWait(), "burst %d: a quiet set", b)
		posted := make(chan time.Time, 1)
		perr := make(chan error, 1)
		go func(i, k int, base uint64) {
			time.Sleep(5 * time.Millisecond)
			posted <- time.Now()
			perr <- r.sendErr(i, k, base)
		}(i, k, sent[i])
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		require.NoError(t, ws.Wait(ctx), "burst %d on connection %d: no wake-up", b, i)
		cancel()
		lat = append(lat, time.Since(<-posted))
		require.NoError(t, <-perr)
		sleeps++
		// Drain through the poll set until the burst is whole: k sends
		// and k receives.
		seen := map[int]bool{}
		sends, recvs := 0, 0
		for sends < k || recvs < k {
			n, err := ps.Poll(ready)
			require.NoError(t, err)
			if n == 0 {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				require.NoError(t, ws.Wait(ctx), "burst %d: %d/%d sends, %d/%d receives", b, sends, k, recvs, k)
				cancel()
				continue
			}
			for _, c := range ready[:n] {
				seen[c] = true
				m, err := r.cqs[c].Poll(wcs)
				require.NoError(t, err)
				for _, wc := range wcs[:m] {
					require.Equal(t, WCSuccess, wc.Status, "%+v", wc)
					switch c {
					case 2 * i:
						require.Equal(t, sent[i]+uint64(sends), wc.WRID, "send order")
						sends++
					case 2*i + 1:
						require.Equal(t, sent[i]+uint64(recvs), wc.WRID, "receive order")
						s := int(wc.WRID) % depth
						off := (i*depth + s) * r.slot
						require.NoError(t, check(r.rmr.Bytes()[off:off+int(wc.ByteLen)], int(wc.WRID)))
						recvs++
					default:
						t.Fatalf("burst %d on connection %d: a completion on CQ #%d: %+v", b, i, c, wc)
					}
				}
			}
		}
		assert.True(t, seen[2*i] && seen[2*i+1], "burst %d: the poll set named %v, want the CQs of connection %d", b, seen, i)
		r.postRecvs(t, i, k, sent[i]+uint64(depth))
		sent[i] += uint64(k)
	}
	for _, cq := range r.cqs {
		n, err := cq.Poll(wcs)
		require.NoError(t, err)
		assert.Zero(t, n, "CQ %d: left over", cq.Handle())
	}
	slices.Sort(lat)
	st := ps.Stats()
	t.Logf("wait set over %d CQs: %d bursts, %d sleeps, wake-up latency (post to Wait's return) p50 %v p90 %v max %v; poll set: %d polls, %d checks, %d idled, %d woken",
		len(r.cqs), bursts, sleeps, lat[len(lat)/2], lat[len(lat)*9/10], lat[len(lat)-1], st.Polls, st.Checked, st.Idled, st.Woken)
}

// Rule 3 and 4 (fd, trywait): the wait set's fd in an epoll instance the
// test owns is not readable after TryWait succeeds, becomes readable for a
// completion, stays readable while completions are queued (TryWait says
// ErrAgain), and is cleared by the TryWait that follows the drain: no
// spinning fd. A CQ's own fd (the per-CQ style) behaves the same in the
// same epoll instance.
func TestWaitSetFDInEpollNeverSpins(t *testing.T) {
	d := openGuest(t)
	r := newEventRig(t, d, 2, 16, nil)
	ws := r.waitSet(t, event.FD)
	r.postRecvs(t, 1, 16, 0)

	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	require.NoError(t, err)
	defer unix.Close(ep)
	setFD, err := ws.FD()
	require.NoError(t, err)
	// FD hands out the caller's own dup.
	defer unix.Close(setFD)
	rcq := r.cqs[3] // receiver 1's CQ
	cqFD, err := rcq.FD()
	require.NoError(t, err)
	defer unix.Close(cqFD)
	require.NoError(t, unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, setFD, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(setFD)}))
	require.NoError(t, unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, cqFD, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(cqFD)}))
	evs := make([]unix.EpollEvent, 4)
	readable := func(ms int) []int32 {
		for {
			n, err := unix.EpollWait(ep, evs, ms)
			if err == unix.EINTR {
				continue
			}
			require.NoError(t, err)
			var fds []int32
			for _, e := range evs[:n] {
				fds = append(fds, e.Fd)
			}
			sort.Slice(fds, func(a, b int) bool { return fds[a] < fds[b] })
			return fds
		}
	}
	// until waits for both fds, collecting what epoll reports readable.
	until := func(ms int) []int32 {
		got := map[int32]bool{}
		deadline := time.Now().Add(time.Duration(ms) * time.Millisecond)
		for len(got) < 2 && time.Now().Before(deadline) {
			for _, fd := range readable(100) {
				got[fd] = true
			}
		}
		var fds []int32
		for fd := range got {
			fds = append(fds, fd)
		}
		sort.Slice(fds, func(a, b int) bool { return fds[a] < fds[b] })
		return fds
	}
	drain := func() int {
		total := 0
		wcs := make([]WC, 16)
		for _, cq := range r.cqs {
			n, err := cq.Poll(wcs)
			require.NoError(t, err)
			total += n
		}
		return total
	}
	want := []int32{int32(min(setFD, cqFD)), int32(max(setFD, cqFD))}

	require.NoError(t, event.TryWait(ws, rcq), "nothing pending")
	assert.Empty(t, readable(0), "readable after a successful TryWait")

	for round := 0; round < 5; round++ {
		r.send(t, 1, 1, uint64(round))
		assert.Equal(t, want, until(20000), "round %d: a completion makes both fds readable", round)
		// Not drained: still readable, and TryWait says so.
		time.Sleep(20 * time.Millisecond)
		assert.ErrorIs(t, event.TryWait(ws, rcq), event.ErrAgain, "round %d: completions queued", round)
		assert.Equal(t, want, readable(0), "round %d: readable while completions are queued", round)
		got := 0
		for got < 2 { // the send's and the receive's
			got += drain()
		}
		require.NoError(t, event.TryWait(ws, rcq), "round %d: drained", round)
		assert.Empty(t, readable(0), "round %d: the fd spins after a successful TryWait", round)
	}
}

// Rule 2 (counters): counters bound to sends and receives match the wr_id
// count exactly. The send counter counts as the service polls its CQs; the
// receive counter's CQ is driven by the counter alone (nobody polls it),
// and Counter.Wait sleeps on its interrupt until the threshold. Flushed
// receives count as errors, and a waiter sees the error value move.
func TestCountersMatchTheWRIDCountExactly(t *testing.T) {
	d := openGuest(t)
	const conns, depth, per = 2, 64, 300
	sends, recvs := event.NewCounter(), event.NewCounter()
	r := newEventRig(t, d, conns, depth, func(i int, send bool, c *QPConfig) {
		if send {
			c.SendCounter = sends
		} else {
			c.RecvCounter = recvs
		}
	})
	for i := 0; i < conns; i++ {
		require.NoError(t, r.cqs[2*i+1].SetMode(CQCounted))
		require.NoError(t, recvs.Drive(r.cqs[2*i+1].Source()))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	wcs := make([]WC, 64)
	done := 0
	for i := 0; i < conns; i++ {
		for base := 0; base < per; base += depth / 2 {
			k := min(depth/2, per-base)
			r.postRecvs(t, i, k, uint64(base))
			r.send(t, i, k, uint64(base))
			for got := 0; got < k; {
				n, err := r.cqs[2*i].Poll(wcs)
				require.NoError(t, err)
				for _, wc := range wcs[:n] {
					require.Equal(t, WCSuccess, wc.Status)
					require.Equal(t, uint64(base+got), wc.WRID)
					got++
				}
				if n == 0 {
					require.NoError(t, r.cqs[2*i].Wait(ctx))
				}
			}
			done += k
			assert.Equal(t, uint64(done), sends.Value(), "send counter after %d send completions", done)
			// Counter-only: the receive counter gets there by itself.
			require.NoError(t, recvs.Wait(ctx, uint64(done)))
		}
	}
	v, err := recvs.Read()
	require.NoError(t, err)
	assert.Equal(t, uint64(conns*per), v, "receive counter")
	assert.Equal(t, uint64(conns*per), sends.Value(), "send counter")
	assert.Zero(t, sends.Errors())
	assert.Zero(t, recvs.Errors())
	// A CQ in CQCounted mode refuses Poll: its completions went to counters.
	_, err = r.cqs[1].Poll(wcs)
	assert.ErrorIs(t, err, ErrBusy)

	// Ten receives flushed by Close count as ten errors, and a waiter
	// for more than will ever come is told the error value moved.
	r.postRecvs(t, 0, 10, 1000)
	werr := make(chan error, 1)
	go func() { werr <- recvs.Wait(ctx, uint64(conns*per+1000)) }()
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, r.receivers[0].Close())
	assert.ErrorIs(t, <-werr, event.ErrCounter)
	require.Eventually(t, func() bool {
		e, err := recvs.ReadErr()
		return err == nil && e == 10
	}, 10*time.Second, 10*time.Millisecond, "flushed receives as errors: %d", recvs.Errors())
	assert.Equal(t, uint64(conns*per), recvs.Value(), "flushes are not successes")
}

// Rule 5 (close): a set with members, a CQ in a set and a counter bound to
// a QP refuse Close with ErrBusy; once emptied and unbound they close, and
// a goroutine blocked in Wait (wait set of each kind, counter) is released
// with ErrClosed. Nothing leaks: the fds the sets made are gone.
func TestCloseRulesAndBlockedWaitersReleased(t *testing.T) {
	d := openGuest(t)
	c := event.NewCounter()
	r := newEventRig(t, d, 1, 16, func(i int, send bool, cfg *QPConfig) {
		if send {
			cfg.SendCounter = c
		}
	})
	lone, err := d.CreateCQ(context.Background(), 16) // no QP holds it
	require.NoError(t, err)
	before := measure(t)
	for _, kind := range []event.Kind{event.FD, event.Chan} {
		ws, err := event.NewWaitSet(kind)
		require.NoError(t, err)
		require.NoError(t, ws.Add(lone.Source()))
		assert.ErrorIs(t, ws.Add(lone.Source()), ErrBusy, "%v: added twice", kind)
		assert.ErrorIs(t, ws.Close(), ErrBusy, "%v: closed with a member", kind)
		assert.ErrorIs(t, lone.Close(), ErrBusy, "%v: a CQ in a set closed", kind)

		werr := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			werr <- ws.Wait(ctx)
		}()
		time.Sleep(50 * time.Millisecond)
		select {
		case err := <-werr:
			t.Fatalf("%v: Wait on an idle set returned: %v", kind, err)
		default:
		}
		require.NoError(t, ws.Remove(lone.Source()))
		require.NoError(t, ws.Close())
		select {
		case err := <-werr:
			assert.ErrorIs(t, err, ErrClosed, "%v: the blocked waiter", kind)
		case <-time.After(20 * time.Second):
			t.Fatalf("%v: Close did not release the waiter", kind)
		}
		assert.NoError(t, ws.Close(), "%v: Close twice", kind)
		assert.ErrorIs(t, ws.TryWait(), ErrClosed, "%v: TryWait after Close", kind)
	}

	assert.ErrorIs(t, c.Close(), ErrBusy, "a counter bound to a QP closed")
	werr := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		werr <- c.Wait(ctx, 1)
	}()
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, r.senders[0].Close()) // releases the binding
	require.NoError(t, c.Close())
	select {
	case err := <-werr:
		assert.ErrorIs(t, err, ErrClosed, "the blocked counter waiter")
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not release the counter's waiter")
	}
	// A CQ with its own fd closes, and its wait object goes with it; the
	// fd FD handed out is the caller's dup, closed here.
	loneFD, err := lone.FD()
	require.NoError(t, err)
	require.NoError(t, lone.Close())
	require.NoError(t, unix.Close(loneFD))
	require.NoError(t, r.receivers[0].Close())
	for _, cq := range r.cqs {
		require.NoError(t, cq.Close())
	}
	after := measure(t)
	assert.LessOrEqual(t, after.fds, before.fds, "fds leaked by sets, counters or CQ fds")
}

// Rule 1 (poll set) with the device: members that stay empty go idle (one
// arm each) and cost no check; a completion on one wakes exactly its
// member through the notification ring, and Poll names it; none is ever
// missed.
func TestPollSetIdleMembersWakeOnTheirCompletion(t *testing.T) {
	d := openGuest(t)
	const conns = 8
	r := newEventRig(t, d, conns, 16, nil)
	ps := event.NewPollSet[int]()
	ps.SetIdleAfter(1)
	for i, cq := range r.cqs {
		require.NoError(t, ps.Add(cq.Source(), i))
	}
	ws := r.waitSet(t, event.FD)
	out := make([]int, 16)
	n, err := ps.Poll(out)
	require.NoError(t, err)
	require.Zero(t, n)
	require.EqualValues(t, len(r.cqs), ps.Stats().Idled, "all idle after an empty poll")
	checked := ps.Stats().Checked
	for k := 0; k < 100; k++ {
		n, err := ps.Poll(out)
		require.NoError(t, err)
		require.Zero(t, n)
	}
	assert.Equal(t, checked, ps.Stats().Checked, "idle members were checked")

	wcs := make([]WC, 8)
	for round, i := range []int{3, 0, 7, 3} {
		r.postRecvs(t, i, 1, uint64(round))
		r.send(t, i, 1, uint64(round))
		seen := map[int]int{}
		for got := 0; got < 2; {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			require.NoError(t, ws.Wait(ctx))
			cancel()
			n, err := ps.Poll(out)
			require.NoError(t, err)
			for _, c := range out[:n] {
				require.Contains(t, []int{2 * i, 2*i + 1}, c, "round %d: the poll set named CQ #%d", round, c)
				m, err := r.cqs[c].Poll(wcs)
				require.NoError(t, err)
				seen[c] += m
				got += m
			}
		}
		assert.Equal(t, map[int]int{2 * i: 1, 2*i + 1: 1}, seen, "round %d", round)
	}
	assert.GreaterOrEqual(t, ps.Stats().Woken, uint64(4), "idle members woken")
}

// Rule 5 at teardown: Device.Close destroys CQs still in a wait set rather
// than leave them on the device, and a goroutine blocked in the set's Wait
// wakes and is told the CQ is gone; the set then empties and closes.
func TestDeviceCloseReleasesAWaiterOnItsCQs(t *testing.T) {
	d, err := Open(guestBDF(t), nil)
	require.NoError(t, err)
	cq, err := d.CreateCQ(context.Background(), 16)
	require.NoError(t, err)
	ws, err := event.NewWaitSet(event.FD)
	require.NoError(t, err)
	require.NoError(t, ws.Add(cq.Source()))
	werr := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for {
			if err := ws.Wait(ctx); err != nil {
				werr <- err
				return
			}
		}
	}()
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, d.Close())
	select {
	case err := <-werr:
		assert.ErrorIs(t, err, ErrClosed, "the waiter on a destroyed CQ")
	case <-time.After(20 * time.Second):
		t.Fatal("Device.Close left the waiter asleep")
	}
	require.NoError(t, ws.Remove(cq.Source()))
	require.NoError(t, ws.Close())
}
