package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/firmware"
)

// infoAbout is info's help beyond its summary: the JSON's forms.
const infoAbout = `With --json, one object: the device's attributes under ibv_devinfo -v's
names (fw_ver, node_guid, vendor_part_id, max_qp_wr, max_map_per_fmr, ...),
then PVRDMA's own capabilities ibv_devinfo does not show, then "ports" (per
port: state, max_mtu, active_mtu, link_layer, ..., gids), "quirks" and
"srq". GUIDs are strings in ibv_devinfo's form "xxxx:xxxx:xxxx:xxxx";
64-bit values (max_mr_size, page_size_cap, atomic_arg_sizes) are "0x..."
strings, as ibv_devinfo prints them; other numbers are numbers;
enumerations are the names ibv_devinfo prints without its "(code)":
"PORT_ACTIVE", "1024", "Ethernet", "1X", "2.5 Gbps", "LINK_UP",
"ATOMIC_HCA", and "unknown (N)" for a code it has no name for.`

// infoDoc is what `pvctl info --json` prints (infoAbout says its forms):
// first the device's attributes under the names ibv_devinfo -v prints
// (rdma-core's examples/devinfo.c), then PVRDMA's capabilities that have
// no ibv_device_attr field, then the ports and what is vfrdma's own. Every
// key appears once in the document.
type infoDoc struct {
	BDF              string `json:"bdf"`
	InterfaceVersion uint32 `json:"interface_version"` // the VERSION register
	Transport        string `json:"transport"`
	FWVer            string `json:"fw_ver"`
	NodeGUID         string `json:"node_guid"`
	SysImageGUID     string `json:"sys_image_guid"`
	VendorID         uint32 `json:"vendor_id"`
	VendorPartID     uint32 `json:"vendor_part_id"`
	HWVer            uint32 `json:"hw_ver"`
	PhysPortCnt      uint8  `json:"phys_port_cnt"`
	MaxMRSize        string `json:"max_mr_size"`
	PageSizeCap      string `json:"page_size_cap"`
	MaxQP            uint32 `json:"max_qp"`
	MaxQPWR          uint32 `json:"max_qp_wr"`
	DeviceCapFlags   uint32 `json:"device_cap_flags"`
	MaxSGE           uint32 `json:"max_sge"`
	MaxSGERD         uint32 `json:"max_sge_rd"`
	MaxCQ            uint32 `json:"max_cq"`
	MaxCQE           uint32 `json:"max_cqe"`
	MaxMR            uint32 `json:"max_mr"`
	MaxPD            uint32 `json:"max_pd"`
	MaxQPRDAtom      uint32 `json:"max_qp_rd_atom"`
	MaxEERDAtom      uint32 `json:"max_ee_rd_atom"`
	MaxResRDAtom     uint32 `json:"max_res_rd_atom"`
	MaxQPInitRDAtom  uint32 `json:"max_qp_init_rd_atom"`
	MaxEEInitRDAtom  uint32 `json:"max_ee_init_rd_atom"`
	AtomicCap        string `json:"atomic_cap"`
	MaxEE            uint32 `json:"max_ee"`
	MaxRDD           uint32 `json:"max_rdd"`
	MaxMW            uint32 `json:"max_mw"`
	MaxRawIPv6QP     uint32 `json:"max_raw_ipv6_qp"`
	MaxRawEthyQP     uint32 `json:"max_raw_ethy_qp"`
	MaxMcastGrp      uint32 `json:"max_mcast_grp"`
	MaxMcastQPAttach uint32 `json:"max_mcast_qp_attach"`
	MaxTotalMcast    uint32 `json:"max_total_mcast_qp_attach"`
	MaxAH            uint32 `json:"max_ah"`
	MaxFMR           uint32 `json:"max_fmr"`
	MaxMapPerFMR     uint32 `json:"max_map_per_fmr"`
	MaxSRQ           uint32 `json:"max_srq"`
	MaxSRQWR         uint32 `json:"max_srq_wr"`
	MaxSRQSGE        uint32 `json:"max_srq_sge"`
	MaxPKeys         uint16 `json:"max_pkeys"`
	LocalCAAckDelay  uint8  `json:"local_ca_ack_delay"`

	// PVRDMA's capabilities (the DSR's caps) that ibv_devinfo does not
	// print. MaxGIDTblLen is the caps' gid_tbl_len (the port has its
	// own); AtomicOps the CAS (1) and fetch-and-add (2) bits atomic_cap
	// is made from, as Linux's vmw_pvrdma makes it.
	MaxUAR                uint32   `json:"max_uar"`
	MaxGIDTblLen          uint32   `json:"max_gid_tbl_len"`
	GIDTypes              []string `json:"gid_types"`
	AtomicOps             uint8    `json:"atomic_ops"`
	AtomicArgSizes        string   `json:"atomic_arg_sizes"`
	BMMEFlags             uint8    `json:"bmme_flags"`
	ExCompMask            uint32   `json:"ex_comp_mask"`
	DeviceCapFlags2       uint32   `json:"device_cap_flags2"`
	MaxFABitBoundary      uint32   `json:"max_fa_bit_boundary"`
	LogMaxAtomicInlineArg uint32   `json:"log_max_atomic_inline_arg"`
	MaxFastRegPageListLen uint32   `json:"max_fast_reg_page_list_len"`

	Ports     []portDoc `json:"ports"`
	Quirks    quirksDoc `json:"quirks"`
	SRQ       srqInfo   `json:"srq"`
	Recovered int       `json:"recovered_objects,omitempty"`

	mode uint8 // the caps' mode, for the text
}

