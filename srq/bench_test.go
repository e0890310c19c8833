package srq_test

import (
	"strconv"
	"testing"

	"github.com/vfrdma/vfrdma/wq"
)

// BenchmarkPost times Post of a chain of batch receives (one SGE each)
// and its doorbell; the device takes them and they complete outside the
// timer whenever the SRQ is full.
func BenchmarkPost(b *testing.B) {
	for _, batch := range []int{1, 32} {
		b.Run("batch"+strconv.Itoa(batch), func(b *testing.B) {
			const slots = 1024
			r := newRig(b, slots, slots, false)
			m, _ := r.q.Attach(1)
			wrs := make([]wq.RecvWR, batch)
			for i := range wrs {
				wrs[i] = wq.RecvWR{WRID: uint64(i), SGEs: []wq.SGE{r.sge(i*1024, 1024)}}
			}
			drain := func() {
				ids, _ := r.take(b)
				for _, id := range ids {
					r.q.Complete(m, id)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if r.q.Available()+batch > slots {
					b.StopTimer()
					drain()
					b.StartTimer()
				}
				if _, err := r.q.Post(wrs, false); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/WQE")
		})
	}
}

// BenchmarkComplete times the poller's side of one SRQ completion.
func BenchmarkComplete(b *testing.B) {
	const slots = 1024
	r := newRig(b, slots, slots, false)
	m, _ := r.q.Attach(1)
	wrs := make([]wq.RecvWR, 32)
	for i := range wrs {
		wrs[i] = wq.RecvWR{WRID: uint64(i), SGEs: []wq.SGE{r.sge(i*1024, 1024)}}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%32 == 0 {
			b.StopTimer()
			if _, err := r.q.Post(wrs, false); err != nil {
				b.Fatal(err)
			}
			ready, _ := r.cons.Ready()
			r.cons.Consume(ready)
			b.StartTimer()
		}
		if !r.q.Complete(m, uint64(i%32)) {
			b.Fatal("not outstanding")
		}
	}
}
