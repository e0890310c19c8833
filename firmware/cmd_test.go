package firmware

import (
	"bytes"
	"encoding/hex"
	"errors"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
)

// Golden layouts: every expected byte is placed by hand at the offset the
// facts sheet (§4) gives, independently of the encoders, so a wrong offset
// or width fails.

func p8(b []byte, off int, v uint8)   { b[off] = v }
func p16(b []byte, off int, v uint16) { b[off], b[off+1] = byte(v), byte(v>>8) }
func p32(b []byte, off int, v uint32) {
	for i := range 4 {
		b[off+i] = byte(v >> (8 * i))
	}
}
func p64(b []byte, off int, v uint64) {
	for i := range 8 {
		b[off+i] = byte(v >> (8 * i))
	}
}

// wantReq builds an expected command slot: zeroes, code at 8, then fields.
func wantReq(code uint32, fields func(b []byte)) []byte {
	b := make([]byte, CmdSlotSize)
	p32(b, 8, code)
	fields(b)
	return b
}

func gid(seed byte) (g [16]byte) {
	for i := range g {
		g[i] = seed + byte(i)
	}
	return g
}

func TestRequestGolden(t *testing.T) {
	g1, g2, g3 := gid(0x10), gid(0x40), gid(0x70)
	attr := QPAttr{
		QPState: 3, CurQPState: 2, PathMTU: 3, PathMigState: 1,
		QKey: 0x11111111, RQPSN: 0x222222, SQPSN: 0x333333, DestQPNum: 0x444444,
		QPAccessFlags: 0x7, PKeyIndex: 0x5151, AltPKeyIndex: 0x5252,
		EnSQDAsyncNotify: 0x61, SQDraining: 0x62, MaxRDAtomic: 0x63, MaxDestRDAtomic: 0x64,
		MinRNRTimer: 0x65, PortNum: 0x66, Timeout: 0x67, RetryCnt: 0x68, RNRRetry: 0x69,
		AltPortNum: 0x6a, AltTimeout: 0x6b,
		Cap: QPCap{MaxSendWR: 0x71, MaxRecvWR: 0x72, MaxSendSGE: 0x73, MaxRecvSGE: 0x74, MaxInlineData: 0x75},
		AH: AHAttr{
			GRH:  GlobalRoute{DGID: g2, FlowLabel: 0x81828384, SGIDIndex: 0x85, HopLimit: 0x86, TrafficClass: 0x87},
			DLID: 0x8889, VLANID: 0x8a8b, SL: 0x8c, SrcPathBits: 0x8d, StaticRate: 0x8e, AHFlags: 0x8f,
			PortNum: 0x90, DMAC: [6]byte{0x91, 0x92, 0x93, 0x94, 0x95, 0x96},
		},
		AltAH: AHAttr{
			GRH:  GlobalRoute{DGID: g3, FlowLabel: 0xa1a2a3a4, SGIDIndex: 0xa5, HopLimit: 0xa6, TrafficClass: 0xa7},
			DLID: 0xa8a9, VLANID: 0xaaab, SL: 0xac, SrcPathBits: 0xad, StaticRate: 0xae, AHFlags: 0xaf,
			PortNum: 0xb0, DMAC: [6]byte{0xb1, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6},
		},
	}
	tests := []struct {
		name string
		req  Request
		want []byte
	}{
		{"QUERY_PORT", QueryPortRequest{Port: 0xA1}, wantReq(0, func(b []byte) { p8(b, 16, 0xA1) })},
		{"QUERY_PKEY", QueryPKeyRequest{Port: 0xA1, Index: 0xA2}, wantReq(1, func(b []byte) { p8(b, 16, 0xA1); p8(b, 17, 0xA2) })},
		{"CREATE_PD", CreatePDRequest{CtxHandle: 0xA1A2A3A4}, wantReq(2, func(b []byte) { p32(b, 16, 0xA1A2A3A4) })},
		{"DESTROY_PD", DestroyPDRequest{PDHandle: 0xA1A2A3A4}, wantReq(3, func(b []byte) { p32(b, 16, 0xA1A2A3A4) })},
		{"CREATE_MR", CreateMRRequest{Start: 0x1111222233334444, Length: 0x5555666677778888, PDirDMA: 0x99990000AAAA1000,
			PDHandle: 0xB1B2B3B4, AccessFlags: 0xC1C2C3C4, Flags: 0xD1D2D3D4, NChunks: 0xE1E2E3E4},
			wantReq(4, func(b []byte) {
				p64(b, 16, 0x1111222233334444)
				p64(b, 24, 0x5555666677778888)
				p64(b, 32, 0x99990000AAAA1000)
				p32(b, 40, 0xB1B2B3B4)
				p32(b, 44, 0xC1C2C3C4)
				p32(b, 48, 0xD1D2D3D4)
				p32(b, 52, 0xE1E2E3E4)
			})},
		{"DESTROY_MR", DestroyMRRequest{MRHandle: 0xA1A2A3A4}, wantReq(5, func(b []byte) { p32(b, 16, 0xA1A2A3A4) })},
		{"CREATE_CQ", CreateCQRequest{PDirDMA: 0x1111222233334000, CtxHandle: 0xB1B2B3B4, CQE: 0xC1C2C3C4, NChunks: 0xD1D2D3D4},
			wantReq(6, func(b []byte) {
				p64(b, 16, 0x1111222233334000)
				p32(b, 24, 0xB1B2B3B4)
				p32(b, 28, 0xC1C2C3C4)
				p32(b, 32, 0xD1D2D3D4)
			})},
		{"RESIZE_CQ", ResizeCQRequest{CQHandle: 0xA1A2A3A4, CQE: 0xB1B2B3B4}, wantReq(7, func(b []byte) { p32(b, 16, 0xA1A2A3A4); p32(b, 20, 0xB1B2B3B4) })},
		{"DESTROY_CQ", DestroyCQRequest{CQHandle: 0xA1A2A3A4}, wantReq(8, func(b []byte) { p32(b, 16, 0xA1A2A3A4) })},
		{"CREATE_QP", CreateQPRequest{PDirDMA: 0x1111222233334000, PDHandle: 0xA1, SendCQHandle: 0xA2, RecvCQHandle: 0xA3,
			SRQHandle: 0xA4, MaxSendWR: 0xA5, MaxRecvWR: 0xA6, MaxSendSGE: 0xA7, MaxRecvSGE: 0xA8, MaxInlineData: 0xA9,
			LKey: 0xAA, AccessFlags: 0xAB, TotalChunks: 0xB1B2, SendChunks: 0xB3B4, MaxAtomicArg: 0xB5B6,
			SQSigAll: true, QPType: QPTypeUD, IsSRQ: true},
			wantReq(9, func(b []byte) {
				p64(b, 16, 0x1111222233334000)
				for i, v := range []uint32{0xA1, 0xA2, 0xA3, 0xA4, 0xA5, 0xA6, 0xA7, 0xA8, 0xA9, 0xAA, 0xAB} {
					p32(b, 24+4*i, v)
				}
				p16(b, 68, 0xB1B2)
				p16(b, 70, 0xB3B4)
				p16(b, 72, 0xB5B6)
				p8(b, 74, 1)
				p8(b, 75, 4)
				p8(b, 76, 1)
			})},
		{"MODIFY_QP", ModifyQPRequest{QPHandle: 0xF1F2F3F4, AttrMask: 0x1FFFFF, Attr: attr},
			wantReq(10, func(b []byte) {
				p32(b, 16, 0xF1F2F3F4)
				p32(b, 20, 0x1FFFFF)
				p32(b, 24, 3)
				p32(b, 28, 2)
				p32(b, 32, 3)
				p32(b, 36, 1)
				p32(b, 40, 0x11111111)
				p32(b, 44, 0x222222)
				p32(b, 48, 0x333333)
				p32(b, 52, 0x444444)
				p32(b, 56, 0x7)
				p16(b, 60, 0x5151)
				p16(b, 62, 0x5252)
				for i, v := range []uint8{0x61, 0x62, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69, 0x6a, 0x6b} {
					p8(b, 64+i, v) // en_sqd_async_notify @64 ... alt_timeout @74
				}
				p32(b, 80, 0x71)
				p32(b, 84, 0x72)
				p32(b, 88, 0x73)
				p32(b, 92, 0x74)
				p32(b, 96, 0x75)
				copy(b[104:120], g2[:])
				p32(b, 120, 0x81828384)
				p8(b, 124, 0x85)
				p8(b, 125, 0x86)
				p8(b, 126, 0x87)
				p16(b, 128, 0x8889)
				p16(b, 130, 0x8a8b)
				p8(b, 132, 0x8c)
				p8(b, 133, 0x8d)
				p8(b, 134, 0x8e)
				p8(b, 135, 0x8f)
				p8(b, 136, 0x90)
				copy(b[137:143], []byte{0x91, 0x92, 0x93, 0x94, 0x95, 0x96})
				copy(b[144:160], g3[:])
				p32(b, 160, 0xa1a2a3a4)
				p8(b, 164, 0xa5)
				p8(b, 165, 0xa6)
				p8(b, 166, 0xa7)
				p16(b, 168, 0xa8a9)
				p16(b, 170, 0xaaab)
				p8(b, 172, 0xac)
				p8(b, 173, 0xad)
				p8(b, 174, 0xae)
				p8(b, 175, 0xaf)
				p8(b, 176, 0xb0)
				copy(b[177:183], []byte{0xb1, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6})
			})},
		{"QUERY_QP", QueryQPRequest{QPHandle: 0xA1A2A3A4, AttrMask: 0xB1B2B3B4}, wantReq(11, func(b []byte) { p32(b, 16, 0xA1A2A3A4); p32(b, 20, 0xB1B2B3B4) })},
		{"DESTROY_QP", DestroyQPRequest{QPHandle: 0xA1A2A3A4}, wantReq(12, func(b []byte) { p32(b, 16, 0xA1A2A3A4) })},
		{"CREATE_UC/32", CreateUCRequest{PFN: 0xA1A2A3A4}, wantReq(13, func(b []byte) { p32(b, 16, 0xA1A2A3A4) })},
		{"CREATE_UC/64", CreateUCRequest{PFN: 0xB1B2B3B4A1A2A3A4, PFN64: true}, wantReq(13, func(b []byte) { p64(b, 16, 0xB1B2B3B4A1A2A3A4) })},
		{"DESTROY_UC", DestroyUCRequest{CtxHandle: 0xA1A2A3A4}, wantReq(14, func(b []byte) { p32(b, 16, 0xA1A2A3A4) })},
		{"CREATE_BIND", CreateBindRequest{MTU: 0xA1A2A3A4, VLAN: 0xB1B2B3B4, Index: 0xC1C2C3C4, GID: g1, GIDType: 0xD1},
			wantReq(15, func(b []byte) {
				p32(b, 16, 0xA1A2A3A4)
				p32(b, 20, 0xB1B2B3B4)
				p32(b, 24, 0xC1C2C3C4)
				copy(b[28:44], g1[:])
				p8(b, 44, 0xD1)
			})},
		{"DESTROY_BIND", DestroyBindRequest{Index: 0xA1A2A3A4, GID: g1},
			wantReq(16, func(b []byte) { p32(b, 16, 0xA1A2A3A4); copy(b[20:36], g1[:]) })},
		{"CREATE_SRQ", CreateSRQRequest{PDirDMA: 0x1111222233334000, PDHandle: 0xA1A2A3A4, NChunks: 0xB1B2B3B4,
			Attr: SRQAttr{MaxWR: 0xC1C2C3C4, MaxSGE: 0xD1D2D3D4, SRQLimit: 0xE1E2E3E4}, SRQType: 0xF1},
			wantReq(17, func(b []byte) {
				p64(b, 16, 0x1111222233334000)
				p32(b, 24, 0xA1A2A3A4)
				p32(b, 28, 0xB1B2B3B4)
				p32(b, 32, 0xC1C2C3C4)
				p32(b, 36, 0xD1D2D3D4)
				p32(b, 40, 0xE1E2E3E4)
				p8(b, 48, 0xF1)
			})},
		{"MODIFY_SRQ", ModifySRQRequest{SRQHandle: 0xA1A2A3A4, AttrMask: 0xB1B2B3B4, Attr: SRQAttr{MaxWR: 0xC1C2C3C4, MaxSGE: 0xD1D2D3D4, SRQLimit: 0xE1E2E3E4}},
			wantReq(18, func(b []byte) {
				p32(b, 16, 0xA1A2A3A4)
				p32(b, 20, 0xB1B2B3B4)
				p32(b, 24, 0xC1C2C3C4)
				p32(b, 28, 0xD1D2D3D4)
				p32(b, 32, 0xE1E2E3E4)
			})},
		{"QUERY_SRQ", QuerySRQRequest{SRQHandle: 0xA1A2A3A4}, wantReq(19, func(b []byte) { p32(b, 16, 0xA1A2A3A4) })},
		{"DESTROY_SRQ", DestroySRQRequest{SRQHandle: 0xA1A2A3A4}, wantReq(20, func(b []byte) { p32(b, 16, 0xA1A2A3A4) })},
		// The QEMU-swap variants: same layouts, other codes.
		{"probe", srqProbe{handle: 0xA1A2A3A4}, wantReq(18, func(b []byte) { p32(b, 16, 0xA1A2A3A4) })},
		{"swapped query", swappedQuerySRQ{handle: 0xA1A2A3A4}, wantReq(18, func(b []byte) { p32(b, 16, 0xA1A2A3A4) })},
		{"swapped modify", swappedModifySRQ{r: ModifySRQRequest{SRQHandle: 0xA1A2A3A4, AttrMask: 2, Attr: SRQAttr{SRQLimit: 0xE1E2E3E4}}},
			wantReq(19, func(b []byte) { p32(b, 16, 0xA1A2A3A4); p32(b, 20, 2); p32(b, 32, 0xE1E2E3E4) })},
	}
	seen := map[Cmd]bool{}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := make([]byte, CmdSlotSize+8)
			for i := range got {
				got[i] = 0xCC // stale bytes the encoder must clear
			}
			if err := tc.req.Encode(got); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got[:CmdSlotSize], tc.want) {
				t.Errorf("encoding differs:\n got %s\nwant %s", hex.EncodeToString(got[:CmdSlotSize]), hex.EncodeToString(tc.want))
			}
			if got[CmdSlotSize] != 0xCC {
				t.Error("encoder wrote past the slot")
			}
			if err := tc.req.Encode(make([]byte, CmdSlotSize-1)); !errors.Is(err, ErrInvalid) {
				t.Errorf("short slot: %v, want ErrInvalid", err)
			}
		})
		seen[tc.req.Cmd()] = true
	}
	for c := range Cmd(NumCmds) {
		if !seen[c] {
			t.Errorf("no golden test for %v", c)
		}
	}
}

