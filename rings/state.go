package rings

import "sync/atomic"

// Ring-state layout (pvrdma_ring.h: struct pvrdma_ring, struct
// pvrdma_ring_state).
const (
	// StateSize is the size of one ring state: two 32-bit counters.
	StateSize = 8
	// ProdTailOffset and ConsHeadOffset locate the counters in a state.
	ProdTailOffset = 0
	ConsHeadOffset = 4
	// StateOffsetSQ is where a QP's send-queue state sits in its
	// ring-state page (the "tx" half).
	StateOffsetSQ = 0
	// StateOffsetRQ is where every other ring keeps its state in the
	// ring-state page (the "rx" half): a QP's receive queue, a CQ, an SRQ,
	// and the DSR's device rings.
	StateOffsetRQ = 8
)

// MaxSlots is the largest element count a ring may have: the counters run to
// 2n−1, which must fit in 32 bits.
const MaxSlots = 1 << 31

// State is one ring's 8-byte state in DMA memory: prod_tail (u32 at 0) and
// cons_head (u32 at 4). The driver and the device both access it, each
// counter only through single aligned 32-bit atomic loads and stores. Its
// methods are safe for concurrent use.
type State struct {
	prod *uint32
	cons *uint32
}

// NewState returns the State over the first 8 bytes of mem, which must be
// 4-byte aligned (a page-aligned ring-state page at offset 0 or 8 is). mem
// must stay mapped for as long as the State is used. NewState writes
// nothing: zero the counters before the device object is created.
func NewState(mem []byte) (*State, error) {
	if len(mem) < StateSize {
		return nil, invalidf("ring state of %d bytes, want at least %d", len(mem), StateSize)
	}
	if misaligned4(mem) {
		return nil, invalidf("ring state is not 4-byte aligned")
	}
	p, c := counters(mem)
	return &State{prod: p, cons: c}, nil
}

// ProdTail loads prod_tail with one atomic 32-bit load.
func (s *State) ProdTail() uint32 { return atomic.LoadUint32(s.prod) }

// ConsHead loads cons_head with one atomic 32-bit load.
func (s *State) ConsHead() uint32 { return atomic.LoadUint32(s.cons) }

// SetProdTail stores prod_tail with one atomic 32-bit store. Drivers use
// Producer.Publish; this is for device models, tests and resets.
func (s *State) SetProdTail(v uint32) { atomic.StoreUint32(s.prod, v) }

// SetConsHead stores cons_head with one atomic 32-bit store. Drivers use
// Consumer.Consume; this is for device models, tests and resets.
func (s *State) SetConsHead(v uint32) { atomic.StoreUint32(s.cons, v) }
