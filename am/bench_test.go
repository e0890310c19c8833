//go:build !guest

package am

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/internal/perf"
)

// fragmentStream returns a context reassembling a 1 MiB message from
// task 1 into its handler's buffer, and a function that returns the next
// fragment of it: the reassembly is rewound before it would complete, so
// that every packet is a fragment in the middle of a message.
func fragmentStream(tb testing.TB) (*Context, func() []byte) {
	const length = 1 << 20
	c := hostContext(tb, Config{Tasks: 2, PacketSize: 4096})
	buf := make([]byte, length)
	if err := c.SetHandler(1, func(a *Arrival) Return { return Return{Buf: buf} }); err != nil {
		require.NoError(tb, err)
	}
	body := 4096 - headerSize
	cn := c.conns[1]
	c.take(cn, pkt(header{kind: kindFirst, handler: 1, length: length}, make([]byte, body)))
	b := make([]byte, 4096)
	return c, func() []byte {
		if cn.rx.got+uint64(body) >= length {
			cn.rx.got = uint64(body)
		}
		h := header{kind: kindFrag, length: length, offset: cn.rx.got}
		h.put(b)
		cn.unposted = 0
		return b
	}
}

// Taking a fragment (parse, the checks against the reassembly, the copy
// into the handler's buffer) allocates nothing.
func TestTakingAFragmentAllocatesNothing(t *testing.T) {
	c, next := fragmentStream(t)
	cn := c.conns[1]
	allocs := testing.AllocsPerRun(100, func() { c.take(cn, next()) })
	if cn.err != nil || cn.rx == nil || cn.rx.drop {
		require.Failf(t, "broken", "the stream was not reassembled into the buffer (refused: %v)", cn.err)
	}
	if allocs != 0 {
		require.Failf(t, "broken", "%v allocations per fragment", allocs)
	}
}

// BenchmarkTakeFragment is the receive path's cost per 4 KiB fragment.
func BenchmarkTakeFragment(b *testing.B) {
	c, next := fragmentStream(b)
	cn := c.conns[1]
	b.ReportAllocs()
	b.SetBytes(4096 - headerSize)
	for b.Loop() {
		c.take(cn, next())
	}
	if cn.err != nil {
		require.NoError(b, cn.err)
	}
}

// eagerStream returns a context taking 8-byte eager messages from task 1
// into a handler that consumes them in the call, and a function that
// returns the next one (its acknowledgement taken off, as sent).
func eagerStream(tb testing.TB) (*Context, func() []byte) {
	c := hostContext(tb, Config{Tasks: 2, PacketSize: 4096})
	if err := c.SetHandler(1, func(a *Arrival) Return { return Return{} }); err != nil {
		require.NoError(tb, err)
	}
	cn := c.conns[1]
	b := make([]byte, headerSize+8)
	return c, func() []byte {
		h := header{kind: kindEager, handler: 1, id: cn.rxNext, length: 8}
		h.put(b)
		cn.unposted, cn.acks, cn.ackState = 0, cn.acks[:0], acksNone
		return b
	}
}

func BenchmarkTakeEager(b *testing.B) {
	c, next := eagerStream(b)
	cn := c.conns[1]
	b.ReportAllocs()
	for range b.N {
		c.take(cn, next())
	}
	if cn.err != nil {
		b.Fatal(cn.err)
	}
}

// Taking an eager message (parse, checks, the header handler, the
// acknowledgement queued) allocates nothing.
func TestTakingAnEagerMessageAllocatesNothing(t *testing.T) {
	c, next := eagerStream(t)
	cn := c.conns[1]
	allocs := testing.AllocsPerRun(100, func() { c.take(cn, next()) })
	require.NoError(t, cn.err)
	require.Zero(t, allocs, "allocations per eager message")
}

// BenchmarkAmsendEager sends 8-byte messages between two tasks on the
// model and waits for their acknowledgements, 64 at a time: the whole
// path, the model's work included.
func BenchmarkAmsendEager(b *testing.B) {
	d := openDevice(b)
	cs := newJob(b, d, 2, Config{})
	for _, c := range cs {
		require.NoError(b, c.SetHandler(1, func(*Arrival) Return { return Return{} }))
	}
	ctx := withTimeout(b, time.Minute)
	data := make([]byte, 8)
	cmpl := NewCounter()
	b.ReportAllocs()
	b.ResetTimer()
	out := int64(0)
	for i := range b.N {
		require.NoError(b, cs[0].Amsend(1, 1, nil, data, Counters{Cmpl: cmpl}))
		if out++; out == 64 || i == b.N-1 {
			_, err := cmpl.Wait(ctx, out)
			require.NoError(b, err)
			out = 0
		}
	}
	require.NoError(b, cs[0].Fence(ctx))
}

// BenchmarkAmsendRoundTrip bounces an 8-byte message between two tasks on
// the model, one round trip at a time (task 1's handler answers from the
// progress goroutine), and reports the round trips' median and 99th
// percentile (perf.Quantile, nearest rank) beside the mean.
func BenchmarkAmsendRoundTrip(b *testing.B) {
	d := openDevice(b)
	cs := newJob(b, d, 2, Config{})
	answer := make([]byte, 8) // never changes: safe to send again before the last send's Org
	pongs := make(chan struct{}, 1)
	require.NoError(b, cs[1].SetHandler(1, func(a *Arrival) Return {
		_ = cs[1].Amsend(a.Src, 2, nil, answer, Counters{})
		return Return{}
	}))
	require.NoError(b, cs[0].SetHandler(2, func(*Arrival) Return {
		pongs <- struct{}{}
		return Return{}
	}))
	require.NoError(b, cs[1].SetHandler(2, func(*Arrival) Return { return Return{} }))
	require.NoError(b, cs[0].SetHandler(1, func(*Arrival) Return { return Return{} }))
	ctx := withTimeout(b, time.Minute)
	data := make([]byte, 8)
	rtts := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		require.NoError(b, cs[0].Amsend(1, 1, nil, data, Counters{}))
		select {
		case <-pongs:
		case <-ctx.Done():
			require.FailNow(b, "no answer", "%v", context.Cause(ctx))
		}
		rtts = append(rtts, time.Since(start))
	}
	b.StopTimer()
	b.ReportMetric(float64(perf.Median(rtts)), "p50-ns/op")
	b.ReportMetric(float64(perf.Quantile(rtts, 0.99)), "p99-ns/op")
	require.NoError(b, cs[0].Fence(ctx))
}
