package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/am"
	"github.com/vfrdma/vfrdma/connect"
	"github.com/vfrdma/vfrdma/internal/perf"
)

// Handler indices of pvctl am, the same on both tasks.
const (
	amPing = 1 // driver → responder: answer with the same data
	amPong = 2 // responder → driver: the answer
	amSink = 3 // driver → responder: check and count
)

type amRow struct {
	Test            string  `json:"test"` // latency, rate or bandwidth
	Size            int     `json:"size"`
	Messages        int     `json:"messages"` // round trips for latency
	Seconds         float64 `json:"seconds"`
	RoundTripUS     float64 `json:"round_trip_us,omitempty"`
	MessagesPerSec  float64 `json:"messages_per_s,omitempty"`
	MBPerSec        float64 `json:"mb_per_s,omitempty"`
	PacketsPerMsg   float64 `json:"packets_per_message,omitempty"`
	DoorbellsPerMsg float64 `json:"doorbells_per_message,omitempty"`
	// The same messages sent with plain PostSend, 32 per doorbell, in the
	// same run, and how many times faster that is.
	RawMessagesPerSec float64 `json:"raw_messages_per_s,omitempty"`
	RawOverAM         float64 `json:"raw_over_am,omitempty"`
	// Latency, at the driver, on the guest's clock (medians): from the
	// answer's handler (its first packet taken) to the caller waiting for
	// it running again, and from there to the next request's Amsend
	// returning (its doorbell rung).
	HandlerToCallerUS float64 `json:"handler_to_caller_us,omitempty"`
	CallerToSentUS    float64 `json:"caller_to_sent_us,omitempty"`
}

// pong is an answer's verdict, and when its handler took it.
type pong struct {
	err error
	at  time.Time
}

type amResult struct {
	Mode     string  `json:"mode"` // loopback, driver or responder
	Progress string  `json:"progress"`
	Rows     []amRow `json:"rows,omitempty"`
	Checked  int64   `json:"messages_checked"`
}

