// Package ethhub is the bench's host-only Ethernet link: a learning switch
// that QEMU's stream netdevs connect to over a unix socket
// (`-netdev stream,addr.type=unix,addr.path=...`), one connection per NIC.
// QEMU frames each packet with its length, 4 bytes big-endian. Nothing
// leaves the machine.
//
// The switch is lossless: a port that cannot take a frame holds up the
// sender (QEMU then queues on its side), so what a test sees lost was lost
// in a guest, where the device counts it.
package ethhub

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
)

// MaxFrame bounds the frames the switch passes (a jumbo frame and more).
const MaxFrame = 65535

// Stats counts what the switch did.
type Stats struct {
	Ports     int    // connections so far
	Frames    uint64 // frames received from the ports
	Unicast   uint64 // frames sent to the one port that owns their destination
	Flooded   uint64 // frames sent to every other port (broadcast, multicast, unknown)
	BadFrames uint64 // frames shorter than an Ethernet header (dropped)
}

// Hub is a running switch.
type Hub struct {
	ln   net.Listener
	path string

	mu    sync.Mutex
	ports map[*port]struct{}
	macs  map[[6]byte]*port
	n     int
	wg    sync.WaitGroup

	frames, unicast, flooded, bad atomic.Uint64
}

type port struct {
	c  net.Conn
	mu sync.Mutex // one writer at a time
	w  *bufio.Writer
}

// Listen starts a switch on the unix socket at path.
func Listen(path string) (*Hub, error) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("ethhub: %w", err)
	}
	h := &Hub{ln: ln, path: path, ports: map[*port]struct{}{}, macs: map[[6]byte]*port{}}
	h.wg.Add(1)
	go h.accept()
	return h, nil
}

// Path returns the socket's path.
func (h *Hub) Path() string { return h.path }

func (h *Hub) accept() {
	defer h.wg.Done()
	for {
		c, err := h.ln.Accept()
		if err != nil {
			return
		}
		p := &port{c: c, w: bufio.NewWriterSize(c, 64<<10)}
		h.mu.Lock()
		h.ports[p] = struct{}{}
		h.n++
		h.mu.Unlock()
		h.wg.Add(1)
		go h.serve(p)
	}
}

// serve reads p's frames and forwards each: to the port that last sent
// from its destination MAC, or to every other port.
func (h *Hub) serve(p *port) {
	defer h.wg.Done()
	defer h.drop(p)
	r := bufio.NewReaderSize(p.c, 64<<10)
	var hdr [4]byte
	buf := make([]byte, MaxFrame)
	dirty := map[*port]struct{}{}
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n > MaxFrame {
			return // not a stream netdev: hang up
		}
		f := buf[:n]
		if _, err := io.ReadFull(r, f); err != nil {
			return
		}
		h.frames.Add(1)
		if n < 14 {
			h.bad.Add(1)
			continue
		}
		var dst, src [6]byte
		copy(dst[:], f[0:6])
		copy(src[:], f[6:12])
		h.mu.Lock()
		if src[0]&1 == 0 {
			h.macs[src] = p
		}
		to, known := h.macs[dst]
		var outs []*port
		if known && dst[0]&1 == 0 {
			if to != p {
				outs = append(outs, to)
			}
			h.unicast.Add(1)
		} else {
			for q := range h.ports {
				if q != p {
					outs = append(outs, q)
				}
			}
			h.flooded.Add(1)
		}
		h.mu.Unlock()
		for _, q := range outs {
			q.send(hdr[:], f)
			dirty[q] = struct{}{}
		}
		if r.Buffered() == 0 { // a burst has been passed on: push it out
			for q := range dirty {
				q.flush()
				delete(dirty, q)
			}
		}
	}
}

func (p *port) send(hdr, f []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, _ = p.w.Write(hdr)
	_, _ = p.w.Write(f)
}

func (p *port) flush() {
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.w.Flush()
}

func (h *Hub) drop(p *port) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.ports, p)
	for m, q := range h.macs {
		if q == p {
			delete(h.macs, m)
		}
	}
	_ = p.c.Close()
}

// Stats returns the counters.
func (h *Hub) Stats() Stats {
	h.mu.Lock()
	n := h.n
	h.mu.Unlock()
	return Stats{Ports: n, Frames: h.frames.Load(), Unicast: h.unicast.Load(), Flooded: h.flooded.Load(), BadFrames: h.bad.Load()}
}

// Close stops the switch and hangs up every port.
func (h *Hub) Close() error {
	err := h.ln.Close()
	h.mu.Lock()
	for p := range h.ports {
		_ = p.c.Close()
	}
	h.mu.Unlock()
	h.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
