package rings

import "strconv"

// The constants below are untyped so that they compare directly with the
// uint32 fields of SendWQE and CQE; convert to WCStatus or WCOpcode to print
// a name.

// Work-request opcodes (SendWQE.Opcode, WQE byte 16; enum pvrdma_wr_opcode).
// QEMU 7.2 ignores the opcode and posts every WQE as a plain SEND.
const (
	WRRDMAWrite               = 0
	WRRDMAWriteWithImm        = 1
	WRSend                    = 2
	WRSendWithImm             = 3
	WRRDMARead                = 4
	WRAtomicCmpAndSwp         = 5
	WRAtomicFetchAndAdd       = 6
	WRLSO                     = 7
	WRSendWithInv             = 8
	WRRDMAReadWithInv         = 9
	WRLocalInv                = 10
	WRFastRegMR               = 11
	WRMaskedAtomicCmpAndSwp   = 12
	WRMaskedAtomicFetchAndAdd = 13
	WRBindMW                  = 14
	WRRegSigMR                = 15
	WRError                   = 16
)

// Send flags (SendWQE.Flags, WQE byte 20; enum pvrdma_send_flags). QEMU 7.2
// ignores all of them: every send WQE produces a CQE.
const (
	SendFence     = 0x1
	SendSignaled  = 0x2
	SendSolicited = 0x4
	SendInline    = 0x8
	SendIPCsum    = 0x10
)

// WCOpcode is a completion opcode (CQE byte 16; enum pvrdma_wc_opcode).
type WCOpcode uint32

// Completion opcodes. QEMU 7.2 reports WCSend for every send-queue
// completion and WCRecv for every receive.
const (
	WCSend            = 0
	WCRDMAWrite       = 1
	WCRDMARead        = 2
	WCCompSwap        = 3
	WCFetchAdd        = 4
	WCBindMW          = 5
	WCLSO             = 6
	WCLocalInv        = 7
	WCFastRegMR       = 8
	WCMaskedCompSwap  = 9
	WCMaskedFetchAdd  = 10
	WCRecv            = 0x80
	WCRecvRDMAWithImm = 0x81
)

var wcOpcodeNames = [...]string{
	"SEND", "RDMA_WRITE", "RDMA_READ", "COMP_SWAP", "FETCH_ADD", "BIND_MW",
	"LSO", "LOCAL_INV", "FAST_REG_MR", "MASKED_COMP_SWAP", "MASKED_FETCH_ADD",
}

func (o WCOpcode) String() string {
	switch {
	case int(o) < len(wcOpcodeNames):
		return wcOpcodeNames[o]
	case o == WCRecv:
		return "RECV"
	case o == WCRecvRDMAWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return "WC_OPCODE_" + strconv.FormatUint(uint64(o), 10)
}

// WCStatus is a completion status (CQE byte 20; enum pvrdma_wc_status, the
// same numbering as libibverbs' ibv_wc_status).
type WCStatus uint32

// Completion status codes. QEMU 7.2 reports errors it generates itself as
// WCGeneralErr with a code in CQE.VendorErr.
const (
	WCSuccess        = 0
	WCLocLenErr      = 1
	WCLocQPOpErr     = 2
	WCLocEECOpErr    = 3
	WCLocProtErr     = 4
	WCWRFlushErr     = 5
	WCMWBindErr      = 6
	WCBadRespErr     = 7
	WCLocAccessErr   = 8
	WCRemInvReqErr   = 9
	WCRemAccessErr   = 10
	WCRemOpErr       = 11
	WCRetryExcErr    = 12
	WCRNRRetryExcErr = 13
	WCLocRDDViolErr  = 14
	WCRemInvRDReqErr = 15
	WCRemAbortErr    = 16
	WCInvEECNErr     = 17
	WCInvEECStateErr = 18
	WCFatalErr       = 19
	WCRespTimeoutErr = 20
	WCGeneralErr     = 21
)

var wcStatusNames = [...]string{
	"SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR",
	"LOC_PROT_ERR", "WR_FLUSH_ERR", "MW_BIND_ERR", "BAD_RESP_ERR",
	"LOC_ACCESS_ERR", "REM_INV_REQ_ERR", "REM_ACCESS_ERR", "REM_OP_ERR",
	"RETRY_EXC_ERR", "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR",
	"REM_INV_RD_REQ_ERR", "REM_ABORT_ERR", "INV_EECN_ERR",
	"INV_EEC_STATE_ERR", "FATAL_ERR", "RESP_TIMEOUT_ERR", "GENERAL_ERR",
}

func (s WCStatus) String() string {
	if int(s) < len(wcStatusNames) {
		return wcStatusNames[s]
	}
	return "WC_STATUS_" + strconv.FormatUint(uint64(s), 10)
}

// Completion flags (CQE.WCFlags, CQE byte 36; enum pvrdma_wc_flags).
const (
	WCFlagGRH                = 0x1
	WCFlagWithImm            = 0x2
	WCFlagWithInvalidate     = 0x4
	WCFlagIPCsumOK           = 0x8
	WCFlagWithSMAC           = 0x10
	WCFlagWithVLAN           = 0x20
	WCFlagWithNetworkHdrType = 0x40
)

// Network header types (CQE.NetworkHdrType, CQE byte 57).
const (
	NetworkHdrIB   = 0 // InfiniBand or RoCE v1
	NetworkHdrIPv4 = 1
	NetworkHdrIPv6 = 2
)

// QEMU 7.2's own vendor error codes, reported in CQE.VendorErr with status
// WCGeneralErr (facts sheet §11 item 19).
const (
	VendorErrPostFailed     = 0x201 // backend post or AH creation failed
	VendorErrNoCompContext  = 0x203 // out of completion contexts
	VendorErrQP0            = 0x204 // QP0 used
	VendorErrBadNumSGE      = 0x205 // bad num_sge (the QEMU hang of item 6)
	VendorErrMADSend        = 0x206 // MAD send failed
	VendorErrInvalidLKey    = 0x207 // invalid lkey (legacy builds; OR'ed with the lkey)
	VendorErrMADBufTooSmall = 0x209 // MAD buffer too small
	VendorErrGIDIndex       = 0x210 // GID index unresolvable (the QEMU hang of item 6)
)