// cmdAM runs active messages between two tasks (package am): ping-pong
// latency, one-way message rate and bandwidth, every byte checked, beside
// the raw PostSend rate of the same messages. Task 0 drives, task 1
// responds: in loopback both are contexts on this device; with --vm or
// --listen/--connect, the client end drives.
func cmdAM(e *env, args []string) error {
	fs := newFlagSet(e, "am")
	o := amFlags(fs)
	t := &o.t
	if err := t.parse(e, fs, args); err != nil {
		return err
	}
	iters, messages, bwSize, bwMessages, polling := o.iters, o.messages, o.bwSize, o.bwMessages, o.polling
	sizes, err := parseSizes(o.sizeList)
	if err != nil {
		return err
	}
	tests := map[string]bool{}
	for _, name := range strings.Split(o.testList, ",") {
		switch name {
		case "latency", "rate", "bandwidth":
			tests[name] = true
		default:
			return usageErrorf("--tests %q: %q is not latency, rate or bandwidth", o.testList, name)
		}
	}
	if o.launcher {
		if o.t.listen != "" || o.t.connect != "" || o.t.vm {
			return usageErrorf("--launcher: the launcher makes the job; no --listen, --connect or --vm")
		}
		return cmdAMJob(e, o, sizes)
	}
	rawSizes := sizes
	if !tests["rate"] {
		rawSizes = nil
	}
	for _, c := range []struct {
		name string
		v    int
		what string
	}{{"iters", iters, "round trips per size"}, {"messages", messages, "messages per size"}, {"bw-messages", bwMessages, "messages"}} {
		if err := checkCount(c.name, c.v, c.what); err != nil {
			return err
		}
	}
	if bwSize < 1 || bwSize > am.DefaultMaxMessage {
		return usageErrorf("--bw-size %d: want 1 to %d bytes (am's largest message)", bwSize, am.DefaultMaxMessage)
	}
	d, err := t.openDevice(e)
	if err != nil {
		return err
	}
	defer d.Close()
	ctx, cancel := withTimeout(10 * time.Minute)
	defer cancel()

	res := amResult{Mode: "loopback"}
	// The raw rate first, over a plain RC QP pair (or the peer's QP).
	raw, x, err := amRaw(ctx, t, d, rawSizes, messages)
	if err != nil {
		return fmt.Errorf("raw PostSend rate: %w", err)
	}
	if x != nil {
		defer x.close()
		res.Mode = "driver"
		if x.server() {
			res.Mode = "responder"
		}
	}
	tasks, err := amTasks(ctx, d, x, am.Config{Polling: polling, Spin: o.spin, Credits: o.credits})
	if err != nil {
		return err
	}
	res.Progress = tasks[0].ProgressMode()
	defer func() {
		for _, c := range tasks {
			c.Close()
		}
	}()
	var checked, bad atomic.Int64
	pongs := make(chan pong, 1)
	for _, c := range tasks {
		install := amHandlers
		if !o.check {
			install = amHandlersUnchecked(max(slices.Max(sizes), bwSize))
		}
		if err := install(c, &checked, &bad, pongs); err != nil {
			return err
		}
	}
	if res.Mode == "responder" {
		c := tasks[0]
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		if err := c.Barrier(ctx); err != nil { // the driver is done
			return err
		}
		res.Checked = checked.Load()
		if e.json {
			if err := e.printJSON(res); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(e.out, "am responder: %d messages checked, %d bad\n", res.Checked, bad.Load())
			fmt.Fprintln(e.out, amStatsLine(c.Stats()))
		}
		if bad.Load() > 0 {
			return fmt.Errorf("%d messages arrived with wrong bytes", bad.Load())
		}
		return nil
	}
	drv, resp := tasks[0], 1
	if res.Mode == "driver" {
		if err := drv.Barrier(ctx); err != nil {
			return err
		}
	}
	for _, size := range sizes {
		if !tests["latency"] {
			break
		}
		row, err := amLatency(ctx, drv, resp, size, iters, pongs, o.check)
		if err != nil {
			return err
		}
		res.Rows = append(res.Rows, row)
	}
	for i, size := range sizes {
		if !tests["rate"] {
			break
		}
		row, err := amRate(ctx, drv, resp, "rate", size, messages)
		if err != nil {
			return err
		}
		row.RawMessagesPerSec = raw[i]
		if row.MessagesPerSec > 0 {
			row.RawOverAM = raw[i] / row.MessagesPerSec
		}
		res.Rows = append(res.Rows, row)
	}
	if tests["bandwidth"] {
		row, err := amRate(ctx, drv, resp, "bandwidth", bwSize, bwMessages)
		if err != nil {
			return err
		}
		res.Rows = append(res.Rows, row)
	}
	if res.Mode == "driver" {
		if err := drv.Barrier(ctx); err != nil {
			return err
		}
	} else if err := drv.Fence(ctx); err != nil {
		return err
	}
	res.Checked = checked.Load()
	if bad.Load() > 0 {
		return fmt.Errorf("%d messages arrived with wrong bytes", bad.Load())
	}
	if e.json {
		return e.printJSON(res)
	}
	what := "two tasks on one device"
	if res.Mode == "driver" {
		what = "this task drives, the peer responds"
	}
	checking := "every byte checked"
	if !o.check {
		checking = "bytes not checked (--check=false)"
	}
	fmt.Fprintf(e.out, "active messages, %s (%s progress); %s\n", what, res.Progress, checking)
	w := tabwriter.NewWriter(e.out, 2, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "test\tsize\tmessages\tµs/round trip\tmsg/s\tMB/s\tpackets/msg\tdoorbells/msg\traw msg/s\traw÷am\t")
	for _, r := range res.Rows {
		fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%s\t%s\t%.2f\t%.3f\t%s\t%s\t\n", r.Test, r.Size, r.Messages,
			blank(r.RoundTripUS, "%.1f"), blank(r.MessagesPerSec, "%.0f"), blank(r.MBPerSec, "%.1f"),
			r.PacketsPerMsg, r.DoorbellsPerMsg, blank(r.RawMessagesPerSec, "%.0f"), blank(r.RawOverAM, "%.2f"))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(e.out, amStatsLine(drv.Stats()))
	for _, r := range res.Rows {
		if r.Test == "latency" && res.Mode != "responder" {
			fmt.Fprintf(e.out, "latency %d B at the driver (guest clock, medians): answer's handler → caller running %.1f µs, caller → next Amsend returned (doorbell rung) %.1f µs\n",
				r.Size, r.HandlerToCallerUS, r.CallerToSentUS)
		}
	}
	return nil
}

// amStatsLine is a task's whole run in one line: its messages, and its
// packets and doorbells by kind.
func amStatsLine(s am.Stats) string {
	return fmt.Sprintf("am stats: %d messages sent, %d received; %d data packets, %d control packets (credits and acknowledgements), %d acknowledgements rode on data packets; %d doorbells, %d of them receive buffers back to the SRQ; %d credit stalls",
		s.Sent, s.Received, s.Packets, s.CtrlPackets, s.RideAcks, s.Doorbells, s.RecvDoorbells, s.CreditStalls)
}

