//go:build !guest

package am_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/am"
)

// amBig is where every active message's data comes from: message seq of
// n bytes is amBig[seq%251:][:n], so bytes that land in the wrong message
// or at the wrong offset show.
var amBig = func() []byte {
	r := rand.New(rand.NewPCG(7, 11))
	b := make([]byte, 24<<10+251)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}()

func amData(seq uint64, n int) []byte { o := int(seq % 251); return amBig[o : o+n] }

// amKey names a message: origin, target and the origin's sequence number.
type amKey struct {
	src, dst int
	seq      uint64
}

// amMsg is a message Amsend took, with its own completion counter.
type amMsg struct {
	key  amKey
	cmpl *am.Counter
}

// amJob is one job's ledger.
type amJob struct {
	s  *soak
	cs []*am.Context

	mu      sync.Mutex
	sent    [][]*amMsg    // by origin
	arrived map[amKey]int // header handler runs
	landed  map[amKey]int // data in and checked (completion handler, or consumed in the header handler)
	seq     []uint64      // by origin
}

// amWorker runs jobs of one task per device, one after the other, until
// ctx ends.
func (s *soak) amWorker(ctx context.Context, rng *rand.Rand) {
	for ctx.Err() == nil {
		ds, ok := acquire(s.nodes...)
		if !ok {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		s.amJob(ctx, rng, ds)
		release(s.nodes...)
	}
}

// A job's tasks (one per device), packet size and credits: small packets,
// so that messages go in many fragments.
const (
	amTasks   = 3
	amPacket  = 2048
	amCredits = 8
)

// amSpins are the tasks' Config.Spin: one sleeps at once, one spins the
// device's default, one a little.
var amSpins = []time.Duration{-1, 0, 50 * time.Microsecond}

// amJob makes a job, runs traffic for 0.5-2.5 s (less if a node dies),
// fences, closes and checks it.
func (s *soak) amJob(ctx context.Context, rng *rand.Rand, ds []*vfrdma.Device) {
	n := len(ds)
	j := &amJob{s: s, cs: make([]*am.Context, n), sent: make([][]*amMsg, n), arrived: map[amKey]int{},
		landed: map[amKey]int{}, seq: make([]uint64, n)}
	if !j.start(ds) {
		return
	}
	s.counts.jobs.Add(1)
	stop := make(chan struct{})
	var senders sync.WaitGroup
	for i := range n {
		for k := range 2 {
			r := rand.New(rand.NewPCG(rng.Uint64(), uint64(i<<4|k)))
			senders.Go(func() { j.sender(i, r, stop) })
		}
	}
	t := time.NewTimer(time.Duration(500+rng.IntN(2000)) * time.Millisecond)
	tick := time.NewTicker(5 * time.Millisecond)
wait:
	for {
		select {
		case <-t.C:
			break wait
		case <-ctx.Done():
			break wait
		case <-tick.C:
			if anyDead(s.nodes...) {
				break wait
			}
		}
	}
	t.Stop()
	tick.Stop()
	close(stop)
	senders.Wait()
	j.finish()
}

// start makes every task's context; if one fails (a command fault, a
// dead device) the others stop waiting for it and every one made is
// closed.
func (j *amJob) start(ds []*vfrdma.Device) bool {
	n := len(ds)
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	xs := am.LocalExchangers(n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			j.cs[i], errs[i] = am.New(ctx, ds[i], am.Config{Tasks: n, Self: i, Exchange: xs[i],
				PacketSize: amPacket, Credits: amCredits, Spin: amSpins[i%len(amSpins)]})
			if errs[i] != nil {
				cancel() // the others wait for this one's address
			}
		})
	}
	wg.Wait()
	var first error
	for i, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) && first == nil {
			first = err
			// A QP fatal on one of its QPs in set-up: the driver refuses
			// the next transition if it saw the event, the device if not.
			if j.s.nodes[i].qpFatals.Load() > 0 && (errors.Is(err, vfrdma.ErrQPState) || errors.Is(err, syscall.EINVAL)) {
				addTo(&j.s.counts.cmdRefused, "QP failed in set-up", 1)
				first = nil
			}
		}
		if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			j.s.hang("am: task %d's New: %v", i, err)
		}
	}
	if first == nil && errors.Join(errs...) == nil {
		for i, c := range j.cs {
			// Refused only by a context that failed already (a fault
			// just after New): its Fence says so.
			_ = c.SetHandler(1, j.handler(i))
		}
		return true
	}
	j.s.counts.jobsRefused.Add(1)
	for i, err := range errs {
		if err != nil && len(refusedDestroys(err)) > 0 {
			j.keptBy(i, err)
			j.s.nodes[i].amKept.Store(true)
		}
	}
	if first != nil {
		if cause := j.s.refused(first); cause == "other" {
			j.s.errorf("am", "New: %v", first)
		}
	}
	for i, c := range j.cs {
		if c != nil {
			j.closeCtx(i)
		}
	}
	return false
}

