package event

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
)

// Kind is what a WaitSet sleeps on.
type Kind int

const (
	// FD is an eventfd, usable with select, poll and epoll (FD returns
	// it). It is readable from the moment an event may be pending until a
	// TryWait succeeds. Wait parks the goroutine in the Go runtime poller,
	// holding no OS thread. The default.
	FD Kind = iota
	// Chan is a Go channel (C returns it); Wait blocks on it.
	Chan
	// Yield has no wait object: Wait checks the members in a loop,
	// yielding the processor between checks, for services that trade CPU
	// for latency. It never arms a member.
	Yield
)

func (k Kind) String() string {
	switch k {
	case FD:
		return "fd"
	case Chan:
		return "chan"
	case Yield:
		return "yield"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// signal is a wait object that is set or not. set is idempotent and cheap
// while already set; reset clears it; wait blocks until it is set (without
// clearing it), the context ends, or the signal is closed.
type signal struct {
	kind Kind
	on   atomic.Bool
	// raised counts the sets that raised the wait object; drained is its
	// value when a reset last drained the object.
	raised, drained atomic.Uint64

	// FD
	f  *os.File
	rc syscall.RawConn
	fd int
	pr [1]unix.PollFd
	// The raw read and write functions, made once: closures made per call
	// would be allocated, and reset and set are hot.
	drainFn, setFn func(fd uintptr) bool
	buf            [8]byte

	// Chan
	ch   chan struct{}
	done chan struct{}

	closed atomic.Bool
}

func newSignal(kind Kind) (*signal, error) {
	s := &signal{kind: kind, done: make(chan struct{})}
	switch kind {
	case FD:
		efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err != nil {
			return nil, fmt.Errorf("eventfd: %w", err)
		}
		// Non-blocking, so the runtime poller takes it; the fd number is
		// kept, since File.Fd would switch it to blocking.
		s.f = os.NewFile(uintptr(efd), "vfrdma-waitset")
		if s.rc, err = s.f.SyscallConn(); err != nil {
			_ = s.f.Close()
			return nil, err
		}
		s.fd = efd
		s.pr[0] = unix.PollFd{Fd: int32(efd), Events: unix.POLLIN}
		s.drainFn = func(fd uintptr) bool {
			_, _ = unix.Read(int(fd), s.buf[:])
			return true
		}
		s.setFn = func(fd uintptr) bool {
			_, err := unix.Write(int(fd), one)
			return err != unix.EAGAIN // the counter is saturated: readable anyway
		}
	case Chan:
		s.ch = make(chan struct{}, 1)
	case Yield:
	default:
		return nil, fmt.Errorf("%w: wait object kind %d", errInvalid, kind)
	}
	return s, nil
}

var one = binary.NativeEndian.AppendUint64(nil, 1)

// set raises the signal. Only the first set after a reset reaches the
// wait object. The flag goes up before the object is raised; once it is,
// set counts the raise (raised), so that reset can tell a raise it has not
// drained from none.
func (s *signal) set() {
	if s.on.Load() || !s.on.CompareAndSwap(false, true) {
		return
	}
	switch s.kind {
	case FD:
		_ = s.rc.Write(s.setFn)
	case Chan:
		select {
		case s.ch <- struct{}{}:
		default:
		}
	}
	s.raised.Add(1)
}

// reset clears the signal: first the wait object, then the flag, so that a
// set racing the reset either reaches the object afterwards or came before
// the flag was cleared, when its event is already visible to the checks
// that follow a reset (or was taken before them). A set that claimed the
// flag before the reset may raise the object after the drain, under a
// lowered flag: the next reset sees its count and drains it, so a waiter
// wakes once for it, never spins on it. When the flag is down and no raise
// came since the last drain, there is nothing to drain: an idle TryWait
// makes no system call.
func (s *signal) reset() {
	r := s.raised.Load()
	if !s.on.Load() && r == s.drained.Load() {
		return
	}
	switch s.kind {
	case FD:
		_ = s.rc.Read(s.drainFn)
	case Chan:
		select {
		case <-s.ch:
		default:
		}
	}
	s.drained.Store(r)
	s.on.Store(false)
}

// wait blocks until the signal is set, ctx ends or the signal is closed.
func (s *signal) wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return ErrClosed
	}
	switch s.kind {
	case Chan:
		select {
		case <-s.ch:
			// Leave it set (only reset clears it), without blocking: a set
			// that claimed the flag before the last reset may have sent
			// its token since the receive, and the channel is full.
			select {
			case s.ch <- struct{}{}:
			default:
			}
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-s.done:
			return ErrClosed
		}
	case FD:
		return s.waitFD(ctx)
	}
	return fmt.Errorf("%w: a %v wait set has no wait object", errInvalid, s.kind)
}

// waitFD waits for the eventfd to be readable, without reading it.
func (s *signal) waitFD(ctx context.Context) error {
	deadline, _ := ctx.Deadline()
	if err := s.f.SetReadDeadline(deadline); err != nil {
		return s.mapErr(err)
	}
	var stop func() bool
	var fired chan struct{}
	if ctx.Done() != nil {
		fired = make(chan struct{})
		stop = context.AfterFunc(ctx, func() {
			_ = s.f.SetReadDeadline(time.Unix(1, 0)) // in the past: wakes the waiter
			close(fired)
		})
	}
	var perr error
	err := s.rc.Read(func(uintptr) bool {
		n, err := unix.Poll(s.pr[:], 0)
		switch {
		case err == unix.EINTR:
			return false
		case err != nil:
			perr = err
			return true
		}
		return n > 0 // not readable yet: park until it is
	})
	if stop != nil && !stop() {
		<-fired
	}
	if err == nil {
		err = perr
	}
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if cerr := ctx.Err(); cerr != nil {
				return cerr
			}
			return context.DeadlineExceeded
		}
		return s.mapErr(err)
	}
	return nil
}

func (s *signal) mapErr(err error) error {
	if errors.Is(err, os.ErrClosed) || s.closed.Load() {
		return ErrClosed
	}
	return err
}

// close releases a waiter with ErrClosed and frees the wait object.
func (s *signal) close() error {
	if s.closed.Swap(true) {
		return nil
	}
	close(s.done)
	if s.f != nil {
		return s.f.Close()
	}
	return nil
}