func TestEncodeRequestCookie(t *testing.T) {
	b := make([]byte, CmdSlotSize)
	if err := EncodeRequest(b, 0x0102030405060708, CreatePDRequest{CtxHandle: 9}); err != nil {
		t.Fatal(err)
	}
	want := wantReq(2, func(b []byte) { p64(b, 0, 0x0102030405060708); p32(b, 16, 9) })
	if !bytes.Equal(b, want) {
		t.Errorf("got %x\nwant %x", b, want)
	}
}

// resp builds a response slot with the given header fields.
func resp(cookie uint64, ack uint32, e uint8, fields func(b []byte)) []byte {
	b := make([]byte, RespSlotSize)
	p64(b, 0, cookie)
	p32(b, 8, ack)
	p8(b, 12, e)
	if fields != nil {
		fields(b)
	}
	return b
}

func TestResponseGolden(t *testing.T) {
	t.Run("QUERY_PORT", func(t *testing.T) {
		b := resp(1, 0x80000000, 0, func(b []byte) {
			for i, v := range []uint32{4, 5, 3, 0x1004, 0x1005, 0x1006, 0x1007, 0x1008} {
				p32(b, 16+4*i, v) // state @16 ... qkey_viol_cntr @44
			}
			p16(b, 48, 0x2001)
			p16(b, 50, 0x2002)
			p16(b, 52, 0x2003)
			for i, v := range []uint8{0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0x38} {
				p8(b, 54+i, v) // lmc @54 ... phys_state @61
			}
			p16(b, 62, 0xFFFF) // reserved
		})
		var r QueryPortResponse
		if err := r.Decode(b); err != nil {
			t.Fatal(err)
		}
		want := PortAttr{State: 4, MaxMTU: 5, ActiveMTU: 3, GIDTblLen: 0x1004, PortCapFlags: 0x1005, MaxMsgSz: 0x1006,
			BadPKeyCntr: 0x1007, QKeyViolCntr: 0x1008, PKeyTblLen: 0x2001, LID: 0x2002, SMLID: 0x2003,
			LMC: 0x31, MaxVLNum: 0x32, SMSL: 0x33, SubnetTimeout: 0x34, InitTypeReply: 0x35,
			ActiveWidth: 0x36, ActiveSpeed: 0x37, PhysState: 0x38}
		if r.Attr != want {
			t.Errorf("got %+v\nwant %+v", r.Attr, want)
		}
	})
	t.Run("QUERY_PKEY", func(t *testing.T) {
		var r QueryPKeyResponse
		if err := r.Decode(resp(1, 0x80000001, 0, func(b []byte) { p16(b, 16, 0xA1A2); p8(b, 18, 0xFF) })); err != nil || r.PKey != 0xA1A2 {
			t.Errorf("got %#x, %v", r.PKey, err)
		}
	})
	t.Run("CREATE_PD", func(t *testing.T) {
		var r CreatePDResponse
		if err := r.Decode(resp(1, 0x80000002, 0, func(b []byte) { p32(b, 16, 0xA1A2A3A4) })); err != nil || r.PDHandle != 0xA1A2A3A4 {
			t.Errorf("got %#x, %v", r.PDHandle, err)
		}
	})
	t.Run("CREATE_MR", func(t *testing.T) {
		var r CreateMRResponse
		err := r.Decode(resp(1, 0x80000004, 0, func(b []byte) { p32(b, 16, 0xA1); p32(b, 20, 0xA2); p32(b, 24, 0xFFFFFFFF); p32(b, 28, 0xEE) }))
		if want := (CreateMRResponse{MRHandle: 0xA1, LKey: 0xA2, RKey: 0xFFFFFFFF}); err != nil || r != want {
			t.Errorf("got %+v, %v", r, err)
		}
	})
	t.Run("CREATE_CQ", func(t *testing.T) {
		var r CreateCQResponse
		err := r.Decode(resp(1, 0x80000006, 0, func(b []byte) { p32(b, 16, 0xA1A2A3); p32(b, 20, 0xB1B2B3B4) }))
		if want := (CreateCQResponse{CQHandle: 0xA1A2A3, CQE: 0xB1B2B3B4}); err != nil || r != want {
			t.Errorf("got %+v, %v", r, err)
		}
		err = r.Decode(resp(1, 0x80000006, 0, func(b []byte) { p32(b, 16, 0x01000000) }))
		if !errors.Is(err, ErrDeviceFault) {
			t.Errorf("25-bit CQ handle: %v, want ErrDeviceFault", err)
		}
	})
	t.Run("RESIZE_CQ", func(t *testing.T) {
		var r ResizeCQResponse
		if err := r.Decode(resp(1, 0x80000007, 0, func(b []byte) { p32(b, 16, 0xA1A2A3A4) })); err != nil || r.CQE != 0xA1A2A3A4 {
			t.Errorf("got %+v, %v", r, err)
		}
	})
	t.Run("CREATE_QP/v1", func(t *testing.T) {
		r := CreateQPResponse{}
		err := r.Decode(resp(1, 0x80000009, 0, func(b []byte) {
			p32(b, 16, 0xA1A2A3)
			for i, v := range []uint32{0xB1, 0xB2, 0xB3, 0xB4, 0xB5} {
				p32(b, 20+4*i, v)
			}
		}))
		want := CreateQPResponse{QPN: 0xA1A2A3, QPHandle: 0xA1A2A3, MaxSendWR: 0xB1, MaxRecvWR: 0xB2, MaxSendSGE: 0xB3, MaxRecvSGE: 0xB4, MaxInlineData: 0xB5}
		if err != nil || r != want {
			t.Errorf("got %+v, %v\nwant %+v", r, err, want)
		}
	})
	t.Run("CREATE_QP/v2", func(t *testing.T) {
		r := CreateQPResponse{V2: true}
		err := r.Decode(resp(1, 0x80000009, 0, func(b []byte) {
			p32(b, 16, 0xA1A2A3)
			p32(b, 20, 0xC1C2C3)
			for i, v := range []uint32{0xB1, 0xB2, 0xB3, 0xB4, 0xB5} {
				p32(b, 24+4*i, v)
			}
		}))
		want := CreateQPResponse{V2: true, QPN: 0xA1A2A3, QPHandle: 0xC1C2C3, MaxSendWR: 0xB1, MaxRecvWR: 0xB2, MaxSendSGE: 0xB3, MaxRecvSGE: 0xB4, MaxInlineData: 0xB5}
		if err != nil || r != want {
			t.Errorf("got %+v, %v\nwant %+v", r, err, want)
		}
		r = CreateQPResponse{V2: true}
		if err := r.Decode(resp(1, 0x80000009, 0, func(b []byte) { p32(b, 20, 0xFF000000) })); !errors.Is(err, ErrDeviceFault) {
			t.Errorf("wide QP handle: %v, want ErrDeviceFault", err)
		}
	})
	t.Run("QUERY_QP", func(t *testing.T) {
		var r QueryQPResponse
		err := r.Decode(resp(1, 0x8000000B, 0, func(b []byte) {
			for i, v := range []uint32{3, 2, 3, 1, 0xA5, 0xA6, 0xA7, 0xA8, 0xA9} {
				p32(b, 16+4*i, v) // qp_state @16 ... qp_access_flags @48
			}
			for i := 52; i < RespSlotSize; i++ {
				b[i] = 0xEE // libibverbs layout on QEMU: must not be read
			}
		}))
		want := QueryQPResponse{QPState: 3, CurQPState: 2, PathMTU: 3, PathMigState: 1, QKey: 0xA5, RQPSN: 0xA6, SQPSN: 0xA7, DestQPNum: 0xA8, QPAccessFlags: 0xA9}
		if err != nil || r != want {
			t.Errorf("got %+v, %v\nwant %+v", r, err, want)
		}
		if err := r.Decode(resp(1, 0x8000000B, 0, func(b []byte) { p32(b, 16, 7) })); !errors.Is(err, ErrDeviceFault) {
			t.Errorf("qp_state 7: %v, want ErrDeviceFault", err)
		}
	})
	t.Run("DESTROY_QP", func(t *testing.T) {
		var r DestroyQPResponse
		if err := r.Decode(resp(1, 0x8000000C, 0, func(b []byte) { p32(b, 16, 0xA1A2A3A4) })); err != nil || r.EventsReported != 0xA1A2A3A4 {
			t.Errorf("got %+v, %v", r, err)
		}
	})
	t.Run("CREATE_UC", func(t *testing.T) {
		var r CreateUCResponse
		if err := r.Decode(resp(1, 0x8000000D, 0, func(b []byte) { p32(b, 16, 0xA1A2A3A4) })); err != nil || r.CtxHandle != 0xA1A2A3A4 {
			t.Errorf("got %+v, %v", r, err)
		}
	})
	t.Run("CREATE_SRQ", func(t *testing.T) {
		var r CreateSRQResponse
		if err := r.Decode(resp(1, 0x80000011, 0, func(b []byte) { p32(b, 16, 0xA1A2A3) })); err != nil || r.SRQN != 0xA1A2A3 {
			t.Errorf("got %+v, %v", r, err)
		}
		if err := r.Decode(resp(1, 0x80000011, 0, func(b []byte) { p32(b, 16, 0x01000000) })); !errors.Is(err, ErrDeviceFault) {
			t.Errorf("wide SRQ handle: %v", err)
		}
	})
	t.Run("QUERY_SRQ", func(t *testing.T) {
		var r QuerySRQResponse
		err := r.Decode(resp(1, 0x80000013, 0, func(b []byte) { p32(b, 16, 0xA1); p32(b, 20, 0xA2); p32(b, 24, 0xA3); p32(b, 28, 0xEE) }))
		if want := (SRQAttr{MaxWR: 0xA1, MaxSGE: 0xA2, SRQLimit: 0xA3}); err != nil || r.Attr != want {
			t.Errorf("got %+v, %v", r, err)
		}
	})
	t.Run("short slot", func(t *testing.T) {
		for _, r := range []Response{&QueryPortResponse{}, &QueryPKeyResponse{}, &CreatePDResponse{}, &CreateMRResponse{},
			&CreateCQResponse{}, &ResizeCQResponse{}, &CreateQPResponse{}, &QueryQPResponse{}, &DestroyQPResponse{},
			&CreateUCResponse{}, &CreateSRQResponse{}, &QuerySRQResponse{}, HeaderOnly{}} {
			if err := r.Decode(make([]byte, 15)); !errors.Is(err, ErrInvalid) {
				t.Errorf("%T: %v, want ErrInvalid", r, err)
			}
		}
	})
}

