//go:build !guest

package vfrdma

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/event"
	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/mmio"
	"github.com/vfrdma/vfrdma/rings"
)

// eventDevice is a fake device that behaves as QEMU 7.2 does for
// completions: it takes posted sends, writes a CQE for each, then an entry
// in the CQ-notification ring (for every CQE, armed or not; none once the
// ring is full), and raises the CQ interrupt when the CQ was armed, which
// disarms it. It sees arm doorbells through the UAR.
type eventDevice struct {
	d      *Device
	cqs    []*CQ
	qps    []*QP
	cqProd []*rings.Producer
	sqCons []*rings.Consumer
	mr     *MR

	nState *mmio.Region   // notification ring state, written as the device does
	nData  []*mmio.Region // its pages
	nSlots uint32

	mu    sync.Mutex
	armed map[uint32]bool
	irq   chan struct{}

	interrupts, fullSkips atomic.Uint64
}

// Store32 is the UAR: the device notes arm doorbells.
func (f *eventDevice) Store32(off int, v uint32) error {
	if off == doorbell.OffsetCQ && v&(doorbell.CQArm|doorbell.CQArmSol) == doorbell.CQArm|doorbell.CQArmSol {
		f.mu.Lock()
		f.armed[v&doorbell.HandleMask] = true
		f.mu.Unlock()
	}
	return nil
}

