package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/connect"
	"github.com/vfrdma/vfrdma/vmxnet3"
	"github.com/vfrdma/vfrdma/vmxnet3/ethping"
)

// ethDoc is what `pvctl eth info --json` prints.
type ethDoc struct {
	BDF       string        `json:"bdf"`
	MAC       string        `json:"mac"`
	MTU       int           `json:"mtu"`
	Link      string        `json:"link"`
	PortState string        `json:"rdma_port_state"`
	Stats     vmxnet3.Stats `json:"stats"`
}

const ethUsage = `pvctl eth [info] [BDF]                        link, MAC, MTU, counters, and the RDMA port it brings up
pvctl eth ping [--ip A] [--count N] [--size S] IP [BDF]   ARP, then ICMP echo, every byte checked
pvctl eth serve [--ip A] [--for D] [BDF]       answer ARP and ICMP echo for A
pvctl eth gen [--sizes L] [--batches L] [--frames N] [--to MAC] [BDF]   send frames: packets/s, doorbells/packet
pvctl eth gen --vm [--tag T] [...]             between two bench VMs: VM 0 sends, VM 1 counts what arrives
pvctl eth sink [--for D] [--idle D] [BDF]      count frames received: packets/s
(ping and serve print text only; info, gen and sink also --json)`

// ethOpts are eth's flags, one set for its subcommands.
type ethOpts struct {
	ip             string
	count, size    int
	dur, idle      time.Duration
	sizes, batches string
	frames         int
	to             string
	pf             peerFlags
}

// maxEchoPayload is the most an ICMP echo carries in IPv4; the link's
// frame size bounds it further (checked once the NIC is open).
const maxEchoPayload = 65535 - 20 - 8

// ethFlags declares eth's flags on fs.
func ethFlags(fs *flag.FlagSet) *ethOpts {
	o := &ethOpts{}
	fs.StringVar(&o.ip, "ip", "10.0.2.15", "this host's IPv4 address `A` (ping, serve)")
	fs.IntVar(&o.count, "count", 5, "echo requests (ping)")
	fs.IntVar(&o.size, "size", 56, "echo payload bytes (ping)")
	fs.DurationVar(&o.dur, "for", 30*time.Second, "how long to run (serve, sink)")
	fs.DurationVar(&o.idle, "idle", 3*time.Second, "stop after this long without a frame once frames came (sink)")
	fs.StringVar(&o.sizes, "sizes", "64,1514", "frame sizes, a comma-separated `LIST` (gen)")
	fs.StringVar(&o.batches, "batches", "1,8,32", "frames per Send, a comma-separated `LIST` (gen)")
	fs.IntVar(&o.frames, "frames", 20000, "frames per size and batch (gen)")
	fs.StringVar(&o.to, "to", "ff:ff:ff:ff:ff:ff", "destination `MAC` (gen)")
	fs.BoolVar(&o.pf.vm, "vm", false, "gen between two bench VMs: VM 0 sends to VM 1, which counts")
	fs.StringVar(&o.pf.tag, "tag", "eth", "rendezvous key prefix for --vm (`KEY`)")
	return o
}

