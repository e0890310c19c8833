package perf

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/vfrdma/vfrdma"
)

// Send is the windowed sender: it posts Messages requests on QP in
// batches, each batch one chain (one doorbell), while fewer than Window
// are in flight, as perftest posts up to its tx depth before it polls; it
// times each request from its post to its completion on CQ.
type Send struct {
	QP *vfrdma.QP
	CQ *vfrdma.CQ // QP's send CQ
	// Messages is how many requests to send; Batch how many each
	// doorbell posts (1 or more).
	Messages, Batch int
	// Window is how many requests may be in flight, at least a batch;
	// 0 means four batches: enough to keep the device busy, few enough
	// that the latency is the device's and not the queue's. Depth (the
	// send queue's) bounds it.
	Window, Depth int
	// Wait is how the sender waits while nothing completes: Spin, or
	// Sleep (CQ.Wait, as the CQ's options say).
	Wait Wait
	// Quiet ends the run with an error once nothing completed for that
	// long (default DefaultSendQuiet).
	Quiet time.Duration
	// Fill makes wr request seq, with sge (one element, the loop's) as
	// its SGE list; the loop sets wr.WRID to seq after it.
	Fill func(wr *vfrdma.SendWR, sge []vfrdma.SGE, seq int)
	// Done, if set, checks the successful completion of request
	// wc.WRID.
	Done func(wc *vfrdma.WC) error
	// RecvCQ, in loopback, is the receiving end's CQ, which the same loop
	// polls, handing its completions to Repost; with AllReceived the run
	// lasts until every message was received too (RC: none is lost).
	RecvCQ      *vfrdma.CQ
	Repost      func(wcs []vfrdma.WC) error
	AllReceived bool
}

// DefaultSendQuiet is how long Send waits for a completion before it
// fails.
const DefaultSendQuiet = 2 * time.Second

// SendResult is what the sender measured.
type SendResult struct {
	Elapsed time.Duration
	// Latency holds each request's time from its post to its completion,
	// in completion order (Quantile sorts it).
	Latency []time.Duration
	// Doorbells is the send doorbells QP rang (QP.DoorbellStats).
	Doorbells uint64
	// Where the sender's time went: inside PostSend (the doorbell's exit
	// included), inside CQ.Poll (a POLL doorbell's exit included), asleep
	// in CQ.Wait; the rest is the loop's own.
	InPost, InPoll, InWait time.Duration
	Received               int // loopback: the receives RecvCQ completed
}

// Run runs the sender until every request completed (and, with
// AllReceived, was received), a completion fails, the run goes quiet, or
// ctx ends. The loop allocates nothing: what it keeps is made before it
// starts.
func (s *Send) Run(ctx context.Context) (SendResult, error) {
	batch := max(s.Batch, 1)
	window := s.Window
	if window <= 0 {
		window = 4 * batch
	}
	depth := max(window, batch) // a batch is one chain
	if s.Depth > 0 {
		depth = min(depth, s.Depth)
	}
	quiet := s.Quiet
	if quiet <= 0 {
		quiet = DefaultSendQuiet
	}
	wrs := make([]vfrdma.SendWR, batch)
	sges := make([]vfrdma.SGE, batch)
	postedAt := make([]time.Time, s.Messages)
	res := SendResult{Latency: make([]time.Duration, 0, s.Messages)}
	wcs := make([]vfrdma.WC, 64)
	var progress atomic.Int64
	qctx, stop := WatchQuiet(ctx, &progress, quiet)
	defer stop()
	before, _ := s.QP.DoorbellStats()
	sent, done, idle := 0, 0, 0
	start := time.Now()
	for done < s.Messages || s.RecvCQ != nil && s.AllReceived && res.Received < s.Messages {
		// Post batches while the window has room for one.
		for {
			n := min(batch, s.Messages-sent, depth-(sent-done))
			if n <= 0 || (n != batch && sent+n != s.Messages) {
				break
			}
			now := time.Now()
			for i := range n {
				s.Fill(&wrs[i], sges[i:i+1], sent+i)
				wrs[i].WRID = uint64(sent + i)
				postedAt[sent+i] = now
			}
			_, err := s.QP.PostSend(wrs[:n], 0)
			res.InPost += time.Since(now)
			if err != nil {
				return res, err
			}
			sent += n
		}
		t0 := time.Now()
		k, err := s.CQ.Poll(wcs)
		now := time.Now()
		res.InPoll += now.Sub(t0)
		if err != nil {
			return res, err
		}
		for i := range wcs[:k] {
			wc := &wcs[i]
			if wc.Status != vfrdma.WCSuccess {
				return res, fmt.Errorf("send completion %+v", *wc)
			}
			if s.Done != nil {
				if err := s.Done(wc); err != nil {
					return res, err
				}
			}
			res.Latency = append(res.Latency, now.Sub(postedAt[wc.WRID]))
		}
		done += k
		moved := k
		if s.RecvCQ != nil {
			k, err := s.RecvCQ.Poll(wcs)
			if err != nil {
				return res, err
			}
			for _, wc := range wcs[:k] {
				if wc.Status != vfrdma.WCSuccess {
					return res, fmt.Errorf("receive completion %+v", wc)
				}
			}
			if k > 0 && s.Repost != nil {
				if err := s.Repost(wcs[:k]); err != nil {
					return res, err
				}
			}
			res.Received += k
			moved += k
		}
		if moved > 0 {
			idle = 0
			progress.Store(int64(done + res.Received))
			continue
		}
		if err := s.idle(qctx, &idle, done == s.Messages, &res); err != nil {
			switch {
			case !Quiet(qctx) || ctx.Err() != nil:
				return res, err
			case done < s.Messages:
				return res, fmt.Errorf("no send completion for %v (%d of %d done)", quiet, done, s.Messages)
			}
			return res, fmt.Errorf("received %d of %d, then nothing for %v", res.Received, s.Messages, quiet)
		}
	}
	res.Elapsed = time.Since(start)
	after, _ := s.QP.DoorbellStats()
	res.Doorbells = after.Doorbells - before.Doorbells
	return res, nil
}

// idle waits after a round that found nothing, as s.Wait says: on the send
// CQ, or once every send completed on the receiving end's.
func (s *Send) idle(ctx context.Context, idle *int, sendsDone bool, res *SendResult) error {
	if s.Wait == Spin {
		if *idle++; *idle%spinCheck == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		runtime.Gosched()
		return nil
	}
	cq := s.CQ
	if sendsDone {
		cq = s.RecvCQ
	}
	t0 := time.Now()
	err := cq.Wait(ctx)
	res.InWait += time.Since(t0)
	return err
}
