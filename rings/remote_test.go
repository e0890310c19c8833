package rings_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/rings"
)

// An RDMA WRITE WITH IMM fills the wr.rdma union: remote_addr at byte 32,
// rkey at byte 40 (pvrdma_sq_wqe_hdr), and the immediate in network order
// at byte 24; the rest of the union stays zero.
func TestPutSendWQERDMAFillsTheRDMAUnion(t *testing.T) {
	w := rings.SendWQE{
		WRID: 9, Opcode: rings.WRRDMAWriteWithImm, Flags: rings.SendSignaled, Imm: 0x01020304,
		RemoteAddr: 0x1122334455667788, RKey: 0xa1b2c3d4, CompareAdd: 0xdead, Swap: 0xbeef,
		SGEs: []rings.SGE{{Addr: 0x1000, Length: 64, LKey: 5}},
	}
	slot := filled(128, 0xee)
	rings.PutSendWQE(slot, &w)
	want := filled(128, 0xee)
	clear(want[:96])
	at(want, 0, 9)
	at(want, 8, 1)                                               // num_sge
	at(want, 12, 64)                                             // total_len
	at(want, 16, 0x01)                                           // RDMA_WRITE_WITH_IMM
	at(want, 20, 0x02)                                           // SIGNALED
	at(want, 24, 0x01, 0x02, 0x03, 0x04)                         // imm_data, network order
	at(want, 32, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11) // rdma.remote_addr
	at(want, 40, 0xd4, 0xc3, 0xb2, 0xa1)                         // rdma.rkey
	at(want, 80, 0x00, 0x10)                                     // sge[0].addr
	at(want, 88, 64)                                             // sge[0].length
	at(want, 92, 5)                                              // sge[0].lkey
	assert.Equal(t, want, slot)

	back := rings.SendWQE{SGEs: make([]rings.SGE, 0, 4)}
	require.NoError(t, rings.DecodeSendWQE(slot, &back))
	assert.Equal(t, w.RemoteAddr, back.RemoteAddr)
	assert.Equal(t, w.RKey, back.RKey)
	assert.Zero(t, back.CompareAdd, "an RDMA WQE carries no atomic operands")
	assert.Zero(t, back.Swap)
	assert.Equal(t, w.Imm, back.Imm)
}

// A compare-and-swap fills the wr.atomic union: remote_addr at 32,
// compare_add at 40, swap at 48, rkey at 56.
func TestPutSendWQEAtomicFillsTheAtomicUnion(t *testing.T) {
	for _, op := range []uint32{rings.WRAtomicCmpAndSwp, rings.WRAtomicFetchAndAdd} {
		w := rings.SendWQE{
			WRID: 3, Opcode: op, RemoteAddr: 0x0000_7000_0000_0008, RKey: 0x42,
			CompareAdd: 0x0102030405060708, Swap: 0x1112131415161718, Imm: 0x55,
			SGEs: []rings.SGE{{Addr: 0x2000, Length: 8, LKey: 6}},
		}
		slot := filled(128, 0xee)
		rings.PutSendWQE(slot, &w)
		want := filled(128, 0xee)
		clear(want[:96])
		at(want, 0, 3)
		at(want, 8, 1)
		at(want, 12, 8)
		at(want, 16, byte(op))
		at(want, 24, 0, 0, 0, 0x55)                                  // imm_data as given (the driver leaves it 0)
		at(want, 32, 0x08, 0, 0, 0, 0x00, 0x70, 0, 0)                // atomic.remote_addr
		at(want, 40, 0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01) // atomic.compare_add
		at(want, 48, 0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11) // atomic.swap
		at(want, 56, 0x42)                                           // atomic.rkey
		at(want, 80, 0x00, 0x20)
		at(want, 88, 8)
		at(want, 92, 6)
		assert.Equal(t, want, slot, "opcode %d", op)

		back := rings.SendWQE{SGEs: make([]rings.SGE, 0, 4)}
		require.NoError(t, rings.DecodeSendWQE(slot, &back))
		assert.Equal(t, w.RemoteAddr, back.RemoteAddr)
		assert.Equal(t, w.RKey, back.RKey)
		assert.Equal(t, w.CompareAdd, back.CompareAdd)
		assert.Equal(t, w.Swap, back.Swap)
	}
}

// A SEND, and any UD WQE, carries no remote side: the union bytes are the
// UD address or zero, whatever RemoteAddr and RKey hold.
func TestSendWQESendCarriesNoRemote(t *testing.T) {
	slot := filled(128, 0xee)
	rings.PutSendWQE(slot, &rings.SendWQE{Opcode: rings.WRSend, RemoteAddr: ^uint64(0), RKey: ^uint32(0), CompareAdd: 1, Swap: 2})
	assert.Equal(t, make([]byte, 48), slot[32:80], "the union of a SEND")

	ud := rings.UDAddr{RemoteQPN: 7, RemoteQKey: 8}
	rings.PutSendWQE(slot, &rings.SendWQE{Opcode: rings.WRSend, UD: &ud, RemoteAddr: ^uint64(0), RKey: ^uint32(0)})
	back := rings.SendWQE{UD: &rings.UDAddr{}}
	require.NoError(t, rings.DecodeSendWQE(slot, &back))
	assert.Equal(t, uint32(7), back.UD.RemoteQPN)
	assert.Zero(t, back.RemoteAddr, "a UD WQE decodes no remote address")
	assert.Zero(t, back.RKey)
}

// The encoder allocates nothing for the one-sided opcodes either.
func TestPutSendWQERemoteAllocatesNothing(t *testing.T) {
	slot := make([]byte, 128)
	w := rings.SendWQE{Opcode: rings.WRAtomicFetchAndAdd, RemoteAddr: 8, RKey: 1, CompareAdd: 1, SGEs: []rings.SGE{{Length: 8}}}
	r := rings.SendWQE{Opcode: rings.WRRDMARead, RemoteAddr: 8, RKey: 1, SGEs: []rings.SGE{{Length: 8}}}
	allocs := testing.AllocsPerRun(100, func() {
		rings.PutSendWQE(slot, &w)
		rings.PutSendWQE(slot, &r)
	})
	assert.Zero(t, allocs)
}
