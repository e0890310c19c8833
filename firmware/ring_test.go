package firmware

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/mmio"
)

// testRing is a device ring in plain memory with a producer for tests.
type testRing struct {
	state []byte
	regs  Regs
	data  [][]byte
}

func newTestRing(t testing.TB, npages int) *testRing {
	t.Helper()
	r := &testRing{state: make([]byte, PageSize)}
	for i := range r.state {
		r.state[i] = 0xCC // counters must be zeroed by the constructor
	}
	regs, err := mmio.New(r.state)
	if err != nil {
		t.Fatal(err)
	}
	r.regs = regs
	for range npages {
		r.data = append(r.data, make([]byte, PageSize))
	}
	return r
}

func (r *testRing) tail() uint32     { return le.Uint32(r.state[8:]) }
func (r *testRing) head() uint32     { return le.Uint32(r.state[12:]) }
func (r *testRing) setTail(v uint32) { le.PutUint32(r.state[8:], v) }

// produce writes an element the device's way and advances prod_tail.
func (r *testRing) produce(n uint32, elem []byte) {
	t := r.tail()
	off := (t & (n - 1)) * uint32(len(elem))
	copy(r.data[off/PageSize][off%PageSize:], elem)
	r.setTail((t + 1) & (2*n - 1))
}

func TestCQNotifyRing(t *testing.T) {
	tr := newTestRing(t, 1)
	c, err := NewCQNotifyRing(tr.regs, tr.data)
	if err != nil {
		t.Fatal(err)
	}
	if tr.tail() != 0 || tr.head() != 0 {
		t.Fatal("counters not zeroed")
	}
	if le.Uint32(tr.state[0:]) != 0xCCCCCCCC {
		t.Fatal("touched the tx state at offset 0")
	}
	n := uint32(c.Slots())
	if n != 1024 {
		t.Fatalf("slots %d", n)
	}
	buf := make([]uint32, 100)
	if k, err := c.Poll(buf); k != 0 || err != nil {
		t.Fatalf("empty ring: %d, %v", k, err)
	}
	// Go around the ring several times, through the wrap bit.
	next, want := uint32(0), uint32(0)
	for round := range 5000 {
		burst := uint32(round%37 + 1)
		for range burst {
			var e [4]byte
			le.PutUint32(e[:], next&HandleMask)
			tr.produce(n, e[:])
			next++
		}
		for got := uint32(0); got < burst; {
			k, err := c.Poll(buf)
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range buf[:k] {
				if h != want&HandleMask {
					t.Fatalf("got handle %d, want %d", h, want)
				}
				want++
			}
			got += uint32(k)
		}
		if tr.head() != tr.tail() {
			t.Fatalf("cons_head %d != prod_tail %d", tr.head(), tr.tail())
		}
	}
	// A full ring: N elements, prod_tail == cons_head ^ N.
	for range n {
		tr.produce(n, []byte{1, 0, 0, 0})
	}
	if tr.tail() != tr.head()^n {
		t.Fatal("not full")
	}
	big := make([]uint32, 2*n)
	if k, err := c.Poll(big); k != int(n) || err != nil {
		t.Fatalf("full ring: %d, %v", k, err)
	}
}

func TestAsyncRing(t *testing.T) {
	tr := newTestRing(t, 2)
	a, err := NewAsyncRing(tr.regs, tr.data)
	if err != nil {
		t.Fatal(err)
	}
	n := uint32(a.Slots())
	if n != 1024 {
		t.Fatalf("slots %d", n)
	}
	evs := make([]AsyncEvent, 3)
	for i := range uint32(2*n + 5) {
		var e [8]byte
		le.PutUint32(e[0:], i%25)
		le.PutUint32(e[4:], i)
		tr.produce(n, e[:])
		k, err := a.Poll(evs)
		if err != nil || k != 1 || evs[0] != (AsyncEvent{Type: EventType(i % 25), Info: i}) {
			t.Fatalf("event %d: %d, %v, %+v", i, k, err, evs[0])
		}
	}
	if EventSRQLimitReached.String() != "SRQ_LIMIT_REACHED" || EventType(24).String() != "EVENT_24" {
		t.Error("event names")
	}
}

