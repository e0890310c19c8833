package am

import (
	"context"
	"sync"
)

// Counter is a LAPI counter: origin, target and completion counters of
// Amsend count into it, and Wait takes what it waited for back out. The
// zero Counter is ready to use (at 0), as event.Counter's is: NewCounter
// is a convenience. A Counter has no Close and holds nothing to free. It
// is safe for concurrent use; it must not be copied after first use.
type Counter struct {
	mu      sync.Mutex
	v       int64
	changed chan struct{} // made by a waiter, closed when v changes
}

// NewCounter returns a counter at 0, like the zero Counter.
func NewCounter() *Counter { return &Counter{} }

// Get returns the value (LAPI_Getcntr).
func (c *Counter) Get() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.v
}

// Set sets the value (LAPI_Setcntr).
func (c *Counter) Set(v int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.v = v
	c.notify()
}

// add counts n events.
func (c *Counter) add(n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.v += n
	c.notify()
}

func (c *Counter) notify() {
	if c.changed != nil {
		close(c.changed)
		c.changed = nil
	}
}

// Wait blocks until the value reaches v, then subtracts v from it
// (LAPI_Waitcntr), and returns the value left. It returns ctx's error,
// taking nothing, if ctx ends first.
func (c *Counter) Wait(ctx context.Context, v int64) (int64, error) {
	for {
		c.mu.Lock()
		if c.v >= v {
			c.v -= v
			left := c.v
			c.mu.Unlock()
			return left, nil
		}
		if c.changed == nil {
			c.changed = make(chan struct{})
		}
		ch := c.changed
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}
