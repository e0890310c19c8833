package vmxnet3

import (
	"fmt"
	"github.com/stretchr/testify/require"
	"testing"
)

// BenchmarkSend: Send of a batch of 60-byte frames on the fake device (which
// completes them inside the doorbell write, as QEMU does). Per-frame cost
// is ns/op divided by the batch.
func BenchmarkSend(b *testing.B) {
	for _, batch := range []int{1, 32} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			n, f := newTestNIC(b, &Options{TxRing: 256})
			f.discard = true
			frames := make([][]byte, batch)
			for i := range frames {
				frames[i] = frame(60, byte(i))
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := n.Send(frames); err != nil {
					require.NoError(b, err)
				}
			}
		})
	}
}

// BenchmarkRecvEmpty: Recv with nothing there, the poll a busy receiver
// runs most: the gate, one load of the completion ring's generation bit.
func BenchmarkRecvEmpty(b *testing.B) {
	n, _ := newTestNIC(b, nil)
	bufs, sizes := [][]byte{make([]byte, 1514)}, []int{0}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := n.Recv(bufs, sizes); err != nil {
			require.NoError(b, err)
		}
	}
}
