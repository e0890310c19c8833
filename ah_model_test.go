package vfrdma_test

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
)

// An AH's address reaches the wire as given: a hop limit of 0 means the
// default, 64, the traffic class is carried, and a flow label may have 20
// bits, all of them set, and not 21 (refused with ErrInvalid). The
// receiver sees them in the GRH before the payload (IPv6's layout: the
// traffic class and flow label in the first word, the hop limit in byte
// 7).
func TestAnAHsHopLimitTrafficClassAndFlowLabelReachTheGRHAndTheLabelHasTwentyBits(t *testing.T) {
	ctx := ctxT(t)
	d, _ := openModel(t, vmware(20), nil)
	pd, err := d.AllocPD(ctx)
	require.NoError(t, err)
	cq, err := d.CreateCQ(ctx, 64)
	require.NoError(t, err)
	const qkey = 0x1234
	var a, b *vfrdma.QP
	for _, q := range []**vfrdma.QP{&a, &b} {
		*q, err = pd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.UD, SendCQ: cq, RecvCQ: cq, SendDepth: 8, RecvDepth: 8, QKey: qkey, SignalAll: true})
		require.NoError(t, err)
		require.NoError(t, (*q).Connect(ctx, vfrdma.Remote{}, 0))
	}
	mr, err := pd.AllocMR(ctx, 4096, vfrdma.AccessLocalWrite)
	require.NoError(t, err)

	_, err = pd.CreateAH(vfrdma.AHAttr{DGID: d.GID(), FlowLabel: 1 << 20})
	require.ErrorIs(t, err, vfrdma.ErrInvalid, "a flow label of 21 bits")

	for _, tc := range []struct {
		name      string
		attr      vfrdma.AHAttr
		hop       uint8
		tclass    uint8
		flowLabel uint32
	}{
		{"hop limit 0 is the default", vfrdma.AHAttr{DGID: d.GID()}, 64, 0, 0},
		{"hop limit, traffic class and a 20-bit flow label as given", vfrdma.AHAttr{DGID: d.GID(), HopLimit: 5, TrafficClass: 0xA5, FlowLabel: 1<<20 - 1}, 5, 0xA5, 1<<20 - 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ah, err := pd.CreateAH(tc.attr)
			require.NoError(t, err)
			_, err = b.PostRecv([]vfrdma.RecvWR{{WRID: 1, SGEs: []vfrdma.SGE{mr.SGE(1024, 40+64)}}}, 0)
			require.NoError(t, err)
			_, err = a.PostSend([]vfrdma.SendWR{{WRID: 2, SGEs: []vfrdma.SGE{mr.SGE(0, 64)}, AH: ah, RemoteQPN: b.QPN(), RemoteQKey: qkey}}, 0)
			require.NoError(t, err)
			var recv vfrdma.WC
			for _, wc := range waitWCs(t, ctx, cq, 2) {
				require.Equal(t, vfrdma.WCSuccess, wc.Status, "%+v", wc)
				if wc.WRID == 1 {
					recv = wc
				}
			}
			require.EqualValues(t, 1, recv.WRID)
			grh := mr.Bytes()[1024 : 1024+40]
			assert.Equal(t, tc.hop, grh[7], "hop limit")
			assert.Equal(t, tc.flowLabel, binary.BigEndian.Uint32(grh[0:4])&(1<<20-1), "flow label")
			assert.Equal(t, tc.tclass, uint8(binary.BigEndian.Uint32(grh[0:4])>>20), "traffic class")
		})
	}
}