// portDoc is one port in infoDoc, under ibv_devinfo -v's names.
type portDoc struct {
	Port          int      `json:"port"`
	State         string   `json:"state"`
	MaxMTU        string   `json:"max_mtu"`
	ActiveMTU     string   `json:"active_mtu"`
	SMLID         uint16   `json:"sm_lid"`
	PortLID       uint16   `json:"port_lid"`
	PortLMC       uint8    `json:"port_lmc"`
	LinkLayer     string   `json:"link_layer"`
	MaxMsgSz      uint32   `json:"max_msg_sz"`
	PortCapFlags  uint32   `json:"port_cap_flags"`
	MaxVLNum      string   `json:"max_vl_num"`
	BadPKeyCntr   uint32   `json:"bad_pkey_cntr"`
	QKeyViolCntr  uint32   `json:"qkey_viol_cntr"`
	SMSL          uint8    `json:"sm_sl"`
	PKeyTblLen    uint16   `json:"pkey_tbl_len"`
	GIDTblLen     uint32   `json:"gid_tbl_len"`
	SubnetTimeout uint8    `json:"subnet_timeout"`
	InitTypeReply uint8    `json:"init_type_reply"`
	ActiveWidth   string   `json:"active_width"`
	ActiveSpeed   string   `json:"active_speed"`
	PhysState     string   `json:"phys_state"`
	GIDs          []string `json:"gids"` // by index: the one the driver binds, index 0
}

// quirksDoc is the driver's view of the device's deviations (vfrdma.Quirks
// without its version, which is interface_version).
type quirksDoc struct {
	Emulated          bool   `json:"emulated"`
	SRQSwap           string `json:"srq_swap"`
	NoAsyncEvents     bool   `json:"no_async_events"`
	CQArmBoth         bool   `json:"cq_arm_both"`
	UnquiesceKeepsErr bool   `json:"unquiesce_keeps_err"`
}

// The names ibv_devinfo prints for the codes of the port's and device's
// enumerations (rdma-core's examples/devinfo.c).
var (
	portStateNames = map[uint32]string{firmware.PortNop: "PORT_NOP", firmware.PortDown: "PORT_DOWN", firmware.PortInit: "PORT_INIT",
		firmware.PortArmed: "PORT_ARMED", firmware.PortActive: "PORT_ACTIVE", firmware.PortActiveDefer: "PORT_ACTIVE_DEFER"}
	mtuNames = map[uint32]string{firmware.MTU256: "256", firmware.MTU512: "512", firmware.MTU1024: "1024",
		firmware.MTU2048: "2048", firmware.MTU4096: "4096"}
	widthNames = map[uint32]string{1: "1X", 2: "4X", 4: "8X", 8: "12X", 16: "2X"}
	speedNames = map[uint32]string{1: "2.5 Gbps", 2: "5.0 Gbps", 4: "10.0 Gbps", 8: "10.0 Gbps", 16: "14.0 Gbps",
		32: "25.0 Gbps", 64: "50.0 Gbps", 128: "100.0 Gbps"}
	physStateNames = map[uint32]string{1: "SLEEP", 2: "POLLING", 3: "DISABLED", 4: "PORT_CONFIGURATION_TRAINING",
		5: "LINK_UP", 6: "LINK_ERROR_RECOVERY", 7: "PHY_TEST"}
	vlNames = map[uint32]string{1: "1", 2: "2", 3: "4", 4: "8", 5: "15"}
)

