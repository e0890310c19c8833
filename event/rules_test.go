package event

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Tests that pin down rules no other test guards: each one fails when the
// fault its comment names ("Fault caught: ...") is planted in the
// package's code.

// asleepInSignalWait waits until n goroutines are parked in the select of
// signal.wait: asleep on the wait object, past every check that comes
// before the sleep.
func asleepInSignalWait(t *testing.T, n int) {
	t.Helper()
	parkedIn(t, n, "[select", "event.(*signal).wait(")
}

// parkedIn waits until n goroutines are parked in state (as a stack dump
// shows it: "[select", "[sync.Mutex.Lock") with fn on their stacks. It
// reads the goroutines' stacks, not a clock; the bound is a hang guard
// only.
func parkedIn(t *testing.T, n int, state, fn string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	deadline := time.Now().Add(long)
	for {
		k := 0
		for g := range strings.SplitSeq(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			header, _, _ := strings.Cut(g, "\n")
			if strings.Contains(header, state) && strings.Contains(g, fn) {
				k++
			}
		}
		if k >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d goroutines parked %s in %s after %v", k, n, state, fn, long)
		}
		runtime.Gosched()
	}
}

// errSource is a member whose readiness check fails while err is set.
type errSource struct {
	fakeSource
	err error
}

func (e *errSource) Ready(arm bool, mark *uint64) (bool, error) {
	if e.err != nil {
		return false, e.err
	}
	return e.fakeSource.Ready(arm, mark)
}

// windowSource is a driven source whose next Progress runs afterProgress
// once, after it took what was there: an event that lands between a
// counter's progress and its arming, deterministically.
type windowSource struct {
	*fakeSource
	afterProgress func()
}

func (w *windowSource) Progress() (int, error) {
	n, err := w.fakeSource.Progress()
	if h := w.afterProgress; h != nil {
		w.afterProgress = nil
		h()
	}
	return n, err
}

// brokenSource is a driven source whose Progress or arming fails.
type brokenSource struct {
	*fakeSource
	progressErr, armErr error
}

func (b *brokenSource) Progress() (int, error) {
	if b.progressErr != nil {
		return 0, b.progressErr
	}
	return b.fakeSource.Progress()
}

func (b *brokenSource) Ready(arm bool, mark *uint64) (bool, error) {
	if arm && b.armErr != nil {
		return false, b.armErr
	}
	return b.fakeSource.Ready(arm, mark)
}

// waiterFunc is a Waiter made of a function.
type waiterFunc func() error

func (f waiterFunc) TryWait() error { return f() }

// settle calls TryWait until it succeeds: a new member's first look may be
// a false positive.
func settle(t *testing.T, w Waiter) {
	t.Helper()
	for range 3 {
		if w.TryWait() == nil {
			return
		}
	}
	t.Fatal("TryWait stays ErrAgain with nothing pending")
}

// Rule: cancelling a context that has no deadline (context.WithCancel)
// wakes a goroutine already asleep in Wait, which returns the context's
// error; the set still works afterwards. (Fault caught: the select in
// signal.wait without its ctx.Done case.)
func TestCancellingAContextWithoutDeadlineWakesAnFDWaitSetWait(t *testing.T) {
	for _, kind := range []Kind{FD, Chan} {
		t.Run(kind.String(), func(t *testing.T) {
			f := &fakeSource{syncer: &fakeSyncer{}}
			ws := newSetWith(t, kind, f)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			_, has := ctx.Deadline()
			require.False(t, has)
			done := make(chan error, 1)
			go func() { done <- ws.Wait(ctx) }()
			asleepInSignalWait(t, 1)
			cancel()
			select {
			case err := <-done:
				assert.ErrorIs(t, err, context.Canceled)
			case <-time.After(long):
				t.Fatal("a cancelled context did not wake the goroutine asleep in Wait")
			}
			f.produce(1)
			assert.NoError(t, ws.Wait(context.Background()), "Wait with an event pending after a cancel")
		})
	}
}

