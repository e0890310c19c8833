package firmware

import (
	"encoding/binary"
	"fmt"
)

// Layout of the Device Shared Region (byte-packed, pvrdma_dev_api.h).
const (
	// DSRSize is the size of the DSR; keep it within one page.
	DSRSize = 280
	// CapsOffset is the offset of the capabilities block in the DSR.
	CapsOffset = 72
	// CapsSize is the size of the capabilities block.
	CapsSize = 208
)

// Device interface versions (the VERSION register).
const (
	VersionRoCEv1   = 17 // base; RoCEv1 GIDs only
	VersionRoCEv2   = 18 // RoCEv2 GIDs; max_sge_rd and max_fast_reg_page_list_len valid
	VersionPPN64    = 19 // 64-bit UAR PFNs in the DSR and CREATE_UC
	VersionQPHandle = 20 // CREATE_QP response v2 (separate QP handle)

	// MinVersion and MaxVersion bound the versions this package drives.
	MinVersion = VersionRoCEv1
	MaxVersion = VersionQPHandle
	// DriverVersion is the interface version this package implements,
	// written into the DSR's driver_version.
	DriverVersion = VersionQPHandle
)

// Device modes (caps.mode).
const (
	ModeRoCE  = 0
	ModeIWARP = 1
	ModeIB    = 2
)

// Guest OS information values (DSR gos_info).
const (
	GOSBits32    = 1
	GOSBits64    = 2
	GOSTypeLinux = 1
)

// MaxDeviceRingPages bounds num_pages of the DSR's device rings (state page
// included): QEMU 7.2.7+ rejects more, and earlier 7.2 releases read past the
// page table.
const MaxDeviceRingPages = 511

// GOSInfo is the guest OS description in the DSR, a 32-bit bitfield: bits
// 0-1 bitness, 2-5 OS type, 6-21 OS version, 22-31 miscellaneous. QEMU
// ignores it.
type GOSInfo struct {
	Bits    uint8  // GOSBits32 or GOSBits64 (2 bits)
	Type    uint8  // GOSTypeLinux (4 bits)
	Version uint16 // (16 bits)
	Misc    uint16 // (10 bits)
}

func (g GOSInfo) word() (uint32, error) {
	const where = "DSR gos_info"
	switch {
	case g.Bits > 3:
		return 0, invalid(where, "bits", uint64(g.Bits), "0..3")
	case g.Type > 15:
		return 0, invalid(where, "type", uint64(g.Type), "0..15")
	case g.Misc > 1023:
		return 0, invalid(where, "misc", uint64(g.Misc), "0..1023")
	}
	return uint32(g.Bits) | uint32(g.Type)<<2 | uint32(g.Version)<<6 | uint32(g.Misc)<<22, nil
}

// RingPageInfo locates a device ring: its page count, the ring-state page
// included, and its page directory (see WriteRingPageDir).
type RingPageInfo struct {
	NumPages uint32
	PDirDMA  uint64
}

// DSR is what the driver writes into the Device Shared Region.
type DSR struct {
	// DriverVersion is written to driver_version; zero means
	// DriverVersion (the constant). QEMU ignores it.
	DriverVersion uint32
	// GOS describes the guest OS.
	GOS GOSInfo
	// CmdSlotDMA and RespSlotDMA are the DMA addresses of the command and
	// response slots. A slot must not cross a page boundary.
	CmdSlotDMA  uint64
	RespSlotDMA uint64
	// AsyncRing and CQRing are the async-event and CQ-notification rings.
	AsyncRing RingPageInfo
	CQRing    RingPageInfo
	// UARPFN is the page frame number of the driver's UAR page (QEMU
	// ignores it). Below VERSION 19 it must fit 32 bits.
	UARPFN uint64
}

