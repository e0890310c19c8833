package rings

import (
	"encoding/binary"
	"fmt"
	"math/bits"
)

var le = binary.LittleEndian

// Element sizes (vmw_pvrdma ABI header).
const (
	SendHeaderSize = 80 // pvrdma_sq_wqe_hdr; SGEs follow at byte 80
	RecvHeaderSize = 16 // pvrdma_rq_wqe_hdr; SGEs follow at byte 16
	SGESize        = 16 // pvrdma_sge
	CQESize        = 64 // pvrdma_cqe
)

// MaxSGE is the SGE limit of QEMU 7.2 (caps.max_sge) for send, receive and
// SRQ WQEs. A WQE with more makes QEMU spin forever on it (facts sheet §11
// item 6), so posting code must enforce it; the codecs do not.
const MaxSGE = 4

// Send WQE layout: byte offsets in pvrdma_sq_wqe_hdr.
const (
	sqWRID      = 0
	sqNumSGE    = 8
	sqTotalLen  = 12
	sqOpcode    = 16
	sqFlags     = 20
	sqImm       = 24 // imm_data (big-endian) or invalidate_rkey
	udRemoteQPN = 32 // the per-operation union (48 bytes) starts here
	udQKey      = 36
	rdmaAddr    = 32 // wr.rdma: RDMA read and write
	rdmaRKey    = 40
	atomAddr    = 32 // wr.atomic: compare-and-swap, fetch-and-add
	atomCmpAdd  = 40
	atomSwap    = 48
	atomRKey    = 56
	avPortPD    = 40 // the UD address vector starts here
	avSLTCFlow  = 44
	avDGID      = 48
	avPathBits  = 64
	avGIDIndex  = 65 // read by QEMU for every QP type
	avStatRate  = 66
	avHopLimit  = 67
	avDMAC      = 68
)

// Receive WQE layout: byte offsets in pvrdma_rq_wqe_hdr.
const (
	rqWRID     = 0
	rqNumSGE   = 8
	rqTotalLen = 12
)

// SendStride returns the send-queue element size for a QP created with
// maxSGE send SGEs: the smallest power of two ≥ 80 + 16·maxSGE, as QEMU
// computes it (1…4 SGEs → 128, 128, 128, 256). Use the max_send_sge value of
// the CREATE_QP command. A negative maxSGE counts as 0.
func SendStride(maxSGE int) int { return pow2ceil(SendHeaderSize + SGESize*max(maxSGE, 0)) }

// RecvStride returns the receive-queue (and SRQ) element size for maxSGE
// receive SGEs: the smallest power of two ≥ 16 + 16·maxSGE (1…4 SGEs → 32,
// 64, 64, 128). A negative maxSGE counts as 0.
func RecvStride(maxSGE int) int { return pow2ceil(RecvHeaderSize + SGESize*max(maxSGE, 0)) }

func pow2ceil(x int) int { return 1 << bits.Len(uint(x-1)) }

// SGE is one scatter/gather entry (pvrdma_sge, the same layout as
// libibverbs' ibv_sge). QEMU hands it to the backend unchanged: Addr is an
// address in the memory region's own address space and LKey the key
// CREATE_MR returned.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// UDAddr is the datagram part of a UD send WQE: the destination QP and qkey
// and the address vector (pvrdma_av). QEMU 7.2 uses only RemoteQPN,
// RemoteQKey, DGID and GIDIndex; the other fields are written for
// completeness, following the Linux driver's encoding.
type UDAddr struct {
	RemoteQPN  uint32
	RemoteQKey uint32 // used verbatim by QEMU (no "top bit means the QP's qkey")
	// PortPD is the AV's port_pd word: PD handle | port << 24 (see PortPD).
	PortPD       uint32
	DGID         [16]byte
	GIDIndex     uint8 // source GID index; see SendWQE.GIDIndex
	HopLimit     uint8
	TrafficClass uint8
	// SL and FlowLabel share the sl_tclass_flowlabel word with
	// TrafficClass: traffic class in bits 27:20 and flow label in 19:0, as
	// Linux writes them; this package puts SL in bits 31:28 (the header
	// names the field but not its split; Linux leaves those bits zero and
	// QEMU ignores the word).
	SL        uint8
	FlowLabel uint32
	// Additions to the AV fields the device header has and QEMU ignores.
	SrcPathBits uint8 // Linux sets path bits | 0x80
	StatRate    uint8
	DMAC        [6]byte
}

