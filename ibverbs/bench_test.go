package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/pvsim"
)

// What the layer costs (issue 32 item 5): the same loop (post a batch of
// receives, a batch of signaled 64-byte SENDs on an RC pair of one model
// device, one call each, then poll the 2×batch completions) through the
// drop-in, from C, and through the Go API. Run:
//
//	go test -run '^$' -bench 'PostPoll' -benchtime 20000x ./ibverbs/
//
// and compare the ns/request metrics of the two at each batch. The loop
// runs the model's device work too, which dominates it; emptypoll (a poll
// of an empty CQ, through each) and dropin/crossing (a verb whose Go side
// is a table lookup and an atomic add) measure the layer alone.

func BenchmarkPostPoll(b *testing.B) {
	dir, err := os.MkdirTemp("", "dropin-bench")
	require.NoError(b, err)
	defer func() { _ = os.RemoveAll(dir) }()
	benchDir, benchLib = dir, ""
	for _, batch := range []int{1, 32} {
		b.Run("dropin/batch="+strconv.Itoa(batch), func(b *testing.B) { benchDropin(b, batch) })
		b.Run("goapi/batch="+strconv.Itoa(batch), func(b *testing.B) { benchGoAPI(b, batch) })
	}
	b.Run("dropin/emptypoll", func(b *testing.B) { benchDropinRun(b, "emptypoll", strconv.Itoa(b.N)) })
	b.Run("dropin/crossing", func(b *testing.B) { benchDropinRun(b, "emptypoll", strconv.Itoa(b.N)) })
	b.Run("goapi/emptypoll", benchGoEmptyPoll)
}

// benchGoEmptyPoll is the Go API's side of the layer-only comparison: a
// poll of an empty CQ.
func benchGoEmptyPoll(b *testing.B) {
	m, err := pvsim.New(pvsim.Config{Version: 20})
	require.NoError(b, err)
	d, err := vfrdma.OpenFunction(m, &vfrdma.Options{StateDir: "-"})
	require.NoError(b, err)
	defer func() { _ = d.Close(); _ = m.Close() }()
	cq, err := d.CreateCQ(context.Background(), 16)
	require.NoError(b, err)
	wcs := make([]vfrdma.WC, 32)
	b.ResetTimer()
	for range b.N {
		if n, err := cq.Poll(wcs); n != 0 || err != nil {
			b.Fatal(n, err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/request")
}

var benchDir, benchLib, benchProg string

func benchDropin(b *testing.B, batch int) {
	benchDropinRun(b, "bench", strconv.Itoa(max(b.N/batch, 1)), strconv.Itoa(batch))
}

func benchDropinRun(b *testing.B, args ...string) {
	if benchLib == "" {
		dir := benchDir
		out, err := exec.Command("make", "-s", "-C", "..", "dropin", "OUT="+dir).CombinedOutput()
		require.NoError(b, err, "%s", out)
		benchLib = filepath.Join(dir, "vfrdma")
		benchProg = filepath.Join(dir, "dropin_test")
		out, err = exec.Command("gcc", "-O2", "-std=gnu11", "-o", benchProg, "tests/dropin_test.c",
			"-L"+benchLib, "-l:libibverbs.so.1").CombinedOutput()
		require.NoError(b, err, "%s", out)
	}
	cmd := exec.Command(benchProg, args...)
	cmd.Env = append(cmd.Environ(), "LD_LIBRARY_PATH="+benchLib, "VFRDMA_MODEL=v20")
	out, err := cmd.CombinedOutput()
	require.NoError(b, err, "%s", out)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	last := lines[len(lines)-1]
	if strings.HasSuffix(b.Name(), "emptypoll") { // the line before the crossing's
		last = strings.TrimPrefix(lines[len(lines)-2], "emptypoll ")
	}
	f := strings.Fields(last)
	require.Len(b, f, 2, "%s", out)
	ns, err := strconv.ParseFloat(f[1], 64)
	require.NoError(b, err)
	b.ReportMetric(ns, "ns/request")
}

func benchGoAPI(b *testing.B, batch int) {
	ctx := context.Background()
	m, err := pvsim.New(pvsim.Config{Version: 20})
	require.NoError(b, err)
	d, err := vfrdma.OpenFunction(m, &vfrdma.Options{StateDir: "-"})
	require.NoError(b, err)
	defer func() { _ = d.Close(); _ = m.Close() }()
	pd, err := d.AllocPD(ctx)
	require.NoError(b, err)
	cq, err := d.CreateCQ(ctx, 4*batch+4)
	require.NoError(b, err)
	mk := func() *vfrdma.QP {
		qp, err := pd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: cq, RecvCQ: cq, SendDepth: batch, RecvDepth: batch, SignalAll: true})
		require.NoError(b, err)
		return qp
	}
	qa, qb := mk(), mk()
	require.NoError(b, qa.Connect(ctx, vfrdma.Remote{QPN: qb.QPN(), GID: d.GID()}, 0))
	require.NoError(b, qb.Connect(ctx, vfrdma.Remote{QPN: qa.QPN(), GID: d.GID()}, 0))
	mr, err := pd.AllocMR(ctx, 4096, vfrdma.AccessLocalWrite)
	require.NoError(b, err)
	sge := []vfrdma.SGE{mr.SGE(0, 64)}
	sends := make([]vfrdma.SendWR, batch)
	recvs := make([]vfrdma.RecvWR, batch)
	for i := range sends {
		sends[i] = vfrdma.SendWR{SGEs: sge, Flags: vfrdma.SendSignaled}
		recvs[i] = vfrdma.RecvWR{SGEs: sge}
	}
	wcs := make([]vfrdma.WC, 2*batch)
	iters := max(b.N/batch, 1)
	b.ResetTimer()
	for range iters {
		_, err := qb.PostRecv(recvs, 0)
		require.NoError(b, err)
		_, err = qa.PostSend(sends, 0)
		require.NoError(b, err)
		for got := 0; got < 2*batch; {
			n, err := cq.Poll(wcs[:2*batch-got])
			require.NoError(b, err)
			got += n
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(iters*batch), "ns/request")
}