// handler is task dst's header handler: it checks the user header,
// counts the arrival, and either consumes a one-packet message in the
// call or hands a buffer whose completion handler (inline or not) checks
// the bytes.
func (j *amJob) handler(dst int) am.HeaderHandler {
	return func(a *am.Arrival) am.Return {
		if len(a.UHdr) != 16 || int(binary.LittleEndian.Uint64(a.UHdr)) != a.Src {
			j.s.errorf("am data", "task %d: a user header %x from task %d", dst, a.UHdr, a.Src)
			return am.Return{Buf: make([]byte, a.Len)}
		}
		key := amKey{a.Src, dst, binary.LittleEndian.Uint64(a.UHdr[8:])}
		j.mu.Lock()
		j.arrived[key]++
		k := j.arrived[key]
		j.mu.Unlock()
		if k > 1 {
			j.s.errorf("am duplicate", "message %+v arrived %d times", key, k)
		}
		if a.Data != nil && key.seq%3 == 0 {
			j.land(key, a.Data)
			return am.Return{}
		}
		buf := make([]byte, a.Len)
		return am.Return{Buf: buf, Inline: key.seq%2 == 0, Completion: func() { j.land(key, buf) }}
	}
}

// land checks a message's bytes and counts it delivered at its target.
func (j *amJob) land(key amKey, b []byte) {
	if want := amData(key.seq, len(b)); !bytes.Equal(b, want) {
		j.s.errorf("am data", "message %+v of %d bytes landed with bytes that are not the origin's", key, len(b))
	}
	j.mu.Lock()
	j.landed[key]++
	k := j.landed[key]
	j.mu.Unlock()
	if k > 1 {
		j.s.errorf("am duplicate", "message %+v landed %d times", key, k)
	}
}

// amSize picks a message's length: empty, short, a packet exactly or
// one byte over, a few packets, many.
func amSize(rng *rand.Rand, one int) int {
	switch r := rng.IntN(100); {
	case r < 5:
		return 0
	case r < 45:
		return 1 + rng.IntN(64)
	case r < 50:
		return one
	case r < 55:
		return one + 1
	case r < 90:
		return 100 + rng.IntN(6000)
	default:
		return 6000 + rng.IntN(18000)
	}
}

// sender sends from task i to random tasks (itself included) until told
// to stop or its context fails, keeping at most 48 messages of the task
// unfinished.
func (j *amJob) sender(i int, rng *rand.Rand, stop chan struct{}) {
	c := j.cs[i]
	one := c.OnePacket(16)
	for {
		select {
		case <-stop:
			return
		default:
		}
		if st := c.Stats(); st.Sent-st.Delivered-st.Failed >= 48 {
			time.Sleep(200 * time.Microsecond)
			continue
		}
		tgt := rng.IntN(len(j.cs))
		j.mu.Lock()
		seq := j.seq[i]
		j.seq[i]++
		j.mu.Unlock()
		uh := make([]byte, 16)
		binary.LittleEndian.PutUint64(uh, uint64(i))
		binary.LittleEndian.PutUint64(uh[8:], seq)
		m := &amMsg{key: amKey{i, tgt, seq}, cmpl: am.NewCounter()}
		// Recorded before Amsend: the message may land before it returns.
		j.mu.Lock()
		j.sent[i] = append(j.sent[i], m)
		j.mu.Unlock()
		err := c.Amsend(tgt, 1, uh, amData(seq, amSize(rng, one)), am.Counters{Cmpl: m.cmpl})
		if err == nil {
			continue
		}
		j.mu.Lock()
		j.sent[i] = removeMsg(j.sent[i], m)
		j.mu.Unlock()
		switch {
		case errors.Is(err, am.ErrPurged):
			time.Sleep(time.Millisecond) // the others may still be there
		case errors.Is(err, am.ErrDataLen), errors.Is(err, am.ErrUHdrLen), errors.Is(err, am.ErrNoHandler),
			errors.Is(err, am.ErrTarget), errors.Is(err, am.ErrCounter):
			j.s.errorf("am", "task %d: Amsend to %d refused good arguments: %v", i, tgt, err)
			return
		default:
			return // the context failed: Fence says why
		}
	}
}

func removeMsg(ms []*amMsg, m *amMsg) []*amMsg {
	for k := len(ms) - 1; k >= 0; k-- {
		if ms[k] == m {
			return append(ms[:k], ms[k+1:]...)
		}
	}
	return ms
}

// isDead reports whether a call's error says the context failed (its
// progress stopped: the CQ overran, the device died or closed), rather
// than a task purged or a message dropped.
func (j *amJob) isDead(err error) bool {
	return err != nil && !errors.Is(err, am.ErrPurged) && !errors.Is(err, am.ErrDropped)
}

