//go:build !guest

package am_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/am"
	"github.com/vfrdma/vfrdma/pvsim"
	"github.com/vfrdma/vfrdma/rings"
)

// The soak: RC, UD and SRQ traffic and an active-message job run on three
// device models for minutes while every fault the model makes is injected
// at random, and at the end every work request and every message is
// accounted for and nothing is left behind. -soak sets its length
// (go test ./am -run Soak -soak=10m), -soak.seed its seed.
var (
	soakFor  = flag.Duration("soak", 0, "how long TestSoak runs (0: 75 s; 15 s with -short)")
	soakSeed = flag.Uint64("soak.seed", 0, "TestSoak's seed (0: from the clock; the test logs the one it used)")
)

// Bounds of the soak. None is asserted: a wait that reaches its hang guard
// is reported as a hang, with the goroutines' stacks.
const (
	soakRound    = 6 * time.Second  // faults are cleared and the devices checked between rounds
	soakCmdLimit = 2 * time.Second  // Options.CommandTimeout: what a hung command costs
	hangGuard    = 90 * time.Second // no wait of the soak needs more, however loaded the machine
)

// TestSoakEveryRequestAndMessageAccountedForUnderEveryFault drives RC
// (SEND, SEND with immediate, RDMA WRITE with and without immediate, RDMA
// READ, fetch-and-add; signaled and not), UD, SRQ and active-message
// traffic from many goroutines on three device models (VMware's at version
// 20, one answering its commands late, one at version 19) while it injects,
// at random, every fault the model makes: QP fatal errors, CQ overruns,
// port flaps and outages longer than the RC retries, commands answered
// with an error, refused, or never answered, DEVICE_FATAL (the device is
// then closed and opened again), lost answers on the fabric and spurious
// async events. It checks, deterministically:
//
//   - every work request posted completed exactly once (successfully or
//     not; unsignaled sends at most once, and never successfully), except
//     where its CQ failed (overrun, DEVICE_FATAL), where what did not
//     complete is what the driver still counts outstanding; no completion
//     names a request never posted, or another QP;
//   - every message sent with immediate data arrived at most once, in
//     order on RC, with its bytes; every one acknowledged arrived; RDMA
//     READ brought the bytes; no fetch-and-add ran twice;
//   - every active message Amsend took was delivered once (its completion
//     counter at 1, its completion handler run once, its bytes checked) or
//     reported failed (counter at 0), and the context's counts agree;
//   - between rounds, each device's model holds no object and no DMA
//     memory beyond what the open driver holds itself; at the end, no
//     goroutine, file descriptor or locked memory is left.
//
// The table of faults injected and what they did is logged.
func TestSoakEveryRequestAndMessageAccountedForUnderEveryFault(t *testing.T) {
	dur := *soakFor
	if dur == 0 {
		dur = 75 * time.Second
		if testing.Short() {
			dur = 15 * time.Second
		}
	}
	seed := *soakSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("soak: %v, seed %d (-soak.seed=%d repeats the fault schedule's choices)", dur, seed, seed)

	// What the process holds before: measured after a warm-up that starts
	// what the runtime keeps for good (the poller's descriptors).
	warmUp(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	fds0, lck0 := openFDs(t), lockedKB(t)

	s := newSoak(t, seed)
	start := time.Now()
	for round := 0; time.Since(start) < dur && !t.Failed(); round++ {
		s.round(round, min(soakRound, max(dur-time.Since(start), time.Second)))
	}
	s.closeAll()

	s.logTable(time.Since(start))
	if t.Failed() {
		return
	}
	assert.Equal(t, fds0, openFDs(t), "file descriptors open after the soak")
	assert.Zero(t, lockedKB(t)-lck0, "kB of locked memory (am's packet memory) left after the soak; am kept the memory of %d MRs a device would not deregister at first", s.counts.amKeptMRs.Load())
	s.requireTested()
}

// warmUp opens and closes a device and a CQ's descriptor once, so that
// what the runtime opens for good on first use (the poller's descriptors)
// is open before the counts are taken.
func warmUp(t *testing.T) {
	m, err := pvsim.New(pvsim.Config{})
	require.NoError(t, err)
	d, err := vfrdma.OpenFunction(m.Function(), nil)
	require.NoError(t, err)
	cq, err := d.CreateCQ(context.Background(), 16)
	require.NoError(t, err)
	_, err = cq.FD()
	require.NoError(t, err)
	require.NoError(t, cq.Close())
	require.NoError(t, d.Close())
	require.NoError(t, m.Close())
}

// openFDs counts the process's open file descriptors.
func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// lockedKB reads VmLck, the process's locked memory, in kB: am's packet
// memory is locked (vfio.AllocMemory), the model's DMA memory is not.
func lockedKB(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmLck:"); ok {
			f := strings.Fields(rest)
			require.NotEmpty(t, f)
			n, err := strconv.Atoi(f[0])
			require.NoError(t, err)
			return n
		}
	}
	require.FailNow(t, "no VmLck in /proc/self/status")
	return 0
}

