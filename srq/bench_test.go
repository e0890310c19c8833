package srq_test

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/rings"
	"github.com/vfrdma/vfrdma/wq"
)

// BenchmarkPost times Post of a chain of batch receives (one SGE each)
// and its doorbell, per receive; the device takes them and they complete
// outside the timer whenever the SRQ is full.
func BenchmarkPost(b *testing.B) {
	for _, batch := range []int{1, 32} {
		b.Run("batch"+strconv.Itoa(batch), func(b *testing.B) {
			const slots = 1 << 14 // drained every 16384/batch posts
			r := newRig(b, slots, slots, false)
			m, err := r.q.Attach(1)
			require.NoError(b, err)
			wrs := make([]wq.RecvWR, batch)
			for i := range wrs {
				wrs[i] = wq.RecvWR{WRID: uint64(i), SGEs: []wq.SGE{r.sge(i*1024, 1024)}}
			}
			sges := make([]rings.SGE, maxSGE)
			drain := func() { // the device takes everything; the poller completes it
				ready, _ := r.cons.Ready()
				for i := 0; i < ready; i++ {
					s := r.cons.Slot(i)
					id, _, _ := rings.DecodeRecvWQE(r.data[s*r.stride:(s+1)*r.stride], sges)
					r.q.Complete(m, id)
				}
				r.cons.Consume(ready)
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
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/recv")
		})
	}
}

// BenchmarkComplete times the poller's side of one SRQ completion, in
// groups of 32 at the head of what is outstanding: in ring order (the
// oldest is found at once), and reversed in each group (each found by a
// scan from the oldest). The SRQ is refilled, 16384 receives at a time,
// outside the timer.
func BenchmarkComplete(b *testing.B) {
	for _, order := range []string{"inorder", "reversed"} {
		b.Run(order, func(b *testing.B) {
			const slots, group = 1 << 14, 32 // refilled every 16384 completions
			r := newRig(b, slots, slots, false)
			m, err := r.q.Attach(1)
			require.NoError(b, err)
			wrs := make([]wq.RecvWR, slots)
			sges := make([]wq.SGE, group)
			for j := range wrs {
				sges[j%group] = r.sge(j%group*1024, 1024)
				wrs[j] = wq.RecvWR{WRID: uint64(j), SGEs: sges[j%group : j%group+1]}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				k := i % slots
				if k == 0 {
					b.StopTimer()
					for base := 0; base < slots; base += group {
						if _, err := r.q.Post(wrs[base:base+group], false); err != nil {
							b.Fatal(err)
						}
					}
					ready, _ := r.cons.Ready()
					r.cons.Consume(ready)
					b.StartTimer()
				}
				id := uint64(k)
				if order == "reversed" {
					id = uint64(k - k%group + group - 1 - k%group)
				}
				if !r.q.Complete(m, id) {
					b.Fatal("not outstanding")
				}
			}
		})
	}
}

// BenchmarkPostComplete times the whole cycle per receive: Post of a
// chain, the fake device taking it, and the completions, as
// BenchmarkPostPoll does for a QP.
func BenchmarkPostComplete(b *testing.B) {
	for _, batch := range []int{1, 32} {
		b.Run("batch"+strconv.Itoa(batch), func(b *testing.B) {
			r := newRig(b, 64, 64, false)
			m, err := r.q.Attach(1)
			require.NoError(b, err)
			wrs := make([]wq.RecvWR, batch)
			for i := range wrs {
				wrs[i] = wq.RecvWR{WRID: uint64(i), SGEs: []wq.SGE{r.sge(i*1024, 1024)}}
			}
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if _, err := r.q.Post(wrs, false); err != nil {
					b.Fatal(err)
				}
				ready, _ := r.cons.Ready() // the device
				r.cons.Consume(ready)
				for j := range wrs {
					r.q.Complete(m, wrs[j].WRID)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/recv")
		})
	}
}
