package firmware

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func testDSR() DSR {
	return DSR{
		DriverVersion: 0xA1A2A3A4,
		GOS:           GOSInfo{Bits: GOSBits64, Type: GOSTypeLinux, Version: 0xBEEF, Misc: 0x2AA},
		CmdSlotDMA:    0x1111222233334000,
		RespSlotDMA:   0x5555666677778000,
		AsyncRing:     RingPageInfo{NumPages: 5, PDirDMA: 0x99990000AAAA1000},
		CQRing:        RingPageInfo{NumPages: 3, PDirDMA: 0xBBBB0000CCCC2000},
		UARPFN:        0xD1D2D3D4,
	}
}

func TestDSREncodeGolden(t *testing.T) {
	want := func(pfn func(b []byte)) []byte {
		b := make([]byte, DSRSize)
		p32(b, 0, 0xA1A2A3A4)
		// gos_info: bits 0-1 = 2, bits 2-5 = 1, bits 6-21 = 0xBEEF, bits 22-31 = 0x2AA
		p32(b, 8, 2|1<<2|0xBEEF<<6|0x2AA<<22)
		p64(b, 16, 0x1111222233334000)
		p64(b, 24, 0x5555666677778000)
		p32(b, 32, 5)
		p64(b, 40, 0x99990000AAAA1000)
		p32(b, 48, 3)
		p64(b, 56, 0xBBBB0000CCCC2000)
		pfn(b)
		return b
	}
	for _, tc := range []struct {
		version uint32
		pfn     uint64
		want    []byte
	}{
		{17, 0xD1D2D3D4, want(func(b []byte) { p32(b, 64, 0xD1D2D3D4) })},
		{18, 0xD1D2D3D4, want(func(b []byte) { p32(b, 64, 0xD1D2D3D4) })},
		{19, 0xE1E2E3E4D1D2D3D4, want(func(b []byte) { p64(b, 64, 0xE1E2E3E4D1D2D3D4) })},
		{20, 0xE1E2E3E4D1D2D3D4, want(func(b []byte) { p64(b, 64, 0xE1E2E3E4D1D2D3D4) })},
	} {
		d := testDSR()
		d.UARPFN = tc.pfn
		got := bytes.Repeat([]byte{0xCC}, DSRSize+1)
		if err := d.Encode(got, tc.version); err != nil {
			t.Fatalf("version %d: %v", tc.version, err)
		}
		if !bytes.Equal(got[:DSRSize], tc.want) {
			t.Errorf("version %d:\n got %s\nwant %s", tc.version, hex.EncodeToString(got[:DSRSize]), hex.EncodeToString(tc.want))
		}
		if got[DSRSize] != 0xCC {
			t.Error("wrote past the DSR")
		}
	}
	d := testDSR()
	d.DriverVersion = 0
	b := make([]byte, DSRSize)
	if err := d.Encode(b, 17); err != nil || le.Uint32(b) != DriverVersion {
		t.Errorf("default driver_version %d, %v", le.Uint32(b), err)
	}
}

func TestDSREncodeInvalid(t *testing.T) {
	for _, tc := range []struct {
		field   string
		mod     func(*DSR)
		version uint32
	}{
		{"uar_pfn", func(d *DSR) { d.UARPFN = 1 << 32 }, 18},
		{"cmd_slot_dma", func(d *DSR) { d.CmdSlotDMA = 0 }, 17},
		{"cmd_slot_dma", func(d *DSR) { d.CmdSlotDMA = 0x1000 + PageSize - 100 }, 17}, // crosses a page
		{"resp_slot_dma", func(d *DSR) { d.RespSlotDMA = 0x1F80 }, 17},
		{"async_ring_pages.num_pages", func(d *DSR) { d.AsyncRing.NumPages = 1 }, 17},
		{"async_ring_pages.num_pages", func(d *DSR) { d.AsyncRing.NumPages = 4 }, 17}, // 3 data pages
		{"cq_ring_pages.num_pages", func(d *DSR) { d.CQRing.NumPages = 513 }, 17},
		{"cq_ring_pages.pdir_dma", func(d *DSR) { d.CQRing.PDirDMA = 0 }, 17},
		{"async_ring_pages.pdir_dma", func(d *DSR) { d.AsyncRing.PDirDMA = 0x1234 }, 17},
		{"bits", func(d *DSR) { d.GOS.Bits = 4 }, 17},
		{"type", func(d *DSR) { d.GOS.Type = 16 }, 17},
		{"misc", func(d *DSR) { d.GOS.Misc = 1024 }, 17},
	} {
		d := testDSR()
		tc.mod(&d)
		err := d.Encode(make([]byte, DSRSize), tc.version)
		var fe *FieldError
		if !errors.Is(err, ErrInvalid) || !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%s: %v", tc.field, err)
		}
	}
	d := testDSR()
	if err := d.Encode(make([]byte, DSRSize-1), 17); !errors.Is(err, ErrInvalid) {
		t.Errorf("short DSR: %v", err)
	}
}

