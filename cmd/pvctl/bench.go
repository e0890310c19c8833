package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/internal/perf"
)

type benchRow struct {
	Batch           int     `json:"batch"`
	Messages        int     `json:"messages"`
	Seconds         float64 `json:"seconds"`
	MessagesPerSec  float64 `json:"messages_per_s"`
	P50US           float64 `json:"p50_us"`
	P99US           float64 `json:"p99_us"`
	Doorbells       uint64  `json:"doorbells"`
	DoorbellsPerMsg float64 `json:"doorbells_per_message"`
	// Where the sender's time went, per message: inside PostSend (the
	// doorbell's exit included), inside CQ.Poll (a POLL doorbell's exit
	// included), asleep in CQ.Wait; the rest is the loop's own.
	PostUSPerMsg    float64 `json:"post_us_per_msg"`
	PollUSPerMsg    float64 `json:"poll_us_per_msg"`
	WaitUSPerMsg    float64 `json:"wait_us_per_msg"`
	ReceivesChecked int     `json:"receives_checked,omitempty"`
	// The receiver's side, spin or wait (benchwait.go); CPU is the
	// process's (benchResult.ReceiverCPU).
	Receiver            string  `json:"receiver,omitempty"` // spin or wait
	ReceiverMsgPerSec   float64 `json:"receiver_messages_per_s,omitempty"`
	ReceiverCPUUSPerMsg float64 `json:"receiver_cpu_us_per_msg,omitempty"`
	ReceiverCPUPercent  float64 `json:"receiver_cpu_percent,omitempty"`
	WakeupsPerMsg       float64 `json:"wakeups_per_msg,omitempty"`
	EmptyPollsPerMsg    float64 `json:"empty_polls_per_msg,omitempty"`
	// One-sided modes (onesided.go): the completions whose data the
	// initiator checked (READ: every byte; atomic: the value fetched), the
	// target slots found holding the pattern after RDMA WRITEs, and the
	// atomic's word after the batch.
	Checked       int    `json:"checked,omitempty"`
	TargetChecked int    `json:"target_slots_checked,omitempty"`
	Word          uint64 `json:"word,omitempty"`
}

type benchResult struct {
	Transport string `json:"transport"`
	Operation string `json:"operation,omitempty"` // one-sided modes: RDMA_WRITE, RDMA_READ, ATOMIC_FETCH_AND_ADD
	Size      int    `json:"size"`
	Window    int    `json:"window,omitempty"` // messages in flight at most; 0: four batches
	// SenderSpins: the sender polls without sleeping (--send-spin).
	SenderSpins bool       `json:"sender_spins,omitempty"`
	Mode        string     `json:"mode"` // loopback, or sender/receiver (one-sided: initiator/target) between two hosts
	Latency     string     `json:"latency"`
	Rows        []benchRow `json:"rows"`

	// Whose CPU time the receiver figures are: "process" (getrusage
	// RUSAGE_SELF), in loopback "process, sender included".
	ReceiverCPU string `json:"receiver_cpu,omitempty"`
}

// cmdBench measures the send message rate and latency per batch size: the
// sender posts a batch as one chain (one doorbell), keeps at most a queue's
// worth in flight, and times each message from its post to its send
// completion (for RC: the peer has it).
// benchOpts are bench's flags.
type benchOpts struct {
	t          trafficFlags
	messages   int
	so         sendOpts
	batchList  string
	spin, wait bool
}

// benchFlags declares bench's flags on fs.
func benchFlags(fs *flag.FlagSet) *benchOpts {
	o := &benchOpts{}
	o.t.register(fs, 64)
	fs.BoolVar(&o.spin, "spin", false, "the receiver spins on its CQ in a loop of its own; its CPU time is reported")
	fs.BoolVar(&o.wait, "wait", false, "the receiver sleeps on a wait set (event.WaitSet, kind FD) whenever its CQ is empty, instead of spinning; its CPU time is reported")
	fs.IntVar(&o.messages, "messages", 20000, "messages per batch size")
	fs.StringVar(&o.batchList, "batches", "1,8,32,256", "batch sizes, messages per doorbell (`LIST` of 1 to 256, comma-separated)")
	fs.BoolVar(&o.so.spin, "send-spin", true, "the sender never sleeps on the interrupt while completions are due: it polls, yielding the processor, as perftest does (the default; --events sleeps)")
	fs.IntVar(&o.so.window, "window", 0, "messages in flight at most, whatever the batch, but at least one batch (0: four batches); perftest's ib_send_bw keeps 128 (its -t)")
	o.t.registerOneSided(fs, "one-sided: RDMA WRITE into the other end's buffer (its slots checked after each batch); the other end posts nothing (RC only, not on QEMU)",
		"one-sided: fetch-and-add of 1 on one 8-byte word of the other end (--size is 8), each value fetched checked, and the word's final value (RC only, not on QEMU)")
	return o
}

