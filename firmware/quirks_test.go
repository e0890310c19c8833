package firmware

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestQuirksFor(t *testing.T) {
	c := qemuCaps()
	q := QuirksFor(17, &c)
	assert.Equal(t, Quirks{Version: 17, Emulated: true, NoAsyncEvents: true, CQArmBoth: true, UnquiesceKeepsErr: true}, q, "QEMU caps")
	assert.Equal(t, SRQSwapUnknown, q.SRQSwap, "QEMU caps")
	assert.False(t, q.CreateQPV2(), "QEMU caps")
	assert.False(t, q.PFN64(), "QEMU caps")
	c.VendorID, c.VendorPartID, c.PageSizeCap = 0x15ad, 0x0820, PageSize
	q = QuirksFor(20, &c)
	assert.False(t, q.Emulated || q.NoAsyncEvents || q.CQArmBoth, "vendor caps: %+v", q)
	assert.True(t, q.CreateQPV2(), "vendor caps: %+v", q)
	assert.True(t, q.PFN64(), "vendor caps: %+v", q)
	q = QuirksFor(19, &c)
	assert.True(t, q.PFN64(), "version 19: %+v", q)
	assert.False(t, q.CreateQPV2(), "version 19: %+v", q)
}

func TestCQArm(t *testing.T) {
	qemu := Quirks{CQArmBoth: true}
	spec := Quirks{}
	for _, tc := range []struct {
		q    Quirks
		sol  bool
		want uint32
	}{
		{qemu, false, 0x60000000}, {qemu, true, 0x60000000},
		{spec, false, 0x40000000}, {spec, true, 0x20000000},
	} {
		assert.Equal(t, tc.want, tc.q.CQArm(tc.sol), "%+v solicited=%v", tc.q, tc.sol)
	}
}
