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
	opts := &vfrdma.Options{}
	if journal {
		opts.StateDir = b.TempDir()
	}
	d, pd, ctx := benchDevice(b, opts)
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

// benchDevice opens a version-20 model device with opts, and a PD on it,
// for b; both go at b's end. ctx bounds b's commands (a hang guard).
func benchDevice(b *testing.B, opts *vfrdma.Options) (*vfrdma.Device, *vfrdma.PD, context.Context) {
	m, err := pvsim.New(pvsim.Config{Version: 20, Seed: 1})
	require.NoError(b, err)
	d, err := vfrdma.OpenFunction(m, opts)
	if err != nil {
		m.Close()
		require.NoError(b, err)
	}
	b.Cleanup(func() { d.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	b.Cleanup(cancel)
	pd, err := d.AllocPD(ctx)
	require.NoError(b, err)
	return d, pd, ctx
}

// cpuTime returns the CPU time the process has used, user and system.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkQPScale is a server's life at n QPs on one version-20 model
// device: it creates n RC QPs, connects them in pairs (each to the next),
// moves one 64-byte SEND each way on every pair, and closes them all; it
// reports the cost per QP of each phase (wall and CPU time, as
// BenchmarkQPCreateClose). The cost per QP must stay flat from 256 to
// 4 096 QPs (docs/benchmarks.md, "One device at 4 096 QPs").
func BenchmarkQPScale(b *testing.B) {
	for _, n := range []int{256, 1024, 4096} {
		b.Run(strconv.Itoa(n), func(b *testing.B) { benchQPScale(b, n) })
	}
}

func benchQPScale(b *testing.B, n int) {
	d, pd, ctx := benchDevice(b, &vfrdma.Options{})
	scq, err := d.CreateCQ(ctx, n) // the device's largest CQ is 4 096
	require.NoError(b, err)
	rcq, err := d.CreateCQ(ctx, n)
	require.NoError(b, err)
	mr, err := pd.AllocMR(ctx, 64*n, vfrdma.AccessLocalWrite)
	require.NoError(b, err)
	cfg := &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: scq, RecvCQ: rcq, SendDepth: 1, RecvDepth: 1, SignalAll: true}
	qps := make([]*vfrdma.QP, n)
	wcs := make([]vfrdma.WC, 256)
	gid := d.GID()
	var phase [4]time.Duration // create, connect, traffic, close
	var cpu [4]time.Duration
	b.ResetTimer()
	for range b.N {
		mark := func(k int, run func()) {
			c0, t0 := cpuTime(b), time.Now()
			run()
			phase[k] += time.Since(t0)
			cpu[k] += cpuTime(b) - c0
		}
		mark(0, func() {
			for i := range qps {
				if qps[i], err = pd.CreateQP(ctx, cfg); err != nil {
					b.Fatalf("QP %d of %d: %v", i, n, err)
				}
			}
		})
		mark(1, func() {
			for i := 0; i < n; i += 2 {
				x, y := qps[i], qps[i+1]
				if err := x.Connect(ctx, vfrdma.Remote{QPN: y.QPN(), GID: gid, PSN: 0x100}, 0x200); err != nil {
					b.Fatal(err)
				}
				if err := y.Connect(ctx, vfrdma.Remote{QPN: x.QPN(), GID: gid, PSN: 0x200}, 0x100); err != nil {
					b.Fatal(err)
				}
			}
		})
		mark(2, func() {
			for i, qp := range qps {
				if _, err := qp.PostRecv([]vfrdma.RecvWR{{WRID: uint64(i), SGEs: []vfrdma.SGE{mr.SGE(64*i, 64)}}}, 0); err != nil {
					b.Fatal(err)
				}
			}
			for i, qp := range qps {
				if _, err := qp.PostSend([]vfrdma.SendWR{{WRID: uint64(i), Flags: vfrdma.SendSignaled, SGEs: []vfrdma.SGE{mr.SGE(64*i, 64)}}}, 0); err != nil {
					b.Fatal(err)
				}
			}
			for _, cq := range []*vfrdma.CQ{scq, rcq} {
				for got := 0; got < n; {
					k, err := cq.Poll(wcs)
					if err != nil {
						b.Fatal(err)
					}
					for _, w := range wcs[:k] {
						if w.Status != vfrdma.WCSuccess {
							b.Fatalf("wr_id %d on QP %d: %v", w.WRID, w.QPN, w.Status)
						}
					}
					got += k
				}
			}
		})
		mark(3, func() {
			for _, qp := range qps {
				if err := qp.Close(); err != nil {
					b.Fatal(err)
				}
			}
			for _, cq := range []*vfrdma.CQ{scq, rcq} {
				if _, err := cq.Poll(wcs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.StopTimer()
	per := float64(b.N * n)
	for k, name := range []string{"create", "connect", "traffic", "close"} {
		b.ReportMetric(float64(phase[k].Nanoseconds())/per, "ns/"+name)
		b.ReportMetric(float64(cpu[k].Nanoseconds())/per, "cpu-ns/"+name)
	}
	b.ReportMetric(0, "ns/op")
}
