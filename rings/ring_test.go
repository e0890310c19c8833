package rings_test

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/rings"
)

// newState returns a zeroed ring-state page and the State at off in it.
func newState(t testing.TB, off int) ([]byte, *rings.State) {
	t.Helper()
	page := make([]byte, 4096)
	s, err := rings.NewState(page[off:])
	if err != nil {
		t.Fatal(err)
	}
	return page, s
}

// producerAt returns a Producer of n slots whose published prod_tail is tail.
func producerAt(t testing.TB, n int, tail uint32) (*rings.State, *rings.Producer) {
	t.Helper()
	_, s := newState(t, 0)
	s.SetProdTail(tail)
	p, err := rings.NewProducer(s, n)
	if err != nil {
		t.Fatal(err)
	}
	p.SetName("SQ")
	return s, p
}

// consumerAt returns a Consumer of n slots whose cons_head is head.
func consumerAt(t testing.TB, n int, head uint32) (*rings.State, *rings.Consumer) {
	t.Helper()
	_, s := newState(t, rings.StateOffsetRQ)
	s.SetConsHead(head)
	c, err := rings.NewConsumer(s, n)
	if err != nil {
		t.Fatal(err)
	}
	c.SetName("CQ")
	return s, c
}

var sizes = []int{1, 2, 64, 4096}

func TestStateLayout(t *testing.T) {
	page, sq := newState(t, rings.StateOffsetSQ)
	rq, err := rings.NewState(page[rings.StateOffsetRQ:])
	if err != nil {
		t.Fatal(err)
	}
	sq.SetProdTail(0x11223344)
	sq.SetConsHead(0x55667788)
	rq.SetProdTail(0x99aabbcc)
	rq.SetConsHead(0xddeeff00)
	want := []byte{
		0x44, 0x33, 0x22, 0x11, // SQ prod_tail @0
		0x88, 0x77, 0x66, 0x55, // SQ cons_head @4
		0xcc, 0xbb, 0xaa, 0x99, // RQ prod_tail @8
		0x00, 0xff, 0xee, 0xdd, // RQ cons_head @12
	}
	if got := page[:16]; string(got) != string(want) {
		t.Fatalf("state bytes = % x, want % x", got, want)
	}
	for i, b := range page[16:] {
		if b != 0 {
			t.Fatalf("byte %d written", 16+i)
		}
	}
	binary.LittleEndian.PutUint32(page[8:], 7)
	if rq.ProdTail() != 7 || sq.ConsHead() != 0x55667788 || rq.ConsHead() != 0xddeeff00 || sq.ProdTail() != 0x11223344 {
		t.Fatal("loads do not read the layout")
	}
}

func TestNewStateInvalid(t *testing.T) {
	buf := make([]byte, 32)
	for _, c := range []struct {
		name string
		mem  []byte
	}{
		{"nil", nil},
		{"short", buf[:7]},
		{"misaligned", buf[1:]},
		{"misaligned 2", buf[2:]},
	} {
		if _, err := rings.NewState(c.mem); !errors.Is(err, rings.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", c.name, err)
		}
	}
	if _, err := rings.NewState(buf[4:12]); err != nil {
		t.Errorf("4-aligned 8 bytes: %v", err)
	}
}

