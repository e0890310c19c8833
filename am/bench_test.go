//go:build !guest

package am

import (
	"testing"

	"github.com/stretchr/testify/require"
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
		cn.owed = 0
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
