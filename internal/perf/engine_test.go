package perf_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/internal/perf"
	"github.com/vfrdma/vfrdma/pvsim"
)

// link is a's QP connected to b's on one model device: a sends into b's
// receive slots of slot bytes.
type link struct {
	d          *vfrdma.Device
	a, b       *vfrdma.QP
	acq, bcq   *vfrdma.CQ
	mr         *vfrdma.MR
	depth      int
	slot       int
	typ        vfrdma.QPType
	ah         *vfrdma.AH
	rwrs       []vfrdma.RecvWR
	rsges      []vfrdma.SGE
	fills, end int
}

func newLink(t *testing.T, typ vfrdma.QPType, opts *vfrdma.Options) *link {
	t.Helper()
	ctx := withTimeout(t, 20*time.Second)
	m, err := pvsim.New(pvsim.Config{})
	require.NoError(t, err)
	d, err := vfrdma.OpenFunction(m, opts)
	if err != nil {
		m.Close()
		require.NoError(t, err)
	}
	t.Cleanup(func() { d.Close() })
	l := &link{d: d, depth: 64, slot: 64 + vfrdma.UDHeaderRoom, typ: typ}
	pd, err := d.AllocPD(ctx)
	require.NoError(t, err)
	l.acq, err = d.CreateCQ(ctx, 2*l.depth)
	require.NoError(t, err)
	l.bcq, err = d.CreateCQ(ctx, 2*l.depth)
	require.NoError(t, err)
	cfg := func(cq *vfrdma.CQ) *vfrdma.QPConfig {
		return &vfrdma.QPConfig{Type: typ, SendCQ: cq, RecvCQ: cq, SendDepth: l.depth, RecvDepth: l.depth, QKey: 7, SignalAll: true}
	}
	l.a, err = pd.CreateQP(ctx, cfg(l.acq))
	require.NoError(t, err)
	l.b, err = pd.CreateQP(ctx, cfg(l.bcq))
	require.NoError(t, err)
	l.mr, err = pd.AllocMR(ctx, 2*l.depth*l.slot, vfrdma.AccessLocalWrite)
	require.NoError(t, err)
	if typ == vfrdma.RC {
		require.NoError(t, l.a.Connect(ctx, vfrdma.Remote{QPN: l.b.QPN(), GID: d.GID()}, 0))
		require.NoError(t, l.b.Connect(ctx, vfrdma.Remote{QPN: l.a.QPN(), GID: d.GID()}, 0))
	} else {
		require.NoError(t, l.a.Connect(ctx, vfrdma.Remote{}, 0))
		require.NoError(t, l.b.Connect(ctx, vfrdma.Remote{}, 0))
		l.ah, err = pd.CreateAH(vfrdma.AHAttr{DGID: d.GID()})
		require.NoError(t, err)
	}
	slots := make([]vfrdma.WC, l.depth)
	for i := range slots {
		slots[i].WRID = uint64(i)
	}
	require.NoError(t, l.repost(slots))
	return l
}

func withTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// repost posts b's receives again, each into the slot its WRID names.
func (l *link) repost(wcs []vfrdma.WC) error {
	l.rwrs, l.rsges = l.rwrs[:0], l.rsges[:0]
	for _, wc := range wcs {
		l.rsges = append(l.rsges, l.mr.SGE(l.depth*l.slot+int(wc.WRID)*l.slot, l.slot))
	}
	for i, wc := range wcs {
		l.rwrs = append(l.rwrs, vfrdma.RecvWR{WRID: wc.WRID, SGEs: l.rsges[i : i+1]})
	}
	_, err := l.b.PostRecv(l.rwrs, 0)
	return err
}

// fill makes request seq a 64-byte SEND from slot seq%depth.
func (l *link) fill(wr *vfrdma.SendWR, sge []vfrdma.SGE, seq int) {
	sge[0] = l.mr.SGE(seq%l.depth*l.slot, 64)
	*wr = vfrdma.SendWR{SGEs: sge[:1]}
	if l.typ == vfrdma.UD {
		wr.AH, wr.RemoteQPN, wr.RemoteQKey = l.ah, l.b.QPN(), 7
	}
	l.fills++
}

// The sender posts its messages in batches of Batch, one doorbell each,
// never more than Window in flight, and times every one; in loopback the
// same loop takes and reposts the receives.
func TestSendPostsBatchesWithinItsWindowAndTimesEveryMessage(t *testing.T) {
	for _, w := range []perf.Wait{perf.Spin, perf.Sleep} {
		t.Run(w.String(), func(t *testing.T) {
			l := newLink(t, vfrdma.RC, nil)
			ctx := withTimeout(t, 20*time.Second)
			const messages, batch, window = 100, 8, 24
			inFlight := 0
			s := perf.Send{QP: l.a, CQ: l.acq, Messages: messages, Batch: batch, Window: window, Depth: l.depth, Wait: w,
				Fill: func(wr *vfrdma.SendWR, sge []vfrdma.SGE, seq int) {
					l.fill(wr, sge, seq)
					inFlight = max(inFlight, l.fills-l.end)
				},
				Done:   func(*vfrdma.WC) error { l.end++; return nil },
				RecvCQ: l.bcq, Repost: l.repost, AllReceived: true}
			r, err := s.Run(ctx)
			require.NoError(t, err)
			assert.Len(t, r.Latency, messages)
			assert.Equal(t, messages, r.Received)
			assert.EqualValues(t, 13, r.Doorbells, "12 batches of 8 and one of 4, a doorbell each")
			assert.LessOrEqual(t, inFlight, window)
			assert.Positive(t, r.Elapsed)
			for _, d := range r.Latency {
				require.Positive(t, d)
			}
		})
	}
}