// Rule: members of a poll set that share a Syncer (the device whose
// notification ring delivers their wake-ups) each keep it: removing one
// leaves the other idle member woken, and reported, when its source makes
// progress. (Fault caught: Remove dropping the Syncer while another member
// still uses it; Poll no longer syncs it, the notification stays queued and
// the idle member is never checked again.)
func TestRemovingOneOfTwoMembersSharingASyncerStillWakesTheOther(t *testing.T) {
	for _, removed := range []int{0, 1} {
		t.Run(fmt.Sprintf("remove-%d", removed), func(t *testing.T) {
			sy := &fakeSyncer{}
			fs := newFakeSources(sy, 2)
			ps := NewPollSet[int]()
			ps.SetIdleAfter(1)
			for i, f := range fs {
				require.NoError(t, ps.Add(f, i))
			}
			assert.Empty(t, pollOnce(t, ps, 4))
			require.EqualValues(t, 2, ps.Stats().Idled, "both members idle, armed")
			require.NoError(t, ps.Remove(fs[removed]))
			kept := 1 - removed
			fs[kept].produce(1) // its notification is queued on the shared syncer
			assert.Equal(t, []int{kept}, pollOnce(t, ps, 4), "the member left idle was not woken by its event")
			require.NoError(t, ps.Remove(fs[kept]))
			require.NoError(t, ps.Close())
		})
	}
}

// Rule: a poll set syncs each Syncer exactly while at least one member
// uses it: from its first member (a set whose only member is idle still
// sees that member's event) until its last is removed (then the set never
// syncs it again), and removing one Syncer's last member leaves the other
// Syncers synced. (Faults caught: the Syncer listed only from its second
// member; removing the last member's Syncer taking out the others and
// keeping it.)
func TestAPollSetSyncsEachSyncerWhileAMemberUsesIt(t *testing.T) {
	sys := []*fakeSyncer{{}, {}}
	fs := []*fakeSource{{syncer: sys[0]}, {syncer: sys[1]}}
	ps := NewPollSet[int]()
	ps.SetIdleAfter(1)
	for i, f := range fs {
		require.NoError(t, ps.Add(f, i))
	}
	assert.Empty(t, pollOnce(t, ps, 4))
	require.EqualValues(t, 2, ps.Stats().Idled, "both members idle, armed")
	for i, f := range fs {
		f.produce(1) // its notification waits on its own syncer
		assert.Equal(t, []int{i}, pollOnce(t, ps, 4), "the only member of syncer %d was not woken by its event", i)
		f.drain()
		assert.Empty(t, pollOnce(t, ps, 4)) // idle and armed again
	}

	require.NoError(t, ps.Remove(fs[0]))
	syncs := sys[0].syncs.Load()
	fs[1].produce(1)
	assert.Equal(t, []int{1}, pollOnce(t, ps, 4), "removing syncer 0's last member stopped syncer 1")
	assert.Equal(t, syncs, sys[0].syncs.Load(), "the set still syncs a syncer no member uses")
	require.NoError(t, ps.Remove(fs[1]))
	require.NoError(t, ps.Close())
}

// Rule: an Add that a source's Watch refuses leaves no slot behind: the
// next Add takes the slot it would have taken. (Fault caught: the slot of a
// refused Add never freed, so a source that keeps failing grows the set.)
func TestARefusedAddLeavesNoSlotBehind(t *testing.T) {
	ps := NewPollSet[int]()
	closed := NewCounter()
	require.NoError(t, closed.Close())
	for range 100 {
		require.Error(t, ps.Add(closed, 0), "Watch of a closed counter")
	}
	f := &fakeSource{syncer: &fakeSyncer{}}
	require.NoError(t, ps.Add(f, 1))
	assert.Len(t, ps.members, 1, "slots left behind by the refused Adds")
	assert.Len(t, ps.words, 1)
	require.NoError(t, ps.Remove(f))
	require.NoError(t, ps.Close())
}

// Rule: Remove takes out the member it names, wherever it was added: of
// A, B and C, removing B leaves A and C members whose events count, and B
// no longer watched or reported. (Fault caught: the member list cut at the
// wrong index, dropping A and keeping B.)
func TestRemoveTakesOutTheNamedMemberWhenItIsNotTheFirst(t *testing.T) {
	for _, kind := range []Kind{FD, Chan, Yield} {
		t.Run("waitset/"+kind.String(), func(t *testing.T) {
			fs := newFakeSources(&fakeSyncer{}, 3)
			a, b, c := fs[0], fs[1], fs[2]
			ws, err := NewWaitSet(kind)
			require.NoError(t, err)
			for _, f := range fs {
				require.NoError(t, ws.Add(f))
			}
			require.NoError(t, ws.Remove(b))
			assert.Equal(t, 2, ws.Len())
			assert.Zero(t, b.watchers.Len(), "B still watched")
			assert.Equal(t, 1, a.watchers.Len(), "A no longer watched")
			assert.Equal(t, 1, c.watchers.Len(), "C no longer watched")
			assert.ErrorIs(t, ws.Remove(b), errInvalid, "B is still a member")
			settle(t, ws)

			b.produce(1)
			assert.NoError(t, ws.TryWait(), "B's event counts after B was removed")
			for name, f := range map[string]*fakeSource{"A": a, "C": c} {
				f.produce(1)
				assert.ErrorIs(t, ws.TryWait(), ErrAgain, "%s's event does not count", name)
				f.drain()
				assert.NoError(t, ws.TryWait())
			}
			require.NoError(t, ws.Remove(a))
			require.NoError(t, ws.Remove(c))
			require.NoError(t, ws.Close())
		})
	}
	t.Run("pollset", func(t *testing.T) {
		fs := newFakeSources(&fakeSyncer{}, 3)
		a, b, c := fs[0], fs[1], fs[2]
		ps := NewPollSet[string]()
		for i, f := range fs {
			require.NoError(t, ps.Add(f, string(rune('A'+i))))
			f.produce(1)
		}
		require.NoError(t, ps.Remove(b))
		assert.Equal(t, 2, ps.Len())
		assert.Zero(t, b.watchers.Len(), "B still watched")
		assert.Equal(t, 1, a.watchers.Len(), "A no longer watched")
		assert.Equal(t, 1, c.watchers.Len(), "C no longer watched")
		assert.ErrorIs(t, ps.Remove(b), errInvalid, "B is still a member")
		got := pollOnce(t, ps, 4)
		slices.Sort(got)
		assert.Equal(t, []string{"A", "C"}, got)
		require.NoError(t, ps.Remove(a))
		require.NoError(t, ps.Remove(c))
		require.NoError(t, ps.Close())
	})
}