// cmdEth runs the Ethernet function's subcommands.
func cmdEth(e *env, args []string) error {
	sub := "info"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") && !strings.Contains(args[0], ":") {
		sub, args = args[0], args[1:]
	}
	fs := newFlagSet(e, "eth")
	o := ethFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if e.model != "" {
		return errModel
	}
	rest := fs.Args()
	var dst netip.Addr
	switch sub {
	case "ping":
		if len(rest) < 1 {
			return usageErrorf("eth ping needs the IPv4 address to ping")
		}
		var err error
		if dst, err = netip.ParseAddr(rest[0]); err != nil || !dst.Is4() {
			return usageErrorf("eth ping %q: want an IPv4 address", rest[0])
		}
		rest = rest[1:]
	case "info", "serve", "gen", "sink":
	default:
		return usageErrorf("unknown eth subcommand %q: want info, ping, serve, gen or sink", sub)
	}
	if err := e.checkBDF(rest); err != nil {
		return err
	}
	self, err := netip.ParseAddr(o.ip)
	if err != nil || !self.Is4() {
		return usageErrorf("--ip %q: want an IPv4 address", o.ip)
	}
	switch {
	case e.json && (sub == "ping" || sub == "serve"):
		return usageErrorf("eth %s prints text only: no --json", sub)
	case o.pf.vm && sub != "gen":
		return usageErrorf("--vm: only eth gen runs between two VMs")
	case o.pf.vm && o.pf.tag == "":
		return usageErrorf("--tag \"\": --vm needs a rendezvous key prefix")
	case o.size < 0 || o.size > maxEchoPayload:
		return usageErrorf("--size %d: want 0 to %d payload bytes", o.size, maxEchoPayload)
	case o.dur <= 0:
		return usageErrorf("--for %v: want a positive duration", o.dur)
	case o.idle <= 0:
		return usageErrorf("--idle %v: want a positive duration", o.idle)
	}
	if err := checkCount("count", o.count, "echo requests"); err != nil {
		return err
	}
	if err := checkCount("frames", o.frames, "frames"); err != nil {
		return err
	}
	mac, err := net.ParseMAC(o.to)
	if err != nil || len(mac) != 6 {
		return usageErrorf("--to %q: want an Ethernet MAC address (xx:xx:xx:xx:xx:xx)", o.to)
	}
	sz, err := intList("sizes", o.sizes)
	if err != nil {
		return err
	}
	for _, n := range sz {
		if n < vmxnet3.HeaderLen {
			return usageErrorf("--sizes %q: %d: a frame holds its %d-byte header at least", o.sizes, n, vmxnet3.HeaderLen)
		}
	}
	bs, err := intList("batches", o.batches)
	if err != nil {
		return err
	}
	f, err := e.target(rest)
	if err != nil {
		return err
	}
	d, err := vfrdma.Open(f.Addr.String(), &vfrdma.Options{SysfsRoot: e.sysfs, VFIO: e.vfio})
	if err != nil {
		return err
	}
	defer d.Close()
	eth := d.Ethernet()
	switch sub {
	case "info":
		return ethInfo(e, d)
	case "ping":
		return ethPing(e, eth, self, dst, o.count, o.size)
	case "serve":
		ctx, cancel := context.WithTimeout(context.Background(), o.dur)
		defer cancel()
		h := &ethping.Host{L: eth, IP: self}
		n, err := h.Serve(ctx)
		fmt.Fprintf(e.out, "answered %d requests for %v in %v\n", n, self, o.dur)
		return err
	case "gen":
		if o.pf.vm {
			return ethGenVM(e, eth, &o.pf, sz, bs, o.frames)
		}
		_, err = ethGen(e, eth, mac, sz, bs, o.frames, nil)
		return err
	default: // sink
		return ethSink(e, eth, o.dur, o.idle)
	}
}

// intList parses flag name's comma-separated list of positive numbers.
func intList(name, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v <= 0 || v > maxCount {
			return nil, usageErrorf("--%s %q: want a comma-separated list of positive numbers", name, s)
		}
		out = append(out, v)
	}
	return out, nil
}

func ethInfo(e *env, d *vfrdma.Device) error {
	eth := d.Ethernet()
	link, err := eth.Link()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	port, err := d.QueryPort(ctx)
	if err != nil {
		return err
	}
	st, err := eth.Stats()
	if err != nil {
		return err
	}
	doc := ethDoc{BDF: eth.Name(), MAC: eth.MAC().String(), MTU: eth.MTU(), Link: link.String(), PortState: portStateName(port.State), Stats: st}
	if e.json {
		return e.printJSON(doc)
	}
	w := tabwriter.NewWriter(e.out, 0, 8, 2, ' ', 0)
	for _, r := range [][2]any{
		{"vmxnet3", doc.BDF}, {"MAC", doc.MAC}, {"MTU", doc.MTU}, {"link", doc.Link},
		{"RDMA port 1 state", doc.PortState + " (QEMU reports the backend's port only while this function is active)"},
		{"tx frames / bytes / doorbells", fmt.Sprintf("%d / %d / %d", st.TxFrames, st.TxBytes, st.TxDoorbells)},
		{"tx errors (device)", st.TxErrors},
		{"rx frames / bytes", fmt.Sprintf("%d / %d", st.RxFrames, st.RxBytes)},
		{"rx dropped: no buffer (device) / truncated", fmt.Sprintf("%d / %d", st.RxDrops, st.RxTruncated)},
	} {
		fmt.Fprintf(w, "%v:\t%v\n", r[0], r[1])
	}
	return w.Flush()
}

// echoFits refuses an echo payload whose request (Ethernet, IPv4 and ICMP
// headers before it) exceeds the link's frames.
func echoFits(size, maxFrame int) error {
	if n := vmxnet3.HeaderLen + 20 + 8 + size; n > maxFrame {
		return fmt.Errorf("--size %d: an echo request of %d bytes does not fit the link's %d-byte frames", size, n, maxFrame)
	}
	return nil
}

