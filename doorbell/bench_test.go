package doorbell_test

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/mmio"
	"github.com/vfrdma/vfrdma/rings"
)

// realQueue is a Queue over an mmio.Region on ordinary memory (standing in
// for the UAR page) and a rings.Producer, the types the driver uses.
func realQueue(tb testing.TB) (*rings.State, *rings.Producer, *doorbell.Queue) {
	tb.Helper()
	reg, err := mmio.New(make([]byte, doorbell.PageSize))
	if err != nil {
		tb.Fatal(err)
	}
	st, err := rings.NewState(make([]byte, 4096))
	if err != nil {
		tb.Fatal(err)
	}
	p, err := rings.NewProducer(st, 256)
	if err != nil {
		tb.Fatal(err)
	}
	q, err := doorbell.NewQueue(reg, doorbell.OffsetQP, doorbell.QPSend|0x17, p)
	if err != nil {
		tb.Fatal(err)
	}
	return st, p, q
}

func TestNoAllocs(t *testing.T) {
	st, p, q := realQueue(t)
	b, fq := newQueue(t)
	b.log = make([]event, 0, 1<<16) // preallocated, so the fakes do not allocate either
	for name, f := range map[string]func(){
		"Added+Post": func() {
			p.Advance(1)
			q.Added(1)
			_ = q.Post(true)
			p.Advance(1)
			q.Added(1)
			_ = q.Post(false)
			st.SetConsHead(st.ProdTail())
		},
		"Fail": func() {
			p.Advance(1)
			q.Added(1)
			_ = q.Fail()
			_ = q.Fail()
			st.SetConsHead(st.ProdTail())
		},
		"Ring": func() {
			p.Advance(1)
			q.Added(1)
			_ = q.Ring()
			_ = q.Ring()
			st.SetConsHead(st.ProdTail())
		},
		"Stats+Pending": func() { _, _ = q.Stats(), q.Pending() },
		"fakes": func() {
			fq.Added(2)
			_ = fq.Post(true)
			_ = fq.Fail()
			fq.Added(1)
			_ = fq.Ring()
			_ = fq.Post(false)
		},
	} {
		assert.Zero(t, testing.AllocsPerRun(500, f), "%s: allocations per run", name)
	}
}

// BenchmarkPost posts a batch of posts of one WQE each: batch−1 deferred
// posts and a final one without Defer, which publishes the ring and writes
// one doorbell to an mmio.Region over ordinary memory (no VM exit, so this
// is the driver's own cost). ns/op is per batch; ns/post is reported too.
func BenchmarkPost(b *testing.B) {
	for _, batch := range []int{1, 32} {
		b.Run(strconv.Itoa(batch), func(b *testing.B) {
			st, p, q := realQueue(b)
			b.ReportAllocs()
			for b.Loop() {
				for i := range batch {
					p.Advance(1)
					q.Added(1)
					if err := q.Post(i < batch-1); err != nil {
						b.Fatal(err)
					}
				}
				st.SetConsHead(st.ProdTail()) // the device drained the batch
			}
			if s := q.Stats(); s.Doorbells != uint64(b.N) || s.WQEs != uint64(b.N*batch) {
				b.Fatalf("stats %+v after %d batches", s, b.N)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/post")
		})
	}
}