// soak is the run: the fabric, its nodes, the fault log and the counts.
type soak struct {
	t     *testing.T
	seed  uint64
	fab   *pvsim.Fabric
	nodes []*node
	wrid  atomic.Uint64 // wr_ids are unique across the run

	faults faultLog
	counts counts

	errMu  sync.Mutex
	errN   map[string]int
	stacks bool // goroutine stacks logged once

	// reopening: a DEVICE_FATAL's reopen is under way (one at a time).
	reopening atomic.Bool
}

// node is one device model and the driver open on it. Users hold mu
// shared while they use the driver's device; a reopen after DEVICE_FATAL
// holds it exclusively.
type node struct {
	s    *soak
	i    int
	m    *pvsim.Device
	mu   sync.RWMutex
	d    *vfrdma.Device
	dead atomic.Bool // DEVICE_FATAL raised and not reopened yet
	// What the open driver holds on the model with no object of the
	// soak's: compared between rounds.
	baseObj pvsim.Objects
	baseDMA pvsim.DMAUse
	// flapping: a port flap or outage is under way.
	flapping atomic.Bool
	// leftovers close what a cell could not (a destroy refused by a
	// command fault every time it was tried), once faults are cleared.
	lmu       sync.Mutex
	leftovers []func() error
	// amRetry are the am contexts whose Close had a destroy refused
	// (under lmu): Close again, once faults are cleared, frees what is
	// left (am's rule), or finds it freed by the device's Close after a
	// DEVICE_FATAL.
	amRetry []*am.Context
	// amKept: New's clean-up on the node had a destroy refused; the
	// driver keeps what it refused until its Close (which frees the
	// packet memory too), so the node is reopened before the round's
	// check.
	amKept atomic.Bool
	// qpFatals counts the QP fatals injected on the node: a set-up that
	// meets one finds its next transition refused.
	qpFatals atomic.Int64
	// cqMu: cells hold it shared from a CQ's CreateCQ to its entry in
	// cqSides and from its Close to the entry's removal; the CQ-overrun
	// injector exclusively, so that cqSides names the cell whose CQ has
	// a handle when it overflows it.
	cqMu sync.RWMutex
}

// closeDriver closes the node's driver, which takes the leftovers.
func (n *node) closeDriver() error {
	st, _ := n.d.AsyncStats() // a ring fault is the driver's to report; the counts stand
	n.s.counts.staleEvents.Add(int64(st.Stale))
	err := n.d.Close()
	n.lmu.Lock()
	n.leftovers = nil
	n.lmu.Unlock()
	return err
}

