package rings_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/rings"
)

// FuzzConsumer: any prod_tail the device writes, against any valid
// cons_head of any ring size, either reads as the right count or is a device
// fault that changes nothing; never a panic, never a slot out of range.
func FuzzConsumer(f *testing.F) {
	f.Add(uint8(0), uint32(0), uint32(1), uint16(1))
	f.Add(uint8(6), uint32(127), uint32(63), uint16(64))
	f.Add(uint8(12), uint32(4095), uint32(8191), uint16(9))
	f.Add(uint8(6), uint32(5), uint32(0xffffffff), uint16(3))
	f.Add(uint8(31), uint32(0), uint32(0x80000000), uint16(3))
	f.Fuzz(func(t *testing.T, logN uint8, head, tail uint32, take uint16) {
		n := 1 << (logN % 32)
		mask := uint32(2*n - 1)
		head &= mask
		_, s := newState(t, rings.StateOffsetRQ)
		s.SetConsHead(head)
		c, err := rings.NewConsumer(s, n)
		if err != nil {
			t.Fatal(err)
		}
		s.SetProdTail(tail)
		ready, err := c.Ready()
		want := (tail - head) & mask
		if tail&^mask != 0 || want > uint32(n) {
			var ie *rings.IndexError
			require.ErrorIs(t, err, rings.ErrDeviceFault, "invalid tail %#x (n=%d head=%#x)", tail, n, head)
			require.ErrorAs(t, err, &ie)
			require.Equal(t, tail, ie.Value, "IndexError.Value")
			require.Zero(t, ready, "Ready after a fault")
			require.Equal(t, head, s.ConsHead(), "fault moved cons_head")
			return
		}
		if err != nil || ready != int(want) {
			t.Fatalf("n=%d head=%#x tail=%#x: Ready = %d, %v; want %d", n, head, tail, ready, err, want)
		}
		for _, i := range []int{0, ready / 2, ready - 1} {
			if sl := c.Slot(i); sl < 0 || sl >= n || ready > 0 && sl != int((head+uint32(i))&uint32(n-1)) {
				t.Fatalf("Slot(%d) = %d", i, sl)
			}
		}
		k := int(take) % (ready + 1)
		c.Consume(k)
		if got := s.ConsHead(); got != (head+uint32(k))&mask {
			t.Fatalf("cons_head after Consume(%d) = %#x", k, got)
		}
	})
}

// FuzzProducer: any cons_head the device writes, against any published
// prod_tail and unpublished count, gives a free count in [0, n] that matches
// the model, or a device fault; never a panic.
func FuzzProducer(f *testing.F) {
	f.Add(uint8(0), uint32(0), uint16(0), uint32(1))
	f.Add(uint8(6), uint32(100), uint16(10), uint32(36))
	f.Add(uint8(12), uint32(8191), uint16(4096), uint32(4095))
	f.Add(uint8(6), uint32(3), uint16(1), uint32(0xdeadbeef))
	f.Add(uint8(31), uint32(0xffffffff), uint16(0), uint32(0x7fffffff))
	f.Fuzz(func(t *testing.T, logN uint8, pub uint32, unpub uint16, head uint32) {
		n := 1 << (logN % 32)
		mask := uint32(2*n - 1)
		pub &= mask
		_, s := newState(t, rings.StateOffsetSQ)
		s.SetProdTail(pub)
		p, err := rings.NewProducer(s, n)
		if err != nil {
			t.Fatal(err)
		}
		u := int(unpub) % (n + 1)
		p.Advance(u)
		s.SetConsHead(head)
		free, err := p.Free()
		inflight := (pub - head) & mask
		if head&^mask != 0 || inflight > uint32(n) {
			var ie *rings.IndexError
			require.ErrorIs(t, err, rings.ErrDeviceFault, "invalid head %#x (n=%d pub=%#x)", head, n, pub)
			require.ErrorAs(t, err, &ie)
			require.Equal(t, [2]uint32{head, pub}, [2]uint32{ie.Value, ie.Peer}, "IndexError.Value, Peer")
			require.Zero(t, free, "Free after a fault")
		} else if want := max(n-int(inflight)-u, 0); err != nil || free != want {
			t.Fatalf("n=%d pub=%#x unpub=%d head=%#x: Free = %d, %v; want %d", n, pub, u, head, free, err, want)
		}
		if free < 0 || free > n {
			t.Fatalf("Free = %d out of [0, %d]", free, n)
		}
		if s.ProdTail() != pub || p.Unpublished() != u {
			t.Fatal("Free changed the producer")
		}
		if sl := p.Next(int(unpub)); sl < 0 || sl >= n {
			t.Fatalf("Next = %d", sl)
		}
	})
}

