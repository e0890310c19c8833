package connect

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
)

var gid = vfrdma.GID{0xfe, 0x80, 8: 0x50, 9: 0x54, 10: 0x00, 11: 0xff, 12: 0xfe, 13: 0x12, 14: 0x34, 15: 0x56}

// The message is rdma-core's, byte for byte: 52 bytes, LID, QPN and PSN
// zero-padded lower-case hex, the GID's bytes in order, a NUL.
func TestRDMACoreMessageIsThePingpongsText(t *testing.T) {
	e := Endpoint{QPN: 0x11, PSN: 0xdac0b0, GID: gid, LID: 0x1f}
	b := appendRDMACore(nil, e)
	assert.Equal(t, "001f:000011:dac0b0:fe80000000000000505400fffe123456\x00", string(b))
	assert.Len(t, b, rdmaCoreMsgLen)
	got, err := parseRDMACore(b)
	require.NoError(t, err)
	assert.Equal(t, e, got)
}

// The hello's layout (version 2): the endpoint count, then per endpoint
// QPN, PSN, Q_Key, LID, MTU and GID; the region count, then per region
// address, length and rkey; all little-endian; then the data. It decodes
// back.
func TestNativeHelloLayout(t *testing.T) {
	in := Info{
		Endpoints: []Endpoint{{QPN: 0x010203, PSN: 0x040506, QKey: 0x0708090a, LID: 0x0b0c, MTU: 2048, GID: gid}},
		Regions:   []Region{{Addr: 0x1112131415161718, Len: 0x2122232425262728, RKey: 0x31323334}},
		Data:      []byte("xy"),
	}
	p := encodeHello(in)
	want := []byte{1, 0, 0, 0, 3, 2, 1, 0, 6, 5, 4, 0, 0x0a, 9, 8, 7, 0x0c, 0x0b, 0, 8}
	want = append(want, gid[:]...)
	want = append(want, 1, 0, 0, 0, 0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11, 0x28, 0x27, 0x26, 0x25, 0x24, 0x23, 0x22, 0x21, 0x34, 0x33, 0x32, 0x31)
	want = append(want, "xy"...)
	assert.Equal(t, want, p)
	out, err := decodeHello(p)
	require.NoError(t, err)
	assert.Equal(t, in, out)
	assert.Equal(t, []byte("vfrdmaCX\x02\x00\x01\x00\x02\x00\x00\x00hi"), appendMessage(nil, kindHello, []byte("hi")))
}

// No input panics the hello decoder, and what it accepts is in range and
// encodes back to the same bytes.
func FuzzDecodeHello(f *testing.F) {
	f.Add(encodeHello(Info{Endpoints: []Endpoint{{QPN: 1, GID: gid, MTU: 1024}}, Data: []byte("d")}))
	f.Add(encodeHello(Info{Regions: []Region{{Addr: 1 << 63, Len: 1 << 63, RKey: 1}}}))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{2, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, p []byte) {
		in, err := decodeHello(p)
		if err != nil {
			require.ErrorIs(t, err, ErrProtocol)
			return
		}
		for _, e := range in.Endpoints {
			require.NoError(t, e.check())
		}
		for _, r := range in.Regions {
			require.NoError(t, r.check())
		}
		require.LessOrEqual(t, len(in.Data), MaxData)
		require.Equal(t, p, encodeHello(in))
	})
}

// No input panics readMessage; an error is ErrProtocol, ErrRefused or the
// stream's end.
func FuzzReadMessage(f *testing.F) {
	f.Add(appendMessage(nil, kindHello, encodeHello(Info{Endpoints: []Endpoint{{QPN: 1}}})))
	f.Add(appendMessage(nil, kindRefusal, []byte("no")))
	f.Add([]byte("vfrdmaCX\x02\x00\x01\x00\xff\xff\xff\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := readMessage(bytes.NewReader(b), kindHello)
		if err == nil {
			require.LessOrEqual(t, len(p), maxHello)
		}
	})
}

// No 52 bytes panic the rdma-core parser, and what it accepts writes back
// the same, up to the case of the hex.
func FuzzParseRDMACore(f *testing.F) {
	f.Add(appendRDMACore(nil, Endpoint{QPN: 0x11, PSN: 7, GID: gid}))
	f.Add(bytes.Repeat([]byte{':'}, rdmaCoreMsgLen))
	f.Fuzz(func(t *testing.T, m []byte) {
		e, err := parseRDMACore(m)
		if err != nil {
			return
		}
		require.Len(t, m, rdmaCoreMsgLen)
		require.Equal(t, bytes.ToLower(m), appendRDMACore(nil, e))
	})
}