func TestDeviceRingFaults(t *testing.T) {
	tr := newTestRing(t, 1)
	c, err := NewCQNotifyRing(tr.regs, tr.data)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]uint32, 8)
	for _, tail := range []uint32{2048, 4096, 0xFFFFFFFF} {
		tr.setTail(tail)
		k, err := c.Poll(buf)
		var fe *FieldError
		if k != 0 || !errors.Is(err, ErrDeviceFault) || !errors.As(err, &fe) || fe.Field != "prod_tail" {
			t.Errorf("tail %#x: %d, %v", tail, k, err)
		}
		if tr.head() != 0 {
			t.Errorf("tail %#x consumed something", tail)
		}
	}
	// Valid range but further ahead than the ring holds: 1025 of 1024.
	tr.setTail(1025)
	if _, err := c.Poll(buf); !errors.Is(err, ErrDeviceFault) {
		t.Errorf("overrun: %v", err)
	}
	// A handle that no doorbell can name: consumed and reported.
	tr.setTail(0)
	tr.produce(1024, []byte{7, 0, 0, 0})
	tr.produce(1024, []byte{0, 0, 0, 1})
	tr.produce(1024, []byte{9, 0, 0, 0})
	k, err := c.Poll(buf)
	if k != 1 || buf[0] != 7 || !errors.Is(err, ErrDeviceFault) {
		t.Errorf("bad handle: %d, %v", k, err)
	}
	if k, err := c.Poll(buf); k != 1 || buf[0] != 9 || err != nil {
		t.Errorf("after the bad handle: %d %v %v", k, buf[0], err)
	}
}

func TestDeviceRingInvalid(t *testing.T) {
	tr := newTestRing(t, 3)
	if _, err := NewCQNotifyRing(tr.regs, tr.data); !errors.Is(err, ErrInvalid) {
		t.Errorf("3 data pages: %v", err)
	}
	if _, err := NewAsyncRing(tr.regs, nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("no data pages: %v", err)
	}
	if _, err := NewAsyncRing(nil, tr.data[:1]); !errors.Is(err, ErrInvalid) {
		t.Errorf("no state: %v", err)
	}
	if _, err := NewAsyncRing(tr.regs, [][]byte{make([]byte, 100)}); !errors.Is(err, ErrInvalid) {
		t.Errorf("short page: %v", err)
	}
	short, _ := mmio.New(make([]byte, 8))
	if _, err := NewAsyncRing(short, tr.data[:1]); err == nil {
		t.Error("state region too small for the rx state: no error")
	}
}

func TestDeviceRingPollAllocs(t *testing.T) {
	tr := newTestRing(t, 1)
	c, _ := NewCQNotifyRing(tr.regs, tr.data)
	a, _ := NewAsyncRing(newTestRing(t, 1).regs, tr.data)
	buf := make([]uint32, 4)
	evs := make([]AsyncEvent, 4)
	allocs := testing.AllocsPerRun(100, func() {
		tr.produce(1024, []byte{3, 0, 0, 0})
		if _, err := c.Poll(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Poll(evs); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Poll allocates %v times", allocs)
	}
}

// Pending counts the events written past cons_head without consuming any:
// up to a full ring, N of N slots; a prod_tail one further ahead is a
// device fault.
func TestAsyncRingPendingCountsWithoutConsuming(t *testing.T) {
	tr := newTestRing(t, 1)
	a, err := NewAsyncRing(tr.regs, tr.data)
	require.NoError(t, err)
	n := uint32(a.Slots())
	k, err := a.Pending()
	require.NoError(t, err)
	assert.Zero(t, k)
	for range 3 {
		tr.produce(n, make([]byte, AsyncEventSize))
	}
	k, err = a.Pending()
	require.NoError(t, err)
	assert.Equal(t, 3, k)
	assert.Zero(t, tr.head(), "nothing consumed")
	got, err := a.Poll(make([]AsyncEvent, 2))
	require.NoError(t, err)
	require.Equal(t, 2, got)
	k, err = a.Pending()
	require.NoError(t, err)
	assert.Equal(t, 1, k)

	for range n - 1 {
		tr.produce(n, make([]byte, AsyncEventSize))
	}
	k, err = a.Pending()
	require.NoError(t, err)
	assert.Equal(t, int(n), k, "a full ring")
	tr.setTail((tr.head() + n + 1) & (2*n - 1))
	_, err = a.Pending()
	assert.ErrorIs(t, err, ErrDeviceFault, "one past a full ring")
}

// A CQ handle has 24 bits: a notification naming HandleMask itself is a
// handle like any other, HandleMask+1 a device fault (consumed, with the
// handles before it returned).
func TestACQNotificationOfHandleMaskIsTakenAndOneMoreIsAFault(t *testing.T) {
	tr := newTestRing(t, 1)
	c, err := NewCQNotifyRing(tr.regs, tr.data)
	require.NoError(t, err)
	buf := make([]uint32, 8)
	elem := func(h uint32) []byte { return le.AppendUint32(nil, h) }
	tr.produce(1024, elem(HandleMask))
	tr.produce(1024, elem(HandleMask+1))
	tr.produce(1024, elem(5))
	k, err := c.Poll(buf)
	require.ErrorIs(t, err, ErrDeviceFault, "HandleMask+1")
	require.Equal(t, 1, k)
	assert.Equal(t, uint32(HandleMask), buf[0])
	k, err = c.Poll(buf)
	require.NoError(t, err)
	assert.Equal(t, []uint32{5}, buf[:k], "the fault was consumed")
}