// PortPD builds the AV's port_pd word from a PD handle and a port number.
func PortPD(pd uint32, port uint8) uint32 { return pd&0x00FFFFFF | uint32(port)<<24 }

// SendWQE is a send work request as the codec writes it.
type SendWQE struct {
	WRID   uint64
	Opcode uint32 // a WR* constant; ignored by QEMU 7.2
	Flags  uint32 // Send* flags; ignored by QEMU 7.2
	// Imm is the immediate data as a number; the device header declares
	// imm_data big-endian (network order), so it is stored that way. For
	// WRSendWithInv, WRRDMAReadWithInv and WRLocalInv the same word is
	// invalidate_rkey, stored little-endian.
	Imm  uint32
	SGEs []SGE
	// UD is the datagram address; nil for RC.
	UD *UDAddr
	// RemoteAddr and RKey name the peer's memory of an RC one-sided
	// operation: the wr.rdma union for WRRDMAWrite, WRRDMAWriteWithImm,
	// WRRDMARead and WRRDMAReadWithInv, the wr.atomic union for
	// WRAtomicCmpAndSwp and WRAtomicFetchAndAdd. Other opcodes, and UD
	// WQEs, do not carry them.
	RemoteAddr uint64
	RKey       uint32
	// CompareAdd is an atomic's compare_add: the value compared by a
	// compare-and-swap, the addend of a fetch-and-add. Swap is the value a
	// compare-and-swap writes (zero for fetch-and-add, as Linux leaves it).
	CompareAdd uint64
	Swap       uint64
	// GIDIndex is the source GID index. QEMU reads byte 65 (the AV's
	// gid_index) for every QP type and spins forever on a WQE whose index
	// does not resolve, so it is written for RC too. For UD, UD.GIDIndex
	// takes precedence when it is non-zero.
	GIDIndex uint8
}

func immIsRKey(op uint32) bool {
	return op == WRSendWithInv || op == WRRDMAReadWithInv || op == WRLocalInv
}

// union says which member of the WQE's per-operation union an RC opcode
// uses.
func union(op uint32) uint8 {
	switch op {
	case WRRDMAWrite, WRRDMAWriteWithImm, WRRDMARead, WRRDMAReadWithInv:
		return unionRDMA
	case WRAtomicCmpAndSwp, WRAtomicFetchAndAdd:
		return unionAtomic
	}
	return unionNone
}

const (
	unionNone = iota
	unionRDMA
	unionAtomic
)

