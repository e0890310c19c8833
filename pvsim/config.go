package pvsim

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/vfrdma/vfrdma/firmware"
)

// Config describes the device a model plays. The zero Config is a VMware
// device at interface version 20, RoCE v1, on a fabric of its own.
type Config struct {
	// Version is the interface version the VERSION register reports:
	// 17 (RoCE v1), 18 (RoCE v2 allowed, two more capability fields), 19
	// (64-bit UAR page numbers), 20 (QP handles apart from QP numbers).
	// Zero means 20, or 17 with QEMU. A version outside 17..20 is
	// reported as it is (to test a driver's refusal) and modelled as the
	// nearest of 17 and 20.
	Version uint32
	// QEMU plays QEMU 7.2's hw/rdma/vmw instead of VMware's device:
	// version 17, RoCE v1, every send WQE run as a signaled SEND, the
	// MODIFY_SRQ and QUERY_SRQ handlers swapped, commands executed inside
	// the REQUEST write with their status in ERR, no async events, and
	// QEMU's capability block (the fields QEMU leaves alone stay as the
	// driver wrote them). See the package documentation.
	QEMU bool
	// RoCEv2 makes a version 18+ device report RoCE v2 GIDs (gid_types =
	// 0x2) instead of RoCE v1 (0x1). A device reports one of the two.
	RoCEv2 bool
	// Name is what the function calls itself in errors ("" means
	// "pvsim-" and the last three bytes of the MAC).
	Name string
	// MAC is the paired Ethernet function's MAC address: the node GUID is
	// its EUI-64, and the driver's default GID follows from that. Zero
	// means a random locally administered address.
	MAC [6]byte
	// Fabric connects the model to other models: GIDs bound on one are
	// reachable from the others. Nil gives the device a fabric of its own
	// (its QPs reach each other only).
	Fabric *Fabric
	// Seed seeds the model's choices (QP numbers and memory keys at
	// version 20); zero means a random seed.
	Seed uint64
	// Caps, if set, adjusts the capabilities the model reports after its
	// defaults are filled in (see DefaultCaps). The model enforces the
	// limits it reports.
	Caps func(*firmware.Caps)
	// CommandDelay makes a VMware device answer commands asynchronously:
	// REQUEST is accepted at once (ERR 0), and the command runs, its
	// response is written and vector 0 raised this long afterwards, on
	// the model's goroutine. Zero answers before the REQUEST write
	// returns. Ignored in QEMU mode, which always answers inside the
	// write.
	CommandDelay time.Duration
	// SQConsumeOnCompletion makes a VMware device advance a send queue's
	// cons_head when a WQE completes (is acknowledged) rather than when it
	// is fetched. Which one the real device does is not known; QEMU
	// advances at fetch.
	SQConsumeOnCompletion bool
	// CQNotifyAll makes a VMware device write a CQ-notification entry for
	// every CQE, as QEMU does, rather than only for CQEs that fire an
	// armed CQ; the interrupt still needs the CQ armed. Which one the real
	// device does is not known.
	CQNotifyAll bool
	// AcceptAnyGIDType makes CREATE_BIND accept a GID type the device
	// does not report (RoCE v1 on a RoCE v2 device, or the reverse). By
	// default a VMware device refuses such a bind and the GID is not
	// bound. QEMU ignores the type.
	AcceptAnyGIDType bool
	// PortDown starts the port down (QUERY_PORT state DOWN, no traffic).
	PortDown bool
	// UARAddress is BAR2's bus address, whose first page is the driver's
	// UAR page (hw.UARLocator). Zero means 0xfe000000, a 32-bit BAR as
	// QEMU places it; an address above 2^44 needs version 19's 64-bit
	// page frame field.
	UARAddress uint64
}

// defaultUARAddress is where the model's BAR2 sits by default.
const defaultUARAddress = 0xfe000000

// Interface versions, as firmware names them.
const (
	VersionRoCEv1   = firmware.VersionRoCEv1
	VersionRoCEv2   = firmware.VersionRoCEv2
	VersionPPN64    = firmware.VersionPPN64
	VersionQPHandle = firmware.VersionQPHandle
)

// settings is a Config with its defaults filled in and the values the
// model runs on derived from it.
type settings struct {
	Config
	reported uint32 // what VERSION reads
	version  uint32 // what the model behaves as: 17..20
	qemu     bool
	gidType  uint8
	caps     firmware.Caps
}

