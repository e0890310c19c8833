package vfio

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vfrdma/vfrdma/vfio/internal/uapi"
)

func TestMSIX(t *testing.T) {
	e := newEnv(t)
	d := e.open(t)
	vecs, err := d.EnableMSIX(3)
	if err != nil {
		t.Fatal(err)
	}
	if len(vecs) != 3 || vecs[2].Index() != IRQMSIX || vecs[2].Vector() != 2 {
		t.Fatalf("vectors %v", vecs)
	}
	if got := vecs[2].String(); got != "MSI-X vector 2 of 0000:00:10.1" {
		t.Fatalf("String = %q", got)
	}
	if fds := e.rdma.enabled[uapi.PCIMSIXIRQIndex]; len(fds) != 3 || fds[0] < 0 {
		t.Fatalf("kernel has eventfds %v", fds)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	// The device raises vector 0; Wait sees it.
	e.k.raise(e.rdma, uapi.PCIMSIXIRQIndex, 0)
	if n, err := vecs[0].Wait(ctx); err != nil || n != 1 {
		t.Fatalf("Wait = %d, %v", n, err)
	}
	// Interrupts accumulate until read.
	e.k.raise(e.rdma, uapi.PCIMSIXIRQIndex, 2)
	e.k.raise(e.rdma, uapi.PCIMSIXIRQIndex, 2)
	if n, err := vecs[2].Poll(); err != nil || n != 2 {
		t.Fatalf("Poll = %d, %v", n, err)
	}
	if n, err := vecs[2].Poll(); err != nil || n != 0 {
		t.Fatalf("Poll on a quiet vector = %d, %v", n, err)
	}
	// VFIO's loopback trigger.
	if err := vecs[1].Trigger(); err != nil {
		t.Fatal(err)
	}
	if n, err := vecs[1].Wait(context.Background()); err != nil || n != 1 {
		t.Fatalf("Wait after Trigger = %d, %v", n, err)
	}
	// A Wait blocked in the poller wakes when the interrupt comes.
	go func() {
		time.Sleep(20 * time.Millisecond)
		e.k.raise(e.rdma, uapi.PCIMSIXIRQIndex, 1)
	}()
	if n, err := vecs[1].Wait(ctx); err != nil || n != 1 {
		t.Fatalf("blocked Wait = %d, %v", n, err)
	}

	// Timeouts and cancellation name what was waited for.
	short, cancel2 := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel2()
	_, err = vecs[0].Wait(short)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "MSI-X vector 0 of 0000:00:10.1") {
		t.Fatalf("Wait with timeout: %v", err)
	}
	cctx, ccancel := context.WithCancel(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); ccancel() }()
	if _, err := vecs[0].Wait(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait cancelled: %v", err)
	}
	if _, err := vecs[0].Wait(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait on a done context: %v", err)
	}
	// After a timed-out or cancelled wait the vector still works.
	e.k.raise(e.rdma, uapi.PCIMSIXIRQIndex, 0)
	if n, err := vecs[0].Wait(ctx); err != nil || n != 1 {
		t.Fatalf("Wait after a cancelled Wait = %d, %v", n, err)
	}
	if n, err := vecs[0].Poll(); err != nil || n != 0 {
		t.Fatalf("Poll after Wait = %d, %v", n, err)
	}

	if _, err := d.EnableMSIX(3); !errors.Is(err, ErrBusy) {
		t.Fatalf("EnableMSIX twice: %v", err)
	}
	if err := d.DisableIRQs(IRQMSIX); err != nil {
		t.Fatal(err)
	}
	if _, on := e.rdma.enabled[uapi.PCIMSIXIRQIndex]; on {
		t.Fatal("MSI-X still enabled in the kernel")
	}
	if _, err := vecs[0].Wait(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Wait after disable: %v", err)
	}
	if _, err := vecs[0].Poll(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Poll after disable: %v", err)
	}
	if err := vecs[0].Trigger(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Trigger after disable: %v", err)
	}
	if _, err := vecs[0].SyscallConn(); !errors.Is(err, ErrClosed) {
		t.Fatalf("SyscallConn after disable: %v", err)
	}
	if err := d.DisableIRQs(IRQMSIX); err != nil {
		t.Fatalf("second DisableIRQs: %v", err)
	}
	// Enabled again, then left for Close to disable.
	if _, err := d.EnableMSIX(2); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	for _, ev := range e.k.events() {
		if strings.HasPrefix(ev, "BAD") {
			t.Error(ev)
		}
	}
}

func TestEnableIRQsErrors(t *testing.T) {
	e := newEnv(t)
	d := e.open(t)
	if _, err := d.EnableMSIX(4); !errors.Is(err, ErrRange) {
		t.Fatalf("EnableMSIX(4): %v", err)
	}
	if _, err := d.EnableMSIX(0); !errors.Is(err, ErrRange) {
		t.Fatalf("EnableMSIX(0): %v", err)
	}
	if _, err := d.EnableIRQs(IRQMSI, 1); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("EnableIRQs(MSI): %v", err)
	}
	// The kernel refusing leaves nothing behind (TestMain checks fds).
	e.rdma.irqs[IRQMSIX].Count = 9 // the fake accepts what info says...
	e.k.mu.Lock()
	e.rdma.enabled[uapi.PCIMSIXIRQIndex] = []int32{-1} // ...but the index is busy
	e.k.mu.Unlock()
	if _, err := d.EnableMSIX(3); err == nil || !strings.Contains(err.Error(), "VFIO_DEVICE_SET_IRQS") {
		t.Fatalf("EnableMSIX refused by the kernel: %v", err)
	}
	e.k.mu.Lock()
	delete(e.rdma.enabled, uapi.PCIMSIXIRQIndex)
	e.k.mu.Unlock()
}

func TestWaitClosedConcurrently(t *testing.T) {
	e := newEnv(t)
	d := e.open(t)
	vecs, err := d.EnableMSIX(1)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() {
		_, err := vecs[0].Wait(context.Background())
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("Wait woken by Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake the waiter")
	}
}

func TestWaitNoAllocs(t *testing.T) {
	e := newEnv(t)
	d := e.open(t)
	vecs, err := d.EnableMSIX(3)
	if err != nil {
		t.Fatal(err)
	}
	efd := int(e.rdma.enabled[uapi.PCIMSIXIRQIndex][2])
	ctx := context.Background()
	n := testing.AllocsPerRun(100, func() {
		fire(t, efd)
		if c, err := vecs[2].Wait(ctx); err != nil || c != 1 {
			t.Fatalf("Wait = %d, %v", c, err)
		}
		if c, err := vecs[2].Poll(); err != nil || c != 0 {
			t.Fatalf("Poll = %d, %v", c, err)
		}
	})
	if n != 0 && !raceEnabled {
		t.Fatalf("Wait/Poll allocate %v times per call", n)
	}
	if raceEnabled {
		t.Logf("race detector on: %v allocations per call not checked (run without -race to check)", n)
	}
}

func BenchmarkWait(b *testing.B) {
	k := newFakeKernel(b)
	dev := pvrdmaDevice(rdmaName)
	k.addGroup(5, true, dev)
	c, err := OpenContainer(&Options{DevDir: k.devDir, kernel: k})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	g, err := c.OpenGroup(5)
	if err != nil {
		b.Fatal(err)
	}
	d, err := g.OpenDevice(rdmaName)
	if err != nil {
		b.Fatal(err)
	}
	vecs, err := d.EnableMSIX(1)
	if err != nil {
		b.Fatal(err)
	}
	efd := int(dev.enabled[uapi.PCIMSIXIRQIndex][0])
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		fire(b, efd)
		if _, err := vecs[0].Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