func cmdBench(e *env, args []string) error {
	fs := newFlagSet(e, "bench")
	o := benchFlags(fs)
	t := &o.t
	if err := t.parse(e, fs, args); err != nil {
		return err
	}
	messages, batchList, spin, wait, so := o.messages, o.batchList, o.spin, o.wait, o.so
	if err := checkCount("messages", messages, "messages per batch size"); err != nil {
		return err
	}
	if t.events {
		if given(fs, "send-spin") && so.spin {
			return usageErrorf("--send-spin and --events exclude each other")
		}
		so.spin = false
	}
	t.spin = !t.events // the receiver's polls
	if wait {
		if err := t.noPollDoorbell(fs, "--wait"); err != nil {
			return err
		}
	}
	if t.sided != "" && (spin || wait) {
		return usageErrorf("--%s: the target posts nothing: no --spin or --wait", t.sided)
	}
	// Without --spin or --wait, the send bench: in loopback one loop polls
	// both ends, between hosts the receiver polls, and with --events sleeps
	// on CQ.Wait when its polls find nothing.
	recvMode := recvInline
	switch {
	case spin && wait:
		return usageErrorf("--spin and --wait exclude each other")
	case spin:
		recvMode = recvSpin
	case wait:
		recvMode = recvWait
	}
	var batches []int
	for _, f := range strings.Split(batchList, ",") {
		b, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || b < 1 || b > 256 {
			return usageErrorf("--batches %q: %q: want sizes from 1 to 256", batchList, f)
		}
		batches = append(batches, b)
	}
	depth := 512
	if so.window < 0 || so.window > depth {
		return usageErrorf("--window %d: want 1 to %d messages (0: four batches)", so.window, depth)
	}
	d, err := t.openDevice(e)
	if err != nil {
		return err
	}
	defer d.Close()
	ctx, cancel := withTimeout(10 * time.Minute)
	defer cancel()
	a, b, x, err := t.setup(ctx, d, depth, t.size)
	if err != nil {
		return err
	}
	if x != nil {
		defer x.close()
	}
	if t.sided != "" {
		return benchOneSided(ctx, e, t, a, b, x, batches, messages, so)
	}
	typ, _ := t.typ()
	res := benchResult{Transport: typ.String(), Size: t.size, Mode: "loopback", Latency: "post to send completion", Window: so.window, SenderSpins: so.spin}
	switch {
	case x != nil && x.server():
		res.Mode = "receiver"
	case x != nil:
		res.Mode = "sender"
	}
	if recvMode != recvInline {
		switch res.Mode {
		case "loopback":
			res.ReceiverCPU = cpuScopeLoopback
		case "receiver":
			res.ReceiverCPU = cpuScopeProcess
		}
	}
	for _, batch := range batches {
		if x != nil {
			if err := x.barrier(ctx, fmt.Sprintf("bench-%d", batch)); err != nil {
				return err
			}
		}
		var row benchRow
		switch {
		case res.Mode == "receiver":
			var r perf.RecvResult
			r, err = benchReceive(ctx, a, messages, typ, recvWaitOf(recvMode, t))
			row = benchRow{Batch: batch, Messages: r.Got, Seconds: r.Elapsed.Seconds(), MessagesPerSec: perf.Rate(r.Got, r.Elapsed), ReceivesChecked: r.Got}
			if recvMode != recvInline {
				row.addReceiver(recvMode, r)
			}
		case b != nil && recvMode != recvInline:
			// Loopback with the receiver in a goroutine of its own.
			if err = b.fillRecvs(); err != nil {
				break
			}
			type result struct {
				r   perf.RecvResult
				err error
			}
			rch := make(chan result, 1)
			go func() {
				r, err := benchReceive(ctx, b, messages, typ, recvWaitOf(recvMode, t))
				rch <- result{r, err}
			}()
			row, err = benchSend(ctx, a, nil, messages, batch, so)
			rr := <-rch
			if err == nil {
				err = rr.err
			}
			row.addReceiver(recvMode, rr.r)
		default:
			row, err = benchSend(ctx, a, b, messages, batch, so)
		}
		if err != nil {
			return fmt.Errorf("batch %d: %w", batch, err)
		}
		res.Rows = append(res.Rows, row)
	}
	if e.json {
		return e.printJSON(res)
	}
	w := tabwriter.NewWriter(e.out, 0, 4, 2, ' ', tabwriter.AlignRight)
	if res.Mode == "receiver" {
		fmt.Fprintf(e.out, "%s bench receiver, %d-byte messages (the sender reports rates and latency)\n", res.Transport, res.Size)
		if recvMode == recvInline {
			fmt.Fprintf(e.out, "receiver waits: %s\n", t.waitMode())
		}
		if recvMode != recvInline {
			fmt.Fprintf(e.out, "receiver %s; CPU: %s\n", recvMode, cpuScopeNote(res.ReceiverCPU))
			fmt.Fprintln(w, "batch\treceived\tmsg/s\treceiver\tCPU µs/msg\tCPU %\twake-ups/msg\t")
			for _, r := range res.Rows {
				fmt.Fprintf(w, "%d\t%d\t%.0f\t%s\t%.1f\t%.0f\t%.3f\t\n", r.Batch, r.Messages, r.MessagesPerSec, r.Receiver, r.ReceiverCPUUSPerMsg, r.ReceiverCPUPercent, r.WakeupsPerMsg)
			}
			return w.Flush()
		}
		fmt.Fprintln(w, "batch\treceived\tmsg/s\t")
		for _, r := range res.Rows {
			fmt.Fprintf(w, "%d\t%d\t%.0f\t\n", r.Batch, r.Messages, r.MessagesPerSec)
		}
		return w.Flush()
	}
	if recvMode != recvInline && res.Mode == "loopback" {
		fmt.Fprintf(e.out, "%s send bench, %d-byte messages, %s, receiver %s in a goroutine of its own; latency: %s\n", res.Transport, res.Size, res.Mode, recvMode, res.Latency)
		fmt.Fprintf(e.out, "receiver CPU: %s\n", cpuScopeNote(res.ReceiverCPU))
		fmt.Fprintln(w, "batch\tmessages\tmsg/s\tp50 µs\tp99 µs\tdoorbells/msg\trecv msg/s\tCPU µs/msg\tCPU %\twake-ups/msg\t")
		for _, r := range res.Rows {
			fmt.Fprintf(w, "%d\t%d\t%.0f\t%.1f\t%.1f\t%.3f\t%.0f\t%.1f\t%.0f\t%.3f\t\n", r.Batch, r.Messages, r.MessagesPerSec, r.P50US, r.P99US, r.DoorbellsPerMsg, r.ReceiverMsgPerSec, r.ReceiverCPUUSPerMsg, r.ReceiverCPUPercent, r.WakeupsPerMsg)
		}
		return w.Flush()
	}
	inFlight := inFlight(so.window, "messages", "sender", so.spin, ", the sender sleeping on events")
	fmt.Fprintf(e.out, "%s send bench, %d-byte messages, %s, at most %s; latency: %s\n", res.Transport, res.Size, res.Mode, inFlight, res.Latency)
	fmt.Fprintln(w, "batch\tmessages\tmsg/s\tp50 µs\tp99 µs\tdoorbells/msg\tpost µs/msg\tpoll µs/msg\twait µs/msg\t")
	for _, r := range res.Rows {
		fmt.Fprintf(w, "%d\t%d\t%.0f\t%.1f\t%.1f\t%.3f\t%.2f\t%.2f\t%.2f\t\n", r.Batch, r.Messages, r.MessagesPerSec, r.P50US, r.P99US, r.DoorbellsPerMsg, r.PostUSPerMsg, r.PollUSPerMsg, r.WaitUSPerMsg)
	}
	return w.Flush()
}

