package vfrdma_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/event"
)

// The device disarms a CQ when it notifies, so the driver must arm it
// again the next time a wait set sleeps on it: every round of TryWait,
// completion and Wait wakes, not only the first.
func TestAWaitSetIsWokenByACompletionInEveryRoundNotOnlyTheFirst(t *testing.T) {
	d, _ := openModel(t, vmware(18), nil)
	ctx := ctxT(t)
	p := newRCPair(t, ctx, d, true, vfrdma.AccessLocalWrite)
	ws, err := event.NewWaitSet(event.FD)
	require.NoError(t, err)
	t.Cleanup(func() { ws.Close() })
	require.NoError(t, ws.Add(p.cq.Source()))

	wcs := make([]vfrdma.WC, 8)
	for round := range 5 {
		_, err := p.b.PostRecv([]vfrdma.RecvWR{{WRID: uint64(round), SGEs: []vfrdma.SGE{p.mr.SGE(0, 64)}}}, 0)
		require.NoError(t, err)
		// Take what is there until TryWait lets the set sleep (it arms).
		for {
			err := ws.TryWait()
			if err == nil {
				break
			}
			require.True(t, errors.Is(err, event.ErrAgain), "round %d: TryWait: %v", round, err)
			_, err = p.cq.Poll(wcs)
			require.NoError(t, err)
		}
		_, err = p.a.PostSend([]vfrdma.SendWR{{WRID: uint64(round), SGEs: []vfrdma.SGE{p.mr.SGE(64, 64)}}}, 0)
		require.NoError(t, err)
		wctx, cancel := context.WithTimeout(ctx, 15*time.Second) // a hang guard
		err = ws.Wait(wctx)
		cancel()
		require.NoError(t, err, "round %d: the completion did not wake the wait set", round)
		for got := 0; got < 2; { // the send's and the receive's
			k, err := p.cq.Poll(wcs)
			require.NoError(t, err)
			got += k
		}
	}
}
