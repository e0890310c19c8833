package pvsim

// The work-request and completion formats (facts sheet §6,
// vmw_pvrdma-abi.h). The model decodes and encodes them itself, from the
// header's layout, rather than through the driver's codecs: a mistake in
// those shows up as a disagreement with the model.

const (
	sqHeaderSize = 80 // pvrdma_sq_wqe_hdr
	rqHeaderSize = 16 // pvrdma_rq_wqe_hdr
	sgeSize      = 16 // pvrdma_sge
	cqeSize      = 64 // pvrdma_cqe
)

// WR opcodes (pvrdma_wr_opcode).
const (
	wrRDMAWrite        = 0
	wrRDMAWriteWithImm = 1
	wrSend             = 2
	wrSendWithImm      = 3
	wrRDMARead         = 4
	wrAtomicCmpSwp     = 5
	wrAtomicFetchAdd   = 6
)

// Send flags (pvrdma_send_flags).
const (
	sendFence     = 0x1
	sendSignaled  = 0x2
	sendSolicited = 0x4
)

// Completion opcodes, statuses and flags (pvrdma_wc_*).
const (
	wcSend            = 0
	wcRDMAWrite       = 1
	wcRDMARead        = 2
	wcCompSwap        = 3
	wcFetchAdd        = 4
	wcRecv            = 0x80
	wcRecvRDMAWithImm = 0x81

	wcSuccess        = 0
	wcLocLenErr      = 1
	wcLocQPOpErr     = 2
	wcLocProtErr     = 4
	wcWRFlushErr     = 5
	wcRemInvReqErr   = 9
	wcRemAccessErr   = 10
	wcRemOpErr       = 11
	wcRetryExcErr    = 12
	wcRNRRetryExcErr = 13
	wcGeneralErr     = 21

	wcFlagGRH           = 0x1
	wcFlagWithImm       = 0x2
	wcFlagNetworkHdrTyp = 0x40
)

// QEMU 7.2's vendor error codes (facts sheet §11 item 19).
const (
	vendorPostFailed = 0x201
	vendorBadNumSGE  = 0x205
	vendorMADSend    = 0x206
	vendorGIDIndex   = 0x210
)

type sge struct {
	addr   uint64
	length uint32
	lkey   uint32
}

// sendWQE is a decoded send WQE: the header, the per-operation union read
// every way (the QP type and opcode say which applies) and the SGEs.
type sendWQE struct {
	wrID     uint64
	numSGE   uint32
	opcode   uint32
	flags    uint32
	imm      uint32 // the 4 bytes at 24, as they are (big-endian imm_data or invalidate_rkey)
	raddr    uint64 // rdma and atomic: remote_addr
	rkey     uint32 // rdma.rkey
	cmpAdd   uint64 // atomic.compare_add
	swap     uint64 // atomic.swap
	atomRKey uint32 // atomic.rkey
	// ud
	remoteQPN  uint32
	remoteQKey uint32
	tclassFlow uint32
	dgid       [16]byte
	gidIndex   uint8
	hopLimit   uint8
	sges       []sge
}

// decodeSend reads the send WQE in slot; sges receives up to maxSGE SGEs.
// It reports false if num_sge exceeds maxSGE or the slot (w.numSGE says
// what was written).
func decodeSend(slot []byte, maxSGE uint32, w *sendWQE) bool {
	w.wrID = le.Uint64(slot[0:])
	w.numSGE = le.Uint32(slot[8:])
	w.opcode = le.Uint32(slot[16:])
	w.flags = le.Uint32(slot[20:])
	w.imm = le.Uint32(slot[24:])
	w.raddr = le.Uint64(slot[32:])
	w.rkey = le.Uint32(slot[40:])
	w.cmpAdd = le.Uint64(slot[40:])
	w.swap = le.Uint64(slot[48:])
	w.atomRKey = le.Uint32(slot[56:])
	w.remoteQPN = le.Uint32(slot[32:])
	w.remoteQKey = le.Uint32(slot[36:])
	w.tclassFlow = le.Uint32(slot[44:])
	copy(w.dgid[:], slot[48:64])
	w.gidIndex = slot[65]
	w.hopLimit = slot[67]
	w.sges = w.sges[:0]
	room := uint32(len(slot)-sqHeaderSize) / sgeSize
	if w.numSGE > maxSGE || w.numSGE > room {
		return false
	}
	w.sges = decodeSGEs(slot[sqHeaderSize:], w.numSGE, w.sges)
	return true
}

func decodeSGEs(b []byte, n uint32, out []sge) []sge {
	for i := range n {
		e := b[i*sgeSize:]
		out = append(out, sge{addr: le.Uint64(e[0:]), length: le.Uint32(e[8:]), lkey: le.Uint32(e[12:])})
	}
	return out
}

// decodeRecv reads a receive (or SRQ) WQE; false if num_sge exceeds
// maxSGE or the slot.
func decodeRecv(slot []byte, maxSGE uint32) (recvWQE, uint32, bool) {
	r := recvWQE{wrID: le.Uint64(slot[0:])}
	n := le.Uint32(slot[8:])
	room := uint32(len(slot)-rqHeaderSize) / sgeSize
	if n > maxSGE || n > room {
		return r, n, false
	}
	r.sges = decodeSGEs(slot[rqHeaderSize:], n, make([]sge, 0, n))
	return r, n, true
}

// cqe is a completion as the device writes it.
type cqe struct {
	wrID      uint64
	qp        uint64
	opcode    uint32
	status    uint32
	byteLen   uint32
	imm       uint32 // the 4 bytes of imm_data, as the WQE carried them
	srcQP     uint32
	wcFlags   uint32
	vendorErr uint32
	portNum   uint8
	netHdr    uint8
}

func (c *cqe) put(b []byte) {
	b = b[:cqeSize:cqeSize]
	clear(b)
	le.PutUint64(b[0:], c.wrID)
	le.PutUint64(b[8:], c.qp)
	le.PutUint32(b[16:], c.opcode)
	le.PutUint32(b[20:], c.status)
	le.PutUint32(b[24:], c.byteLen)
	le.PutUint32(b[28:], c.imm)
	le.PutUint32(b[32:], c.srcQP)
	le.PutUint32(b[36:], c.wcFlags)
	le.PutUint32(b[40:], c.vendorErr)
	b[50] = c.portNum
	b[57] = c.netHdr
}
