//go:build !guest

package am_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/pvsim"
)

// faultKind is a fault the soak injects.
type faultKind int

const (
	fQPFatal       faultKind = iota // pvsim ErrorQP: the QP fails, QP_FATAL
	fCQOverrun                      // pvsim OverflowCQ: CQ_ERR, completions lost
	fPortFlap                       // pvsim SetPort down for 2-80 ms: retransmissions
	fPortOutage                     // down for 0.6-1.2 s: longer than the RC retries
	fCmdErrno                       // pvsim InjectFault Errno: answered with ENOLINK
	fCmdRefused                     // InjectFault Status: refused at REQUEST
	fCmdHang                        // InjectFault Hang: never answered
	fDeviceFatal                    // pvsim Fatal, then the driver closed and opened again
	fAnswerLoss                     // Fabric.LoseAnswers: ACKs and responses lost
	fSpuriousEvent                  // pvsim Raise: an event about nothing wrong, or nothing known
	nFaultKinds
)

var faultNames = [nFaultKinds]string{
	"QP fatal", "CQ overrun", "port flap (2-80 ms)", "port outage (0.6-1.2 s)",
	"command answered with an errno", "command refused at REQUEST", "command hang",
	"DEVICE_FATAL, then reopen", "answers lost on the fabric", "spurious async event",
}

func (k faultKind) String() string { return faultNames[k] }

// faultWeights are the kinds' shares of the injections (about 13 a
// second).
var faultWeights = [nFaultKinds]int{
	fQPFatal: 24, fCQOverrun: 6, fPortFlap: 10, fPortOutage: 3, fCmdErrno: 10,
	fCmdRefused: 5, fCmdHang: 2, fDeviceFatal: 1, fAnswerLoss: 6, fSpuriousEvent: 8,
}

// faultLog counts, per kind, the injections and the objects they hit.
type faultLog struct {
	rows [nFaultKinds]faultRow
}

type faultRow struct {
	injected atomic.Int64
	mu       sync.Mutex
	hit      map[string]int
}

func (l *faultLog) init() {
	for i := range l.rows {
		l.rows[i].hit = map[string]int{}
	}
}

func (l *faultLog) note(k faultKind, object string) {
	r := &l.rows[k]
	r.injected.Add(1)
	r.mu.Lock()
	r.hit[object]++
	r.mu.Unlock()
}

// objects lists what a kind hit, the most hit first.
func (r *faultRow) objects() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	type kv struct {
		k string
		v int
	}
	var all []kv
	for k, v := range r.hit {
		all = append(all, kv{k, v})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].v > all[j].v || all[i].v == all[j].v && all[i].k < all[j].k })
	var parts []string
	for _, e := range all {
		parts = append(parts, fmt.Sprintf("%s ×%d", e.k, e.v))
	}
	if len(parts) == 0 {
		return "—"
	}
	return strings.Join(parts, ", ")
}

// registry names the cells' QPs, CQs and SRQs by node, so that an
// injection that picks among the model's objects says whose it hit
// (anything else on a device is am's).
type regKey struct {
	node int
	kind byte // 'q' QP by number, 'c' CQ by handle, 's' SRQ by handle
	id   uint32
}

var registry sync.Map // regKey → string

// cqSides are the cells' CQs' sides, by node and handle.
var cqSides sync.Map // regKey → *side

func register(n *node, kind byte, id uint32, label string) {
	registry.Store(regKey{n.i, kind, id}, label)
}
func unregister(n *node, kind byte, id uint32) { registry.Delete(regKey{n.i, kind, id}) }

func label(n *node, kind byte, id uint32, other string) string {
	if v, ok := registry.Load(regKey{n.i, kind, id}); ok {
		return v.(string)
	}
	return other
}

