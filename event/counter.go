package event

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
)

// A Driven source is one a Counter makes progress on: a CQ that nobody
// else polls, whose completions count on the counters bound to its QPs.
type Driven interface {
	Source
	// Progress takes what the source holds and counts it; it reports how
	// many events it took.
	Progress() (int, error)
}

// Counter counts events: a success value and an error value (fi_cntr).
// Bound to a QP's sends or receives (vfrdma.QPConfig.SendCounter,
// RecvCounter) it counts their completions, successful or not, as CQ.Poll
// reaps them; when nobody polls that CQ, Drive it and the counter's reads
// and waits poll it themselves.
//
// Count and CountErr are events: poll sets report them and waiters wake.
// Add, AddErr and Set adjust the values without being events. Reads take
// no lock and allocate nothing. A Counter is safe for concurrent use.
//
// The zero Counter is ready to use, at zero, like NewCounter's (and like
// am.Counter). Lifecycle: Close is refused with ErrBusy while a QP or a set
// holds the counter; after Close, every method that returns an error
// returns one wrapping ErrClosed (the values stay readable through Value
// and Errors, and Count, Add and Set still move them); a second Close
// returns nil; Close releases every goroutine in Wait with ErrClosed.
type Counter struct {
	val, errv atomic.Uint64
	seq       atomic.Uint64 // events counted, for the observers' marks
	watchers  Watchers

	// Waiters in Wait sleep on ch, which a waiter makes and a change
	// closes (and forgets) only while someone waits.
	nwait atomic.Int32
	chMu  sync.Mutex
	ch    chan struct{}

	drives atomic.Pointer[[]Driven] // nil: none

	mu     sync.Mutex
	users  int // bindings (QPs) and sets holding the counter
	closed bool
	shut   atomic.Bool   // closed, for the lock-free reads
	done   chan struct{} // made on first use; closed by Close
	own    *WaitSet      // the counter's own wait object (FD), made on first use
}

// NewCounter returns a counter at zero.
func NewCounter() *Counter { return &Counter{} }

// Count records n successful events.
func (c *Counter) Count(n uint64) {
	c.val.Add(n)
	c.event()
}

// CountErr records n failed events.
func (c *Counter) CountErr(n uint64) {
	c.errv.Add(n)
	c.event()
}

func (c *Counter) event() {
	c.seq.Add(1)
	c.watchers.Wake()
	c.wakeWaiters()
}

func (c *Counter) wakeWaiters() {
	if c.nwait.Load() == 0 {
		return
	}
	c.chMu.Lock()
	if c.ch != nil {
		close(c.ch)
		c.ch = nil
	}
	c.chMu.Unlock()
}

// driven returns the driven sources.
func (c *Counter) driven() []Driven {
	if p := c.drives.Load(); p != nil {
		return *p
	}
	return nil
}

// doneCh returns the channel Close closes; c.mu must be held.
func (c *Counter) doneCh() chan struct{} {
	if c.done == nil {
		c.done = make(chan struct{})
	}
	return c.done
}

// Add adds n to the success value; it is not an event (fi_cntr_add), but
// it wakes a Wait whose threshold it reaches.
func (c *Counter) Add(n uint64) {
	c.val.Add(n)
	c.wakeWaiters()
}

// AddErr adds n to the error value (not an event; Wait returns ErrCounter).
func (c *Counter) AddErr(n uint64) {
	c.errv.Add(n)
	c.wakeWaiters()
}

// Set sets the success value (not an event).
func (c *Counter) Set(v uint64) {
	c.val.Store(v)
	c.wakeWaiters()
}

// SetErr sets the error value (not an event).
func (c *Counter) SetErr(v uint64) {
	c.errv.Store(v)
	c.wakeWaiters()
}

// Read makes progress on the driven sources and returns the success value.
// Without driven sources it is one atomic load. On a closed counter it
// returns the value and ErrClosed.
func (c *Counter) Read() (uint64, error) {
	err := c.progress()
	return c.val.Load(), err
}