func TestCheckResponse(t *testing.T) {
	good := resp(0x42, 0x80000002, 0, nil)
	if err := CheckResponse(good, 0x42, CmdCreatePD.Ack()); err != nil {
		t.Fatal(err)
	}
	if err := CheckResponse(good, 0x43, CmdCreatePD.Ack()); !errors.Is(err, ErrDeviceFault) {
		t.Errorf("cookie mismatch: %v", err)
	}
	if err := CheckResponse(good, 0x42, CmdCreateCQ.Ack()); !errors.Is(err, ErrDeviceFault) {
		t.Errorf("ack mismatch: %v", err)
	}
	var fe *FieldError
	if err := CheckResponse(good, 0x42, CmdCreateCQ.Ack()); !errors.As(err, &fe) || fe.Field != "ack" || fe.Value != 0x80000002 {
		t.Errorf("ack mismatch names %+v", fe)
	}
	if err := CheckResponse(resp(0x42, 0x80000002, 22, nil), 0x42, CmdCreatePD.Ack()); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("err byte 22: %v, want EINVAL", err)
	}
	h, err := DecodeRespHeader(resp(0x1122334455667788, 0x8000000A, 5, func(b []byte) { b[13] = 0xFF }))
	if want := (RespHeader{Cookie: 0x1122334455667788, Ack: 0x8000000A, Err: 5}); err != nil || h != want {
		t.Errorf("header %+v, %v", h, err)
	}
}

