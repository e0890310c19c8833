package ethping

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// wire is one end of an in-memory Ethernet link: what one end sends, the
// other receives, padded to 60 bytes as a NIC pads it.
type wire struct {
	mac     net.HardwareAddr
	in, out chan []byte
	corrupt bool // flip a payload byte of what this end sends
}

func link() (*wire, *wire) {
	a, b := make(chan []byte, 64), make(chan []byte, 64)
	return &wire{mac: net.HardwareAddr{2, 0, 0, 0, 0, 1}, in: a, out: b}, &wire{mac: net.HardwareAddr{2, 0, 0, 0, 0, 2}, in: b, out: a}
}

func (w *wire) Send(frames [][]byte) (int, error) {
	for _, f := range frames {
		c := append([]byte(nil), f...)
		if len(c) < 60 {
			c = append(c, make([]byte, 60-len(c))...)
		}
		if w.corrupt && len(c) > 50 {
			c[len(c)-1] ^= 0xff
		}
		w.out <- c
	}
	return len(frames), nil
}

func (w *wire) RecvWait(ctx context.Context, bufs [][]byte, sizes []int) (int, error) {
	select {
	case f := <-w.in:
		sizes[0] = copy(bufs[0], f)
		return 1, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func (w *wire) MAC() net.HardwareAddr { return w.mac }
func (w *wire) MaxFrame() int         { return 1514 }

// A host resolves another over ARP and pings it; the other answers both;
// every echo payload comes back whole (frames padded to 60 bytes included).
func TestResolvePingServe(t *testing.T) {
	a, b := link()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	server := &Host{L: b, IP: netip.MustParseAddr("10.1.0.2")}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := server.Serve(sctx); done <- err }()

	client := &Host{L: a, IP: netip.MustParseAddr("10.1.0.1")}
	mac, err := client.Resolve(ctx, server.IP)
	require.NoError(t, err)
	assert.Equal(t, b.mac.String(), mac.String())
	for seq, size := range []int{0, 1, 18, 1000, 1472} {
		payload := make([]byte, size)
		for i := range payload {
			payload[i] = byte(i * 3)
		}
		_, err := client.Ping(ctx, mac, server.IP, 7, uint16(seq), payload)
		require.NoError(t, err, "payload of %d bytes", size)
	}
	stop()
	require.NoError(t, <-done)
	assert.Equal(t, 6, server.Answered, "one ARP reply, five echo replies")
}

// An echo whose bytes were damaged on the way fails its checksum and is no
// answer at all: the ping times out rather than report it.
func TestPingChecksTheEcho(t *testing.T) {
	a, b := link()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	server := &Host{L: b, IP: netip.MustParseAddr("10.1.0.2")}
	go func() { _, _ = server.Serve(ctx) }()
	client := &Host{L: a, IP: netip.MustParseAddr("10.1.0.1")}
	mac, err := client.Resolve(ctx, server.IP)
	require.NoError(t, err)
	b.corrupt = true
	short, cancel2 := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel2()
	_, err = client.Ping(short, mac, server.IP, 7, 1, make([]byte, 100))
	assert.ErrorIs(t, err, ErrTimeout, "a reply that fails its checksum is no reply")
}

func TestChecksum(t *testing.T) {
	// The IPv4 header example of RFC 1071's neighbours: a header holding
	// its own checksum sums to 0.
	h := []byte{0x45, 0, 0, 0x54, 0, 0, 0x40, 0, 0x40, 1, 0, 0, 10, 0, 2, 15, 10, 0, 2, 2}
	c := checksum(h)
	h[10], h[11] = byte(c>>8), byte(c)
	assert.Zero(t, checksum(h))
	assert.Equal(t, uint16(0xffff), checksum(nil))
}