// finish fences every task; a context that failed is closed at once, so
// that its peers' messages to it fail rather than wait. Then it checks
// the ledger and closes the rest.
func (j *amJob) finish() {
	s := j.s
	n := len(j.cs)
	fenced := make([]error, n)
	closed := make([]bool, n)
	var wg sync.WaitGroup
	for i, c := range j.cs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
			defer cancel()
			fenced[i] = c.Fence(ctx)
			if ctx.Err() != nil {
				s.hang("am: task %d's Fence: %v; stats %+v", i, fenced[i], c.Stats())
			}
			if j.isDead(fenced[i]) {
				s.counts.amDead.Add(1)
				j.closeCtx(i)
				closed[i] = true
			}
		})
	}
	wg.Wait()
	for i := range j.cs {
		if errors.Is(fenced[i], am.ErrPurged) {
			s.counts.amPurged.Add(1)
		}
		if errors.Is(fenced[i], am.ErrDropped) {
			s.errorf("am", "task %d: Fence reports a message dropped, though every handler takes every message: %v", i, fenced[i])
		}
		if !closed[i] {
			j.closeCtx(i)
		}
	}
	j.verify()
}

// closeCtx closes task i's context, before its device (am's order), even
// after DEVICE_FATAL. Under a command fault, or on a dead device, its
// destroys may be refused: Close is retried between rounds, once faults
// are cleared or the device closed.
func (j *amJob) closeCtx(i int) {
	n, c := j.s.nodes[i], j.cs[i]
	if err := c.Close(); err != nil {
		j.keptBy(i, err)
		n.lmu.Lock()
		n.amRetry = append(n.amRetry, c)
		n.lmu.Unlock()
	}
}

// keptBy checks what the device refused to destroy when task i's context
// was closed or New undid it (the faults the soak injects, and nothing
// else), and counts the MRs among it, whose packet memory stays locked
// until a retried Close or the device's Close frees it.
func (j *amJob) keptBy(i int, err error) {
	s := j.s
	ops := refusedDestroys(err)
	if len(ops) == 0 {
		s.errorf("am", "task %d: Close: %v", i, err)
		return
	}
	for _, e := range refusedDestroyErrs(err) {
		if cause := classify(e); cause == "other" && !errors.Is(e, vfrdma.ErrBusy) {
			s.errorf("am", "task %d: a destroy refused for no fault the soak injected: %v", i, e)
		}
	}
	for _, op := range ops {
		if op == "deregister MR" {
			s.counts.amKeptMRs.Add(1)
		}
	}
}

// refusedDestroys lists the destroys (vfrdma.OpError.Op) an error joins.
func refusedDestroys(err error) []string {
	var out []string
	for _, e := range refusedDestroyErrs(err) {
		out = append(out, e.Op)
	}
	return out
}

// refusedDestroyErrs returns the destroys' errors an error joins.
func refusedDestroyErrs(err error) []*vfrdma.OpError {
	var out []*vfrdma.OpError
	var walk func(error)
	walk = func(e error) {
		if e == nil {
			return
		}
		if oe, ok := e.(*vfrdma.OpError); ok && (strings.HasPrefix(oe.Op, "destroy") || strings.HasPrefix(oe.Op, "deregister")) {
			out = append(out, oe)
			return
		}
		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	return out
}

// verify checks each task's messages: each delivered once (its counter
// at 1, landed once) or reported failed (its counter at 0, landed at most
// once), and the context's counts agree.
func (j *amJob) verify() {
	s := j.s
	j.mu.Lock()
	defer j.mu.Unlock()
	sent := map[amKey]bool{}
	for i, c := range j.cs {
		st := c.Stats()
		var delivered, failed uint64
		for _, m := range j.sent[i] {
			sent[m.key] = true
			switch v := m.cmpl.Get(); v {
			case 1:
				delivered++
				if j.landed[m.key] != 1 {
					s.errorf("am lost", "message %+v was acknowledged; it landed %d times", m.key, j.landed[m.key])
				}
			case 0:
				failed++
			default:
				s.errorf("am duplicate", "message %+v's completion counter is %d", m.key, v)
			}
		}
		if st.Sent != uint64(len(j.sent[i])) || st.Delivered != delivered || st.Failed != failed {
			s.errorf("am count", "task %d: Amsend took %d messages, %d counted delivered and %d not; the context says sent %d, delivered %d, failed %d",
				i, len(j.sent[i]), delivered, failed, st.Sent, st.Delivered, st.Failed)
		}
		if st.Refused != 0 {
			s.errorf("am", "task %d refused %d tasks' packets or completions: %+v", i, st.Refused, st)
		}
		s.counts.amSent.Add(int64(st.Sent))
		s.counts.amDelivered.Add(int64(delivered))
		s.counts.amFailed.Add(int64(failed))
	}
	for key := range j.landed {
		if !sent[key] {
			s.errorf("am data", "message %+v landed; Amsend never took it", key)
		}
	}
}