func (c *Config) settle() (*settings, error) {
	s := &settings{Config: *c}
	if s.QEMU {
		if s.Version != 0 && s.Version != VersionRoCEv1 {
			return nil, fmt.Errorf("pvsim: QEMU 7.2 mode reports version 17, not %d", s.Version)
		}
		if s.RoCEv2 {
			return nil, fmt.Errorf("pvsim: QEMU 7.2 mode has RoCE v1 GIDs only")
		}
		s.Version = VersionRoCEv1
		s.qemu = true
	}
	if s.Version == 0 {
		s.Version = VersionQPHandle
	}
	s.reported = s.Version
	s.version = min(max(s.Version, VersionRoCEv1), VersionQPHandle)
	if s.RoCEv2 && s.version < VersionRoCEv2 {
		return nil, fmt.Errorf("pvsim: RoCE v2 needs version 18 or later, not %d", s.Version)
	}
	s.gidType = firmware.GIDTypeRoCEv1
	if s.RoCEv2 {
		s.gidType = firmware.GIDTypeRoCEv2
	}
	if s.CommandDelay < 0 {
		return nil, fmt.Errorf("pvsim: negative command delay %v", s.CommandDelay)
	}
	if s.MAC == [6]byte{} {
		if _, err := rand.Read(s.MAC[:]); err != nil {
			return nil, fmt.Errorf("pvsim: random MAC: %w", err)
		}
		s.MAC[0] = s.MAC[0]&^0x01 | 0x02 // unicast, locally administered
	}
	if s.Seed == 0 {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("pvsim: random seed: %w", err)
		}
		s.Seed = binary.LittleEndian.Uint64(b[:]) | 1
	}
	if s.UARAddress == 0 {
		s.UARAddress = defaultUARAddress
	}
	if s.UARAddress%pageSize != 0 {
		return nil, fmt.Errorf("pvsim: UAR address %#x is not page-aligned", s.UARAddress)
	}
	if s.Name == "" {
		s.Name = fmt.Sprintf("pvsim-%02x%02x%02x", s.MAC[3], s.MAC[4], s.MAC[5])
	}
	s.caps = DefaultCaps(s.Config)
	if s.Caps != nil {
		s.Caps(&s.caps)
	}
	return s, nil
}

// NodeGUID returns the EUI-64 of a MAC address, the node GUID a device
// paired with that Ethernet function reports.
func NodeGUID(mac [6]byte) uint64 {
	return uint64(mac[0]^0x02)<<56 | uint64(mac[1])<<48 | uint64(mac[2])<<40 | 0xff<<32 | 0xfe<<24 |
		uint64(mac[3])<<16 | uint64(mac[4])<<8 | uint64(mac[5])
}

// DefaultGID returns the GID a driver derives from the node GUID: the
// link-local prefix fe80::/64 and the GUID. vfrdma binds it at index 0.
func DefaultGID(mac [6]byte) [16]byte {
	var g [16]byte
	g[0], g[1] = 0xfe, 0x80
	binary.BigEndian.PutUint64(g[8:], NodeGUID(mac))
	return g
}

// Limits the model uses for VMware devices (values a real device reports
// are not public: these are plausible, and the model enforces them).
const (
	vmwMaxMRSize = 1 << 30 // one page directory: 262,144 pages
	vmwMaxQP     = 16384
	vmwMaxQPWR   = 4096
	vmwMaxSGE    = 4
	vmwMaxCQ     = 4096
	vmwMaxCQE    = 16384
	vmwMaxMR     = 16384
	vmwMaxPD     = 16384
	vmwMaxAH     = 16384
	vmwMaxSRQ    = 1024
	vmwMaxSRQWR  = 4096
	vmwMaxUAR    = 512
	vmwGIDTblLen = 255
	vmwRDAtom    = 16
	vmwMaxMsg    = 1 << 31
)

// QEMU 7.2's values (facts sheet §3: its defaults, unclipped by a backend).
const (
	qemuFWVer     = 14
	qemuMaxMRSize = 1 << 27
	qemuMaxQP     = 1024
	qemuMaxQPWR   = 10467
	qemuMaxSGE    = 4
	qemuMaxCQ     = 2048
	qemuMaxCQE    = 28672
	qemuMaxMR     = 1024
	qemuMaxPD     = 1024
	qemuMaxAH     = 64
	qemuMaxSRQ    = 512
	qemuMaxSRQWR  = 12288
	qemuMaxSRQSGE = 4
	qemuMaxUAR    = 0x200000
	qemuGIDTblLen = 255
	qemuMaxMsg    = 1024
	qemuMaxUC     = 512
)

