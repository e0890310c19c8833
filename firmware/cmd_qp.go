package firmware

import "fmt"

// QPType is a queue pair type (CREATE_QP qp_type).
type QPType uint8

// QP types. QEMU 7.2 creates GSI, RC and UD QPs and rejects the others
// with EIO.
const (
	QPTypeSMI          QPType = 0
	QPTypeGSI          QPType = 1
	QPTypeRC           QPType = 2
	QPTypeUC           QPType = 3
	QPTypeUD           QPType = 4
	QPTypeRawIPv6      QPType = 5
	QPTypeRawEthertype QPType = 6
	QPTypeRawPacket    QPType = 8
	QPTypeXRCIni       QPType = 9
	QPTypeXRCTgt       QPType = 10
)

// QPState is a queue pair state.
type QPState uint32

// QP states.
const (
	QPStateReset QPState = 0
	QPStateInit  QPState = 1
	QPStateRTR   QPState = 2
	QPStateRTS   QPState = 3
	QPStateSQD   QPState = 4
	QPStateSQE   QPState = 5
	QPStateErr   QPState = 6
)

var qpStateNames = [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}

func (s QPState) String() string {
	if int(s) < len(qpStateNames) {
		return qpStateNames[s]
	}
	return fmt.Sprintf("QPState(%d)", uint32(s))
}

// MODIFY_QP / QUERY_QP attribute mask bits.
const (
	QPAttrState           = 1 << 0
	QPAttrCurState        = 1 << 1
	QPAttrEnSQDAsync      = 1 << 2
	QPAttrAccessFlags     = 1 << 3
	QPAttrPKeyIndex       = 1 << 4
	QPAttrPort            = 1 << 5
	QPAttrQKey            = 1 << 6
	QPAttrAV              = 1 << 7
	QPAttrPathMTU         = 1 << 8
	QPAttrTimeout         = 1 << 9
	QPAttrRetryCnt        = 1 << 10
	QPAttrRNRRetry        = 1 << 11
	QPAttrRQPSN           = 1 << 12
	QPAttrMaxQPRDAtomic   = 1 << 13
	QPAttrAltPath         = 1 << 14
	QPAttrMinRNRTimer     = 1 << 15
	QPAttrSQPSN           = 1 << 16
	QPAttrMaxDestRDAtomic = 1 << 17
	QPAttrPathMigState    = 1 << 18
	QPAttrCap             = 1 << 19
	QPAttrDestQPN         = 1 << 20
	// QPAttrAll is every mask bit the device defines.
	QPAttrAll = 1<<21 - 1
)

// AHFlagGRH marks an address handle with a global route header.
const AHFlagGRH = 1

// GlobalRoute is the GRH part of an address handle.
type GlobalRoute struct {
	DGID         [16]byte
	FlowLabel    uint32
	SGIDIndex    uint8
	HopLimit     uint8
	TrafficClass uint8
}

// AHAttr is an address handle as carried in QP attributes (40 bytes).
type AHAttr struct {
	GRH         GlobalRoute
	DLID        uint16
	VLANID      uint16
	SL          uint8
	SrcPathBits uint8
	StaticRate  uint8
	AHFlags     uint8 // AHFlagGRH
	PortNum     uint8
	DMAC        [6]byte
}

// QPCap is the capacity part of QP attributes.
type QPCap struct {
	MaxSendWR     uint32
	MaxRecvWR     uint32
	MaxSendSGE    uint32
	MaxRecvSGE    uint32
	MaxInlineData uint32
}

