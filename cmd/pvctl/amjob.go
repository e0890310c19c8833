package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vfrdma/vfrdma/am"
)

// pvctl am --launcher: the tasks of a job a launcher started (mpirun,
// srun, mpiexec: am.LauncherExchanger reads what it set) run an
// all-to-all: every task sends --messages messages of each of --sizes to
// every other task, every byte is checked at its target, and each task
// checks its counters exactly: origin and completion counters at the
// messages it sent, its target counter and Stats.Received at the messages
// it was sent. A task that is gone (killed, or its process ended) is
// purged by the others, which then fail naming it; a task that hears
// nothing new for --stall fails naming the tasks it still waits for.

// amJobHandler is the all-to-all's handler index; amJobTarget its target
// counter's.
const (
	amJobHandler = 4
	amJobDone    = 5 // a task has all it was sent: its last word
	amJobTarget  = 1
)

// amJobHeader is a message's user header: its origin, its size's index
// and its number among those of that size to this target.
func amJobHeader(src, sizeIdx, i int) []byte {
	var h [16]byte
	binary.LittleEndian.PutUint32(h[0:], uint32(src))
	binary.LittleEndian.PutUint32(h[4:], uint32(sizeIdx))
	binary.LittleEndian.PutUint32(h[8:], uint32(i))
	return h[:]
}

// amJobSeq is the pattern seed of a message, from its header: different
// for each origin, size and number.
func amJobSeq(src, sizeIdx, i, messages int) int { return (src*8+sizeIdx)*messages + i + src*7 }

// amJobResult is one task's report.
type amJobResult struct {
	Mode      string  `json:"mode"` // "launcher"
	Task      int     `json:"task"`
	Tasks     int     `json:"tasks"`
	Sizes     []int   `json:"sizes"`
	Messages  int     `json:"messages_per_size_per_task"`
	Sent      uint64  `json:"sent"`
	Received  int64   `json:"received"`
	Checked   int64   `json:"checked"`
	Origin    int64   `json:"origin_counter"`
	Complete  int64   `json:"completion_counter"`
	Target    int64   `json:"target_counter"`
	Seconds   float64 `json:"seconds"`
	MsgPerSec float64 `json:"messages_per_s"`
	// SetupSeconds is the job's set-up at this task: from opening the
	// device to the first Barrier's end (the address exchange, a QP per
	// peer connected, every task's handlers in place).
	SetupSeconds float64 `json:"setup_seconds"`
	// Start and End are when this task began sending and had all it was
	// sent, in Unix seconds: a job's span is the earliest Start to the
	// latest End.
	Start float64 `json:"start_unix"`
	End   float64 `json:"end_unix"`
	// MaxRSSKiB is the process's peak resident memory (getrusage).
	MaxRSSKiB int64 `json:"max_rss_kib"`
}

// getenv is the environment the launcher set: e.getenv in tests.
func (e *env) env(name string) string {
	if e.getenv != nil {
		return e.getenv(name)
	}
	return os.Getenv(name)
}

