package event

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/vfrdma/vfrdma/wq"
)

// ErrAgain is TryWait's answer when events are already queued: drain them
// and try again before sleeping.
var ErrAgain = errors.New("events pending: drain them, then try again")

// ErrBusy and ErrClosed are the driver's sentinels (vfrdma.ErrBusy,
// vfrdma.ErrClosed): closing what is still in use, using what is closed.
var (
	ErrBusy    = wq.ErrBusy
	ErrClosed  = wq.ErrClosed
	errInvalid = wq.ErrInvalid
)

// ErrCounter is Counter.Wait's answer when the counter's error value moved
// while it waited.
var ErrCounter = errors.New("the counter's error value changed")

// A Waker is told that a source it watches may have new events. Wake must
// be cheap and must not block: sources call it from their notification
// paths.
type Waker interface {
	Wake()
}

// A Source has events that sets poll and wait on.
type Source interface {
	// Watch makes the source call w.Wake whenever it may have new events,
	// until Unwatch. Watching the same Waker twice is refused.
	Watch(w Waker) error
	// Unwatch stops the wake-ups of w.
	Unwatch(w Waker)
	// Ready makes the progress the source needs and reports whether it has
	// events the observer holding *mark has not seen: a CQ that holds
	// completions, a counter that counted since *mark (Ready updates it).
	// With arm set, it first arms the source so that its next event wakes
	// its watchers; a Source that reports false after arming will wake
	// them.
	Ready(arm bool, mark *uint64) (bool, error)
}

// A Syncer delivers, when asked, the wake-ups its sources have coming: a
// device drains its notification ring. A source that has one (see
// Synced) lets a PollSet skip it while idle.
type Syncer interface {
	Sync() error
}

// Synced is implemented by sources whose wake-ups come from a Syncer.
type Synced interface {
	Syncer() Syncer
}

// checkComparable refuses a source or waker whose dynamic type cannot be
// compared (a struct holding a func, say): the sets find members by
// comparing them, which would panic. Use pointers.
func checkComparable(what string, x any) error {
	if x == nil {
		return fmt.Errorf("%w: nil %s", errInvalid, what)
	}
	if t := reflect.TypeOf(x); !t.Comparable() {
		return fmt.Errorf("%w: a %s of type %v, which cannot be compared: use a pointer", errInvalid, what, t)
	}
	return nil
}

// Watchers is the list of Wakers a source tells. Its zero value is empty
// and ready. Add and Remove are safe for concurrent use with Wake, which
// takes no lock and allocates nothing.
type Watchers struct {
	mu   sync.Mutex
	list atomic.Pointer[[]Waker]
}

// Add appends w; a Waker already on the list is refused.
func (ws *Watchers) Add(w Waker) error {
	if err := checkComparable("Waker", w); err != nil {
		return err
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	var old []Waker
	if p := ws.list.Load(); p != nil {
		old = *p
	}
	if slices.Contains(old, w) {
		return fmt.Errorf("%w: already watching", wq.ErrBusy)
	}
	next := append(slices.Clip(old), w)
	ws.list.Store(&next)
	return nil
}

// Remove takes w off the list and reports whether it was there.
func (ws *Watchers) Remove(w Waker) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	p := ws.list.Load()
	if p == nil {
		return false
	}
	i := slices.Index(*p, w)
	if i < 0 {
		return false
	}
	next := slices.Delete(slices.Clone(*p), i, i+1)
	ws.list.Store(&next)
	return true
}

// Len returns how many Wakers are on the list.
func (ws *Watchers) Len() int {
	if p := ws.list.Load(); p != nil {
		return len(*p)
	}
	return 0
}

// Wake tells every Waker on the list.
func (ws *Watchers) Wake() {
	p := ws.list.Load()
	if p == nil {
		return
	}
	for _, w := range *p {
		w.Wake()
	}
}
