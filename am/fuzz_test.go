//go:build !guest

package am

import (
	"bytes"
	"encoding/binary"
	"github.com/stretchr/testify/require"
	"testing"

	"github.com/vfrdma/vfrdma"
)

// FuzzParse: no packet panics parse, and what it accepts holds together:
// the user header within the body and the receiver's maximum, a fragment
// within its message, the acks filling the body; and it re-encodes to the
// same header.
func FuzzParse(f *testing.F) {
	f.Add(pkt(header{kind: kindFirst, handler: 1, uhdrLen: 8, length: 300}, make([]byte, 108)))
	f.Add(pkt(header{kind: kindFrag, length: 5000, offset: 100}, make([]byte, 200)))
	f.Add(pkt(header{kind: kindFrag, length: 100, offset: ^uint64(0) - 5}, make([]byte, 20)))
	f.Add(pkt(header{kind: kindCtrl, length: 1 << 62}, nil))
	f.Add(pkt(header{kind: kindEager, handler: 2, uhdrLen: 16, length: 4}, make([]byte, 20)))
	const maxMessage, maxUHdr = 1 << 20, 64
	f.Fuzz(func(t *testing.T, b []byte) {
		var h header
		if h.parse(b, maxMessage, maxUHdr) != nil {
			return
		}
		body := uint64(len(b) - headerSize)
		switch h.kind {
		case kindEager, kindFirst:
			if uint64(h.uhdrLen) > body || h.uhdrLen > maxUHdr || h.length > maxMessage {
				require.Failf(t, "broken", "accepted %+v with a %d-byte body", h, body)
			}
		case kindFrag:
			if body == 0 || h.offset > h.length || body > h.length-h.offset || h.length > maxMessage {
				require.Failf(t, "broken", "accepted fragment %+v with a %d-byte body", h, body)
			}
		case kindCtrl:
			if h.length*4 != body || h.length > body {
				require.Failf(t, "broken", "accepted ctrl %+v with a %d-byte body", h, body)
			}
		default:
			require.Failf(t, "broken", "accepted kind %d", h.kind)
		}
		out := make([]byte, headerSize)
		h.put(out)
		if !bytes.Equal(out, b[:headerSize]) {
			require.Failf(t, "broken", "%+v re-encodes to %x, not %x", h, out, b[:headerSize])
		}
	})
}

// script encodes packets for FuzzReassembly: per packet, the sending task
// (a byte), the length the device reports (u16), then the bytes.
func script(pkts ...[]byte) []byte {
	var s []byte
	for _, p := range pkts {
		s = append(s, 1)
		s = binary.LittleEndian.AppendUint16(s, uint16(len(p)))
		s = append(s, p...)
	}
	return s
}

// FuzzReassembly drives a context's receive path (recv: the completion's
// checks; take: parse, checks against the reassembly, handlers, acks,
// credits) with a stream of packets from two peers: nothing panics, and
// whatever it took leaves a consistent state: a message being reassembled
// has a buffer of its length unless dropped and is not complete, no task
// holds more credits than the configuration gives, and only refused tasks
// are purged.
func FuzzReassembly(f *testing.F) {
	// The case: a fragment whose length disagrees with its
	// message, then the next fragment.
	f.Add(script(
		pkt(header{kind: kindFirst, handler: 1, uhdrLen: 8, length: 300}, make([]byte, 108)),
		pkt(header{kind: kindFrag, length: 5000, offset: 100}, make([]byte, 200)),
		pkt(header{kind: kindFrag, length: 5000, offset: 300}, make([]byte, 200)),
	))
	f.Add(script(
		pkt(header{kind: kindFirst, handler: 1, uhdrLen: 8, length: 300}, make([]byte, 108)),
		pkt(header{kind: kindFirst, handler: 2, uhdrLen: 8, length: 400}, make([]byte, 108)),
		pkt(header{kind: kindFrag, length: 300, offset: 100}, make([]byte, 200)),
		pkt(header{kind: kindFrag, length: 400, offset: 100}, make([]byte, 200)),
		pkt(header{kind: kindCtrl, credits: 1, length: 1}, []byte{0, 0, 0, 0}),
		pkt(header{kind: kindEager, handler: barrierHandler, uhdrLen: 8, id: 1}, barrierUHdr(1)),
	))
	f.Add(script(pkt(header{kind: kindFirst, handler: barrierHandler, uhdrLen: 8, length: 400}, make([]byte, 108)),
		pkt(header{kind: kindFrag, length: 400, offset: 100}, make([]byte, 200))))
	f.Fuzz(func(t *testing.T, s []byte) {
		c := hostContext(t, Config{Tasks: 3, PacketSize: 256, Credits: 4, MaxMessage: 1 << 14})
		for h := range 4 {
			_ = c.SetHandler(h, func(a *Arrival) Return {
				switch {
				case len(a.UHdr) > 0 && a.UHdr[0] == 1:
					return Return{} // no buffer
				case len(a.UHdr) > 0 && a.UHdr[0] == 2:
					return Return{Buf: make([]byte, a.Len/2)} // short
				}
				return Return{Buf: make([]byte, a.Len), Inline: true, Completion: func() {}}
			})
		}
		refused := uint64(0)
		for slot := 0; len(s) >= 3; slot++ {
			src := int(s[0]) % c.cfg.Tasks
			n := int(binary.LittleEndian.Uint16(s[1:]))
			s = s[3:]
			b := s[:min(n, len(s))]
			s = s[len(b):]
			slot := slot % c.bufs
			copy(c.recvMem[slot*c.cfg.PacketSize:(slot+1)*c.cfg.PacketSize], b)
			wc := vfrdma.WC{WRID: uint64(slot), Status: vfrdma.WCSuccess, Opcode: vfrdma.WCRecv, ByteLen: uint32(n), QPN: uint32(src + 1)}
			if _, err := c.recv(&wc); err != nil {
				require.Failf(t, "broken", "a peer's packet stopped the context: %v", err)
			}
			st := c.Stats()
			if st.Refused < refused {
				require.Failf(t, "broken", "Refused went back: %d after %d", st.Refused, refused)
			}
			refused = st.Refused
			purged := uint64(0)
			for _, cn := range c.conns {
				if cn.err != nil {
					purged++
				}
				if cn.credits > c.cfg.Credits {
					require.Failf(t, "broken", "task %d: %d credits of %d", cn.task, cn.credits, c.cfg.Credits)
				}
				if m := cn.rx; m != nil {
					if m.got >= m.length {
						require.Failf(t, "broken", "task %d: message %d complete (%d of %d) and still reassembled", cn.task, m.id, m.got, m.length)
					}
					if !m.drop && uint64(len(m.ret.Buf)) < m.length {
						require.Failf(t, "broken", "task %d: message %d of %d bytes into a %d-byte buffer", cn.task, m.id, m.length, len(m.ret.Buf))
					}
				}
			}
			if purged != refused {
				require.Failf(t, "broken", "%d tasks purged, %d refused", purged, refused)
			}
		}
	})
}