// Rule: a driven counter passes its source's errors on: when the source's
// progress fails, Read, ReadErr, Wait, Ready and TryWait return that
// error (Wait at once, not after its ctx); when arming the source fails,
// Wait returns that error rather than sleep unarmed. (Faults caught:
// progress dropping Progress's error; Wait ignoring the arming's error.)
func TestADrivenCountersSourceErrorsReachReadAndWait(t *testing.T) {
	errProgress := errors.New("progress failed")
	errArm := errors.New("arming failed")
	ctx, cancel := context.WithTimeout(context.Background(), long) // a hang guard
	defer cancel()

	c := NewCounter()
	d := &brokenSource{fakeSource: &fakeSource{syncer: &fakeSyncer{}}}
	d.counter = c
	require.NoError(t, c.Drive(d))
	fd, err := c.FD()
	require.NoError(t, err)
	defer unix.Close(fd)
	settle(t, c)

	d.progressErr = errProgress
	_, err = c.Read()
	assert.ErrorIs(t, err, errProgress, "Read")
	_, err = c.ReadErr()
	assert.ErrorIs(t, err, errProgress, "ReadErr")
	assert.ErrorIs(t, c.Wait(ctx, 1), errProgress, "Wait")
	_, err = c.Ready(true, nil)
	assert.ErrorIs(t, err, errProgress, "Ready")
	assert.ErrorIs(t, c.TryWait(), errProgress, "TryWait")

	d.progressErr = nil
	d.armErr = errArm
	assert.ErrorIs(t, c.Wait(ctx, 1), errArm, "Wait, arming")
	assert.NoError(t, ctx.Err(), "Wait waited for its ctx")

	d.armErr = nil
	d.produce(1)
	v, err := c.Read()
	require.NoError(t, err, "the source recovered")
	assert.EqualValues(t, 1, v)
	require.NoError(t, c.Undrive(d))
	require.NoError(t, c.Close())
}

// Rule: a TryWait that fails on a member's readiness check leaves the wait
// object signaled: the members after the failing one were neither checked
// nor armed, so a caller asleep on the fd (or the channel) must not sleep
// through their events. (Fault caught: WaitSet.TryWait returning the error
// without raising the object its reset cleared.)
func TestATryWaitThatFailsOnAMemberLeavesTheObjectSignaled(t *testing.T) {
	boom := errors.New("readiness check failed")
	for _, kind := range []Kind{FD, Chan} {
		t.Run(kind.String(), func(t *testing.T) {
			sy := &fakeSyncer{}
			bad := &errSource{fakeSource: fakeSource{syncer: sy}}
			f := &fakeSource{syncer: sy}
			ws := newSetWith(t, kind, bad, f)
			settle(t, ws)
			require.False(t, signaled(t, ws))

			f.produce(1)
			require.NoError(t, sy.Sync()) // its wake-up: the object is raised
			bad.err = boom
			assert.ErrorIs(t, ws.TryWait(), boom)
			assert.True(t, signaled(t, ws), "a failed TryWait left the object clear")
			assert.ErrorIs(t, TryWait(ws), boom, "event.TryWait")
			assert.True(t, signaled(t, ws), "a failed TryWait left the object clear")

			bad.err = nil
			ctx, cancel := context.WithTimeout(context.Background(), long) // a hang guard
			defer cancel()
			assert.NoError(t, ws.Wait(ctx), "a later Wait")
			assert.ErrorIs(t, ws.TryWait(), ErrAgain, "a later TryWait")
			f.drain()
			assert.NoError(t, ws.TryWait())
		})
	}
}