// Encode zero-fills the DSR in b (its capabilities block included, so a
// device that writes none is detected) and writes d for a device reporting
// version: uar_pfn is the 32-bit field below VersionPPN64, else the 64-bit
// one. Each device ring needs 2..MaxDeviceRingPages pages with a power of two
// data pages (the consumers index with masks).
func (d *DSR) Encode(b []byte, version uint32) error {
	const where = "DSR"
	if len(b) < DSRSize {
		return invalid(where, "length", uint64(len(b)), fmt.Sprintf(">= %d", DSRSize))
	}
	gos, err := d.GOS.word()
	if err != nil {
		return err
	}
	if err := checkSlot("cmd_slot_dma", d.CmdSlotDMA, CmdSlotSize); err != nil {
		return err
	}
	if err := checkSlot("resp_slot_dma", d.RespSlotDMA, RespSlotSize); err != nil {
		return err
	}
	if err := checkRingInfo("async_ring_pages", d.AsyncRing); err != nil {
		return err
	}
	if err := checkRingInfo("cq_ring_pages", d.CQRing); err != nil {
		return err
	}
	pfn64 := version >= VersionPPN64
	if !pfn64 && d.UARPFN > 0xFFFFFFFF {
		return invalid(where, "uar_pfn", d.UARPFN, "< 2^32 (device VERSION < 19)")
	}
	clear(b[:DSRSize])
	dv := d.DriverVersion
	if dv == 0 {
		dv = DriverVersion
	}
	le.PutUint32(b[0:], dv)
	le.PutUint32(b[8:], gos)
	le.PutUint64(b[16:], d.CmdSlotDMA)
	le.PutUint64(b[24:], d.RespSlotDMA)
	le.PutUint32(b[32:], d.AsyncRing.NumPages)
	le.PutUint64(b[40:], d.AsyncRing.PDirDMA)
	le.PutUint32(b[48:], d.CQRing.NumPages)
	le.PutUint64(b[56:], d.CQRing.PDirDMA)
	if pfn64 {
		le.PutUint64(b[64:], d.UARPFN)
	} else {
		le.PutUint32(b[64:], uint32(d.UARPFN))
	}
	return nil
}

func checkSlot(field string, a uint64, size uint64) error {
	if a == 0 {
		return invalid("DSR", field, a, "a non-zero DMA address")
	}
	if a%PageSize+size > PageSize {
		return invalid("DSR", field, a, fmt.Sprintf("a slot of %d bytes within one page", size))
	}
	return nil
}

func checkRingInfo(field string, r RingPageInfo) error {
	if err := checkDMA("DSR", field+".pdir_dma", r.PDirDMA); err != nil {
		return err
	}
	if r.NumPages < 2 || r.NumPages > MaxDeviceRingPages || !isPow2(uint64(r.NumPages-1)) {
		return invalid("DSR", field+".num_pages", uint64(r.NumPages), fmt.Sprintf("1 + a power of two, 2..%d", MaxDeviceRingPages))
	}
	return nil
}