func TestCmdNames(t *testing.T) {
	if CmdModifySRQ.String() != "MODIFY_SRQ" || Cmd(21).String() != "CMD_21" || CmdQueryPort.String() != "QUERY_PORT" {
		t.Error("names")
	}
	if CmdDestroySRQ.Ack() != 0x80000014 || CmdQueryPort.Ack() != 0x80000000 {
		t.Error("acks")
	}
}

func TestRequestValidate(t *testing.T) {
	okCQ := CreateCQRequest{PDirDMA: 0x1000, CQE: 64, NChunks: 2}
	okQP := CreateQPRequest{PDirDMA: 0x1000, MaxSendWR: 32, MaxRecvWR: 32, MaxSendSGE: 4, MaxRecvSGE: 4, SendChunks: 2, TotalChunks: 4, QPType: QPTypeRC}
	okSRQ := CreateSRQRequest{PDirDMA: 0x1000, NChunks: 2, Attr: SRQAttr{MaxWR: 32, MaxSGE: 4}}
	okMR := CreateMRRequest{Start: 0x10000, Length: 3 * PageSize, PDirDMA: 0x1000, NChunks: 3}
	for _, r := range []validator{okCQ, okQP, okSRQ, okMR, CreateBindRequest{Index: 254}, DestroyBindRequest{Index: 1},
		CreateUCRequest{PFN: 0xFFFFFFFF}, CreateUCRequest{PFN: 1 << 40, PFN64: true},
		CreateMRRequest{Start: 0x10FFF, Length: 2, PDirDMA: 0x1000, NChunks: 2}, // unaligned: the pages it spans
		CreateMRRequest{Start: 0x10010, Length: 3 * PageSize, PDirDMA: 0x1000, NChunks: 4},
		CreateMRRequest{Flags: MRFlagDMA}, ModifyQPRequest{AttrMask: QPAttrAll, Attr: QPAttr{QPState: QPStateErr}},
		func() CreateQPRequest { q := okQP; q.IsSRQ, q.TotalChunks, q.MaxRecvWR = true, 3, 0; return q }(),
		func() CreateSRQRequest { r := okSRQ; r.NChunks = MaxRingChunks; return r }(),                                  // the most chunks
		CreateMRRequest{Start: 0x10000, Length: MaxPageDirPages * PageSize, PDirDMA: 0x1000, NChunks: MaxPageDirPages}, // the longest MR
	} {
		assert.NoError(t, r.Validate(), "%+v", r)
	}
	bad := []struct {
		r     validator
		field string
		is    error
	}{
		{func() CreateCQRequest { r := okCQ; r.PDirDMA = 0; return r }(), "pdir_dma", ErrInvalid},
		{func() CreateCQRequest { r := okCQ; r.PDirDMA = 0x1008; return r }(), "pdir_dma", ErrInvalid},
		{func() CreateCQRequest { r := okCQ; r.CQE = 65; return r }(), "cqe", ErrInvalid},
		{func() CreateCQRequest { r := okCQ; r.CQE = 48; return r }(), "cqe", ErrInvalid}, // fits its page, not a power of two
		{CreateMRRequest{Start: 0x10000, Length: MaxPageDirPages*PageSize + 1, PDirDMA: 0x1000, NChunks: MaxPageDirPages + 1}, "length", ErrInvalid},
		{func() CreateCQRequest { r := okCQ; r.CQE = 128; return r }(), "cqe", ErrInvalid}, // 128 x 64 > 1 page
		{func() CreateCQRequest { r := okCQ; r.NChunks = 1; return r }(), "nchunks", ErrInvalid},
		{func() CreateCQRequest { r := okCQ; r.NChunks = 129; return r }(), "nchunks", ErrInvalid},
		{func() CreateQPRequest { r := okQP; r.MaxSendWR = 33; return r }(), "max_send_wr", ErrInvalid},
		{func() CreateQPRequest { r := okQP; r.MaxSendWR = 64; return r }(), "max_send_wr", ErrInvalid},  // 64 x 256 > 2 pages
		{func() CreateQPRequest { r := okQP; r.MaxRecvWR = 128; return r }(), "max_recv_wr", ErrInvalid}, // 128 x 128 > 1 page
		{func() CreateQPRequest { r := okQP; r.MaxRecvWR = 0; return r }(), "max_recv_wr", ErrInvalid},
		{func() CreateQPRequest { r := okQP; r.SendChunks = 0; return r }(), "send_chunks", ErrInvalid},
		{func() CreateQPRequest { r := okQP; r.SendChunks, r.TotalChunks = 129, 131; return r }(), "send_chunks", ErrInvalid},
		{func() CreateQPRequest { r := okQP; r.TotalChunks = 3; return r }(), "total_chunks", ErrInvalid}, // no RQ pages
		{func() CreateQPRequest { r := okQP; r.TotalChunks = 2 + 1 + 129; return r }(), "total_chunks", ErrInvalid},
		{func() CreateQPRequest { r := okQP; r.IsSRQ = true; return r }(), "total_chunks", ErrInvalid}, // RQ pages with an SRQ
		{func() CreateSRQRequest { r := okSRQ; r.Attr.MaxWR = 3; return r }(), "max_wr", ErrInvalid},
		{func() CreateSRQRequest { r := okSRQ; r.Attr.MaxWR = 64; return r }(), "max_wr", ErrInvalid},
		{func() CreateSRQRequest { r := okSRQ; r.NChunks = 200; return r }(), "nchunks", ErrInvalid},
		{func() CreateSRQRequest { r := okSRQ; r.NChunks = MaxRingChunks + 1; return r }(), "nchunks", ErrInvalid},
		{func() CreateSRQRequest { r := okSRQ; r.NChunks = 1; return r }(), "nchunks", ErrInvalid},
		{func() CreateMRRequest { r := okMR; r.NChunks = 4; return r }(), "nchunks", ErrInvalid},
		{func() CreateMRRequest { r := okMR; r.Start = 0x10010; return r }(), "nchunks", ErrInvalid},              // spans 4 pages
		{func() CreateMRRequest { r := okMR; r.Start, r.Length = 0x10FFF, 2; return r }(), "nchunks", ErrInvalid}, // spans 2
		{func() CreateMRRequest { r := okMR; r.Length = 0; return r }(), "length", ErrInvalid},
		{func() CreateMRRequest { r := okMR; r.PDirDMA = 0; return r }(), "pdir_dma", ErrInvalid},
		{func() CreateMRRequest { r := okMR; r.Flags = MRFlagFRMR; return r }(), "flags", ErrNotSupported},
		{CreateBindRequest{Index: 255}, "index", ErrInvalid},
		{DestroyBindRequest{Index: 300}, "index", ErrInvalid},
		{CreateUCRequest{PFN: 1 << 32}, "pfn", ErrInvalid},
		{ModifyQPRequest{AttrMask: 1 << 21}, "attr_mask", ErrInvalid},
		{ModifyQPRequest{Attr: QPAttr{QPState: 7}}, "qp_state", ErrInvalid},
	}
	for _, tc := range bad {
		err := tc.r.Validate()
		var fe *FieldError
		if assert.ErrorIs(t, err, tc.is, "%+v", tc.r) && assert.ErrorAs(t, err, &fe, "%+v", tc.r) {
			assert.Equal(t, tc.field, fe.Field, "%+v", tc.r)
		}
	}
}