// blank formats v, or nothing for 0.
func blank(v float64, f string) string {
	if v == 0 {
		return ""
	}
	return fmt.Sprintf(f, v)
}

// amOpts are am's flags.
type amOpts struct {
	t                                   trafficFlags
	sizeList, testList                  string
	iters, messages, bwSize, bwMessages int
	polling, check                      bool
	spin                                time.Duration
	credits                             int
	launcher                            bool
	stall                               time.Duration
}

// amFlags declares am's flags on fs.
func amFlags(fs *flag.FlagSet) *amOpts {
	o := &amOpts{}
	o.t.peerFlags.register(fs,
		"wait for the other task (it drives) on `ADDR`: HOST:PORT, or :PORT for every address",
		"connect to the other task at `HOST:PORT` (this one drives)",
		"the other task is the other VM of a two-VM bench run (VM 1 drives)", "pvctl-am")
	fs.StringVar(&o.sizeList, "sizes", "8,4096", fmt.Sprintf("message sizes for latency and rate (`LIST` of 0 to %d, comma-separated)", am.DefaultMaxMessage))
	fs.StringVar(&o.testList, "tests", "latency,rate,bandwidth", "the tests to run (`LIST` of latency, rate and bandwidth, comma-separated; the raw rate goes with rate)")
	fs.IntVar(&o.iters, "iters", 1000, "ping-pong round trips per size")
	fs.IntVar(&o.messages, "messages", 20000, "messages per size for the rate")
	fs.IntVar(&o.bwSize, "bw-size", 1<<20, "message size for the bandwidth")
	fs.IntVar(&o.bwMessages, "bw-messages", 64, "messages for the bandwidth")
	fs.BoolVar(&o.polling, "polling", false, "progress by polling without ever sleeping")
	fs.BoolVar(&o.check, "check", true, "fill every message with a pattern and check every byte at its target (--check=false: send and answer with the same untouched buffers, as ucx_perftest does, to time the library alone)")
	fs.IntVar(&o.credits, "credits", 0, fmt.Sprintf("packets in flight to the other task (am.Config.Credits; 0: the default, %d); both tasks must use the same", am.DefaultCredits))
	fs.BoolVar(&o.launcher, "launcher", false, "the tasks are a job a launcher started (mpirun, srun, mpiexec; the job's address from VFRDMA_AM_ADDR or VFRDMA_AM_PORT): an all-to-all among them instead of the two-task benchmark, --messages of each of --sizes to every other task, every byte checked, each task's counters exact; a task gone is purged and named")
	fs.DurationVar(&o.stall, "stall", 30*time.Second, "with --launcher: fail, naming the tasks still owing messages, when none arrives for this long")
	fs.DurationVar(&o.spin, "spin", 0, "how long the progress goroutine polls an empty CQ before it sleeps or naps (am.Config.Spin; 0: the default, negative: none)")
	fs.BoolVar(&o.t.pollDoorbell, "poll-doorbell", true, "an empty CQ poll rings the POLL doorbell, as rdma-core's provider does; on QEMU's device CQs are then never armed and the progress goroutine spins, then naps between polls (--poll-doorbell=false: it sleeps on the CQ's interrupt)")
	return o
}

func parseSizes(list string) ([]int, error) {
	var sizes []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 || n > am.DefaultMaxMessage {
			return nil, usageErrorf("--sizes %q: %q: want sizes from 0 to %d bytes", list, f, am.DefaultMaxMessage)
		}
		sizes = append(sizes, n)
	}
	return sizes, nil
}

// amRaw measures plain PostSend, 32 per doorbell, for each size; between
// hosts the server end receives. It returns the sender's rates (none on
// the receiving end) and the exchanger with the peer, if any.
func amRaw(ctx context.Context, t *trafficFlags, d *vfrdma.Device, sizes []int, messages int) ([]float64, exchanger, error) {
	slot := 8
	for _, s := range sizes {
		slot = max(slot, s)
	}
	a, b, x, err := t.setup(ctx, d, 256, slot)
	if err != nil {
		return nil, nil, err
	}
	rates := make([]float64, len(sizes))
	for i, size := range sizes {
		if x != nil {
			if err := x.barrier(ctx, fmt.Sprintf("am-raw-%d", i)); err != nil {
				return nil, x, err
			}
		}
		a.msgSize = max(size, 1)
		if x != nil && x.server() {
			if _, err := benchReceive(ctx, a, messages, vfrdma.RC, perf.Sleep); err != nil {
				return nil, x, err
			}
			continue
		}
		row, err := benchSend(ctx, a, b, messages, 32, sendOpts{})
		if err != nil {
			return nil, x, err
		}
		rates[i] = row.MessagesPerSec
	}
	return rates, x, nil
}

