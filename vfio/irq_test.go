package vfio_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma/vfio"
	"github.com/vfrdma/vfrdma/vfio/vfiotest"
)

func TestMSIX(t *testing.T) { forPaths(t, testMSIX) }

func testMSIX(t *testing.T, p vfio.Path) {
	e := newEnvOn(t, p)
	d := e.open(t)
	vecs, err := d.EnableMSIX(3)
	require.NoError(t, err)
	require.Len(t, vecs, 3)
	require.Equal(t, vfio.IRQMSIX, vecs[2].Index())
	require.Equal(t, 2, vecs[2].Vector())
	require.Equal(t, "MSI-X vector 2 of 0000:00:10.1", vecs[2].String())
	fds := e.rdma.Eventfds(vfio.IRQMSIX)
	require.Len(t, fds, 3, "eventfds the kernel has")
	require.GreaterOrEqual(t, fds[0], 0, "eventfds the kernel has")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	// The device raises vector 0; Wait sees it.
	require.NoError(t, e.rdma.Raise(vfio.IRQMSIX, 0))
	n, err := vecs[0].Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(1), n, "Wait")
	// Interrupts accumulate until read.
	require.NoError(t, e.rdma.Raise(vfio.IRQMSIX, 2))
	require.NoError(t, e.rdma.Raise(vfio.IRQMSIX, 2))
	n, err = vecs[2].Poll()
	require.NoError(t, err)
	require.Equal(t, uint64(2), n, "Poll")
	n, err = vecs[2].Poll()
	require.NoError(t, err)
	require.Zero(t, n, "Poll on a quiet vector")
	// VFIO's loopback trigger.
	require.NoError(t, vecs[1].Trigger())
	n, err = vecs[1].Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, uint64(1), n, "Wait after Trigger")
	// A Wait blocked in the poller wakes when the interrupt comes.
	go func() {
		time.Sleep(20 * time.Millisecond)
		assert.NoError(t, e.rdma.Raise(vfio.IRQMSIX, 1))
	}()
	n, err = vecs[1].Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(1), n, "blocked Wait")

	// Timeouts and cancellation name what was waited for.
	short, cancel2 := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel2()
	_, err = vecs[0].Wait(short)
	require.ErrorIs(t, err, context.DeadlineExceeded, "Wait with timeout")
	require.ErrorContains(t, err, "MSI-X vector 0 of 0000:00:10.1")
	cctx, ccancel := context.WithCancel(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); ccancel() }()
	_, err = vecs[0].Wait(cctx)
	require.ErrorIs(t, err, context.Canceled, "Wait cancelled")
	_, err = vecs[0].Wait(cctx)
	require.ErrorIs(t, err, context.Canceled, "Wait on a done context")
	// After a timed-out or cancelled wait the vector still works.
	require.NoError(t, e.rdma.Raise(vfio.IRQMSIX, 0))
	n, err = vecs[0].Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(1), n, "Wait after a cancelled Wait")
	n, err = vecs[0].Poll()
	require.NoError(t, err)
	require.Zero(t, n, "Poll after Wait")

	_, err = d.EnableMSIX(3)
	require.ErrorIs(t, err, vfio.ErrBusy, "EnableMSIX twice")
	require.NoError(t, d.DisableIRQs(vfio.IRQMSIX))
	require.Nil(t, e.rdma.Eventfds(vfio.IRQMSIX), "MSI-X still enabled in the kernel")
	_, err = vecs[0].Wait(ctx)
	require.ErrorIs(t, err, vfio.ErrClosed, "Wait after disable")
	_, err = vecs[0].Poll()
	require.ErrorIs(t, err, vfio.ErrClosed, "Poll after disable")
	require.ErrorIs(t, vecs[0].Trigger(), vfio.ErrClosed, "Trigger after disable")
	_, err = vecs[0].SyscallConn()
	require.ErrorIs(t, err, vfio.ErrClosed, "SyscallConn after disable")
	require.NoError(t, d.DisableIRQs(vfio.IRQMSIX), "second DisableIRQs")
	// Enabled again, then left for Close to disable.
	_, err = d.EnableMSIX(2)
	require.NoError(t, err)
	require.NoError(t, d.Close())
	for _, ev := range e.k.Events() {
		assert.False(t, strings.HasPrefix(ev, "BAD"), ev)
	}
}

