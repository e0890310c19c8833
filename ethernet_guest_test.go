//go:build guest

package vfrdma

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/qemu/guestctl"
	"github.com/vfrdma/vfrdma/qemu/proto"
	"github.com/vfrdma/vfrdma/vmxnet3"
	"github.com/vfrdma/vfrdma/vmxnet3/ethping"
)

// The RDMA port follows the Ethernet function: Open brings the slot's
// vmxnet3 up, and the port reads ACTIVE with the link up; opened without
// it, the same port reads DOWN.
func TestEthernetPortActiveWhileTheNICIsUp(t *testing.T) {
	bdf := guestBDF(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	d, err := Open(bdf, nil)
	require.NoError(t, err)
	eth := d.Ethernet()
	require.NotNil(t, eth)
	link, err := eth.Link()
	require.NoError(t, err)
	assert.Equal(t, vmxnet3.Link{Up: true, Speed: 1000}, link)
	vm, _ := strconv.Atoi(os.Getenv(proto.EnvVM))
	assert.Equal(t, fmt.Sprintf("52:54:00:12:34:%02x", 0x56+vm), eth.MAC().String(), "the bench's MAC for this VM")
	port, err := d.QueryPort(ctx)
	require.NoError(t, err)
	assert.Equal(t, PortActive, PortState(port.State), "port state with the vmxnet3 function up")
	require.NoError(t, d.Close())

	d, err = Open(bdf, &Options{Ethernet: EthernetOptions{Off: true}})
	require.NoError(t, err)
	defer d.Close()
	assert.Nil(t, d.Ethernet())
	port, err = d.QueryPort(ctx)
	require.NoError(t, err)
	assert.Equal(t, PortDown, PortState(port.State), "port state with the vmxnet3 function reset")
}

// Frames out and in through a third party's IP stack: QEMU's user-mode
// network (one-VM runs) answers ARP and ICMP echo for its gateway,
// 10.0.2.2. Every payload byte comes back.
func TestEthernetPingsTheUserNetGateway(t *testing.T) {
	d := openGuest(t)
	eth := d.Ethernet()
	require.NotNil(t, eth)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := &ethping.Host{L: eth, IP: netip.MustParseAddr("10.0.2.15")}
	gw := netip.MustParseAddr("10.0.2.2")
	mac, err := h.Resolve(ctx, gw)
	require.NoError(t, err)
	t.Logf("%v is at %v", gw, mac)
	for seq, size := range []int{0, 56, 1000, 1472} {
		payload := make([]byte, size)
		for i := range payload {
			payload[i] = byte(seq*31 + i)
		}
		rtt, err := h.Ping(ctx, mac, gw, 0x77, uint16(seq), payload)
		require.NoError(t, err, "echo of %d bytes", size)
		t.Logf("echo of %d bytes: %v", size, rtt)
	}
	s, err := eth.Stats()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, s.TxFrames, uint64(5))
	assert.GreaterOrEqual(t, s.RxFrames, uint64(5))
	assert.Equal(t, s.TxFrames, s.TxDoorbells, "one frame per Send here: one doorbell each")
}

// Bad input gets a clear error and sends nothing: frames shorter than a
// header or longer than MaxFrame, a short receive buffer.
func TestEthernetRefusesBadFrames(t *testing.T) {
	d := openGuest(t)
	eth := d.Ethernet()
	require.NotNil(t, eth)
	before, err := eth.Stats()
	require.NoError(t, err)
	good := make([]byte, 60)
	copy(good, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	n, err := eth.Send([][]byte{make([]byte, 13)})
	assert.ErrorIs(t, err, vmxnet3.ErrFrameSize)
	assert.Zero(t, n)
	n, err = eth.Send([][]byte{good, make([]byte, eth.MaxFrame()+1), good})
	assert.ErrorIs(t, err, vmxnet3.ErrFrameSize)
	assert.Equal(t, 1, n, "the frame before the bad one is sent")
	after, err := eth.Stats()
	require.NoError(t, err)
	assert.Equal(t, before.TxFrames+1, after.TxFrames)
	_, err = eth.Recv(make([][]byte, 2), make([]int, 1))
	assert.ErrorIs(t, err, vmxnet3.ErrInvalid)
	_, err = vmxnet3.Open(d.ethDev, &vmxnet3.Options{TxRing: 100})
	assert.ErrorIs(t, err, vmxnet3.ErrInvalid)
}

// RDMA keeps working while Ethernet frames flow through the same slot: an
// RC stream between two QPs of the device, every byte checked, while a
// goroutine pings QEMU's user network through the vmxnet3 function, every
// echo checked.
func TestEthernetAndRDMATogether(t *testing.T) {
	d := openGuest(t)
	eth := d.Ethernet()
	require.NotNil(t, eth)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	stop := make(chan struct{})
	done := make(chan error, 1)
	var pings atomic.Int64
	go func() {
		h := &ethping.Host{L: eth, IP: netip.MustParseAddr("10.0.2.15")}
		gw := netip.MustParseAddr("10.0.2.2")
		mac, err := h.Resolve(ctx, gw)
		if err != nil {
			done <- err
			return
		}
		payload := make([]byte, 1000)
		for seq := 0; ; seq++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			payload[seq%len(payload)]++
			if _, err := h.Ping(ctx, mac, gw, 0x99, uint16(seq), payload); err != nil {
				done <- err
				return
			}
			pings.Add(1)
		}
	}()
	p := newPair(t, d, RC, 64, 64<<10)
	start := time.Now()
	db := p.stream(t, 20000, 32, rcSizes(64<<10))
	el := time.Since(start)
	close(stop)
	require.NoError(t, <-done, "the pings")
	t.Logf("RC: 20000 messages in %v (%.0f msg/s, %d doorbells) beside %d pings of 1000 bytes", el, 20000/el.Seconds(), db, pings.Load())
	assert.Greater(t, pings.Load(), int64(10), "Ethernet frames flowed during the stream")
}

// A link change reaches the driver as an event: the bench pulls this VM's
// cable (QEMU's set_link through its monitor), WaitLinkChange wakes on the
// event interrupt with the link down, Send refuses with ErrLinkDown; the
// cable back, the next event says up and frames flow again. (QEMU keeps
// the RDMA port's state apart from the Ethernet link: it stays ACTIVE.)
func TestEthernetLinkChangesAreEvents(t *testing.T) {
	d := openGuest(t)
	eth := d.Ethernet()
	require.NotNil(t, eth)
	c, err := guestctl.Open()
	require.NoError(t, err)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	defer c.SetLink(true)

	require.NoError(t, c.SetLink(false))
	l, seen, err := eth.WaitLinkChange(ctx, 0)
	require.NoError(t, err)
	assert.False(t, l.Up, "the event's link state")
	_, err = eth.Send([][]byte{make([]byte, 60)})
	assert.ErrorIs(t, err, vmxnet3.ErrLinkDown)
	port, err := d.QueryPort(ctx)
	require.NoError(t, err)
	assert.Equal(t, PortActive, PortState(port.State))

	require.NoError(t, c.SetLink(true))
	l, seen, err = eth.WaitLinkChange(ctx, seen)
	require.NoError(t, err)
	assert.True(t, l.Up)
	assert.Equal(t, uint64(2), seen)
	h := &ethping.Host{L: eth, IP: netip.MustParseAddr("10.0.2.15")}
	gw := netip.MustParseAddr("10.0.2.2")
	mac, err := h.Resolve(ctx, gw)
	require.NoError(t, err)
	_, err = h.Ping(ctx, mac, gw, 5, 1, []byte("after the cable came back"))
	require.NoError(t, err)
}