// QPAttr is the 160-byte QP attribute block of MODIFY_QP. Every field is
// sent whatever the mask says: QEMU 7.2 reads the values it needs (dgid,
// sgid_index, dest_qp_num, qkey, PSNs) whether or not their mask bits are
// set, so fill everything the transition needs.
type QPAttr struct {
	QPState          QPState
	CurQPState       QPState
	PathMTU          uint32 // MTU* constants
	PathMigState     uint32
	QKey             uint32
	RQPSN            uint32
	SQPSN            uint32
	DestQPNum        uint32
	QPAccessFlags    uint32
	PKeyIndex        uint16
	AltPKeyIndex     uint16
	EnSQDAsyncNotify uint8
	SQDraining       uint8
	MaxRDAtomic      uint8
	MaxDestRDAtomic  uint8
	MinRNRTimer      uint8
	PortNum          uint8
	Timeout          uint8
	RetryCnt         uint8
	RNRRetry         uint8
	AltPortNum       uint8
	AltTimeout       uint8
	Cap              QPCap
	AH               AHAttr
	AltAH            AHAttr
}

// encodeAH writes an address handle at b[0:40].
func encodeAH(b []byte, a *AHAttr) {
	copy(b[0:16], a.GRH.DGID[:])
	le.PutUint32(b[16:], a.GRH.FlowLabel)
	b[20] = a.GRH.SGIDIndex
	b[21] = a.GRH.HopLimit
	b[22] = a.GRH.TrafficClass
	le.PutUint16(b[24:], a.DLID)
	le.PutUint16(b[26:], a.VLANID)
	b[28] = a.SL
	b[29] = a.SrcPathBits
	b[30] = a.StaticRate
	b[31] = a.AHFlags
	b[32] = a.PortNum
	copy(b[33:39], a.DMAC[:])
}

// encode writes the attribute block at b[0:160].
func (a *QPAttr) encode(b []byte) {
	le.PutUint32(b[0:], uint32(a.QPState))
	le.PutUint32(b[4:], uint32(a.CurQPState))
	le.PutUint32(b[8:], a.PathMTU)
	le.PutUint32(b[12:], a.PathMigState)
	le.PutUint32(b[16:], a.QKey)
	le.PutUint32(b[20:], a.RQPSN)
	le.PutUint32(b[24:], a.SQPSN)
	le.PutUint32(b[28:], a.DestQPNum)
	le.PutUint32(b[32:], a.QPAccessFlags)
	le.PutUint16(b[36:], a.PKeyIndex)
	le.PutUint16(b[38:], a.AltPKeyIndex)
	b[40] = a.EnSQDAsyncNotify
	b[41] = a.SQDraining
	b[42] = a.MaxRDAtomic
	b[43] = a.MaxDestRDAtomic
	b[44] = a.MinRNRTimer
	b[45] = a.PortNum
	b[46] = a.Timeout
	b[47] = a.RetryCnt
	b[48] = a.RNRRetry
	b[49] = a.AltPortNum
	b[50] = a.AltTimeout
	le.PutUint32(b[56:], a.Cap.MaxSendWR)
	le.PutUint32(b[60:], a.Cap.MaxRecvWR)
	le.PutUint32(b[64:], a.Cap.MaxSendSGE)
	le.PutUint32(b[68:], a.Cap.MaxRecvSGE)
	le.PutUint32(b[72:], a.Cap.MaxInlineData)
	encodeAH(b[80:120], &a.AH)
	encodeAH(b[120:160], &a.AltAH)
}

// Work-queue element sizes that set the ring strides (the device computes
// them from the SGE counts in CREATE_QP and CREATE_SRQ).
const (
	sqWQEHeader = 80
	rqWQEHeader = 16
	sgeSize     = 16
)

// wqeStride returns the smallest power of two >= hdr + 16*sges.
func wqeStride(hdr int, sges uint32) uint64 {
	n := uint64(hdr) + sgeSize*uint64(sges)
	s := uint64(1)
	for s < n {
		s <<= 1
	}
	return s
}

