//go:build !guest

package am

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/event"
)

// hostContext is a Context with no device under it: the packet and
// completion logic (recv, take, sendDone, acked, fail) and the calls'
// lifecycle run on it as they do on the progress goroutine, with the
// packet memory in plain slices. Task i's QPN is i+1 (both directions).
// Nothing is posted: the tests drive what the progress goroutine would.
func hostContext(t testing.TB, cfg Config) *Context {
	t.Helper()
	require.NoError(t, cfg.fill())
	c := &Context{cfg: cfg, byQPN: map[uint32]*conn{}, arrived: map[uint64]int{}, done: make(chan struct{})}
	c.slotSize = cfg.PacketSize
	c.maxAcks = (cfg.PacketSize - headerSize) / ackSize
	c.bufs = cfg.Tasks * cfg.Credits
	c.recvMem = make([]byte, c.bufs*cfg.PacketSize)
	c.sendMem = make([]byte, cfg.sendSlots()*cfg.PacketSize)
	c.busy = make([]bool, cfg.sendSlots())
	for s := range cfg.sendSlots() {
		c.free = append(c.free, int32(s))
	}
	for i := range cfg.Tasks {
		cn := &conn{task: i, credits: cfg.Credits, sent: map[uint32]*outMsg{}}
		c.conns = append(c.conns, cn)
		c.byQPN[uint32(i+1)] = cn
	}
	ws, err := event.NewWaitSet(event.Chan)
	require.NoError(t, err)
	c.ws = ws
	c.stop = func() {}
	close(c.done) // no progress goroutine
	t.Cleanup(func() { c.Close() })
	return c
}

// anyUHdr is a receiver's user header limit that refuses nothing the
// wire's 16-bit field can say: for tests of parse's other checks.
const anyUHdr = 0xffff

// pkt builds a packet: h, then body (user header and data, or acks).
func pkt(h header, body []byte) []byte {
	b := make([]byte, headerSize+len(body))
	h.put(b)
	copy(b[headerSize:], body)
	return b
}

// deliver puts packet b in receive buffer slot and completes it as the
// device would, from task src.
func deliver(c *Context, src, slot int, b []byte) (bool, error) {
	copy(c.recvMem[slot*c.cfg.PacketSize:], b)
	wc := vfrdma.WC{WRID: uint64(slot), Status: vfrdma.WCSuccess, Opcode: vfrdma.WCRecv, ByteLen: uint32(len(b)), QPN: uint32(src + 1)}
	return c.recv(&wc)
}

// barrierUHdr is the user header of barrier e's message.
func barrierUHdr(e uint64) []byte { return binary.LittleEndian.AppendUint64(nil, e) }
