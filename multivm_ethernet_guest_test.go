//go:build guest

package vfrdma

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/qemu/guestctl"
	"github.com/vfrdma/vfrdma/qemu/proto"
	"github.com/vfrdma/vfrdma/vmxnet3/ethping"
)

// The test traffic's EtherType (IEEE's local experimental one) and frame
// layout: destination, source, type, then the sequence number (8 bytes),
// the kind (1 byte) and, for data, a pattern that depends on the sequence.
const (
	testEtherType = 0x88B5
	kindData      = 1
	kindAck       = 2
	ethHdr        = 14
	seqOff        = ethHdr
	kindOff       = ethHdr + 8
	bodyOff       = ethHdr + 9
)

// ethPattern is the byte source of data frames: frame seq carries
// ethPattern[seq%251:] from bodyOff on.
var ethPattern = func() []byte {
	b := make([]byte, 251+2048)
	for i := range b {
		b[i] = byte(i*7 + 3)
	}
	return b
}()

// frameSize spreads sizes over 60 … 1514 bytes.
func frameSize(seq uint64) int { return 60 + int(seq*7919%1455) }

func ethPeer(t *testing.T) (vm int, p *vmPeer, d *Device) {
	t.Helper()
	bdf := guestBDF(t)
	vm, err1 := strconv.Atoi(os.Getenv(proto.EnvVM))
	vms, err2 := strconv.Atoi(os.Getenv(proto.EnvVMs))
	if err1 != nil || err2 != nil || vms < 2 {
		t.Fatalf("this test needs a two-VM run (pvvm -vms 2); %s=%q %s=%q", proto.EnvVM, os.Getenv(proto.EnvVM), proto.EnvVMs, os.Getenv(proto.EnvVMs))
	}
	if vm > 1 {
		t.Skip("VMs past the first two have no peer here")
	}
	d, err := Open(bdf, nil)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	c, err := guestctl.Open()
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return vm, &vmPeer{c: c, vm: vm, peer: 1 - vm}, d
}

// 1M frames of mixed sizes between two guests over the bench's link, half
// each way at once, every byte checked, in order, none lost: the sender
// keeps at most a window of frames unacknowledged, smaller than the
// receiver's ring, so no frame has to be dropped, and none is (the
// devices' own counts of transmit errors and receive drops stay 0).
func TestMultiVMEthernetMillionFrames(t *testing.T) {
	vm, p, d := ethPeer(t)
	eth := d.Ethernet()
	require.NotNil(t, eth)
	var peerMAC net.HardwareAddr
	p.swap(t, "eth/mac", eth.MAC(), &peerMAC)
	const perSide = 500_000
	const window, ackEvery, batch = 384, 64, 32

	frames := make([][]byte, batch)
	for i := range frames {
		frames[i] = make([]byte, eth.MaxFrame())
	}
	out := make([][]byte, batch)
	rbufs := make([][]byte, batch)
	for i := range rbufs {
		rbufs[i] = make([]byte, eth.MaxFrame())
	}
	sizes := make([]int, batch)
	hdr := func(f []byte, seq uint64, kind byte) {
		copy(f[0:6], peerMAC)
		copy(f[6:12], eth.MAC())
		binary.BigEndian.PutUint16(f[12:], testEtherType)
		binary.BigEndian.PutUint64(f[seqOff:], seq)
		f[kindOff] = kind
	}
	ack := make([]byte, 60)
	var sent, acked, got uint64
	var bytesIn uint64
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	p.barrier(t, "eth/million/start")
	t0 := time.Now()
	for sent < perSide || acked < perSide || got < perSide {
		// Send what the window allows, one doorbell per batch.
		k := 0
		for k < batch && sent+uint64(k) < perSide && sent+uint64(k)-acked < window {
			seq := sent + uint64(k)
			f := frames[k][:frameSize(seq)]
			hdr(f, seq, kindData)
			copy(f[bodyOff:], ethPattern[seq%251:])
			out[k] = f
			k++
		}
		if k > 0 {
			n, err := eth.Send(out[:k])
			require.NoError(t, err)
			require.Equal(t, k, n)
			sent += uint64(k)
		}
		// Receive: poll, or sleep on the interrupt when nothing can be sent.
		var n int
		var err error
		if k == 0 {
			wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
			n, err = eth.RecvWait(wctx, rbufs, sizes)
			wcancel()
			require.NoError(t, err, "vm%d: sent %d (acked %d), received %d", vm, sent, acked, got)
		} else {
			n, err = eth.Recv(rbufs, sizes)
			require.NoError(t, err)
		}
		for i := range n {
			f := rbufs[i][:sizes[i]]
			require.GreaterOrEqual(t, len(f), bodyOff, "a runt frame")
			require.Equal(t, uint16(testEtherType), binary.BigEndian.Uint16(f[12:]), "a frame not of the test")
			seq := binary.BigEndian.Uint64(f[seqOff:])
			switch f[kindOff] {
			case kindAck:
				acked = max(acked, seq)
			case kindData:
				require.Equal(t, got, seq, "vm%d: frames out of order or lost", vm)
				require.Equal(t, frameSize(seq), len(f), "frame %d's size", seq)
				if !bytes.Equal(f[bodyOff:], ethPattern[seq%251:][:len(f)-bodyOff]) {
					t.Fatalf("vm%d: frame %d (%d bytes) differs", vm, seq, len(f))
				}
				got++
				bytesIn += uint64(len(f))
				if got%ackEvery == 0 || got == perSide {
					hdr(ack, got, kindAck)
					_, err := eth.Send([][]byte{ack})
					require.NoError(t, err)
				}
			default:
				t.Fatalf("frame kind %d", f[kindOff])
			}
		}
	}
	el := time.Since(t0)
	s, err := eth.Stats()
	require.NoError(t, err)
	t.Logf("vm%d: %d frames (%d bytes) each way in %v: %.0f frames/s in, %.2f frames per doorbell out, %d receive sleeps; stats %+v",
		vm, perSide, bytesIn, el.Round(time.Millisecond), float64(perSide)/el.Seconds(), float64(s.TxFrames)/float64(s.TxDoorbells), s.RxWaits, s)
	assert.Zero(t, s.TxErrors, "frames the device could not send")
	assert.Zero(t, s.RxDrops, "frames the device dropped for want of buffers")
	assert.Zero(t, s.RxTruncated)
	p.barrier(t, "eth/million/done")
}