// The three devices: VMware's at version 20; one that answers commands
// 2 ms late (so that a command sent while its caller's time runs out is
// answered after it) and consumes send WQEs on completion; one at version 19 (QP
// handles are QP numbers) that writes a notification for every CQE.
var soakDevices = []pvsim.Config{
	{Version: 20},
	{Version: 20, CommandDelay: 2 * time.Millisecond, SQConsumeOnCompletion: true},
	{Version: 19, CQNotifyAll: true},
}

func newSoak(t *testing.T, seed uint64) *soak {
	s := &soak{t: t, seed: seed, fab: pvsim.NewFabric(), errN: map[string]int{}}
	s.faults.init()
	for i, cfg := range soakDevices {
		cfg.Fabric = s.fab
		cfg.Seed = seed + uint64(i)
		cfg.MAC = [6]byte{0x02, 0x50, 0x5a, 0, 0, byte(i + 1)}
		cfg.Name = fmt.Sprintf("soak%d", i)
		m, err := pvsim.New(cfg)
		require.NoError(t, err)
		n := &node{s: s, i: i, m: m}
		s.nodes = append(s.nodes, n)
		require.NoError(t, n.open(), "opening the driver on %s", cfg.Name)
	}
	return s
}

// open opens the driver on the node's model and takes the baseline.
// Called with mu held exclusively (or before anyone uses the node).
func (n *node) open() error {
	d, err := vfrdma.OpenFunction(n.m.Function(), &vfrdma.Options{CommandTimeout: soakCmdLimit})
	if err != nil {
		return err
	}
	go func() { // until Close closes the channel
		for ev := range d.AsyncEvents() {
			n.s.counts.event(ev)
		}
	}()
	n.d = d
	n.baseObj, n.baseDMA = n.m.Objects(), n.m.DMA()
	return nil
}

// acquire takes the nodes' devices for a user (shared), in index order;
// false if one is dead (nothing is then held).
func acquire(ns ...*node) ([]*vfrdma.Device, bool) {
	sorted := append([]*node(nil), ns...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].i < sorted[j].i })
	var held []*node
	for i, n := range sorted {
		if i > 0 && n == sorted[i-1] {
			continue
		}
		n.mu.RLock()
		held = append(held, n)
		if n.dead.Load() {
			for _, h := range held {
				h.mu.RUnlock()
			}
			return nil, false
		}
	}
	ds := make([]*vfrdma.Device, len(ns))
	for i, n := range ns {
		ds[i] = n.d
	}
	return ds, true
}

// release gives back what acquire took.
func release(ns ...*node) {
	seen := map[*node]bool{}
	for _, n := range ns {
		if !seen[n] {
			seen[n] = true
			n.mu.RUnlock()
		}
	}
}

func anyDead(ns ...*node) bool {
	for _, n := range ns {
		if n.dead.Load() {
			return true
		}
	}
	return false
}

// errorf reports a broken rule: the first few of each kind in full, the
// rest counted.
func (s *soak) errorf(kind, format string, args ...any) {
	s.errMu.Lock()
	s.errN[kind]++
	k := s.errN[kind]
	s.errMu.Unlock()
	if k <= 5 {
		s.t.Errorf("%s: "+format, append([]any{kind}, args...)...)
	} else if k == 6 {
		s.t.Errorf("%s: more of the same follow, counted at the end", kind)
	}
}

// hang reports a wait that reached its hang guard, with every goroutine's
// stack the first time.
func (s *soak) hang(format string, args ...any) {
	s.errorf("hang", format, args...)
	s.errMu.Lock()
	dump := !s.stacks
	s.stacks = true
	s.errMu.Unlock()
	if dump {
		var b bytes.Buffer
		_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
		s.t.Logf("goroutines at the hang:\n%s", b.String())
	}
}