// Caps are the device capabilities the device writes into the DSR when
// DSRHIGH is written. QEMU 7.2 fills only some fields (fw_ver, node_guid,
// max_mr_size, max_qp, max_qp_wr, max_sge, max_cq, max_cqe, max_mr, max_pd,
// max_ah, max_srq, max_srq_wr, max_srq_sge, max_uar, gid_tbl_len,
// max_pkeys, phys_port_cnt, mode, gid_types); the others stay zero. Its
// max_qp_wr, max_cqe and max_srq_wr overstate what can be created (rings are
// limited to MaxRingChunks pages).
type Caps struct {
	FWVer                 uint64 `json:"fw_ver"`
	NodeGUID              uint64 `json:"node_guid"`      // stored big-endian by the device; decoded to its numeric value
	SysImageGUID          uint64 `json:"sys_image_guid"` // likewise
	MaxMRSize             uint64 `json:"max_mr_size"`
	PageSizeCap           uint64 `json:"page_size_cap"`
	AtomicArgSizes        uint64 `json:"atomic_arg_sizes"`
	ExCompMask            uint32 `json:"ex_comp_mask"`
	DeviceCapFlags2       uint32 `json:"device_cap_flags2"`
	MaxFABitBoundary      uint32 `json:"max_fa_bit_boundary"`
	LogMaxAtomicInlineArg uint32 `json:"log_max_atomic_inline_arg"`
	VendorID              uint32 `json:"vendor_id"`
	VendorPartID          uint32 `json:"vendor_part_id"`
	HWVer                 uint32 `json:"hw_ver"`
	MaxQP                 uint32 `json:"max_qp"`
	MaxQPWR               uint32 `json:"max_qp_wr"`
	DeviceCapFlags        uint32 `json:"device_cap_flags"`
	MaxSGE                uint32 `json:"max_sge"`
	MaxSGERD              uint32 `json:"max_sge_rd"` // valid from VERSION 18
	MaxCQ                 uint32 `json:"max_cq"`
	MaxCQE                uint32 `json:"max_cqe"`
	MaxMR                 uint32 `json:"max_mr"`
	MaxPD                 uint32 `json:"max_pd"`
	MaxQPRDAtom           uint32 `json:"max_qp_rd_atom"`
	MaxEERDAtom           uint32 `json:"max_ee_rd_atom"`
	MaxResRDAtom          uint32 `json:"max_res_rd_atom"`
	MaxQPInitRDAtom       uint32 `json:"max_qp_init_rd_atom"`
	MaxEEInitRDAtom       uint32 `json:"max_ee_init_rd_atom"`
	MaxEE                 uint32 `json:"max_ee"`
	MaxRDD                uint32 `json:"max_rdd"`
	MaxMW                 uint32 `json:"max_mw"`
	MaxRawIPv6QP          uint32 `json:"max_raw_ipv6_qp"`
	MaxRawEthyQP          uint32 `json:"max_raw_ethy_qp"`
	MaxMcastGrp           uint32 `json:"max_mcast_grp"`
	MaxMcastQPAttach      uint32 `json:"max_mcast_qp_attach"`
	MaxTotalMcastQPAttach uint32 `json:"max_total_mcast_qp_attach"`
	MaxAH                 uint32 `json:"max_ah"`
	MaxFMR                uint32 `json:"max_fmr"`
	MaxMapPerFMR          uint32 `json:"max_map_per_fmr"`
	MaxSRQ                uint32 `json:"max_srq"`
	MaxSRQWR              uint32 `json:"max_srq_wr"`
	MaxSRQSGE             uint32 `json:"max_srq_sge"`
	MaxUAR                uint32 `json:"max_uar"` // QEMU: 0x200000, a byte size rather than a page count
	GIDTblLen             uint32 `json:"gid_tbl_len"`
	MaxPKeys              uint16 `json:"max_pkeys"`
	LocalCAAckDelay       uint8  `json:"local_ca_ack_delay"`
	PhysPortCnt           uint8  `json:"phys_port_cnt"`
	Mode                  uint8  `json:"mode"` // Mode* constants
	AtomicOps             uint8  `json:"atomic_ops"`
	BMMEFlags             uint8  `json:"bmme_flags"`
	GIDTypes              uint8  `json:"gid_types"`                  // GIDType* bits
	MaxFastRegPageListLen uint32 `json:"max_fast_reg_page_list_len"` // valid from VERSION 18
}

// DecodeCaps reads the capabilities block of the DSR in b. A block left
// entirely zero (the device did not load the DSR: a bad address, a ring
// with no pages, ...) is an error wrapping ErrDSRNotLoaded. DecodeCaps does
// not judge the values; see Caps.Validate.
func DecodeCaps(b []byte) (Caps, error) {
	if len(b) < DSRSize {
		return Caps{}, invalid("DSR", "length", uint64(len(b)), fmt.Sprintf(">= %d", DSRSize))
	}
	p := b[CapsOffset:DSRSize]
	loaded := false
	for _, v := range p {
		if v != 0 {
			loaded = true
			break
		}
	}
	if !loaded {
		return Caps{}, fmt.Errorf("capabilities block left zero after DSRHIGH: %w", ErrDSRNotLoaded)
	}
	u32 := func(off int) uint32 { return le.Uint32(p[off:]) }
	return Caps{
		FWVer:                 le.Uint64(p[0:]),
		NodeGUID:              binary.BigEndian.Uint64(p[8:]),
		SysImageGUID:          binary.BigEndian.Uint64(p[16:]),
		MaxMRSize:             le.Uint64(p[24:]),
		PageSizeCap:           le.Uint64(p[32:]),
		AtomicArgSizes:        le.Uint64(p[40:]),
		ExCompMask:            u32(48),
		DeviceCapFlags2:       u32(52),
		MaxFABitBoundary:      u32(56),
		LogMaxAtomicInlineArg: u32(60),
		VendorID:              u32(64),
		VendorPartID:          u32(68),
		HWVer:                 u32(72),
		MaxQP:                 u32(76),
		MaxQPWR:               u32(80),
		DeviceCapFlags:        u32(84),
		MaxSGE:                u32(88),
		MaxSGERD:              u32(92),
		MaxCQ:                 u32(96),
		MaxCQE:                u32(100),
		MaxMR:                 u32(104),
		MaxPD:                 u32(108),
		MaxQPRDAtom:           u32(112),
		MaxEERDAtom:           u32(116),
		MaxResRDAtom:          u32(120),
		MaxQPInitRDAtom:       u32(124),
		MaxEEInitRDAtom:       u32(128),
		MaxEE:                 u32(132),
		MaxRDD:                u32(136),
		MaxMW:                 u32(140),
		MaxRawIPv6QP:          u32(144),
		MaxRawEthyQP:          u32(148),
		MaxMcastGrp:           u32(152),
		MaxMcastQPAttach:      u32(156),
		MaxTotalMcastQPAttach: u32(160),
		MaxAH:                 u32(164),
		MaxFMR:                u32(168),
		MaxMapPerFMR:          u32(172),
		MaxSRQ:                u32(176),
		MaxSRQWR:              u32(180),
		MaxSRQSGE:             u32(184),
		MaxUAR:                u32(188),
		GIDTblLen:             u32(192),
		MaxPKeys:              le.Uint16(p[196:]),
		LocalCAAckDelay:       p[198],
		PhysPortCnt:           p[199],
		Mode:                  p[200],
		AtomicOps:             p[201],
		BMMEFlags:             p[202],
		GIDTypes:              p[203],
		MaxFastRegPageListLen: u32(204),
	}, nil
}