// capsBytes builds a DSR whose caps fields hold distinct values, each placed
// at the absolute DSR offset of the facts sheet's caps table.
func capsBytes() []byte {
	b := make([]byte, DSRSize)
	p64(b, 72, 0x0000000100020003)                                // fw_ver
	copy(b[80:88], []byte{0x52, 0x54, 0x00, 0xff, 0xfe, 1, 2, 3}) // node_guid, big-endian
	copy(b[88:96], []byte{1, 2, 3, 4, 5, 6, 7, 8})                // sys_image_guid
	p64(b, 96, 0x1000000000000001)                                // max_mr_size
	p64(b, 104, 0x1000000000000002)                               // page_size_cap
	p64(b, 112, 0x1000000000000003)                               // atomic_arg_sizes
	for off := 120; off <= 264; off += 4 {                        // ex_comp_mask .. gid_tbl_len
		p32(b, off, uint32(0x2000+off))
	}
	p16(b, 268, 0x3001) // max_pkeys
	p8(b, 270, 0x41)    // local_ca_ack_delay
	p8(b, 271, 0x42)    // phys_port_cnt
	p8(b, 272, 0x43)    // mode
	p8(b, 273, 0x44)    // atomic_ops
	p8(b, 274, 0x45)    // bmme_flags
	p8(b, 275, 0x46)    // gid_types
	p32(b, 276, 0x5001) // max_fast_reg_page_list_len
	return b
}

func TestDecodeCapsGolden(t *testing.T) {
	c, err := DecodeCaps(capsBytes())
	if err != nil {
		t.Fatal(err)
	}
	v := func(off int) uint32 { return uint32(0x2000 + off) }
	want := Caps{
		FWVer: 0x0000000100020003, NodeGUID: 0x525400fffe010203, SysImageGUID: 0x0102030405060708,
		MaxMRSize: 0x1000000000000001, PageSizeCap: 0x1000000000000002, AtomicArgSizes: 0x1000000000000003,
		ExCompMask: v(120), DeviceCapFlags2: v(124), MaxFABitBoundary: v(128), LogMaxAtomicInlineArg: v(132),
		VendorID: v(136), VendorPartID: v(140), HWVer: v(144), MaxQP: v(148), MaxQPWR: v(152),
		DeviceCapFlags: v(156), MaxSGE: v(160), MaxSGERD: v(164), MaxCQ: v(168), MaxCQE: v(172),
		MaxMR: v(176), MaxPD: v(180), MaxQPRDAtom: v(184), MaxEERDAtom: v(188), MaxResRDAtom: v(192),
		MaxQPInitRDAtom: v(196), MaxEEInitRDAtom: v(200), MaxEE: v(204), MaxRDD: v(208), MaxMW: v(212),
		MaxRawIPv6QP: v(216), MaxRawEthyQP: v(220), MaxMcastGrp: v(224), MaxMcastQPAttach: v(228),
		MaxTotalMcastQPAttach: v(232), MaxAH: v(236), MaxFMR: v(240), MaxMapPerFMR: v(244),
		MaxSRQ: v(248), MaxSRQWR: v(252), MaxSRQSGE: v(256), MaxUAR: v(260), GIDTblLen: v(264),
		MaxPKeys: 0x3001, LocalCAAckDelay: 0x41, PhysPortCnt: 0x42, Mode: 0x43, AtomicOps: 0x44,
		BMMEFlags: 0x45, GIDTypes: 0x46, MaxFastRegPageListLen: 0x5001,
	}
	if c != want {
		t.Errorf("got  %+v\nwant %+v", c, want)
	}
	if c.FWVersion() != "1.2.3" {
		t.Errorf("FWVersion %q", c.FWVersion())
	}
}

func TestDecodeCapsNotLoaded(t *testing.T) {
	b := make([]byte, DSRSize)
	d := testDSR()
	if err := d.Encode(b, 17); err != nil {
		t.Fatal(err)
	}
	if _, err := DecodeCaps(b); !errors.Is(err, ErrDSRNotLoaded) {
		t.Errorf("zero caps: %v, want ErrDSRNotLoaded", err)
	}
	if _, err := DecodeCaps(b[:DSRSize-1]); !errors.Is(err, ErrInvalid) {
		t.Errorf("short: %v", err)
	}
}

