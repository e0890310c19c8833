package event

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// long is the bound on anything a test waits for: generous, since a wait
// that reaches it is a failure (a lost wake-up), never a measurement.
const long = 10 * time.Second

// fakeSyncer is a device's notification ring: a source that gets an event
// while armed queues itself here; Sync delivers the queue by waking each
// one's watchers. With interrupts started, each notification also kicks an
// "interrupt" goroutine that calls Sync.
type fakeSyncer struct {
	mu    sync.Mutex
	queue []*fakeSource
	irq   chan struct{} // nil: no interrupts; set before any producer runs

	syncMu sync.Mutex // one Sync at a time; guards spare
	spare  []*fakeSource

	syncs     atomic.Int64
	delivered atomic.Int64
}

func (s *fakeSyncer) notify(f *fakeSource) {
	s.mu.Lock()
	s.queue = append(s.queue, f)
	s.mu.Unlock()
	if s.irq != nil {
		select {
		case s.irq <- struct{}{}:
		default: // an interrupt is already due: it will see this one too
		}
	}
}

// Sync delivers the queued notifications. In steady state it allocates
// nothing (two buffers swap).
func (s *fakeSyncer) Sync() error {
	s.syncs.Add(1)
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	s.mu.Lock()
	s.queue, s.spare = s.spare[:0], s.queue
	s.mu.Unlock()
	for _, f := range s.spare {
		f.watchers.Wake()
	}
	s.delivered.Add(int64(len(s.spare)))
	return nil
}

// startInterrupts runs the interrupt goroutine until the test ends.
func (s *fakeSyncer) startInterrupts(t testing.TB) {
	s.irq = make(chan struct{}, 1)
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		for {
			select {
			case <-s.irq:
				_ = s.Sync()
			case <-done:
				return
			}
		}
	}()
	t.Cleanup(func() { close(done); <-exited })
}

// fakeSource is a CQ in miniature, modelled on QEMU's: a count of pending
// events (the ring), an arm that the next event spends, and a notification
// queued on its syncer. The event is visible (counted) before its
// notification is queued.
type fakeSource struct {
	pending  atomic.Int64
	armed    atomic.Bool
	watchers Watchers
	syncer   *fakeSyncer

	counter *Counter // Progress counts into it (a driven CQ)
	// inReady, when set, runs at the end of each Ready, after the source
	// was looked at: an event that lands in the middle of the caller's
	// work, deterministically. Single-goroutine tests only.
	inReady    func(f *fakeSource, arm bool)
	readies    atomic.Int64
	progresses atomic.Int64
}

var (
	_ Source = (*fakeSource)(nil)
	_ Synced = (*fakeSource)(nil)
	_ Driven = (*fakeSource)(nil)
)

func newFakeSources(s *fakeSyncer, n int) []*fakeSource {
	fs := make([]*fakeSource, n)
	for i := range fs {
		fs[i] = &fakeSource{syncer: s}
	}
	return fs
}

func (f *fakeSource) Watch(w Waker) error { return f.watchers.Add(w) }
func (f *fakeSource) Unwatch(w Waker)     { f.watchers.Remove(w) }
func (f *fakeSource) Syncer() Syncer      { return f.syncer }

func (f *fakeSource) Ready(arm bool, _ *uint64) (bool, error) {
	f.readies.Add(1)
	if arm {
		f.armed.CompareAndSwap(false, true)
	}
	ok := f.pending.Load() > 0
	if f.inReady != nil {
		f.inReady(f, arm)
	}
	return ok, nil
}

// produce makes k events visible, then spends the arm, if any, on a
// notification.
func (f *fakeSource) produce(k int) {
	f.pending.Add(int64(k))
	if f.armed.Swap(false) {
		f.syncer.notify(f)
	}
}

// drain takes every pending event.
func (f *fakeSource) drain() int { return int(f.pending.Swap(0)) }

// Progress takes the pending events and counts each on the counter, as
// CQ.Poll counts the completions of a QP bound to a counter.
func (f *fakeSource) Progress() (int, error) {
	f.progresses.Add(1)
	if f.counter == nil {
		return 0, errors.New("fakeSource: Progress with no counter")
	}
	n := f.drain()
	for range n {
		f.counter.Count(1)
	}
	return n, nil
}

// wakeCount is a Waker that counts its wake-ups.
type wakeCount struct{ n atomic.Int64 }

func (w *wakeCount) Wake() { w.n.Add(1) }

// funcWaker and sliceSource have types that cannot be compared.
type funcWaker struct{ f func() }

func (w funcWaker) Wake() { w.f() }