// FuzzDecodeCQE: every 64-byte pattern decodes to the fields at the
// offsets of pvrdma_cqe, and re-encodes to the same bytes (reserved zeroed).
func FuzzDecodeCQE(f *testing.F) {
	golden, _ := cqeGolden()
	f.Add(golden)
	f.Add(make([]byte, 64))
	f.Add(bytes.Repeat([]byte{0xff}, 64))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < rings.CQESize {
			b = append(b, make([]byte, rings.CQESize-len(b))...)
		}
		var c rings.CQE
		rings.DecodeCQE(b, &c)
		l := binary.LittleEndian
		if c.WRID != l.Uint64(b[0:]) || c.QP != l.Uint64(b[8:]) || c.Opcode != l.Uint32(b[16:]) ||
			c.Status != l.Uint32(b[20:]) || c.ByteLen != l.Uint32(b[24:]) || c.Imm != binary.BigEndian.Uint32(b[28:]) ||
			c.SrcQP != l.Uint32(b[32:]) || c.WCFlags != l.Uint32(b[36:]) || c.VendorErr != l.Uint32(b[40:]) ||
			c.PKeyIndex != l.Uint16(b[44:]) || c.SLID != l.Uint16(b[46:]) || c.SL != b[48] ||
			c.DLIDPathBits != b[49] || c.PortNum != b[50] || !bytes.Equal(c.SMAC[:], b[51:57]) || c.NetworkHdrType != b[57] {
			t.Fatalf("decoded %+v from % x", c, b[:64])
		}
		_ = rings.WCStatus(c.Status).String()
		_ = rings.WCOpcode(c.Opcode).String()
		out := make([]byte, rings.CQESize)
		rings.PutCQE(out, &c)
		if !bytes.Equal(out[:58], b[:58]) || !bytes.Equal(out[58:], make([]byte, 6)) {
			t.Fatalf("re-encoded % x from % x", out, b[:64])
		}
	})
}

// FuzzDecodeSendWQE: whatever a slot holds, the device-side decoder either
// rejects num_sge or returns a WQE that PutSendWQE writes back to the same
// bytes (up to total_len, which it recomputes, and the reserved bytes).
func FuzzDecodeSendWQE(f *testing.F) {
	seed := make([]byte, 256)
	rings.PutSendWQE(seed, &rings.SendWQE{WRID: 1, Opcode: rings.WRSendWithInv, Imm: 5, SGEs: []rings.SGE{{1, 2, 3}, {4, 5, 6}},
		UD: &rings.UDAddr{RemoteQPN: 9, DGID: [16]byte{1}, SL: 15, FlowLabel: 0xfffff, TrafficClass: 0xff}})
	f.Add(seed, uint8(4))
	f.Add(make([]byte, 80), uint8(0))
	f.Add(bytes.Repeat([]byte{0xff}, 200), uint8(255))
	f.Fuzz(func(t *testing.T, b []byte, room uint8) {
		if len(b) < rings.SendHeaderSize {
			b = append(b, make([]byte, rings.SendHeaderSize-len(b))...)
		}
		var ud rings.UDAddr
		w := rings.SendWQE{UD: &ud, SGEs: make([]rings.SGE, 0, int(room))}
		err := rings.DecodeSendWQE(b, &w)
		num := binary.LittleEndian.Uint32(b[8:])
		fits := uint64(num) <= uint64(min(int(room), (len(b)-rings.SendHeaderSize)/rings.SGESize))
		if fits != (err == nil) || err != nil && (!errors.Is(err, rings.ErrInvalid) || len(w.SGEs) != 0) {
			t.Fatalf("num_sge %d room %d len %d: %v", num, room, len(b), err)
		}
		if err != nil {
			return
		}
		out := make([]byte, len(b))
		rings.PutSendWQE(out, &w)
		for _, r := range [][2]int{{0, 12}, {16, 28}, {32, 74}, {80, rings.SendHeaderSize + rings.SGESize*int(num)}} {
			if !bytes.Equal(out[r[0]:r[1]], b[r[0]:r[1]]) {
				t.Fatalf("bytes %d..%d: % x, want % x", r[0], r[1], out[r[0]:r[1]], b[r[0]:r[1]])
			}
		}
	})
}

// FuzzDecodeRecvWQE is FuzzDecodeSendWQE for receive WQEs.
func FuzzDecodeRecvWQE(f *testing.F) {
	seed := make([]byte, 64)
	rings.PutRecvWQE(seed, 3, []rings.SGE{{1, 2, 3}})
	f.Add(seed, uint8(1))
	f.Add(bytes.Repeat([]byte{0xff}, 40), uint8(4))
	f.Fuzz(func(t *testing.T, b []byte, room uint8) {
		if len(b) < rings.RecvHeaderSize {
			b = append(b, make([]byte, rings.RecvHeaderSize-len(b))...)
		}
		sges := make([]rings.SGE, int(room))
		id, n, err := rings.DecodeRecvWQE(b, sges)
		num := binary.LittleEndian.Uint32(b[8:])
		fits := uint64(num) <= uint64(min(int(room), (len(b)-rings.RecvHeaderSize)/rings.SGESize))
		if fits != (err == nil) || id != binary.LittleEndian.Uint64(b) || err == nil && n != int(num) || err != nil && n != 0 {
			t.Fatalf("num_sge %d room %d len %d: n=%d %v", num, room, len(b), n, err)
		}
		if err != nil {
			return
		}
		out := make([]byte, len(b))
		rings.PutRecvWQE(out, id, sges[:n])
		end := rings.RecvHeaderSize + rings.SGESize*n
		if !bytes.Equal(out[:12], b[:12]) || !bytes.Equal(out[16:end], b[16:end]) {
			t.Fatalf("re-encoded % x from % x", out[:end], b[:end])
		}
	})
}