// CreateQPRequest is CREATE_QP (9). The QP's page directory is a single
// table: entry 0 the ring-state page, then SendChunks send-queue pages, then
// the receive-queue pages (none with an SRQ).
type CreateQPRequest struct {
	PDirDMA       uint64
	PDHandle      uint32
	SendCQHandle  uint32
	RecvCQHandle  uint32 // must exist even with an SRQ
	SRQHandle     uint32 // used when IsSRQ
	MaxSendWR     uint32 // SQ ring element count, a power of two
	MaxRecvWR     uint32 // RQ ring element count, a power of two
	MaxSendSGE    uint32 // sets the SQ stride
	MaxRecvSGE    uint32 // sets the RQ stride
	MaxInlineData uint32 // not supported by QEMU; send 0
	LKey          uint32
	AccessFlags   uint32
	TotalChunks   uint16 // 1 + send pages + receive pages
	SendChunks    uint16 // send pages, the state page not counted
	MaxAtomicArg  uint16
	SQSigAll      bool
	QPType        QPType
	IsSRQ         bool
}

// Cmd implements Request.
func (CreateQPRequest) Cmd() Cmd { return CmdCreateQP }

// Validate checks the rules QEMU 7.2 relies on: power-of-two ring sizes,
// 1..128 send pages and (without an SRQ) 1..128 receive pages, rings that
// fit their pages (QEMU does not check, and overruns them), and no receive
// pages with an SRQ.
func (r CreateQPRequest) Validate() error {
	const where = "CREATE_QP request"
	if err := checkDMA(where, "pdir_dma", r.PDirDMA); err != nil {
		return err
	}
	if !isPow2(uint64(r.MaxSendWR)) {
		return invalid(where, "max_send_wr", uint64(r.MaxSendWR), "a power of two")
	}
	if r.SendChunks < 1 || r.SendChunks > MaxRingChunks {
		return invalid(where, "send_chunks", uint64(r.SendChunks), fmt.Sprintf("1..%d", MaxRingChunks))
	}
	if uint64(r.TotalChunks) < 1+uint64(r.SendChunks) {
		return invalid(where, "total_chunks", uint64(r.TotalChunks), fmt.Sprintf(">= 1 + send_chunks = %d", 1+int(r.SendChunks)))
	}
	if room := uint64(r.SendChunks) * PageSize; uint64(r.MaxSendWR)*wqeStride(sqWQEHeader, r.MaxSendSGE) > room {
		return invalid(where, "max_send_wr", uint64(r.MaxSendWR), fmt.Sprintf("<= %d (SQ fits send_chunks pages at stride %d)", room/wqeStride(sqWQEHeader, r.MaxSendSGE), wqeStride(sqWQEHeader, r.MaxSendSGE)))
	}
	rpages := uint64(r.TotalChunks) - 1 - uint64(r.SendChunks)
	if r.IsSRQ {
		if rpages != 0 {
			return invalid(where, "total_chunks", uint64(r.TotalChunks), fmt.Sprintf("%d (no receive pages with an SRQ)", 1+int(r.SendChunks)))
		}
		return nil
	}
	if rpages < 1 || rpages > MaxRingChunks {
		return invalid(where, "total_chunks", uint64(r.TotalChunks), fmt.Sprintf("1 + send_chunks + 1..%d receive pages", MaxRingChunks))
	}
	if !isPow2(uint64(r.MaxRecvWR)) {
		return invalid(where, "max_recv_wr", uint64(r.MaxRecvWR), "a power of two")
	}
	if room := rpages * PageSize; uint64(r.MaxRecvWR)*wqeStride(rqWQEHeader, r.MaxRecvSGE) > room {
		return invalid(where, "max_recv_wr", uint64(r.MaxRecvWR), fmt.Sprintf("<= %d (RQ fits the receive pages at stride %d)", room/wqeStride(rqWQEHeader, r.MaxRecvSGE), wqeStride(rqWQEHeader, r.MaxRecvSGE)))
	}
	return nil
}

