package event

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultSpin is how long a CQ's Wait looks for events before it sleeps,
// on a device whose work does not run on the waiter's cores: long enough
// that a stream's next completion usually comes within it, short enough
// that an idle waiter burns little.
const DefaultSpin = 200 * time.Microsecond

// Spinner is a Source that says how long a waiter should look at it before
// sleeping (a CQ: its device's spin). A wait set spins as long as the
// longest of its members asks, unless SetSpin says otherwise.
type Spinner interface {
	Spin() time.Duration
}

// WaitSet is one wait object for many sources: it is signaled when any
// member may have an event. Add, Remove and Close are safe for concurrent
// use with everything; TryWait and Wait are meant for the goroutine that
// drains the members, though several may Wait at once.
//
// Lifecycle: after Close, every method that returns an error returns one
// wrapping ErrClosed; a second Close returns nil. A Wait racing Close
// returns nil or ErrClosed, and Close releases every goroutine asleep in
// Wait with ErrClosed (and raises the eventfd, so that callers asleep on
// their FD wake and find the set closed). The zero WaitSet is not usable:
// make one with NewWaitSet.
type WaitSet struct {
	sig *signal

	mu      sync.Mutex
	members atomic.Pointer[[]*wsMember]
	closed  atomic.Bool
	spin    atomic.Int64 // Wait's spin (SetSpin), in ns; negative: the members' (Spinner)
}

type wsMember struct {
	src  Source
	mark uint64 // what the waiter has seen of a counter
}

// NewWaitSet returns an empty wait set that sleeps on a wait object of the
// given kind.
func NewWaitSet(kind Kind) (*WaitSet, error) {
	sig, err := newSignal(kind)
	if err != nil {
		return nil, err
	}
	ws := &WaitSet{sig: sig}
	ws.members.Store(&[]*wsMember{})
	ws.spin.Store(-1)
	return ws, nil
}

// SetSpin sets how long Wait looks at the members, without arming them,
// before it sleeps: an event within it costs no arming and no wake-up.
// Unless set, it is the longest spin a member asks for (Spinner; a CQ
// asks for its device's), and none if no member asks. Zero or negative:
// Wait sleeps at once.
func (ws *WaitSet) SetSpin(d time.Duration) { ws.spin.Store(int64(max(d, 0))) }

// Spin returns how long Wait spins (SetSpin, or the members').
func (ws *WaitSet) Spin() time.Duration {
	if d := ws.spin.Load(); d >= 0 {
		return time.Duration(d)
	}
	var d time.Duration
	for _, m := range *ws.members.Load() {
		if s, ok := m.src.(Spinner); ok {
			d = max(d, s.Spin())
		}
	}
	return d
}

// Kind returns the set's wait object kind.
func (ws *WaitSet) Kind() Kind { return ws.sig.kind }

// Wake signals the set: its sources call it when they may have events.
func (ws *WaitSet) Wake() { ws.sig.set() }

