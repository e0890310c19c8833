package rings

// checkSlots validates an element count and returns it with its counter mask
// 2n−1.
func checkSlots(n int) (uint32, uint32, error) {
	if n < 1 || n > MaxSlots || n&(n-1) != 0 {
		return 0, 0, invalidf("%d ring slots, want a power of two from 1 to %d", n, MaxSlots)
	}
	return uint32(n), uint32(2*n - 1), nil
}

// Producer is the driver's side of a ring the driver fills and the device
// drains: a QP send or receive queue, or an SRQ.
//
// The caller asks for room with Free, writes element bodies at the slots
// Next names, records them with Advance, and makes them visible to the device
// with Publish (one atomic store of prod_tail), then rings the doorbell. The
// device owns cons_head; Free reads it once per call and validates it.
//
// A Producer is single-owner: it is not safe for concurrent use.
type Producer struct {
	s     *State
	n     uint32 // element count, a power of two
	mask  uint32 // 2n-1
	tail  uint32 // local prod_tail: everything written
	pub   uint32 // prod_tail as last stored: everything published
	unpub int    // written but not published: (tail-pub)&mask
	name  string
}

// NewProducer returns the producer of an n-element ring (n a power of two,
// 1 ≤ n ≤ MaxSlots) whose counters are s. It writes nothing: it takes the
// current prod_tail as its starting point (zero in a freshly zeroed page),
// which must be a valid counter.
func NewProducer(s *State, n int) (*Producer, error) {
	if s == nil {
		return nil, invalidf("nil ring state")
	}
	un, mask, err := checkSlots(n)
	if err != nil {
		return nil, err
	}
	tail := s.ProdTail()
	if tail&^mask != 0 {
		return nil, invalidf("prod_tail %#x is not a counter of a %d-slot ring", tail, n)
	}
	return &Producer{s: s, n: un, mask: mask, tail: tail, pub: tail, name: "producer ring"}, nil
}

// SetName sets the ring name that errors carry ("SQ", "RQ", "SRQ 3", ...).
func (p *Producer) SetName(name string) { p.name = name }

// Len returns the ring's element count n.
func (p *Producer) Len() int { return int(p.n) }

// Free reads cons_head once and returns how many more elements may be
// written: n minus those the device has not consumed yet, minus those
// written but not yet published.
//
// A cons_head with bits outside 2n−1, or more than n behind the published
// prod_tail (which includes a cons_head ahead of anything published: the
// device cannot consume what it was not shown), is an *IndexError wrapping
// [ErrDeviceFault], and Free returns 0 with it.
func (p *Producer) Free() (int, error) {
	head := p.s.ConsHead()
	inflight := (p.pub - head) & p.mask
	if head&^p.mask != 0 || inflight > p.n {
		return 0, p.fault(head)
	}
	return max(int(p.n-inflight)-p.unpub, 0), nil
}

//go:noinline
func (p *Producer) fault(head uint32) error {
	return &IndexError{Ring: p.name, Field: "cons_head", Value: head, Slots: p.n, Peer: p.pub}
}

// Next returns the slot index (0 … n−1) of the i-th element after everything
// already written: Next(0) is the slot the next element goes to.
func (p *Producer) Next(i int) int { return int((p.tail + uint32(i)) & (p.n - 1)) }

// Advance records that k more elements were written at Next(0) … Next(k−1).
// It is local: the device sees them only after Publish. k must not exceed
// what Free allowed; a k that is negative or would leave more than n
// elements unpublished panics.
func (p *Producer) Advance(k int) {
	if k < 0 || k > int(p.n)-p.unpub {
		panic("rings: Producer.Advance past the ring size")
	}
	p.tail = (p.tail + uint32(k)) & p.mask
	p.unpub += k
}

// Unpublished returns how many elements were written but not published.
func (p *Producer) Unpublished() int { return p.unpub }