func b2u(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// Encode implements Request.
func (r CreateQPRequest) Encode(b []byte) error {
	if err := beginRequest(b, CmdCreateQP); err != nil {
		return err
	}
	le.PutUint64(b[16:], r.PDirDMA)
	le.PutUint32(b[24:], r.PDHandle)
	le.PutUint32(b[28:], r.SendCQHandle)
	le.PutUint32(b[32:], r.RecvCQHandle)
	le.PutUint32(b[36:], r.SRQHandle)
	le.PutUint32(b[40:], r.MaxSendWR)
	le.PutUint32(b[44:], r.MaxRecvWR)
	le.PutUint32(b[48:], r.MaxSendSGE)
	le.PutUint32(b[52:], r.MaxRecvSGE)
	le.PutUint32(b[56:], r.MaxInlineData)
	le.PutUint32(b[60:], r.LKey)
	le.PutUint32(b[64:], r.AccessFlags)
	le.PutUint16(b[68:], r.TotalChunks)
	le.PutUint16(b[70:], r.SendChunks)
	le.PutUint16(b[72:], r.MaxAtomicArg)
	b[74] = b2u(r.SQSigAll)
	b[75] = uint8(r.QPType)
	b[76] = b2u(r.IsSRQ)
	return nil
}

// CreateQPResponse is the response to CREATE_QP, in one of two layouts: v1
// (QPN then the capacities; what QEMU 7.2 writes) and v2 (QPN, a separate
// QP handle, then the capacities; devices reporting VERSION >= 20). Set V2
// from Quirks.CreateQPV2 before decoding; Channel.CreateQP does.
type CreateQPResponse struct {
	// V2 selects the layout to decode; it is an input.
	V2 bool
	// QPN is the QP number peers address.
	QPN uint32
	// QPHandle names the QP in later commands and doorbells; in the v1
	// layout it is the QPN.
	QPHandle      uint32
	MaxSendWR     uint32
	MaxRecvWR     uint32
	MaxSendSGE    uint32
	MaxRecvSGE    uint32
	MaxInlineData uint32
}

// Decode implements Response. The QPN and the handle must fit 24 bits.
func (r *CreateQPResponse) Decode(b []byte) error {
	if err := checkResp(b, CmdCreateQP); err != nil {
		return err
	}
	r.QPN = le.Uint32(b[16:])
	off := 20
	if r.V2 {
		r.QPHandle = le.Uint32(b[20:])
		off = 24
	} else {
		r.QPHandle = r.QPN
	}
	r.MaxSendWR = le.Uint32(b[off:])
	r.MaxRecvWR = le.Uint32(b[off+4:])
	r.MaxSendSGE = le.Uint32(b[off+8:])
	r.MaxRecvSGE = le.Uint32(b[off+12:])
	r.MaxInlineData = le.Uint32(b[off+16:])
	if err := checkHandle(CmdCreateQP, "qpn", r.QPN); err != nil {
		return err
	}
	return checkHandle(CmdCreateQP, "qp_handle", r.QPHandle)
}

// ModifyQPRequest is MODIFY_QP (10). The whole attribute block is sent on
// every call.
type ModifyQPRequest struct {
	QPHandle uint32
	AttrMask uint32 // QPAttr* bits
	Attr     QPAttr
}

// Cmd implements Request.
func (ModifyQPRequest) Cmd() Cmd { return CmdModifyQP }

// Validate checks the mask and the target state.
func (r ModifyQPRequest) Validate() error {
	if r.AttrMask&^QPAttrAll != 0 {
		return invalid("MODIFY_QP request", "attr_mask", uint64(r.AttrMask), fmt.Sprintf("within %#x", QPAttrAll))
	}
	if r.Attr.QPState > QPStateErr {
		return invalid("MODIFY_QP request", "qp_state", uint64(r.Attr.QPState), "0..6")
	}
	return nil
}

// Encode implements Request.
func (r ModifyQPRequest) Encode(b []byte) error {
	if err := beginRequest(b, CmdModifyQP); err != nil {
		return err
	}
	le.PutUint32(b[16:], r.QPHandle)
	le.PutUint32(b[20:], r.AttrMask)
	r.Attr.encode(b[24:184])
	return nil
}

// HeaderOnly is the Response of commands whose response is just a header
// (MODIFY_QP): the channel checks the header and there is nothing to decode.
type HeaderOnly struct{}

// Decode implements Response.
func (HeaderOnly) Decode(b []byte) error {
	if len(b) < HeaderSize {
		return invalid("response slot", "length", uint64(len(b)), fmt.Sprintf(">= %d", HeaderSize))
	}
	return nil
}

// QueryQPRequest is QUERY_QP (11).
type QueryQPRequest struct {
	QPHandle uint32
	AttrMask uint32
}

// Cmd implements Request.
func (QueryQPRequest) Cmd() Cmd { return CmdQueryQP }

// Encode implements Request.
func (r QueryQPRequest) Encode(b []byte) error {
	if err := beginRequest(b, CmdQueryQP); err != nil {
		return err
	}
	le.PutUint32(b[16:], r.QPHandle)
	le.PutUint32(b[20:], r.AttrMask)
	return nil
}

// QueryQPResponse is the part of the QUERY_QP response that is valid on
// QEMU 7.2: response offsets 16..51. QEMU writes libibverbs' QP attribute
// structure over the device's attribute block; the two agree only up to
// qp_access_flags, and everything after (pkey index, capacities, address
// handles) is in libibverbs order, so it is deliberately not decoded.
type QueryQPResponse struct {
	QPState       QPState
	CurQPState    QPState
	PathMTU       uint32
	PathMigState  uint32
	QKey          uint32
	RQPSN         uint32
	SQPSN         uint32
	DestQPNum     uint32
	QPAccessFlags uint32
}

// Decode implements Response. The states must be valid QP states.
func (r *QueryQPResponse) Decode(b []byte) error {
	if err := checkResp(b, CmdQueryQP); err != nil {
		return err
	}
	r.QPState = QPState(le.Uint32(b[16:]))
	r.CurQPState = QPState(le.Uint32(b[20:]))
	r.PathMTU = le.Uint32(b[24:])
	r.PathMigState = le.Uint32(b[28:])
	r.QKey = le.Uint32(b[32:])
	r.RQPSN = le.Uint32(b[36:])
	r.SQPSN = le.Uint32(b[40:])
	r.DestQPNum = le.Uint32(b[44:])
	r.QPAccessFlags = le.Uint32(b[48:])
	if r.QPState > QPStateErr {
		return fault("QUERY_QP response", "qp_state", uint64(r.QPState), "0..6")
	}
	if r.CurQPState > QPStateErr {
		return fault("QUERY_QP response", "cur_qp_state", uint64(r.CurQPState), "0..6")
	}
	return nil
}

// DestroyQPRequest is DESTROY_QP (12). Linux reads no response, and QEMU
// does not fill events_reported; Channel.DestroyQP checks only the status.
type DestroyQPRequest struct {
	QPHandle uint32
}

// Cmd implements Request.
func (DestroyQPRequest) Cmd() Cmd { return CmdDestroyQP }

// Encode implements Request.
func (r DestroyQPRequest) Encode(b []byte) error {
	if err := beginRequest(b, CmdDestroyQP); err != nil {
		return err
	}
	le.PutUint32(b[16:], r.QPHandle)
	return nil
}

// DestroyQPResponse is the response to DESTROY_QP (not written by QEMU 7.2
// beyond the header).
type DestroyQPResponse struct {
	EventsReported uint32
}

// Decode implements Response.
func (r *DestroyQPResponse) Decode(b []byte) error {
	if err := checkResp(b, CmdDestroyQP); err != nil {
		return err
	}
	r.EventsReported = le.Uint32(b[16:])
	return nil
}