func TestWQEStride(t *testing.T) {
	// The strides QEMU computes (facts sheet §6).
	for _, tc := range []struct {
		sge    uint32
		sq, rq uint64
	}{{1, 128, 32}, {2, 128, 64}, {3, 128, 64}, {4, 256, 128}} {
		if sq, rq := wqeStride(sqWQEHeader, tc.sge), wqeStride(rqWQEHeader, tc.sge); sq != tc.sq || rq != tc.rq {
			t.Errorf("%d SGEs: strides %d/%d, want %d/%d", tc.sge, sq, rq, tc.sq, tc.rq)
		}
	}
}

// CREATE_QP takes 1 to MaxRingChunks send pages and, without an SRQ, 1 to
// MaxRingChunks receive pages: exactly MaxRingChunks of each is valid,
// one more of either is refused with ErrInvalid naming its field.
func TestCreateQPTakesExactlyMaxRingChunksPagesPerQueueAndNotOneMore(t *testing.T) {
	ok := CreateQPRequest{PDirDMA: 0x1000, MaxSendWR: 32, MaxRecvWR: 32, MaxSendSGE: 4, MaxRecvSGE: 4, SendChunks: 2, TotalChunks: 4, QPType: QPTypeRC}
	for _, tc := range []struct {
		name        string
		send, total uint16
		field       string
	}{
		{"send pages at the limit", MaxRingChunks, 1 + MaxRingChunks + 1, ""},
		{"receive pages at the limit", 2, 1 + 2 + MaxRingChunks, ""},
		{"both at the limit", MaxRingChunks, 1 + 2*MaxRingChunks, ""},
		{"send pages past it", MaxRingChunks + 1, 1 + MaxRingChunks + 1 + 1, "send_chunks"},
		{"receive pages past it", 2, 1 + 2 + MaxRingChunks + 1, "total_chunks"},
	} {
		r := ok
		r.SendChunks, r.TotalChunks = tc.send, tc.total
		err := r.Validate()
		if tc.field == "" {
			assert.NoError(t, err, tc.name)
			continue
		}
		if assert.ErrorIs(t, err, ErrInvalid, tc.name) {
			assert.Contains(t, err.Error(), tc.field, tc.name)
		}
	}
}