// Wait is the CQ vector.
func (f *eventDevice) Wait(ctx context.Context) (uint64, error) {
	select {
	case <-f.irq:
		return 1, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func newEventDevice(t testing.TB, ncq, depth int) *eventDevice {
	t.Helper()
	f := &eventDevice{armed: map[uint32]bool{}, irq: make(chan struct{}, 1)}
	d := &Device{name: "fake", opt: (&Options{StateDir: "-"}).withDefaults(), uar: f, emulated: true, udMax: 4096,
		pds: map[*PD]struct{}{}, cqs: map[*CQ]struct{}{}, mrs: map[*MR]struct{}{}, qps: map[*QP]struct{}{}, srqs: map[*SRQ]struct{}{}, binds: map[uint32]GID{},
		cqArm: [2]uint32{doorbell.CQArm | doorbell.CQArmSol, doorbell.CQArm | doorbell.CQArmSol}, cqIRQ: f}
	d.gidSet.set(0, true)
	d.notify.d = d
	f.d = d
	t.Cleanup(d.notify.stop)

	// The notification ring: 2 pages, 2048 slots, so that it fills.
	state := make([]byte, firmware.PageSize)
	var err error
	f.nState, err = mmio.New(state)
	require.NoError(t, err)
	var pages [][]byte
	for range 2 {
		p := make([]byte, firmware.PageSize)
		pages = append(pages, p)
		r, err := mmio.New(p)
		require.NoError(t, err)
		f.nData = append(f.nData, r)
	}
	d.cqNotify, err = firmware.NewCQNotifyRing(f.nState, pages)
	require.NoError(t, err)
	f.nSlots = uint32(d.cqNotify.Slots())

	pd := &PD{d: d, handle: 1}
	f.mr = &MR{pd: pd, handle: 3, lkey: 0x77, access: AccessLocalWrite, addr: 0x100000, mem: make([]byte, 1<<16)}
	require.NoError(t, d.addMR(f.mr))
	for i := 0; i < ncq; i++ {
		cqState := make([]byte, 16)
		st, _ := rings.NewState(cqState[8:16])
		n := 2 * depth
		cons, err := rings.NewConsumer(st, n)
		require.NoError(t, err)
		prod, _ := rings.NewProducer(st, n)
		cq := newCQ(d, uint32(10+i), n, nil, st, cons, make([]byte, n*CQESize))
		d.notify.add(cq)
		f.cqs = append(f.cqs, cq)
		f.cqProd = append(f.cqProd, prod)
	}
	return f
}

// addQP makes an RTS QP whose sends and receives complete on cqs[i].
func (f *eventDevice) addQP(t testing.TB, i, depth int, sendCntr *event.Counter) *QP {
	t.Helper()
	qpState := make([]byte, 16)
	qpn := uint32(0x100 + i)
	qp := &QP{pd: &PD{d: f.d, handle: 1}, d: f.d, typ: RC, qpn: qpn, handle: qpn, sendCQ: f.cqs[i], recvCQ: f.cqs[i], udMax: 4096, sendCntr: sendCntr}
	require.NoError(t, qp.initQueue(&qp.sq, qpState[0:8], make([]byte, depth*rings.SendStride(1)), rings.SendStride(1), depth, 1, doorbell.QPSend))
	require.NoError(t, qp.initQueue(&qp.rq, qpState[8:16], make([]byte, depth*rings.RecvStride(1)), rings.RecvStride(1), depth, 1, doorbell.QPRecv))
	qp.state.Store(uint32(StateRTS))
	require.NoError(t, f.d.addQP(context.Background(), qp))
	st, _ := rings.NewState(qpState[0:8])
	cons, _ := rings.NewConsumer(st, depth)
	f.qps = append(f.qps, qp)
	f.sqCons = append(f.sqCons, cons)
	return qp
}

// complete does the device's work for QP i: a CQE per published send, then
// per CQE a notification entry and, if the CQ is armed, an interrupt. It
// returns how many it completed.
func (f *eventDevice) complete(i int) int {
	c, qp, cq, prod := f.sqCons[i], f.qps[i], f.cqs[i], f.cqProd[i]
	ready, err := c.Ready()
	if err != nil {
		panic(err)
	}
	var e rings.CQE
	for k := 0; k < ready; k++ {
		slot := qp.sq.Slot(c.Slot(k))
		e = rings.CQE{WRID: binary.LittleEndian.Uint64(slot), QP: uint64(qp.qpn)}
		rings.PutCQE(cq.data[prod.Next(0)*CQESize:], &e)
		prod.Advance(1)
		prod.Publish()
		f.notify(cq.handle)
	}
	c.Consume(ready)
	return ready
}

// notify writes the CQ's handle into the notification ring unless it is
// full (then, as QEMU does, neither the entry nor the interrupt), and
// interrupts if the CQ is armed.
func (f *eventDevice) notify(h uint32) {
	tail, _ := f.nState.Load32(8)
	head, _ := f.nState.Load32(12)
	mask := 2*f.nSlots - 1
	if (tail-head)&mask >= f.nSlots {
		f.fullSkips.Add(1)
		return
	}
	off := (tail & (f.nSlots - 1)) * 4
	_ = f.nData[off/firmware.PageSize].Store32(int(off%firmware.PageSize), h)
	_ = f.nState.Store32(8, (tail+1)&mask)
	f.mu.Lock()
	armed := f.armed[h]
	f.armed[h] = false
	f.mu.Unlock()
	if armed {
		f.interrupts.Add(1)
		select {
		case f.irq <- struct{}{}:
		default:
		}
	}
}

// explain names the CQs that hold completions, with the arm state as the
// driver and the device see it, and what waits in the notification ring.
func (f *eventDevice) explain() string {
	s := ""
	for i, cq := range f.cqs {
		if n, _ := cq.cons.Ready(); n > 0 {
			f.mu.Lock()
			dev := f.armed[cq.handle]
			f.mu.Unlock()
			s += fmt.Sprintf("CQ #%d (handle %d) holds %d, driver armed %v, device armed %v, watchers %d; ", i, cq.handle, n, cq.armed.Load(), dev, cq.watchers.Len())
		}
	}
	k, _ := f.d.cqNotify.Pending()
	s += fmt.Sprintf("%d notifications pending, %d interrupts pending", k, len(f.irq))
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "notifier") {
			s += "\n" + g
		}
	}
	return s
}

var trywaitTotal = flag.Int("trywait.total", 0, "completions TestTryWaitThenSleepNeverLosesAWakeUp produces (0: a million, a tenth under -race or -short)")