func TestNewInvalid(t *testing.T) {
	_, s := newState(t, 0)
	for _, n := range []int{0, -1, 3, 6, 100, rings.MaxSlots * 2, -rings.MaxSlots} {
		if _, err := rings.NewProducer(s, n); !errors.Is(err, rings.ErrInvalid) {
			t.Errorf("NewProducer(n=%d) err = %v", n, err)
		}
		if _, err := rings.NewConsumer(s, n); !errors.Is(err, rings.ErrInvalid) {
			t.Errorf("NewConsumer(n=%d) err = %v", n, err)
		}
	}
	if _, err := rings.NewProducer(nil, 4); !errors.Is(err, rings.ErrInvalid) {
		t.Errorf("NewProducer(nil) err = %v", err)
	}
	if _, err := rings.NewConsumer(nil, 4); !errors.Is(err, rings.ErrInvalid) {
		t.Errorf("NewConsumer(nil) err = %v", err)
	}
	// The driver's own counter already out of range for the ring.
	s.SetProdTail(8)
	if _, err := rings.NewProducer(s, 4); !errors.Is(err, rings.ErrInvalid) {
		t.Errorf("NewProducer over prod_tail 8, n=4: err = %v", err)
	}
	s.SetConsHead(8)
	if _, err := rings.NewConsumer(s, 4); !errors.Is(err, rings.ErrInvalid) {
		t.Errorf("NewConsumer over cons_head 8, n=4: err = %v", err)
	}
	for _, n := range []int{1, 2, rings.MaxSlots} {
		s.SetProdTail(0)
		s.SetConsHead(0)
		p, err := rings.NewProducer(s, n)
		if err != nil || p.Len() != n {
			t.Errorf("NewProducer(n=%d) = %v, %v", n, p, err)
		}
		c, err := rings.NewConsumer(s, n)
		if err != nil || c.Len() != n {
			t.Errorf("NewConsumer(n=%d) = %v, %v", n, c, err)
		}
	}
}

// heads returns the cons_head/prod_tail values to try against a ring of n:
// every counter value for small rings, the interesting ones and a sample for
// large rings, and values with bits outside 2n-1.
func counterValues(n int, rng *rand.Rand) []uint32 {
	var vs []uint32
	if n <= 64 {
		for v := range 2 * n {
			vs = append(vs, uint32(v))
		}
	} else {
		for _, v := range []int{0, 1, n - 1, n, n + 1, 2*n - 1} {
			vs = append(vs, uint32(v))
		}
		for range 64 {
			vs = append(vs, uint32(rng.IntN(2*n)))
		}
	}
	// Invalid: any bit outside 2n-1.
	for _, v := range []uint64{uint64(2 * n), uint64(2*n) + 1, uint64(4*n) - 1, 1 << 31, 0xffffffff, 0x80000000 | uint64(n-1)} {
		if v <= 0xffffffff {
			vs = append(vs, uint32(v))
		}
	}
	return vs
}

// TestProducerFree checks Free against the index model for every (published
// tail, device head) pair of small rings and a sample of large ones.
func TestProducerFree(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range sizes {
		mask := uint32(2*n - 1)
		for _, tail := range counterValues(n, rng) {
			if tail&^mask != 0 {
				continue // the driver's own counter is always valid
			}
			s, p := producerAt(t, n, tail)
			for _, head := range counterValues(n, rng) {
				s.SetConsHead(head)
				free, err := p.Free()
				inflight := (tail - head) & mask
				valid := head&^mask == 0 && inflight <= uint32(n)
				if !valid {
					checkIndexErr(t, err, "SQ", "cons_head", head, n)
					if free != 0 {
						t.Fatalf("n=%d tail=%d head=%d: Free = %d with error", n, tail, head, free)
					}
					continue
				}
				if err != nil || free != n-int(inflight) {
					t.Fatalf("n=%d tail=%d head=%d: Free = %d, %v; want %d", n, tail, head, free, err, n-int(inflight))
				}
				// Empty and full, spelled out.
				if head == tail && free != n {
					t.Fatalf("n=%d empty ring: Free = %d", n, free)
				}
				if head == tail^uint32(n) && free != 0 {
					t.Fatalf("n=%d full ring: Free = %d", n, free)
				}
			}
			if got := s.ProdTail(); got != tail {
				t.Fatalf("Free wrote prod_tail: %d -> %d", tail, got)
			}
		}
	}
}

