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
// see that the set is signaled and leaves it set; it used to put the token
// back with a blocking send. A Wake that claimed the flag before a
// TryWait's reset sends its token late, under the lowered flag: when that
// send lands between Wait's receive and its put-back, the channel is full
// and the put-back blocked for good, deaf to ctx (1 in 3 000 to 1 in
// 100 000 tries with free-running wakers). Here the late sender is a
// goroutine parked on the full channel while Wait takes the token, which
// hands the sender's token into the buffer at the receive: the put-back
// meets a full channel every time the sender parked first.
func TestWaitNeverOutlivesItsCtxWhenALateWakeFillsTheChannel(t *testing.T) {
	const rounds = 20
	for round := range rounds {
		f := &fakeSource{syncer: &fakeSyncer{}}
		ws, err := NewWaitSet(Chan)
		require.NoError(t, err)
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
			assert.NoError(t, err, "round %d: the set was signaled", round)
		case <-time.After(long):
			cancel()
			t.Fatalf("round %d: Wait still blocked %v after it began, with a ctx of 50ms", round, long)
		}
		cancel()
		<-late
		require.NoError(t, ws.Remove(f))
		require.NoError(t, ws.Close())
	}
}

// Rule: the fd FD hands out is the caller's own dup. Closing it leaves the
// set working: events still raise its wait object and the next FD, and a
// Wait with nothing pending sleeps until its ctx ends (it used to get nil
// at once, forever: a silent spin on the closed number).
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
// close it (it used to: A's fd was A's own, closed twice).
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
