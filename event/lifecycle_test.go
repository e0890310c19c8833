package event

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Rule: Wait never outlives its ctx. Wait on a Chan set takes the token to
// see that the set is signaled and leaves it set by putting the token back
// without blocking. A Wake that claimed the flag before a TryWait's reset
// sends its token late, under the lowered flag: when that send lands
// between Wait's receive and its put-back, the channel is full, and a
// blocking put-back would wait for good, deaf to ctx (with free-running
// wakers, 1 try in 3 000 to 100 000 meets it). Here the late sender is a
// goroutine parked on the full channel while Wait takes the token, which
// hands the sender's token into the buffer at the receive: the put-back
// meets a full channel every time the sender parked first.
func TestWaitNeverOutlivesItsCtxWhenALateWakeFillsTheChannel(t *testing.T) {
	const rounds = 20
	for round := range rounds {
		f := &fakeSource{syncer: &fakeSyncer{}}
		ws, err := NewWaitSet(Chan)
		require.NoError(t, err)
		ws.SetSpin(0) // the hook is for TryWait's look, not the spin's
		require.NoError(t, ws.Add(f))
		late := make(chan struct{})
		f.inReady = func(f *fakeSource, arm bool) {
			f.inReady = nil
			ws.Wake() // a Wake during TryWait: the token is in
			go func() {
				defer close(late)
				ws.sig.ch <- struct{}{} // the late send of a Wake that claimed the flag before the reset
			}()
			for range 100 { // let the sender park on the full channel
				runtime.Gosched()
			}
			time.Sleep(time.Millisecond)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		done := make(chan error, 1)
		go func() { done <- ws.Wait(ctx) }()
		select {
		case err := <-done:
			// The set was signaled; on a loaded machine the ctx may have
			// ended by the time Wait looked, and either may win.
			if err != nil {
				assert.ErrorIs(t, err, context.DeadlineExceeded, "round %d", round)
			}
		case <-time.After(long):
			cancel()
			t.Fatalf("round %d: Wait still blocked %v after it began, with a ctx of 50ms", round, long)
		}
		cancel()
		// A Wait that its ctx ended leaves the token in: take it, so that
		// the late sender gets through.
		for ok := true; ok; {
			select {
			case <-late:
				ok = false
			case <-ws.sig.ch:
			}
		}
		require.NoError(t, ws.Remove(f))
		require.NoError(t, ws.Close())
	}
}

// Rule: the fd FD hands out is the caller's own dup. Closing it leaves the
// set working: events still raise its wait object and the next FD, and a
// Wait with nothing pending sleeps until its ctx ends, rather than
// returning nil at once on the closed number (a silent spin).
func TestWaitSetFDIsTheCallersToCloseAndTheSetStillWorks(t *testing.T) {
	f := &fakeSource{syncer: &fakeSyncer{}}
	ws := newSetWith(t, FD, f)
	fd, err := ws.FD()
	require.NoError(t, err)
	fd2, err := ws.FD()
	require.NoError(t, err)
	assert.NotEqual(t, fd, fd2, "FD handed out the same descriptor twice")
	require.NoError(t, unix.Close(fd), "the caller closes its fd")

	require.NoError(t, ws.TryWait())
	assert.False(t, fdReadable(t, fd2, 0), "set after a TryWait that succeeded")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, ws.Wait(ctx), context.DeadlineExceeded, "Wait with nothing pending after the caller closed its fd")

	f.produce(1)
	require.NoError(t, f.syncer.Sync())
	assert.True(t, fdReadable(t, fd2, 0), "another FD of the set is not raised by an event")
	assert.ErrorIs(t, ws.TryWait(), ErrAgain)
	assert.NoError(t, ws.Wait(context.Background()))
	f.drain()
	require.NoError(t, ws.TryWait())
	assert.False(t, fdReadable(t, fd2, 0))
	require.NoError(t, unix.Close(fd2))
}

// fdOpen reports whether fd is an open descriptor.
func fdOpen(fd int) bool {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	return err == nil
}

// Rule: closing one set's FD cannot hurt another. The caller closes set
// A's fd; set B's eventfd may then take that number; A's Close must not
// close it (A's fd is the caller's, and closing it again would close B's).
func TestClosingOneSetsFDLeavesAnotherSetUnaffected(t *testing.T) {
	a, err := NewWaitSet(FD)
	require.NoError(t, err)
	fdA, err := a.FD()
	require.NoError(t, err)
	require.NoError(t, unix.Close(fdA))

	fb := &fakeSource{syncer: &fakeSyncer{}}
	b := newSetWith(t, FD, fb)
	require.NoError(t, a.Close())

	fdB, err := b.FD()
	require.NoError(t, err)
	defer unix.Close(fdB)
	require.NoError(t, b.TryWait())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, b.Wait(ctx), context.DeadlineExceeded, "B's Wait with nothing pending")
	fb.produce(1)
	require.NoError(t, fb.syncer.Sync())
	assert.True(t, fdReadable(t, fdB, 0), "B's fd is not raised by its event")
	assert.ErrorIs(t, b.TryWait(), ErrAgain)
	fb.drain()
	require.NoError(t, b.TryWait())
	assert.False(t, fdReadable(t, fdB, 0))
}