// enumName is code's name in names, or "unknown (code)".
func enumName(names map[uint32]string, code uint32) string {
	if n, ok := names[code]; ok {
		return n
	}
	return fmt.Sprintf("unknown (%d)", code)
}

func portStateName(s uint32) string { return enumName(portStateNames, s) }

// hex64 is a 64-bit value as ibv_devinfo prints it, and as JSON keeps it
// exact: a string.
func hex64(v uint64) string { return fmt.Sprintf("0x%x", v) }

// transportAndLink are ibv_devinfo's transport and link_layer for the
// device's mode: RoCE is the InfiniBand transport over Ethernet.
func transportAndLink(mode uint8) (transport, link string) {
	switch mode {
	case firmware.ModeRoCE:
		return "InfiniBand", "Ethernet"
	case firmware.ModeIWARP:
		return "iWARP", "Ethernet"
	case firmware.ModeIB:
		return "InfiniBand", "InfiniBand"
	}
	u := fmt.Sprintf("unknown (%d)", mode)
	return u, u
}

// atomicCap is ibv_devinfo's atomic_cap as Linux's vmw_pvrdma reports it:
// ATOMIC_HCA when the device runs compare-and-swap or fetch-and-add.
func atomicCap(ops uint8) string {
	if ops&(1<<0|1<<1) != 0 {
		return "ATOMIC_HCA"
	}
	return "ATOMIC_NONE"
}

// gidTypeNames names the GID types in a caps gid_types mask.
func gidTypeNames(mask uint8) []string {
	names := []string{}
	for bit, n := range map[uint8]string{firmware.GIDTypeRoCEv1: "RoCE v1", firmware.GIDTypeRoCEv2: "RoCE v2"} {
		if mask&bit != 0 {
			names = append(names, n)
			mask &^= bit
		}
	}
	slices.Sort(names)
	if mask != 0 {
		names = append(names, fmt.Sprintf("unknown (%#x)", mask))
	}
	return names
}