func cmdAMJob(e *env, o *amOpts, sizes []int) error {
	x, err := am.LauncherExchanger(e.env)
	if err != nil {
		return err
	}
	messages := o.messages
	t0 := time.Now()
	d, err := o.t.openDevice(e)
	if err != nil {
		return err
	}
	defer d.Close()
	ctx, cancel := withTimeout(30 * time.Minute)
	defer cancel()
	c, err := am.New(ctx, d, am.Config{Tasks: x.Tasks, Self: x.Self, Exchange: x, Polling: o.polling, Spin: o.spin, Credits: o.credits})
	if err != nil {
		return fmt.Errorf("task %d of %d: %w", x.Self, x.Tasks, err)
	}
	defer c.Close()
	self, tasks := c.Self(), c.Tasks()
	fail := func(err error) error { return fmt.Errorf("task %d of %d: %w", self, tasks, err) }

	// What arrived, by origin; the first wrong byte.
	from := make([]atomic.Int64, tasks)
	var checked, received atomic.Int64
	var badOnce sync.Once
	var bad error
	check := func(b []byte, src, sizeIdx, i int) {
		if sizeIdx >= len(sizes) || len(b) != sizes[sizeIdx] || i >= messages {
			badOnce.Do(func() {
				bad = fmt.Errorf("from task %d: a message of %d bytes, size #%d, number %d: not one this job sends", src, len(b), sizeIdx, i)
			})
		} else if err := checkPattern(b, amJobSeq(src, sizeIdx, i, messages)); err != nil {
			badOnce.Do(func() { bad = fmt.Errorf("from task %d, %d bytes, number %d: %w", src, len(b), i, err) })
		} else {
			checked.Add(1)
		}
		from[src].Add(1)
		received.Add(1)
	}
	err = c.SetHandler(amJobHandler, func(a *am.Arrival) am.Return {
		if len(a.UHdr) != 16 {
			badOnce.Do(func() { bad = fmt.Errorf("from task %d: a user header of %d bytes", a.Src, len(a.UHdr)) })
			return am.Return{}
		}
		src := int(binary.LittleEndian.Uint32(a.UHdr[0:]))
		sizeIdx := int(binary.LittleEndian.Uint32(a.UHdr[4:]))
		i := int(binary.LittleEndian.Uint32(a.UHdr[8:]))
		if src != a.Src {
			badOnce.Do(func() { bad = fmt.Errorf("from task %d: its header names task %d", a.Src, src) })
		}
		if a.Data != nil || a.Len == 0 {
			check(a.Data, a.Src, sizeIdx, i)
			return am.Return{}
		}
		buf, from := make([]byte, a.Len), a.Src // a is valid only during the call
		return am.Return{Buf: buf, Completion: func() { check(buf, from, sizeIdx, i) }}
	})
	if err != nil {
		return fail(err)
	}
	done := make([]atomic.Int64, tasks)
	err = c.SetHandler(amJobDone, func(a *am.Arrival) am.Return {
		done[a.Src].Add(1)
		return am.Return{}
	})
	if err != nil {
		return fail(err)
	}
	target := am.NewCounter()
	if err := c.SetCounter(amJobTarget, target); err != nil {
		return fail(err)
	}
	// Every task's handler is in place before anyone sends.
	if err := c.Barrier(ctx); err != nil {
		return fail(err)
	}
	setup := time.Since(t0).Seconds()
	fmt.Fprintf(e.stderr(), "task %d of %d: sending\n", self, tasks)

	org, cmpl := am.NewCounter(), am.NewCounter()
	start := time.Now()
	// A task found gone (purged: its QP failed, its process ended) is
	// sent nothing more; the job goes on among the others, and ends in
	// an error naming it.
	gone := map[int]error{}
	var sent int64
	for sizeIdx, size := range sizes {
		for i := range messages {
			for k := 1; k < tasks; k++ {
				tgt := (self + k) % tasks
				if gone[tgt] != nil {
					continue
				}
				data := make([]byte, size)
				pattern(data, amJobSeq(self, sizeIdx, i, messages))
				err := c.Amsend(tgt, amJobHandler, amJobHeader(self, sizeIdx, i), data, am.Counters{Tgt: amJobTarget, Org: org, Cmpl: cmpl})
				if errors.Is(err, am.ErrPurged) {
					gone[tgt] = err
					continue
				}
				if err != nil {
					return fail(err)
				}
				sent++
			}
		}
	}
	perTask := int64(messages * len(sizes))
	want := perTask * int64(tasks-1)
	// Everything this task sent is acknowledged, or failed with its
	// target purged (ErrPurged names the task).
	if err := c.Fence(ctx); err != nil {
		if len(gone) == 0 {
			gone[-1] = err
		}
	}
	// Everything it is sent arrives from every task not gone; a task that
	// owes messages past --stall is gone too.
	stall := o.stall
	waitAll := func(what string, count func(src int) int64, need int64) {
		last, lastAt := int64(-1), time.Now()
		for {
			var total int64
			owe := []int{}
			for src := range tasks {
				if src == self || gone[src] != nil {
					continue
				}
				n := count(src)
				total += n
				if n < need {
					owe = append(owe, src)
				}
			}
			if len(owe) == 0 {
				return
			}
			if total != last {
				last, lastAt = total, time.Now()
			} else if time.Since(lastAt) > stall {
				for _, src := range owe {
					gone[src] = fmt.Errorf("task %d is gone: no %s from it for %v (%d of %d)", src, what, stall, count(src), need)
				}
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitAll("message", func(src int) int64 { return from[src].Load() }, perTask)
	secs := time.Since(start).Seconds()
	if bad != nil {
		return fail(bad)
	}
	// The last word: each task tells the others not gone that it has
	// all it was sent, and leaves once it has heard the same from them,
	// so that none leaves while another still exchanges with it.
	var dones int64
	for tgt := range tasks {
		if tgt == self || gone[tgt] != nil {
			continue
		}
		if err := c.Amsend(tgt, amJobDone, nil, nil, am.Counters{}); errors.Is(err, am.ErrPurged) {
			gone[tgt] = err
		} else if err != nil {
			return fail(err)
		} else {
			dones++
		}
	}
	waitAll("last word", func(src int) int64 { return done[src].Load() }, 1)
	if len(gone) > 0 {
		var got int64
		for src := range tasks {
			if src != self && gone[src] == nil {
				got += from[src].Load()
			}
		}
		fmt.Fprintf(e.out, "task %d of %d: with the tasks not gone, sent %d and received %d messages, every byte checked\n", self, tasks, sent, got)
		return fail(errors.Join(goneErrs(gone)...))
	}

	// Everyone is done before anyone closes.
	if err := c.Barrier(ctx); err != nil {
		return fail(err)
	}
	// Its own Barrier messages acknowledged too, Stats count the two
	// Barriers' messages beside the job's (one to and from every task,
	// itself included, each time) and the last words (one to and from
	// every other task).
	if err := c.Fence(ctx); err != nil {
		return fail(err)
	}
	st, barriers := c.Stats(), uint64(2*tasks)+uint64(dones)
	res := amJobResult{Mode: "launcher", Task: self, Tasks: tasks, Sizes: sizes, Messages: messages,
		Sent: st.Sent - barriers, Received: received.Load(), Checked: checked.Load(),
		Origin: org.Get(), Complete: cmpl.Get(), Target: target.Get(), Seconds: secs, SetupSeconds: setup, MaxRSSKiB: maxRSS(),
		Start: unixSeconds(start), End: unixSeconds(start.Add(time.Duration(secs * float64(time.Second))))}
	if secs > 0 {
		res.MsgPerSec = float64(res.Sent+uint64(res.Received)) / secs
	}
	var wrong []string
	for _, v := range []struct {
		name      string
		got, want int64
	}{{"sent", int64(res.Sent), sent}, {"origin counter", res.Origin, sent}, {"completion counter", res.Complete, sent},
		{"received", res.Received, want}, {"checked", res.Checked, want}, {"target counter", res.Target, want},
		{"Stats.Received", int64(st.Received - barriers), want}, {"Stats.Delivered", int64(st.Delivered - barriers), sent},
		{"Stats.Failed", int64(st.Failed), 0}} {
		if v.got != v.want {
			wrong = append(wrong, fmt.Sprintf("%s %d, want %d", v.name, v.got, v.want))
		}
	}
	if len(wrong) > 0 {
		return fail(fmt.Errorf("counters not exact: %s", strings.Join(wrong, "; ")))
	}
	if e.json {
		return e.printJSON(res)
	}
	fmt.Fprintf(e.out, "task %d of %d: sent %d and received %d messages (sizes %v, %d per size to each task), every byte checked; counters exact: origin %d, completion %d, target %d; %.0f msg/s in %.2f s; set-up %.2f s, peak RSS %d MiB\n",
		self, tasks, res.Sent, res.Received, sizes, messages, res.Origin, res.Complete, res.Target, res.MsgPerSec, secs, res.SetupSeconds, res.MaxRSSKiB>>10)
	return nil
}

// goneErrs lists why each gone task is (index order; -1, a failure no
// Amsend saw, last).
func goneErrs(gone map[int]error) []error {
	var ids []int
	for t := range gone {
		ids = append(ids, t)
	}
	sort.Ints(ids)
	var errs []error
	for _, t := range ids {
		if t >= 0 {
			errs = append(errs, gone[t])
		}
	}
	if err := gone[-1]; err != nil {
		errs = append(errs, err)
	}
	return errs
}

// maxRSS is the process's peak resident memory in KiB (0 if unknown).
func maxRSS() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Maxrss
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }
