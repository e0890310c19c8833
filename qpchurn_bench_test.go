package vfrdma_test

import (
	"context"
	"strconv"
	"syscall"
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
// (docs/benchmarks.md, "QP create and close"). Without the journal (the
// model's default), and with it (a real device's default). The process's
// CPU time per QP (cpu-ns/create, cpu-ns/close: the driver's, the model's
// and the runtime's) is reported beside the wall time, which on a loaded
// machine is mostly waiting for a CPU.
func BenchmarkQPCreateClose(b *testing.B) {
	for _, journal := range []bool{false, true} {
		for _, n := range []int{256, 1024, 4096} {
			name := "nojournal/" + strconv.Itoa(n)
			if journal {
				name = "journal/" + strconv.Itoa(n)
			}
			b.Run(name, func(b *testing.B) { benchQPCreateClose(b, n, journal) })
		}
	}
}

func benchQPCreateClose(b *testing.B, n int, journal bool) {
	m, err := pvsim.New(pvsim.Config{Version: 20, Seed: 1})
	require.NoError(b, err)
	opts := &vfrdma.Options{}
	if journal {
		opts.StateDir = b.TempDir()
	}
	d, err := vfrdma.OpenFunction(m, opts)
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
	var create, closing, createCPU, closingCPU time.Duration
	b.ResetTimer()
	for range b.N {
		c0 := cpuTime(b)
		t0 := time.Now()
		for i := range qps {
			if qps[i], err = pd.CreateQP(ctx, cfg); err != nil {
				b.Fatalf("QP %d of %d: %v", i, n, err)
			}
		}
		t1 := time.Now()
		c1 := cpuTime(b)
		for _, qp := range qps {
			if err := qp.Close(); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := cq.Poll(wcs); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		c2 := cpuTime(b)
		create += t1.Sub(t0)
		closing += t2.Sub(t1)
		createCPU += c1 - c0
		closingCPU += c2 - c1
	}
	b.StopTimer()
	per := float64(b.N * n)
	b.ReportMetric(float64(create.Nanoseconds())/per, "ns/create")
	b.ReportMetric(float64(closing.Nanoseconds())/per, "ns/close")
	b.ReportMetric(float64(createCPU.Nanoseconds())/per, "cpu-ns/create")
	b.ReportMetric(float64(closingCPU.Nanoseconds())/per, "cpu-ns/close")
	b.ReportMetric(0, "ns/op")
}

// cpuTime returns the CPU time the process has used, user and system.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