// DefaultCaps returns the capabilities a model configured by c reports
// before Config.Caps adjusts them. In QEMU mode these are the fields QEMU
// 7.2 writes (the others are left as the driver wrote them in the DSR; here
// they are zero).
func DefaultCaps(c Config) firmware.Caps {
	if c.QEMU {
		return firmware.Caps{
			FWVer: qemuFWVer, NodeGUID: NodeGUID(c.MAC), MaxMRSize: qemuMaxMRSize,
			MaxQP: qemuMaxQP, MaxQPWR: qemuMaxQPWR, MaxSGE: qemuMaxSGE, MaxCQ: qemuMaxCQ,
			MaxCQE: qemuMaxCQE, MaxMR: qemuMaxMR, MaxPD: qemuMaxPD, MaxAH: qemuMaxAH,
			MaxSRQ: qemuMaxSRQ, MaxSRQWR: qemuMaxSRQWR, MaxSRQSGE: qemuMaxSRQSGE,
			MaxUAR: qemuMaxUAR, GIDTblLen: qemuGIDTblLen, MaxPKeys: 1, PhysPortCnt: 1,
			Mode: firmware.ModeRoCE, GIDTypes: firmware.GIDTypeRoCEv1,
		}
	}
	v := c.Version
	if v == 0 {
		v = VersionQPHandle
	}
	caps := firmware.Caps{
		FWVer:           1 << 32, // 1.0.0
		NodeGUID:        NodeGUID(c.MAC),
		SysImageGUID:    NodeGUID(c.MAC),
		MaxMRSize:       vmwMaxMRSize,
		PageSizeCap:     4096,
		AtomicArgSizes:  8,
		VendorID:        0x15ad,
		VendorPartID:    0x0820,
		HWVer:           1,
		MaxQP:           vmwMaxQP,
		MaxQPWR:         vmwMaxQPWR,
		MaxSGE:          vmwMaxSGE,
		MaxCQ:           vmwMaxCQ,
		MaxCQE:          vmwMaxCQE,
		MaxMR:           vmwMaxMR,
		MaxPD:           vmwMaxPD,
		MaxQPRDAtom:     vmwRDAtom,
		MaxResRDAtom:    vmwRDAtom * vmwMaxQP,
		MaxQPInitRDAtom: vmwRDAtom,
		MaxAH:           vmwMaxAH,
		MaxSRQ:          vmwMaxSRQ,
		MaxSRQWR:        vmwMaxSRQWR,
		MaxSRQSGE:       vmwMaxSGE,
		MaxUAR:          vmwMaxUAR,
		GIDTblLen:       vmwGIDTblLen,
		MaxPKeys:        1,
		LocalCAAckDelay: 15,
		PhysPortCnt:     1,
		Mode:            firmware.ModeRoCE,
		AtomicOps:       atomicCAS | atomicFAA,
		GIDTypes:        firmware.GIDTypeRoCEv1,
	}
	if c.RoCEv2 {
		caps.GIDTypes = firmware.GIDTypeRoCEv2
	}
	if v >= VersionRoCEv2 {
		caps.MaxSGERD = vmwMaxSGE
	}
	return caps
}

// caps.atomic_ops bits.
const (
	atomicCAS       = 1 << 0
	atomicFAA       = 1 << 1
	atomicMaskedCAS = 1 << 2
	atomicMaskedFAA = 1 << 3
)