// round runs the workers and the injector for d, then clears the faults,
// lets the leftovers go and checks each device is back at its baseline.
func (s *soak) round(round int, d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	rng := func(k uint64) *rand.Rand { return rand.New(rand.NewPCG(s.seed, uint64(round)<<8|k)) }
	for k := range 2 {
		wg.Go(func() { s.verbsWorker(ctx, rng(uint64(1+k)), cellRC) })
	}
	wg.Go(func() { s.verbsWorker(ctx, rng(3), cellSRQ) })
	wg.Go(func() { s.verbsWorker(ctx, rng(4), cellUD) })
	wg.Go(func() { s.amWorker(ctx, rng(5)) })
	wg.Go(func() { s.inject(ctx, rng(6), &wg) })
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d + hangGuard):
		s.hang("round %d: the workers did not end within %v of its end", round, hangGuard)
		s.t.FailNow()
	}
	s.counts.rounds.Add(1)

	// Between rounds: no fault pending, every port up, then what cells
	// could not close goes, and each device holds only the driver's own.
	s.fab.LoseAnswers(0)
	for _, n := range s.nodes {
		n.m.ClearFaults()
		if err := n.m.SetPort(true); err != nil {
			s.errorf("restore", "port up on %s: %v", n.m.Name(), err)
		}
	}
	for _, n := range s.nodes {
		n.lmu.Lock()
		left := n.leftovers
		n.leftovers = nil
		n.lmu.Unlock()
		for _, f := range left {
			if err := f(); err != nil {
				s.errorf("leak", "%s: closing what a cell left, with no fault pending: %v", n.m.Name(), err)
			}
		}
		s.counts.leftovers.Add(int64(len(left)))
		n.lmu.Lock()
		retry := n.amRetry
		n.amRetry = nil
		n.lmu.Unlock()
		for _, c := range retry {
			// Faults cleared, or the device closed since (DEVICE_FATAL):
			// the retry frees the rest.
			if err := c.Close(); err != nil {
				s.errorf("leak", "%s: an am context's Close retried with no fault pending: %v", n.m.Name(), err)
			}
		}
		s.counts.amRetried.Add(int64(len(retry)))
		if n.amKept.Swap(false) {
			// What New's clean-up could not destroy stays with the
			// driver until its Close: close it, open it again.
			if err := n.closeDriver(); err != nil {
				s.errorf("close", "%s: Device.Close with no fault pending: %v", n.m.Name(), err)
			}
			if dma := n.m.DMA(); dma != (pvsim.DMAUse{}) {
				s.errorf("leak", "%s: the model still maps %+v once the driver is closed", n.m.Name(), dma)
			}
			if err := n.open(); err != nil {
				s.errorf("reopen", "%s: %v", n.m.Name(), err)
				n.dead.Store(true)
			}
			s.counts.amKeptReopens.Add(1)
			continue
		}
		if obj := n.m.Objects(); obj != n.baseObj {
			s.errorf("leak", "%s after round %d: the model holds %+v, the driver alone %+v", n.m.Name(), round, obj, n.baseObj)
		}
		if dma := n.m.DMA(); dma != n.baseDMA {
			s.errorf("leak", "%s after round %d: the model maps %+v, the driver alone %+v", n.m.Name(), round, dma, n.baseDMA)
		}
	}
}

// closeAll closes every driver, checks that the model then maps nothing,
// and closes the models.
func (s *soak) closeAll() {
	for _, n := range s.nodes {
		if err := n.closeDriver(); err != nil {
			s.errorf("close", "%s: Device.Close: %v", n.m.Name(), err)
		}
		if dma := n.m.DMA(); dma != (pvsim.DMAUse{}) {
			s.errorf("leak", "%s: the model still maps %+v once the driver is closed", n.m.Name(), dma)
		}
		st := n.m.Stats()
		s.counts.retransmits.Add(int64(st.Retransmits))
		s.counts.dropped.Add(int64(st.Dropped))
		s.counts.cqesDropped.Add(int64(st.CQEsDropped))
		s.counts.cmdErrors.Add(int64(st.CommandErrors))
		if err := n.m.Close(); err != nil {
			s.errorf("close", "%s: model Close: %v", n.m.Name(), err)
		}
	}
}

