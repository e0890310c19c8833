//go:build guest

package vfrdma

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Options.PollDoorbell beside waits, in two goroutines: a responder waits
// on its CQ whenever a poll finds nothing; the pinger spins on its own CQ,
// polling with POLL doorbells. On QEMU 7.2 a POLL doorbell that meets the
// completion thread raising an armed CQ's interrupt — any CQ of the device
// — deadlocks the VM (each thread waits on the other's lock; the run ends
// on the bench's timeout: this test did, 4 times in 4, before the rule). So
// with PollDoorbell the driver never arms a CQ on QEMU: Wait polls.
func TestPollDoorbellNeverMeetsAnArmedCQ(t *testing.T) {
	d, err := Open(guestBDF(t), &Options{PollDoorbell: true})
	require.NoError(t, err)
	defer d.Close()
	p := newPair(t, d, RC, 8, 64)
	const rounds = 3000
	wcs := make([]WC, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	recv := func(qp *QP, mr *MR) {
		_, err := qp.PostRecv([]RecvWR{{WRID: 1, SGEs: []SGE{mr.SGE(0, 64)}}}, 0)
		require.NoError(t, err)
	}
	send := func(qp *QP, mr *MR, seq int) {
		mr.Bytes()[256] = byte(seq)
		_, err := qp.PostSend([]SendWR{{WRID: uint64(seq), SGEs: []SGE{mr.SGE(256, 64)}}}, 0)
		require.NoError(t, err)
	}
	waits := 0 // the responder's sleeps; read after it is done
	recv(p.a, p.amr)
	recv(p.b, p.bmr)
	start := time.Now()
	responder := make(chan error, 1)
	bwcs := make([]WC, 4)
	go func() {
		for i := 0; i < rounds; i++ {
			for got := false; !got; {
				n, err := p.bcq.Poll(bwcs)
				if err != nil {
					responder <- err
					return
				}
				for _, wc := range bwcs[:n] {
					got = got || wc.Opcode == WCRecv
				}
				if n == 0 {
					waits++
					if err := p.bcq.Wait(ctx); err != nil {
						responder <- err
						return
					}
				}
			}
			if _, err := p.b.PostRecv([]RecvWR{{WRID: 1, SGEs: []SGE{p.bmr.SGE(0, 64)}}}, 0); err != nil {
				responder <- err
				return
			}
			p.bmr.Bytes()[256] = p.bmr.Bytes()[0]
			if _, err := p.b.PostSend([]SendWR{{WRID: uint64(i), SGEs: []SGE{p.bmr.SGE(256, 64)}}}, 0); err != nil {
				responder <- err
				return
			}
		}
		responder <- nil
	}()
	for i := 0; i < rounds; i++ {
		send(p.a, p.amr, i)
		for got := false; !got; { // spin: POLL doorbells while nothing may be armed
			n, err := p.acq.Poll(wcs)
			require.NoError(t, err)
			for _, wc := range wcs[:n] {
				require.Equal(t, WCSuccess, wc.Status)
				got = got || wc.Opcode == WCRecv
			}
			require.NoError(t, ctx.Err())
			runtime.Gosched() // one vCPU: let the responder run
		}
		require.Equal(t, byte(i), p.amr.Bytes()[0], "the echo of round %d", i)
		recv(p.a, p.amr)
	}
	require.NoError(t, <-responder)
	el := time.Since(start)
	t.Logf("%d round trips in %v (%.1f µs each), %d waits on an empty CQ", rounds, el, float64(el.Microseconds())/rounds, waits)
	assert.Positive(t, waits, "the responder waited while the pinger polled")
}