// qemuCaps are the values QEMU 7.2 writes.
func qemuCaps() Caps {
	return Caps{FWVer: 14, MaxMRSize: 1 << 27, MaxQP: 1024, MaxQPWR: 10467, MaxSGE: 4, MaxCQ: 2048, MaxCQE: 28672,
		MaxMR: 1024, MaxPD: 1024, MaxAH: 64, MaxSRQ: 512, MaxSRQWR: 12288, MaxSRQSGE: 4, MaxUAR: 0x200000,
		GIDTblLen: 255, MaxPKeys: 1, PhysPortCnt: 1, Mode: ModeRoCE, GIDTypes: GIDTypeRoCEv1}
}

func TestCapsValidate(t *testing.T) {
	q := qemuCaps()
	for _, v := range []uint32{17, 18, 19, 20} {
		if err := q.Validate(v); err != nil {
			t.Errorf("QEMU caps at version %d: %v", v, err)
		}
	}
	for _, tc := range []struct {
		name    string
		version uint32
		mod     func(*Caps)
		field   string
		is      error
	}{
		{"version 16", 16, nil, "VERSION", ErrNotSupported},
		{"version 21", 21, nil, "VERSION", ErrNotSupported},
		{"iWARP", 17, func(c *Caps) { c.Mode = ModeIWARP }, "mode", ErrNotSupported},
		{"v17 RoCEv2", 17, func(c *Caps) { c.GIDTypes = GIDTypeRoCEv2 }, "gid_types", ErrNotSupported},
		{"v17 both", 17, func(c *Caps) { c.GIDTypes = 3 }, "gid_types", ErrNotSupported},
		{"v18 both", 18, func(c *Caps) { c.GIDTypes = 3 }, "gid_types", ErrNotSupported},
		{"v18 none", 18, func(c *Caps) { c.GIDTypes = 0 }, "gid_types", ErrNotSupported},
		{"no QP", 17, func(c *Caps) { c.MaxQP = 0 }, "max_qp", ErrDeviceFault},
		{"no SGE", 17, func(c *Caps) { c.MaxSGE = 0 }, "max_sge", ErrDeviceFault},
		{"no CQE", 17, func(c *Caps) { c.MaxCQE = 0 }, "max_cqe", ErrDeviceFault},
		{"no port", 17, func(c *Caps) { c.PhysPortCnt = 0 }, "phys_port_cnt", ErrDeviceFault},
		{"no GIDs", 17, func(c *Caps) { c.GIDTblLen = 0 }, "gid_tbl_len", ErrDeviceFault},
		{"SRQ without WRs", 17, func(c *Caps) { c.MaxSRQWR = 0 }, "max_srq_wr", ErrDeviceFault},
		{"SRQ without SGEs", 17, func(c *Caps) { c.MaxSRQSGE = 0 }, "max_srq_sge", ErrDeviceFault},
	} {
		c := qemuCaps()
		if tc.mod != nil {
			tc.mod(&c)
		}
		err := c.Validate(tc.version)
		var fe *FieldError
		if !errors.Is(err, tc.is) || !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%s: %v, want %v on %s", tc.name, err, tc.is, tc.field)
		}
	}
	c := qemuCaps()
	c.GIDTypes = GIDTypeRoCEv2
	if err := c.Validate(18); err != nil {
		t.Errorf("v18 RoCEv2: %v", err)
	}
	c.MaxSRQ, c.MaxSRQWR, c.MaxSRQSGE = 0, 0, 0
	if err := c.Validate(18); err != nil {
		t.Errorf("no SRQ support is fine: %v", err)
	}
}

// A command or response slot must lie within one page: one that ends
// exactly at the page's end is taken, one that runs a byte past is refused.
func TestDSRSlotsMayEndExactlyAtThePageEndAndNotAByteLater(t *testing.T) {
	for _, tc := range []struct {
		field string
		size  uint64
		set   func(*DSR, uint64)
	}{
		{"cmd_slot_dma", CmdSlotSize, func(d *DSR, a uint64) { d.CmdSlotDMA = a }},
		{"resp_slot_dma", RespSlotSize, func(d *DSR, a uint64) { d.RespSlotDMA = a }},
	} {
		d := testDSR()
		tc.set(&d, 0x7000+PageSize-tc.size)
		require.NoError(t, d.Encode(make([]byte, DSRSize), 17), "%s ending at the page's end", tc.field)
		tc.set(&d, 0x7000+PageSize-tc.size+1)
		err := d.Encode(make([]byte, DSRSize), 17)
		var fe *FieldError
		require.ErrorIs(t, err, ErrInvalid, "%s a byte past the page's end", tc.field)
		require.ErrorAs(t, err, &fe)
		assert.Equal(t, tc.field, fe.Field)
	}
}