// requireTested fails a soak that did not exercise what it claims to.
func (s *soak) requireTested() {
	t := s.t
	c := &s.counts
	assert.NotZero(t, c.cells.Load(), "no verbs cell ran to its checks")
	assert.NotZero(t, c.wrs.Load(), "no work request completed")
	assert.NotZero(t, c.amDelivered.Load(), "no active message was delivered")
	for k := range nFaultKinds {
		if *soakFor == 0 && testing.Short() {
			break // a short soak may miss the rarest
		}
		assert.NotZero(t, s.faults.rows[k].injected.Load(), "no %s injected", k)
	}
	s.errMu.Lock()
	defer s.errMu.Unlock()
	for kind, n := range s.errN {
		if n > 5 {
			t.Errorf("%s: %d in all", kind, n)
		}
	}
}

// counts are what the workers saw, for the table.
type counts struct {
	rounds, cells, cellsRefused, wrs, wrsLost, leftovers atomic.Int64
	status                                               sync.Map // vfrdma.WCStatus → *atomic.Int64
	events                                               sync.Map // vfrdma.AsyncEventType → *atomic.Int64
	unknownEvents                                        atomic.Int64
	cmdRefused                                           sync.Map // cause → *atomic.Int64
	jobs, jobsRefused, amSent, amDelivered, amFailed     atomic.Int64
	amPurged, amDead                                     atomic.Int64
	reopens, amKeptReopens, amKeptMRs, amRetried         atomic.Int64
	retransmits, dropped, cqesDropped, cmdErrors         atomic.Int64
	immChecked, readsChecked, faaChecked                 atomic.Int64
	staleEvents                                          atomic.Int64 // AsyncStats.Stale of the drivers closed
}

func addTo(m *sync.Map, key any, n int64) {
	v, _ := m.LoadOrStore(key, new(atomic.Int64))
	v.(*atomic.Int64).Add(n)
}

func loadFrom(m *sync.Map, key any) int64 {
	if v, ok := m.Load(key); ok {
		return v.(*atomic.Int64).Load()
	}
	return 0
}

// event counts the async events the drivers delivered (Device.AsyncEvents).
func (c *counts) event(ev vfrdma.AsyncEvent) {
	addTo(&c.events, ev.Type, 1)
	if ev.QP == nil && ev.CQ == nil && ev.SRQ == nil && ev.Port != 1 && ev.Type != vfrdma.EventDeviceFatal {
		c.unknownEvents.Add(1)
	}
}

// refused counts a control call a fault refused, by what it met.
func (s *soak) refused(err error) string {
	cause := classify(err)
	addTo(&s.counts.cmdRefused, cause, 1)
	return cause
}

