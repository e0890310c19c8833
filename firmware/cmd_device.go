package firmware

import "fmt"

// Port states (QUERY_PORT state).
const (
	PortNop         = 0
	PortDown        = 1
	PortInit        = 2
	PortArmed       = 3
	PortActive      = 4
	PortActiveDefer = 5
)

// MTU values (port max_mtu/active_mtu, QP path_mtu).
const (
	MTU256  = 1
	MTU512  = 2
	MTU1024 = 3
	MTU2048 = 4
	MTU4096 = 5
)

// GID types (caps.gid_types bits, CREATE_BIND gid_type).
const (
	GIDTypeRoCEv1 = 0x1
	GIDTypeRoCEv2 = 0x2
)

// QueryPortRequest is QUERY_PORT (0).
type QueryPortRequest struct {
	Port uint8 // port number; QEMU accepts 0 and 1
}

// Cmd implements Request.
func (QueryPortRequest) Cmd() Cmd { return CmdQueryPort }

// Encode implements Request.
func (r QueryPortRequest) Encode(b []byte) error {
	if err := beginRequest(b, CmdQueryPort); err != nil {
		return err
	}
	b[16] = r.Port
	return nil
}

// PortAttr is the port attribute block of the QUERY_PORT response. QEMU
// 7.2 reports max_msg_sz 1024, width 1X and speed SDR whatever the backend,
// and state DOWN until the paired vmxnet3 function is activated.
type PortAttr struct {
	State         uint32 `json:"state"`   // Port* constants
	MaxMTU        uint32 `json:"max_mtu"` // MTU* constants
	ActiveMTU     uint32 `json:"active_mtu"`
	GIDTblLen     uint32 `json:"gid_tbl_len"`
	PortCapFlags  uint32 `json:"port_cap_flags"`
	MaxMsgSz      uint32 `json:"max_msg_sz"`
	BadPKeyCntr   uint32 `json:"bad_pkey_cntr"`
	QKeyViolCntr  uint32 `json:"qkey_viol_cntr"`
	PKeyTblLen    uint16 `json:"pkey_tbl_len"`
	LID           uint16 `json:"lid"`
	SMLID         uint16 `json:"sm_lid"`
	LMC           uint8  `json:"lmc"`
	MaxVLNum      uint8  `json:"max_vl_num"`
	SMSL          uint8  `json:"sm_sl"`
	SubnetTimeout uint8  `json:"subnet_timeout"`
	InitTypeReply uint8  `json:"init_type_reply"`
	ActiveWidth   uint8  `json:"active_width"`
	ActiveSpeed   uint8  `json:"active_speed"`
	PhysState     uint8  `json:"phys_state"`
}

// QueryPortResponse is the response to QUERY_PORT.
type QueryPortResponse struct {
	Attr PortAttr
}

// Decode implements Response.
func (r *QueryPortResponse) Decode(b []byte) error {
	if err := checkResp(b, CmdQueryPort); err != nil {
		return err
	}
	a := &r.Attr
	a.State = le.Uint32(b[16:])
	a.MaxMTU = le.Uint32(b[20:])
	a.ActiveMTU = le.Uint32(b[24:])
	a.GIDTblLen = le.Uint32(b[28:])
	a.PortCapFlags = le.Uint32(b[32:])
	a.MaxMsgSz = le.Uint32(b[36:])
	a.BadPKeyCntr = le.Uint32(b[40:])
	a.QKeyViolCntr = le.Uint32(b[44:])
	a.PKeyTblLen = le.Uint16(b[48:])
	a.LID = le.Uint16(b[50:])
	a.SMLID = le.Uint16(b[52:])
	a.LMC = b[54]
	a.MaxVLNum = b[55]
	a.SMSL = b[56]
	a.SubnetTimeout = b[57]
	a.InitTypeReply = b[58]
	a.ActiveWidth = b[59]
	a.ActiveSpeed = b[60]
	a.PhysState = b[61]
	return nil
}

// QueryPKeyRequest is QUERY_PKEY (1).
type QueryPKeyRequest struct {
	Port  uint8
	Index uint8
}

// Cmd implements Request.
func (QueryPKeyRequest) Cmd() Cmd { return CmdQueryPKey }

// Encode implements Request.
func (r QueryPKeyRequest) Encode(b []byte) error {
	if err := beginRequest(b, CmdQueryPKey); err != nil {
		return err
	}
	b[16] = r.Port
	b[17] = r.Index
	return nil
}

// QueryPKeyResponse is the response to QUERY_PKEY (QEMU: always 0xFFFF).
type QueryPKeyResponse struct {
	PKey uint16
}