type sliceSource struct {
	*fakeSource
	tags []int
}

// fdReadable polls fd for ms milliseconds (0: just look).
func fdReadable(t testing.TB, fd, ms int) bool {
	t.Helper()
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(p, ms)
		if err == unix.EINTR {
			continue
		}
		require.NoError(t, err)
		return n > 0
	}
}

// signaled reports whether the wait object of an FD or Chan set is set,
// without consuming it.
func signaled(t testing.TB, ws *WaitSet) bool {
	t.Helper()
	switch ws.Kind() {
	case FD:
		fd, err := ws.FD()
		require.NoError(t, err)
		defer unix.Close(fd)
		return fdReadable(t, fd, 0)
	case Chan:
		return len(ws.C()) > 0
	}
	t.Fatalf("a %v set has no wait object", ws.Kind())
	return false
}

func newSetWith(t testing.TB, kind Kind, srcs ...Source) *WaitSet {
	t.Helper()
	ws, err := NewWaitSet(kind)
	require.NoError(t, err)
	for _, s := range srcs {
		require.NoError(t, ws.Add(s))
	}
	t.Cleanup(func() {
		for _, s := range srcs {
			_ = ws.Remove(s)
		}
		_ = ws.Close()
	})
	return ws
}

func asSources(fs []*fakeSource) []Source {
	out := make([]Source, len(fs))
	for i, f := range fs {
		out[i] = f
	}
	return out
}

func TestWatchersRefuseDuplicatesAndNilAndWakeEachOnce(t *testing.T) {
	var ws Watchers
	ws.Wake() // the zero value is ready
	a, b := &wakeCount{}, &wakeCount{}
	require.NoError(t, ws.Add(a))
	require.NoError(t, ws.Add(b))
	assert.ErrorIs(t, ws.Add(a), ErrBusy, "the same Waker twice")
	assert.ErrorIs(t, ws.Add(nil), errInvalid, "a nil Waker")
	assert.ErrorIs(t, ws.Add(funcWaker{func() {}}), errInvalid, "a Waker that cannot be compared")
	assert.Equal(t, 2, ws.Len())

	ws.Wake()
	assert.EqualValues(t, 1, a.n.Load())
	assert.EqualValues(t, 1, b.n.Load())

	assert.True(t, ws.Remove(a), "Remove of a watcher")
	assert.False(t, ws.Remove(a), "Remove twice")
	assert.False(t, ws.Remove(&wakeCount{}), "Remove of a stranger")
	ws.Wake()
	assert.EqualValues(t, 1, a.n.Load(), "a removed Waker was woken")
	assert.EqualValues(t, 2, b.n.Load())
	assert.Equal(t, 1, ws.Len())
	require.NoError(t, ws.Add(a), "re-adding after Remove")
	assert.Equal(t, 2, ws.Len())
}

// Add and Remove run concurrently with Wake (run under -race): a Waker
// that stays on the list all along gets every wake-up.
func TestWatchersWakeRacesAddAndRemove(t *testing.T) {
	var ws Watchers
	stay := &wakeCount{}
	require.NoError(t, ws.Add(stay))
	done := make(chan struct{})
	go func() {
		defer close(done)
		others := []*wakeCount{{}, {}, {}}
		for i := range 2000 {
			w := others[i%3]
			if ws.Add(w) == nil {
				assert.True(t, ws.Remove(w))
			}
		}
	}()
	const wakes = 2000
	for range wakes {
		ws.Wake()
	}
	<-done
	assert.EqualValues(t, wakes, stay.n.Load())
	assert.Equal(t, 1, ws.Len())
}

