// Package lifecycle holds what every closable object of the driver shares:
// the ErrClosed sentinel and the in-use gate that makes "after Close every
// call returns ErrClosed, and nothing is freed while a call may touch it"
// hold at the price of two atomic adds per call.
package lifecycle

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
)

// ErrClosed reports use of a closed object; every package's ErrClosed is
// this one, so errors.Is(err, vfrdma.ErrClosed) holds for all of them.
var ErrClosed = errors.New("vfrdma: closed")

// Gate is an object's in-use count, the lifecycle rule's mechanism (the
// model is internal/poll.FD's reference count): a call that touches memory
// Close releases enters the gate and leaves it when done; Close shuts the
// gate, so that later calls are refused, then waits for the calls inside
// to leave before it releases anything. A holder (Hold) may also take the
// gate for a while without shutting it: calls are refused meanwhile, and
// let in again at Unhold.
//
// enter and exit are one atomic add each, with no lock and no allocation:
// the hot paths (post, poll) pay two locked adds per call, not per request.
type Gate struct {
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

// Enter lets a call in and reports true, or refuses it (shut or held) and
// reports false; a call let in must Exit.
func (g *Gate) Enter() bool {
	if g.v.Add(1)&gateFlags != 0 {
		g.refuse()
		return false
	}
	return true
}

// refuse takes a refused call out again.
//
//go:noinline
func (g *Gate) refuse() {
	g.v.Add(-1)
	g.exitSlow()
}

// Exit lets a call out.
func (g *Gate) Exit() {
	if g.v.Add(-1)&gateFlags != 0 {
		g.exitSlow()
	}
}

// exitSlow is the end of exit while the gate is shut or held: a call that
// finds none inside signals the closer or holder (more than one may: the
// closer looks again).
//
//go:noinline
func (g *Gate) exitSlow() {
	if g.v.Load()&^gateFlags == 0 {
		g.signal()
	}
}

// IsShut reports whether the gate is shut for good.
func (g *Gate) IsShut() bool { return g.v.Load()&gateShut != 0 }

//go:noinline
func (g *Gate) signal() {
	g.mu.Lock()
	if g.idle != nil {
		close(g.idle)
		g.idle = nil
	}
	g.mu.Unlock()
}

// Drain waits until no call is inside. The gate must be shut or held.
func (g *Gate) Drain() {
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

// Close shuts the gate for good and waits for the calls inside to leave.
// It is idempotent.
func (g *Gate) Close() {
	g.hmu.Lock()
	defer g.hmu.Unlock()
	g.v.Or(gateShut)
	g.Drain()
}

// Hold refuses calls until Unhold and waits for the calls inside to leave:
// the holder then has the object to itself. Holders take turns.
func (g *Gate) Hold() {
	g.hmu.Lock()
	g.v.Or(gateHeld)
	g.Drain()
}

// Unhold lets calls in again (unless the gate was shut meanwhile, by
// shutHeld).
func (g *Gate) Unhold() {
	g.v.And(^int64(gateHeld))
	g.hmu.Unlock()
}

// ShutHeld shuts a gate its caller holds, for good, and lets go of it.
func (g *Gate) ShutHeld() {
	g.v.Or(gateShut)
	g.Unhold()
}

// EnterWait is Enter for calls that wait out a holder rather than fail:
// it reports false only once the gate is shut. Holders keep the gate for a
// short scan (CQ.rekey), so the wait is a yield loop.
func (g *Gate) EnterWait() bool {
	for {
		if g.Enter() {
			return true
		}
		if g.IsShut() {
			return false
		}
		runtime.Gosched()
	}
}

// Shut refuses every call from now on, without waiting for the calls
// inside (Drain does): a closer with several gates shuts them all first.
// It reports whether this was the first Shut.
func (g *Gate) Shut() bool {
	return g.v.Or(gateShut)&gateShut == 0
}

// Inside reports how many calls are inside the gate now (for tests and
// diagnostics: it may change as soon as it is read).
func (g *Gate) Inside() int64 { return g.v.Load() &^ gateFlags }
