package am

import (
	"encoding/binary"
	"fmt"

	"github.com/vfrdma/vfrdma"
)

// Packet kinds.
const (
	kindEager = 1 // a whole message: header, user header, data
	kindFirst = 2 // the first packet of a message in fragments
	kindFrag  = 3 // a later fragment
	kindCtrl  = 4 // credits and acknowledgements only
)

// Header flags (eager and first packets).
const (
	flagTgtCounter = 1 << 0 // tgtCntr names a counter at the target
	// flagAcks (two bits): how many acknowledgements, 0 to 2, ride in the
	// offset field, which a message's first packet does not use.
	flagAcks     = 3 << 1
	flagAcksOne  = 1 << 1
	flagAckSoon  = 1 << 3 // the origin waits for this message's acknowledgement (a Cmpl counter)
	flagsMessage = flagTgtCounter | flagAcks | flagAckSoon
	maxRideAcks  = 2 // acknowledgements a first packet carries
)

// Ack entries: a u32 each (ackSize bytes), the message id, with ackFailed
// set when the target dropped the message (no handler, no buffer, a
// buffer too short).
const (
	ackSize   = 4
	ackFailed = 1 << 31
)

// headerSize is the fixed packet header:
//
//	0  u8  kind
//	1  u8  flags
//	2  u16 handler index (eager, first)
//	4  u16 user header length (eager, first)
//	6  u16 target counter index (eager, first, with flagTgtCounter)
//	8  u32 credits returned to the receiver of this packet
//	12 u32 message id (eager, first, frag)
//	16 u64 message length (eager, first, frag); ctrl: number of acks
//	24 u64 offset of this packet's data in the message (frag); eager and
//	       first: up to two acknowledgements, a u32 each, as the flags
//	       say (the unused rest 0); ctrl: 0
//
// Then, for eager and first, the user header, then the data; for frag, the
// data; for ctrl, the acks, a u32 each. Little endian throughout.
const headerSize = 32

// Header field offsets, as the table above lays them out.
const (
	offKind    = 0
	offFlags   = 1
	offHandler = 2
	offUHdrLen = 4
	offTgtCntr = 6
	offCredits = 8
	offID      = 12
	offLength  = 16
	offOffset  = 24
	// offRideAcks is where the acknowledgements riding on an eager or
	// first packet are: its offset field, ackSize bytes each, the first
	// at the lowest bytes.
	offRideAcks = offOffset
)

type header struct {
	kind    uint8
	flags   uint8
	handler uint16
	uhdrLen uint16
	tgtCntr uint16
	credits uint32
	id      uint32
	length  uint64
	offset  uint64
}

func (h *header) put(b []byte) {
	_ = b[headerSize-1]
	b[offKind] = h.kind
	b[offFlags] = h.flags
	binary.LittleEndian.PutUint16(b[offHandler:], h.handler)
	binary.LittleEndian.PutUint16(b[offUHdrLen:], h.uhdrLen)
	binary.LittleEndian.PutUint16(b[offTgtCntr:], h.tgtCntr)
	binary.LittleEndian.PutUint32(b[offCredits:], h.credits)
	binary.LittleEndian.PutUint32(b[offID:], h.id)
	binary.LittleEndian.PutUint64(b[offLength:], h.length)
	binary.LittleEndian.PutUint64(b[offOffset:], h.offset)
}