// TryWait on quiet members is nil and arms them (FD, Chan); with events it
// is ErrAgain and leaves the wait object set; once they are drained the
// TryWait that succeeds clears the object (no spinning fd); an event after
// it sets the object through the member's wake-up.
func TestTryWaitIsErrAgainWhilePendingAndClearsTheObjectWhenNot(t *testing.T) {
	for _, kind := range []Kind{FD, Chan, Yield} {
		t.Run(kind.String(), func(t *testing.T) {
			sy := &fakeSyncer{}
			fs := newFakeSources(sy, 4)
			ws := newSetWith(t, kind, asSources(fs)...)
			assert.Equal(t, kind, ws.Kind())
			assert.Equal(t, 4, ws.Len())

			require.NoError(t, ws.TryWait(), "quiet members")
			for i, f := range fs {
				assert.Equal(t, kind != Yield, f.armed.Load(), "member %d armed (a Yield set never arms)", i)
			}
			if kind == Yield {
				_, err := ws.FD()
				assert.ErrorIs(t, err, errInvalid, "FD of a yield set")
				assert.Nil(t, ws.C(), "C of a yield set")
				fs[1].produce(2)
				assert.ErrorIs(t, ws.TryWait(), ErrAgain)
				assert.ErrorIs(t, ws.TryWait(), ErrAgain, "not drained yet")
				fs[1].drain()
				assert.NoError(t, ws.TryWait(), "drained")
				return
			}
			if kind == FD {
				assert.Nil(t, ws.C(), "C of an fd set")
			} else {
				_, err := ws.FD()
				assert.ErrorIs(t, err, errInvalid, "FD of a chan set")
			}
			assert.False(t, signaled(t, ws), "set after a TryWait that succeeded")

			fs[1].produce(2) // its notification stays queued for now
			assert.ErrorIs(t, ws.TryWait(), ErrAgain)
			assert.True(t, signaled(t, ws), "ErrAgain left the object clear")
			assert.ErrorIs(t, ws.TryWait(), ErrAgain, "not drained yet")
			assert.True(t, signaled(t, ws), "ErrAgain left the object clear")

			fs[1].drain()
			require.NoError(t, sy.Sync()) // the stale notification
			require.NoError(t, ws.TryWait(), "drained")
			assert.False(t, signaled(t, ws), "the object stays set after a TryWait that succeeded (a spinning fd)")
			for i, f := range fs {
				assert.True(t, f.armed.Load(), "member %d not armed", i)
			}

			fs[3].produce(1)
			assert.EqualValues(t, 1, func() int64 { sy.mu.Lock(); defer sy.mu.Unlock(); return int64(len(sy.queue)) }())
			require.NoError(t, sy.Sync())
			assert.True(t, signaled(t, ws), "an event after TryWait did not set the object")
			assert.ErrorIs(t, ws.TryWait(), ErrAgain)
			fs[3].drain()
			require.NoError(t, ws.TryWait())
			assert.False(t, signaled(t, ws), "set after a TryWait that succeeded")

			// A member added with events: Add sets the object, TryWait
			// finds them.
			extra := &fakeSource{syncer: sy}
			extra.produce(1)
			require.NoError(t, ws.Add(extra))
			assert.True(t, signaled(t, ws), "Add of a member left the object clear")
			assert.ErrorIs(t, ws.TryWait(), ErrAgain)
			extra.drain()
			require.NoError(t, ws.TryWait())
			require.NoError(t, ws.Remove(extra))
		})
	}
}

// Wait returns, with no error, when another goroutine produces an event,
// and not before: the producer marks its event before producing it.
func TestWaitReturnsWhenAnotherGoroutineProduces(t *testing.T) {
	for _, kind := range []Kind{FD, Chan, Yield} {
		t.Run(kind.String(), func(t *testing.T) {
			sy := &fakeSyncer{}
			fs := newFakeSources(sy, 4)
			ws := newSetWith(t, kind, asSources(fs)...)
			for round := range 20 {
				for _, f := range fs {
					f.drain()
				}
				var produced atomic.Bool
				done := make(chan struct{})
				go func() {
					defer close(done)
					time.Sleep(time.Millisecond)
					produced.Store(true)
					fs[round%4].produce(1)
					_ = sy.Sync() // the interrupt
				}()
				ctx, cancel := context.WithTimeout(context.Background(), long)
				err := ws.Wait(ctx)
				cancel()
				require.NoError(t, err, "round %d", round)
				assert.True(t, produced.Load(), "round %d: Wait returned before the event", round)
				<-done
			}
		})
	}
}

// C holds a value once an event comes after a TryWait that succeeded.
func TestChanSetCReceivesAfterAnEvent(t *testing.T) {
	sy := &fakeSyncer{}
	fs := newFakeSources(sy, 2)
	ws := newSetWith(t, Chan, asSources(fs)...)
	require.NotNil(t, ws.C())
	require.NoError(t, ws.TryWait())
	select {
	case <-ws.C():
		t.Fatal("C holds a value with nothing pending")
	default:
	}
	go func() {
		time.Sleep(time.Millisecond)
		fs[1].produce(1)
		_ = sy.Sync()
	}()
	select {
	case <-ws.C():
	case <-time.After(long):
		t.Fatal("C got nothing after an event")
	}
	assert.EqualValues(t, 1, fs[1].pending.Load())
}

