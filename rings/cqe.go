package rings

import "encoding/binary"

// CQE layout: byte offsets in pvrdma_cqe.
const (
	cqWRID         = 0
	cqQP           = 8
	cqOpcode       = 16
	cqStatus       = 20
	cqByteLen      = 24
	cqImm          = 28 // big-endian
	cqSrcQP        = 32
	cqWCFlags      = 36
	cqVendorErr    = 40
	cqPKeyIndex    = 44
	cqSLID         = 46
	cqSL           = 48
	cqDLIDPathBits = 49
	cqPortNum      = 50
	cqSMAC         = 51
	cqNetHdrType   = 57
	// 58..63 reserved
)

// CQE is a decoded completion (pvrdma_cqe). QEMU 7.2 fills WRID, QP,
// Opcode, Status, ByteLen, SrcQP, WCFlags and VendorErr; the rest read 0.
type CQE struct {
	WRID uint64
	// QP is the QP handle: below interface version 20 it is the QPN; from
	// 20 on, a handle distinct from the QPN (small: Linux and rdma-core
	// look QPs up by its low 16 bits). No source defines the upper 32 bits.
	QP        uint64
	Opcode    uint32 // a WC* opcode; WCOpcode(Opcode) prints it
	Status    uint32 // a WC* status; WCStatus(Status) prints it
	ByteLen   uint32 // for UD receives, includes the 40-byte GRH area
	Imm       uint32 // immediate data as a number (stored big-endian)
	SrcQP     uint32
	WCFlags   uint32 // WCFlag* bits
	VendorErr uint32 // with WCGeneralErr, a QEMU VendorErr* code
	PKeyIndex uint16
	SLID      uint16
	SL        uint8
	// DLIDPathBits, PortNum, SMAC and NetworkHdrType are never filled by
	// QEMU 7.2.
	DLIDPathBits   uint8
	PortNum        uint8
	SMAC           [6]byte
	NetworkHdrType uint8
}

// DecodeCQE reads the 64-byte CQE at the start of slot into c. Every bit
// pattern decodes (the fields are plain numbers; callers judge them). slot
// must hold CQESize bytes (DecodeCQE panics otherwise). It does not
// allocate.
func DecodeCQE(slot []byte, c *CQE) {
	b := slot[:CQESize:CQESize]
	DecodeCQEWork(b, c)
	c.PKeyIndex = le.Uint16(b[cqPKeyIndex:])
	c.SLID = le.Uint16(b[cqSLID:])
	c.SL = b[cqSL]
	c.DLIDPathBits = b[cqDLIDPathBits]
	c.PortNum = b[cqPortNum]
	copy(c.SMAC[:], b[cqSMAC:cqSMAC+6])
	c.NetworkHdrType = b[cqNetHdrType]
}

// DecodeCQEWork reads the fields of the 64-byte CQE at the start of slot
// that a work completion reports (WRID, QP, Opcode, Status, ByteLen, Imm,
// SrcQP, WCFlags, VendorErr) into c, and leaves c's others as they were:
// the poll path's decoder. It does not allocate.
func DecodeCQEWork(slot []byte, c *CQE) {
	b := slot[:CQESize:CQESize]
	c.WRID = le.Uint64(b[cqWRID:])
	c.QP = le.Uint64(b[cqQP:])
	c.Opcode = le.Uint32(b[cqOpcode:])
	c.Status = le.Uint32(b[cqStatus:])
	c.ByteLen = le.Uint32(b[cqByteLen:])
	c.Imm = binary.BigEndian.Uint32(b[cqImm:])
	c.SrcQP = le.Uint32(b[cqSrcQP:])
	c.WCFlags = le.Uint32(b[cqWCFlags:])
	c.VendorErr = le.Uint32(b[cqVendorErr:])
}

// PutCQE writes c as a 64-byte CQE at the start of slot, reserved bytes
// zeroed, the way the device does; it is for device models and tests. It
// does not allocate.
func PutCQE(slot []byte, c *CQE) {
	b := slot[:CQESize:CQESize]
	le.PutUint64(b[cqWRID:], c.WRID)
	le.PutUint64(b[cqQP:], c.QP)
	le.PutUint32(b[cqOpcode:], c.Opcode)
	le.PutUint32(b[cqStatus:], c.Status)
	le.PutUint32(b[cqByteLen:], c.ByteLen)
	binary.BigEndian.PutUint32(b[cqImm:], c.Imm)
	le.PutUint32(b[cqSrcQP:], c.SrcQP)
	le.PutUint32(b[cqWCFlags:], c.WCFlags)
	le.PutUint32(b[cqVendorErr:], c.VendorErr)
	le.PutUint16(b[cqPKeyIndex:], c.PKeyIndex)
	le.PutUint16(b[cqSLID:], c.SLID)
	b[cqSL] = c.SL
	b[cqDLIDPathBits] = c.DLIDPathBits
	b[cqPortNum] = c.PortNum
	copy(b[cqSMAC:cqSMAC+6], c.SMAC[:])
	b[cqNetHdrType] = c.NetworkHdrType
	clear(b[cqNetHdrType+1:])
}