// registered returns the ids of one kind a node's cells have now.
func registered(n *node, kind byte) []uint32 {
	var out []uint32
	registry.Range(func(k, _ any) bool {
		if rk := k.(regKey); rk.node == n.i && rk.kind == kind {
			out = append(out, rk.id)
		}
		return true
	})
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// statusRefused is what ERR reads for a Status fault: -ECOMM.
var statusRefused = func() uint32 { e := int32(faultStatusErrno); return uint32(-e) }()

// The commands a fault may target: those the workers' set-ups and
// tear-downs issue, or any.
var faultCmds = []firmware.Cmd{
	pvsim.AnyCommand, pvsim.AnyCommand, firmware.CmdCreatePD, firmware.CmdDestroyPD,
	firmware.CmdCreateMR, firmware.CmdDestroyMR, firmware.CmdCreateCQ, firmware.CmdDestroyCQ,
	firmware.CmdCreateQP, firmware.CmdModifyQP, firmware.CmdDestroyQP,
	firmware.CmdCreateSRQ, firmware.CmdDestroySRQ, firmware.CmdQueryPort,
}

func cmdName(c firmware.Cmd) string {
	if c == pvsim.AnyCommand {
		return "any command"
	}
	return c.String()
}

// inject injects a fault every 20-130 ms until ctx ends. Port flaps and
// reopens run on goroutines of wg, so the round waits for them.
func (s *soak) inject(ctx context.Context, rng *rand.Rand, wg *sync.WaitGroup) {
	total := 0
	for _, w := range faultWeights {
		total += w
	}
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		t.Reset(time.Duration(20+rng.IntN(110)) * time.Millisecond)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pick := rng.IntN(total)
		k := faultKind(0)
		for ; pick >= faultWeights[k]; k++ {
			pick -= faultWeights[k]
		}
		if rng.IntN(4) == 0 {
			// A kind not injected yet goes first: a run injects every kind
			// however the draws fall.
			for u := range nFaultKinds {
				if s.faults.rows[u].injected.Load() == 0 {
					k = u
					break
				}
			}
		}
		n := s.nodes[rng.IntN(len(s.nodes))]
		if n.dead.Load() {
			continue
		}
		s.injectOne(k, n, rng, wg)
	}
}

func (s *soak) injectOne(k faultKind, n *node, rng *rand.Rand, wg *sync.WaitGroup) {
	m := n.m
	switch k {
	case fQPFatal:
		qps := m.QPs()
		if len(qps) == 0 {
			return
		}
		q := qps[rng.IntN(len(qps))]
		if m.ErrorQP(q.Handle) != nil {
			return // destroyed meanwhile
		}
		n.qpFatals.Add(1)
		s.faults.note(k, label(n, 'q', q.QPN, "am's QP"))
	case fCQOverrun:
		if !n.cqMu.TryLock() {
			return // a cell is between a CQ's create or close and cqSides
		}
		defer n.cqMu.Unlock()
		cells := registered(n, 'c')
		if len(cells) > 0 && rng.IntN(4) != 0 {
			h := cells[rng.IntN(len(cells))]
			if v, ok := cqSides.Load(regKey{n.i, 'c', h}); ok {
				v.(*side).overflowed.Store(true) // before: its poller may see it at once
			}
			if m.OverflowCQ(h) == nil {
				s.faults.note(k, label(n, 'c', h, "am's CQ"))
			}
			return
		}
		// Another CQ: am's (the model hands out the lowest free handle).
		for _, h := range rng.Perm(32) {
			h := uint32(h + 1)
			if _, ok := cqSides.Load(regKey{n.i, 'c', h}); ok {
				continue
			}
			if m.OverflowCQ(h) == nil {
				s.faults.note(k, label(n, 'c', h, "am's CQ"))
				return
			}
		}
	case fPortFlap, fPortOutage:
		if !n.flapping.CompareAndSwap(false, true) {
			return
		}
		d := time.Duration(2+rng.IntN(78)) * time.Millisecond
		if k == fPortOutage {
			d = time.Duration(600+rng.IntN(600)) * time.Millisecond
		}
		if err := m.SetPort(false); err != nil {
			s.errorf("inject", "%s: port down: %v", m.Name(), err)
			n.flapping.Store(false)
			return
		}
		s.faults.note(k, "port of "+m.Name())
		wg.Go(func() {
			time.Sleep(d)
			if err := m.SetPort(true); err != nil {
				s.errorf("inject", "%s: port up: %v", m.Name(), err)
			}
			n.flapping.Store(false)
		})
	case fCmdErrno, fCmdRefused, fCmdHang:
		f := pvsim.CommandFault{Cmd: faultCmds[rng.IntN(len(faultCmds))], Count: 1 + rng.IntN(3)}
		switch k {
		case fCmdErrno:
			f.Errno = faultErrno
		case fCmdRefused:
			f.Status = statusRefused
		case fCmdHang:
			f.Hang, f.Count = true, 1
		}
		if err := m.InjectFault(f); err != nil {
			s.errorf("inject", "%s: %v", m.Name(), err)
			return
		}
		s.faults.note(k, cmdName(f.Cmd))
	case fDeviceFatal:
		if !s.reopening.CompareAndSwap(false, true) {
			return // one at a time
		}
		n.dead.Store(true)
		if err := m.Fatal(); err != nil {
			s.errorf("inject", "%s: fatal: %v", m.Name(), err)
		}
		s.faults.note(k, m.Name()+", every object")
		wg.Go(func() {
			defer s.reopening.Store(false)
			s.reopen(n)
		})
	case fAnswerLoss:
		lost := 1 + rng.IntN(8)
		s.fab.LoseAnswers(lost)
		s.faults.note(k, fmt.Sprintf("the next %d answers", lost))
	case fSpuriousEvent:
		s.spurious(n, rng)
	}
}

