package pvsim_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/pvsim"
)

// BenchmarkRCSend streams 64-byte RC SENDs between two drivers on two
// models, in batches of 32: the model's cost per message, driver and
// completions included.
func BenchmarkRCSend(b *testing.B) {
	for _, tc := range []struct {
		name string
		cfg  pvsim.Config
	}{devices[0], devices[1], devices[4]} {
		b.Run(tc.name, func(b *testing.B) {
			fab := pvsim.NewFabric()
			a, r := newNode(b, tc.cfg, fab, 1), newNode(b, tc.cfg, fab, 2)
			qa, qr := a.qp(b, vfrdma.RC, nil), r.qp(b, vfrdma.RC, nil)
			connect(b, a, qa, r, qr)
			const batch = 32
			swr := make([]vfrdma.SendWR, batch)
			rwr := make([]vfrdma.RecvWR, batch)
			for i := range swr {
				swr[i] = vfrdma.SendWR{WRID: uint64(i), Flags: signaled, SGEs: []vfrdma.SGE{a.mr.SGE(i*64, 64)}}
				rwr[i] = vfrdma.RecvWR{WRID: uint64(i), SGEs: []vfrdma.SGE{r.mr.SGE(i*64, 64)}}
			}
			b.SetBytes(64)
			b.ResetTimer()
			for n := 0; n < b.N; n += batch {
				_, err := qr.PostRecv(rwr, 0)
				require.NoError(b, err)
				_, err = qa.PostSend(swr, 0)
				require.NoError(b, err)
				poll(b, a.cq, batch)
				poll(b, r.cq, batch)
			}
		})
	}
}