// encodeCaps writes the capability block (208 bytes at DSR offset 72),
// every field, as a VMware device does. Offsets are the facts sheet's
// (pvrdma_dev_api.h, struct pvrdma_device_caps).
func encodeCaps(b []byte, c *firmware.Caps, version uint32) {
	p := b[:firmware.CapsSize]
	le.PutUint64(p[0:], c.FWVer)
	binary.BigEndian.PutUint64(p[8:], c.NodeGUID)
	binary.BigEndian.PutUint64(p[16:], c.SysImageGUID)
	le.PutUint64(p[24:], c.MaxMRSize)
	le.PutUint64(p[32:], c.PageSizeCap)
	le.PutUint64(p[40:], c.AtomicArgSizes)
	for _, f := range []struct {
		off int
		v   uint32
	}{
		{48, c.ExCompMask}, {52, c.DeviceCapFlags2}, {56, c.MaxFABitBoundary},
		{60, c.LogMaxAtomicInlineArg}, {64, c.VendorID}, {68, c.VendorPartID},
		{72, c.HWVer}, {76, c.MaxQP}, {80, c.MaxQPWR}, {84, c.DeviceCapFlags},
		{88, c.MaxSGE}, {96, c.MaxCQ}, {100, c.MaxCQE}, {104, c.MaxMR},
		{108, c.MaxPD}, {112, c.MaxQPRDAtom}, {116, c.MaxEERDAtom},
		{120, c.MaxResRDAtom}, {124, c.MaxQPInitRDAtom}, {128, c.MaxEEInitRDAtom},
		{132, c.MaxEE}, {136, c.MaxRDD}, {140, c.MaxMW}, {144, c.MaxRawIPv6QP},
		{148, c.MaxRawEthyQP}, {152, c.MaxMcastGrp}, {156, c.MaxMcastQPAttach},
		{160, c.MaxTotalMcastQPAttach}, {164, c.MaxAH}, {168, c.MaxFMR},
		{172, c.MaxMapPerFMR}, {176, c.MaxSRQ}, {180, c.MaxSRQWR},
		{184, c.MaxSRQSGE}, {188, c.MaxUAR}, {192, c.GIDTblLen},
	} {
		le.PutUint32(p[f.off:], f.v)
	}
	le.PutUint16(p[196:], c.MaxPKeys)
	p[198] = c.LocalCAAckDelay
	p[199] = c.PhysPortCnt
	p[200] = c.Mode
	p[201] = c.AtomicOps
	p[202] = c.BMMEFlags
	p[203] = c.GIDTypes
	// max_sge_rd and max_fast_reg_page_list_len mean something from
	// version 18 on (Linux's PVRDMA_GET_CAP); a version 17 device leaves
	// them (the latter was reserved bytes then).
	if version >= VersionRoCEv2 {
		le.PutUint32(p[92:], c.MaxSGERD)
		le.PutUint32(p[204:], c.MaxFastRegPageListLen)
	}
}

// encodeQEMUCaps writes what QEMU 7.2's init_dev_caps and load_dsr write,
// and nothing else: gid_types is OR'ed in.
func encodeQEMUCaps(b []byte, c *firmware.Caps) {
	p := b[:firmware.CapsSize]
	le.PutUint64(p[0:], c.FWVer)
	binary.BigEndian.PutUint64(p[8:], c.NodeGUID)
	le.PutUint64(p[16:], c.SysImageGUID)
	le.PutUint64(p[24:], c.MaxMRSize)
	for _, f := range []struct {
		off int
		v   uint32
	}{
		{76, c.MaxQP}, {80, c.MaxQPWR}, {88, c.MaxSGE}, {96, c.MaxCQ},
		{100, c.MaxCQE}, {104, c.MaxMR}, {108, c.MaxPD}, {164, c.MaxAH},
		{176, c.MaxSRQ}, {180, c.MaxSRQWR}, {184, c.MaxSRQSGE}, {188, c.MaxUAR},
		{192, c.GIDTblLen},
	} {
		le.PutUint32(p[f.off:], f.v)
	}
	le.PutUint16(p[196:], c.MaxPKeys)
	p[199] = c.PhysPortCnt
	p[200] = c.Mode
	p[203] |= c.GIDTypes
}

// SpecError is ParseSpec's error: the spec, and what is wrong with it.
type SpecError struct {
	Spec, Reason string
}

func (e *SpecError) Error() string { return fmt.Sprintf("pvsim: model spec %q: %s", e.Spec, e.Reason) }

// ParseSpec reads a model spec, as pvctl's --model and the libibverbs
// drop-in's VFRDMA_MODEL take it: v17..v20 (VMware's device at that
// interface version; vmware is v20) or qemu (QEMU 7.2's device), with
// ",rocev2" for RoCE v2 GIDs. Case does not matter. A spec it does not
// take is a *SpecError.
func ParseSpec(spec string) (Config, error) {
	var cfg Config
	parts := strings.Split(strings.ToLower(spec), ",")
	switch v := parts[0]; {
	case v == "qemu":
		cfg.QEMU = true
	case v == "vmware":
		cfg.Version = VersionQPHandle
	case strings.HasPrefix(v, "v"):
		n, err := strconv.Atoi(v[1:])
		if err != nil || n < int(VersionRoCEv1) || n > int(VersionQPHandle) {
			return cfg, &SpecError{spec, "the version is v17 to v20"}
		}
		cfg.Version = uint32(n)
	default:
		return cfg, &SpecError{spec, "want v17..v20, vmware or qemu, with ,rocev2 optional"}
	}
	for _, opt := range parts[1:] {
		if opt != "rocev2" {
			return cfg, &SpecError{spec, fmt.Sprintf("unknown option %q (rocev2 is the one)", opt)}
		}
		cfg.RoCEv2 = true
	}
	return cfg, nil
}
