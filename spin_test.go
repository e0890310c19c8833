//go:build !guest

package vfrdma

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// long bounds a test's waits: a hang guard, never a measured time.
const long = 10 * time.Second

// Rule: CQ.Wait spins for Options.Spin before it arms: a completion that
// comes within the spin is taken with no arm doorbell and no interrupt
// (Stats.Spun counts it), and a context that ends during the spin ends
// Wait. The spin is bounded: once it has passed, Wait arms and sleeps.
// With a negative Spin, Wait arms at once. (Faults caught: no spin; a spin
// that never ends; a spin deaf to ctx.)
func TestWaitSpinsForOptionsSpinBeforeItArms(t *testing.T) {
	f := newEventDevice(t, 1, 16)
	qp := f.addQP(t, 0, 16, nil)
	cq := f.cqs[0]
	send := func() {
		_, err := qp.PostSend([]SendWR{{WRID: 1, SGEs: []SGE{f.mr.SGE(0, 8)}}}, 0)
		require.NoError(t, err)
		require.Equal(t, 1, f.complete(0))
	}
	take := func() {
		wcs := make([]WC, 4)
		n, err := cq.Poll(wcs)
		require.NoError(t, err)
		require.Equal(t, 1, n)
	}
	wait := func(ctx context.Context) <-chan error {
		done := make(chan error, 1)
		go func() { done <- cq.Wait(ctx) }()
		return done
	}
	ctx, cancel := context.WithTimeout(context.Background(), long)
	defer cancel()

	t.Run("a completion within the spin", func(t *testing.T) {
		f.d.waitSpin = time.Hour
		done := wait(ctx)
		send()
		require.NoError(t, <-done)
		take()
		st := cq.Stats()
		assert.EqualValues(t, 1, st.Spun)
		assert.Zero(t, st.Doorbells, "an arm doorbell was rung")
		assert.Zero(t, f.interrupts.Load())
		assert.False(t, cq.armed.Load())
	})
	t.Run("ctx ends during the spin", func(t *testing.T) {
		f.d.waitSpin = time.Hour
		short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
		defer cancel()
		assert.ErrorIs(t, cq.Wait(short), context.DeadlineExceeded)
		assert.False(t, cq.armed.Load(), "armed during a spin of an hour")
	})
	for _, spin := range []time.Duration{time.Millisecond, 0} {
		t.Run("spin "+spin.String()+" then sleep", func(t *testing.T) {
			f.d.waitSpin = spin
			before := cq.Stats()
			done := wait(ctx)
			require.Eventually(t, cq.armed.Load, long, 100*time.Microsecond, "Wait never armed the CQ")
			send()
			require.NoError(t, <-done)
			take()
			st := cq.Stats()
			assert.Equal(t, before.Spun, st.Spun)
			assert.Greater(t, st.Interrupts, before.Interrupts, "woken by the interrupt")
		})
	}
}

// Rule: with Options.PollDoorbell and a pace, an empty poll rings the POLL
// doorbell at most once per pace; with no pace, on every empty poll.
// (Faults caught: the pace ignored; the pace never letting a doorbell
// through.)
func TestPollPaceRingsThePollDoorbellAtMostOncePerPace(t *testing.T) {
	f := newFixture(t, RC, 16)
	f.d.opt.PollDoorbell = true
	wcs := make([]WC, 4)
	polls := func(k int) uint64 {
		before := f.cq.Stats().Doorbells
		for range k {
			n, err := f.cq.Poll(wcs)
			require.NoError(t, err)
			require.Zero(t, n)
		}
		return f.cq.Stats().Doorbells - before
	}
	assert.EqualValues(t, 10, polls(10), "no pace: a doorbell per empty poll")
	f.d.pollPace = time.Hour
	assert.EqualValues(t, 1, polls(10), "a pace of an hour: one doorbell")
	f.d.pollPace = time.Millisecond
	f.cq.lastPoll = time.Now().Add(-time.Second)
	assert.EqualValues(t, 1, polls(1), "the pace has passed: the next empty poll rings")
}

// The spin of a Wait that a completion answers allocates nothing.
func TestWaitThatSpinsAllocatesNothing(t *testing.T) {
	f := newEventDevice(t, 1, 16)
	qp := f.addQP(t, 0, 16, nil)
	cq := f.cqs[0]
	f.d.waitSpin = time.Hour
	wrs := []SendWR{{WRID: 1, SGEs: []SGE{f.mr.SGE(0, 8)}}}
	wcs := make([]WC, 4)
	ctx := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		_, err := qp.PostSend(wrs, 0)
		require.NoError(t, err)
		f.complete(0)
		require.NoError(t, cq.Wait(ctx))
		n, err := cq.Poll(wcs)
		require.NoError(t, err)
		require.Equal(t, 1, n)
	})
	assert.Zero(t, allocs)
}
