//go:build guest

package vfrdma

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/event"
	"github.com/vfrdma/vfrdma/qemu/guestctl"
	"github.com/vfrdma/vfrdma/qemu/proto"
)

func sum(v []int) int {
	s := 0
	for _, x := range v {
		s += x
	}
	return s
}

func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Between two VMs: vm0 serves 8 RC connections from one wait set (a CQ per
// connection, a poll set to find the ones with work) and sleeps whenever
// nothing is pending; vm1 sends 50k messages over them. Every byte is
// checked, every connection's messages arrive in order, and the receiver
// does not spin: each sleep is taken only after TryWait said it was safe,
// and wake-ups that find nothing are few. Its CPU time is reported.
func TestMultiVMWaitSetReceiver(t *testing.T) {
	bdf := guestBDF(t)
	vm, err1 := strconv.Atoi(os.Getenv(proto.EnvVM))
	vms, err2 := strconv.Atoi(os.Getenv(proto.EnvVMs))
	require.True(t, err1 == nil && err2 == nil && vms >= 2, "this test needs a two-VM run (pvvm -vms 2)")
	if vm > 1 {
		return
	}
	d, err := Open(bdf, nil)
	require.NoError(t, err)
	defer d.Close()
	c, err := guestctl.Open()
	require.NoError(t, err)
	defer c.Close()
	p := &vmPeer{c: c, vm: vm, peer: 1 - vm}

	const (
		conns   = 8
		depth   = 64 // receives posted per connection
		window  = 16 // sends in flight per connection
		slot    = 4096
		perConn = 6250 // 50k messages in all
	)
	sizes := []int{4, 17, 64, 100, 512, 1000, 1500, 4096}
	size := func(i, seq int) int { return sizes[(seq*5+i)%len(sizes)] }
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pd, err := d.AllocPD(ctx)
	require.NoError(t, err)
	mr, err := pd.AllocMR(ctx, conns*depth*slot, AccessLocalWrite)
	require.NoError(t, err)
	cqs := make([]*CQ, conns)
	qps := make([]*QP, conns)
	mine := make([]vmAddr, conns)
	for i := range qps {
		cqs[i], err = d.CreateCQ(ctx, 2*depth)
		require.NoError(t, err)
		qps[i], err = pd.CreateQP(ctx, &QPConfig{Type: RC, SendCQ: cqs[i], RecvCQ: cqs[i], SendDepth: depth, RecvDepth: depth})
		require.NoError(t, err)
		mine[i] = vmAddr{QPN: qps[i].QPN(), GID: d.GID()}
	}
	var theirs []vmAddr
	p.swap(t, "waitset", mine, &theirs)
	require.Len(t, theirs, conns)
	for i, qp := range qps {
		require.NoError(t, qp.Connect(ctx, Remote{QPN: theirs[i].QPN, GID: theirs[i].GID}, 0))
	}
	buf := func(i, s int) int { return (i*depth + s) * slot }

	if vm == 1 {
		// The sender: rounds of a window per connection, each round sent
		// whole and then a pause, so that the receiver (slower under TCG
		// than the sender) drains and sleeps between rounds.
		sent, done := make([]int, conns), make([]int, conns)
		wrs := make([]SendWR, window)
		sges := make([]SGE, window)
		wcs := make([]WC, 32)
		p.barrier(t, "waitset-posted")
		total := 0
		for total < conns*perConn {
			for i, qp := range qps {
				n := min(window, perConn-sent[i])
				for k := 0; k < n; k++ {
					seq := sent[i] + k
					off := buf(i, seq%depth)
					b := mr.Bytes()[off : off+size(i, seq)]
					id := uint32(i<<24 | seq)
					binary.LittleEndian.PutUint32(b, id)
					fill(b[4:], int(id))
					sges[k] = mr.SGE(off, len(b))
					wrs[k] = SendWR{WRID: uint64(seq), SGEs: sges[k : k+1]}
				}
				if n > 0 {
					_, err := qp.PostSend(wrs[:n], 0)
					require.NoError(t, err)
					sent[i] += n
				}
			}
			for total < sum(sent) {
				for i := range qps {
					k, err := cqs[i].Poll(wcs)
					require.NoError(t, err)
					for _, wc := range wcs[:k] {
						require.Equal(t, WCSuccess, wc.Status, "send %+v", wc)
						require.Equal(t, uint64(done[i]), wc.WRID, "send order on connection %d", i)
						done[i]++
						total++
					}
				}
				require.NoError(t, ctx.Err(), "sender stalled at %d", total)
			}
			time.Sleep(20 * time.Millisecond)
		}
		p.barrier(t, "waitset-done")
		return
	}

	// The receiver.
	ws, err := event.NewWaitSet(event.FD)
	require.NoError(t, err)
	ps := event.NewPollSet[int]()
	for i, cq := range cqs {
		require.NoError(t, ws.Add(cq.Source()))
		require.NoError(t, ps.Add(cq.Source(), i))
	}
	rwr := make([]RecvWR, depth)
	rsge := make([]SGE, depth)
	for i, qp := range qps {
		for s := 0; s < depth; s++ {
			rsge[s] = mr.SGE(buf(i, s), slot)
			rwr[s] = RecvWR{WRID: uint64(s), SGEs: rsge[s : s+1]}
		}
		_, err := qp.PostRecv(rwr, 0)
		require.NoError(t, err)
	}
	p.barrier(t, "waitset-posted")
	next := make([]int, conns)
	wcs := make([]WC, 32)
	ready := make([]int, conns)
	recvd, waits, spurious := 0, 0, 0
	woke := false
	cpu0, t0 := cpuTime(t), time.Now()
	for recvd < conns*perConn {
		n, err := ps.Poll(ready)
		require.NoError(t, err)
		got := 0
		for _, i := range ready[:n] {
			k, err := cqs[i].Poll(wcs)
			require.NoError(t, err)
			nr := 0
			for _, wc := range wcs[:k] {
				require.Equal(t, WCSuccess, wc.Status, "receive %+v", wc)
				require.Equal(t, WCRecv, wc.Opcode&WCRecv, "connection %d: a non-receive completion %+v", i, wc)
				s := int(wc.WRID)
				off := buf(i, s)
				b := mr.Bytes()[off : off+int(wc.ByteLen)]
				require.GreaterOrEqual(t, len(b), 4)
				id := int(binary.LittleEndian.Uint32(b))
				require.Equal(t, i<<24|next[i], id, "connection %d: message order", i)
				require.Equal(t, size(i, next[i]), len(b), "message %#x size", id)
				require.NoError(t, check(b[4:], id))
				rsge[nr] = mr.SGE(off, slot)
				rwr[nr] = RecvWR{WRID: uint64(s), SGEs: rsge[nr : nr+1]}
				nr++
				next[i]++
			}
			if nr > 0 {
				_, err := qps[i].PostRecv(rwr[:nr], 0) // one chain, one doorbell
				require.NoError(t, err)
			}
			recvd += k
			got += k
		}
		if woke && got == 0 {
			spurious++ // woken, and nothing to take
		}
		woke = false
		if n > 0 {
			continue
		}
		// Wait does TryWait first: it sleeps only when that says it is
		// safe, and returns at once when something is pending.
		waits++
		if err := ws.Wait(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			require.NoError(t, err)
		}
		require.NoError(t, ctx.Err(), "stalled at %d of %d messages", recvd, conns*perConn)
		woke = true
	}
	el, cpu := time.Since(t0), cpuTime(t)-cpu0
	p.barrier(t, "waitset-done")
	for i, cq := range cqs {
		require.NoError(t, ws.Remove(cq.Source()))
		require.NoError(t, ps.Remove(cq.Source()))
		assert.Equal(t, perConn, next[i], "connection %d", i)
	}
	require.NoError(t, ws.Close())
	st := ps.Stats()
	t.Logf("wait-set receiver: %d connections, %d messages in %v (%.0f msg/s); CPU %v (%.1f µs per message, %.0f%% of the wall time); %d waits (%.3f per message), %d woke to nothing; poll set %d polls, %d checks",
		conns, recvd, el, float64(recvd)/el.Seconds(), cpu, float64(cpu.Microseconds())/float64(recvd), 100*cpu.Seconds()/el.Seconds(), waits, float64(waits)/float64(recvd), spurious, st.Polls, st.Checked)
	// A spinning receiver wakes to nothing about as often as it waits; a
	// sleeping one only when a notification raced a drain.
	assert.Less(t, spurious, max(100, waits/2), "wake-ups that found nothing: the receiver spins")
}