// TestProducerUnpublished checks that written-but-unpublished elements
// count against Free and become visible only on Publish.
func TestProducerUnpublished(t *testing.T) {
	for _, n := range sizes {
		for _, start := range []uint32{0, uint32(n) - 1, uint32(n), uint32(2*n - 1)} {
			s, p := producerAt(t, n, start)
			s.SetConsHead(start)
			k := (n + 1) / 2
			p.Advance(k)
			if p.Unpublished() != k {
				t.Fatalf("Unpublished = %d, want %d", p.Unpublished(), k)
			}
			if free, err := p.Free(); err != nil || free != n-k {
				t.Fatalf("n=%d: Free after Advance(%d) = %d, %v", n, k, free, err)
			}
			if s.ProdTail() != start {
				t.Fatal("Advance published")
			}
			p.Advance(n - k)
			if free, err := p.Free(); err != nil || free != 0 {
				t.Fatalf("n=%d: Free with the whole ring unpublished = %d, %v", n, free, err)
			}
			p.Publish()
			want := (start + uint32(n)) & uint32(2*n-1)
			if s.ProdTail() != want || p.Unpublished() != 0 {
				t.Fatalf("n=%d: prod_tail after Publish = %d, want %d", n, s.ProdTail(), want)
			}
			if want != start^uint32(n) {
				t.Fatal("a full ring must differ from cons_head in the wrap bit only")
			}
			// A cons_head that moved past the published tail is a fault,
			// except at exactly n behind, which is the full ring.
			if free, err := p.Free(); err != nil || free != 0 {
				t.Fatalf("full ring: Free = %d, %v", free, err)
			}
			s.SetConsHead(want)
			if free, err := p.Free(); err != nil || free != n {
				t.Fatalf("drained ring: Free = %d, %v", free, err)
			}
		}
	}
}

// TestProducerNext walks the slot indices over several wraps.
func TestProducerNext(t *testing.T) {
	for _, n := range sizes {
		s, p := producerAt(t, n, 0)
		total := 0
		for total < 5*n+3 {
			free, err := p.Free()
			if err != nil {
				t.Fatal(err)
			}
			k := min(free, 1+total%7)
			for i := range k {
				if got, want := p.Next(i), (total+i)%n; got != want {
					t.Fatalf("n=%d: Next(%d) = %d after %d elements, want %d", n, i, got, total, want)
				}
			}
			p.Advance(k)
			if got, want := p.Next(0), (total+k)%n; got != want {
				t.Fatalf("n=%d: Next(0) after Advance = %d, want %d", n, got, want)
			}
			p.Publish()
			total += k
			if got, want := s.ProdTail(), uint32(total%(2*n)); got != want {
				t.Fatalf("n=%d: prod_tail = %d after %d elements, want %d", n, got, total, want)
			}
			s.SetConsHead(s.ProdTail()) // the device drains everything
		}
	}
}

func TestPublishNothingStoresNothing(t *testing.T) {
	s, p := producerAt(t, 8, 3)
	s.SetProdTail(0xdead) // would be overwritten by a store
	p.Publish()
	if s.ProdTail() != 0xdead {
		t.Fatal("Publish with nothing written stored prod_tail")
	}
}

func TestProducerReset(t *testing.T) {
	s, p := producerAt(t, 16, 5)
	s.SetConsHead(2)
	p.Advance(3)
	p.Reset()
	if s.ProdTail() != 0 || s.ConsHead() != 0 || p.Unpublished() != 0 || p.Next(0) != 0 {
		t.Fatalf("after Reset: prod_tail %d cons_head %d unpublished %d next %d", s.ProdTail(), s.ConsHead(), p.Unpublished(), p.Next(0))
	}
	if free, err := p.Free(); err != nil || free != 16 {
		t.Fatalf("Free after Reset = %d, %v", free, err)
	}
}

func TestProducerAdvancePanics(t *testing.T) {
	for _, c := range []struct {
		name string
		f    func(p *rings.Producer)
	}{
		{"negative", func(p *rings.Producer) { p.Advance(-1) }},
		{"past n", func(p *rings.Producer) { p.Advance(5) }},
		{"past n in two", func(p *rings.Producer) { p.Advance(3); p.Advance(2) }},
	} {
		_, p := producerAt(t, 4, 0)
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", c.name)
				}
			}()
			c.f(p)
		}()
	}
}