// parse decodes and checks a received packet on its own: the peer is
// another process, and a packet that does not hold together is refused
// rather than trusted. What a packet must agree with (the message being
// reassembled, the credits outstanding, the next message id) the receiver
// checks against its state: see Context.check. maxMessage and maxUHdr
// are the receiver's Config.MaxMessage and Config.MaxUHdr: a peer that
// fits more in its packets than this task takes is refused, as Amsend
// refuses it here.
func (h *header) parse(b []byte, maxMessage, maxUHdr int) error {
	if len(b) < headerSize {
		return fmt.Errorf("%w: a %d-byte packet, shorter than its header", errProtocol, len(b))
	}
	h.kind = b[offKind]
	h.flags = b[offFlags]
	h.handler = binary.LittleEndian.Uint16(b[offHandler:])
	h.uhdrLen = binary.LittleEndian.Uint16(b[offUHdrLen:])
	h.tgtCntr = binary.LittleEndian.Uint16(b[offTgtCntr:])
	h.credits = binary.LittleEndian.Uint32(b[offCredits:])
	h.id = binary.LittleEndian.Uint32(b[offID:])
	h.length = binary.LittleEndian.Uint64(b[offLength:])
	h.offset = binary.LittleEndian.Uint64(b[offOffset:])
	body := uint64(len(b) - headerSize)
	if h.kind == kindCtrl && h.offset != 0 {
		return fmt.Errorf("%w: kind %d packet with offset %d", errProtocol, h.kind, h.offset)
	}
	if h.kind != kindEager && h.kind != kindFirst && (h.flags != 0 || h.handler != 0 || h.uhdrLen != 0 || h.tgtCntr != 0) {
		return fmt.Errorf("%w: kind %d packet with first-packet fields (flags %#x, handler %d, user header %d, counter %d)", errProtocol, h.kind, h.flags, h.handler, h.uhdrLen, h.tgtCntr)
	}
	switch h.kind {
	case kindEager, kindFirst:
		if h.flags&^flagsMessage != 0 || h.flags&flagTgtCounter != 0 && (h.tgtCntr == 0 || h.tgtCntr >= MaxCounters) || h.flags&flagTgtCounter == 0 && h.tgtCntr != 0 {
			return fmt.Errorf("%w: flags %#x with target counter %d (1 to %d)", errProtocol, h.flags, h.tgtCntr, MaxCounters-1)
		}
		if n := h.rideAcks(); n > maxRideAcks || h.offset>>(8*ackSize*n) != 0 {
			return fmt.Errorf("%w: %d acknowledgements riding in %#x", errProtocol, n, h.offset)
		}
		if h.uhdrLen%8 != 0 || int(h.uhdrLen) > maxUHdr {
			return fmt.Errorf("%w: a %d-byte user header (a multiple of 8, at most %d)", errProtocol, h.uhdrLen, maxUHdr)
		}
		if uint64(h.uhdrLen) > body {
			return fmt.Errorf("%w: user header of %d bytes in a %d-byte body", errProtocol, h.uhdrLen, body)
		}
		data := body - uint64(h.uhdrLen)
		if h.length > uint64(maxMessage) {
			return fmt.Errorf("%w: message of %d bytes, over the maximum %d", errProtocol, h.length, maxMessage)
		}
		if h.kind == kindEager && data != h.length || h.kind == kindFirst && data >= h.length {
			return fmt.Errorf("%w: kind %d message of %d bytes with %d in its first packet", errProtocol, h.kind, h.length, data)
		}
	case kindFrag:
		// Each term on its own, so that no sum can wrap around: the offset
		// test keeps length-offset from wrapping.
		if body == 0 || h.length > uint64(maxMessage) ||
			h.offset >= h.length ||
			body > h.length-h.offset {
			return fmt.Errorf("%w: fragment of %d bytes at %d of a %d-byte message (maximum %d)", errProtocol, body, h.offset, h.length, maxMessage)
		}
	case kindCtrl:
		if h.length > body/ackSize || h.length*ackSize != body {
			return fmt.Errorf("%w: %d acks in a %d-byte body", errProtocol, h.length, body)
		}
	default:
		return fmt.Errorf("%w: packet kind %d", errProtocol, h.kind)
	}
	return nil
}

// rideAcks is how many acknowledgements an eager or first packet carries
// in its offset field.
func (h *header) rideAcks() int { return int(h.flags&flagAcks) / flagAcksOne }

// setRideAcks puts acks (at most maxRideAcks) in h's offset field, the
// first at its lowest bytes, and their count in its flags.
func (h *header) setRideAcks(acks []uint32) {
	for i, a := range acks {
		h.offset |= uint64(a) << (8 * ackSize * i)
	}
	h.flags |= uint8(len(acks) * flagAcksOne)
}

// rideAckBytes returns the k acknowledgements riding on packet b, an
// eager or first packet that parse took (k is its rideAcks), as acked
// reads them.
func rideAckBytes(b []byte, k int) []byte { return b[offRideAcks : offRideAcks+ackSize*k] }

// A task's address, what it publishes through the Exchanger:
//
//	0        16 bytes: its GID
//	16       u32: the first PSN of every QP it sends on (24 bits, random
//	         per context: a stale packet of an earlier job on a reused
//	         QPN does not fit the sequence)
//	20+4×t   u32: the QPN of its QP to task t; for itself, of the QP its
//	         own requests arrive on
//
// Little endian.
const (
	addrPSN  = len(vfrdma.GID{}) // where the PSN is
	addrQPNs = addrPSN + 4       // where the QPNs begin
	qpnSize  = 4
)

// addressLen is the length of a task's address in a job of tasks tasks.
func addressLen(tasks int) int { return addrQPNs + qpnSize*tasks }

// addressPSN returns the first PSN address b gives (b is addressLen
// long); above 24 bits, the address is not one of ours.
func addressPSN(b []byte) uint32 { return binary.LittleEndian.Uint32(b[addrPSN:]) }

// addressQPN returns the QPN address b gives for task t (b is
// addressLen long).
func addressQPN(b []byte, t int) uint32 { return binary.LittleEndian.Uint32(b[addrQPNs+qpnSize*t:]) }
