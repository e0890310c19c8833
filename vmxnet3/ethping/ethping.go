// Package ethping is an ARP and ICMP echo client and responder over a
// frame interface (a vmxnet3.NIC): enough IPv4 to ask a host on the link
// for its MAC, ping it, and answer both, as `pvctl eth ping` and the
// in-guest tests do. It allocates per call, not per frame.
package ethping

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"
)

// Link is what ethping needs of a NIC.
type Link interface {
	Send(frames [][]byte) (int, error)
	RecvWait(ctx context.Context, bufs [][]byte, sizes []int) (int, error)
	MAC() net.HardwareAddr
	MaxFrame() int
}

const (
	etherARP  = 0x0806
	etherIPv4 = 0x0800
	protoICMP = 1
	icmpEcho  = 8
	icmpReply = 0
)

var broadcast = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// ErrTimeout reports no answer in time.
var ErrTimeout = errors.New("ethping: no answer")

// Host is one IPv4 address on a link.
type Host struct {
	L  Link
	IP netip.Addr // ours
	// Other reports, if set, each received frame the host did not use
	// (not an answer it waited for, not a request it answered).
	Other func(frame []byte)
	// Answered counts requests this host answered while it waited.
	Answered int

	bufs  [][]byte
	sizes []int
}

func (h *Host) init() {
	if h.bufs == nil {
		h.bufs = make([][]byte, 32)
		for i := range h.bufs {
			h.bufs[i] = make([]byte, h.L.MaxFrame())
		}
		h.sizes = make([]int, len(h.bufs))
	}
}

// Resolve asks the link who has ip (ARP), resending every interval, until
// ctx is done.
func (h *Host) Resolve(ctx context.Context, ip netip.Addr) (net.HardwareAddr, error) {
	req := arpFrame(1, h.L.MAC(), h.IP, broadcast, ip)
	var mac net.HardwareAddr
	err := h.exchange(ctx, req, func(f []byte) bool {
		if op, sha, spa, _, tpa, ok := parseARP(f); ok && op == 2 && spa == ip && tpa == h.IP {
			mac = sha
			return true
		}
		return false
	})
	if err != nil {
		return nil, fmt.Errorf("ARP who-has %v: %w", ip, err)
	}
	return mac, nil
}

// Ping sends one ICMP echo request with payload to ip at mac and waits for
// its reply, whose payload must be the same; it returns the round trip.
func (h *Host) Ping(ctx context.Context, mac net.HardwareAddr, ip netip.Addr, id, seq uint16, payload []byte) (time.Duration, error) {
	req := icmpFrame(h.L.MAC(), h.IP, mac, ip, icmpEcho, id, seq, payload)
	t0 := time.Now()
	var bad error
	err := h.exchange(ctx, req, func(f []byte) bool {
		typ, rid, rseq, src, data, ok := parseICMP(f)
		if !ok || typ != icmpReply || src != ip || rid != id || rseq != seq {
			return false
		}
		if !bytes.Equal(data, payload) {
			bad = fmt.Errorf("echo reply %d from %v: %d bytes differ from the %d sent", seq, ip, len(data), len(payload))
		}
		return true
	})
	if err != nil {
		return 0, fmt.Errorf("ping %v seq %d: %w", ip, seq, err)
	}
	return time.Since(t0), bad
}

// Serve answers ARP requests for the host's IP and ICMP echo requests to
// it until ctx is done, and returns how many it answered.
func (h *Host) Serve(ctx context.Context) (int, error) {
	h.init()
	for {
		n, err := h.L.RecvWait(ctx, h.bufs, h.sizes)
		if err != nil {
			if ctx.Err() != nil || expired(err) {
				return h.Answered, nil
			}
			return h.Answered, err
		}
		for i := range n {
			if err := h.handle(h.bufs[i][:h.sizes[i]]); err != nil {
				return h.Answered, err
			}
		}
	}
}

// handle answers f if it is a request for this host, else hands it to
// Other.
func (h *Host) handle(f []byte) error {
	var reply []byte
	if op, sha, spa, _, tpa, ok := parseARP(f); ok && op == 1 && tpa == h.IP {
		reply = arpFrame(2, h.L.MAC(), h.IP, sha, spa)
	} else if typ, id, seq, src, data, ok := parseICMP(f); ok && typ == icmpEcho && dstIP(f) == h.IP {
		reply = icmpFrame(h.L.MAC(), h.IP, net.HardwareAddr(f[6:12]), src, icmpReply, id, seq, data)
	}
	if reply == nil {
		if h.Other != nil {
			h.Other(f)
		}
		return nil
	}
	if _, err := h.L.Send([][]byte{reply}); err != nil {
		return err
	}
	h.Answered++
	return nil
}