func TestEnableIRQsErrors(t *testing.T) { forPaths(t, testEnableIRQsErrors) }

func testEnableIRQsErrors(t *testing.T, p vfio.Path) {
	e := newEnvOn(t, p)
	d := e.open(t)
	_, err := d.EnableMSIX(4)
	require.ErrorIs(t, err, vfio.ErrRange, "EnableMSIX(4)")
	_, err = d.EnableMSIX(0)
	require.ErrorIs(t, err, vfio.ErrRange, "EnableMSIX(0)")
	_, err = d.EnableIRQs(vfio.IRQMSI, 1)
	require.ErrorIs(t, err, vfio.ErrNotSupported, "EnableIRQs(MSI)")
	// The kernel refusing leaves nothing behind (TestMain checks fds).
	e.k.Fail(vfiotest.IoctlSetIRQs, unix.EINVAL)
	_, err = d.EnableMSIX(3)
	require.Error(t, err, "EnableMSIX refused by the kernel")
	require.ErrorContains(t, err, "VFIO_DEVICE_SET_IRQS")
	require.ErrorIs(t, err, unix.EINVAL)
	e.k.Fail(vfiotest.IoctlSetIRQs, nil)
	require.Nil(t, e.rdma.Eventfds(vfio.IRQMSIX))
	_, err = d.EnableMSIX(3)
	require.NoError(t, err, "EnableMSIX once the kernel takes it")
}

func TestWaitClosedConcurrently(t *testing.T) { forPaths(t, testWaitClosedConcurrently) }

func testWaitClosedConcurrently(t *testing.T, p vfio.Path) {
	e := newEnvOn(t, p)
	d := e.open(t)
	vecs, err := d.EnableMSIX(1)
	require.NoError(t, err)
	done := make(chan error)
	go func() {
		_, err := vecs[0].Wait(context.Background())
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, d.Close())
	select {
	case err := <-done:
		require.ErrorIs(t, err, vfio.ErrClosed, "Wait woken by Close")
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake the waiter")
	}
}

func TestWaitNoAllocs(t *testing.T) { forPaths(t, testWaitNoAllocs) }

func testWaitNoAllocs(t *testing.T, p vfio.Path) {
	e := newEnvOn(t, p)
	d := e.open(t)
	vecs, err := d.EnableMSIX(3)
	require.NoError(t, err)
	efd := e.rdma.Eventfds(vfio.IRQMSIX)[2]
	ctx := context.Background()
	n := testing.AllocsPerRun(100, func() {
		signal(t, efd)
		if c, err := vecs[2].Wait(ctx); err != nil || c != 1 {
			t.Fatalf("Wait = %d, %v", c, err)
		}
		if c, err := vecs[2].Poll(); err != nil || c != 0 {
			t.Fatalf("Poll = %d, %v", c, err)
		}
	})
	if raceEnabled {
		t.Logf("race detector on: %v allocations per call not checked (run without -race to check)", n)
		return
	}
	require.Zero(t, n, "Wait/Poll allocations per call")
}

// signal makes an eventfd count one, as the kernel does when an interrupt
// comes; unlike Device.Raise it takes no lock (the allocation count is the
// vector's alone).
func signal(t testing.TB, fd int) {
	one := [8]byte{1}
	if _, err := unix.Write(fd, one[:]); err != nil {
		t.Errorf("signal eventfd %d: %v", fd, err)
	}
}

func BenchmarkWait(b *testing.B) {
	k := vfiotest.New(b)
	dev := vfiotest.PVRDMA(rdmaName)
	k.AddGroup(5, true, dev)
	c, err := vfio.OpenContainer(&vfio.Options{Kernel: k})
	require.NoError(b, err)
	defer c.Close()
	g, err := c.OpenGroup(5)
	require.NoError(b, err)
	d, err := g.OpenDevice(rdmaName)
	require.NoError(b, err)
	vecs, err := d.EnableMSIX(1)
	require.NoError(b, err)
	efd := dev.Eventfds(vfio.IRQMSIX)[0]
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		signal(b, efd)
		if _, err := vecs[0].Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