// Rule: TryWait over several waiters reports the first error that is not
// ErrAgain, wherever ErrAgain and later errors come, and tries every
// waiter even after one failed, so each is armed. (Faults caught: a later
// error replacing the first; a return at the first error, leaving the
// waiters after it unarmed.)
func TestTryWaitOverWaitersReportsTheFirstRealErrorAndTriesThemAll(t *testing.T) {
	e1, e2 := errors.New("first"), errors.New("second")
	fail1 := waiterFunc(func() error { return e1 })
	fail2 := waiterFunc(func() error { return e2 })
	again := waiterFunc(func() error { return ErrAgain })
	quiet := waiterFunc(func() error { return nil })
	for _, tc := range []struct {
		name string
		ws   []Waiter
		want error
	}{
		{"two errors", []Waiter{fail1, fail2}, e1},
		{"two errors, reversed", []Waiter{fail2, fail1}, e2},
		{"ErrAgain, then two errors", []Waiter{again, fail1, again, fail2}, e1},
		{"quiet, error, ErrAgain", []Waiter{quiet, fail2, again}, e2},
		{"ErrAgain only", []Waiter{quiet, again, again}, ErrAgain},
	} {
		err := TryWait(tc.ws...)
		assert.ErrorIs(t, err, tc.want, tc.name)
		if tc.want != ErrAgain {
			assert.NotErrorIs(t, err, ErrAgain, tc.name)
		}
	}

	sy := &fakeSyncer{}
	fs := newFakeSources(sy, 2)
	ws := newSetWith(t, FD, fs[0])
	ws2 := newSetWith(t, Chan, fs[1])
	settle(t, ws)
	settle(t, ws2)
	fs[0].armed.Store(false)
	fs[1].armed.Store(false)
	assert.ErrorIs(t, TryWait(fail1, ws, fail2, ws2), e1)
	assert.True(t, fs[0].armed.Load(), "a waiter after a failed one was not tried")
	assert.True(t, fs[1].armed.Load(), "a waiter after two failed ones was not tried")
}

// Rule: an event that lands between a counter's progress and its arming of
// the driven source is not slept through: the arming's look reports it
// (Ready, TryWait) and Wait checks again after arming. The source is
// driven after the counter joined the set, so it was never armed and the
// event makes no notification: only those looks can see it. (Faults
// caught: Counter.Ready ignoring what arming the driven source reported;
// Wait sleeping without its check after arming.)
func TestACounterSeesAnEventBetweenItsProgressAndItsArming(t *testing.T) {
	newDriven := func(t *testing.T, c *Counter) *windowSource {
		d := &windowSource{fakeSource: &fakeSource{syncer: &fakeSyncer{}, counter: c}}
		require.NoError(t, c.Drive(d))
		d.afterProgress = func() { d.produce(1) }
		return d
	}
	t.Run("Ready", func(t *testing.T) {
		c := NewCounter()
		d := newDriven(t, c)
		ok, err := c.Ready(true, nil)
		require.NoError(t, err)
		require.Nil(t, d.afterProgress, "the event did not land")
		assert.True(t, ok, "the event that landed before the arming was not reported")
		require.NoError(t, c.Close())
	})
	t.Run("TryWait", func(t *testing.T) {
		c := NewCounter()
		ws := newSetWith(t, FD, c)
		settle(t, ws)
		d := newDriven(t, c)
		err := ws.TryWait()
		require.Nil(t, d.afterProgress, "the event did not land")
		require.Zero(t, queued(d.syncer), "the event made a notification: the window was not exercised")
		if err == nil {
			assert.True(t, signaled(t, ws), "TryWait said sleep with the wait object clear: the event is slept through")
		}
		assert.ErrorIs(t, err, ErrAgain)
		v, err := c.Read()
		require.NoError(t, err)
		assert.EqualValues(t, 1, v)
		require.NoError(t, c.Undrive(d))
	})
	t.Run("Wait", func(t *testing.T) {
		c := NewCounter()
		d := newDriven(t, c)
		ctx, cancel := context.WithTimeout(context.Background(), long) // a hang guard
		defer cancel()
		assert.NoError(t, c.Wait(ctx, 1), "Wait slept through the event that landed before its arming")
		require.Nil(t, d.afterProgress, "the event did not land")
		assert.EqualValues(t, 1, c.Value())
		require.NoError(t, c.Close())
	})
}