func TestWaitSetCloseAddAndRemoveRules(t *testing.T) {
	_, err := NewWaitSet(Kind(7))
	assert.ErrorIs(t, err, errInvalid, "an unknown kind")
	assert.Equal(t, "Kind(7)", Kind(7).String())

	for _, kind := range []Kind{FD, Chan, Yield} {
		t.Run(kind.String(), func(t *testing.T) {
			sy := &fakeSyncer{}
			fs := newFakeSources(sy, 2)
			ws, err := NewWaitSet(kind)
			require.NoError(t, err)
			require.NoError(t, ws.Add(fs[0]))
			assert.ErrorIs(t, ws.Add(fs[0]), ErrBusy, "the same source twice")
			assert.Equal(t, 1, ws.Len())
			assert.Equal(t, 1, fs[0].watchers.Len(), "a refused Add watched the source again")
			assert.ErrorIs(t, ws.Add(nil), errInvalid, "a nil source")
			assert.ErrorIs(t, ws.Add(sliceSource{fs[1], nil}), errInvalid, "a source that cannot be compared")
			assert.Error(t, ws.Remove(fs[1]), "Remove of a non-member")

			assert.ErrorIs(t, ws.Close(), ErrBusy, "Close with a member")
			require.NoError(t, ws.TryWait(), "a refused Close closed the set")
			require.NoError(t, ws.Remove(fs[0]))
			assert.Zero(t, fs[0].watchers.Len(), "Remove left the source watched")
			assert.Error(t, ws.Remove(fs[0]), "Remove twice")
			require.NoError(t, ws.Close())
			assert.NoError(t, ws.Close(), "Close twice")
			assert.ErrorIs(t, ws.TryWait(), ErrClosed)
			assert.ErrorIs(t, ws.Add(fs[0]), ErrClosed)
			assert.Zero(t, fs[0].watchers.Len(), "Add to a closed set watched the source")
			if kind == FD {
				_, err := ws.FD()
				assert.ErrorIs(t, err, ErrClosed)
			}
			ctx, cancel := context.WithTimeout(context.Background(), long)
			defer cancel()
			assert.ErrorIs(t, ws.Wait(ctx), ErrClosed, "Wait on a closed set")
		})
	}
}

// A goroutine asleep in Wait is released with ErrClosed when the set is
// closed (after its members are removed).
func TestCloseReleasesAGoroutineBlockedInWait(t *testing.T) {
	for _, kind := range []Kind{FD, Chan, Yield} {
		t.Run(kind.String(), func(t *testing.T) {
			sy := &fakeSyncer{}
			fs := newFakeSources(sy, 2)
			ws, err := NewWaitSet(kind)
			require.NoError(t, err)
			for _, f := range fs {
				require.NoError(t, ws.Add(f))
			}
			ctx, cancel := context.WithTimeout(context.Background(), long)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- ws.Wait(ctx) }()
			time.Sleep(5 * time.Millisecond) // let it fall asleep (either way, the rule holds)
			for _, f := range fs {
				require.NoError(t, ws.Remove(f))
			}
			require.NoError(t, ws.Close())
			select {
			case err := <-done:
				assert.ErrorIs(t, err, ErrClosed)
				assert.NotErrorIs(t, err, context.DeadlineExceeded)
			case <-time.After(2 * long):
				t.Fatal("Close did not release the waiter")
			}
		})
	}
}

// Wait returns the context's error when it ends first.
func TestWaitReturnsTheContextsError(t *testing.T) {
	for _, kind := range []Kind{FD, Chan, Yield} {
		t.Run(kind.String(), func(t *testing.T) {
			fs := newFakeSources(&fakeSyncer{}, 1)
			ws := newSetWith(t, kind, asSources(fs)...)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
			defer cancel()
			assert.ErrorIs(t, ws.Wait(ctx), context.DeadlineExceeded)
			ctx2, cancel2 := context.WithCancel(context.Background())
			cancel2()
			assert.ErrorIs(t, ws.Wait(ctx2), context.Canceled)
			// The set still works.
			fs[0].produce(1)
			assert.NoError(t, ws.Wait(context.Background()), "Wait with an event pending")
		})
	}
}

