package connect_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/connect"
)

// version is the native format's version this package speaks.
const version = 2

// The native format's bytes, written here independently of the package:
// the header (magic, version, kind) and a frame of the payload.
func nativeMsg(v, kind uint16, payload []byte) []byte {
	b := []byte("vfrdmaCX")
	b = binary.LittleEndian.AppendUint16(b, v)
	b = binary.LittleEndian.AppendUint16(b, kind)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(payload)))
	return append(b, payload...)
}

// helloPayload is a hello's payload claiming count endpoints and holding
// eps (QPN, PSN, Q_Key, LID, MTU, GID each), no region, then data.
func helloPayload(count uint32, eps []connect.Endpoint, data []byte) []byte {
	return helloRegions(count, eps, 0, nil, data)
}

// helloRegions is a hello's payload claiming count endpoints and holding
// eps, then claiming rcount regions and holding rs (address, length,
// rkey each), then data.
func helloRegions(count uint32, eps []connect.Endpoint, rcount uint32, rs []connect.Region, data []byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, count)
	for _, e := range eps {
		b = binary.LittleEndian.AppendUint32(b, e.QPN)
		b = binary.LittleEndian.AppendUint32(b, e.PSN)
		b = binary.LittleEndian.AppendUint32(b, e.QKey)
		b = binary.LittleEndian.AppendUint16(b, e.LID)
		b = binary.LittleEndian.AppendUint16(b, uint16(e.MTU))
		b = append(b, e.GID[:]...)
	}
	b = binary.LittleEndian.AppendUint32(b, rcount)
	for _, r := range rs {
		b = binary.LittleEndian.AppendUint64(b, r.Addr)
		b = binary.LittleEndian.AppendUint64(b, r.Len)
		b = binary.LittleEndian.AppendUint32(b, r.RKey)
	}
	return append(b, data...)
}

// rdmaCoreMsg is one message as rdma-core's pingpongs write it.
func rdmaCoreMsg(lid, qpn, psn uint32, gidHex string) []byte {
	return append([]byte(fmt.Sprintf("%04x:%06x:%06x:%s", lid, qpn, psn, gidHex)), 0)
}

const gidAHex = "fe80000000000000505400fffe123456"

// fromRawPeer runs step on the server's end of a Conn whose client is a
// raw TCP connection that writes sent and then closes its write side. It
// returns what the raw client read back and step's error.
func fromRawPeer(t *testing.T, f connect.Format, sent []byte, step func(context.Context, *connect.Conn) error) ([]byte, error) {
	t.Helper()
	ctx := withTimeout(t, 10*time.Second)
	ln, err := connect.Listen(ctx, "127.0.0.1:0", &connect.Options{Format: f})
	require.NoError(t, err)
	defer ln.Close()
	raw, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer raw.Close()
	srv, err := ln.Accept(ctx)
	require.NoError(t, err)
	wrote := make(chan error, 1)
	go func() { // it may be more than the socket buffers hold before the server reads
		_, err := raw.Write(sent)
		if err == nil {
			err = raw.(*net.TCPConn).CloseWrite()
		}
		wrote <- err
	}()
	stepErr := step(ctx, srv)
	srv.Close()
	<-wrote // a server that gave up early may leave it an error: not the test's point
	_ = raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	back, _ := io.ReadAll(raw)
	return back, stepErr
}

func exchange(ctx context.Context, c *connect.Conn) error {
	_, err := c.Exchange(ctx, connect.Info{Endpoints: []connect.Endpoint{{QPN: 5, GID: gidB}}})
	return err
}