// Rule: a counter whose Wait has returned, by whichever way out (its
// threshold met before it slept or after, its context ended, its arming
// failed), has no waiter left: Count and Add, with nobody waiting, touch
// no lock or channel. (Fault caught: the way out after the check that
// follows the arming leaving the waiter counted, which makes every later
// Count take the channel's lock.)
func TestEveryWayOutOfACounterWaitLeavesNoWaiterBehind(t *testing.T) {
	ctx := func(t *testing.T) context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), long) // a hang guard
		t.Cleanup(cancel)
		return ctx
	}
	t.Run("met-before-any-sleep", func(t *testing.T) {
		c := NewCounter()
		c.Count(1)
		require.NoError(t, c.Wait(ctx(t), 1))
		assert.Zero(t, c.nwait.Load())
	})
	t.Run("met-by-the-check-after-arming", func(t *testing.T) {
		c := NewCounter()
		d := &windowSource{fakeSource: &fakeSource{syncer: &fakeSyncer{}, counter: c}}
		require.NoError(t, c.Drive(d))
		d.afterProgress = func() { d.produce(1) }
		require.NoError(t, c.Wait(ctx(t), 1))
		require.Nil(t, d.afterProgress, "the event did not land in the window")
		assert.Zero(t, c.nwait.Load())
	})
	t.Run("met-after-sleeping", func(t *testing.T) {
		c := NewCounter()
		done := make(chan error, 1)
		go func() { done <- c.Wait(ctx(t), 1) }()
		require.Eventually(t, func() bool { return c.nwait.Load() == 1 }, long, time.Millisecond)
		c.Count(1)
		require.NoError(t, <-done)
		assert.Zero(t, c.nwait.Load())
	})
	t.Run("context-ended", func(t *testing.T) {
		c := NewCounter()
		cctx, cancel := context.WithCancel(ctx(t))
		cancel()
		assert.ErrorIs(t, c.Wait(cctx, 1), context.Canceled)
		assert.Zero(t, c.nwait.Load())
	})
	t.Run("arming-failed", func(t *testing.T) {
		c := NewCounter()
		b := &brokenSource{fakeSource: &fakeSource{syncer: &fakeSyncer{}, counter: c}, armErr: errors.New("arming failed")}
		require.NoError(t, c.Drive(b))
		assert.Error(t, c.Wait(ctx(t), 1))
		assert.Zero(t, c.nwait.Load())
	})
}

// queued returns how many notifications wait on s.
func queued(s *fakeSyncer) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue)
}

// --- signal.go: the wait object.

// Rule: each Kind names itself; an unknown one shows its number.
// (Fault caught: a wrong or missing name.)
func TestKindStringNamesEachKind(t *testing.T) {
	assert.Equal(t, "fd", FD.String())
	assert.Equal(t, "chan", Chan.String())
	assert.Equal(t, "yield", Yield.String())
	assert.Equal(t, "Kind(3)", Kind(3).String())
	assert.Equal(t, "Kind(-1)", Kind(-1).String())
}

// Rule: an FD set's eventfd is non-blocking (a drain of a clear fd or a
// raise of a saturated one must fail with EAGAIN, never sleep) and
// close-on-exec, and every fd FD hands out is a new close-on-exec
// descriptor (no child process inherits the set's wait object). (Faults
// caught: the eventfd made without EFD_NONBLOCK or EFD_CLOEXEC; the dup
// made with F_DUPFD.)
func TestTheEventfdAndItsDupsAreNonBlockingAndCloseOnExec(t *testing.T) {
	ws := newSetWith(t, FD)
	own := ws.sig.efd
	fd, err := ws.FD()
	require.NoError(t, err)
	defer unix.Close(fd)
	assert.NotEqual(t, own, fd)
	for name, n := range map[string]int{"the set's eventfd": own, "FD's dup": fd} {
		fl, err := unix.FcntlInt(uintptr(n), unix.F_GETFL, 0)
		require.NoError(t, err)
		assert.NotZero(t, fl&unix.O_NONBLOCK, "%s blocks", name)
		fdfl, err := unix.FcntlInt(uintptr(n), unix.F_GETFD, 0)
		require.NoError(t, err)
		assert.NotZero(t, fdfl&unix.FD_CLOEXEC, "%s is inherited across exec", name)
	}
}

// readEventfd reads the set's eventfd counter (and clears it).
func readEventfd(t *testing.T, ws *WaitSet) uint64 {
	t.Helper()
	var b [8]byte
	n, err := unix.Read(ws.sig.efd, b[:])
	if err == unix.EAGAIN {
		return 0
	}
	require.NoError(t, err)
	require.Equal(t, 8, n)
	return binary.NativeEndian.Uint64(b[:])
}