// Add makes src a member. A source already in the set is refused with
// ErrBusy.
func (ws *WaitSet) Add(src Source) error {
	if err := checkComparable("Source", src); err != nil {
		return fmt.Errorf("add to wait set: %w", err)
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.closed.Load() {
		return fmt.Errorf("add to wait set: %w", ErrClosed)
	}
	old := *ws.members.Load()
	if slices.ContainsFunc(old, func(m *wsMember) bool { return m.src == src }) {
		return fmt.Errorf("add to wait set: %w: already a member", ErrBusy)
	}
	if err := src.Watch(ws); err != nil {
		return fmt.Errorf("add to wait set: %w", err)
	}
	next := append(slices.Clip(old), &wsMember{src: src, mark: ^uint64(0)})
	ws.members.Store(&next)
	ws.sig.set() // it may have events already: the next TryWait looks
	return nil
}

// Remove takes src out of the set; a source not in it is refused with
// ErrInvalid.
func (ws *WaitSet) Remove(src Source) error {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.closed.Load() {
		return fmt.Errorf("remove from wait set: %w", ErrClosed)
	}
	old := *ws.members.Load()
	i := slices.IndexFunc(old, func(m *wsMember) bool { return m.src == src })
	if i < 0 {
		return fmt.Errorf("remove from wait set: %w: not a member", errInvalid)
	}
	src.Unwatch(ws)
	next := slices.Delete(slices.Clone(old), i, i+1)
	ws.members.Store(&next)
	return nil
}

// Len returns the number of members.
func (ws *WaitSet) Len() int { return len(*ws.members.Load()) }

// FD returns a new descriptor of an FD wait set's eventfd, to put in the
// caller's own select, poll or epoll. It is readable while events may be
// pending, until a TryWait succeeds, and when the set closes. The
// descriptor is the caller's: close it when done (take it out of an epoll
// set first: epoll watches the file, which the set keeps open). Closing it
// never affects the set or anyone else; each call makes a new one. Do not
// read it, write it or change its flags: they are the set's.
func (ws *WaitSet) FD() (int, error) {
	if ws.closed.Load() {
		return -1, fmt.Errorf("wait set fd: %w", ErrClosed)
	}
	if ws.sig.kind != FD {
		return -1, fmt.Errorf("%w: a %v wait set has no fd", errInvalid, ws.sig.kind)
	}
	fd, err := ws.sig.dup()
	if err != nil {
		return -1, fmt.Errorf("wait set fd: %w", err)
	}
	return fd, nil
}

// C returns the channel of a Chan wait set: it holds a value while events
// may be pending. Receiving it consumes the signal; call TryWait before
// the next receive.
func (ws *WaitSet) C() <-chan struct{} {
	if ws.sig.kind != Chan {
		return nil
	}
	return ws.sig.ch
}

// TryWait arms every member and reports whether it is safe to sleep on the
// wait object: nil when nothing is pending, ErrAgain (the wait object left
// signaled) when some member has events. It first clears the wait object,
// then arms and checks each member, so that an event arriving at any point
// either shows in the checks or signals the object afterwards. On a set
// with nothing pending it allocates nothing.
func (ws *WaitSet) TryWait() error {
	if ws.closed.Load() {
		return fmt.Errorf("trywait: %w", ErrClosed)
	}
	arm := ws.sig.kind != Yield
	if arm {
		ws.sig.reset()
		if err := ws.sig.err(); err != nil {
			return fmt.Errorf("trywait: %w", err)
		}
	}
	pending := false
	for _, m := range *ws.members.Load() {
		ok, err := m.src.Ready(arm, &m.mark)
		if err != nil {
			ws.sig.set()
			return fmt.Errorf("trywait: %w", err)
		}
		pending = pending || ok
	}
	if pending {
		ws.sig.set()
		return ErrAgain
	}
	return nil
}

// Wait blocks until a member may have events or ctx ends. It first spins
// (SetSpin), looking at the members without arming them and yielding the
// processor between looks; then it returns at once when TryWait finds
// events pending, and otherwise sleeps on the wait object (a Yield set
// checks the members in a loop instead). It returns
// ctx's error, wrapped, when ctx ends first and ErrClosed when the set is
// closed under it.
func (ws *WaitSet) Wait(ctx context.Context) error {
	if ws.sig.kind != Yield { // a Yield set looks without arming anyway
		if ok, err := ws.spinFor(ctx); ok || err != nil {
			return err
		}
	}
	for {
		err := ws.TryWait()
		if err == ErrAgain {
			return nil
		}
		if err != nil {
			return err
		}
		if ws.sig.kind != Yield {
			if err := ws.sig.wait(ctx); err != nil {
				return fmt.Errorf("wait set (%d members, %v): %w", ws.Len(), ws.sig.kind, err)
			}
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("wait set (%d members, yield): %w", ws.Len(), err)
		}
		runtime.Gosched()
	}
}

// Close frees the wait object and releases a goroutine blocked in Wait with
// ErrClosed. A set that still has members is refused with ErrBusy: remove
// them first. Close is idempotent.
func (ws *WaitSet) Close() error {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.closed.Load() {
		return nil
	}
	if n := len(*ws.members.Load()); n > 0 {
		return fmt.Errorf("close wait set: %w: %d members; remove them first", ErrBusy, n)
	}
	ws.closed.Store(true)
	return ws.sig.close()
}

// spinFor looks at the members, unarmed, until one has events or the spin
// has passed: it reports whether one has.
func (ws *WaitSet) spinFor(ctx context.Context) (bool, error) {
	ok, err := Spin(ctx, ws.Spin(), func() (bool, error) {
		if ws.closed.Load() {
			return false, ErrClosed
		}
		for _, m := range *ws.members.Load() {
			if ok, err := m.src.Ready(false, &m.mark); ok || err != nil {
				return ok, err
			}
		}
		return false, nil
	})
	if err != nil {
		return false, fmt.Errorf("wait set (%d members, %v): %w", ws.Len(), ws.sig.kind, err)
	}
	return ok, nil
}

// Spin calls look, yielding the processor between calls, until it reports
// true or an error, or d has passed (then false), or ctx ends (ctx's
// error). It reads the clock and ctx once per 16 looks, and allocates
// nothing: the spin of CQ.Wait and of a wait set's Wait.
func Spin(ctx context.Context, d time.Duration, look func() (bool, error)) (bool, error) {
	if d <= 0 {
		return false, nil
	}
	var deadline time.Time
	for i := 0; ; i++ {
		if ok, err := look(); ok || err != nil {
			return ok, err
		}
		if i%16 == 0 {
			now := time.Now()
			if i == 0 {
				deadline = now.Add(d)
			} else if now.After(deadline) {
				return false, nil
			}
			if err := ctx.Err(); err != nil {
				return false, err
			}
		}
		runtime.Gosched()
	}
}
