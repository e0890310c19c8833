package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/event"
)

// Receiver modes of pvctl bench. Inline (the default) is the send bench:
// in loopback one loop polls both ends; between hosts the receiver polls
// and sleeps on CQ.Wait. Spin and wait run the receiver as a loop of its
// own: spin polls its CQ without ever sleeping, wait sleeps on a wait set
// (event.WaitSet of kind FD, an eventfd) whenever its CQ is empty.
const (
	recvInline = "inline"
	recvSpin   = "spin"
	recvWait   = "wait"
)

// The scope of the receiver's CPU figures (benchResult.ReceiverCPU).
const (
	cpuScopeProcess  = "process"
	cpuScopeLoopback = "process, sender included"
)

// cpuUse is a getrusage(RUSAGE_SELF) reading, or the difference of two:
// the whole process's user and system CPU time. RUSAGE_SELF, not RUSAGE_THREAD: the
// receiver is a goroutine, which the runtime moves between threads, and a
// sleeping receiver's wake-ups are partly made on other threads (the CQ
// interrupt goroutine, the runtime's poller); the process is what
// receiving costs. In loopback the sender is in the same process.
type cpuUse struct {
	user, sys time.Duration
}

func cpuUseOf(ru *unix.Rusage) cpuUse {
	return cpuUse{user: time.Duration(ru.Utime.Nano()), sys: time.Duration(ru.Stime.Nano())}
}

func readCPU() (cpuUse, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return cpuUse{}, fmt.Errorf("getrusage: %w", err)
	}
	return cpuUseOf(&ru), nil
}

// since returns what was used between before and c.
func (c cpuUse) since(before cpuUse) cpuUse {
	return cpuUse{user: c.user - before.user, sys: c.sys - before.sys}
}

// total is user plus system time.
func (c cpuUse) total() time.Duration { return c.user + c.sys }

// recvResult is what the receiver measured.
type recvResult struct {
	got     int
	elapsed time.Duration
	cpu     cpuUse // the process's, over the receive loop
	// WaitSet.Wait calls, each after a poll found the CQ empty. Wait
	// returns at once, without sleeping, when its TryWait finds a
	// completion that came since the poll: this counts the sleeps, or a
	// few more.
	wakeups int
	polls   int
	empty   int // polls that found nothing
}

// perMessage divides a duration into microseconds per message.
func perMessage(d time.Duration, messages int) float64 {
	if messages == 0 {
		return 0
	}
	return float64(d.Nanoseconds()) / 1e3 / float64(messages)
}

// errQuiet is the cause of a receive loop's context when the sender has
// been quiet too long.
var errQuiet = errors.New("the sender went quiet")

// watchQuiet returns a context that ends, with cause errQuiet, once
// progress has not moved for quiet. It checks on a ticker of its own, so
// that the receive loop pays one atomic store per poll that found
// something, not a timer per wait. stop ends the watch.
func watchQuiet(ctx context.Context, progress *atomic.Int64, quiet time.Duration) (qctx context.Context, stop func()) {
	qctx, cancel := context.WithCancelCause(ctx)
	go func() {
		t := time.NewTicker(quiet / 8)
		defer t.Stop()
		last, since := progress.Load(), time.Now()
		for {
			select {
			case <-qctx.Done():
				return
			case now := <-t.C:
				if p := progress.Load(); p != last {
					last, since = p, now
				} else if now.Sub(since) >= quiet {
					cancel(errQuiet)
					return
				}
			}
		}
	}()
	return qctx, func() { cancel(context.Canceled) }
}

// benchReceiveLoop receives messages on a, reposting each receive,
// spinning on its CQ (spin) or sleeping on a wait set when the CQ is empty
// (wait). It stops when it has them all, or (UD, which may drop) when the
// sender has been quiet for 5 s.
func benchReceiveLoop(ctx context.Context, a *endpoint, messages int, typ vfrdma.QPType, mode string) (recvResult, error) {
	var r recvResult
	if err := a.fillRecvs(); err != nil {
		return r, err
	}
	var ws *event.WaitSet
	if mode == recvWait {
		var err error
		if ws, err = event.NewWaitSet(event.FD); err != nil {
			return r, err
		}
		if err := ws.Add(a.cq.Source()); err != nil {
			_ = ws.Close()
			return r, err
		}
		defer func() {
			_ = ws.Remove(a.cq.Source())
			_ = ws.Close()
		}()
	}
	const quiet = 5 * time.Second
	var progress atomic.Int64
	qctx, stop := watchQuiet(ctx, &progress, quiet)
	defer stop()
	wcs := make([]vfrdma.WC, 64)
	cpu0, err := readCPU()
	if err != nil {
		return r, err
	}
	start := time.Now()
loop:
	for r.got < messages {
		n, err := a.cq.Poll(wcs)
		if err != nil {
			return r, err
		}
		r.polls++
		for _, wc := range wcs[:n] {
			if wc.Status != vfrdma.WCSuccess {
				return r, fmt.Errorf("receive completion %+v", wc)
			}
			r.got++
		}
		if n > 0 {
			if err := a.repost(wcs[:n]); err != nil {
				return r, err
			}
			progress.Store(int64(r.got))
			continue
		}
		r.empty++
		if mode == recvSpin {
			if r.empty%1024 != 0 || qctx.Err() == nil {
				continue
			}
		} else {
			// Wait arms the CQ (TryWait) and sleeps unless it finds a
			// completion; it returns at once when one came since the poll.
			r.wakeups++
			err := ws.Wait(qctx)
			if err == nil {
				continue
			}
			if qctx.Err() == nil {
				return r, err
			}
		}
		if errors.Is(context.Cause(qctx), errQuiet) {
			if typ == vfrdma.UD {
				break loop
			}
			return r, fmt.Errorf("received %d of %d, then nothing for %v", r.got, messages, quiet)
		}
		return r, ctx.Err()
	}
	r.elapsed = time.Since(start)
	cpu1, err := readCPU()
	r.cpu = cpu1.since(cpu0)
	return r, err
}

// addReceiver puts the receiver's figures into a bench row.
func (row *benchRow) addReceiver(mode string, r recvResult) {
	row.Receiver = mode
	row.ReceivesChecked = r.got
	row.ReceiverCPUUSPerMsg = perMessage(r.cpu.total(), r.got)
	if r.elapsed > 0 {
		row.ReceiverCPUPercent = 100 * r.cpu.total().Seconds() / r.elapsed.Seconds()
		row.ReceiverMsgPerSec = float64(r.got) / r.elapsed.Seconds()
	}
	if r.got > 0 {
		row.WakeupsPerMsg = float64(r.wakeups) / float64(r.got)
		row.EmptyPollsPerMsg = float64(r.empty) / float64(r.got)
	}
}

// cpuScopeNote says in words whose CPU time the receiver figures are.
func cpuScopeNote(scope string) string {
	switch scope {
	case cpuScopeLoopback:
		return "the whole process (getrusage RUSAGE_SELF), sender included: in loopback the receiver is a goroutine beside it; wake-ups are WaitSet.Wait calls"
	case cpuScopeProcess:
		return "this receiver process (getrusage RUSAGE_SELF); wake-ups are WaitSet.Wait calls"
	}
	return scope
}