// Rule 4 (trywait) and rule 3, also under the race detector: a million
// completions (a tenth under -race or -short; -trywait.total N) over 64 CQs, 48 polled by the consumer and 16 driven by four
// counters, produced in random bursts by a fake device that interrupts
// only armed CQs. The consumer finds work through a poll set, and sleeps
// only in epoll on the wait set's fd after TryWait succeeds. Not one
// wake-up may be lost (a sleep with work outstanding hangs the test until
// its bound), every completion is seen once and in order, and the poll set
// never leaves out a CQ that holds completions (which would make TryWait
// say ErrAgain forever).
func TestTryWaitThenSleepNeverLosesAWakeUp(t *testing.T) {
	const (
		ncq      = 64
		direct   = 48 // CQs the consumer polls; the rest are counter-driven
		ncounter = 4
		depth    = 32
	)
	total := 1_000_000
	if testing.Short() || raceOn {
		total = 100_000
	}
	if *trywaitTotal > 0 {
		total = *trywaitTotal
	}
	f := newEventDevice(t, ncq, depth)
	counters := make([]*event.Counter, ncounter)
	for k := range counters {
		counters[k] = event.NewCounter()
	}
	for i := 0; i < ncq; i++ {
		var c *event.Counter
		if i >= direct {
			c = counters[(i-direct)%ncounter]
		}
		f.addQP(t, i, depth, c)
		if c != nil {
			require.NoError(t, f.cqs[i].SetMode(CQCounted))
			require.NoError(t, c.Drive(f.cqs[i].Source()))
		}
	}
	ws, err := event.NewWaitSet(event.FD)
	require.NoError(t, err)
	ps := event.NewPollSet[int]()
	ps.SetIdleAfter(4)
	for i := 0; i < direct; i++ {
		require.NoError(t, ws.Add(f.cqs[i].Source()))
		require.NoError(t, ps.Add(f.cqs[i].Source(), i))
	}
	for k, c := range counters {
		require.NoError(t, ws.Add(c))
		require.NoError(t, ps.Add(c, ncq+k))
	}
	fd, err := ws.FD()
	require.NoError(t, err)
	defer unix.Close(fd) // the caller's own dup

	// The producer posts bursts on random QPs and completes them as the
	// device would, pausing now and then so that the consumer sleeps.
	var produced atomic.Int64
	var asleep atomic.Bool // the consumer is in (or entering) epoll
	var taken atomic.Int64 // what the consumer has seen
	stop := make(chan struct{})
	perr := make(chan error, 1)
	go func() {
		rng := rand.New(rand.NewPCG(1, 2))
		wrs := make([]SendWR, 8)
		sge := []SGE{f.mr.SGE(0, 64)}
		next := make([]uint64, ncq)
		for n := 0; n < total; {
			select {
			case <-stop:
				perr <- nil
				return
			default:
			}
			i := rng.IntN(ncq)
			qp := f.qps[i]
			k := min(1+rng.IntN(8), total-n, depth-qp.sq.Outstanding())
			if k <= 0 {
				runtime.Gosched()
				continue
			}
			for j := range wrs[:k] {
				wrs[j] = SendWR{WRID: next[i] + uint64(j), SGEs: sge}
			}
			if _, err := qp.PostSend(wrs[:k], 0); err != nil {
				perr <- err
				return
			}
			next[i] += uint64(k)
			n += f.complete(i)
			produced.Store(int64(n))
			if rng.IntN(8) == 0 {
				// A lull: the consumer must take everything by itself (a
				// completion it slept through stays untaken), and the next
				// burst lands at a random point of its TryWait or sleep.
				deadline := time.Now().Add(20 * time.Second)
				for taken.Load() < int64(n) {
					if time.Now().After(deadline) {
						perr <- fmt.Errorf("lost wake-up: %d completions produced, %d taken after 20 s of quiet (consumer asleep: %v)", n, taken.Load(), asleep.Load())
						return
					}
					runtime.Gosched()
				}
				if rng.IntN(2) == 0 {
					for y := 0; y < 10_000 && !asleep.Load(); y++ {
						runtime.Gosched()
					}
				} else {
					for range rng.IntN(40) {
						runtime.Gosched()
					}
				}
			}
		}
		perr <- nil
	}()
	defer close(stop)

	// The consumer.
	wcs := make([]WC, 32)
	ready := make([]int, 16)
	want := make([]uint64, ncq)
	consumed, sleeps, tries, again, idleAgain := 0, 0, 0, 0, 0
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	counted := func() int {
		s := 0
		for _, c := range counters {
			s += int(c.Value())
		}
		return s
	}
	for consumed+counted() < total {
		n, err := ps.Poll(ready)
		require.NoError(t, err)
		for _, c := range ready[:n] {
			if c >= ncq {
				_, err := counters[c-ncq].Read()
				require.NoError(t, err)
				continue
			}
			m, err := f.cqs[c].Poll(wcs)
			require.NoError(t, err)
			for _, wc := range wcs[:m] {
				if wc.WRID != want[c] {
					require.Equal(t, want[c], wc.WRID, "CQ #%d: completion order", c)
				}
				want[c]++
			}
			consumed += m
		}
		taken.Store(int64(consumed + counted()))
		if n > 0 {
			idleAgain = 0
			continue
		}
		tries++
		switch err := ws.TryWait(); {
		case errors.Is(err, event.ErrAgain):
			again++
			if idleAgain++; idleAgain > 100_000 {
				t.Fatalf("TryWait says events are pending but the poll set names none: a false negative (consumed %d, counted %d, produced %d)",
					consumed, counted(), produced.Load())
			}
			runtime.Gosched()
			continue
		case err != nil:
			require.NoError(t, err)
		}
		idleAgain = 0
		// Safe to sleep. Work still owed when the fd stays quiet for 20 s
		// (the producer never pauses that long) is a lost wake-up.
		sleeps++
		taken.Store(int64(consumed + counted())) // TryWait progressed the counters
		asleep.Store(true)
		for {
			k, err := unix.Poll(pfd, 20_000)
			if err == unix.EINTR {
				continue
			}
			require.NoError(t, err)
			if k == 0 && consumed+counted() < total {
				t.Fatalf("lost wake-up: slept 20 s with %d of %d completions produced and %d taken (sleep %d); %s",
					produced.Load(), total, consumed+counted(), sleeps, f.explain())
			}
			break
		}
		asleep.Store(false)
	}
	require.NoError(t, <-perr)
	assert.Equal(t, total, consumed+counted(), "completions seen")
	for _, c := range counters {
		assert.Zero(t, c.Errors())
	}
	for i := 0; i < direct; i++ {
		assert.Zero(t, f.qps[i].sq.OutstandingP(), "QP %d outstanding", i)
	}
	st := ps.Stats()
	t.Logf("%d completions: %d sleeps, %d TryWaits (%d ErrAgain), %d interrupts, %d full-ring skips; poll set: %d polls, %d checks (%.1f per poll), %d idled, %d woken",
		total, sleeps, tries, again, f.interrupts.Load(), f.fullSkips.Load(), st.Polls, st.Checked, float64(st.Checked)/float64(st.Polls), st.Idled, st.Woken)
	assert.Greater(t, sleeps, 100, "the consumer barely slept: the test did not exercise sleeping")

	for i := 0; i < direct; i++ {
		require.NoError(t, ws.Remove(f.cqs[i].Source()))
	}
	for _, c := range counters {
		require.NoError(t, ws.Remove(c))
	}
	require.NoError(t, ws.Close())
}

