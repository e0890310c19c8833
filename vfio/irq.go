package vfio

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma/vfio/internal/uapi"
)

// Vector is one interrupt vector of a device, signalled on an eventfd.
//
// A Vector is single-owner: one goroutine at a time calls Wait or Poll.
// Close (or the device's DisableIRQs or Close) may be called from any
// goroutine and wakes a waiter with an error wrapping ErrClosed.
type Vector struct {
	d     *Device
	index int
	sub   int
	what  string // "MSI-X vector 2", for errors
	f     *os.File
	rc    syscall.RawConn
	fd    int32 // the eventfd number registered with VFIO

	closed atomic.Bool

	// Read state, owned by the waiting goroutine.
	buf    [8]byte
	count  uint64
	rerr   error
	block  bool // readFn waits for readiness when true
	readFn func(fd uintptr) bool
}

func irqName(index int) string {
	switch index {
	case IRQINTx:
		return "INTx"
	case IRQMSI:
		return "MSI"
	case IRQMSIX:
		return "MSI-X"
	case IRQErr:
		return "error IRQ"
	case IRQReq:
		return "request IRQ"
	}
	return fmt.Sprintf("IRQ index %d", index)
}

func newVector(d *Device, index, sub int) (*Vector, error) {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	v := &Vector{d: d, index: index, sub: sub, what: fmt.Sprintf("%s vector %d", irqName(index), sub)}
	// A non-blocking fd handed to os.NewFile is registered with the
	// runtime poller; from here on the fd is reached only through rc.
	v.f = os.NewFile(uintptr(efd), "vfio-"+d.name+"-"+v.what)
	if v.rc, err = v.f.SyscallConn(); err != nil {
		_ = v.f.Close()
		return nil, err
	}
	if err := v.rc.Control(func(fd uintptr) { v.fd = int32(fd) }); err != nil {
		_ = v.f.Close()
		return nil, err
	}
	v.readFn = func(fd uintptr) bool {
		n, err := unix.Read(int(fd), v.buf[:])
		switch {
		case err == unix.EAGAIN:
			return !v.block
		case err == unix.EINTR:
			return false
		case err != nil:
			v.rerr = err
		case n != 8:
			v.rerr = fmt.Errorf("eventfd read returned %d bytes", n)
		default:
			v.count = binary.NativeEndian.Uint64(v.buf[:])
		}
		return true
	}
	return v, nil
}

// Index returns the vector's IRQ index (IRQMSIX for MSI-X).
func (v *Vector) Index() int { return v.index }

// Vector returns the vector number within its index.
func (v *Vector) Vector() int { return v.sub }

// String names the vector: "MSI-X vector 2 of 0000:00:10.1".
func (v *Vector) String() string { return v.what + " of " + v.d.name }

// Wait blocks until the vector fires or ctx is done, without tying up a
// thread (the eventfd is waited on through the Go runtime poller). It
// returns how many interrupts arrived since the last Wait or Poll (at least
// one). A context without a Done channel does not allocate; one with a
// deadline or cancellation costs a timer or an AfterFunc per call.
func (v *Vector) Wait(ctx context.Context) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, v.err("wait for", err)
	}
	if v.closed.Load() {
		return 0, v.err("wait for", ErrClosed)
	}
	deadline, _ := ctx.Deadline()
	if err := v.f.SetReadDeadline(deadline); err != nil {
		return 0, v.err("wait for", v.mapErr(err))
	}
	var stop func() bool
	var fired chan struct{}
	if ctx.Done() != nil {
		fired = make(chan struct{})
		stop = context.AfterFunc(ctx, func() {
			_ = v.f.SetReadDeadline(time.Unix(1, 0)) // in the past: wakes the waiter
			close(fired)
		})
	}
	n, err := v.read(true)
	if stop != nil && !stop() {
		<-fired // the AfterFunc ran or is running: let it finish before returning
	}
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if cerr := ctx.Err(); cerr != nil {
				err = cerr
			} else {
				err = context.DeadlineExceeded
			}
		}
		return 0, v.err("wait for", err)
	}
	return n, nil
}

// Poll returns how many interrupts arrived since the last Wait or Poll,
// without blocking (0 when none).
func (v *Vector) Poll() (uint64, error) {
	if v.closed.Load() {
		return 0, v.err("poll", ErrClosed)
	}
	if err := v.f.SetReadDeadline(time.Time{}); err != nil {
		return 0, v.err("poll", v.mapErr(err))
	}
	n, err := v.read(false)
	if err != nil {
		return 0, v.err("poll", err)
	}
	return n, nil
}

func (v *Vector) read(block bool) (uint64, error) {
	v.block, v.count, v.rerr = block, 0, nil
	if err := v.rc.Read(v.readFn); err != nil {
		return 0, v.mapErr(err)
	}
	return v.count, v.rerr
}

func (v *Vector) mapErr(err error) error {
	// The poller reports a file closed under a waiter as "use of closed
	// file", which is not os.ErrClosed: look at our own flag too.
	if errors.Is(err, os.ErrClosed) || v.closed.Load() {
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return err
}

func (v *Vector) err(op string, err error) error {
	return &OpError{Op: op + " " + v.what + " of", Dev: v.d.name, Err: err}
}

// Trigger makes the kernel signal the vector's eventfd as if the device had
// raised the interrupt (VFIO's loopback: SET_IRQS with DATA_NONE and
// ACTION_TRIGGER). It tests the path from VFIO to the waiter without the
// device.
func (v *Vector) Trigger() error {
	v.d.mu.Lock()
	defer v.d.mu.Unlock()
	if v.closed.Load() || v.d.closed {
		return v.err("trigger", ErrClosed)
	}
	err := uapi.DeviceSetIRQs(v.d.g.c.k, v.d.fd, uapi.IRQSetDataNone|uapi.IRQSetActionTrigger, uint32(v.index), uint32(v.sub), 1, nil)
	if err != nil {
		return v.err("trigger", fmt.Errorf("VFIO_DEVICE_SET_IRQS: %w", err))
	}
	return nil
}

// SyscallConn gives access to the eventfd, for callers that put it in
// their own poll set (epoll). Reading it consumes interrupts a Wait would
// otherwise see.
func (v *Vector) SyscallConn() (syscall.RawConn, error) {
	if v.closed.Load() {
		return nil, v.err("syscall conn", ErrClosed)
	}
	return v.rc, nil
}

// closeFile closes the eventfd; a waiter wakes with ErrClosed.
func (v *Vector) closeFile() error {
	if v.closed.Swap(true) {
		return nil
	}
	return v.f.Close()
}

// EnableMSIX enables the first n MSI-X vectors on eventfds (pvrdma has 3:
// command response, async events, CQ notification).
func (d *Device) EnableMSIX(n int) ([]*Vector, error) { return d.EnableIRQs(IRQMSIX, n) }

// EnableIRQs binds vectors 0..n-1 of IRQ index to new eventfds and enables
// the index. Enabling an index already enabled is an error wrapping
// ErrBusy: DisableIRQs first.
func (d *Device) EnableIRQs(index, n int) ([]*Vector, error) {
	op := "enable " + irqName(index)
	info, ok := d.irqs[index]
	if !ok {
		return nil, opErr(op, d.name, wrapf(ErrNotSupported, nil, "the device has no %s vectors", irqName(index)))
	}
	if n <= 0 || n > info.Count {
		return nil, opErr(op, d.name, wrapf(ErrRange, nil, "%d vectors asked, the device has %d", n, info.Count))
	}
	if !info.Eventfd {
		return nil, opErr(op, d.name, wrapf(ErrNotSupported, nil, "%s cannot signal an eventfd", irqName(index)))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, opErr(op, d.name, ErrClosed)
	}
	if d.vectors[index] != nil {
		return nil, opErr(op, d.name, wrapf(ErrBusy, nil, "%s is already enabled; DisableIRQs first", irqName(index)))
	}
	vecs := make([]*Vector, 0, n)
	fds := make([]int32, n)
	undo := func() {
		for _, v := range vecs {
			_ = v.closeFile()
		}
	}
	for i := range n {
		v, err := newVector(d, index, i)
		if err != nil {
			undo()
			return nil, opErr(op, d.name, err)
		}
		vecs = append(vecs, v)
		fds[i] = v.fd
	}
	err := uapi.DeviceSetIRQs(d.g.c.k, d.fd, uapi.IRQSetDataEventfd|uapi.IRQSetActionTrigger,
		uint32(index), 0, uint32(n), uapi.EventfdData(fds))
	if err != nil {
		undo()
		return nil, opErr(op, d.name, fmt.Errorf("VFIO_DEVICE_SET_IRQS: %w", err))
	}
	d.vectors[index] = vecs
	return vecs, nil
}

// DisableIRQs disables IRQ index and closes its vectors' eventfds. It is a
// no-op for an index that is not enabled.
func (d *Device) DisableIRQs(index int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil // Close disabled everything
	}
	return d.disableLocked(index)
}

// disableLocked: d.mu is held. The index is disabled in the kernel before
// the eventfds are closed, so the kernel never signals a closed fd number.
func (d *Device) disableLocked(index int) error {
	vecs, ok := d.vectors[index]
	if !ok {
		return nil
	}
	delete(d.vectors, index)
	var errs []error
	if err := uapi.DeviceSetIRQs(d.g.c.k, d.fd, uapi.IRQSetDataNone|uapi.IRQSetActionTrigger, uint32(index), 0, 0, nil); err != nil {
		errs = append(errs, fmt.Errorf("disable %s: VFIO_DEVICE_SET_IRQS: %w", irqName(index), err))
	}
	for _, v := range vecs {
		errs = append(errs, v.closeFile())
	}
	return opErr("disable "+irqName(index), d.name, errors.Join(errs...))
}
