package vfrdma

import (
	"context"
	"fmt"

	"github.com/vfrdma/vfrdma/event"
)

// WaitN polls the CQ into wcs until it holds at least n completions, and
// returns how many it holds: n to len(wcs), as io.ReadAtLeast reads. n is
// 1 to len(wcs); another n is an error wrapping ErrInvalid.
//
// While polls find fewer than n, WaitN waits as the CQ's options say:
// on a CQ that can be armed (Armable), as Wait does, spinning on the ring
// for Options.Spin and then sleeping on the CQ's interrupt; on one that
// cannot (Options.PollDoorbell on QEMU's device), it polls for
// Options.Spin, yielding the processor between polls (an empty poll rings
// the POLL doorbell at Options.PollPace), then rings the doorbell and
// naps as Wait does. A caller that must never sleep sets a Spin longer
// than it waits.
//
// The completions polled are wcs[:k] whatever the error: when ctx ends
// first (its error, wrapped) or a poll fails, k may be above 0 and below
// n, and those completions are the caller's to handle. After Close it
// returns ErrClosed. WaitN is single-owner, as Poll and Wait are; it
// allocates nothing but its errors.
func (cq *CQ) WaitN(ctx context.Context, wcs []WC, n int) (int, error) {
	if n < 1 || n > len(wcs) {
		return 0, fmt.Errorf("%w: CQ %d: WaitN for %d completions into %d WCs: want 1 to len(wcs)", ErrInvalid, cq.Handle(), n, len(wcs))
	}
	got := 0
	look := func() (bool, error) {
		k, err := cq.Poll(wcs[got:])
		got += k
		return got >= n, err
	}
	for {
		if enough, err := look(); enough || err != nil {
			return got, err
		}
		if !cq.Armable() {
			// Nothing but polls harvests the device's completions here:
			// the spin polls. A spin that ctx ended falls to Wait, which
			// reports ctx's error as every wait of the CQ does.
			if enough, err := event.Spin(ctx, cq.Spin(), look); enough || err != nil && ctx.Err() == nil {
				return got, err
			}
		}
		if err := cq.Wait(ctx); err != nil {
			return got, err
		}
	}
}