// The hot calls allocate nothing: Poll over a set of CQs and counters,
// counter reads that drive a CQ, TryWait on a set and on a CQ's own fd
// with nothing pending, and the arming behind them.
func TestEventHotCallsAllocateNothing(t *testing.T) {
	f := newEventDevice(t, 8, 16)
	c := event.NewCounter()
	for i := 0; i < 8; i++ {
		var sc *event.Counter
		if i >= 4 {
			sc = c
		}
		f.addQP(t, i, 16, sc)
	}
	ps := event.NewPollSet[int]()
	ws, err := event.NewWaitSet(event.FD)
	require.NoError(t, err)
	for i := 0; i < 4; i++ {
		require.NoError(t, ps.Add(f.cqs[i].Source(), i))
		require.NoError(t, ws.Add(f.cqs[i].Source()))
	}
	for i := 4; i < 8; i++ {
		require.NoError(t, f.cqs[i].SetMode(CQCounted))
		require.NoError(t, c.Drive(f.cqs[i].Source()))
	}
	require.NoError(t, ps.Add(c, 8))
	require.NoError(t, ws.Add(c))
	out := make([]int, 16)
	wcs := make([]WC, 16)
	wrs := []SendWR{{WRID: 1, SGEs: []SGE{f.mr.SGE(0, 8)}}}
	// Warm up: the first TryWait makes the CQ's own wait set.
	require.ErrorIs(t, ws.TryWait(), event.ErrAgain) // a new member may hold events
	require.NoError(t, ws.TryWait())
	require.NoError(t, f.cqs[0].TryWait())
	for name, fn := range map[string]func(){
		"PollSet.Poll, all idle":      func() { _, _ = ps.Poll(out) },
		"Counter.Read, driving 4 CQs": func() { _, _ = c.Read() },
		"WaitSet.TryWait, nothing pending": func() {
			if err := ws.TryWait(); err != nil {
				panic(err)
			}
		},
		"CQ.TryWait, nothing pending": func() {
			if err := f.cqs[0].TryWait(); err != nil {
				panic(err)
			}
		},
		"post, complete, poll set, poll": func() {
			if _, err := f.qps[1].PostSend(wrs, 0); err != nil {
				panic(err)
			}
			f.complete(1)
			n, _ := ps.Poll(out)
			for _, k := range out[:n] {
				if k < 8 {
					_, _ = f.cqs[k].Poll(wcs)
				}
			}
		},
	} {
		assert.Zero(t, testing.AllocsPerRun(200, fn), name)
	}
	for i := 0; i < 4; i++ {
		require.NoError(t, ps.Remove(f.cqs[i].Source()))
		require.NoError(t, ws.Remove(f.cqs[i].Source()))
	}
	require.NoError(t, ws.Remove(c))
	require.NoError(t, ws.Close())
}