// TestConsumerReady checks Ready against the index model for every (head,
// device tail) pair of small rings and a sample of large ones, and that an
// invalid tail changes nothing.
func TestConsumerReady(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range sizes {
		mask := uint32(2*n - 1)
		for _, head := range counterValues(n, rng) {
			if head&^mask != 0 {
				continue
			}
			s, c := consumerAt(t, n, head)
			for _, tail := range counterValues(n, rng) {
				s.SetProdTail(tail)
				ready, err := c.Ready()
				avail := (tail - head) & mask
				valid := tail&^mask == 0 && avail <= uint32(n)
				if !valid {
					checkIndexErr(t, err, "CQ", "prod_tail", tail, n)
					if ready != 0 {
						t.Fatalf("n=%d: Ready = %d with error", n, ready)
					}
				} else if err != nil || ready != int(avail) {
					t.Fatalf("n=%d head=%d tail=%d: Ready = %d, %v; want %d", n, head, tail, ready, err, avail)
				}
				if head == tail && ready != 0 || valid && tail == head^uint32(n) && ready != n {
					t.Fatalf("n=%d head=%d tail=%d: empty/full misread: %d", n, head, tail, ready)
				}
				if s.ConsHead() != head || c.Slot(0) != int(head)&(n-1) {
					t.Fatalf("Ready moved cons_head")
				}
			}
		}
	}
}

// TestConsumerInvalidConsumesNothing: after a fault, Consume of anything
// beyond what a valid Ready reported panics, and the state is unchanged.
func TestConsumerInvalidConsumesNothing(t *testing.T) {
	s, c := consumerAt(t, 8, 0)
	s.SetProdTail(100)
	n, err := c.Ready()
	require.ErrorIs(t, err, rings.ErrDeviceFault)
	require.Zero(t, n, "Ready after a fault")
	assert.Panics(t, func() { c.Consume(1) }, "Consume(1) after a faulted Ready")
	assert.Zero(t, s.ConsHead(), "cons_head moved")
}

// TestConsumerSequence drives a consumer through several wraps against a
// device model that produces random batches, checking slots and contents.
func TestConsumerSequence(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, n := range sizes {
		s, c := consumerAt(t, n, 0)
		data := make([]uint64, n) // the ring's elements
		produced, consumed := 0, 0
		for consumed < 6*n+5 {
			// Device: fill some of the free slots, then publish.
			room := n - (produced - consumed)
			k := rng.IntN(room + 1)
			for i := range k {
				data[(produced+i)%n] = uint64(produced + i)
			}
			produced += k
			s.SetProdTail(uint32(produced % (2 * n)))
			// Driver.
			ready, err := c.Ready()
			if err != nil || ready != produced-consumed {
				t.Fatalf("n=%d: Ready = %d, %v; want %d", n, ready, err, produced-consumed)
			}
			take := rng.IntN(ready + 1)
			for i := range take {
				if got := data[c.Slot(i)]; got != uint64(consumed+i) {
					t.Fatalf("n=%d: element %d read %d", n, consumed+i, got)
				}
			}
			c.Consume(take)
			consumed += take
			if got, want := s.ConsHead(), uint32(consumed%(2*n)); got != want {
				t.Fatalf("n=%d: cons_head = %d, want %d", n, got, want)
			}
		}
	}
}

func TestConsumeZeroStoresNothing(t *testing.T) {
	s, c := consumerAt(t, 8, 3)
	s.SetConsHead(0xbeef)
	c.Consume(0)
	if s.ConsHead() != 0xbeef {
		t.Fatal("Consume(0) stored cons_head")
	}
}

