package vmxnet3

import "sync/atomic"

// gate counts the calls that may touch the NIC's device memory (its DMA
// memory and BARs) and lets Close wait for them before it frees that
// memory, as os.File's descriptor reference count does: Close marks the
// gate shut, after which every call that tries to enter is refused, then
// waits until the calls already inside have left.
//
// Entering and leaving is one atomic add each and never allocates. The NIC
// has one gate per side (transmit, receive, control) on cache lines of
// their own, so that a sender and a receiver on two CPUs do not share one.
type gate struct {
	state atomic.Int64 // calls inside; plus gateShut once Close has begun
	// idle is signalled by the last call to leave a shut gate. Buffered:
	// the signal waits for Close if it comes first.
	idle chan struct{}
	_    [48]byte // the rest of a 64-byte cache line
}

const gateShut = 1 << 62

func (g *gate) init() { g.idle = make(chan struct{}, 1) }

// enter reports whether the caller may go in; if so it must call leave.
func (g *gate) enter() bool {
	if g.state.Add(1)&gateShut != 0 {
		g.leave()
		return false
	}
	return true
}

// leave lets Close go on once the last call inside a shut gate is out.
func (g *gate) leave() {
	if g.state.Add(-1) == gateShut {
		select {
		case g.idle <- struct{}{}:
		default:
		}
	}
}

// shut refuses every call from now on. It reports whether the gate was
// open (the first shut).
func (g *gate) shut() bool {
	for {
		s := g.state.Load()
		if s&gateShut != 0 {
			return false
		}
		if g.state.CompareAndSwap(s, s|gateShut) {
			return true
		}
	}
}

// drain waits, after shut, until no call is inside.
func (g *gate) drain() {
	for g.state.Load() != gateShut {
		<-g.idle
	}
}

// isShut reports whether Close has begun.
func (g *gate) isShut() bool { return g.state.Load()&gateShut != 0 }
