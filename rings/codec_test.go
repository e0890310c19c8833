package rings_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/vfrdma/vfrdma/rings"
)

// at writes hand-listed bytes into b at off; the golden layouts below are
// built with it, one field per line, offsets from the device header.
func at(b []byte, off int, v ...byte) { copy(b[off:], v) }

func filled(n int, v byte) []byte { return bytes.Repeat([]byte{v}, n) }

func TestStrides(t *testing.T) {
	for _, c := range []struct{ sge, send, recv int }{
		{-1, 128, 16}, {0, 128, 16},
		{1, 128, 32}, {2, 128, 64}, {3, 128, 64}, {4, 256, 128},
		{5, 256, 128}, {7, 256, 128}, {8, 256, 256}, {11, 256, 256}, {12, 512, 256}, {30, 1024, 512},
	} {
		if got := rings.SendStride(c.sge); got != c.send {
			t.Errorf("SendStride(%d) = %d, want %d", c.sge, got, c.send)
		}
		if got := rings.RecvStride(c.sge); got != c.recv {
			t.Errorf("RecvStride(%d) = %d, want %d", c.sge, got, c.recv)
		}
	}
	if rings.SendHeaderSize != 80 || rings.RecvHeaderSize != 16 || rings.SGESize != 16 || rings.CQESize != 64 {
		t.Fatal("element sizes")
	}
}

func TestPutSendWQERCGolden(t *testing.T) {
	w := rings.SendWQE{
		WRID:     0x0102030405060708,
		Opcode:   rings.WRSendWithImm,
		Flags:    rings.SendSignaled | rings.SendSolicited,
		Imm:      0xa1b2c3d4,
		GIDIndex: 2,
		SGEs: []rings.SGE{
			{Addr: 0x1122334455667788, Length: 0x100, LKey: 0x0badf00d},
			{Addr: 0x99aabbccddeeff00, Length: 0x20, LKey: 7},
		},
	}
	slot := filled(128, 0xee)
	rings.PutSendWQE(slot, &w)

	want := filled(128, 0xee)
	clear(want[:112])
	at(want, 0, 0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01)  // wr_id
	at(want, 8, 0x02, 0x00, 0x00, 0x00)                          // num_sge
	at(want, 12, 0x20, 0x01, 0x00, 0x00)                         // total_len 0x120
	at(want, 16, 0x03, 0x00, 0x00, 0x00)                         // opcode SEND_WITH_IMM
	at(want, 20, 0x06, 0x00, 0x00, 0x00)                         // SIGNALED|SOLICITED
	at(want, 24, 0xa1, 0xb2, 0xc3, 0xd4)                         // imm_data, network order
	at(want, 65, 0x02)                                           // gid_index, RC too
	at(want, 80, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11) // sge[0].addr
	at(want, 88, 0x00, 0x01, 0x00, 0x00)                         // sge[0].length
	at(want, 92, 0x0d, 0xf0, 0xad, 0x0b)                         // sge[0].lkey
	at(want, 96, 0x00, 0xff, 0xee, 0xdd, 0xcc, 0xbb, 0xaa, 0x99) // sge[1].addr
	at(want, 104, 0x20, 0x00, 0x00, 0x00)                        // sge[1].length
	at(want, 108, 0x07, 0x00, 0x00, 0x00)                        // sge[1].lkey
	if !bytes.Equal(slot, want) {
		t.Fatalf("RC WQE:\n got % x\nwant % x", slot, want)
	}
}