// TryWait over several waiters: nil only when all are quiet; ErrAgain when
// one has events, and every waiter is armed anyway; an error other than
// ErrAgain wins.
func TestTryWaitOverWaitersArmsAllAndPrefersRealErrors(t *testing.T) {
	sy := &fakeSyncer{}
	fs := newFakeSources(sy, 3)
	a := newSetWith(t, FD, fs[0])
	b := newSetWith(t, Chan, fs[1])
	c := NewCounter()
	_ = c.TryWait() // its first look may be a false positive (a new observer)
	require.NoError(t, TryWait(a, b, c))
	fs[0].produce(1)
	fs[1].armed.Store(false)
	assert.ErrorIs(t, TryWait(a, b, c), ErrAgain)
	assert.True(t, fs[1].armed.Load(), "the waiter after the one with events was not armed")
	fs[0].drain()
	require.NoError(t, TryWait(a, b, c))
	c.Count(1)
	assert.ErrorIs(t, TryWait(a, b, c), ErrAgain, "a counter that counted")
	require.NoError(t, TryWait(a, b, c))

	closed, err := NewWaitSet(FD)
	require.NoError(t, err)
	require.NoError(t, closed.Close())
	fs[1].produce(1)
	assert.ErrorIs(t, TryWait(b, closed), ErrClosed, "an error after ErrAgain")
	assert.ErrorIs(t, TryWait(closed, b), ErrClosed, "an error before ErrAgain")
	assert.NoError(t, TryWait())
	require.NoError(t, c.Close())
}

// The lost wake-up. A producer spends arms at random points of the
// consumer's drain, TryWait and sleep; an "interrupt" goroutine delivers
// the notifications; the consumer sleeps only after a TryWait that
// succeeded, on the wait object alone. A sleep that lasts 10 s while events
// are left is a lost wake-up. In the end every event is taken.
func TestTryWaitThenSleepNeverMissesAWakeUp(t *testing.T) {
	for _, tc := range []struct {
		name    string
		kind    Kind
		members string // "": 8 sources; "counter": and a counter; "driven": and a counter driving a 9th source
		total   int
	}{
		{"fd", FD, "", 200_000},
		{"chan", Chan, "", 200_000},
		{"fd+counter", FD, "counter", 100_000},
		{"chan+counter", Chan, "counter", 100_000},
		{"fd+driven-counter", FD, "driven", 100_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lostWakeUpRun(t, tc.kind, tc.members, tc.total, uint64(len(tc.name)))
		})
	}
}

func lostWakeUpRun(t *testing.T, kind Kind, members string, total int, seed uint64) {
	sy := &fakeSyncer{}
	sy.startInterrupts(t)
	fs := newFakeSources(sy, 8)
	srcs := asSources(fs)
	var c *Counter
	var driven *fakeSource
	if members != "" {
		c = NewCounter()
		srcs = append(srcs, c)
		if members == "driven" {
			driven = &fakeSource{syncer: sy, counter: c}
			require.NoError(t, c.Drive(driven))
		}
	}
	ws := newSetWith(t, kind, srcs...)

	var produced, consumed atomic.Int64
	quit := make(chan struct{})
	defer close(quit)
	perr := make(chan error, 1)
	go func() { // the producer
		rng := rand.New(rand.NewPCG(seed, 7))
		for n := 0; n < total; {
			k := min(1+rng.IntN(8), total-n)
			switch i := rng.IntN(len(fs) + 2); {
			case i < len(fs):
				fs[i].produce(k)
			case c == nil:
				fs[i%len(fs)].produce(k)
			case driven != nil && i == len(fs):
				driven.produce(k)
			default:
				c.Count(uint64(k))
			}
			n += k
			produced.Store(int64(n))
			switch r := rng.IntN(32); {
			case r == 0: // a lull: let the consumer catch up and fall asleep
				for consumed.Load() < int64(n) {
					select {
					case <-quit:
						perr <- nil
						return
					default:
					}
					runtime.Gosched()
				}
				if rng.IntN(2) == 0 {
					time.Sleep(time.Duration(rng.IntN(30)) * time.Microsecond)
				}
			case r < 6:
				runtime.Gosched()
			}
		}
		perr <- nil
	}()

	var timer *time.Timer
	if kind == Chan {
		timer = time.NewTimer(long)
		defer timer.Stop()
	}
	fd := -1
	if kind == FD {
		var err error
		fd, err = ws.FD()
		require.NoError(t, err)
		defer unix.Close(fd)
	}
	var got, lastC int64
	sleeps, agains := 0, 0
	for got < int64(total) {
		for _, f := range fs {
			got += int64(f.drain())
		}
		if c != nil {
			v, err := c.Read() // progresses the driven source
			require.NoError(t, err)
			got += int64(v) - lastC
			lastC = int64(v)
		}
		consumed.Store(got)
		if got >= int64(total) {
			break
		}
		err := ws.TryWait()
		if errors.Is(err, ErrAgain) {
			agains++
			continue
		}
		require.NoError(t, err)
		sleeps++
		woke := false
		if kind == FD {
			woke = fdReadable(t, fd, int(long/time.Millisecond))
		} else {
			timer.Reset(long)
			select {
			case <-ws.C():
				woke = true
			case <-timer.C:
			}
		}
		if !woke && produced.Load() > got {
			t.Fatalf("lost wake-up: asleep %v with %d events produced and %d taken (sleep %d)", long, produced.Load(), got, sleeps)
		}
	}
	require.NoError(t, <-perr)
	assert.EqualValues(t, total, got, "events taken")
	assert.EqualValues(t, total, produced.Load())
	for i, f := range fs {
		assert.Zero(t, f.pending.Load(), "source %d", i)
	}
	t.Logf("%v %s: %d events, %d sleeps, %d ErrAgain, %d notifications delivered in %d syncs",
		kind, members, total, sleeps, agains, sy.delivered.Load(), sy.syncs.Load())
	assert.Greater(t, sleeps, 100, "the consumer barely slept: the test did not exercise sleeping")
	if driven != nil {
		require.NoError(t, c.Undrive(driven))
	}
}

func TestCounterValuesCountAddSetAndRead(t *testing.T) {
	c := NewCounter()
	v, err := c.Read()
	require.NoError(t, err)
	assert.Zero(t, v)
	c.Count(3)
	c.Count(4)
	c.CountErr(1)
	c.Add(10)
	c.AddErr(2)
	v, err = c.Read()
	require.NoError(t, err)
	assert.EqualValues(t, 17, v)
	e, err := c.ReadErr()
	require.NoError(t, err)
	assert.EqualValues(t, 3, e)
	assert.EqualValues(t, 17, c.Value())
	assert.EqualValues(t, 3, c.Errors())
	c.Set(100)
	c.SetErr(5)
	assert.EqualValues(t, 100, c.Value())
	assert.EqualValues(t, 5, c.Errors())
	c.SetErr(0)
	c.Count(1)
	v, _ = c.Read()
	e, _ = c.ReadErr()
	assert.EqualValues(t, 101, v)
	assert.Zero(t, e)

	// Concurrent counts add up (run under -race).
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 1000 {
				c.Count(1)
				c.CountErr(2)
			}
		})
	}
	wg.Wait()
	assert.EqualValues(t, 4101, c.Value())
	assert.EqualValues(t, 8000, c.Errors())
	require.NoError(t, c.Close())
}

// Count events wake watchers; Add, AddErr, Set and SetErr do not.
func TestCounterCountIsAnEventAndAddOrSetIsNot(t *testing.T) {
	c := NewCounter()
	w := &wakeCount{}
	require.NoError(t, c.Watch(w))
	c.Add(1)
	c.AddErr(1)
	c.Set(5)
	c.SetErr(0)
	assert.Zero(t, w.n.Load(), "Add or Set woke a watcher")
	var mark uint64
	ok, err := c.Ready(false, &mark)
	require.NoError(t, err)
	assert.False(t, ok, "Add or Set made the counter ready")
	c.Count(1)
	assert.EqualValues(t, 1, w.n.Load())
	c.CountErr(1)
	assert.EqualValues(t, 2, w.n.Load())
	ok, _ = c.Ready(false, &mark)
	assert.True(t, ok, "counted since the mark")
	ok, _ = c.Ready(false, &mark)
	assert.False(t, ok, "Ready did not move the mark")
	c.Unwatch(w)
	c.Count(1)
	assert.EqualValues(t, 2, w.n.Load(), "an unwatched Waker was woken")
	require.NoError(t, c.Close())
}

func TestCounterWaitReturnsAtTheThresholdFromAnotherGoroutine(t *testing.T) {
	c := NewCounter()
	ctx, cancel := context.WithTimeout(context.Background(), long)
	defer cancel()
	go func() {
		for range 10 {
			time.Sleep(200 * time.Microsecond)
			c.Count(1)
		}
	}()
	require.NoError(t, c.Wait(ctx, 10))
	assert.GreaterOrEqual(t, c.Value(), uint64(10), "Wait returned below the threshold")

	go func() { time.Sleep(time.Millisecond); c.Add(5) }()
	require.NoError(t, c.Wait(ctx, 15), "Add reaches the threshold")
	assert.GreaterOrEqual(t, c.Value(), uint64(15))

	go func() { time.Sleep(time.Millisecond); c.Set(100) }()
	require.NoError(t, c.Wait(ctx, 100), "Set reaches the threshold")
	require.NoError(t, c.Wait(ctx, 3), "a threshold already passed")

	short, cancel2 := context.WithTimeout(context.Background(), 2*time.Millisecond)
	defer cancel2()
	assert.ErrorIs(t, c.Wait(short, 1000), context.DeadlineExceeded)
	require.NoError(t, c.Close())
}

// Wait returns ErrCounter when the error value moves while it waits, by
// CountErr or by AddErr; an error value that moved before is no error.
func TestCounterWaitReturnsErrCounterWhenTheErrorValueMoves(t *testing.T) {
	c := NewCounter()
	c.CountErr(3) // before the Wait: not its business
	ctx, cancel := context.WithTimeout(context.Background(), long)
	defer cancel()
	for _, move := range []func(){func() { c.CountErr(1) }, func() { c.AddErr(1) }} {
		done := make(chan error, 1)
		go func() { done <- c.Wait(ctx, 1000) }()
		// Move only once the Wait took its starting error value (it counts
		// itself a waiter after that): a move before is not its business.
		require.Eventually(t, func() bool { return c.nwait.Load() > 0 }, long, 100*time.Microsecond, "Wait never began waiting")
		move()
		select {
		case err := <-done:
			assert.ErrorIs(t, err, ErrCounter)
		case <-time.After(long):
			t.Fatal("Wait did not return when the error value moved")
		}
	}
	require.NoError(t, c.Close())
}

func TestCounterWaitIsReleasedByClose(t *testing.T) {
	c := NewCounter()
	done := make(chan error, 1)
	go func() { done <- c.Wait(context.Background(), 1000) }()
	time.Sleep(2 * time.Millisecond)
	require.NoError(t, c.Close())
	select {
	case err := <-done:
		assert.ErrorIs(t, err, ErrClosed)
	case <-time.After(long):
		t.Fatal("Close did not release Wait")
	}
	assert.ErrorIs(t, c.Wait(context.Background(), 1000), ErrClosed, "Wait after Close")
}

func TestCounterCloseIsRefusedWhileHeldOrInASet(t *testing.T) {
	c := NewCounter()
	require.NoError(t, c.Hold())
	require.NoError(t, c.Hold())
	assert.ErrorIs(t, c.Close(), ErrBusy, "held twice")
	c.Release()
	assert.ErrorIs(t, c.Close(), ErrBusy, "held once")
	c.Release()

	ws, err := NewWaitSet(FD)
	require.NoError(t, err)
	require.NoError(t, ws.Add(c))
	assert.ErrorIs(t, c.Close(), ErrBusy, "in a wait set")
	require.NoError(t, ws.Remove(c))
	require.NoError(t, ws.Close())

	ps := NewPollSet[int]()
	require.NoError(t, ps.Add(c, 1))
	assert.ErrorIs(t, c.Close(), ErrBusy, "in a poll set")
	require.NoError(t, ps.Remove(c))

	fd, err := c.FD() // its own wait set does not count
	require.NoError(t, err)
	require.NoError(t, unix.Close(fd))
	require.NoError(t, c.Close())
	assert.NoError(t, c.Close(), "Close twice")
	assert.ErrorIs(t, c.Hold(), ErrClosed)
	assert.ErrorIs(t, c.Watch(&wakeCount{}), ErrClosed)
	assert.ErrorIs(t, c.Drive(&fakeSource{}), ErrClosed)
	_, err = c.FD()
	assert.ErrorIs(t, err, ErrClosed)
	assert.ErrorIs(t, c.TryWait(), ErrClosed)
	ws2, err := NewWaitSet(Chan)
	require.NoError(t, err)
	assert.ErrorIs(t, ws2.Add(c), ErrClosed, "a closed counter into a set")
	require.NoError(t, ws2.Close())
}