// Rule: a Wake while the object is already raised is cheap: only the first
// Wake after a TryWait cleared it reaches the wait object (one write to the
// eventfd, one token in the channel). (Fault caught: set without its
// claim of the flag, writing the eventfd on every Wake.)
func TestOnlyTheFirstWakeAfterATryWaitRaisesTheWaitObject(t *testing.T) {
	ws := newSetWith(t, FD)
	require.NoError(t, ws.TryWait())
	for range 3 {
		ws.Wake()
	}
	assert.EqualValues(t, 1, readEventfd(t, ws), "eventfd writes for three Wakes")
	assert.EqualValues(t, 1, ws.sig.raised.Load(), "raises counted for three Wakes")
}

// Rule: a saturated eventfd (a raise fails with EAGAIN) is raised anyway:
// neither a Wake nor Close kills the set for it, TryWait clears it, and
// Close still closes the set's eventfd. (Faults caught: EAGAIN not taken
// as success by set's raise or by close's raise; the set then reports an
// error forever, or leaks its eventfd.)
func TestASaturatedEventfdCountsAsRaisedAndTheSetStillCloses(t *testing.T) {
	saturate := func(t *testing.T, ws *WaitSet) {
		t.Helper()
		max := binary.NativeEndian.AppendUint64(nil, 1<<64-2) // the largest value an eventfd holds
		_, err := unix.Write(ws.sig.efd, max)
		require.NoError(t, err)
	}
	ws, err := NewWaitSet(FD)
	require.NoError(t, err)
	require.NoError(t, ws.TryWait())
	saturate(t, ws)
	ws.Wake()
	assert.NoError(t, ws.sig.err(), "a raise of a saturated eventfd killed the set")
	require.NoError(t, ws.TryWait())
	assert.False(t, signaled(t, ws), "TryWait did not clear the saturated eventfd")
	ws.Wake()
	assert.True(t, signaled(t, ws), "the set no longer raises its eventfd")
	require.NoError(t, ws.TryWait())

	saturate(t, ws)
	own := ws.sig.efd
	require.NoError(t, ws.Close())
	assert.False(t, fdOpen(own), "Close left a saturated eventfd open")
}

// Rule: a drain that finds the eventfd already clear is no error. That is
// the state a Wake leaves when it claimed the flag and has not written the
// eventfd yet as a TryWait runs: the TryWait drains a clear eventfd, and
// the set must stay alive. (Fault caught: drainFD not taking EAGAIN as
// "already clear", killing the set.)
func TestADrainThatFindsTheEventfdClearIsNoError(t *testing.T) {
	ws := newSetWith(t, FD)
	require.NoError(t, ws.TryWait())
	ws.sig.on.Store(true) // a Wake between its claim and its write
	assert.NoError(t, ws.TryWait())
	assert.NoError(t, ws.sig.err())
	ws.Wake()
	assert.True(t, signaled(t, ws), "the set no longer raises its eventfd")
}

// Rule: a Wake that claimed the flag before a TryWait's reset and raised
// the object after its drain leaves the object raised under a lowered
// flag; the next TryWait drains it, so that the waiter wakes once for it
// and the fd does not stay readable (a spinning fd). The state is set up
// as that interleaving leaves it: a Wake, then the reset's lowering of the
// flag. (Fault caught: set not counting its raise, so reset takes the
// raised object for a clear one.)
func TestARaiseAfterAResetsDrainIsDrainedByTheNextTryWait(t *testing.T) {
	for _, kind := range []Kind{FD, Chan} {
		t.Run(kind.String(), func(t *testing.T) {
			ws := newSetWith(t, kind)
			require.NoError(t, ws.TryWait())
			ws.Wake()
			ws.sig.on.Store(false) // the reset lowered the flag after its drain
			require.True(t, signaled(t, ws))
			require.NoError(t, ws.TryWait())
			assert.False(t, signaled(t, ws), "a late raise stays on the object after TryWait succeeded")
			ws.Wake()
			assert.True(t, signaled(t, ws), "a Wake after that TryWait")
		})
	}
}

// Rule: an idle TryWait (the flag down, no raise since the last drain)
// makes no system call on the eventfd. Every use of the number holds
// fdMu shared, so with fdMu held exclusively, an idle TryWait must still
// return. (Faults caught: reset draining without looking at the flag and
// the raise count; reset not recording what it drained, so that every
// later TryWait drains again.)
func TestAnIdleTryWaitMakesNoSystemCall(t *testing.T) {
	f := &fakeSource{syncer: &fakeSyncer{}}
	ws := newSetWith(t, FD, f)
	settle(t, ws)
	ws.Wake()
	require.NoError(t, ws.TryWait()) // drains the raise
	ws.sig.fdMu.Lock()
	done := make(chan error, 1)
	go func() { done <- ws.TryWait() }()
	select {
	case err := <-done:
		assert.NoError(t, err)
		ws.sig.fdMu.Unlock()
	case <-time.After(long):
		t.Error("an idle TryWait used the eventfd")
		ws.sig.fdMu.Unlock()
		<-done
	}
}