// Publish makes everything written visible to the device with one atomic
// store of prod_tail. The store is ordered after every earlier store to the
// element bodies (sync/atomic stores are release stores: on amd64 an XCHG,
// which is a full barrier; on arm64 an STLR). With nothing unpublished it
// stores nothing.
func (p *Producer) Publish() {
	if p.unpub == 0 {
		return
	}
	p.pub = p.tail
	p.unpub = 0
	p.s.SetProdTail(p.tail)
}

// Reset zeroes both counters in the ring state and the local ones, as the
// drivers do when a QP returns to RESET. The device must not be using the
// ring (it does not process a QP in RESET), since Reset writes cons_head,
// which the device otherwise owns.
func (p *Producer) Reset() {
	p.tail, p.pub, p.unpub = 0, 0, 0
	p.s.SetProdTail(0)
	p.s.SetConsHead(0)
}

// Consumer is the driver's side of a ring the device fills and the driver
// drains: a CQ (and, in device models, the device's side of a send queue).
//
// The caller reads the device's prod_tail with Ready (once per poll), reads
// the bodies at the slots Slot names, then hands the slots back with Consume
// (one atomic store of cons_head).
//
// A Consumer is single-owner: it is not safe for concurrent use.
type Consumer struct {
	s     *State
	n     uint32
	mask  uint32
	head  uint32 // cons_head, owned by this side
	avail int    // elements Ready reported and not yet consumed
	name  string
}

// NewConsumer returns the consumer of an n-element ring (n a power of two,
// 1 ≤ n ≤ MaxSlots) whose counters are s. It writes nothing: it takes the
// current cons_head as its starting point (zero in a freshly zeroed page),
// which must be a valid counter.
func NewConsumer(s *State, n int) (*Consumer, error) {
	if s == nil {
		return nil, invalidf("nil ring state")
	}
	un, mask, err := checkSlots(n)
	if err != nil {
		return nil, err
	}
	head := s.ConsHead()
	if head&^mask != 0 {
		return nil, invalidf("cons_head %#x is not a counter of a %d-slot ring", head, n)
	}
	return &Consumer{s: s, n: un, mask: mask, head: head, name: "consumer ring"}, nil
}

// SetName sets the ring name that errors carry ("CQ 2", ...).
func (c *Consumer) SetName(name string) { c.name = name }

// Len returns the ring's element count n.
func (c *Consumer) Len() int { return int(c.n) }

// Ready reads prod_tail once and returns how many elements are available
// from Slot(0) on. Read element bodies only after Ready, never before.
//
// A prod_tail with bits outside 2n−1, or more than n ahead of cons_head, is
// an *IndexError wrapping [ErrDeviceFault]; Ready then returns 0 and
// changes nothing.
func (c *Consumer) Ready() (int, error) {
	tail := c.s.ProdTail()
	d := (tail - c.head) & c.mask
	if tail&^c.mask != 0 || d > c.n {
		return 0, c.fault(tail)
	}
	c.avail = int(d)
	return int(d), nil
}

//go:noinline
func (c *Consumer) fault(tail uint32) error {
	return &IndexError{Ring: c.name, Field: "prod_tail", Value: tail, Slots: c.n, Peer: c.head}
}

// Slot returns the slot index (0 … n−1) of the i-th available element.
func (c *Consumer) Slot(i int) int { return int((c.head + uint32(i)) & (c.n - 1)) }

// Consume hands the first k available elements back to the device with one
// atomic store of cons_head (none for k = 0). Finish reading their bodies
// first: the device may overwrite them as soon as the store lands. k must be
// at most what the last Ready reported minus what was consumed since; more,
// or a negative k, panics.
func (c *Consumer) Consume(k int) {
	if uint(k) > uint(c.avail) {
		panic("rings: Consumer.Consume of more elements than Ready reported")
	}
	if k == 0 {
		return
	}
	c.avail -= k
	c.head = (c.head + uint32(k)) & c.mask
	c.s.SetConsHead(c.head)
}

// Reset zeroes both counters in the ring state and the local ones. The
// device must not be using the ring.
func (c *Consumer) Reset() {
	c.head, c.avail = 0, 0
	c.s.SetProdTail(0)
	c.s.SetConsHead(0)
}
