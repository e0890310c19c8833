package perf

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// ErrQuiet is the cause (context.Cause) of WatchQuiet's context once
// progress stood still for its quiet time.
var ErrQuiet = errors.New("no progress for the quiet time")

// WatchQuiet returns a context that ends, with cause ErrQuiet, once
// progress has not moved for quiet (checked every quiet/8, on a goroutine
// of its own: the loop pays one atomic store when it progresses, not a
// timer per wait). stop ends the watch and the context; call it when the
// loop is done.
func WatchQuiet(ctx context.Context, progress *atomic.Int64, quiet time.Duration) (qctx context.Context, stop func()) {
	qctx, cancel := context.WithCancelCause(ctx)
	go func() {
		t := time.NewTicker(max(quiet/8, time.Millisecond))
		defer t.Stop()
		last, since := progress.Load(), time.Now()
		for {
			select {
			case <-qctx.Done():
				return
			case now := <-t.C:
				if p := progress.Load(); p != last {
					last, since = p, now
				} else if now.Sub(since) >= quiet {
					cancel(ErrQuiet)
					return
				}
			}
		}
	}()
	return qctx, func() { cancel(context.Canceled) }
}

// Quiet reports whether ctx, one of WatchQuiet's, ended because progress
// stood still (and not because its parent ended).
func Quiet(ctx context.Context) bool { return errors.Is(context.Cause(ctx), ErrQuiet) }