// newInfoDoc makes info's document from what the device reported.
func newInfoDoc(d *vfrdma.Device, port vfrdma.PortAttr) infoDoc {
	c, q := d.Caps(), d.Quirks()
	transport, link := transportAndLink(c.Mode)
	return infoDoc{
		BDF: d.Name(), InterfaceVersion: d.Version(), Transport: transport, FWVer: c.FWVersion(),
		NodeGUID: guid(c.NodeGUID), SysImageGUID: guid(c.SysImageGUID),
		VendorID: c.VendorID, VendorPartID: c.VendorPartID, HWVer: c.HWVer, PhysPortCnt: c.PhysPortCnt,
		MaxMRSize: hex64(c.MaxMRSize), PageSizeCap: hex64(c.PageSizeCap),
		MaxQP: c.MaxQP, MaxQPWR: c.MaxQPWR, DeviceCapFlags: c.DeviceCapFlags, MaxSGE: c.MaxSGE, MaxSGERD: c.MaxSGERD,
		MaxCQ: c.MaxCQ, MaxCQE: c.MaxCQE, MaxMR: c.MaxMR, MaxPD: c.MaxPD,
		MaxQPRDAtom: c.MaxQPRDAtom, MaxEERDAtom: c.MaxEERDAtom, MaxResRDAtom: c.MaxResRDAtom,
		MaxQPInitRDAtom: c.MaxQPInitRDAtom, MaxEEInitRDAtom: c.MaxEEInitRDAtom, AtomicCap: atomicCap(c.AtomicOps),
		MaxEE: c.MaxEE, MaxRDD: c.MaxRDD, MaxMW: c.MaxMW, MaxRawIPv6QP: c.MaxRawIPv6QP, MaxRawEthyQP: c.MaxRawEthyQP,
		MaxMcastGrp: c.MaxMcastGrp, MaxMcastQPAttach: c.MaxMcastQPAttach, MaxTotalMcast: c.MaxTotalMcastQPAttach,
		MaxAH: c.MaxAH, MaxFMR: c.MaxFMR, MaxMapPerFMR: c.MaxMapPerFMR,
		MaxSRQ: c.MaxSRQ, MaxSRQWR: c.MaxSRQWR, MaxSRQSGE: c.MaxSRQSGE, MaxPKeys: c.MaxPKeys, LocalCAAckDelay: c.LocalCAAckDelay,

		MaxUAR: c.MaxUAR, MaxGIDTblLen: c.GIDTblLen, GIDTypes: gidTypeNames(c.GIDTypes), AtomicOps: c.AtomicOps,
		AtomicArgSizes: hex64(c.AtomicArgSizes), BMMEFlags: c.BMMEFlags, ExCompMask: c.ExCompMask,
		DeviceCapFlags2: c.DeviceCapFlags2, MaxFABitBoundary: c.MaxFABitBoundary,
		LogMaxAtomicInlineArg: c.LogMaxAtomicInlineArg, MaxFastRegPageListLen: c.MaxFastRegPageListLen,

		Ports: []portDoc{{
			Port: 1, State: portStateName(port.State), MaxMTU: enumName(mtuNames, port.MaxMTU), ActiveMTU: enumName(mtuNames, port.ActiveMTU),
			SMLID: port.SMLID, PortLID: port.LID, PortLMC: port.LMC, LinkLayer: link, MaxMsgSz: port.MaxMsgSz,
			PortCapFlags: port.PortCapFlags, MaxVLNum: enumName(vlNames, uint32(port.MaxVLNum)),
			BadPKeyCntr: port.BadPKeyCntr, QKeyViolCntr: port.QKeyViolCntr, SMSL: port.SMSL, PKeyTblLen: port.PKeyTblLen,
			GIDTblLen: port.GIDTblLen, SubnetTimeout: port.SubnetTimeout, InitTypeReply: port.InitTypeReply,
			ActiveWidth: enumName(widthNames, uint32(port.ActiveWidth)), ActiveSpeed: enumName(speedNames, uint32(port.ActiveSpeed)),
			PhysState: enumName(physStateNames, uint32(port.PhysState)), GIDs: []string{d.GID().String()},
		}},
		Quirks: quirksDoc{Emulated: q.Emulated, SRQSwap: q.SRQSwap.String(), NoAsyncEvents: q.NoAsyncEvents,
			CQArmBoth: q.CQArmBoth, UnquiesceKeepsErr: q.UnquiesceKeepsErr},
		SRQ:       newSRQInfo(d),
		Recovered: d.Recovered(),
		mode:      c.Mode,
	}
}

// srqInfo is what matters to a user of shared receive queues beyond the
// device's max_srq, max_srq_wr and max_srq_sge.
type srqInfo struct {
	// MaxDepth is the largest SRQ the driver creates, by SGEs per receive
	// (index 0: 1 SGE), as the driver computes it (Device.MaxSRQDepth).
	MaxDepth []int `json:"max_depth_by_sge"`
	// LimitEvents says who raises low-watermark events.
	LimitEvents string `json:"low_watermark_events"`

	maxSRQWR, maxSGE int // the device's, for the text
}

func newSRQInfo(d *vfrdma.Device) srqInfo {
	c := d.Caps()
	s := srqInfo{maxSRQWR: int(c.MaxSRQWR), maxSGE: int(c.MaxSRQSGE), LimitEvents: "the driver, from its own counts", MaxDepth: []int{}}
	if d.Quirks().NoAsyncEvents {
		s.LimitEvents += " (the device sends none)"
	}
	for sge := 1; sge <= s.maxSGE; sge++ {
		s.MaxDepth = append(s.MaxDepth, d.MaxSRQDepth(sge))
	}
	return s
}

