package doorbell_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/mmio"
	"github.com/vfrdma/vfrdma/rings"
)

// The real types satisfy the interfaces.
var (
	_ doorbell.Register  = (*mmio.Region)(nil)
	_ doorbell.Publisher = (*rings.Producer)(nil)
)

// event is one thing the fakes saw, in order.
type event struct {
	publish bool   // a Publish (else a doorbell store)
	off     int    // store offset
	val     uint32 // store value
	err     bool   // the store failed
}

func (e event) String() string {
	if e.publish {
		return "publish"
	}
	return fmt.Sprintf("store(%#x, %#x, failed=%v)", e.off, e.val, e.err)
}

// bench is a fake Register and Publisher sharing one event log.
type bench struct {
	log      []event
	failNext int // fail this many upcoming stores
}

type fakeReg struct{ b *bench }

var errStore = errors.New("store failed")

func (r fakeReg) Store32(off int, v uint32) error {
	if r.b.failNext > 0 {
		r.b.failNext--
		r.b.log = append(r.b.log, event{off: off, val: v, err: true})
		return errStore
	}
	r.b.log = append(r.b.log, event{off: off, val: v})
	return nil
}

type fakePub struct{ b *bench }

func (p fakePub) Publish() { p.b.log = append(p.b.log, event{publish: true}) }

const qpValue = doorbell.QPSend | 0x1234

func newQueue(t testing.TB) (*bench, *doorbell.Queue) {
	t.Helper()
	b := &bench{}
	q, err := doorbell.NewQueue(fakeReg{b}, doorbell.OffsetQP, qpValue, fakePub{b})
	if err != nil {
		t.Fatal(err)
	}
	return b, q
}

// wantLog checks the events since mark: n rings, each a publish followed by
// a store of the queue's doorbell.
func wantRings(t *testing.T, b *bench, mark, n int, what string) {
	t.Helper()
	got := b.log[mark:]
	if len(got) != 2*n {
		t.Fatalf("%s: events %v, want %d publish+doorbell pairs", what, got, n)
	}
	for i := 0; i < len(got); i += 2 {
		if !got[i].publish || got[i+1].publish || got[i+1].off != doorbell.OffsetQP || got[i+1].val != qpValue {
			t.Fatalf("%s: events %v, want publish then store(0, %#x)", what, got, qpValue)
		}
	}
}

func TestDeferredChains(t *testing.T) {
	for n := 1; n <= 40; n++ {
		b, q := newQueue(t)
		for i := range n - 1 {
			q.Added(1)
			if err := q.Post(true); err != nil {
				t.Fatal(err)
			}
			if len(b.log) != 0 || q.Pending() != i+1 {
				t.Fatalf("chain of %d: deferred post %d wrote %v (pending %d)", n, i, b.log, q.Pending())
			}
		}
		q.Added(1)
		if err := q.Post(false); err != nil {
			t.Fatal(err)
		}
		wantRings(t, b, 0, 1, fmt.Sprintf("chain of %d", n))
		want := doorbell.Stats{Posts: uint64(n), WQEs: uint64(n), Doorbells: 1, DeferredPosts: uint64(n - 1)}
		if got := q.Stats(); got != want || q.Pending() != 0 {
			t.Fatalf("chain of %d: stats %+v, want %+v; pending %d", n, got, want, q.Pending())
		}
	}
}

