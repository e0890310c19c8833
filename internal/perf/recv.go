package perf

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/event"
)

// Receive is a receive loop: it polls a CQ whose completions are
// receives, hands each batch to Repost (which posts them again), and
// counts them, until it has Messages of them.
type Receive struct {
	CQ       *vfrdma.CQ
	Messages int
	// Wait is how the loop waits when a poll finds nothing: Spin, Sleep
	// or WaitSet.
	Wait Wait
	// Quiet ends the loop once nothing arrived for that long (default
	// DefaultQuiet): with MayDrop (UD, which may drop), as a loop that
	// received what it could; otherwise with an error that says how far
	// it got.
	Quiet   time.Duration
	MayDrop bool
	// Repost posts again the receives whose completions are wcs (all
	// successful); nil posts nothing.
	Repost func(wcs []vfrdma.WC) error
	// WCs is how many completions a poll takes at most (default 64).
	WCs int
}

// DefaultQuiet is how long Receive waits for a message before it stops.
const DefaultQuiet = 5 * time.Second

// RecvResult is what a receive loop measured.
type RecvResult struct {
	Got int // receives completed
	// Elapsed runs from the loop's first poll to its end: a loop that
	// stopped on a quiet sender (MayDrop) counts the quiet too.
	Elapsed time.Duration
	CPU     CPU // the process's, over the loop
	// Polls and Empty count the loop's polls, and those that found
	// nothing (Spin and WaitSet; Sleep's are CQ.WaitN's own).
	Polls int
	Empty int
	// Wakeups counts WaitSet.Wait calls, each after a poll found the CQ
	// empty: Wait returns at once, without sleeping, when a completion
	// came since the poll, so this counts the sleeps or a few more.
	Wakeups int
}

// Run runs the loop until it has r.Messages receives, the sender goes
// quiet (see Quiet), a completion fails, or ctx ends.
func (r *Receive) Run(ctx context.Context) (RecvResult, error) {
	var res RecvResult
	var ws *event.WaitSet
	if r.Wait == WaitSet {
		var err error
		if ws, err = event.NewWaitSet(event.FD); err != nil {
			return res, err
		}
		if err := ws.Add(r.CQ.Source()); err != nil {
			_ = ws.Close()
			return res, err
		}
		defer func() {
			_ = ws.Remove(r.CQ.Source())
			_ = ws.Close()
		}()
	}
	quiet := r.Quiet
	if quiet <= 0 {
		quiet = DefaultQuiet
	}
	var progress atomic.Int64
	qctx, stop := WatchQuiet(ctx, &progress, quiet)
	defer stop()
	wcs := make([]vfrdma.WC, max(r.WCs, 64))
	cpu0, err := ReadCPU()
	if err != nil {
		return res, err
	}
	start := time.Now()
	var c pollCount
	for res.Got < r.Messages {
		n, err := r.next(qctx, wcs, ws, &c, &res)
		if err != nil {
			if !Quiet(qctx) || ctx.Err() != nil {
				return res, err
			}
			if r.MayDrop {
				break
			}
			return res, fmt.Errorf("received %d of %d, then nothing for %v", res.Got, r.Messages, quiet)
		}
		for _, wc := range wcs[:n] {
			if wc.Status != vfrdma.WCSuccess {
				return res, fmt.Errorf("receive completion %+v", wc)
			}
		}
		res.Got += n
		if r.Repost != nil {
			if err := r.Repost(wcs[:n]); err != nil {
				return res, err
			}
		}
		progress.Store(int64(res.Got))
	}
	res.Elapsed = time.Since(start)
	res.Polls, res.Empty = c.polls, c.empty
	cpu1, err := ReadCPU()
	res.CPU = cpu1.Since(cpu0)
	return res, err
}

// next returns the loop's next completions, waiting as r.Wait says.
func (r *Receive) next(ctx context.Context, wcs []vfrdma.WC, ws *event.WaitSet, c *pollCount, res *RecvResult) (int, error) {
	switch r.Wait {
	case Spin:
		return spin(ctx, r.CQ, wcs, c)
	case Sleep:
		return r.CQ.WaitN(ctx, wcs, 1)
	case WaitSet:
		for {
			n, err := r.CQ.Poll(wcs)
			c.polls++
			if n > 0 || err != nil {
				return n, err
			}
			c.empty++
			// Wait arms the CQ (TryWait) and sleeps unless it finds a
			// completion; it returns at once when one came since the poll.
			res.Wakeups++
			if err := ws.Wait(ctx); err != nil {
				return 0, err
			}
		}
	}
	return 0, fmt.Errorf("perf: Receive with %v", r.Wait)
}
