//go:build !guest

package am

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// wirePacket builds a packet of header h and a zero body of n bytes.
func wirePacket(h header, n int) []byte {
	b := make([]byte, headerSize+n)
	h.put(b)
	return b
}

// An eager packet holds exactly its message: data past the declared
// length is refused as surely as data short of it.
func TestEagerPacketWithMoreDataThanItsLengthIsRefused(t *testing.T) {
	var h header
	require.NoError(t, h.parse(wirePacket(header{kind: kindEager, uhdrLen: 8, length: 10}, 18), 1<<20, anyUHdr), "exactly its length")
	assert.ErrorIs(t, h.parse(wirePacket(header{kind: kindEager, uhdrLen: 8, length: 10}, 19), 1<<20, anyUHdr), errProtocol, "one byte more")
	assert.ErrorIs(t, h.parse(wirePacket(header{kind: kindEager, uhdrLen: 8, length: 10}, 17), 1<<20, anyUHdr), errProtocol, "one byte less")
}

// A control packet's body is exactly its acknowledgements, four bytes
// each: a body shorter than the count says is refused, as is a longer one.
func TestControlPacketBodyNotExactlyItsAckCountIsRefused(t *testing.T) {
	var h header
	require.NoError(t, h.parse(wirePacket(header{kind: kindCtrl, length: 3}, 12), 1<<20, anyUHdr))
	assert.ErrorIs(t, h.parse(wirePacket(header{kind: kindCtrl, length: 3}, 8), 1<<20, anyUHdr), errProtocol, "shorter than its acks")
	assert.ErrorIs(t, h.parse(wirePacket(header{kind: kindCtrl, length: 3}, 16), 1<<20, anyUHdr), errProtocol, "longer than its acks")
	assert.ErrorIs(t, h.parse(wirePacket(header{kind: kindCtrl, length: 3}, 13), 1<<20, anyUHdr), errProtocol, "not a whole number of acks")
}

// The maximum message size is inclusive: a message of exactly MaxMessage
// bytes is taken, parsed and delivered; one byte more is refused inline
// (ErrDataLen) and by the receiver's parser (a protocol error).
func TestMessageOfExactlyMaxMessageBytesIsDelivered(t *testing.T) {
	const max = 64 << 10
	var h header
	require.NoError(t, h.parse(wirePacket(header{kind: kindFirst, length: max}, 100), max, anyUHdr), "first packet")
	require.NoError(t, h.parse(wirePacket(header{kind: kindFrag, length: max, offset: max - 100}, 100), max, anyUHdr), "last fragment")
	assert.ErrorIs(t, h.parse(wirePacket(header{kind: kindFirst, length: max + 1}, 100), max, anyUHdr), errProtocol)
	assert.ErrorIs(t, h.parse(wirePacket(header{kind: kindFrag, length: max + 1, offset: max - 100}, 100), max, anyUHdr), errProtocol)
	assert.ErrorIs(t, h.parse(wirePacket(header{kind: kindEager, length: 257}, 257), 256, anyUHdr), errProtocol, "eager over the maximum")
	require.NoError(t, h.parse(wirePacket(header{kind: kindEager, length: 256}, 256), 256, anyUHdr), "eager at the maximum")

	d := openDevice(t)
	cs := newJob(t, d, 2, Config{MaxMessage: max})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got := make(chan []byte, 1)
	for _, c := range cs { // the same index on every task
		require.NoError(t, c.SetHandler(1, func(a *Arrival) Return {
			buf := make([]byte, a.Len)
			return Return{Buf: buf, Completion: func() { got <- buf }}
		}))
	}
	data := pattern(0, 1, 0, max)
	cmpl := NewCounter()
	require.NoError(t, cs[0].Amsend(1, 1, nil, data, Counters{Cmpl: cmpl}))
	_, err := cmpl.Wait(ctx, 1)
	require.NoError(t, err)
	assert.Equal(t, data, <-got)
	assert.ErrorIs(t, cs[0].Amsend(1, 1, nil, make([]byte, max+1), Counters{}), ErrDataLen)
}