// FWVersion formats fw_ver as major.minor.sub (bits 63-32, 31-16, 15-0).
func (c *Caps) FWVersion() string {
	return fmt.Sprintf("%d.%d.%d", c.FWVer>>32, c.FWVer>>16&0xFFFF, c.FWVer&0xFFFF)
}

// Validate checks that a device reporting version with these capabilities
// is one this driver can drive. Unsupported devices (a version outside
// 17..20, a mode other than RoCE, GID types Linux would refuse: exactly
// RoCEv1 at version 17, exactly RoCEv1 or exactly RoCEv2 from version 18)
// give a *FieldError wrapping ErrNotSupported; capabilities that cannot be
// right (no QP, CQ, PD, MR, SGE, port or GID) wrap ErrDeviceFault.
func (c *Caps) Validate(version uint32) error {
	const where = "caps"
	if version < MinVersion || version > MaxVersion {
		return &FieldError{Where: "device", Field: "VERSION", Value: uint64(version), Want: fmt.Sprintf("%d..%d", MinVersion, MaxVersion), Err: ErrNotSupported}
	}
	if c.Mode != ModeRoCE {
		return &FieldError{Where: where, Field: "mode", Value: uint64(c.Mode), Want: "0 (RoCE)", Err: ErrNotSupported}
	}
	switch {
	case version == VersionRoCEv1 && c.GIDTypes != GIDTypeRoCEv1:
		return &FieldError{Where: where, Field: "gid_types", Value: uint64(c.GIDTypes), Want: "0x1 (RoCEv1) at VERSION 17", Err: ErrNotSupported}
	case version >= VersionRoCEv2 && c.GIDTypes != GIDTypeRoCEv1 && c.GIDTypes != GIDTypeRoCEv2:
		return &FieldError{Where: where, Field: "gid_types", Value: uint64(c.GIDTypes), Want: "0x1 (RoCEv1) or 0x2 (RoCEv2)", Err: ErrNotSupported}
	}
	for _, f := range []struct {
		name string
		v    uint32
	}{
		{"max_qp", c.MaxQP}, {"max_qp_wr", c.MaxQPWR}, {"max_sge", c.MaxSGE},
		{"max_cq", c.MaxCQ}, {"max_cqe", c.MaxCQE}, {"max_mr", c.MaxMR},
		{"max_pd", c.MaxPD}, {"gid_tbl_len", c.GIDTblLen},
		{"phys_port_cnt", uint32(c.PhysPortCnt)},
	} {
		if f.v == 0 {
			return fault(where, f.name, 0, ">= 1")
		}
	}
	if c.MaxSRQ != 0 {
		if c.MaxSRQWR == 0 {
			return fault(where, "max_srq_wr", 0, ">= 1 when max_srq != 0")
		}
		if c.MaxSRQSGE == 0 {
			return fault(where, "max_srq_sge", 0, ">= 1 when max_srq != 0")
		}
	}
	return nil
}