func TestConsumePanics(t *testing.T) {
	for _, k := range []int{-1, 3, 9} {
		s, c := consumerAt(t, 8, 0)
		s.SetProdTail(2)
		if _, err := c.Ready(); err != nil {
			t.Fatal(err)
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Consume(%d) with 2 ready did not panic", k)
				}
			}()
			c.Consume(k)
		}()
	}
	// Consumed in parts, then one too many.
	s, c := consumerAt(t, 8, 0)
	s.SetProdTail(2)
	if _, err := c.Ready(); err != nil {
		t.Fatal(err)
	}
	c.Consume(1)
	c.Consume(1)
	defer func() {
		if recover() == nil {
			t.Error("third Consume(1) with 2 ready did not panic")
		}
	}()
	c.Consume(1)
}

func TestConsumerReset(t *testing.T) {
	s, c := consumerAt(t, 8, 6)
	s.SetProdTail(9)
	if _, err := c.Ready(); err != nil {
		t.Fatal(err)
	}
	c.Consume(2)
	c.Reset()
	if s.ConsHead() != 0 || s.ProdTail() != 0 || c.Slot(0) != 0 {
		t.Fatal("Reset left counters")
	}
	if n, err := c.Ready(); n != 0 || err != nil {
		t.Fatalf("Ready after Reset = %d, %v", n, err)
	}
}

// TestProducerConsumerPair runs a Producer and a Consumer over one State
// (driver and device model) through many wraps, with a published-but-not-
// drained window, to check the two sides agree on every slot.
func TestProducerConsumerPair(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, n := range sizes {
		_, s := newState(t, 0)
		p, err := rings.NewProducer(s, n)
		if err != nil {
			t.Fatal(err)
		}
		c, err := rings.NewConsumer(s, n)
		if err != nil {
			t.Fatal(err)
		}
		ring := make([]uint64, n)
		var next, want uint64
		for want < uint64(8*n+11) {
			free, err := p.Free()
			if err != nil {
				t.Fatal(err)
			}
			k := rng.IntN(free + 1)
			for i := range k {
				ring[p.Next(i)] = next
				next++
			}
			p.Advance(k)
			if rng.IntN(4) != 0 {
				p.Publish()
			}
			ready, err := c.Ready()
			if err != nil {
				t.Fatal(err)
			}
			if ready != int(next-want)-p.Unpublished() {
				t.Fatalf("n=%d: Ready %d, written %d, unpublished %d", n, ready, next-want, p.Unpublished())
			}
			take := rng.IntN(ready + 1)
			for i := range take {
				if got := ring[c.Slot(i)]; got != want {
					t.Fatalf("n=%d: read %d, want %d", n, got, want)
				}
				want++
			}
			c.Consume(take)
		}
	}
}

func checkIndexErr(t *testing.T, err error, ring, field string, v uint32, n int) {
	t.Helper()
	require.ErrorIs(t, err, rings.ErrDeviceFault, "n=%d %s=%#x", n, field, v)
	var ie *rings.IndexError
	require.ErrorAs(t, err, &ie)
	want := rings.IndexError{Ring: ring, Field: field, Value: v, Slots: uint32(n), Peer: ie.Peer}
	require.Equal(t, want, *ie)
}

func TestIndexErrorMessage(t *testing.T) {
	s, c := consumerAt(t, 64, 10)
	s.SetProdTail(200)
	_, err := c.Ready()
	assert.EqualError(t, err, "rings: CQ: device wrote prod_tail 0xc8 with bits outside 0x7f (64 slots): pvrdma: device fault", "bits error")
	s.SetProdTail(80)
	_, err = c.Ready()
	assert.EqualError(t, err, "rings: CQ: device wrote prod_tail 0x50, more than 64 slots from cons_head 0xa: pvrdma: device fault", "distance error")
	ps, p := producerAt(t, 64, 10)
	p.SetName("SQ 7")
	ps.SetConsHead(12) // ahead of everything published
	_, err = p.Free()
	assert.EqualError(t, err, "rings: SQ 7: device wrote cons_head 0xc, more than 64 slots from prod_tail 0xa: pvrdma: device fault", "producer error")
}