// Rule: a Wake racing a TryWait's reset is never lost: reset clears the
// wait object before it lowers the flag, so a Wake either comes while the
// flag is up, when its event shows in the checks that follow, or raises
// the object after the drain. Here the Wake (with its member's event)
// lands while the reset waits to drain the eventfd; the TryWait then
// finds the event and returns ErrAgain, and ErrAgain leaves the object
// signaled. (Fault caught: reset lowering the flag before its drain; the
// Wake's raise is drained away and the flag left up, so the object stays
// clear and deaf to every Wake until the next TryWait.)
func TestAWakeDuringTryWaitsResetIsNotLost(t *testing.T) {
	sy := &fakeSyncer{}
	f := &fakeSource{syncer: sy}
	ws := newSetWith(t, FD, f)
	settle(t, ws)
	ws.Wake() // something to drain: the next reset reads the eventfd
	ws.sig.bufMu.Lock()
	done := make(chan error, 1)
	go func() { done <- ws.TryWait() }()
	parkedIn(t, 1, "[sync.Mutex.Lock", "event.(*signal).drainFD(")
	f.produce(1)
	require.NoError(t, sy.Sync()) // its wake-up, during the reset
	ws.sig.bufMu.Unlock()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, ErrAgain, "the event of a Wake during the reset")
	case <-time.After(long):
		t.Fatal("TryWait did not return")
	}
	assert.True(t, signaled(t, ws), "ErrAgain left the object clear")
	f.drain()
	require.NoError(t, ws.TryWait())
	ws.Wake()
	assert.True(t, signaled(t, ws), "a Wake after that no longer raises the object")
}

// Rule: a closed set never touches the number it closed: a Wake that
// comes after Close (a source's wake-up racing Remove and Close) writes no
// eventfd, though another file may hold that number by then. (Fault
// caught: close keeping the closed number, so that a later raise writes
// to whichever file took it.)
func TestAWakeAfterCloseNeverTouchesTheClosedNumber(t *testing.T) {
	ws, err := NewWaitSet(FD)
	require.NoError(t, err)
	require.NoError(t, ws.TryWait())
	own := ws.sig.efd
	require.NoError(t, ws.Close())
	other, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	require.NoError(t, err)
	defer unix.Close(other)
	require.Equal(t, own, other, "the lowest free number is the closed one")
	ws.Wake()
	var b [8]byte
	_, err = unix.Read(other, b[:])
	assert.ErrorIs(t, err, unix.EAGAIN, "a Wake after Close wrote to the file that took the set's number")
	_, err = ws.FD()
	assert.ErrorIs(t, err, ErrClosed)
}

// Rule: one event wakes every goroutine asleep in Wait: a waiter that
// wakes leaves the object raised for the others (only TryWait clears it).
// (Fault caught: signal.wait taking the token without putting it back.)
func TestOneEventWakesEveryGoroutineAsleepInWait(t *testing.T) {
	const waiters = 3
	for _, kind := range []Kind{FD, Chan} {
		t.Run(kind.String(), func(t *testing.T) {
			sy := &fakeSyncer{}
			f := &fakeSource{syncer: sy}
			ws := newSetWith(t, kind, f)
			ctx, cancel := context.WithTimeout(context.Background(), long) // a hang guard
			defer cancel()
			done := make(chan error, waiters)
			for range waiters {
				go func() { done <- ws.Wait(ctx) }()
			}
			asleepInSignalWait(t, waiters)
			f.produce(1)
			require.NoError(t, sy.Sync())
			for i := range waiters {
				assert.NoError(t, <-done, "waiter %d", i)
			}
		})
	}
}

// Rule: a wait object's wait refuses a set that has none (Yield) rather
// than sleep on nothing. (Fault caught: the check removed; the wait then
// sleeps until its ctx ends.)
func TestAYieldSignalRefusesToSleep(t *testing.T) {
	s, err := newSignal(Yield)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), long) // a hang guard
	defer cancel()
	assert.ErrorIs(t, s.wait(ctx), errInvalid)
	assert.NoError(t, ctx.Err(), "it slept")
	assert.NoError(t, s.close())
}

