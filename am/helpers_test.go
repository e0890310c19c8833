package am

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
)

// newJob makes n tasks, each a Context on d, as n processes would.
func newJob(t testing.TB, d *vfrdma.Device, n int, cfg Config) []*Context {
	t.Helper()
	return newHoldingJob(t, d, n, cfg, ackHold)
}

// newHoldingJob is newJob with contexts that hold acknowledgements and
// taken buffers back for hold instead of ackHold (as far as their idle
// policy lets them: idlePolicy.hold).
func newHoldingJob(t testing.TB, d *vfrdma.Device, n int, cfg Config, hold time.Duration) []*Context {
	t.Helper()
	ds := make([]*vfrdma.Device, n)
	for i := range ds {
		ds[i] = d
	}
	return startJob(t, ds, cfg, hold)
}

// startJob makes one task per device, task i on ds[i], each holding
// acknowledgements back for hold.
func startJob(t testing.TB, ds []*vfrdma.Device, cfg Config, hold time.Duration) []*Context {
	t.Helper()
	n := len(ds)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	xs := LocalExchangers(n)
	cs := make([]*Context, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := cfg
			cfg.Tasks, cfg.Self, cfg.Exchange = n, i, xs[i]
			cs[i], errs[i] = newContext(ctx, ds[i], cfg, hold)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "task %d", i)
	}
	t.Cleanup(func() {
		for _, c := range cs {
			c.Close()
		}
	})
	return cs
}

func withTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// pattern fills a message's data so that every byte says who sent it to
// whom, which message and where in it.
func pattern(src, dst, msg, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(src*131 + dst*31 + msg*7 + i + i>>8 + i>>16)
	}
	return b
}

// checkPattern reports the first byte that is not what pattern wrote.
func checkPattern(b []byte, src, dst, msg int) error {
	want := pattern(src, dst, msg, len(b))
	if bytes.Equal(b, want) {
		return nil
	}
	for i := range b {
		if b[i] != want[i] {
			return fmt.Errorf("message %d from task %d to %d: byte %d of %d is %#x, want %#x", msg, src, dst, i, len(b), b[i], want[i])
		}
	}
	return nil
}
