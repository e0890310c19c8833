package perf

import (
	"context"
	"fmt"
	"runtime"

	"github.com/vfrdma/vfrdma"
)

// Wait is how a loop waits when a poll finds no completion.
type Wait int

const (
	// Spin polls again at once, never sleeping, yielding the processor
	// between polls (one vCPU may carry both ends), as rdma-core's
	// pingpongs and perftest do.
	Spin Wait = iota
	// Sleep waits as the CQ's options say (CQ.WaitN: Options.Spin, then
	// the CQ's interrupt), as rdma-core's pingpongs do with -e.
	Sleep
	// WaitSet sleeps on a wait set (event.WaitSet of kind FD, an eventfd)
	// holding the CQ whenever a poll finds nothing: Receive's only.
	WaitSet
)

func (w Wait) String() string {
	switch w {
	case Spin:
		return "spin"
	case Sleep:
		return "events"
	case WaitSet:
		return "wait"
	}
	return fmt.Sprintf("Wait(%d)", int(w))
}

// spinCheck is how many empty polls a spin makes between looks at its
// context.
const spinCheck = 64

// Next polls cq into wcs until it holds at least one completion, waiting
// as w says (Spin or Sleep), until ctx ends; it returns how many it
// holds. It allocates nothing but its errors.
func (w Wait) Next(ctx context.Context, cq *vfrdma.CQ, wcs []vfrdma.WC) (int, error) {
	switch w {
	case Sleep:
		return cq.WaitN(ctx, wcs, 1)
	case Spin:
		var c pollCount
		return spin(ctx, cq, wcs, &c)
	}
	return 0, fmt.Errorf("perf: %v: Next waits with Spin or Sleep", w)
}

// pollCount counts a loop's polls, and those that found nothing.
type pollCount struct{ polls, empty int }

// spin polls cq into wcs until it holds a completion, yielding the
// processor after each empty poll and looking at ctx every spinCheck of
// them.
func spin(ctx context.Context, cq *vfrdma.CQ, wcs []vfrdma.WC, c *pollCount) (int, error) {
	for {
		n, err := cq.Poll(wcs)
		c.polls++
		if n > 0 || err != nil {
			return n, err
		}
		if c.empty++; c.empty%spinCheck == 0 {
			if err := ctx.Err(); err != nil {
				return 0, err
			}
		}
		runtime.Gosched()
	}
}