// PutSendWQE writes w into slot, the start of a send-queue element: it
// zeroes the 80-byte header (and so the union), writes the header, the UD
// union when w.UD is set (else the rdma or atomic union its opcode uses),
// the GID index at byte 65, and the SGEs from byte 80 on, with num_sge = len(w.SGEs) and total_len = the sum of their
// lengths. Bytes past the last SGE are left alone. It does not allocate.
//
// slot must hold SendHeaderSize + SGESize·len(w.SGEs) bytes (PutSendWQE
// panics otherwise); the caller keeps len(w.SGEs) within the QP's max SGE.
func PutSendWQE(slot []byte, w *SendWQE) {
	end := SendHeaderSize + SGESize*len(w.SGEs)
	b := slot[:end:end]
	clear(b[:SendHeaderSize])
	le.PutUint64(b[sqWRID:], w.WRID)
	le.PutUint32(b[sqNumSGE:], uint32(len(w.SGEs)))
	le.PutUint32(b[sqOpcode:], w.Opcode)
	le.PutUint32(b[sqFlags:], w.Flags)
	if immIsRKey(w.Opcode) {
		le.PutUint32(b[sqImm:], w.Imm)
	} else {
		binary.BigEndian.PutUint32(b[sqImm:], w.Imm)
	}
	gid := w.GIDIndex
	if ud := w.UD; ud != nil {
		le.PutUint32(b[udRemoteQPN:], ud.RemoteQPN)
		le.PutUint32(b[udQKey:], ud.RemoteQKey)
		le.PutUint32(b[avPortPD:], ud.PortPD)
		le.PutUint32(b[avSLTCFlow:], uint32(ud.SL&0xF)<<28|uint32(ud.TrafficClass)<<20|ud.FlowLabel&0xFFFFF)
		copy(b[avDGID:avDGID+16], ud.DGID[:])
		b[avPathBits] = ud.SrcPathBits
		b[avStatRate] = ud.StatRate
		b[avHopLimit] = ud.HopLimit
		copy(b[avDMAC:avDMAC+6], ud.DMAC[:])
		if ud.GIDIndex != 0 {
			gid = ud.GIDIndex
		}
	} else if u := union(w.Opcode); u != unionNone {
		putRemote(b, w, u)
	}
	b[avGIDIndex] = gid
	le.PutUint32(b[sqTotalLen:], putSGEs(b[SendHeaderSize:], w.SGEs))
}

// putRemote writes the rdma or atomic union of an RC WQE (bytes 32..63:
// below the gid_index byte that PutSendWQE writes for QEMU).
func putRemote(b []byte, w *SendWQE, u uint8) {
	if u == unionRDMA {
		le.PutUint64(b[rdmaAddr:], w.RemoteAddr)
		le.PutUint32(b[rdmaRKey:], w.RKey)
		return
	}
	le.PutUint64(b[atomAddr:], w.RemoteAddr)
	le.PutUint64(b[atomCmpAdd:], w.CompareAdd)
	le.PutUint64(b[atomSwap:], w.Swap)
	le.PutUint32(b[atomRKey:], w.RKey)
}

// putSGEs writes sges at the start of b and returns the sum of their
// lengths (modulo 2^32).
func putSGEs(b []byte, sges []SGE) uint32 {
	var total uint32
	for i := range sges {
		s := &sges[i]
		e := b[i*SGESize : i*SGESize+SGESize]
		le.PutUint64(e[0:], s.Addr)
		le.PutUint32(e[8:], s.Length)
		le.PutUint32(e[12:], s.LKey)
		total += s.Length
	}
	return total
}

// PutRecvWQE writes a receive (or SRQ) WQE into slot: the 16-byte header
// (wr_id, num_sge = len(sges), total_len = the sum of the lengths) and the
// SGEs from byte 16 on. slot must hold RecvHeaderSize + SGESize·len(sges)
// bytes (PutRecvWQE panics otherwise). It does not allocate.
func PutRecvWQE(slot []byte, wrID uint64, sges []SGE) {
	end := RecvHeaderSize + SGESize*len(sges)
	b := slot[:end:end]
	le.PutUint64(b[rqWRID:], wrID)
	le.PutUint32(b[rqNumSGE:], uint32(len(sges)))
	le.PutUint32(b[rqTotalLen:], putSGEs(b[RecvHeaderSize:], sges))
}

// WQEError reports a WQE that a device model cannot read: a num_sge that
// does not fit the slot or the caller's SGE buffer. It wraps ErrInvalid.
type WQEError struct {
	NumSGE uint32 // num_sge as written
	Room   int    // SGEs that fit
}

func (e *WQEError) Error() string {
	return fmt.Sprintf("rings: WQE num_sge %d exceeds the %d SGEs that fit: %v", e.NumSGE, e.Room, ErrInvalid)
}

// Unwrap returns ErrInvalid.
func (e *WQEError) Unwrap() error { return ErrInvalid }