func TestPutSendWQEUDGolden(t *testing.T) {
	ud := rings.UDAddr{
		RemoteQPN:    0xabc,
		RemoteQKey:   0x11111111,
		PortPD:       rings.PortPD(3, 1),
		DGID:         [16]byte{0xfe, 0x80, 15: 0x01},
		GIDIndex:     5,
		HopLimit:     64,
		TrafficClass: 0x12,
		SL:           3,
		FlowLabel:    0xabcde,
		SrcPathBits:  0x80,
		StatRate:     2,
		DMAC:         [6]byte{0x02, 0, 0, 0, 0, 0x01},
	}
	w := rings.SendWQE{
		WRID:     0xfeedface00000001,
		Opcode:   rings.WRSend,
		Flags:    rings.SendSignaled,
		SGEs:     []rings.SGE{{Addr: 0x1000, Length: 64, LKey: 0x11}},
		UD:       &ud,
		GIDIndex: 9, // the AV's own index wins
	}
	slot := filled(128, 0xee)
	rings.PutSendWQE(slot, &w)

	want := filled(128, 0xee)
	clear(want[:96])
	at(want, 0, 0x01, 0x00, 0x00, 0x00, 0xce, 0xfa, 0xed, 0xfe)           // wr_id
	at(want, 8, 0x01, 0x00, 0x00, 0x00)                                   // num_sge
	at(want, 12, 0x40, 0x00, 0x00, 0x00)                                  // total_len
	at(want, 16, 0x02, 0x00, 0x00, 0x00)                                  // SEND
	at(want, 20, 0x02, 0x00, 0x00, 0x00)                                  // SIGNALED
	at(want, 32, 0xbc, 0x0a, 0x00, 0x00)                                  // ud.remote_qpn
	at(want, 36, 0x11, 0x11, 0x11, 0x11)                                  // ud.remote_qkey
	at(want, 40, 0x03, 0x00, 0x00, 0x01)                                  // av.port_pd: pd 3, port 1
	at(want, 44, 0xde, 0xbc, 0x2a, 0x31)                                  // av.sl_tclass_flowlabel 0x312abcde
	at(want, 48, 0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01) // av.dgid
	at(want, 64, 0x80)                                                    // av.src_path_bits
	at(want, 65, 0x05)                                                    // av.gid_index
	at(want, 66, 0x02)                                                    // av.stat_rate
	at(want, 67, 0x40)                                                    // av.hop_limit
	at(want, 68, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01)                      // av.dmac
	at(want, 80, 0x00, 0x10, 0, 0, 0, 0, 0, 0)                            // sge[0].addr
	at(want, 88, 0x40, 0x00, 0x00, 0x00)                                  // sge[0].length
	at(want, 92, 0x11, 0x00, 0x00, 0x00)                                  // sge[0].lkey
	if !bytes.Equal(slot, want) {
		t.Fatalf("UD WQE:\n got % x\nwant % x", slot, want)
	}
}

func TestSendWQEGIDIndexRule(t *testing.T) {
	slot := make([]byte, 128)
	for _, c := range []struct {
		name   string
		w      rings.SendWQE
		want65 byte
	}{
		{"RC", rings.SendWQE{GIDIndex: 3}, 3},
		{"UD, AV index zero", rings.SendWQE{GIDIndex: 4, UD: &rings.UDAddr{}}, 4},
		{"UD, AV index set", rings.SendWQE{GIDIndex: 4, UD: &rings.UDAddr{GIDIndex: 6}}, 6},
		{"UD, only AV", rings.SendWQE{UD: &rings.UDAddr{GIDIndex: 6}}, 6},
	} {
		rings.PutSendWQE(slot, &c.w)
		if slot[65] != c.want65 {
			t.Errorf("%s: byte 65 = %d, want %d", c.name, slot[65], c.want65)
		}
	}
}

func TestSendWQEImmByOpcode(t *testing.T) {
	slot := make([]byte, 80)
	for _, c := range []struct {
		op   uint32
		want []byte
	}{
		{rings.WRSendWithImm, []byte{0x12, 0x34, 0x56, 0x78}},
		{rings.WRRDMAWriteWithImm, []byte{0x12, 0x34, 0x56, 0x78}},
		{rings.WRSendWithInv, []byte{0x78, 0x56, 0x34, 0x12}},
		{rings.WRRDMAReadWithInv, []byte{0x78, 0x56, 0x34, 0x12}},
		{rings.WRLocalInv, []byte{0x78, 0x56, 0x34, 0x12}},
	} {
		w := rings.SendWQE{Opcode: c.op, Imm: 0x12345678}
		rings.PutSendWQE(slot, &w)
		if !bytes.Equal(slot[24:28], c.want) {
			t.Errorf("opcode %d: bytes 24..27 = % x, want % x", c.op, slot[24:28], c.want)
		}
		var back rings.SendWQE
		if err := rings.DecodeSendWQE(slot, &back); err != nil || back.Imm != 0x12345678 {
			t.Errorf("opcode %d: decoded Imm %#x, %v", c.op, back.Imm, err)
		}
	}
}

// TestPutSendWQEClearsHeader: a slot reused after a UD WQE carries no stale
// union bytes into an RC WQE.
func TestPutSendWQEClearsHeader(t *testing.T) {
	slot := filled(256, 0xff)
	rings.PutSendWQE(slot, &rings.SendWQE{WRID: 1})
	for i, b := range slot[:80] {
		if b != 0 && i != 0 {
			t.Fatalf("byte %d = %#x after an empty RC WQE", i, b)
		}
	}
	if slot[80] != 0xff {
		t.Fatal("PutSendWQE wrote past its SGEs")
	}
}

func TestPutShortSlotPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"send header": func() { rings.PutSendWQE(make([]byte, 79), &rings.SendWQE{}) },
		"send SGEs":   func() { rings.PutSendWQE(make([]byte, 128), &rings.SendWQE{SGEs: make([]rings.SGE, 4)}) },
		"recv":        func() { rings.PutRecvWQE(make([]byte, 31), 0, make([]rings.SGE, 1)) },
		"CQE":         func() { rings.DecodeCQE(make([]byte, 63), &rings.CQE{}) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

func TestPutRecvWQEGolden(t *testing.T) {
	slot := filled(64, 0xee)
	rings.PutRecvWQE(slot, 0x1122334455667788, []rings.SGE{
		{Addr: 0xa000, Length: 0x800, LKey: 0x42},
		{Addr: 0xb000, Length: 0x10, LKey: 0x43},
	})
	want := filled(64, 0xee)
	clear(want[:48])
	at(want, 0, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11) // wr_id
	at(want, 8, 0x02, 0x00, 0x00, 0x00)                         // num_sge
	at(want, 12, 0x10, 0x08, 0x00, 0x00)                        // total_len 0x810
	at(want, 16, 0x00, 0xa0, 0, 0, 0, 0, 0, 0)                  // sge[0].addr
	at(want, 24, 0x00, 0x08, 0x00, 0x00)                        // sge[0].length
	at(want, 28, 0x42, 0x00, 0x00, 0x00)                        // sge[0].lkey
	at(want, 32, 0x00, 0xb0, 0, 0, 0, 0, 0, 0)                  // sge[1].addr
	at(want, 40, 0x10, 0x00, 0x00, 0x00)                        // sge[1].length
	at(want, 44, 0x43, 0x00, 0x00, 0x00)                        // sge[1].lkey
	if !bytes.Equal(slot, want) {
		t.Fatalf("recv WQE:\n got % x\nwant % x", slot, want)
	}
}

// cqeGolden is a CQE built by hand from the field offsets of pvrdma_cqe,
// with every field non-zero and the reserved bytes set to show that they
// are ignored.
func cqeGolden() ([]byte, rings.CQE) {
	b := make([]byte, 64)
	at(b, 0, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08) // wr_id
	at(b, 8, 0xcd, 0xab, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00) // qp
	at(b, 16, 0x80, 0x00, 0x00, 0x00)                        // opcode RECV
	at(b, 20, 0x05, 0x00, 0x00, 0x00)                        // status WR_FLUSH_ERR
	at(b, 24, 0x28, 0x04, 0x00, 0x00)                        // byte_len
	at(b, 28, 0xde, 0xad, 0xbe, 0xef)                        // imm_data, network order
	at(b, 32, 0x34, 0x12, 0x00, 0x00)                        // src_qp
	at(b, 36, 0x41, 0x00, 0x00, 0x00)                        // wc_flags GRH|NETWORK_HDR_TYPE
	at(b, 40, 0x01, 0x02, 0x00, 0x00)                        // vendor_err 0x201
	at(b, 44, 0xff, 0xff)                                    // pkey_index
	at(b, 46, 0x02, 0x01)                                    // slid
	at(b, 48, 0x07)                                          // sl
	at(b, 49, 0x55)                                          // dlid_path_bits
	at(b, 50, 0x01)                                          // port_num
	at(b, 51, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56)            // smac
	at(b, 57, 0x02)                                          // network_hdr_type IPv6
	at(b, 58, 0x99, 0x99, 0x99, 0x99, 0x99, 0x99)            // reserved
	return b, rings.CQE{
		WRID: 0x0807060504030201, QP: 0xabcd, Opcode: rings.WCRecv, Status: rings.WCWRFlushErr,
		ByteLen: 0x428, Imm: 0xdeadbeef, SrcQP: 0x1234, WCFlags: rings.WCFlagGRH | rings.WCFlagWithNetworkHdrType,
		VendorErr: rings.VendorErrPostFailed, PKeyIndex: 0xffff, SLID: 0x0102, SL: 7, DLIDPathBits: 0x55,
		PortNum: 1, SMAC: [6]byte{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}, NetworkHdrType: rings.NetworkHdrIPv6,
	}
}

func TestDecodeCQEGolden(t *testing.T) {
	b, want := cqeGolden()
	c := rings.CQE{WRID: 99, SMAC: [6]byte{9, 9, 9, 9, 9, 9}}
	rings.DecodeCQE(b, &c)
	if c != want {
		t.Fatalf("DecodeCQE:\n got %+v\nwant %+v", c, want)
	}
	out := filled(64, 0xaa)
	rings.PutCQE(out, &want)
	clear(b[58:])
	if !bytes.Equal(out, b) {
		t.Fatalf("PutCQE:\n got % x\nwant % x", out, b)
	}
}

func TestDecodeWQERoundTrip(t *testing.T) {
	ud := rings.UDAddr{RemoteQPN: 1, RemoteQKey: 2, PortPD: 3, DGID: [16]byte{1, 2, 3}, GIDIndex: 4, HopLimit: 5,
		TrafficClass: 6, SL: 7, FlowLabel: 0xfffff, SrcPathBits: 8, StatRate: 9, DMAC: [6]byte{1, 2, 3, 4, 5, 6}}
	w := rings.SendWQE{WRID: 10, Opcode: rings.WRSendWithImm, Flags: 3, Imm: 11, UD: &ud, GIDIndex: 4,
		SGEs: []rings.SGE{{1, 2, 3}, {4, 5, 6}, {7, 8, 9}, {10, 11, 12}}}
	slot := make([]byte, rings.SendStride(4))
	rings.PutSendWQE(slot, &w)
	var gotUD rings.UDAddr
	got := rings.SendWQE{UD: &gotUD, SGEs: make([]rings.SGE, 0, 4)}
	if err := rings.DecodeSendWQE(slot, &got); err != nil {
		t.Fatal(err)
	}
	if gotUD != ud || got.WRID != w.WRID || got.Opcode != w.Opcode || got.Flags != w.Flags || got.Imm != w.Imm ||
		got.GIDIndex != w.GIDIndex || len(got.SGEs) != 4 || got.SGEs[3] != w.SGEs[3] || got.SGEs[0] != w.SGEs[0] {
		t.Fatalf("round trip:\n got %+v %+v\nwant %+v %+v", got, gotUD, w, ud)
	}
	// Room for fewer SGEs than num_sge: an error, no SGEs.
	got.SGEs = make([]rings.SGE, 0, 3)
	err := rings.DecodeSendWQE(slot, &got)
	var we *rings.WQEError
	if !errors.Is(err, rings.ErrInvalid) || !errors.As(err, &we) || we.NumSGE != 4 || we.Room != 3 || len(got.SGEs) != 0 {
		t.Fatalf("short SGE buffer: %v, %d SGEs", err, len(got.SGEs))
	}
	// A slot too short for num_sge.
	got.SGEs = make([]rings.SGE, 0, 8)
	if err := rings.DecodeSendWQE(slot[:128], &got); !errors.As(err, &we) || we.Room != 3 {
		t.Fatalf("short slot: %v", err)
	}

	rslot := make([]byte, rings.RecvStride(2))
	rings.PutRecvWQE(rslot, 77, []rings.SGE{{1, 2, 3}, {4, 5, 6}})
	sges := make([]rings.SGE, 4)
	id, n, err := rings.DecodeRecvWQE(rslot, sges)
	if err != nil || id != 77 || n != 2 || sges[0] != (rings.SGE{1, 2, 3}) || sges[1] != (rings.SGE{4, 5, 6}) {
		t.Fatalf("recv round trip: %d %d %v %v", id, n, err, sges)
	}
	if _, n, err := rings.DecodeRecvWQE(rslot, sges[:1]); n != 0 || !errors.Is(err, rings.ErrInvalid) {
		t.Fatalf("recv with room for 1 of 2: %d, %v", n, err)
	}
	_, _, err = rings.DecodeRecvWQE(rslot, nil)
	if want := "rings: WQE num_sge 2 exceeds the 0 SGEs that fit: rings: invalid argument"; err == nil || err.Error() != want {
		t.Fatalf("WQEError message %q, want %q", err, want)
	}
}

func TestNames(t *testing.T) {
	for _, c := range []struct {
		got, want string
	}{
		{rings.WCStatus(rings.WCSuccess).String(), "SUCCESS"},
		{rings.WCStatus(rings.WCWRFlushErr).String(), "WR_FLUSH_ERR"},
		{rings.WCStatus(rings.WCRNRRetryExcErr).String(), "RNR_RETRY_EXC_ERR"},
		{rings.WCStatus(rings.WCGeneralErr).String(), "GENERAL_ERR"},
		{rings.WCStatus(22).String(), "WC_STATUS_22"},
		{rings.WCOpcode(rings.WCSend).String(), "SEND"},
		{rings.WCOpcode(rings.WCMaskedFetchAdd).String(), "MASKED_FETCH_ADD"},
		{rings.WCOpcode(rings.WCRecv).String(), "RECV"},
		{rings.WCOpcode(rings.WCRecvRDMAWithImm).String(), "RECV_RDMA_WITH_IMM"},
		{rings.WCOpcode(11).String(), "WC_OPCODE_11"},
	} {
		if c.got != c.want {
			t.Errorf("%q, want %q", c.got, c.want)
		}
	}
	// Spot checks of the numbering against the device header.
	if rings.WRError != 16 || rings.WRBindMW != 14 || rings.WCRespTimeoutErr != 20 || rings.WCFlagWithNetworkHdrType != 0x40 ||
		rings.SendIPCsum != 0x10 || rings.WCLocProtErr != 4 || rings.WRSend != 2 {
		t.Fatal("constant numbering")
	}
	if rings.PortPD(0x12345678, 2) != 0x02345678 {
		t.Fatal("PortPD")
	}
}