// amTasks makes the am contexts: both tasks in loopback, this task's
// otherwise (the driving, client end is task 0).
func amTasks(ctx context.Context, d *vfrdma.Device, x exchanger, cfg am.Config) ([]*am.Context, error) {
	cfg.Tasks = 2
	if x == nil {
		xs := am.LocalExchangers(2)
		cs := make([]*am.Context, 2)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for i := range cs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cfg := cfg
				cfg.Self, cfg.Exchange = i, xs[i]
				cs[i], errs[i] = am.New(ctx, d, cfg)
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			for _, c := range cs {
				if c != nil {
					c.Close()
				}
			}
			return nil, err
		}
		return cs, nil
	}
	cfg.Self = 0
	if x.server() {
		cfg.Self = 1
	}
	if v, ok := x.(*vmExchange); ok {
		// Rendezvous keys are written once per run: a tag of its own.
		x = &vmExchange{c: v.c, vm: v.vm, tag: v.tag + "/am"}
	}
	cfg.Exchange = amPeerExchange{x: x, self: cfg.Self}
	c, err := am.New(ctx, d, cfg)
	if err != nil {
		return nil, err
	}
	return []*am.Context{c}, nil
}

// amPeerExchange is am's all-gather over pvctl's exchanger with the peer.
type amPeerExchange struct {
	x    exchanger
	self int
}

func (p amPeerExchange) AllGather(ctx context.Context, mine []byte) ([][]byte, error) {
	theirs, err := p.x.swap(ctx, connect.Info{Data: mine})
	if err != nil {
		return nil, err
	}
	all := make([][]byte, 2)
	all[p.self], all[1-p.self] = mine, theirs.Data
	return all, nil
}

// amHandlers registers the ping, pong and sink handlers on c. Every
// message's data is pattern(seq) with seq in its user header; checked
// counts the messages checked, bad those with a wrong byte; pongs gets
// each answer's verdict.
func amHandlers(c *am.Context, checked, bad *atomic.Int64, pongs chan<- pong) error {
	check := func(b []byte, seq int) error {
		checked.Add(1)
		if err := checkPattern(b, seq); err != nil {
			bad.Add(1)
			return err
		}
		return nil
	}
	err := c.SetHandler(amPing, func(a *am.Arrival) am.Return {
		seq := int(binary.LittleEndian.Uint64(a.UHdr))
		src := a.Src
		uh := append([]byte(nil), a.UHdr...)
		answer := func(b []byte) {
			_ = check(b, seq)
			_ = c.Amsend(src, amPong, uh, b, am.Counters{})
		}
		if a.Data != nil {
			answer(append([]byte(nil), a.Data...)) // Data is valid only in the call
			return am.Return{}
		}
		buf := make([]byte, a.Len)
		return am.Return{Buf: buf, Completion: func() { answer(buf) }}
	})
	if err != nil {
		return err
	}
	err = c.SetHandler(amPong, func(a *am.Arrival) am.Return {
		seq := int(binary.LittleEndian.Uint64(a.UHdr))
		if a.Data != nil {
			at := time.Now()
			pongs <- pong{check(a.Data, seq), at}
			return am.Return{}
		}
		buf := make([]byte, a.Len)
		at := time.Now()
		return am.Return{Buf: buf, Completion: func() { pongs <- pong{check(buf, seq), at} }}
	})
	if err != nil {
		return err
	}
	return c.SetHandler(amSink, func(a *am.Arrival) am.Return {
		seq := int(binary.LittleEndian.Uint64(a.UHdr))
		if a.Data != nil {
			_ = check(a.Data, seq)
			return am.Return{}
		}
		buf := make([]byte, a.Len)
		return am.Return{Buf: buf, Completion: func() { _ = check(buf, seq) }}
	})
}