// A counter that drives a source counts the source's events in Read, with
// nobody else touching the source.
func TestCounterReadProgressesItsDrivenSource(t *testing.T) {
	sy := &fakeSyncer{}
	c := NewCounter()
	d := &fakeSource{syncer: sy, counter: c}
	assert.ErrorIs(t, c.Drive(nil), errInvalid)
	assert.ErrorIs(t, c.Drive(sliceSource{d, nil}), errInvalid, "a source that cannot be compared")
	require.NoError(t, c.Drive(d))
	assert.ErrorIs(t, c.Drive(d), ErrBusy, "driven twice")
	assert.Equal(t, 1, d.watchers.Len(), "the counter watches what it drives")

	d.produce(4)
	assert.EqualValues(t, 0, c.Value(), "Value makes no progress")
	v, err := c.Read()
	require.NoError(t, err)
	assert.EqualValues(t, 4, v, "Read did not progress the driven source")
	assert.Zero(t, d.pending.Load())
	d.produce(2)
	_, err = c.ReadErr()
	require.NoError(t, err)
	assert.EqualValues(t, 6, c.Value(), "ReadErr did not progress the driven source")

	// The driven source's notification reaches the counter's watchers.
	w := &wakeCount{}
	require.NoError(t, c.Watch(w))
	ok, err := c.Ready(true, nil)
	require.NoError(t, err)
	assert.False(t, ok)
	assert.True(t, d.armed.Load(), "Ready(arm) did not arm the driven source")
	d.produce(1)
	require.NoError(t, sy.Sync())
	assert.EqualValues(t, 1, w.n.Load(), "the driven source's wake-up did not reach the counter's watcher")
	c.Unwatch(w)

	require.NoError(t, c.Undrive(d))
	assert.Error(t, c.Undrive(d), "Undrive twice")
	assert.Zero(t, d.watchers.Len(), "Undrive left the source watched")
	d.produce(5)
	v, _ = c.Read()
	assert.EqualValues(t, 6, v, "Read progressed an undriven source")

	require.NoError(t, c.Drive(d))
	require.NoError(t, c.Close())
	assert.Zero(t, d.watchers.Len(), "Close left the driven source watched")
}

// Wait progresses the driven source while it waits and sleeps between its
// events, woken by their notifications: events come from another goroutine
// with pauses between them, and the source is progressed a few times per
// event, not spun on.
func TestCounterWaitProgressesItsDrivenSourceAndSleepsBetweenEvents(t *testing.T) {
	const events = 50
	sy := &fakeSyncer{}
	c := NewCounter()
	d := &fakeSource{syncer: sy, counter: c}
	require.NoError(t, c.Drive(d))
	go func() {
		for range events {
			time.Sleep(500 * time.Microsecond)
			d.produce(1)
			_ = sy.Sync() // the interrupt
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), long)
	defer cancel()
	require.NoError(t, c.Wait(ctx, events))
	assert.EqualValues(t, events, c.Value())
	p := d.progresses.Load()
	t.Logf("%d progress calls for %d events", p, events)
	assert.LessOrEqual(t, p, int64(10*events), "Wait spun on the driven source instead of sleeping")
	require.NoError(t, c.Close())
}

// The counter's own FD and TryWait behave like a wait set's: readable once
// it counts (or its driven source has an event), cleared by the TryWait
// that succeeds.
func TestCounterFDAndTryWaitActLikeAWaitSet(t *testing.T) {
	sy := &fakeSyncer{}
	c := NewCounter()
	d := &fakeSource{syncer: sy, counter: c}
	require.NoError(t, c.Drive(d))
	fd, err := c.FD()
	require.NoError(t, err)
	defer unix.Close(fd)
	fd2, err := c.FD()
	require.NoError(t, err)
	defer unix.Close(fd2)
	assert.NotEqual(t, fd, fd2, "FD handed out the same descriptor twice")

	settle := func() {
		t.Helper()
		for range 2 { // a new observer may see one false positive
			if c.TryWait() == nil {
				return
			}
		}
		t.Fatal("TryWait stays ErrAgain with nothing counted")
	}
	settle()
	assert.False(t, fdReadable(t, fd, 0), "readable after a TryWait that succeeded")
	assert.True(t, d.armed.Load(), "TryWait did not arm the driven source")

	c.Count(1)
	assert.True(t, fdReadable(t, fd, 0), "not readable after Count")
	assert.True(t, fdReadable(t, fd2, 0), "a second FD is not the same wait object")
	assert.ErrorIs(t, c.TryWait(), ErrAgain)
	require.NoError(t, c.TryWait())
	assert.False(t, fdReadable(t, fd, 0))

	c.Add(3)
	c.Set(10)
	assert.False(t, fdReadable(t, fd, 0), "Add or Set made the fd readable")
	require.NoError(t, c.TryWait(), "Add or Set is not an event")

	d.produce(2)
	require.NoError(t, sy.Sync())
	assert.True(t, fdReadable(t, fd, 0), "the driven source's event did not make the fd readable")
	assert.ErrorIs(t, c.TryWait(), ErrAgain)
	assert.EqualValues(t, 12, c.Value(), "TryWait did not progress the driven source")
	require.NoError(t, c.TryWait())
	assert.False(t, fdReadable(t, fd, 0))

	// A goroutine sleeping on the fd wakes for a Count.
	go func() { time.Sleep(time.Millisecond); c.Count(1) }()
	assert.True(t, fdReadable(t, fd, int(long/time.Millisecond)), "asleep on the fd through a Count")
	require.NoError(t, c.Close())
}