func ethPing(e *env, eth *vmxnet3.NIC, self, dst netip.Addr, count, size int) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(count+5)*5*time.Second)
	defer cancel()
	if err := echoFits(size, eth.MaxFrame()); err != nil {
		return err
	}
	h := &ethping.Host{L: eth, IP: self}
	t0 := time.Now()
	mac, err := h.Resolve(ctx, dst)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.out, "ARP: %v is at %v (%v)\n", dst, mac, time.Since(t0).Round(time.Microsecond))
	payload := make([]byte, size)
	var total time.Duration
	for seq := range count {
		for i := range payload {
			payload[i] = byte(seq + i)
		}
		rtt, err := h.Ping(ctx, mac, dst, 0x5056, uint16(seq), payload)
		if err != nil {
			return err
		}
		total += rtt
		fmt.Fprintf(e.out, "%d bytes from %v: icmp_seq=%d time=%v (payload checked)\n", size+8, dst, seq, rtt.Round(time.Microsecond))
	}
	fmt.Fprintf(e.out, "%d sent, %d received, 0%% loss, avg %v\n", count, count, (total / time.Duration(count)).Round(time.Microsecond))
	return nil
}

// genRow is one line of `pvctl eth gen`.
type genRow struct {
	Size               int     `json:"size"`
	Batch              int     `json:"batch"`
	Frames             int     `json:"frames"`
	PPS                float64 `json:"packets_per_s"`
	MbitS              float64 `json:"mbit_per_s"`
	DoorbellsPerPacket float64 `json:"doorbells_per_packet"`
}

// ethGen sends frames of each size in batches of each size and reports the
// transmit rate: QEMU sends every frame of a batch before the doorbell's
// write returns, so this is the whole path to the link. row, if set, runs
// before and after each size and batch (the --vm rendezvous).
func ethGen(e *env, eth *vmxnet3.NIC, to net.HardwareAddr, sizes, batches []int, frames int, row func(i int, end bool) error) ([]genRow, error) {
	var rows []genRow
	for _, size := range sizes {
		if size < vmxnet3.HeaderLen || size > eth.MaxFrame() {
			return nil, fmt.Errorf("frame size %d: want %d to %d", size, vmxnet3.HeaderLen, eth.MaxFrame())
		}
		for _, batch := range batches {
			if row != nil {
				if err := row(len(rows), false); err != nil {
					return nil, err
				}
			}
			buf := make([][]byte, batch)
			for i := range buf {
				f := make([]byte, size)
				copy(f[0:6], to)
				copy(f[6:12], eth.MAC())
				binary.BigEndian.PutUint16(f[12:], 0x88B5)
				buf[i] = f
			}
			before, err := eth.Stats()
			if err != nil {
				return nil, err
			}
			t0 := time.Now()
			for sent := 0; sent < frames; {
				k := min(batch, frames-sent)
				for i := range k {
					binary.BigEndian.PutUint64(buf[i][14:], uint64(sent+i))
				}
				n, err := eth.Send(buf[:k])
				if err != nil && !errors.Is(err, vmxnet3.ErrRingFull) {
					return nil, err
				}
				sent += n
			}
			el := time.Since(t0)
			after, err := eth.Stats()
			if err != nil {
				return nil, err
			}
			rows = append(rows, genRow{Size: size, Batch: batch, Frames: frames,
				PPS: float64(frames) / el.Seconds(), MbitS: float64(frames*size*8) / el.Seconds() / 1e6,
				DoorbellsPerPacket: float64(after.TxDoorbells-before.TxDoorbells) / float64(frames)})
			if row != nil {
				if err := row(len(rows)-1, true); err != nil {
					return nil, err
				}
			}
		}
	}
	if e.json {
		return rows, e.printJSON(rows)
	}
	fmt.Fprintf(e.out, "vmxnet3 transmit to %v (the device sends each batch before the doorbell returns)\n", to)
	w := tabwriter.NewWriter(e.out, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "size\tbatch\tframes\tpackets/s\tMbit/s\tdoorbells/packet\t")
	for _, r := range rows {
		fmt.Fprintf(w, "%d\t%d\t%d\t%.0f\t%.1f\t%.3f\t\n", r.Size, r.Batch, r.Frames, r.PPS, r.MbitS, r.DoorbellsPerPacket)
	}
	return rows, w.Flush()
}

// sinkRow is what the receiving VM of `eth gen --vm` counted for one row.
type sinkRow struct {
	Size        int     `json:"size"`
	Batch       int     `json:"batch"`
	Sent        int     `json:"sent"`
	Received    int     `json:"received"`
	PPS         float64 `json:"packets_per_s"`
	DeviceDrops uint64  `json:"device_drops"`
	// LinkLost is what neither device saw: sent − received − device
	// drops. On the bench it is QEMU's network layer: a sender's QEMU
	// queues up to 10 000 frames the socket does not take yet and drops
	// past that without a count.
	LinkLost int `json:"link_lost"`
}

