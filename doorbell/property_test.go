package doorbell_test

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/vfrdma/vfrdma/doorbell"
)

// model is a device and a ring behind a Queue: it sees publishes and
// doorbell stores in order and drains, on each doorbell, everything
// published, as QEMU does.
type model struct {
	t         testing.TB
	written   int   // WQEs the poster wrote (sum of Added)
	published int   // prod_tail as last published
	drained   int   // WQEs handed to the device
	handed    []int // times each WQE was handed over
	lastPub   bool  // the previous event was a publish
	failNext  bool
	doorbells int
}

func (m *model) Publish() {
	if m.published > m.written {
		m.t.Fatalf("published %d > written %d", m.published, m.written)
	}
	m.published = m.written
	m.lastPub = true
}

func (m *model) Store32(off int, v uint32) error {
	if off != doorbell.OffsetQP || v != qpValue {
		m.t.Fatalf("store(%#x, %#x)", off, v)
	}
	if !m.lastPub {
		m.t.Fatal("doorbell not immediately preceded by a publish")
	}
	if m.published != m.written {
		m.t.Fatalf("doorbell with %d written but only %d published", m.written, m.published)
	}
	m.lastPub = false
	if m.failNext {
		m.failNext = false
		return errStore
	}
	if m.published == m.drained {
		m.t.Fatal("doorbell with nothing new to drain")
	}
	for i := m.drained; i < m.published; i++ {
		m.handed[i]++
	}
	m.drained = m.published
	m.doorbells++
	return nil
}

// checkSequence runs ops (one byte per operation) against a Queue and the
// model, checking after each step:
//   - Added and deferred posts write nothing;
//   - Post(false), Fail and Ring write nothing when nothing is pending, and
//     otherwise exactly one publish followed by one doorbell, after which
//     nothing is pending (unless the store failed: then everything stays
//     pending and the next ring retries);
//   - the Queue's Pending and Stats agree with the model;
//
// and at the end, after a final Ring, that every WQE was handed to the
// device exactly once.
func checkSequence(t testing.TB, ops []byte) {
	m := &model{t: t}
	q, err := doorbell.NewQueue(m, doorbell.OffsetQP, qpValue, m)
	if err != nil {
		t.Fatal(err)
	}
	var want doorbell.Stats
	step := func(op byte) {
		before, drainedBefore := m.doorbells, m.drained
		pendingBefore := m.written - m.drained
		fail := op&0x80 != 0 && pendingBefore > 0
		m.failNext = fail
		var err error
		ring := false // this op should publish and ring
		switch op % 6 {
		case 0, 1:
			k := 1 + int(op>>3)%4
			m.written += k
			m.handed = append(m.handed, make([]int, k)...)
			q.Added(k)
			m.failNext = false
			fail = false
		case 2:
			err = q.Post(true)
			want.Posts++
			want.DeferredPosts++
			fail = false
			m.failNext = false
		case 3:
			err = q.Post(false)
			want.Posts++
			ring = pendingBefore > 0
		case 4:
			err = q.Fail()
			want.FailedPosts++
			ring = pendingBefore > 0
		case 5:
			err = q.Ring()
			ring = pendingBefore > 0
			if ring && !fail {
				want.Rings++
			}
		}
		if fail != errors.Is(err, errStore) || !fail && err != nil {
			t.Fatalf("op %d: err = %v, store failure injected: %v", op, err, fail)
		}
		switch {
		case ring && !fail:
			if m.doorbells != before+1 || m.drained != m.written {
				t.Fatalf("op %d: %d doorbells (want 1), drained %d of %d", op, m.doorbells-before, m.drained, m.written)
			}
			want.Doorbells++
			want.WQEs += uint64(pendingBefore)
		default:
			if m.doorbells != before || m.drained != drainedBefore {
				t.Fatalf("op %d: handed WQEs to the device", op)
			}
		}
		if q.Pending() != m.written-m.drained {
			t.Fatalf("op %d: Pending %d, model %d", op, q.Pending(), m.written-m.drained)
		}
		if got := q.Stats(); got != want {
			t.Fatalf("op %d: stats %+v, want %+v", op, got, want)
		}
	}
	for _, op := range ops {
		step(op)
	}
	step(5) // Ring
	if m.drained != m.written {
		t.Fatalf("after Ring: drained %d of %d", m.drained, m.written)
	}
	for i, n := range m.handed {
		if n != 1 {
			t.Fatalf("WQE %d handed to the device %d times", i, n)
		}
	}
}

func TestQueueProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for range 3000 {
		ops := make([]byte, rng.IntN(64))
		for i := range ops {
			ops[i] = byte(rng.Uint32())
		}
		checkSequence(t, ops)
	}
}

func FuzzQueue(f *testing.F) {
	f.Add([]byte{0, 2, 0, 2, 0, 3})
	f.Add([]byte{0, 2, 8, 4, 5, 5})
	f.Add([]byte{0, 0x83, 5, 0x85, 0x84, 3})
	f.Fuzz(func(t *testing.T, ops []byte) { checkSequence(t, ops) })
}