// logTable logs the faults injected, the objects they hit and what came
// of them, and the run's counts.
func (s *soak) logTable(el time.Duration) {
	c := &s.counts
	st := func(w vfrdma.WCStatus) int64 { return loadFrom(&c.status, w) }
	ev := func(e vfrdma.AsyncEventType) int64 { return loadFrom(&c.events, e) }
	ref := func(k string) int64 { return loadFrom(&c.cmdRefused, k) }
	outcome := [nFaultKinds]string{
		fQPFatal: fmt.Sprintf("driver saw %d QP_FATAL; %d flush completions in all",
			ev(vfrdma.EventQPFatal), st(vfrdma.WCFlushErr)),
		fCQOverrun: fmt.Sprintf("driver saw %d CQ_ERR; %d CQEs the model dropped; %d requests lost with failed CQs, each counted outstanding by the driver",
			ev(vfrdma.EventCQErr), c.cqesDropped.Load(), c.wrsLost.Load()),
		fPortFlap: fmt.Sprintf("%d retransmissions, %d packets dropped (all causes)", c.retransmits.Load(), c.dropped.Load()),
		fPortOutage: fmt.Sprintf("%d RETRY_EXC_ERR completions; %d am tasks purged",
			st(rings.WCRetryExcErr), c.amPurged.Load()),
		fCmdErrno:   fmt.Sprintf("%d calls failed with the errno; set-ups undone, destroys retried", ref("errno")),
		fCmdRefused: fmt.Sprintf("%d calls refused at REQUEST", ref("refused")),
		fCmdHang:    fmt.Sprintf("%d calls timed out; the channel went on", ref("timeout")),
		fDeviceFatal: fmt.Sprintf("driver saw %d DEVICE_FATAL; %d reopens; %d calls refused by the dead device; %d am contexts died",
			ev(vfrdma.EventDeviceFatal), c.reopens.Load(), ref("device dead"), c.amDead.Load()),
		fAnswerLoss: "retransmitted (counted with the port flaps)",
		fSpuriousEvent: fmt.Sprintf("%d delivered naming no object of the driver's",
			c.unknownEvents.Load()),
	}
	var b strings.Builder
	fmt.Fprintf(&b, "soak: %v, %d rounds, seed %d\n", el.Round(time.Second), c.rounds.Load(), s.seed)
	fmt.Fprintf(&b, "| fault | injected | objects affected | outcome |\n|---|---|---|---|\n")
	for k := range nFaultKinds {
		r := &s.faults.rows[k]
		fmt.Fprintf(&b, "| %s | %d | %s | %s |\n", k, r.injected.Load(), r.objects(), outcome[k])
	}
	fmt.Fprintf(&b, "verbs: %d cells checked (%d set-ups refused by faults), %d work requests completed exactly once, %d lost with a failed CQ; %d immediate-data arrivals, %d READs, %d fetch-and-adds checked; %d leftovers closed between rounds\n",
		c.cells.Load(), c.cellsRefused.Load(), c.wrs.Load(), c.wrsLost.Load(), c.immChecked.Load(), c.readsChecked.Load(), c.faaChecked.Load(), c.leftovers.Load())
	fmt.Fprintf(&b, "stale async events: %d taken after their object was destroyed and its handle given to a new one, applied to none\n",
		c.staleEvents.Load())
	fmt.Fprintf(&b, "completions by status:")
	var keys []int
	c.status.Range(func(k, _ any) bool { keys = append(keys, int(k.(vfrdma.WCStatus))); return true })
	sort.Ints(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, " %v=%d", vfrdma.WCStatus(k), st(vfrdma.WCStatus(k)))
	}
	fmt.Fprintf(&b, "\nam: %d jobs (%d refused by faults), %d messages sent: %d delivered once, %d reported failed; %d purges, %d contexts died; %d MRs a device would not deregister at first (in Close or New's clean-up), %d contexts' Closes retried, %d devices reopened for what New's clean-up left\n",
		c.jobs.Load(), c.jobsRefused.Load(), c.amSent.Load(), c.amDelivered.Load(), c.amFailed.Load(), c.amPurged.Load(), c.amDead.Load(), c.amKeptMRs.Load(), c.amRetried.Load(), c.amKeptReopens.Load())
	s.t.Log(b.String())
}

// The errnos the command faults carry, so that a failure can be told
// from any other: Errno faults answer ENOLINK, Status faults refuse with
// -ECOMM; a device after DEVICE_FATAL refuses every command with -EIO.
const (
	faultErrno       = syscall.ENOLINK
	faultStatusErrno = syscall.ECOMM
)

// classify names what a refused control call met.
func classify(err error) string {
	switch {
	case errors.Is(err, faultErrno):
		return "errno"
	case errors.Is(err, faultStatusErrno):
		return "refused"
	case errors.Is(err, syscall.EIO):
		return "device dead"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, vfrdma.ErrDeviceFatal):
		return "device dead"
	}
	return "other"
}