// Rule: a dead eventfd is an error, never a spin, and the set never closes
// a number it no longer owns. Code that does not own it closes the set's
// own eventfd (the set never hands it out, so only such a bug can); the
// set finds EBADF on its next use, and from then on TryWait, Wait and FD
// report it; a new file that takes the number survives the set's Close.
func TestADeadEventfdIsAnErrorAndTheSetLeavesItsNumberAlone(t *testing.T) {
	ws, err := NewWaitSet(FD)
	require.NoError(t, err)
	own := ws.sig.efd
	require.NoError(t, unix.Close(own)) // the foreign bug

	ws.Wake()
	err = ws.TryWait()
	require.ErrorIs(t, err, unix.EBADF, "TryWait on a dead eventfd")
	ctx, cancel := context.WithTimeout(context.Background(), long)
	defer cancel()
	for range 3 {
		err := ws.Wait(ctx)
		require.ErrorIs(t, err, unix.EBADF, "Wait on a dead eventfd")
	}
	_, err = ws.FD()
	assert.ErrorIs(t, err, unix.EBADF, "FD of a dead set")

	other, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	require.NoError(t, err)
	defer unix.Close(other)
	require.Equal(t, own, other, "the lowest free number is the dead one")
	ws.Wake()
	assert.ErrorIs(t, ws.TryWait(), unix.EBADF, "the set went back to the number")
	assert.NoError(t, ws.Close())
	assert.True(t, fdOpen(other), "the set's Close closed a number it no longer owns")
	var buf [8]byte
	_, err = unix.Read(other, buf[:])
	assert.ErrorIs(t, err, unix.EAGAIN, "the set wrote to a number it no longer owns")
}

// Rule: after Close, every method that returns an error returns one
// wrapping ErrClosed, and a second Close returns nil: wait sets of each
// kind, poll sets and counters.
func TestEveryMethodAfterCloseReturnsErrClosed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), long)
	defer cancel()
	f := &fakeSource{syncer: &fakeSyncer{}}
	for _, kind := range []Kind{FD, Chan, Yield} {
		ws, err := NewWaitSet(kind)
		require.NoError(t, err)
		require.NoError(t, ws.Close())
		assert.NoError(t, ws.Close(), "%v: a second Close", kind)
		assert.ErrorIs(t, ws.Add(f), ErrClosed, "%v: Add", kind)
		assert.ErrorIs(t, ws.Remove(f), ErrClosed, "%v: Remove", kind)
		_, err = ws.FD()
		assert.ErrorIs(t, err, ErrClosed, "%v: FD", kind)
		assert.ErrorIs(t, ws.TryWait(), ErrClosed, "%v: TryWait", kind)
		assert.ErrorIs(t, ws.Wait(ctx), ErrClosed, "%v: Wait", kind)
		assert.ErrorIs(t, TryWait(ws), ErrClosed, "%v: event.TryWait", kind)
	}

	ps := NewPollSet[int]()
	require.NoError(t, ps.Add(f, 1))
	assert.ErrorIs(t, ps.Close(), ErrBusy, "PollSet.Close with a member")
	require.NoError(t, ps.Remove(f))
	require.NoError(t, ps.Close())
	assert.NoError(t, ps.Close(), "PollSet: a second Close")
	assert.ErrorIs(t, ps.Add(f, 1), ErrClosed, "PollSet.Add")
	assert.Zero(t, f.watchers.Len(), "Add to a closed poll set watched the source")
	assert.ErrorIs(t, ps.Remove(f), ErrClosed, "PollSet.Remove")
	_, err := ps.Poll(make([]int, 4))
	assert.ErrorIs(t, err, ErrClosed, "PollSet.Poll")

	c := NewCounter()
	d := &fakeSource{syncer: &fakeSyncer{}, counter: c}
	require.NoError(t, c.Drive(d))
	c.Count(3)
	require.NoError(t, c.Close())
	assert.NoError(t, c.Close(), "Counter: a second Close")
	v, err := c.Read()
	assert.ErrorIs(t, err, ErrClosed, "Counter.Read")
	assert.EqualValues(t, 3, v, "Counter.Read's value after Close")
	_, err = c.ReadErr()
	assert.ErrorIs(t, err, ErrClosed, "Counter.ReadErr")
	assert.ErrorIs(t, c.Wait(ctx, 1), ErrClosed, "Counter.Wait, threshold reached")
	assert.ErrorIs(t, c.Wait(ctx, 10), ErrClosed, "Counter.Wait")
	assert.ErrorIs(t, c.Drive(d), ErrClosed, "Counter.Drive")
	assert.ErrorIs(t, c.Undrive(d), ErrClosed, "Counter.Undrive")
	assert.Zero(t, d.watchers.Len(), "Close left the driven source watched")
	assert.ErrorIs(t, c.Watch(&wakeCount{}), ErrClosed, "Counter.Watch")
	assert.ErrorIs(t, c.Hold(), ErrClosed, "Counter.Hold")
	_, err = c.FD()
	assert.ErrorIs(t, err, ErrClosed, "Counter.FD")
	assert.ErrorIs(t, c.TryWait(), ErrClosed, "Counter.TryWait")
	var mark uint64
	_, err = c.Ready(true, &mark)
	assert.ErrorIs(t, err, ErrClosed, "Counter.Ready")
}