// amHandlersUnchecked registers handlers that do what ucx_perftest's do:
// nothing with the bytes. The ping handler answers with a buffer of the
// same length that nothing writes; data that comes in fragments lands in
// one buffer per context that nothing reads (fragments land one message
// at a time, on the progress goroutine). checked and bad stay 0.
func amHandlersUnchecked(maxSize int) func(c *am.Context, checked, bad *atomic.Int64, pongs chan<- pong) error {
	answer, uh := make([]byte, maxSize), seqHeader(0)
	return func(c *am.Context, _, _ *atomic.Int64, pongs chan<- pong) error {
		sink := make([]byte, maxSize)
		err := c.SetHandler(amPing, func(a *am.Arrival) am.Return {
			src, n := a.Src, a.Len
			if a.Data != nil {
				_ = c.Amsend(src, amPong, uh, answer[:n], am.Counters{})
				return am.Return{}
			}
			return am.Return{Buf: sink[:n], Completion: func() { _ = c.Amsend(src, amPong, uh, answer[:n], am.Counters{}) }}
		})
		if err != nil {
			return err
		}
		err = c.SetHandler(amPong, func(a *am.Arrival) am.Return {
			at := time.Now()
			if a.Data != nil {
				pongs <- pong{at: at}
				return am.Return{}
			}
			return am.Return{Buf: sink[:a.Len], Completion: func() { pongs <- pong{at: at} }}
		})
		if err != nil {
			return err
		}
		return c.SetHandler(amSink, func(a *am.Arrival) am.Return {
			if a.Data != nil {
				return am.Return{}
			}
			return am.Return{Buf: sink[:a.Len]}
		})
	}
}

func seqHeader(seq int) []byte { return binary.LittleEndian.AppendUint64(nil, uint64(seq)) }

// amLatency bounces size bytes between the driver and the responder.
func amLatency(ctx context.Context, c *am.Context, resp, size, iters int, pongs <-chan pong, check bool) (amRow, error) {
	data := make([]byte, size)
	var resumed time.Time // when the caller ran again after the last answer
	h2c := make([]time.Duration, 0, iters)
	c2s := make([]time.Duration, 0, iters)
	measure := false
	round := func(seq int) error {
		if check {
			pattern(data, seq)
		}
		if err := c.Amsend(resp, amPing, seqHeader(seq), data, am.Counters{}); err != nil {
			return err
		}
		if measure && !resumed.IsZero() {
			c2s = append(c2s, time.Since(resumed))
		}
		select {
		case p := <-pongs:
			resumed = time.Now()
			if measure {
				h2c = append(h2c, resumed.Sub(p.at))
			}
			return p.err
		case <-ctx.Done():
			return fmt.Errorf("no answer to round trip %d: %w", seq, ctx.Err())
		}
	}
	for i := range 10 { // warm up
		if err := round(i); err != nil {
			return amRow{}, err
		}
	}
	before := c.Stats()
	measure, resumed = true, time.Time{}
	start := time.Now()
	for i := range iters {
		if err := round(i); err != nil {
			return amRow{}, err
		}
	}
	el := time.Since(start)
	after := c.Stats()
	return amRow{Test: "latency", Size: size, Messages: iters, Seconds: el.Seconds(), RoundTripUS: perf.PerMessage(el, iters),
		PacketsPerMsg:     float64(after.Packets-before.Packets) / float64(iters),
		DoorbellsPerMsg:   float64(after.Doorbells-before.Doorbells) / float64(iters),
		HandlerToCallerUS: perf.US(perf.Median(h2c)), CallerToSentUS: perf.US(perf.Median(c2s))}, nil
}

// amRate sends messages of size bytes one way and waits until the
// responder's completion handlers have run for them all (cmpl).
func amRate(ctx context.Context, c *am.Context, resp int, test string, size, messages int) (amRow, error) {
	data := make([]byte, size)
	seq := size // every message carries the same bytes
	pattern(data, seq)
	uh := seqHeader(seq)
	cmpl := am.NewCounter()
	before := c.Stats()
	start := time.Now()
	for range messages {
		if err := c.Amsend(resp, amSink, uh, data, am.Counters{Cmpl: cmpl}); err != nil {
			return amRow{}, err
		}
	}
	if _, err := cmpl.Wait(ctx, int64(messages)); err != nil {
		return amRow{}, fmt.Errorf("%s: %d of %d messages complete: %w", test, cmpl.Get(), messages, err)
	}
	el := time.Since(start)
	after := c.Stats()
	row := amRow{Test: test, Size: size, Messages: messages, Seconds: el.Seconds(),
		MessagesPerSec:  float64(messages) / el.Seconds(),
		MBPerSec:        float64(size) * float64(messages) / el.Seconds() / 1e6,
		PacketsPerMsg:   float64(after.Packets-before.Packets) / float64(messages),
		DoorbellsPerMsg: float64(after.Doorbells-before.Doorbells) / float64(messages)}
	if test == "bandwidth" {
		row.MessagesPerSec = 0
	} else {
		row.MBPerSec = 0
	}
	return row, nil
}
