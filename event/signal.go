package event

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Kind is what a WaitSet sleeps on.
type Kind int

const (
	// FD is an eventfd, usable with select, poll and epoll (FD returns a
	// dup of it). It is readable from the moment an event may be pending
	// until a TryWait succeeds. Wait parks the goroutine on a channel
	// raised with the eventfd, holding no OS thread. The default.
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
//
// Wait sleeps on a channel of one token for both the Chan and the FD kind:
// a select on it, ctx and close needs no deadline juggling and serves any
// number of waiters. The FD kind keeps an eventfd beside it, raised and
// drained with the channel, for the callers' own select, poll or epoll.
// That eventfd is the set's alone: FD hands out dups. Every use of its
// number holds fdMu shared and close takes it exclusively, so the number is
// never used after it is closed; once a system call on it fails (EBADF:
// some code closed a number it did not own), the set is dead: it reports
// the error from TryWait and Wait, and it never touches or closes the
// number again, since another file may hold it by then.
type signal struct {
	kind Kind
	on   atomic.Bool
	// raised counts the sets that raised the wait object; drained is its
	// value when a reset last drained the object.
	raised, drained atomic.Uint64

	ch   chan struct{} // Chan and FD: what Wait sleeps on
	done chan struct{} // closed by close

	// FD
	fdMu  sync.RWMutex
	efd   int // -1 once closed; written under fdMu held exclusively
	dead  atomic.Pointer[error]
	bufMu sync.Mutex
	buf   [8]byte

	closed atomic.Bool
}

func newSignal(kind Kind) (*signal, error) {
	s := &signal{kind: kind, done: make(chan struct{}), efd: -1}
	switch kind {
	case FD:
		efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err != nil {
			return nil, fmt.Errorf("eventfd: %w", err)
		}
		s.efd = efd
		s.ch = make(chan struct{}, 1)
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
	// The CAS decides; the Load only spares a locked CAS while the flag
	// is up.
	if s.on.Load() || !s.on.CompareAndSwap(false, true) {
		return
	}
	if s.kind == FD {
		s.fdOp("raise", func(fd int) error {
			_, err := unix.Write(fd, one)
			if err == unix.EAGAIN { // the counter is saturated: readable anyway
				return nil
			}
			return err
		})
	}
	if s.ch != nil {
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
	if s.kind == FD {
		s.fdOp("drain", s.drainFD)
	}
	if s.ch != nil {
		select {
		case <-s.ch:
		default:
		}
	}
	s.drained.Store(r)
	s.on.Store(false)
}

// drainFD reads the eventfd into buf (a local one escapes under -race),
// one reset at a time.
func (s *signal) drainFD(fd int) error {
	s.bufMu.Lock()
	defer s.bufMu.Unlock()
	_, err := unix.Read(fd, s.buf[:])
	if err == unix.EAGAIN { // already clear
		return nil
	}
	return err
}

// fdOp runs op on the eventfd unless the set is closed or dead, retrying
// on EINTR; an error kills the set.
func (s *signal) fdOp(what string, op func(fd int) error) {
	s.fdMu.RLock()
	defer s.fdMu.RUnlock()
	if s.efd < 0 || s.dead.Load() != nil {
		return
	}
	err := op(s.efd)
	// Read and write on a non-blocking eventfd never sleep, so EINTR is
	// not expected; it is retried all the same.
	for err == unix.EINTR {
		err = op(s.efd)
	}
	if err != nil {
		s.kill(fmt.Errorf("wait set: %s eventfd %d: %w (closed by code that does not own it?); the set no longer uses that number", what, s.efd, err))
	}
}

// kill records the error that killed the set: the first, when two uses
// fail at once.
func (s *signal) kill(err error) { s.dead.CompareAndSwap(nil, &err) }

// err reports a dead eventfd.
func (s *signal) err() error {
	if p := s.dead.Load(); p != nil {
		return *p
	}
	return nil
}

// dup returns a new descriptor of the eventfd, the caller's to close.
func (s *signal) dup() (int, error) {
	s.fdMu.RLock()
	defer s.fdMu.RUnlock()
	if s.efd < 0 {
		return -1, ErrClosed
	}
	if err := s.err(); err != nil {
		return -1, err
	}
	fd, err := unix.FcntlInt(uintptr(s.efd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("wait set: dup eventfd: %w", err)
	}
	return fd, nil
}

// wait blocks until the signal is set, ctx ends or the signal is closed.
func (s *signal) wait(ctx context.Context) error {
	// An ended ctx is reported at once, even beside a raise that landed
	// since TryWait (the select below would take either).
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return ErrClosed
	}
	if s.ch == nil {
		return fmt.Errorf("%w: a %v wait set has no wait object", errInvalid, s.kind)
	}
	select {
	case <-s.ch:
		// Leave it set (only reset clears it), without blocking: a set
		// that claimed the flag before the last reset may have sent its
		// token since the receive, and the channel is full.
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
}

// close releases the waiters with ErrClosed and frees the wait object. The
// eventfd is raised first, so that a caller asleep on a dup of it wakes
// and finds the set closed; a dead eventfd's number is not closed.
func (s *signal) close() error {
	if s.closed.Swap(true) {
		return nil
	}
	close(s.done)
	if s.kind != FD {
		return nil
	}
	s.fdOp("raise", func(fd int) error {
		_, err := unix.Write(fd, one)
		if err == unix.EAGAIN {
			return nil
		}
		return err
	})
	s.fdMu.Lock()
	fd := s.efd
	s.efd = -1
	s.fdMu.Unlock()
	if s.err() != nil {
		return nil
	}
	if err := unix.Close(fd); err != nil {
		return fmt.Errorf("close wait set eventfd %d: %w", fd, err)
	}
	return nil
}