// depthText lists MaxDepth by SGEs per receive, for the text output.
func (s *srqInfo) depthText() string {
	if len(s.MaxDepth) == 0 {
		return "none (no SRQ SGEs)"
	}
	parts := make([]string, len(s.MaxDepth))
	for i, n := range s.MaxDepth {
		parts[i] = fmt.Sprintf("%d (%d SGE)", n, i+1)
		if i > 0 {
			parts[i] = fmt.Sprintf("%d (%d SGEs)", n, i+1)
		}
	}
	return strings.Join(parts, ", ")
}

// limitText says what MaxDepth is made of, for the text output.
func (s *srqInfo) limitText() string {
	return fmt.Sprintf("the lower of max_srq_wr %d and what one ring of %d pages holds at each stride, rounded down to a power of two",
		s.maxSRQWR, firmware.MaxRingChunks)
}

// cmdInfo opens the device and prints its capabilities and port, in the
// spirit of ibv_devinfo -v.
func cmdInfo(e *env, args []string) error {
	fs := newFlagSet(e, "info")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := e.checkBDF(fs.Args()); err != nil {
		return err
	}
	d, err := e.open(fs.Args(), nil)
	if err != nil {
		return err
	}
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	port, err := d.QueryPort(ctx)
	if err != nil {
		return err
	}
	doc := newInfoDoc(d, port)
	if err := d.Close(); err != nil {
		return err
	}
	if e.json {
		return e.printJSON(doc)
	}
	printInfo(e.out, &doc)
	return nil
}

func guid(v uint64) string {
	return fmt.Sprintf("%04x:%04x:%04x:%04x", v>>48, v>>32&0xffff, v>>16&0xffff, v&0xffff)
}

func printInfo(w io.Writer, d *infoDoc) {
	p := &d.Ports[0]
	rows := []struct {
		k string
		v any
	}{
		{"hca_id", "pvrdma " + d.BDF},
		{"interface version", d.InterfaceVersion},
		{"transport", d.Transport},
		{"fw_ver", d.FWVer},
		{"node_guid", d.NodeGUID},
		{"sys_image_guid", d.SysImageGUID},
		{"phys_port_cnt", d.PhysPortCnt},
		{"max_mr_size", d.MaxMRSize},
		{"max_qp", d.MaxQP},
		{"max_qp_wr", d.MaxQPWR},
		{"max_sge", d.MaxSGE},
		{"max_cq", d.MaxCQ},
		{"max_cqe", d.MaxCQE},
		{"max_mr", d.MaxMR},
		{"max_pd", d.MaxPD},
		{"max_ah", d.MaxAH},
		{"max_srq", d.MaxSRQ},
		{"max_srq_wr", d.MaxSRQWR},
		{"max_srq_sge", d.MaxSRQSGE},
		{"max_pkeys", d.MaxPKeys},
		{"atomic_cap", d.AtomicCap},
		{"gid_tbl_len", d.MaxGIDTblLen},
		{"gid_types", strings.Join(d.GIDTypes, ", ")},
		{"mode", map[uint8]string{0: "RoCE", 1: "iWARP", 2: "InfiniBand"}[d.mode]},
		{"port 1 state", p.State},
		{"port 1 max_mtu", p.MaxMTU},
		{"port 1 active_mtu", p.ActiveMTU},
		{"port 1 link_layer", p.LinkLayer},
		{"port 1 max_msg_sz", fmt.Sprintf("0x%x", p.MaxMsgSz)},
		{"port 1 gid_tbl_len", p.GIDTblLen},
		{"port 1 pkey_tbl_len", p.PKeyTblLen},
		{"port 1 active_width", p.ActiveWidth},
		{"port 1 active_speed", p.ActiveSpeed},
		{"port 1 GID[0]", p.GIDs[0]},
		{"srq max depth", d.SRQ.depthText()},
		{"srq depth limit", d.SRQ.limitText()},
		{"srq low watermark", "raised by " + d.SRQ.LimitEvents},
		{"quirks", fmt.Sprintf("emulated=%v cq_arm_both=%v no_async_events=%v", d.Quirks.Emulated, d.Quirks.CQArmBoth, d.Quirks.NoAsyncEvents)},
	}
	for _, r := range rows {
		fmt.Fprintf(w, "%-22s %v\n", r.k+":", r.v)
	}
	if d.Recovered > 0 {
		fmt.Fprintf(w, "%-22s %d (left by a process that died holding the device)\n", "recovered objects:", d.Recovered)
	}
}