// DecodeSendWQE reads the send WQE at the start of slot into w, the way a
// device does; it is for device models and tests. The SGEs go into
// w.SGEs[:num_sge], reusing its capacity; if w.UD is non-nil the UD union is
// decoded into it (the caller knows the QP type; the WQE does not say),
// otherwise the rdma or atomic union the opcode uses (RemoteAddr, RKey,
// CompareAdd, Swap; zero for the opcodes that use neither).
// w.GIDIndex is byte 65. Imm follows the rule PutSendWQE uses, keyed on the
// decoded opcode. A num_sge larger than cap(w.SGEs) or than the slot holds
// is a *WQEError and leaves w.SGEs empty. It does not allocate.
func DecodeSendWQE(slot []byte, w *SendWQE) error {
	b := slot[:SendHeaderSize:SendHeaderSize]
	w.WRID = le.Uint64(b[sqWRID:])
	w.Opcode = le.Uint32(b[sqOpcode:])
	w.Flags = le.Uint32(b[sqFlags:])
	if immIsRKey(w.Opcode) {
		w.Imm = le.Uint32(b[sqImm:])
	} else {
		w.Imm = binary.BigEndian.Uint32(b[sqImm:])
	}
	w.GIDIndex = b[avGIDIndex]
	if ud := w.UD; ud != nil {
		ud.RemoteQPN = le.Uint32(b[udRemoteQPN:])
		ud.RemoteQKey = le.Uint32(b[udQKey:])
		ud.PortPD = le.Uint32(b[avPortPD:])
		f := le.Uint32(b[avSLTCFlow:])
		ud.SL, ud.TrafficClass, ud.FlowLabel = uint8(f>>28), uint8(f>>20), f&0xFFFFF
		copy(ud.DGID[:], b[avDGID:avDGID+16])
		ud.SrcPathBits = b[avPathBits]
		ud.GIDIndex = b[avGIDIndex]
		ud.StatRate = b[avStatRate]
		ud.HopLimit = b[avHopLimit]
		copy(ud.DMAC[:], b[avDMAC:avDMAC+6])
	}
	w.RemoteAddr, w.RKey, w.CompareAdd, w.Swap = 0, 0, 0, 0
	if w.UD == nil {
		switch union(w.Opcode) {
		case unionRDMA:
			w.RemoteAddr, w.RKey = le.Uint64(b[rdmaAddr:]), le.Uint32(b[rdmaRKey:])
		case unionAtomic:
			w.RemoteAddr, w.RKey = le.Uint64(b[atomAddr:]), le.Uint32(b[atomRKey:])
			w.CompareAdd, w.Swap = le.Uint64(b[atomCmpAdd:]), le.Uint64(b[atomSwap:])
		}
	}
	var err error
	w.SGEs, err = decodeSGEs(slot[SendHeaderSize:], le.Uint32(b[sqNumSGE:]), w.SGEs[:0])
	return err
}

// DecodeRecvWQE reads the receive WQE at the start of slot, the way a device
// does; it is for device models and tests. The SGEs go into sges[:n]. A
// num_sge larger than len(sges) or than the slot holds is a *WQEError with
// n = 0. It does not allocate.
func DecodeRecvWQE(slot []byte, sges []SGE) (wrID uint64, n int, err error) {
	b := slot[:RecvHeaderSize:RecvHeaderSize]
	out, err := decodeSGEs(slot[RecvHeaderSize:], le.Uint32(b[rqNumSGE:]), sges[:0:len(sges)])
	return le.Uint64(b[rqWRID:]), len(out), err
}

func decodeSGEs(b []byte, num uint32, dst []SGE) ([]SGE, error) {
	room := min(cap(dst), len(b)/SGESize)
	if uint64(num) > uint64(room) {
		return dst[:0], &WQEError{NumSGE: num, Room: room}
	}
	dst = dst[:num]
	for i := range dst {
		e := b[i*SGESize : i*SGESize+SGESize]
		dst[i] = SGE{Addr: le.Uint64(e[0:]), Length: le.Uint32(e[8:]), LKey: le.Uint32(e[12:])}
	}
	return dst, nil
}