// exchange sends req, then waits for a frame match accepts, resending req
// every 200 ms, and answers requests for this host meanwhile.
func (h *Host) exchange(ctx context.Context, req []byte, match func([]byte) bool) error {
	h.init()
	for {
		if _, err := h.L.Send([][]byte{req}); err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		for {
			n, err := h.L.RecvWait(wctx, h.bufs, h.sizes)
			if err != nil {
				cancel()
				if ctx.Err() != nil {
					return fmt.Errorf("%w: %v", ErrTimeout, ctx.Err())
				}
				if wctx.Err() != nil || expired(err) {
					break // resend
				}
				return err
			}
			for i := range n {
				f := h.bufs[i][:h.sizes[i]]
				if match(f) {
					cancel()
					return nil
				}
				if err := h.handle(f); err != nil {
					cancel()
					return err
				}
			}
		}
	}
}

// expired reports a wait that ended with its context (the interrupt's
// deadline may fire a moment before the context says so).
func expired(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

func ether(dst, src net.HardwareAddr, typ uint16, payload int) []byte {
	f := make([]byte, 14+payload)
	copy(f[0:6], dst)
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:], typ)
	return f
}

func arpFrame(op uint16, sha net.HardwareAddr, spa netip.Addr, tha net.HardwareAddr, tpa netip.Addr) []byte {
	dst := tha
	if op == 1 {
		dst = broadcast
	}
	f := ether(dst, sha, etherARP, 28)
	a := f[14:]
	binary.BigEndian.PutUint16(a[0:], 1)         // Ethernet
	binary.BigEndian.PutUint16(a[2:], etherIPv4) // IPv4
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:], op)
	copy(a[8:14], sha)
	s4 := spa.As4()
	copy(a[14:18], s4[:])
	if op == 2 {
		copy(a[18:24], tha)
	}
	t4 := tpa.As4()
	copy(a[24:28], t4[:])
	return f
}

func parseARP(f []byte) (op uint16, sha net.HardwareAddr, spa netip.Addr, tha net.HardwareAddr, tpa netip.Addr, ok bool) {
	if len(f) < 42 || binary.BigEndian.Uint16(f[12:]) != etherARP {
		return
	}
	a := f[14:]
	if binary.BigEndian.Uint16(a[0:]) != 1 || binary.BigEndian.Uint16(a[2:]) != etherIPv4 || a[4] != 6 || a[5] != 4 {
		return
	}
	return binary.BigEndian.Uint16(a[6:]), append(net.HardwareAddr(nil), a[8:14]...), netip.AddrFrom4([4]byte(a[14:18])),
		append(net.HardwareAddr(nil), a[18:24]...), netip.AddrFrom4([4]byte(a[24:28])), true
}

func icmpFrame(src net.HardwareAddr, sip netip.Addr, dst net.HardwareAddr, dip netip.Addr, typ uint8, id, seq uint16, data []byte) []byte {
	f := ether(dst, src, etherIPv4, 20+8+len(data))
	ip := f[14:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(data)))
	ip[8] = 64 // TTL
	ip[9] = protoICMP
	s4, d4 := sip.As4(), dip.As4()
	copy(ip[12:16], s4[:])
	copy(ip[16:20], d4[:])
	binary.BigEndian.PutUint16(ip[10:], checksum(ip[:20]))
	ic := ip[20:]
	ic[0] = typ
	binary.BigEndian.PutUint16(ic[4:], id)
	binary.BigEndian.PutUint16(ic[6:], seq)
	copy(ic[8:], data)
	binary.BigEndian.PutUint16(ic[2:], checksum(ic))
	return f
}

// parseICMP reads an ICMP echo or reply, checking both checksums; data is
// the payload (within the IP length: frames are padded to 60 bytes).
func parseICMP(f []byte) (typ uint8, id, seq uint16, src netip.Addr, data []byte, ok bool) {
	if len(f) < 14+20+8 || binary.BigEndian.Uint16(f[12:]) != etherIPv4 {
		return
	}
	ip := f[14:]
	ihl := int(ip[0]&0xf) * 4
	total := int(binary.BigEndian.Uint16(ip[2:]))
	if ip[0]>>4 != 4 || ihl < 20 || total < ihl+8 || total > len(ip) || ip[9] != protoICMP || checksum(ip[:ihl]) != 0 {
		return
	}
	ic := ip[ihl:total]
	if checksum(ic) != 0 {
		return
	}
	return ic[0], binary.BigEndian.Uint16(ic[4:]), binary.BigEndian.Uint16(ic[6:]), netip.AddrFrom4([4]byte(ip[12:16])), ic[8:], true
}

func dstIP(f []byte) netip.Addr { return netip.AddrFrom4([4]byte(f[14+16 : 14+20])) }

// checksum is the Internet checksum of b (0 over a block that holds its
// own correct checksum).
func checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}
