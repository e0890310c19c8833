package perf

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// WatchQuiet's context lives while progress moves and ends, with cause
// ErrQuiet, once it stands still for the quiet time; stop, and the
// parent's end, are not quiet.
func TestWatchQuietEndsOnlyWhenProgressStandsStill(t *testing.T) {
	var progress atomic.Int64
	// Long enough that a loaded machine's scheduling never makes 10 ms of
	// sleep look like silence.
	const quiet = 2 * time.Second

	ctx, stop := WatchQuiet(context.Background(), &progress, quiet)
	defer stop()
	for range 50 {
		time.Sleep(10 * time.Millisecond)
		progress.Add(1)
	}
	require.NoError(t, ctx.Err(), "still making progress")
	select {
	case <-ctx.Done():
	case <-time.After(20 * quiet):
		require.FailNow(t, "no ErrQuiet after 20 quiet periods")
	}
	assert.ErrorIs(t, context.Cause(ctx), ErrQuiet)
	assert.True(t, Quiet(ctx))

	ctx2, stop2 := WatchQuiet(context.Background(), &progress, quiet)
	stop2()
	<-ctx2.Done()
	assert.False(t, Quiet(ctx2), "stopped, not quiet")
	parent, cancel := context.WithCancel(context.Background())
	ctx3, stop3 := WatchQuiet(parent, &progress, quiet)
	defer stop3()
	cancel()
	<-ctx3.Done()
	assert.ErrorIs(t, context.Cause(ctx3), context.Canceled)
	assert.False(t, Quiet(ctx3), "the parent ended, not quiet")
}
