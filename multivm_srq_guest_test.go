//go:build guest

package vfrdma

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/qemu/guestctl"
	"github.com/vfrdma/vfrdma/qemu/proto"
)

// Between two VMs: four RC QPs per side on one SRQ per side, 100k messages
// of mixed sizes (50k each way), every byte checked, each connection's
// messages in order, every wr_id completed exactly once.
func TestMultiVMSRQ(t *testing.T) {
	bdf := guestBDF(t)
	vm, err1 := strconv.Atoi(os.Getenv(proto.EnvVM))
	vms, err2 := strconv.Atoi(os.Getenv(proto.EnvVMs))
	require.True(t, err1 == nil && err2 == nil && vms >= 2, "this test needs a two-VM run (pvvm -vms 2)")
	if vm > 1 {
		return // VMs past the first two have no peer here
	}
	d, err := Open(bdf, nil)
	require.NoError(t, err)
	defer d.Close()
	c, err := guestctl.Open()
	require.NoError(t, err)
	defer c.Close()
	p := &vmPeer{c: c, vm: vm, peer: 1 - vm}

	const (
		conns   = 4
		depth   = 256      // SRQ receives
		slot    = 16 << 10 // receive buffer
		window  = 16       // sends in flight per connection
		perConn = 12500    // messages each connection sends: 50k per VM
	)
	sizes := []int{4, 5, 8, 63, 64, 65, 100, 1000, 1023, 1024, 1025, 4096, 4097, 9000, slot}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	pd, err := d.AllocPD(ctx)
	require.NoError(t, err)
	scq, err := d.CreateCQ(ctx, 2*conns*window)
	require.NoError(t, err)
	rcq, err := d.CreateCQ(ctx, 2*depth)
	require.NoError(t, err)
	srq, err := pd.CreateSRQ(ctx, &SRQConfig{Depth: depth})
	require.NoError(t, err)
	rmr, err := pd.AllocMR(ctx, depth*slot, AccessLocalWrite)
	require.NoError(t, err)
	smr, err := pd.AllocMR(ctx, conns*window*slot, AccessLocalWrite)
	require.NoError(t, err)
	qps := make([]*QP, conns)
	mine := make([]vmAddr, conns)
	for i := range qps {
		qps[i], err = pd.CreateQP(ctx, &QPConfig{Type: RC, SendCQ: scq, RecvCQ: rcq, SendDepth: window, SRQ: srq})
		require.NoError(t, err)
		mine[i] = vmAddr{QPN: qps[i].QPN(), GID: d.GID()}
	}
	var theirs []vmAddr
	p.swap(t, "srq", mine, &theirs)
	require.Len(t, theirs, conns)
	conn := map[uint32]int{}
	for i, qp := range qps {
		require.NoError(t, qp.Connect(ctx, Remote{QPN: theirs[i].QPN, GID: theirs[i].GID}, 0))
		conn[qp.QPN()] = i
	}
	// Receives go back to the SRQ in one chain per poll: one doorbell.
	posted := make([]bool, depth)
	rwr := make([]RecvWR, 0, depth)
	rsge := make([]SGE, depth)
	repost := func() {
		if len(rwr) == 0 {
			return
		}
		_, err := srq.PostRecv(rwr, 0)
		require.NoError(t, err)
		for _, wr := range rwr {
			posted[wr.WRID] = true
		}
		rwr = rwr[:0]
	}
	post := func(s int) {
		rsge[s] = rmr.SGE(s*slot, slot)
		rwr = append(rwr, RecvWR{WRID: uint64(s), SGEs: rsge[s : s+1]})
	}
	for s := 0; s < depth; s++ {
		post(s)
	}
	repost()
	p.barrier(t, "srq-posted")

	// A message leads with (vm, connection, sequence), which seeds its
	// pattern; its size comes from the same numbers.
	size := func(v, i, seq int) int { return sizes[(seq*7+i*3+v)%len(sizes)] }
	sent, sendDone, next := make([]int, conns), make([]int, conns), make([]int, conns)
	recvd, doneSends := 0, 0
	swr := make([]SendWR, window)
	sge := make([]SGE, window)
	wcs := make([]WC, 64)
	start := time.Now()
	for recvd < conns*perConn || doneSends < conns*perConn {
		progress := false
		for i, qp := range qps {
			n := min(window-(sent[i]-sendDone[i]), perConn-sent[i])
			for k := 0; k < n; k++ {
				seq := sent[i] + k
				sz := size(vm, i, seq)
				off := (i*window + seq%window) * slot
				b := smr.Bytes()[off : off+sz]
				id := uint32(vm<<28 | i<<24 | seq)
				binary.LittleEndian.PutUint32(b, id)
				fill(b[4:], int(id))
				sge[k] = smr.SGE(off, sz)
				swr[k] = SendWR{WRID: uint64(id), SGEs: sge[k : k+1]}
			}
			if n > 0 {
				_, err := qp.PostSend(swr[:n], 0) // one chain, one doorbell
				require.NoError(t, err)
				sent[i] += n
				progress = true
			}
		}
		k, err := scq.Poll(wcs)
		require.NoError(t, err)
		for _, wc := range wcs[:k] {
			require.Equal(t, WCSuccess, wc.Status, "send %+v", wc)
			i := conn[wc.QPN]
			require.Equal(t, uint64(vm<<28|i<<24|sendDone[i]), wc.WRID, "send completion order on connection %d", i)
			sendDone[i]++
			doneSends++
		}
		progress = progress || k > 0
		k, err = rcq.Poll(wcs)
		require.NoError(t, err)
		for _, wc := range wcs[:k] {
			require.Equal(t, WCSuccess, wc.Status, "receive %+v", wc)
			s := int(wc.WRID)
			require.True(t, s < depth && posted[s], "receive %d completed while not posted", wc.WRID)
			posted[s] = false
			i, ok := conn[wc.QPN]
			require.True(t, ok, "a receive on QP %d, not one of ours", wc.QPN)
			b := rmr.Bytes()[s*slot : s*slot+int(wc.ByteLen)]
			require.GreaterOrEqual(t, len(b), 4)
			id := int(binary.LittleEndian.Uint32(b))
			want := p.peer<<28 | i<<24 | next[i]
			require.Equal(t, want, id, "connection %d: message order", i)
			require.Equal(t, size(p.peer, i, next[i]), len(b), "message %#x size", id)
			require.NoError(t, check(b[4:], id))
			next[i]++
			recvd++
			post(s)
		}
		repost()
		progress = progress || k > 0
		if !progress {
			// Sleep on whichever CQ still owes us something; a timeout
			// only means look again, the test's deadline bounds it all.
			cq := rcq
			if recvd == conns*perConn {
				cq = scq
			}
			wctx, wcancel := context.WithTimeout(ctx, 50*time.Millisecond)
			err := cq.Wait(wctx)
			wcancel()
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				require.NoError(t, err)
			}
			require.NoError(t, ctx.Err(), "stalled: received %d, sends done %d of %d", recvd, doneSends, conns*perConn)
		}
	}
	el := time.Since(start)
	p.barrier(t, "srq-done")
	assert.Equal(t, depth, srq.Outstanding())
	snap := srq.Query()
	for _, v := range snap.QPs {
		assert.Equal(t, uint64(perConn), v.Consumed, "QP %d consumed", v.QPN)
	}
	st := srq.DoorbellStats()
	t.Logf("SRQ vm%d<->vm%d: %d connections, %d messages each way in %v (%.0f msg/s each way), %.3f SRQ doorbells per receive",
		vm, p.peer, conns, conns*perConn, el, float64(conns*perConn)/el.Seconds(), float64(st.Doorbells)/float64(conns*perConn))
}