// What a hostile or confused peer sends to a native end is an error that
// says what was wrong, wrapping ErrProtocol (ErrRefused for a refusal);
// never a panic, never an allocation of what the peer claims. A peer that
// speaks the native format is told why in a refusal.
func TestHostileInputIsAnErrorNative(t *testing.T) {
	good := connect.Endpoint{QPN: 1, GID: gidA}
	for _, tc := range []struct {
		name    string
		sent    []byte
		want    string
		refusal bool // the raw peer gets a refusal back
	}{
		{"another protocol", []byte("GET / HTTP/1.0\r\n\r\n"), "not vfrdma's exchange", false},
		{"rdma-core's format", rdmaCoreMsg(0, 0x11, 7, gidAHex), "rdma-core's pingpong exchange", false},
		{"another version", nativeMsg(1, 1, helloPayload(1, []connect.Endpoint{good}, nil)), "the peer speaks version 1 of the exchange, this end 2", true},
		{"unknown kind", nativeMsg(version, 9, nil), "unknown kind 9", true},
		{"oversize frame", nativeMsg(version, 1, nil)[:12], "", true}, // filled in below
		{"oversize count", nativeMsg(version, 1, helloPayload(1<<20, nil, nil)), "offers 1048576 endpoints", true},
		{"count beyond the payload", nativeMsg(version, 1, helloPayload(3, []connect.Endpoint{good}, nil)), "3 endpoints and the region count take 104 bytes, the hello has 40", true},
		{"no region count", nativeMsg(version, 1, helloPayload(1, []connect.Endpoint{good}, nil)[:36]), "1 endpoints and the region count take 40 bytes, the hello has 36", true},
		{"oversize region count", nativeMsg(version, 1, helloRegions(0, nil, 1<<20, nil, nil)), "offers 1048576 regions", true},
		{"region count beyond the payload", nativeMsg(version, 1, helloRegions(0, nil, 2, []connect.Region{{Addr: 1, Len: 1}}, nil)), "2 regions take 44 bytes, the hello has 24 after its endpoints", true},
		{"empty region", nativeMsg(version, 1, helloRegions(0, nil, 1, []connect.Region{{Addr: 0x1000, RKey: 7}}, nil)), "region 0: region at 0x1000 (rkey 0x7) is empty", true},
		{"region past the address space", nativeMsg(version, 1, helloRegions(0, nil, 2, []connect.Region{{Addr: 1, Len: 1}, {Addr: 1<<63 + 1, Len: 1 << 63}}, nil)), "region 1: region at 0x8000000000000001 of 9223372036854775808 bytes passes the end", true},
		{"oversize data", nativeMsg(version, 1, helloPayload(0, nil, make([]byte, connect.MaxData+1))), "bytes of data", true},
		{"QPN 0", nativeMsg(version, 1, helloPayload(1, []connect.Endpoint{{GID: gidA}}, nil)), "endpoint 0: QPN 0x0", true},
		{"QPN past 24 bits", nativeMsg(version, 1, helloPayload(2, []connect.Endpoint{good, {QPN: 1 << 24}}, nil)), "endpoint 1: QPN 0x1000000", true},
		{"PSN past 24 bits", nativeMsg(version, 1, helloPayload(1, []connect.Endpoint{{QPN: 1, PSN: 1 << 31}}, nil)), "PSN 0x80000000", true},
		{"bad MTU", nativeMsg(version, 1, helloPayload(1, []connect.Endpoint{{QPN: 1, MTU: 1500}}, nil)), "path MTU 1500", true},
		{"header cut", []byte("vfrdma"), "a header cut at 6 of 12 bytes", true},
		{"frame cut", nativeMsg(version, 1, helloPayload(1, []connect.Endpoint{good}, nil))[:30], "cut short", true},
		{"a barrier for a hello", nativeMsg(version, 2, []byte("ready")), "a barrier where a hello was due", true},
		{"a refusal", nativeMsg(version, 3, []byte("go away\x00\xff")), "the peer refused the exchange, saying: go away??", false},
		{"nothing", nil, "the peer closed the connection", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "oversize frame" {
				tc.sent = binary.LittleEndian.AppendUint32(tc.sent, 0xffffffff)
				tc.want = "a frame of 4294967295 bytes"
			}
			back, err := fromRawPeer(t, connect.Native, tc.sent, exchange)
			require.Error(t, err)
			switch tc.name {
			case "a refusal":
				assert.ErrorIs(t, err, connect.ErrRefused)
			case "nothing":
				assert.ErrorIs(t, err, io.EOF)
			default:
				assert.ErrorIs(t, err, connect.ErrProtocol)
			}
			assert.ErrorContains(t, err, tc.want)
			assert.ErrorContains(t, err, "connect: exchange with 127.0.0.1:", "the error names the peer")
			if tc.refusal {
				require.Greater(t, len(back), 16, "a refusal comes back")
				assert.Equal(t, "vfrdmaCX", string(back[:8]))
				assert.EqualValues(t, 3, binary.LittleEndian.Uint16(back[10:]), "its kind")
				assert.Contains(t, string(back[16:]), tc.want, "the refusal says why")
			} else {
				assert.Empty(t, back, "no refusal to a peer that does not speak the format")
			}
		})
	}
}

// The same holds at the client's end: a server that answers garbage.
func TestHostileServerIsAnError(t *testing.T) {
	ctx := withTimeout(t, 10*time.Second)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.ReadFull(c, make([]byte, 12+4+4+32))
		_, _ = c.Write(bytes.Repeat([]byte{0xff}, 64))
	}()
	cli, err := connect.Dial(ctx, ln.Addr().String(), nil)
	require.NoError(t, err)
	defer cli.Close()
	err = exchange(ctx, cli)
	require.ErrorIs(t, err, connect.ErrProtocol)
	assert.ErrorContains(t, err, "not vfrdma's exchange")
	assert.ErrorContains(t, err, ln.Addr().String())
}