// spurious raises an event about nothing wrong (communication
// established, SQ drained, a path migrated, last WQE, LID or GID changed,
// the SRQ limit on an SRQ whose watermark may not be armed) or about an
// object nobody has.
func (s *soak) spurious(n *node, rng *rand.Rand) {
	m := n.m
	var ev firmware.EventType
	var info uint32
	switch rng.IntN(4) {
	case 0:
		qps := m.QPs()
		if len(qps) == 0 {
			return
		}
		ev = []firmware.EventType{firmware.EventCommEst, firmware.EventSQDrained, firmware.EventPathMig, firmware.EventQPLastWQEReached}[rng.IntN(4)]
		info = qps[rng.IntN(len(qps))].Handle
	case 1:
		ev = []firmware.EventType{firmware.EventLIDChange, firmware.EventPKeyChange, firmware.EventGIDChange, firmware.EventClientReregister}[rng.IntN(4)]
		info = 1
	case 2:
		srqs := registered(n, 's')
		if len(srqs) == 0 {
			return
		}
		ev, info = firmware.EventSRQLimitReached, srqs[rng.IntN(len(srqs))]
	case 3:
		ev, info = []firmware.EventType{firmware.EventCommEst, firmware.EventSRQErr, firmware.EventSMChange}[rng.IntN(3)], 0xfff0+uint32(rng.IntN(15))
	}
	if err := m.Raise(ev, info); err != nil {
		s.errorf("inject", "%s: raise %v: %v", m.Name(), ev, err)
		return
	}
	s.faults.note(fSpuriousEvent, ev.String())
}

// reopen waits for the dead node's users to let go, closes its driver
// (whose destroys the dead device refuses), checks the model then maps
// nothing, and opens the driver again.
func (s *soak) reopen(n *node) {
	n.mu.Lock()
	defer n.mu.Unlock()
	_ = n.closeDriver() // the device refuses the destroys: Close reports them and shuts the objects all the same
	if dma := n.m.DMA(); dma != (pvsim.DMAUse{}) {
		s.errorf("leak", "%s: the model still maps %+v once the driver that saw DEVICE_FATAL is closed", n.m.Name(), dma)
	}
	for attempt := 0; ; attempt++ {
		err := n.open()
		if err == nil {
			break
		}
		s.refused(err)
		if attempt == 5 {
			n.m.ClearFaults() // faults injected before the fatal wait for commands
		}
		if attempt == 10 {
			s.errorf("reopen", "%s: the driver does not open after DEVICE_FATAL: %v", n.m.Name(), err)
			return // the node stays dead
		}
	}
	n.dead.Store(false)
	s.counts.reopens.Add(1)
}