// A completion Done refuses ends the run with its error; a send that
// never completes ends it once Quiet passed, saying how far it got.
func TestSendStopsAtARefusedCompletionAndWhenNothingCompletes(t *testing.T) {
	l := newLink(t, vfrdma.RC, nil)
	ctx := withTimeout(t, 20*time.Second)
	bad := errors.New("wrong bytes")
	s := perf.Send{QP: l.a, CQ: l.acq, Messages: 10, Batch: 1, Fill: l.fill, Done: func(wc *vfrdma.WC) error {
		if wc.WRID == 3 {
			return bad
		}
		return nil
	}, RecvCQ: l.bcq, Repost: l.repost}
	_, err := s.Run(ctx)
	require.ErrorIs(t, err, bad)

	l = newLink(t, vfrdma.RC, nil)
	other, err := l.d.CreateCQ(ctx, 16) // where none of the sends completes
	require.NoError(t, err)
	s = perf.Send{QP: l.a, CQ: other, Messages: 10, Batch: 2, Fill: l.fill, Quiet: 100 * time.Millisecond, Wait: perf.Sleep}
	_, err = s.Run(ctx)
	require.ErrorContains(t, err, "no send completion for 100ms (0 of 10 done)")
	require.NoError(t, ctx.Err())
}

// send posts n SENDs from a to b, one at a time, each waited for.
func (l *link) send(ctx context.Context, n int) error {
	wcs := make([]vfrdma.WC, 1)
	for i := range n {
		var wr [1]vfrdma.SendWR
		var sge [1]vfrdma.SGE
		l.fill(&wr[0], sge[:], i)
		wr[0].WRID = uint64(i)
		if _, err := l.a.PostSend(wr[:], 0); err != nil {
			return err
		}
		if _, err := l.acq.WaitN(ctx, wcs, 1); err != nil {
			return err
		}
	}
	return nil
}

// sendAside runs send on a goroutine; the test waits for it at its end.
func (l *link) sendAside(t *testing.T, ctx context.Context, n int) {
	done := make(chan error, 1)
	go func() { done <- l.send(ctx, n) }()
	t.Cleanup(func() { require.NoError(t, <-done) })
}

// The receive loop takes every message, reposting each receive, whatever
// its wait: spinning, asleep on the CQ, or on a wait set (whose sleeps it
// counts).
func TestReceiveTakesEveryMessageWhateverItsWait(t *testing.T) {
	for _, w := range []perf.Wait{perf.Spin, perf.Sleep, perf.WaitSet} {
		t.Run(w.String(), func(t *testing.T) {
			l := newLink(t, vfrdma.RC, nil)
			ctx := withTimeout(t, 20*time.Second)
			const messages = 200
			l.sendAside(t, ctx, messages)
			r := perf.Receive{CQ: l.bcq, Messages: messages, Wait: w, Repost: l.repost}
			res, err := r.Run(ctx)
			require.NoError(t, err)
			assert.Equal(t, messages, res.Got)
			assert.Positive(t, res.Elapsed)
			if w != perf.Sleep {
				assert.GreaterOrEqual(t, res.Polls, 1)
				assert.GreaterOrEqual(t, res.Polls, res.Empty)
			}
			if w == perf.WaitSet {
				assert.Equal(t, res.Empty, res.Wakeups, "a wait after every empty poll")
			} else {
				assert.Zero(t, res.Wakeups)
			}
		})
	}
}

// A receive loop whose sender goes quiet stops: with MayDrop (UD) with
// what it got, otherwise with an error that says how far it got.
func TestReceiveStopsWhenTheSenderGoesQuiet(t *testing.T) {
	for _, mayDrop := range []bool{true, false} {
		t.Run(fmt.Sprint("may drop ", mayDrop), func(t *testing.T) {
			l := newLink(t, vfrdma.UD, nil)
			ctx := withTimeout(t, 20*time.Second)
			require.NoError(t, l.send(ctx, 5))
			r := perf.Receive{CQ: l.bcq, Messages: 10, Wait: perf.Sleep, Quiet: 100 * time.Millisecond, MayDrop: mayDrop, Repost: l.repost}
			res, err := r.Run(ctx)
			assert.Equal(t, 5, res.Got)
			if mayDrop {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, "received 5 of 10, then nothing for 100ms")
		})
	}
}

// Next returns once a completion is there, spinning or asleep, and ends
// with its context; it does not wait on a wait set.
func TestNextWaitsForACompletionSpinningOrAsleep(t *testing.T) {
	for _, w := range []perf.Wait{perf.Spin, perf.Sleep} {
		t.Run(w.String(), func(t *testing.T) {
			l := newLink(t, vfrdma.RC, nil)
			ctx := withTimeout(t, 20*time.Second)
			wcs := make([]vfrdma.WC, 4)
			l.sendAside(t, ctx, 1)
			n, err := w.Next(ctx, l.bcq, wcs)
			require.NoError(t, err)
			assert.Equal(t, 1, n)
			short, cancel := context.WithCancel(ctx)
			cancel()
			_, err = w.Next(short, l.bcq, wcs)
			assert.ErrorIs(t, err, context.Canceled)
		})
	}
	_, err := perf.WaitSet.Next(context.Background(), nil, nil)
	assert.ErrorContains(t, err, "Next waits with Spin or Sleep")
}