// ethGenVM runs gen between two bench VMs: VM 0 sends every row to VM 1,
// which counts what arrives and what its device dropped, row by row (a
// barrier before each row; after it, VM 1 drains until the link is quiet).
func ethGenVM(e *env, eth *vmxnet3.NIC, pf *peerFlags, sizes, batches []int, frames int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	x, err := pf.open(ctx)
	if err != nil {
		return err
	}
	defer x.close()
	peer, err := x.swap(ctx, connect.Info{Data: eth.MAC()})
	if err != nil {
		return err
	}
	if len(peer.Data) != 6 {
		return fmt.Errorf("the other VM's MAC address is %d bytes, not 6", len(peer.Data))
	}
	if x.server() {
		_, err := ethGen(e, eth, net.HardwareAddr(peer.Data), sizes, batches, frames, func(i int, end bool) error {
			return x.barrier(ctx, fmt.Sprintf("row%d/%v", i, end))
		})
		return err
	}
	bufs := make([][]byte, 64)
	for i := range bufs {
		bufs[i] = make([]byte, eth.MaxFrame())
	}
	sizesIn := make([]int, len(bufs))
	var rows []sinkRow
	for _, size := range sizes {
		for _, batch := range batches {
			i := len(rows)
			if err := x.barrier(ctx, fmt.Sprintf("row%d/false", i)); err != nil {
				return err
			}
			sent := make(chan error, 1)
			go func() { sent <- x.barrier(ctx, fmt.Sprintf("row%d/true", i)) }()
			before, err := eth.Stats()
			if err != nil {
				return err
			}
			got, done := 0, false
			var first, last time.Time
			for {
				wctx, wcancel := context.WithTimeout(ctx, 300*time.Millisecond)
				n, err := eth.RecvWait(wctx, bufs, sizesIn)
				wcancel()
				if err != nil && ctx.Err() != nil {
					return err
				}
				if n > 0 {
					if got == 0 {
						first = time.Now()
					}
					last = time.Now()
					got += n
					continue
				}
				if !done {
					select {
					case err := <-sent:
						if err != nil {
							return err
						}
						done = true
					default:
					}
					continue
				}
				break // sent, and quiet since
			}
			after, err := eth.Stats()
			if err != nil {
				return err
			}
			r := sinkRow{Size: size, Batch: batch, Sent: frames, Received: got, DeviceDrops: after.RxDrops - before.RxDrops}
			r.LinkLost = max(frames-got-int(r.DeviceDrops), 0)
			if el := last.Sub(first); el > 0 {
				r.PPS = float64(got) / el.Seconds()
			}
			rows = append(rows, r)
		}
	}
	if e.json {
		return e.printJSON(rows)
	}
	fmt.Fprintln(e.out, "vmxnet3 receive from the other VM (the bench's switch between them)")
	w := tabwriter.NewWriter(e.out, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "size\tbatch\tsent\treceived\tpackets/s\tdropped by the device\tlost on the link\t")
	for _, r := range rows {
		fmt.Fprintf(w, "%d\t%d\t%d\t%d\t%.0f\t%d\t%d\t\n", r.Size, r.Batch, r.Sent, r.Received, r.PPS, r.DeviceDrops, r.LinkLost)
	}
	return w.Flush()
}

// ethSink counts the frames that arrive and their rate, from the first
// frame to the last.
func ethSink(e *env, eth *vmxnet3.NIC, dur, idle time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), dur)
	defer cancel()
	bufs := make([][]byte, 64)
	for i := range bufs {
		bufs[i] = make([]byte, eth.MaxFrame())
	}
	sizes := make([]int, len(bufs))
	var frames, bytes int
	var first, last time.Time
	for {
		wait := dur
		if frames > 0 {
			wait = idle
		}
		wctx, wcancel := context.WithTimeout(ctx, wait)
		n, err := eth.RecvWait(wctx, bufs, sizes)
		wcancel()
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
				break
			}
			return err
		}
		now := time.Now()
		if frames == 0 {
			first = now
		}
		last = now
		frames += n
		for i := range n {
			bytes += sizes[i]
		}
	}
	st, err := eth.Stats()
	if err != nil {
		return err
	}
	el := last.Sub(first)
	rate := 0.0
	if el > 0 {
		rate = float64(frames) / el.Seconds()
	}
	if e.json {
		return e.printJSON(map[string]any{"frames": frames, "bytes": bytes, "packets_per_s": rate, "device_drops": st.RxDrops, "waits": st.RxWaits})
	}
	fmt.Fprintf(e.out, "received %d frames (%d bytes) in %v: %.0f packets/s; %d dropped by the device for want of buffers; %d sleeps on the receive interrupt\n",
		frames, bytes, el.Round(time.Millisecond), rate, st.RxDrops, st.RxWaits)
	return nil
}
