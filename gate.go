package vfrdma

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// gate is an object's in-use count, the lifecycle rule's mechanism (the
// model is internal/poll.FD's reference count): a call that touches memory
// Close releases enters the gate and leaves it when done; Close shuts the
// gate, so that later calls are refused, then waits for the calls inside
// to leave before it releases anything. A holder (hold) may also take the
// gate for a while without shutting it: calls are refused meanwhile, and
// let in again at unhold.
//
// enter and exit are one atomic add each, with no lock and no allocation:
// the hot paths (post, poll) pay two locked adds per call, not per request.
type gate struct {
	v atomic.Int64 // gateShut | gateHeld | calls inside

	hmu  sync.Mutex // serialises holders and shutters
	mu   sync.Mutex // guards idle
	idle chan struct{}
}

const (
	gateShut  = 1 << 62 // shut for good: calls are refused
	gateHeld  = 1 << 61 // held for a while: calls are refused until unhold
	gateFlags = gateShut | gateHeld
)

// enter lets a call in and reports true, or refuses it (shut or held) and
// reports false; a call let in must exit.
func (g *gate) enter() bool {
	if g.v.Add(1)&gateFlags != 0 {
		g.refuse()
		return false
	}
	return true
}

// refuse takes a refused call out again.
//
//go:noinline
func (g *gate) refuse() {
	g.v.Add(-1)
	g.exitSlow()
}

// exit lets a call out.
func (g *gate) exit() {
	if g.v.Add(-1)&gateFlags != 0 {
		g.exitSlow()
	}
}

// exitSlow is the end of exit while the gate is shut or held: a call that
// finds none inside signals the closer or holder (more than one may: the
// closer looks again).
//
//go:noinline
func (g *gate) exitSlow() {
	if g.v.Load()&^gateFlags == 0 {
		g.signal()
	}
}

// shut reports whether the gate is shut for good.
func (g *gate) shut() bool { return g.v.Load()&gateShut != 0 }

//go:noinline
func (g *gate) signal() {
	g.mu.Lock()
	if g.idle != nil {
		close(g.idle)
		g.idle = nil
	}
	g.mu.Unlock()
}

// drain waits until no call is inside. The gate must be shut or held.
func (g *gate) drain() {
	for {
		g.mu.Lock()
		if g.v.Load()&^gateFlags == 0 {
			g.mu.Unlock()
			return
		}
		if g.idle == nil {
			g.idle = make(chan struct{})
		}
		ch := g.idle
		g.mu.Unlock()
		<-ch
	}
}

// close shuts the gate for good and waits for the calls inside to leave.
// It is idempotent.
func (g *gate) close() {
	g.hmu.Lock()
	defer g.hmu.Unlock()
	g.v.Or(gateShut)
	g.drain()
}

// hold refuses calls until unhold and waits for the calls inside to leave:
// the holder then has the object to itself. Holders take turns.
func (g *gate) hold() {
	g.hmu.Lock()
	g.v.Or(gateHeld)
	g.drain()
}

// unhold lets calls in again (unless the gate was shut meanwhile, by
// shutHeld).
func (g *gate) unhold() {
	g.v.And(^int64(gateHeld))
	g.hmu.Unlock()
}

// shutHeld shuts a gate its caller holds, for good, and lets go of it.
func (g *gate) shutHeld() {
	g.v.Or(gateShut)
	g.unhold()
}

// enterWait is enter for calls that wait out a holder rather than fail:
// it reports false only once the gate is shut. Holders keep the gate for a
// short scan (CQ.rekey), so the wait is a yield loop.
func (g *gate) enterWait() bool {
	for {
		if g.enter() {
			return true
		}
		if g.shut() {
			return false
		}
		runtime.Gosched()
	}
}