// ReadErr makes progress and returns the error value (and ErrClosed on a
// closed counter).
func (c *Counter) ReadErr() (uint64, error) {
	err := c.progress()
	return c.errv.Load(), err
}

// Value and Errors return the values without making progress.
func (c *Counter) Value() uint64  { return c.val.Load() }
func (c *Counter) Errors() uint64 { return c.errv.Load() }

func (c *Counter) progress() error {
	if c.shut.Load() {
		return fmt.Errorf("counter: %w", ErrClosed)
	}
	p := c.drives.Load()
	if p == nil {
		return nil
	}
	for _, d := range *p {
		if _, err := d.Progress(); err != nil {
			return err
		}
	}
	return nil
}

// Drive makes the counter progress d in its reads and waits: for a CQ whose
// completions only counters want. The counter watches d, so a wait set
// holding the counter wakes for d's events too.
func (c *Counter) Drive(d Driven) error {
	if err := checkComparable("Driven source", d); err != nil {
		return fmt.Errorf("counter drive: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("counter drive: %w", ErrClosed)
	}
	old := c.driven()
	if slices.Contains(old, d) {
		return fmt.Errorf("counter drive: %w: already driven", ErrBusy)
	}
	if err := d.Watch(c); err != nil {
		return fmt.Errorf("counter drive: %w", err)
	}
	next := append(slices.Clip(old), d)
	c.drives.Store(&next)
	return nil
}

// Undrive stops driving d.
func (c *Counter) Undrive(d Driven) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("counter undrive: %w", ErrClosed)
	}
	old := c.driven()
	i := slices.Index(old, d)
	if i < 0 {
		return fmt.Errorf("counter undrive: %w: not driven", errInvalid)
	}
	d.Unwatch(c)
	next := slices.Delete(slices.Clone(old), i, i+1)
	c.drives.Store(&next)
	return nil
}

// Wake is called by the driven sources when they may have events: it
// passes the wake-up on to the counter's watchers and waiters.
func (c *Counter) Wake() {
	c.watchers.Wake()
	c.wakeWaiters()
}

// Watch implements Source.
func (c *Counter) Watch(w Waker) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("counter watch: %w", ErrClosed)
	}
	if err := c.watchers.Add(w); err != nil {
		return err
	}
	c.users++
	return nil
}

// Unwatch implements Source.
func (c *Counter) Unwatch(w Waker) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.watchers.Remove(w) {
		c.users--
	}
}

// Ready implements Source: it progresses the driven sources (arming them
// first when arm is set) and reports whether the counter counted an event
// since *mark, which it moves to the present.
func (c *Counter) Ready(arm bool, mark *uint64) (bool, error) {
	pending := false
	if c.shut.Load() {
		return false, fmt.Errorf("counter: %w", ErrClosed)
	}
	for _, d := range c.driven() {
		if _, err := d.Progress(); err != nil {
			return false, err
		}
		if arm {
			// An event that lands between the progress and the arming
			// shows here, and is taken by the next progress.
			ok, err := d.Ready(true, nil)
			if err != nil {
				return false, err
			}
			pending = pending || ok
		}
	}
	if s := c.seq.Load(); mark != nil && s != *mark {
		*mark = s
		pending = true
	}
	return pending, nil
}

// Hold marks the counter as used by a binding (a QP counting into it), so
// that Close is refused until Release. Hold on a closed counter fails.
func (c *Counter) Hold() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("counter hold: %w", ErrClosed)
	}
	c.users++
	return nil
}

// Release ends a Hold.
func (c *Counter) Release() {
	c.mu.Lock()
	c.users--
	c.mu.Unlock()
}

