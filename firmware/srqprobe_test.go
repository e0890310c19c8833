package firmware_test

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/firmware"
)

func TestProbeSRQSwap(t *testing.T) {
	// QEMU: detected even with a handle that names no SRQ (the header is
	// written on failure too), and cached.
	b := newBench(t, benchOpts{dev: qemu})
	s, err := b.ch.ProbeSRQSwap(bg, 1234)
	require.NoError(t, err, "QEMU probe")
	require.Equal(t, firmware.SRQSwapYes, s, "QEMU probe")
	require.Equal(t, firmware.SRQSwapYes, b.ch.Quirks().SRQSwap)
	n := len(b.tap.sent())
	s, _ = b.ch.ProbeSRQSwap(bg, 1234)
	assert.Equal(t, firmware.SRQSwapYes, s)
	assert.Len(t, b.tap.sent(), n, "probe not cached")

	// A device following the interface: the probe is a modify that changes
	// nothing.
	for _, v := range []uint32{17, 20} {
		sp := newBench(t, benchOpts{dev: vmware(v)})
		pd, err := sp.ch.CreatePD(bg, 0)
		require.NoError(t, err)
		dir, _ := sp.ringObject(1)
		srq, err := sp.ch.CreateSRQ(bg, firmware.CreateSRQRequest{PDirDMA: dir, PDHandle: pd, NChunks: 2,
			Attr: firmware.SRQAttr{MaxWR: 16, MaxSGE: 1, SRQLimit: 3}})
		require.NoError(t, err)
		// Arm the limit with MODIFY_SRQ as the interface numbers it (the
		// device ignores a limit at creation), without the probe.
		require.NoError(t, sp.ch.Exec(bg, firmware.ModifySRQRequest{SRQHandle: srq, AttrMask: firmware.SRQAttrLimit,
			Attr: firmware.SRQAttr{SRQLimit: 3}}, nil))
		s, err := sp.ch.ProbeSRQSwap(bg, srq)
		require.NoError(t, err, "version %d probe", v)
		require.Equal(t, firmware.SRQSwapNo, s, "version %d probe", v)
		info, ok := sp.dev.SRQ(srq)
		require.True(t, ok)
		assert.Equal(t, uint32(3), info.Limit, "the probe changed the SRQ")
		assert.False(t, sp.ch.Quirks().Emulated, "spec device taken for QEMU")
	}
}

func TestQuerySRQFirstCallErrors(t *testing.T) {
	// The first QuerySRQ on QEMU is the probe; its failure is the query's.
	b := newBench(t, benchOpts{dev: qemu})
	_, err := b.ch.QuerySRQ(bg, 77)
	var oe *firmware.OpError
	require.ErrorIs(t, err, syscall.EINVAL)
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, "QUERY_SRQ", oe.Op)
	assert.Equal(t, firmware.Status(0xFFFFFFEA), oe.Status)
	assert.Equal(t, firmware.SRQSwapYes, b.ch.Quirks().SRQSwap, "swap recorded")
	// Later queries go as code 18 and are reported as QUERY_SRQ.
	_, err = b.ch.QuerySRQ(bg, 77)
	require.ErrorIs(t, err, syscall.EINVAL)
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, "QUERY_SRQ (sent as code 18, QEMU swap)", oe.Op)
	sent := b.tap.sent()
	assert.Equal(t, firmware.CmdModifySRQ, sent[len(sent)-1], "code sent")
	// A modify QEMU refuses (it only takes the limit) fails loudly instead
	// of running a query and "succeeding".
	err = b.ch.ModifySRQ(bg, firmware.ModifySRQRequest{SRQHandle: 0, AttrMask: firmware.SRQAttrMaxWR, Attr: firmware.SRQAttr{MaxWR: 8}})
	assert.ErrorIs(t, err, syscall.EINVAL, "max_wr modify")
}

// TestModifySRQOnQEMUWithoutQuirk shows the trap the quirk avoids: code 18
// on QEMU runs a query and reports success without modifying anything.
func TestModifySRQOnQEMUWithoutQuirk(t *testing.T) {
	b := newBench(t, benchOpts{dev: qemu})
	pd, err := b.ch.CreatePD(bg, 0)
	require.NoError(t, err)
	dir, _ := b.ringObject(1)
	srq, err := b.ch.CreateSRQ(bg, firmware.CreateSRQRequest{PDirDMA: dir, PDHandle: pd, NChunks: 2,
		Attr: firmware.SRQAttr{MaxWR: 16, MaxSGE: 1, SRQLimit: 3}})
	require.NoError(t, err)
	limit := func() uint32 {
		info, ok := b.dev.SRQ(srq)
		require.True(t, ok)
		return info.Limit
	}
	require.NoError(t, b.ch.Exec(bg, firmware.ModifySRQRequest{SRQHandle: srq, AttrMask: firmware.SRQAttrLimit, Attr: firmware.SRQAttr{SRQLimit: 9}}, nil))
	require.Equal(t, uint32(3), limit(), "the model does not model the swap")
	require.NoError(t, b.ch.ModifySRQ(bg, firmware.ModifySRQRequest{SRQHandle: srq, AttrMask: firmware.SRQAttrLimit, Attr: firmware.SRQAttr{SRQLimit: 9}}))
	assert.Equal(t, uint32(9), limit(), "ModifySRQ did not modify")
}
