package pvsim

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fullPacket sets every field a frame carries, each at its largest legal
// value where it has a limit.
func fullPacket() *packet {
	p := &packet{kind: pktNak, ud: false, gidType: 1, srcQPN: 1<<24 - 1, dstQPN: 0x123456, psn: psnMask,
		payload: []byte("payload"), imm: 0xdeadbeef, withImm: true, solicited: true, raddr: 0x7f0012345678,
		rkey: 0xabcdef01, length: 1234, cmp: 1, swap: 2, fetchAdd: true, qkey: 0x11111111, tclass: 3,
		hopLimit: 64, flow: 1<<20 - 1, nak: nakRemOp, rnrTimer: 31, orig: 99, token: 1<<64 - 1}
	p.srcGID[0], p.dstGID[15] = 0xfe, 0x01
	return p
}

// A frame carries every field of a packet, at the limits of each.
func TestAFabricFrameCarriesEveryFieldAtItsLimits(t *testing.T) {
	want := fullPacket()
	got, err := readFrame(bytes.NewReader(encodeFrame(nil, want, want.token)))
	require.NoError(t, err)
	assert.Equal(t, want, got)

	empty := &packet{kind: pktAck}
	got, err = readFrame(bytes.NewReader(encodeFrame(nil, empty, 0)))
	require.NoError(t, err)
	assert.Equal(t, empty, got)
}

// Each field of a peer process's frame past its limit is refused with
// ErrFabricFrame, one past the largest legal value.
func TestAFabricFramePastAFieldsLimitIsRefused(t *testing.T) {
	le := binary.LittleEndian
	for name, spoil := range map[string]func(f []byte){
		"length below the header": func(f []byte) { le.PutUint32(f, frameHeader-1) },
		"length past the largest": func(f []byte) { le.PutUint32(f, uint32(maxFrame+1)) },
		"kind":                    func(f []byte) { f[4] = byte(pktHandled) + 1 },
		"notice with no token": func(f []byte) {
			f[4], f[7] = byte(pktHandled), 0
			clear(f[4+104 : 4+112])
		},
		"flags":            func(f []byte) { f[5] |= 0x10 },
		"NAK kind":         func(f []byte) { f[7] = byte(nakRemOp) + 1 },
		"NAK on a request": func(f []byte) { f[4] = byte(pktSend) },
		"datagram that is no SEND": func(f []byte) {
			f[4], f[7], f[5] = byte(pktWrite), 0, fUD
		},
		"source QPN":        func(f []byte) { le.PutUint32(f[4+36:], 1<<24) },
		"destination QPN":   func(f []byte) { le.PutUint32(f[4+40:], 1<<24) },
		"PSN":               func(f []byte) { le.PutUint32(f[4+44:], psnMask+1) },
		"length field":      func(f []byte) { le.PutUint32(f[4+64:], vmwMaxMsg+1) },
		"RNR timer":         func(f []byte) { f[4+90] = 32 },
		"reserved byte":     func(f []byte) { f[4+91] = 1 },
		"flow label":        func(f []byte) { le.PutUint32(f[4+92:], 1<<20) },
		"payload cut short": func(f []byte) { le.PutUint32(f, le.Uint32(f)+1) },
	} {
		t.Run(name, func(t *testing.T) {
			f := encodeFrame(nil, fullPacket(), 7)
			spoil(f)
			_, err := readFrame(bytes.NewReader(f))
			assert.ErrorIs(t, err, ErrFabricFrame)
		})
	}
}