// A message's first packet carries up to two acknowledgements in its
// offset field, as many as its flags say and no more: a third, or bytes
// in the part the flags leave unused, are refused; a control packet
// carries none there.
func TestAcksRideInAFirstPacketOnlyAsItsFlagsSay(t *testing.T) {
	var h header
	for k := range maxRideAcks + 1 {
		off := uint64(0)
		for i := range k {
			off |= uint64(7+i) << (32 * i)
		}
		require.NoError(t, h.parse(wirePacket(header{kind: kindEager, flags: uint8(k * flagAcksOne), offset: off, length: 4}, 4), 1<<20, anyUHdr), "%d acks", k)
		assert.Equal(t, k, h.rideAcks())
		require.NoError(t, h.parse(wirePacket(header{kind: kindFirst, flags: uint8(k * flagAcksOne), offset: off, length: 8}, 4), 1<<20, anyUHdr), "%d acks, first", k)
	}
	assert.ErrorIs(t, h.parse(wirePacket(header{kind: kindEager, flags: 3 * flagAcksOne, length: 4}, 4), 1<<20, anyUHdr), errProtocol, "three acks")
	assert.ErrorIs(t, h.parse(wirePacket(header{kind: kindEager, offset: 7, length: 4}, 4), 1<<20, anyUHdr), errProtocol, "an ack the flags do not count")
	assert.ErrorIs(t, h.parse(wirePacket(header{kind: kindEager, flags: flagAcksOne, offset: 7 | 8<<32, length: 4}, 4), 1<<20, anyUHdr), errProtocol, "a second ack the flags do not count")
	assert.ErrorIs(t, h.parse(wirePacket(header{kind: kindCtrl, offset: 7}, 0), 1<<20, anyUHdr), errProtocol, "a control packet with an ack in its offset")
	assert.ErrorIs(t, h.parse(wirePacket(header{kind: kindFrag, flags: flagAcksOne, offset: 0, length: 8}, 4), 1<<20, anyUHdr), errProtocol, "a fragment with flags")
	require.NoError(t, h.parse(wirePacket(header{kind: kindEager, flags: flagAckSoon, length: 4}, 4), 1<<20, anyUHdr), "an acknowledgement asked for soon")
}

// The header's fields sit where wire.go's table says, little endian: the
// named offsets are those bytes, and the acknowledgements riding on a
// message's first packet are in its offset field, at byte 24.
func TestHeaderFieldsSitAtTheirWireOffsets(t *testing.T) {
	h := header{kind: kindEager, flags: flagTgtCounter, handler: 0x0201, uhdrLen: 0x0403, tgtCntr: 0x0605,
		credits: 0x0a090807, id: 0x0e0d0c0b, length: 0x161514131211100f, offset: 0x1e1d1c1b1a191817}
	b := make([]byte, headerSize)
	h.put(b)
	le := binary.LittleEndian
	for _, f := range []struct {
		name      string
		off, want int // the named offset, and the table's
		got, put  uint64
	}{
		{"kind", offKind, 0, uint64(b[0]), uint64(h.kind)},
		{"flags", offFlags, 1, uint64(b[1]), uint64(h.flags)},
		{"handler", offHandler, 2, uint64(le.Uint16(b[2:])), uint64(h.handler)},
		{"user header length", offUHdrLen, 4, uint64(le.Uint16(b[4:])), uint64(h.uhdrLen)},
		{"target counter", offTgtCntr, 6, uint64(le.Uint16(b[6:])), uint64(h.tgtCntr)},
		{"credits", offCredits, 8, uint64(le.Uint32(b[8:])), uint64(h.credits)},
		{"id", offID, 12, uint64(le.Uint32(b[12:])), uint64(h.id)},
		{"length", offLength, 16, le.Uint64(b[16:]), h.length},
		{"offset", offOffset, 24, le.Uint64(b[24:]), h.offset},
		{"riding acks", offRideAcks, 24, le.Uint64(b[24:]), h.offset},
	} {
		assert.Equal(t, f.want, f.off, f.name)
		assert.Equal(t, f.put, f.got, f.name)
	}
	assert.Equal(t, 4, ackSize)
}

// Acknowledgements put on a message's first packet (setRideAcks) are
// read back at the receiver (rideAckBytes) as the ids they were, in
// order, as many as the flags count: none, one, and the most, two.
func TestRidingAcksAreReadAsTheyWerePut(t *testing.T) {
	for k := range maxRideAcks + 1 {
		ids := []uint32{0x11223344, 0x55667788 | ackFailed}[:k]
		h := header{kind: kindEager, length: 4}
		h.setRideAcks(ids)
		b := wirePacket(h, 4)
		var got header
		require.NoError(t, got.parse(b, 1<<20, anyUHdr), "%d acks", k)
		require.Equal(t, k, got.rideAcks())
		acks := rideAckBytes(b, k)
		require.Len(t, acks, ackSize*k)
		for i, id := range ids {
			assert.Equal(t, id, binary.LittleEndian.Uint32(acks[ackSize*i:]), "ack %d of %d", i, k)
		}
	}
}

// A task's address is its GID, its first PSN, then a QPN per task: 20
// bytes and four per task, task t's QPN at 20+4t.
func TestAnAddressIsTheGIDThePSNThenAQPNPerTask(t *testing.T) {
	assert.Equal(t, 20, addressLen(0))
	assert.Equal(t, 20+4*3, addressLen(3))
	b := make([]byte, addressLen(3))
	for i := range b {
		b[i] = byte(i)
	}
	assert.Equal(t, binary.LittleEndian.Uint32(b[16:]), addressPSN(b))
	assert.Equal(t, binary.LittleEndian.Uint32(b[20:]), addressQPN(b, 0))
	assert.Equal(t, binary.LittleEndian.Uint32(b[28:]), addressQPN(b, 2))
}