// What a hostile peer sends in rdma-core's format is an error wrapping
// ErrProtocol that says what was wrong.
func TestHostileInputIsAnErrorRDMACore(t *testing.T) {
	good := rdmaCoreMsg(0, 0x11, 7, gidAHex)
	zero := rdmaCoreMsg(0, 0, 0, strings.Repeat("0", 32))
	srq := func(msgs ...[]byte) []byte {
		var b []byte
		for _, m := range msgs {
			b = append(b, m...)
		}
		for len(b) < 256*52 {
			b = append(b, zero...)
		}
		return b
	}
	for _, tc := range []struct {
		name string
		f    connect.Format
		sent []byte
		want string
	}{
		{"bad GID text", connect.RDMACore, rdmaCoreMsg(0, 0x11, 7, "fe80zz0000000000505400fffe123456"), "byte 23 is 'z', not a hex digit of the GID"},
		{"no colons", connect.RDMACore, append(bytes.Repeat([]byte{'0'}, 51), 0), "byte 4 is '0', not a colon"},
		{"no NUL", connect.RDMACore, append(good[:51:51], 'x'), "byte 51 is 'x', not the closing NUL"},
		{"QPN not hex", connect.RDMACore, []byte(strings.Replace(string(good), "000011", "00001g", 1)), "byte 10 is 'g', not a hex digit of the QPN"},
		{"truncated", connect.RDMACore, good[:30], "cut at 30 of 52 bytes"},
		{"QPN 0", connect.RDMACore, zero, "names no QP"},
		{"no GID", connect.RDMACore, rdmaCoreMsg(0, 0x11, 7, strings.Repeat("0", 32)), "-g GID_INDEX"},
		{"vfrdma's format", connect.RDMACore, nativeMsg(version, 1, helloPayload(1, []connect.Endpoint{{QPN: 1}}, nil)), "native exchange"},
		{"srq: a QP after none", connect.RDMACoreSRQ, srq(good, zero, good), "address 3 names QP 0x11 after address 2 named none"},
		{"srq: no QP", connect.RDMACoreSRQ, srq(), "none of the peer's 256 addresses"},
		{"srq: truncated", connect.RDMACoreSRQ, srq(good)[:100*52], "address 101 of 256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			back, err := fromRawPeer(t, tc.f, tc.sent, exchange)
			require.ErrorIs(t, err, connect.ErrProtocol)
			assert.ErrorContains(t, err, tc.want)
			assert.Empty(t, back, "the server writes nothing before Ready")
		})
	}
	// The server's Ready waits for the client's "done" and nothing else.
	back, err := fromRawPeer(t, connect.RDMACore, append(good, "nope\x00"...), func(ctx context.Context, c *connect.Conn) error {
		if err := exchange(ctx, c); err != nil {
			return err
		}
		return c.Ready(ctx)
	})
	require.ErrorIs(t, err, connect.ErrProtocol)
	assert.ErrorContains(t, err, `the peer sent "nope\x00" where its "done" was due`)
	assert.Len(t, back, 52, "the server's address went out at Ready")
}

// ReadFrame reads what WriteFrame wrote, across its allocation chunks.
func TestFrameRoundTrips(t *testing.T) {
	for _, n := range []int{0, 1, 64<<10 - 1, 64<<10 + 3, 200 << 10} {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i * 7)
		}
		var buf bytes.Buffer
		require.NoError(t, connect.WriteFrame(&buf, b))
		got, err := connect.ReadFrame(&buf, n)
		require.NoError(t, err, n)
		assert.Equal(t, b, got, n)
	}
	var buf bytes.Buffer
	require.NoError(t, connect.WriteFrame(&buf, make([]byte, 11)))
	_, err := connect.ReadFrame(&buf, 10)
	assert.ErrorIs(t, err, connect.ErrProtocol, "over the limit")
	_, err = connect.ReadFrame(bytes.NewReader(nil), 10)
	assert.ErrorIs(t, err, io.EOF, "no frame at all")
}

// A frame whose length claims a gigabyte and brings ten bytes costs what
// arrived (and a chunk), not what was claimed.
func TestFrameLengthDoesNotAllocateWhatThePeerClaims(t *testing.T) {
	in := binary.LittleEndian.AppendUint32(nil, 1<<30)
	in = append(in, make([]byte, 10)...)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := connect.ReadFrame(bytes.NewReader(in), 1<<31)
	runtime.ReadMemStats(&after)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20))
}

// The GID hex of rdma-core's message is the GID's bytes in order.
func TestRDMACoreGIDIsItsBytesInOrder(t *testing.T) {
	g, err := hex.DecodeString(gidAHex)
	require.NoError(t, err)
	assert.Equal(t, gidA[:], g)
}