// BenchmarkPollSetCQs is Poll over real CQs of the fake device: all idle
// (armed, skipped until named), one active (always holding a completion,
// so always hot), and all hot (IdleAfter out of reach: a check per member).
func BenchmarkPollSetCQs(b *testing.B) {
	for _, n := range []int{1, 64, 1024} {
		for _, mode := range []string{"idle", "oneActive", "allHot"} {
			b.Run(fmt.Sprintf("members=%d/%s", n, mode), func(b *testing.B) {
				f := newEventDevice(b, n, 4)
				f.addQP(b, 0, 4, nil)
				ps := event.NewPollSet[int]()
				if mode == "allHot" {
					ps.SetIdleAfter(1 << 30)
				}
				for i, cq := range f.cqs {
					if err := ps.Add(cq.Source(), i); err != nil {
						b.Fatal(err)
					}
				}
				out := make([]int, 16)
				for range 2 * event.DefaultIdleAfter {
					if _, err := ps.Poll(out); err != nil {
						b.Fatal(err)
					}
				}
				if mode == "oneActive" {
					if _, err := f.qps[0].PostSend([]SendWR{{WRID: 1, SGEs: []SGE{f.mr.SGE(0, 8)}}}, 0); err != nil {
						b.Fatal(err)
					}
					f.complete(0)
				}
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					k, err := ps.Poll(out)
					if err != nil || (mode == "oneActive") != (k == 1) {
						b.Fatalf("poll: %d, %v", k, err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/member")
			})
		}
	}
}

// BenchmarkCounterRead is a counter read: bare (one atomic load), and
// driving one empty CQ (its Progress: a lock and a poll of the ring).
func BenchmarkCounterRead(b *testing.B) {
	f := newEventDevice(b, 1, 4)
	bare, driving := event.NewCounter(), event.NewCounter()
	f.addQP(b, 0, 4, driving)
	if err := errors.Join(f.cqs[0].SetMode(CQCounted), driving.Drive(f.cqs[0].Source())); err != nil {
		b.Fatal(err)
	}
	for name, c := range map[string]*event.Counter{"bare": bare, "driving1CQ": driving} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				if _, err := c.Read(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
