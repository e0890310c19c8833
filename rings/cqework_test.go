package rings_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/vfrdma/vfrdma/rings"
)

// DecodeCQEWork reads exactly the work-completion fields DecodeCQE reads,
// and leaves the others alone.
func TestDecodeCQEWorkMatchesDecodeCQE(t *testing.T) {
	b, want := cqeGolden()
	got := rings.CQE{PKeyIndex: 0x7777, SMAC: [6]byte{9, 9, 9, 9, 9, 9}}
	rings.DecodeCQEWork(b, &got)
	assert.Equal(t, want.WRID, got.WRID)
	assert.Equal(t, want.QP, got.QP)
	assert.Equal(t, want.Opcode, got.Opcode)
	assert.Equal(t, want.Status, got.Status)
	assert.Equal(t, want.ByteLen, got.ByteLen)
	assert.Equal(t, want.Imm, got.Imm)
	assert.Equal(t, want.SrcQP, got.SrcQP)
	assert.Equal(t, want.WCFlags, got.WCFlags)
	assert.Equal(t, want.VendorErr, got.VendorErr)
	assert.Equal(t, uint16(0x7777), got.PKeyIndex, "left alone")
	assert.Equal(t, [6]byte{9, 9, 9, 9, 9, 9}, got.SMAC, "left alone")
	assert.Zero(t, testing.AllocsPerRun(100, func() { rings.DecodeCQEWork(b, &got) }))
}
