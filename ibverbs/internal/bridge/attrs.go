package bridge

import (
	"context"
	"fmt"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/firmware"
)

// DeviceAttr is struct ibv_device_attr's content.
type DeviceAttr struct {
	FWVer                                  string
	NodeGUID, SysImageGUID                 uint64 // numeric (the C layer stores them big-endian)
	MaxMRSize, PageSizeCap                 uint64
	VendorID, VendorPartID, HWVer          uint32
	MaxQP, MaxQPWR                         int
	DeviceCapFlags                         uint32
	MaxSGE, MaxSGERD, MaxCQ, MaxCQE        int
	MaxMR, MaxPD, MaxQPRDAtom, MaxQPInitRD int
	MaxResRDAtom, AtomicCap                int
	MaxAH, MaxSRQ, MaxSRQWR, MaxSRQSGE     int
	MaxPKeys                               int
	LocalCAAckDelay, PhysPortCnt           uint8
}

// ibv_device_cap_flags the drop-in reports.
const (
	capRCRNRNAKGen        = 1 << 12
	capPortActiveEvent    = 1 << 10
	atomicNone, atomicHCA = 0, 1
)

// DeviceAttr returns what ibv_query_device reports: the device's
// capabilities, with max_srq_wr the deepest SRQ the driver makes and
// max_qp_rd_atom the device's.
func (c *Context) DeviceAttr() DeviceAttr {
	c.attrOnce.Do(func() {
		k := c.Dev.Caps()
		a := DeviceAttr{
			FWVer: k.FWVersion(), NodeGUID: k.NodeGUID, SysImageGUID: k.SysImageGUID,
			MaxMRSize: k.MaxMRSize, PageSizeCap: k.PageSizeCap,
			VendorID: k.VendorID, VendorPartID: k.VendorPartID, HWVer: k.HWVer,
			MaxQP: int(k.MaxQP), MaxQPWR: int(k.MaxQPWR), DeviceCapFlags: capRCRNRNAKGen,
			MaxSGE: int(k.MaxSGE), MaxSGERD: int(k.MaxSGERD), MaxCQ: int(k.MaxCQ), MaxCQE: int(k.MaxCQE),
			MaxMR: int(k.MaxMR), MaxPD: int(k.MaxPD), MaxQPRDAtom: int(k.MaxQPRDAtom), MaxQPInitRD: int(k.MaxQPInitRDAtom),
			MaxResRDAtom: int(k.MaxResRDAtom), AtomicCap: atomicNone,
			MaxAH: int(k.MaxAH), MaxSRQ: int(k.MaxSRQ), MaxSRQWR: c.Dev.MaxSRQDepth(1), MaxSRQSGE: int(k.MaxSRQSGE),
			MaxPKeys: int(k.MaxPKeys), LocalCAAckDelay: k.LocalCAAckDelay, PhysPortCnt: k.PhysPortCnt,
		}
		if a.MaxSGERD == 0 {
			a.MaxSGERD = a.MaxSGE
		}
		if !c.Dev.Quirks().NoAsyncEvents {
			a.DeviceCapFlags |= capPortActiveEvent
		}
		if k.AtomicOps != 0 && !c.Dev.Quirks().Emulated {
			a.AtomicCap = atomicHCA
		}
		if a.VendorID == 0 {
			a.VendorID, a.VendorPartID = 0x15ad, 0x0820
		}
		c.attr = a
	})
	return c.attr
}

// PortAttr is struct ibv_port_attr's content.
type PortAttr struct {
	State, MaxMTU, ActiveMTU  int
	GIDTblLen                 int
	PortCapFlags              uint32
	MaxMsgSz                  uint32
	BadPKeyCntr, QKeyViolCntr uint32
	PKeyTblLen                int
	LID, SMLID                uint16
	LMC, MaxVLNum, SMSL       uint8
	SubnetTimeout             uint8
	InitTypeReply             uint8
	ActiveWidth, ActiveSpeed  uint8
	PhysState                 uint8
	LinkLayer                 uint8 // IBV_LINK_LAYER_ETHERNET
}

// linkLayerEthernet is IBV_LINK_LAYER_ETHERNET: the device is RoCE.
const linkLayerEthernet = 2

// QueryPort asks the device for port's attributes (port 1 is the one).
func (c *Context) QueryPort(port int) (PortAttr, error) {
	if port != 1 {
		return PortAttr{}, fmt.Errorf("%w: port %d (the device has port 1)", errInvalid, port)
	}
	ctx, cancel := context.WithTimeout(context.Background(), CommandTimeout)
	defer cancel()
	p, err := c.Dev.QueryPort(ctx)
	if err != nil {
		return PortAttr{}, err
	}
	a := PortAttr{State: int(p.State), MaxMTU: int(p.MaxMTU), ActiveMTU: int(p.ActiveMTU),
		GIDTblLen: int(p.GIDTblLen), PortCapFlags: p.PortCapFlags, MaxMsgSz: p.MaxMsgSz,
		BadPKeyCntr: p.BadPKeyCntr, QKeyViolCntr: p.QKeyViolCntr, PKeyTblLen: int(p.PKeyTblLen),
		LID: p.LID, SMLID: p.SMLID, LMC: p.LMC, MaxVLNum: p.MaxVLNum, SMSL: p.SMSL,
		SubnetTimeout: p.SubnetTimeout, InitTypeReply: p.InitTypeReply,
		ActiveWidth: p.ActiveWidth, ActiveSpeed: p.ActiveSpeed, PhysState: p.PhysState,
		LinkLayer: linkLayerEthernet}
	if a.GIDTblLen == 0 {
		a.GIDTblLen = int(c.Dev.Caps().GIDTblLen)
	}
	if a.PKeyTblLen == 0 {
		a.PKeyTblLen = 1
	}
	return a, nil
}

// GID returns the GID at index of port 1: a bound one, or the zero GID
// for an index in the table with nothing bound. An index past the table
// is EINVAL.
func (c *Context) GID(port, index int) (vfrdma.GID, error) {
	if port != 1 || index < 0 || index >= int(c.Dev.Caps().GIDTblLen) {
		return vfrdma.GID{}, fmt.Errorf("%w: GID %d of port %d (the table has %d)", errInvalid, index, port, c.Dev.Caps().GIDTblLen)
	}
	return c.Dev.GIDs()[index], nil
}

// The verbs' GID types: ibv_query_gid_type's sysfs numbering and
// struct ibv_gid_entry's.
const (
	GIDTypeSysfsRoCEv1 = 0
	GIDTypeSysfsRoCEv2 = 1
	GIDTypeRoCEv1      = 1
	GIDTypeRoCEv2      = 2
)

// RoCEv2 reports whether the device's GIDs are RoCE v2.
func (c *Context) RoCEv2() bool { return c.Dev.Caps().GIDTypes&firmware.GIDTypeRoCEv2 != 0 }