// inFlight says what a bench keeps in flight: window requests (what
// counts them: unit), or four batches; then whether who spins, or else
// what sleeping says.
func inFlight(window int, unit, who string, spins bool, sleeping string) string {
	s := "4 batches"
	if window > 0 {
		s = fmt.Sprintf("%d %s", window, unit)
	}
	s += " in flight"
	if spins {
		return s + ", the " + who + " spinning"
	}
	return s + sleeping
}

// sendOpts are benchSend's choices beyond the batch.
type sendOpts struct {
	// window: messages in flight at most; 0 means four batches (see
	// perf.Send.Window).
	window int
	// spin: never sleep on the interrupt; poll and yield instead.
	spin bool
	// remote, if set, makes the requests its one-sided operation
	// (onesided.go) and checks their completions.
	remote *remoteOp
}

// benchSend sends messages from a (perf.Send); b, in loopback, receives
// them in the same loop (reposting its receives). Between hosts the peer
// runs benchReceive.
func benchSend(ctx context.Context, a, b *endpoint, messages, batch int, so sendOpts) (benchRow, error) {
	size := a.slot
	if a.qp.Type() == vfrdma.UD {
		size -= vfrdma.UDHeaderRoom
	}
	if a.msgSize > 0 {
		size = a.msgSize
	}
	s := perf.Send{QP: a.qp, CQ: a.cq, Messages: messages, Batch: batch, Window: so.window, Depth: a.depth, Wait: perf.Sleep,
		Fill: func(wr *vfrdma.SendWR, sge []vfrdma.SGE, seq int) {
			// Receive slots (loopback) follow the queue, not the window.
			a.sendWR(wr, sge, uint64(seq), seq%a.depth, size)
			if so.remote != nil {
				so.remote.fill(wr, seq)
			}
		}}
	if so.spin {
		s.Wait = perf.Spin
	}
	if so.remote != nil {
		s.Done = so.remote.done
	}
	if b != nil {
		if err := b.fillRecvs(); err != nil {
			return benchRow{}, err
		}
		s.RecvCQ, s.Repost, s.AllReceived = b.cq, b.repost, a.qp.Type() == vfrdma.RC
	}
	r, err := s.Run(ctx)
	if err != nil {
		return benchRow{}, err
	}
	row := benchRow{Batch: batch, Messages: messages, Seconds: r.Elapsed.Seconds(), MessagesPerSec: perf.Rate(messages, r.Elapsed),
		P50US: perf.US(perf.Quantile(r.Latency, 0.5)), P99US: perf.US(perf.Quantile(r.Latency, 0.99)), Doorbells: r.Doorbells}
	row.DoorbellsPerMsg = float64(row.Doorbells) / float64(messages)
	row.PostUSPerMsg = perf.PerMessage(r.InPost, messages)
	row.PollUSPerMsg = perf.PerMessage(r.InPoll, messages)
	row.WaitUSPerMsg = perf.PerMessage(r.InWait, messages)
	if b != nil {
		row.ReceivesChecked = r.Received
	}
	return row, nil
}

// benchReceive keeps receives posted on a and counts messages until it
// has them all or the sender goes quiet (UD may drop: it stops with what
// it got), waiting as wait says (perf.Receive).
func benchReceive(ctx context.Context, a *endpoint, messages int, typ vfrdma.QPType, wait perf.Wait) (perf.RecvResult, error) {
	if err := a.fillRecvs(); err != nil {
		return perf.RecvResult{}, err
	}
	r := perf.Receive{CQ: a.cq, Messages: messages, Wait: wait, MayDrop: typ == vfrdma.UD, Repost: a.repost}
	return r.Run(ctx)
}

// fillRecvs posts a receive in every slot, once: every completed receive
// is reposted into its slot, so between rounds all slots stay posted.
func (e *endpoint) fillRecvs() error {
	if _, recv := e.qp.Outstanding(); recv > 0 {
		return nil
	}
	for s := 0; s < e.depth; s++ {
		if err := e.postRecv(s); err != nil {
			return err
		}
	}
	return nil
}