// Rule: closing a wait object is idempotent, and an fd asked for once it
// is closed (an FD call racing Close past its own check) is ErrClosed.
// (Faults caught: close without its once-only guard, closing done twice;
// dup without its closed check, duplicating -1.)
func TestSignalCloseIsIdempotentAndDupAfterItIsErrClosed(t *testing.T) {
	for _, kind := range []Kind{FD, Chan, Yield} {
		s, err := newSignal(kind)
		require.NoError(t, err)
		require.NoError(t, s.close(), kind)
		assert.NotPanics(t, func() { assert.NoError(t, s.close(), "%v: a second close", kind) })
		if kind == FD {
			_, err := s.dup()
			assert.ErrorIs(t, err, ErrClosed)
		}
		assert.ErrorIs(t, s.wait(context.Background()), ErrClosed, kind)
	}
}

// The eventfd may be descriptor 0 (a service that closed its stdin): it is
// a descriptor like any other, raised by Wake and seen through the set's
// FD.
func TestAnEventfdThatIsDescriptorZeroIsRaisedLikeAnyOther(t *testing.T) {
	saved, err := unix.Dup(0)
	require.NoError(t, err)
	defer func() {
		assert.NoError(t, unix.Dup2(saved, 0))
		unix.Close(saved)
	}()
	require.NoError(t, unix.Close(0))
	ws, err := NewWaitSet(FD)
	require.NoError(t, err)
	defer ws.Close()
	require.Equal(t, 0, ws.sig.efd, "the eventfd took the lowest free descriptor")
	fd, err := ws.FD()
	require.NoError(t, err)
	defer unix.Close(fd)
	ws.Wake()
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(pfd, int(long/time.Millisecond)) // a hang guard: raised, it is readable at once
	require.NoError(t, err)
	assert.Equal(t, 1, n, "the set's fd is not readable after Wake")
}

// A counter refuses a second Watch by the same waker (ErrBusy) and counts
// only the first as a user: after one Unwatch, Close succeeds. (A refused
// Watch that counted a user would keep the counter busy for good.)
func TestACounterRefusesASecondWatchByTheSameWaker(t *testing.T) {
	c := NewCounter()
	w := &wakeCount{}
	require.NoError(t, c.Watch(w))
	assert.ErrorIs(t, c.Watch(w), ErrBusy)
	assert.Error(t, c.Watch(funcWaker{func() {}}), "a waker that cannot be compared")
	c.Unwatch(w)
	assert.NoError(t, c.Close(), "no user left")
}

// Rule: a wait set's Wait spins first (SetSpin): it looks at its members
// without arming them, so an event within the spin costs no arming and no
// wake-up; a ctx that ends during the spin ends Wait; the spin is bounded,
// after it Wait arms and sleeps; with no spin, Wait arms at once. (Faults
// caught: no spin; a spin that arms; a spin that never ends; a spin deaf
// to ctx.)
func TestAWaitSetWaitSpinsUnarmedBeforeItSleeps(t *testing.T) {
	for _, kind := range []Kind{FD, Chan} {
		t.Run(kind.String(), func(t *testing.T) {
			sy := &fakeSyncer{}
			sy.startInterrupts(t)
			f := &fakeSource{syncer: sy}
			ws := newSetWith(t, kind, f)
			settle(t, ws)
			f.armed.Store(false)
			ctx, cancel := context.WithTimeout(context.Background(), long)
			defer cancel()
			wait := func() <-chan error {
				done := make(chan error, 1)
				go func() { done <- ws.Wait(ctx) }()
				return done
			}

			var arms atomic.Int64 // Ready calls that arm
			f.inReady = func(_ *fakeSource, arm bool) {
				if arm {
					arms.Add(1)
				}
			}
			ws.SetSpin(time.Hour)
			done := wait()
			f.produce(1)
			require.NoError(t, <-done)
			assert.Zero(t, arms.Load(), "the member was armed: Wait did not take the event in its spin")
			f.drain()

			short, cancelShort := context.WithTimeout(ctx, 10*time.Millisecond)
			defer cancelShort()
			assert.ErrorIs(t, ws.Wait(short), context.DeadlineExceeded)
			assert.Zero(t, arms.Load(), "armed during a spin of an hour")

			for _, spin := range []time.Duration{time.Millisecond, 0} {
				ws.SetSpin(spin)
				done := wait()
				require.Eventually(t, f.armed.Load, long, 100*time.Microsecond, "spin %v: Wait never armed the member", spin)
				f.produce(1) // a notification: the interrupt wakes the set
				require.NoError(t, <-done, "spin %v", spin)
				f.drain()
				settle(t, ws)
				f.armed.Store(false)
			}
		})
	}
}
