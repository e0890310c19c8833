package vfrdma_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/pvsim"
)

// The UD payload limit is the port's active MTU, whatever it is: QEMU's
// mode reports 4096 (its backend's), VMware's 1024. A UD send of exactly
// UDMaxPayload bytes is posted and delivered whole; one byte more is
// refused with ErrInvalid.
func TestAUDMessageMayBeAsLongAsThePortsActiveMTUAndNotAByteLonger(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  pvsim.Config
		want int
	}{
		{"qemu", pvsim.Config{QEMU: true}, 4096},
		{"v20", vmware(20), 1024},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t)
			d, _ := openModel(t, tc.cfg, nil)
			port, err := d.QueryPort(ctx)
			require.NoError(t, err)
			require.GreaterOrEqual(t, port.ActiveMTU, uint32(firmware.MTU256))
			require.LessOrEqual(t, port.ActiveMTU, uint32(firmware.MTU4096))
			assert.Equal(t, 128<<port.ActiveMTU, d.UDMaxPayload(), "128 << active_mtu %d", port.ActiveMTU)
			require.Equal(t, tc.want, d.UDMaxPayload())
			limit := d.UDMaxPayload()

			pd, err := d.AllocPD(ctx)
			require.NoError(t, err)
			cq, err := d.CreateCQ(ctx, 16)
			require.NoError(t, err)
			ud := make([]*vfrdma.QP, 2)
			for i := range ud {
				ud[i], err = pd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.UD, SendCQ: cq, RecvCQ: cq, QKey: 0x2222, SignalAll: true})
				require.NoError(t, err)
				require.NoError(t, ud[i].Connect(ctx, vfrdma.Remote{}, 0))
			}
			ah, err := pd.CreateAH(vfrdma.AHAttr{DGID: d.GID()})
			require.NoError(t, err)
			mr, err := pd.AllocMR(ctx, 3*8192, vfrdma.AccessLocalWrite)
			require.NoError(t, err)
			buf := mr.Bytes()
			for i := range limit + 1 {
				buf[i] = byte(i * 7)
			}
			_, err = ud[1].PostRecv([]vfrdma.RecvWR{{WRID: 1, SGEs: []vfrdma.SGE{mr.SGE(8192, vfrdma.UDHeaderRoom+limit)}}}, 0)
			require.NoError(t, err)
			send := func(n int) error {
				_, err := ud[0].PostSend([]vfrdma.SendWR{{WRID: uint64(n), SGEs: []vfrdma.SGE{mr.SGE(0, n)}, AH: ah, RemoteQPN: ud[1].QPN(), RemoteQKey: 0x2222}}, 0)
				return err
			}
			require.ErrorIs(t, send(limit+1), vfrdma.ErrInvalid, "one byte past the MTU")
			require.NoError(t, send(limit), "exactly the MTU")
			for _, wc := range waitWCs(t, ctx, cq, 2) {
				require.Equal(t, vfrdma.WCSuccess, wc.Status, "%+v", wc)
				if wc.Opcode == vfrdma.WCRecv {
					assert.EqualValues(t, vfrdma.UDHeaderRoom+limit, wc.ByteLen)
				}
			}
			assert.Equal(t, buf[:limit], buf[8192+vfrdma.UDHeaderRoom:8192+vfrdma.UDHeaderRoom+limit], "the datagram arrived whole")
		})
	}
}
