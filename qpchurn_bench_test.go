package vfrdma_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/pvsim"
)

// BenchmarkQPCreateClose creates n RC QPs on one CQ of a version-20 model
// device, then closes them all and polls the CQ once (which lets the
// driver forget the closed QPs' handles), and reports the cost per QP of
// each phase: ns/create and ns/close. A server meets both on every connect
// and disconnect; the cost per QP must not grow with the number of QPs
// (docs/benchmarks.md, "QP create and close").
func BenchmarkQPCreateClose(b *testing.B) {
	for _, n := range []int{256, 1024, 4096} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			m, err := pvsim.New(pvsim.Config{Version: 20, Seed: 1})
			require.NoError(b, err)
			d, err := vfrdma.OpenFunction(m, nil)
			if err != nil {
				m.Close()
				require.NoError(b, err)
			}
			defer d.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			pd, err := d.AllocPD(ctx)
			require.NoError(b, err)
			cq, err := d.CreateCQ(ctx, 64)
			require.NoError(b, err)
			cfg := &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: cq, RecvCQ: cq, SendDepth: 1, RecvDepth: 1}
			qps := make([]*vfrdma.QP, n)
			wcs := make([]vfrdma.WC, 16)
			var create, close time.Duration
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				for i := range qps {
					if qps[i], err = pd.CreateQP(ctx, cfg); err != nil {
						b.Fatalf("QP %d of %d: %v", i, n, err)
					}
				}
				t1 := time.Now()
				for _, qp := range qps {
					if err := qp.Close(); err != nil {
						b.Fatal(err)
					}
				}
				if _, err := cq.Poll(wcs); err != nil {
					b.Fatal(err)
				}
				t2 := time.Now()
				create += t1.Sub(t0)
				close += t2.Sub(t1)
			}
			b.StopTimer()
			per := float64(b.N * n)
			b.ReportMetric(float64(create.Nanoseconds())/per, "ns/create")
			b.ReportMetric(float64(close.Nanoseconds())/per, "ns/close")
			b.ReportMetric(0, "ns/op")
		})
	}
}
