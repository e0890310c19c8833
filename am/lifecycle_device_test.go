package am

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/vfrdma/vfrdma"
)

// The device closed under a running job (senders queueing, waiters in
// Fence, the progress goroutines taking packets) crashes nothing: each
// context fails with ErrClosed, its progress goroutine and ticker end, the
// senders and waiters return errors wrapping ErrClosed, every call after
// it returns one, and Close frees the rest with no error. (Fault caught:
// Close's flushes waking the progress goroutine, which then polls the
// freed CQ: SIGSEGV.)
//
// Each way the progress goroutine idles (sleeping, polling) runs rounds
// that close the device after more or fewer messages landed, so that the
// close meets the job at different moments.
func TestDeviceClosedUnderARunningJob(t *testing.T) {
	for _, tc := range []struct {
		polling bool
		after   int64 // messages landed before the close
	}{{false, 1}, {false, 7}, {false, 20}, {true, 1}, {true, 7}, {true, 20}} {
		name := fmt.Sprintf("sleeping/after %d", tc.after)
		if tc.polling {
			name = fmt.Sprintf("polling/after %d", tc.after)
		}
		polling := tc.polling
		t.Run(name, func(t *testing.T) {
			d := openDevice(t)
			before := goleak.IgnoreCurrent() // the device's own are its business
			cs := newJob(t, d, 2, Config{Polling: polling})
			ctx := withTimeout(t, 2*time.Minute)
			landed := NewCounter()
			for _, c := range cs {
				require.NoError(t, c.SetHandler(1, func(a *Arrival) Return {
					if a.Data != nil {
						return Return{Completion: func() { landed.add(1) }, Inline: true}
					}
					return Return{Buf: make([]byte, a.Len), Inline: true, Completion: func() { landed.add(1) }}
				}))
			}
			data := make([]byte, 40<<10) // fragments: reassembly is under way when the device goes
			errs := make([]error, 2*len(cs))
			var wg sync.WaitGroup
			for i, c := range cs {
				wg.Add(2)
				go func() { // a sender
					defer wg.Done()
					for {
						if err := c.Amsend(1-i, 1, nil, data, Counters{}); err != nil {
							errs[2*i] = err
							return
						}
						time.Sleep(time.Millisecond) // a queue the device drains, not an unbounded one
					}
				}()
				go func() { // a waiter
					defer wg.Done()
					for {
						if err := c.Fence(ctx); err != nil {
							errs[2*i+1] = err
							return
						}
						time.Sleep(time.Millisecond)
					}
				}()
			}
			_, err := landed.Wait(ctx, tc.after) // the job is running
			require.NoError(t, err)
			require.NoError(t, d.Close())
			wg.Wait()
			for i, err := range errs {
				assert.ErrorIs(t, err, vfrdma.ErrClosed, "goroutine %d", i)
				assert.NotErrorIs(t, err, context.DeadlineExceeded, "goroutine %d was released by the close, not its ctx", i)
			}
			// The contexts' goroutines are gone before anyone closes them.
			goleak.VerifyNone(t, before)
			for i, c := range cs {
				calls := map[string]error{
					"Amsend":     c.Amsend(1-i, 1, nil, nil, Counters{}),
					"Fence":      c.Fence(ctx),
					"Barrier":    c.Barrier(ctx),
					"Purge":      c.Purge(ctx, 1-i),
					"SetHandler": c.SetHandler(2, nil),
					"SetCounter": c.SetCounter(2, nil),
				}
				for name, err := range calls {
					assert.ErrorIs(t, err, vfrdma.ErrClosed, "task %d: %s after the device closed", i, name)
				}
				assert.NoError(t, c.Close(), "task %d: Close after the device's", i)
				assert.NoError(t, c.Close(), "task %d: a second Close", i)
				err := c.Amsend(1-i, 1, nil, nil, Counters{})
				assert.ErrorIs(t, err, vfrdma.ErrClosed, "task %d: Amsend after Close", i)
				assert.False(t, errors.Is(err, context.Canceled))
			}
			goleak.VerifyNone(t, before)
		})
	}
}

// Close of a context in the middle of a job returns, releases its Fence
// waiters with ErrClosed, and leaves no goroutine behind; the device and
// the other task's context are untouched.
func TestContextClosedUnderARunningJob(t *testing.T) {
	d := openDevice(t)
	before := goleak.IgnoreCurrent()
	cs := newJob(t, d, 2, Config{})
	ctx := withTimeout(t, 2*time.Minute)
	landed := NewCounter()
	for _, c := range cs {
		require.NoError(t, c.SetHandler(1, func(a *Arrival) Return {
			return Return{Buf: make([]byte, a.Len), Inline: true, Completion: func() { landed.add(1) }}
		}))
	}
	data := make([]byte, 40<<10)
	fenced := make(chan error, 1)
	go func() {
		for {
			if err := cs[0].Amsend(1, 1, nil, data, Counters{}); err != nil {
				fenced <- err
				return
			}
			if err := cs[0].Fence(ctx); err != nil {
				fenced <- err
				return
			}
		}
	}()
	_, err := landed.Wait(ctx, 10)
	require.NoError(t, err)
	require.NoError(t, cs[0].Close())
	assert.ErrorIs(t, <-fenced, vfrdma.ErrClosed)
	assert.ErrorIs(t, cs[0].Fence(ctx), vfrdma.ErrClosed)
	require.NoError(t, cs[1].Close())
	// The device lives on, and with it the interrupt goroutine its CQs
	// started; the contexts' own must be gone.
	goleak.VerifyNone(t, before, goleak.IgnoreAnyFunction("github.com/vfrdma/vfrdma.(*notifier).start.func1"))
}
