package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/event"
)

// Receiver modes of pvctl bench. Inline is the original: in loopback one
// loop polls both ends; between hosts the receiver polls and sleeps on its
// CQ (CQ.Wait). Spin and wait run the receiver on a thread of its own, so
// that its CPU time is its own: spin polls without ever sleeping, wait
// sleeps on a wait set (event.WaitSet, an eventfd) whenever its CQ is empty.
const (
	recvInline = "inline"
	recvSpin   = "spin"
	recvWait   = "wait"
)

// recvResult is what the receiver measured.
type recvResult struct {
	got     int
	elapsed time.Duration
	cpu     time.Duration // the receiving thread's user+system time
	sleeps  int           // waits that slept (TryWait said it was safe)
	polls   int
	empty   int // polls that found nothing
}

// threadCPU returns the calling thread's user+system CPU time. The caller
// must be locked to its thread.
func threadCPU() (time.Duration, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return rusageCPU(&ru), nil
}

func rusageCPU(ru *unix.Rusage) time.Duration {
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// perMessage divides a duration into microseconds per message.
func perMessage(d time.Duration, messages int) float64 {
	if messages == 0 {
		return 0
	}
	return float64(d.Nanoseconds()) / 1e3 / float64(messages)
}

// benchReceiveLoop receives messages on a, reposting each receive, on a
// thread of its own, spinning or sleeping on a wait set when its CQ is
// empty. It stops when it has them all, or (UD, which may drop) when the
// sender has been quiet for 5 s.
func benchReceiveLoop(ctx context.Context, a *endpoint, messages int, typ vfrdma.QPType, mode string) (recvResult, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
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
		if err := ws.Add(a.cq); err != nil {
			ws.Close()
			return r, err
		}
		defer func() {
			_ = ws.Remove(a.cq)
			_ = ws.Close()
		}()
	}
	const quiet = 5 * time.Second
	wcs := make([]vfrdma.WC, 64)
	cpu0, err := threadCPU()
	if err != nil {
		return r, err
	}
	start := time.Now()
	last := start
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
			if err := a.postRecv(int(wc.WRID)); err != nil {
				return r, err
			}
		}
		if n > 0 {
			last = time.Now()
			continue
		}
		r.empty++
		if mode == recvSpin {
			if r.empty%1024 == 0 {
				if err := ctx.Err(); err != nil {
					return r, err
				}
				if time.Since(last) > quiet {
					if typ == vfrdma.UD {
						break
					}
					return r, fmt.Errorf("received %d of %d, then nothing for %v", r.got, messages, quiet)
				}
			}
			continue
		}
		switch err := ws.TryWait(); {
		case errors.Is(err, event.ErrAgain):
			continue
		case err != nil:
			return r, err
		}
		r.sleeps++
		wctx, cancel := context.WithTimeout(ctx, quiet)
		err = ws.Wait(wctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			if typ == vfrdma.UD {
				break
			}
			return r, fmt.Errorf("received %d of %d, then nothing for %v", r.got, messages, quiet)
		}
		if err != nil {
			return r, err
		}
	}
	r.elapsed = time.Since(start)
	cpu1, err := threadCPU()
	r.cpu = cpu1 - cpu0
	return r, err
}

// addReceiver puts the receiver's figures into a bench row.
func (row *benchRow) addReceiver(mode string, r recvResult) {
	row.Receiver = mode
	row.ReceivesChecked = r.got
	row.ReceiverCPUUSPerMsg = perMessage(r.cpu, r.got)
	if r.elapsed > 0 {
		row.ReceiverCPUPercent = 100 * r.cpu.Seconds() / r.elapsed.Seconds()
		row.ReceiverMsgPerSec = float64(r.got) / r.elapsed.Seconds()
	}
	if r.got > 0 {
		row.SleepsPerMsg = float64(r.sleeps) / float64(r.got)
		row.EmptyPollsPerMsg = float64(r.empty) / float64(r.got)
	}
}
