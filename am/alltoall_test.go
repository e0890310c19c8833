package am

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// allToAll is one task's part of the exchange every rule test leans on:
// this task sends a message of each size to every task, itself included,
// and checks every byte of what it receives in the completion handler. It
// returns an error for anything wrong: a byte, a count, a counter.
func allToAll(ctx context.Context, c *Context, sizes []int) error {
	const handler, tgtIndex = 1, 1
	n, self := c.Tasks(), c.Self()
	tgt := NewCounter()
	if err := c.SetCounter(tgtIndex, tgt); err != nil {
		return err
	}
	var mu sync.Mutex
	var bad []error
	got := map[[2]int]bool{} // (source, message) seen
	err := c.SetHandler(handler, func(a *Arrival) Return {
		msg := int(binary.LittleEndian.Uint64(a.UHdr))
		size := int(binary.LittleEndian.Uint64(a.UHdr[8:]))
		if size != a.Len {
			mu.Lock()
			bad = append(bad, fmt.Errorf("message %d from %d: Len %d, its header says %d", msg, a.Src, a.Len, size))
			mu.Unlock()
		}
		buf := make([]byte, a.Len)
		src := a.Src
		return Return{Buf: buf, Completion: func() {
			err := checkPattern(buf, src, self, msg)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				bad = append(bad, err)
			}
			if got[[2]int{src, msg}] {
				bad = append(bad, fmt.Errorf("message %d from %d arrived twice", msg, src))
			}
			got[[2]int{src, msg}] = true
		}}
	})
	if err != nil {
		return err
	}
	if err := c.Barrier(ctx); err != nil { // every task has its handler
		return err
	}
	org, cmpl := NewCounter(), NewCounter()
	for dst := range n {
		for msg, size := range sizes {
			var uh [16]byte
			binary.LittleEndian.PutUint64(uh[:], uint64(msg))
			binary.LittleEndian.PutUint64(uh[8:], uint64(size))
			data := pattern(self, dst, msg, size)
			if err := c.Amsend(dst, handler, uh[:], data, Counters{Tgt: tgtIndex, Org: org, Cmpl: cmpl}); err != nil {
				return fmt.Errorf("Amsend of %d bytes to task %d: %w", size, dst, err)
			}
		}
	}
	want := int64(n * len(sizes))
	if _, err := cmpl.Wait(ctx, want); err != nil {
		return fmt.Errorf("cmpl reached %d of %d: %w", cmpl.Get(), want, err)
	}
	if err := c.Fence(ctx); err != nil {
		return err
	}
	if err := c.Barrier(ctx); err != nil { // every task has had all its messages acknowledged
		return err
	}
	var errs []error
	if v := org.Get(); v != want {
		errs = append(errs, fmt.Errorf("org counted %d, want %d", v, want))
	}
	if v := cmpl.Get(); v != 0 {
		errs = append(errs, fmt.Errorf("cmpl has %d left after waiting for all %d", v, want))
	}
	// Every completion handler here ran before its acknowledgement went,
	// and every task's messages were acknowledged before the barrier.
	if v := tgt.Get(); v != want {
		errs = append(errs, fmt.Errorf("tgt counted %d, want %d", v, want))
	}
	mu.Lock()
	errs = append(errs, bad...)
	if len(got) != int(want) {
		errs = append(errs, fmt.Errorf("%d distinct messages arrived, want %d", len(got), want))
	}
	mu.Unlock()
	_ = c.SetCounter(tgtIndex, nil)
	_ = c.SetHandler(handler, nil)
	return errors.Join(errs...)
}

// runTasks runs f for every task at once and fails t with their errors.
func runTasks(t *testing.T, cs []*Context, timeout time.Duration, f func(ctx context.Context, c *Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(ctx, c)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		assert.NoError(t, err, "task %d", i)
	}
}