// Rule: a Wait racing Close returns nil or ErrClosed, promptly, and Close
// releases every waiter: several goroutines Wait on a quiet set or counter
// while Close runs at a random point of their start.
func TestWaitRacingCloseReturnsErrClosedAndCloseReleasesEveryWaiter(t *testing.T) {
	const rounds, waiters = 50, 4
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel() // a Wait that needs its ctx to return fails below first
	check := func(t *testing.T, what string, round int, errs chan error) {
		t.Helper()
		for range waiters {
			select {
			case err := <-errs:
				if err != nil {
					assert.ErrorIs(t, err, ErrClosed, "%s round %d", what, round)
				}
			case <-time.After(long):
				t.Fatalf("%s round %d: Close did not release a waiter", what, round)
			}
		}
	}
	for _, kind := range []Kind{FD, Chan, Yield} {
		for round := range rounds {
			ws, err := NewWaitSet(kind)
			require.NoError(t, err)
			errs := make(chan error, waiters)
			for range waiters {
				go func() { errs <- ws.Wait(ctx) }()
			}
			for range round % 7 {
				runtime.Gosched()
			}
			require.NoError(t, ws.Close())
			check(t, kind.String(), round, errs)
		}
	}
	for round := range rounds {
		c := NewCounter()
		errs := make(chan error, waiters)
		for range waiters {
			go func() { errs <- c.Wait(ctx, 1) }()
		}
		for range round % 7 {
			runtime.Gosched()
		}
		require.NoError(t, c.Close())
		check(t, "counter", round, errs)
	}
}

// Rule: the zero value of Counter is ready to use, like am.Counter's: its
// first Read returns 0 and no panic; so is the zero PollSet.
func TestZeroCounterAndPollSetAreReady(t *testing.T) {
	var c Counter
	v, err := c.Read()
	require.NoError(t, err)
	assert.Zero(t, v)
	c.Count(2)
	c.CountErr(1)
	assert.EqualValues(t, 2, c.Value())
	assert.EqualValues(t, 1, c.Errors())
	go func() { time.Sleep(time.Millisecond); c.Count(3) }()
	require.NoError(t, c.Wait(context.Background(), 5), "Wait on a zero counter")

	var ps PollSet[int]
	require.NoError(t, ps.Add(&c, 7), "Add to a zero poll set")
	f := &fakeSource{syncer: &fakeSyncer{}}
	require.NoError(t, ps.Add(f, 8))
	out := make([]int, 4)
	n, err := ps.Poll(out)
	require.NoError(t, err)
	assert.ElementsMatch(t, []int{7}, out[:n], "a new observer sees the counter's count")
	f.produce(1)
	c.Count(1)
	n, err = ps.Poll(out)
	require.NoError(t, err)
	assert.ElementsMatch(t, []int{7, 8}, out[:n])
	require.NoError(t, ps.Remove(&c))
	require.NoError(t, ps.Remove(f))
	require.NoError(t, ps.Close())

	var zc Counter
	fd, err := zc.FD()
	require.NoError(t, err, "FD of a zero counter")
	require.NoError(t, unix.Close(fd))
	require.NoError(t, zc.Close())
	var zc2 Counter
	require.NoError(t, zc2.Close(), "Close of an unused zero counter")
	assert.ErrorIs(t, zc2.Wait(context.Background(), 1), ErrClosed)
}

// Rule: Close releases every waiter, those asleep on their own FD too: the
// set raises its eventfd as it closes, the caller's dup becomes readable,
// and the caller's TryWait finds the set closed. The dup stays the
// caller's: it is still open after Close.
func TestCloseWakesACallerAsleepOnItsFD(t *testing.T) {
	ws, err := NewWaitSet(FD)
	require.NoError(t, err)
	fd, err := ws.FD()
	require.NoError(t, err)
	defer unix.Close(fd)
	require.NoError(t, ws.TryWait())
	require.False(t, fdReadable(t, fd, 0), "readable after a TryWait that succeeded")
	go func() {
		time.Sleep(time.Millisecond)
		_ = ws.Close()
	}()
	assert.True(t, fdReadable(t, fd, int(long/time.Millisecond)), "a caller asleep on its fd slept through Close")
	assert.ErrorIs(t, ws.TryWait(), ErrClosed)
	assert.True(t, fdOpen(fd), "Close closed the caller's fd")
}