// What a flood loses is what the receiving device counts as dropped: one
// side sends a burst eight times its peer's ring while the peer does not
// receive; then the peer drains, and received + dropped = sent.
func TestMultiVMEthernetDropsAreCounted(t *testing.T) {
	vm, p, d := ethPeer(t)
	eth := d.Ethernet()
	require.NotNil(t, eth)
	var peerMAC net.HardwareAddr
	p.swap(t, "eth/drops/mac", eth.MAC(), &peerMAC)
	const burst = 4096
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if vm == 0 {
		f := make([]byte, 200)
		copy(f[0:6], peerMAC)
		copy(f[6:12], eth.MAC())
		binary.BigEndian.PutUint16(f[12:], testEtherType)
		p.barrier(t, "eth/drops/ready")
		out := [][]byte{f}
		for seq := uint64(0); seq < burst; seq++ {
			binary.BigEndian.PutUint64(f[seqOff:], seq)
			_, err := eth.Send(out)
			require.NoError(t, err)
		}
		p.barrier(t, "eth/drops/sent")
		p.barrier(t, "eth/drops/counted")
		return
	}
	before, err := eth.Stats()
	require.NoError(t, err)
	p.barrier(t, "eth/drops/ready")
	p.barrier(t, "eth/drops/sent")
	// The frames sit in the hub and QEMU until QEMU delivers them; drain
	// until nothing came for a second.
	bufs := [][]byte{make([]byte, eth.MaxFrame())}
	sizes := make([]int, 1)
	got := 0
	last := uint64(0)
	for {
		wctx, wcancel := context.WithTimeout(ctx, time.Second)
		n, err := eth.RecvWait(wctx, bufs, sizes)
		wcancel()
		if err != nil {
			break
		}
		seq := binary.BigEndian.Uint64(bufs[0][seqOff:])
		require.True(t, got == 0 || seq > last, "frames out of order")
		last = seq
		got += n
	}
	after, err := eth.Stats()
	require.NoError(t, err)
	drops := after.RxDrops - before.RxDrops
	t.Logf("burst of %d: %d received, %d dropped by the device", burst, got, drops)
	assert.Equal(t, uint64(burst), uint64(got)+drops, "received + dropped = sent")
	assert.Positive(t, drops, "a burst eight times the ring must overflow it")
	p.barrier(t, "eth/drops/counted")
}

// Ping between the two guests: one answers ARP and echo for its address,
// the other resolves it and pings.
func TestMultiVMEthernetPing(t *testing.T) {
	vm, p, d := ethPeer(t)
	eth := d.Ethernet()
	require.NotNil(t, eth)
	ip := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 10, 0, byte(1 + i)}) }
	h := &ethping.Host{L: eth, IP: ip(vm)}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if vm == 1 {
		sctx, scancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { _, err := h.Serve(sctx); done <- err }()
		p.barrier(t, "eth/ping/serving")
		p.barrier(t, "eth/ping/done")
		scancel()
		require.NoError(t, <-done)
		assert.GreaterOrEqual(t, h.Answered, 11, "one ARP reply and ten echo replies")
		return
	}
	p.barrier(t, "eth/ping/serving")
	mac, err := h.Resolve(ctx, ip(1))
	require.NoError(t, err)
	var peerMAC net.HardwareAddr = mac
	for seq := range 10 {
		payload := []byte(fmt.Sprintf("ping %d from vm%d %s", seq, vm, bytes.Repeat([]byte{'x'}, seq*100)))
		rtt, err := h.Ping(ctx, peerMAC, ip(1), 1, uint16(seq), payload)
		require.NoError(t, err)
		t.Logf("echo %d: %v", seq, rtt)
	}
	p.barrier(t, "eth/ping/done")
}