// Wait blocks until the success value reaches threshold, the error value
// changes (ErrCounter), ctx ends, or the counter is closed (ErrClosed).
// It makes progress on the driven sources while it waits, sleeping between
// their events without spinning.
func (c *Counter) Wait(ctx context.Context, threshold uint64) error {
	c.mu.Lock()
	done, closed := c.doneCh(), c.closed
	c.mu.Unlock()
	if closed {
		return fmt.Errorf("counter wait for %d: %w", threshold, ErrClosed)
	}
	errStart := c.errv.Load()
	check := func() (bool, error) {
		if err := c.progress(); err != nil {
			return false, err
		}
		if c.errv.Load() != errStart {
			return false, fmt.Errorf("counter wait for %d (at %d): %w", threshold, c.val.Load(), ErrCounter)
		}
		return c.val.Load() >= threshold, nil
	}
	for {
		if ok, err := check(); ok || err != nil {
			return err
		}
		c.nwait.Add(1)
		c.chMu.Lock()
		if c.ch == nil {
			c.ch = make(chan struct{})
		}
		ch := c.ch
		c.chMu.Unlock()
		var ok bool
		var err error
		for _, d := range c.driven() {
			if _, err = d.Ready(true, nil); err != nil {
				break
			}
		}
		if err == nil {
			ok, err = check()
		}
		if ok || err != nil {
			c.nwait.Add(-1)
			return err
		}
		select {
		case <-ch:
		case <-done:
			err = fmt.Errorf("counter wait for %d: %w", threshold, ErrClosed)
		case <-ctx.Done():
			err = fmt.Errorf("counter wait for %d (at %d, errors %d): %w", threshold, c.val.Load(), c.errv.Load(), ctx.Err())
		}
		c.nwait.Add(-1)
		if err != nil {
			return err
		}
	}
}

// FD returns a new descriptor of the counter's own eventfd (its own FD
// wait set, made on first use): readable when the counter may have
// counted, until TryWait succeeds. The descriptor is the caller's to close
// (see WaitSet.FD); do not read or write it.
func (c *Counter) FD() (int, error) {
	ws, err := c.ownSet()
	if err != nil {
		return -1, err
	}
	return ws.FD()
}

// TryWait arms the counter's own wait object (see FD) and reports whether
// it is safe to sleep on it: ErrAgain when the counter counted since the
// last TryWait or its driven sources hold events.
func (c *Counter) TryWait() error {
	ws, err := c.ownSet()
	if err != nil {
		return err
	}
	return ws.TryWait()
}

func (c *Counter) ownSet() (*WaitSet, error) {
	c.mu.Lock()
	own, closed := c.own, c.closed
	c.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("counter wait object: %w", ErrClosed)
	}
	if own != nil {
		return own, nil
	}
	ws, err := NewWaitSet(FD)
	if err != nil {
		return nil, err
	}
	if err := ws.Add(c); err != nil {
		_ = ws.Close()
		return nil, err
	}
	c.mu.Lock()
	if c.own == nil && !c.closed {
		c.own, ws = ws, nil
	}
	own, closed = c.own, c.closed
	c.mu.Unlock()
	if ws != nil { // another goroutine won, or Close came first
		_ = ws.Remove(c)
		_ = ws.Close()
	}
	if closed {
		return nil, fmt.Errorf("counter wait object: %w", ErrClosed)
	}
	return own, nil
}

// Close releases its waiters with ErrClosed. A counter still bound to a
// QP or in a set is refused with ErrBusy. A second Close returns nil.
func (c *Counter) Close() error {
	c.mu.Lock()
	own := c.own
	busy := c.users
	if own != nil {
		busy-- // its own wait set
	}
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	if busy > 0 {
		c.mu.Unlock()
		return fmt.Errorf("close counter: %w: %d bindings or sets still use it", ErrBusy, busy)
	}
	c.closed = true
	drives := c.driven()
	c.drives.Store(nil)
	c.shut.Store(true)
	close(c.doneCh())
	c.mu.Unlock()
	for _, d := range drives {
		d.Unwatch(c)
	}
	if own != nil {
		_ = own.Remove(c)
		return own.Close()
	}
	return nil
}