// Decode implements Response.
func (r *QueryPKeyResponse) Decode(b []byte) error {
	if err := checkResp(b, CmdQueryPKey); err != nil {
		return err
	}
	r.PKey = le.Uint16(b[16:])
	return nil
}

// CreateUCRequest is CREATE_UC (13): a user context for a UAR page. A VFIO
// driver does not need one (context handle 0 works); QEMU ignores the PFN.
type CreateUCRequest struct {
	// PFN is the UAR page frame number.
	PFN uint64
	// PFN64 selects the 64-bit form (device VERSION >= 19, see
	// Quirks.PFN64); the 32-bit form rejects a PFN above 32 bits.
	PFN64 bool
}

// Cmd implements Request.
func (CreateUCRequest) Cmd() Cmd { return CmdCreateUC }

// Validate checks that the PFN fits the form in use.
func (r CreateUCRequest) Validate() error {
	if !r.PFN64 && r.PFN > 0xFFFFFFFF {
		return invalid("CREATE_UC request", "pfn", r.PFN, "< 2^32 (device VERSION < 19)")
	}
	return nil
}

// Encode implements Request. The 32-bit and 64-bit forms share offset 16;
// little-endian, a value below 2^32 has the same bytes in both.
func (r CreateUCRequest) Encode(b []byte) error {
	if err := beginRequest(b, CmdCreateUC); err != nil {
		return err
	}
	if r.PFN64 {
		le.PutUint64(b[16:], r.PFN)
	} else {
		le.PutUint32(b[16:], uint32(r.PFN))
	}
	return nil
}

// CreateUCResponse is the response to CREATE_UC.
type CreateUCResponse struct {
	CtxHandle uint32
}

// Decode implements Response.
func (r *CreateUCResponse) Decode(b []byte) error {
	if err := checkResp(b, CmdCreateUC); err != nil {
		return err
	}
	r.CtxHandle = le.Uint32(b[16:])
	return nil
}

// DestroyUCRequest is DESTROY_UC (14). The device writes no response.
type DestroyUCRequest struct {
	CtxHandle uint32
}

// Cmd implements Request.
func (DestroyUCRequest) Cmd() Cmd { return CmdDestroyUC }

// Encode implements Request.
func (r DestroyUCRequest) Encode(b []byte) error {
	if err := beginRequest(b, CmdDestroyUC); err != nil {
		return err
	}
	le.PutUint32(b[16:], r.CtxHandle)
	return nil
}

// MaxGIDIndex bounds CREATE_BIND/DESTROY_BIND indices on QEMU 7.2 (its
// GID table has 255 entries); caps.gid_tbl_len is the device's own bound.
const MaxGIDIndex = 254

// CreateBindRequest is CREATE_BIND (15): store a GID at an index of the
// port's GID table. The device writes no response. QEMU uses only Index and
// GID; Linux sends MTU 1024 and VLAN 0xFFF.
type CreateBindRequest struct {
	MTU     uint32
	VLAN    uint32
	Index   uint32
	GID     [16]byte
	GIDType uint8 // GIDTypeRoCEv1 or GIDTypeRoCEv2
}

// Cmd implements Request.
func (CreateBindRequest) Cmd() Cmd { return CmdCreateBind }

// Validate checks the index against QEMU's table size.
func (r CreateBindRequest) Validate() error {
	if r.Index > MaxGIDIndex {
		return invalid("CREATE_BIND request", "index", uint64(r.Index), fmt.Sprintf("<= %d", MaxGIDIndex))
	}
	return nil
}

// Encode implements Request.
func (r CreateBindRequest) Encode(b []byte) error {
	if err := beginRequest(b, CmdCreateBind); err != nil {
		return err
	}
	le.PutUint32(b[16:], r.MTU)
	le.PutUint32(b[20:], r.VLAN)
	le.PutUint32(b[24:], r.Index)
	copy(b[28:44], r.GID[:])
	b[44] = r.GIDType
	return nil
}

// DestroyBindRequest is DESTROY_BIND (16). The device writes no response.
type DestroyBindRequest struct {
	Index uint32
	GID   [16]byte
}

// Cmd implements Request.
func (DestroyBindRequest) Cmd() Cmd { return CmdDestroyBind }

// Validate checks the index against QEMU's table size.
func (r DestroyBindRequest) Validate() error {
	if r.Index > MaxGIDIndex {
		return invalid("DESTROY_BIND request", "index", uint64(r.Index), fmt.Sprintf("<= %d", MaxGIDIndex))
	}
	return nil
}

// Encode implements Request.
func (r DestroyBindRequest) Encode(b []byte) error {
	if err := beginRequest(b, CmdDestroyBind); err != nil {
		return err
	}
	le.PutUint32(b[16:], r.Index)
	copy(b[20:36], r.GID[:])
	return nil
}