func TestBatchInOnePost(t *testing.T) {
	b, q := newQueue(t)
	q.Added(5) // one post call with a list of 5 WRs
	if err := q.Post(false); err != nil {
		t.Fatal(err)
	}
	wantRings(t, b, 0, 1, "batch of 5")
	if s := q.Stats(); s.WQEs != 5 || s.Doorbells != 1 || s.Posts != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestPostWithNothingPending(t *testing.T) {
	b, q := newQueue(t)
	for range 3 {
		if err := q.Post(false); err != nil {
			t.Fatal(err)
		}
	}
	q.Added(0)
	if err := q.Post(false); err != nil {
		t.Fatal(err)
	}
	if len(b.log) != 0 {
		t.Fatalf("empty posts wrote %v", b.log)
	}
	if s := q.Stats(); s != (doorbell.Stats{Posts: 4}) {
		t.Fatalf("stats %+v", s)
	}
	// And right after a ring, the next empty post rings nothing either.
	q.Added(1)
	_ = q.Post(false)
	mark := len(b.log)
	_ = q.Post(false)
	if len(b.log) != mark {
		t.Fatal("second post rang again")
	}
}

func TestFail(t *testing.T) {
	t.Run("after deferred posts", func(t *testing.T) {
		b, q := newQueue(t)
		q.Added(1)
		_ = q.Post(true)
		q.Added(2)
		_ = q.Post(true)
		if err := q.Fail(); err != nil {
			t.Fatal(err)
		}
		wantRings(t, b, 0, 1, "fail")
		want := doorbell.Stats{Posts: 2, WQEs: 3, Doorbells: 1, DeferredPosts: 2, FailedPosts: 1}
		if s := q.Stats(); s != want {
			t.Fatalf("stats %+v, want %+v", s, want)
		}
	})
	t.Run("after WQEs of the same call", func(t *testing.T) {
		b, q := newQueue(t)
		q.Added(2) // WRs 1 and 2 of a list were written; WR 3 failed
		if err := q.Fail(); err != nil {
			t.Fatal(err)
		}
		wantRings(t, b, 0, 1, "fail mid-list")
		if s := q.Stats(); s.WQEs != 2 || s.FailedPosts != 1 || s.Posts != 0 {
			t.Fatalf("stats %+v", s)
		}
	})
	t.Run("nothing pending", func(t *testing.T) {
		b, q := newQueue(t)
		if err := q.Fail(); err != nil {
			t.Fatal(err)
		}
		if len(b.log) != 0 {
			t.Fatalf("wrote %v", b.log)
		}
		if s := q.Stats(); s != (doorbell.Stats{FailedPosts: 1}) {
			t.Fatalf("stats %+v", s)
		}
	})
	t.Run("a deferred chain continues after a failure", func(t *testing.T) {
		b, q := newQueue(t)
		q.Added(1)
		_ = q.Post(true)
		_ = q.Fail() // rings for the first
		q.Added(1)
		_ = q.Post(true)
		q.Added(1)
		_ = q.Post(false) // rings once for the other two
		wantRings(t, b, 0, 2, "fail then chain")
		if s := q.Stats(); s.WQEs != 3 || s.Doorbells != 2 {
			t.Fatalf("stats %+v", s)
		}
	})
}

// Ring hands the deferred chain to the device with one publish and one
// doorbell; with nothing pending it writes nothing, and counts nothing.
func TestRingHandsTheDeferredChainOverWithOneDoorbellAndNothingWhenNothingIsPending(t *testing.T) {
	b, q := newQueue(t)
	require.NoError(t, q.Ring())
	assert.Empty(t, b.log, "Ring with nothing pending")
	q.Added(1)
	require.NoError(t, q.Post(true))
	q.Added(1)
	require.NoError(t, q.Post(true))
	require.NoError(t, q.Ring())
	wantRings(t, b, 0, 1, "ring")
	require.NoError(t, q.Ring())
	assert.Len(t, b.log, 2, "a second Ring, with nothing pending")
	assert.Equal(t, doorbell.Stats{Posts: 2, WQEs: 2, Doorbells: 1, DeferredPosts: 2, Rings: 1}, q.Stats())
}

// A doorbell store that fails leaves the WQEs pending, counted nowhere;
// the next Ring retries and hands them over.
func TestAFailedDoorbellStoreLeavesTheWQEsPendingForTheNextRing(t *testing.T) {
	b, q := newQueue(t)
	q.Added(3)
	b.failNext = 1
	require.ErrorIs(t, q.Post(false), errStore, "Post")
	assert.Equal(t, 3, q.Pending(), "pending after a failed doorbell")
	assert.Zero(t, q.Stats().Doorbells)
	assert.Zero(t, q.Stats().WQEs)
	b.failNext = 1
	require.ErrorIs(t, q.Ring(), errStore, "Ring")
	assert.Zero(t, q.Stats().Rings, "a Ring whose store failed")
	b.failNext = 1
	require.ErrorIs(t, q.Fail(), errStore, "Fail")
	mark := len(b.log)
	require.NoError(t, q.Ring())
	wantRings(t, b, mark, 1, "retry")
	s := q.Stats()
	assert.EqualValues(t, 3, s.WQEs)
	assert.EqualValues(t, 1, s.Doorbells)
	assert.EqualValues(t, 1, s.Rings)
	assert.Zero(t, q.Pending())
}

// Reset forgets what is pending, so a Ring after it writes nothing; the
// stats stay.
func TestResetForgetsThePendingWQEsAndKeepsTheStats(t *testing.T) {
	b, q := newQueue(t)
	q.Added(4)
	require.NoError(t, q.Post(true))
	q.Reset()
	assert.Zero(t, q.Pending(), "pending after Reset")
	require.NoError(t, q.Ring())
	assert.Empty(t, b.log, "Ring after Reset")
	assert.EqualValues(t, 1, q.Stats().Posts, "Reset cleared the stats")
}

func TestAddedNegativePanics(t *testing.T) {
	_, q := newQueue(t)
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	q.Added(-1)
}

func TestNewQueue(t *testing.T) {
	b := &bench{}
	reg, pub := fakeReg{b}, fakePub{b}
	for _, c := range []struct {
		name string
		reg  doorbell.Register
		off  int
		val  uint32
		pub  doorbell.Publisher
		ok   bool
	}{
		{"QP send", reg, doorbell.OffsetQP, doorbell.QPSend | 0xffffff, pub, true},
		{"QP recv", reg, doorbell.OffsetQP, doorbell.QPRecv | 1, pub, true},
		{"QP both", reg, doorbell.OffsetQP, doorbell.QPSend | doorbell.QPRecv | 1, pub, true},
		{"QP on page 3", reg, 3*doorbell.PageSize + doorbell.OffsetQP, doorbell.QPSend, pub, true},
		{"SRQ", reg, doorbell.OffsetSRQ, doorbell.SRQRecv | 7, pub, true},
		{"SRQ on page 1", reg, doorbell.PageSize + doorbell.OffsetSRQ, doorbell.SRQRecv, pub, true},
		{"QP without bits", reg, doorbell.OffsetQP, 0x1234, pub, false},
		{"QP handle too wide", reg, doorbell.OffsetQP, doorbell.QPSend | 0x1000000, pub, false},
		{"QP with a CQ bit", reg, doorbell.OffsetQP, doorbell.QPSend | doorbell.CQArmSol, pub, false},
		{"SRQ without bits", reg, doorbell.OffsetSRQ, 7, pub, false},
		{"SRQ with QPRecv", reg, doorbell.OffsetSRQ, doorbell.QPRecv | 7, pub, false},
		{"SRQ with SRQRecv and QPRecv", reg, doorbell.OffsetSRQ, doorbell.SRQRecv | doorbell.QPRecv | 7, pub, false},
		{"CQ", reg, doorbell.OffsetCQ, doorbell.CQPoll | 1, pub, false},
		{"offset 0xc", reg, 0xc, doorbell.QPSend, pub, false},
		{"offset misaligned", reg, 2, doorbell.QPSend, pub, false},
		{"offset negative", reg, -4, doorbell.QPSend, pub, false},
		{"nil register", nil, doorbell.OffsetQP, doorbell.QPSend, pub, false},
		{"nil publisher", reg, doorbell.OffsetQP, doorbell.QPSend, nil, false},
	} {
		q, err := doorbell.NewQueue(c.reg, c.off, c.val, c.pub)
		if !c.ok {
			assert.ErrorIs(t, err, doorbell.ErrInvalid, c.name)
			continue
		}
		if assert.NoError(t, err, c.name) {
			assert.Equal(t, c.off, q.Offset(), c.name)
			assert.Equal(t, c.val, q.Value(), c.name)
		}
	}
}

func TestConstants(t *testing.T) {
	// Against vmw_pvrdma-abi.h.
	for _, c := range []struct {
		got, want uint64
	}{
		{doorbell.OffsetQP, 0}, {doorbell.OffsetCQ, 4}, {doorbell.OffsetSRQ, 8},
		{doorbell.QPSend, 0x40000000}, {doorbell.QPRecv, 0x80000000},
		{doorbell.CQArmSol, 0x20000000}, {doorbell.CQArm, 0x40000000}, {doorbell.CQPoll, 0x80000000},
		{doorbell.SRQRecv, 0x40000000}, {doorbell.HandleMask, 0xffffff},
	} {
		if c.got != c.want {
			t.Errorf("%#x, want %#x", c.got, c.want)
		}
	}
}

// TestWithRealTypes drives a Queue over an mmio.Region on ordinary memory
// and a rings.Producer, checking the doorbell bytes and prod_tail.
func TestWithRealTypes(t *testing.T) {
	uar := make([]byte, doorbell.PageSize)
	reg, err := mmio.New(uar)
	if err != nil {
		t.Fatal(err)
	}
	statePage := make([]byte, 4096)
	st, err := rings.NewState(statePage[rings.StateOffsetRQ:])
	if err != nil {
		t.Fatal(err)
	}
	p, err := rings.NewProducer(st, 16)
	if err != nil {
		t.Fatal(err)
	}
	q, err := doorbell.NewQueue(reg, doorbell.OffsetSRQ, doorbell.SRQRecv|0x42, p)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		p.Advance(1)
		q.Added(1)
		if err := q.Post(true); err != nil {
			t.Fatal(err)
		}
	}
	if st.ProdTail() != 0 || uar[8] != 0 {
		t.Fatal("deferred posts published or rang")
	}
	if err := q.Post(false); err != nil {
		t.Fatal(err)
	}
	if st.ProdTail() != 3 {
		t.Fatalf("prod_tail %d", st.ProdTail())
	}
	if got := [4]byte(uar[8:12]); got != [4]byte{0x42, 0, 0, 0x40} {
		t.Fatalf("doorbell bytes % x", got)
	}
	// Ring: CQ poll, and the store error of a bad offset.
	if err := doorbell.Ring(reg, doorbell.OffsetCQ, doorbell.CQPoll|5); err != nil {
		t.Fatal(err)
	}
	if got := [4]byte(uar[4:8]); got != [4]byte{5, 0, 0, 0x80} {
		t.Fatalf("CQ doorbell bytes % x", got)
	}
	if err := doorbell.Ring(reg, doorbell.PageSize, 1); !errors.Is(err, mmio.ErrRange) {
		t.Fatalf("Ring out of range: %v", err)
	}
	// A Queue whose offset lies outside the Register reports the store error.
	q2, err := doorbell.NewQueue(reg, doorbell.PageSize+doorbell.OffsetQP, doorbell.QPSend|1, p)
	if err != nil {
		t.Fatal(err)
	}
	p.Advance(1)
	q2.Added(1)
	if err := q2.Post(false); !errors.Is(err, mmio.ErrRange) || q2.Pending() != 1 {
		t.Fatalf("Post to a bad offset: %v, pending %d", err, q2.Pending())
	}
}
