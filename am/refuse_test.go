//go:build !guest

package am

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
)

// fixedExchanger gathers this task's address with the others' given ones,
// and keeps this task's.
type fixedExchanger struct {
	all  [][]byte // every task's address; this task's slot is filled in
	self int
	mine []byte
}

func (x *fixedExchanger) AllGather(_ context.Context, mine []byte) ([][]byte, error) {
	x.mine = mine
	all := slices.Clone(x.all)
	all[x.self] = mine
	return all, nil
}

// rawPeer is task 1 of a two-task job whose task 0 is a Context: a bare
// RC QP on the same model, connected to the context's QP for task 1, that
// sends whatever packets the test makes. It is a peer that does not
// follow the protocol.
type rawPeer struct {
	c   *Context // task 0
	qp  *vfrdma.QP
	cq  *vfrdma.CQ
	mr  *vfrdma.MR // send area at 0, then the receive buffers
	ctx context.Context
}

// rawRecvs is how many receive buffers the raw peer posts, for the
// context's control packets (acknowledgements, credits).
const rawRecvs = 16

// rawPSN is the raw peer's first send PSN.
const rawPSN = 0x5a5a5a

// newRawPeer makes task 0's context of cfg (Tasks, Self and Exchange set
// here) and the raw peer as its task 1.
func newRawPeer(t *testing.T, cfg Config) *rawPeer {
	t.Helper()
	d := openDevice(t)
	ctx := withTimeout(t, time.Minute) // a hang guard
	p := &rawPeer{ctx: ctx}
	pd, err := d.AllocPD(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { pd.Close() })
	p.cq, err = d.CreateCQ(ctx, 64)
	require.NoError(t, err)
	t.Cleanup(func() { p.cq.Close() })
	p.qp, err = pd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: p.cq, RecvCQ: p.cq, SendDepth: 8, RecvDepth: rawRecvs})
	require.NoError(t, err)
	t.Cleanup(func() { p.qp.Close() })
	size := cfg.PacketSize
	if size == 0 {
		size = DefaultPacketSize
	}
	p.mr, err = pd.AllocMR(ctx, (rawRecvs+2)*size, vfrdma.AccessLocalWrite)
	require.NoError(t, err)
	t.Cleanup(func() { p.mr.Close() })

	gid := d.GID()
	addr := append([]byte(nil), gid[:]...)
	addr = binary.LittleEndian.AppendUint32(addr, rawPSN)     // its first PSN
	addr = binary.LittleEndian.AppendUint32(addr, p.qp.QPN()) // its QP for task 0
	addr = binary.LittleEndian.AppendUint32(addr, 0)          // for itself: none
	x := &fixedExchanger{all: [][]byte{nil, addr}}
	cfg.Tasks, cfg.Self, cfg.Exchange = 2, 0, x
	p.c, err = New(ctx, d, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { p.c.Close() })
	require.NoError(t, p.qp.Connect(ctx, vfrdma.Remote{QPN: addressQPN(x.mine, 1), GID: gid, PSN: addressPSN(x.mine)}, rawPSN))
	wrs := make([]vfrdma.RecvWR, rawRecvs)
	for i := range wrs {
		wrs[i] = vfrdma.RecvWR{WRID: uint64(1 + i), SGEs: []vfrdma.SGE{p.mr.SGE((2+i)*size, size)}}
	}
	_, err = p.qp.PostRecv(wrs, 0)
	require.NoError(t, err)
	return p
}

// send sends packet b to task 0 and returns the status its send completed
// with; the receive completions it meets (the context's control packets)
// are set aside.
func (p *rawPeer) send(t *testing.T, b []byte) vfrdma.WCStatus {
	t.Helper()
	copy(p.mr.Bytes(), b)
	_, err := p.qp.PostSend([]vfrdma.SendWR{{Flags: vfrdma.SendSignaled, SGEs: []vfrdma.SGE{p.mr.SGE(0, len(b))}}}, 0)
	require.NoError(t, err)
	wcs := make([]vfrdma.WC, 8)
	for {
		n, err := p.cq.Poll(wcs)
		require.NoError(t, err)
		for _, wc := range wcs[:n] {
			if wc.WRID == 0 {
				return wc.Status
			}
		}
		select {
		case <-p.ctx.Done():
			require.FailNow(t, "the raw peer's send never completed")
		case <-time.After(time.Millisecond):
		}
	}
}

// purged reports whether task 0 has purged task 1.
func (p *rawPeer) purged() bool {
	p.c.mu.Lock()
	defer p.c.mu.Unlock()
	return p.c.conns[1].err != nil
}

// waitUntil waits for cond, polling; only a hang meets the bound.
func waitUntil(t *testing.T, ctx context.Context, cond func() bool, what string) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			require.FailNow(t, "waited in vain", what)
		case <-time.After(time.Millisecond):
		}
	}
}

// refusedPeer asserts that task 0 refused the raw peer: purged, counted
// once in Stats.Refused, Fence reports the protocol error, and Amsend to
// it says so.
func (p *rawPeer) refused(t *testing.T) {
	t.Helper()
	c := p.c
	assert.EqualValues(t, 1, c.Stats().Refused, "refused and counted")
	err := c.Fence(p.ctx)
	assert.ErrorIs(t, err, ErrPurged)
	assert.ErrorIs(t, err, errProtocol)
	err = c.Amsend(1, 1, nil, nil, Counters{})
	assert.ErrorIs(t, err, ErrPurged)
	assert.ErrorIs(t, err, errProtocol)
}

// A peer's message whose user header is longer than the target's MaxUHdr
// is refused there, as the origin's Amsend refuses its own: the header
// handler does not run, the peer is purged and counted in Stats.Refused.
// A user header of exactly MaxUHdr bytes is taken. (Without the check, a
// 512-byte user header reached a handler of a target whose MaxUHdr is the
// default 256: it fits the packet, and nothing else stopped it.)
func TestAUserHeaderAboveMaxUHdrIsRefusedAndCounted(t *testing.T) {
	for _, past := range []int{DefaultMaxUHdr + 8, 512} {
		t.Run(fmt.Sprintf("%d bytes", past), func(t *testing.T) {
			p := newRawPeer(t, Config{})
			c := p.c
			require.Equal(t, DefaultMaxUHdr, c.MaxUHdr())
			got := make(chan int, 2)
			require.NoError(t, c.SetHandler(1, func(a *Arrival) Return {
				got <- len(a.UHdr)
				return Return{}
			}))
			eager := func(id uint32, uhdr int) []byte {
				return pkt(header{kind: kindEager, handler: 1, uhdrLen: uint16(uhdr), id: id, length: 8}, make([]byte, uhdr+8))
			}
			require.Equal(t, vfrdma.WCSuccess, p.send(t, eager(0, c.MaxUHdr())))
			select {
			case n := <-got:
				assert.Equal(t, c.MaxUHdr(), n, "a user header of exactly MaxUHdr bytes is taken")
			case <-p.ctx.Done():
				require.FailNow(t, "the message at the limit never reached its handler")
			}
			assert.False(t, p.purged())

			require.Equal(t, vfrdma.WCSuccess, p.send(t, eager(1, past)), "the device delivers it: the refusal is the context's")
			waitUntil(t, p.ctx, func() bool { return len(got) > 0 || p.purged() }, "the message over the limit was neither handled nor refused")
			assert.Empty(t, got, "the handler ran with a %d-byte user header", past)
			p.refused(t)
		})
	}
}

// A peer's packet longer than a receive buffer (PacketSize) is refused:
// the receive completes in error (LOC_LEN_ERR), and the peer is purged and
// counted in Stats.Refused as for any packet that does not hold together.
// A packet of exactly PacketSize bytes is taken.
func TestAPacketLongerThanTheReceiveBufferIsRefusedAndCounted(t *testing.T) {
	const size = 256
	p := newRawPeer(t, Config{PacketSize: size})
	c := p.c
	got := make(chan int, 2)
	require.NoError(t, c.SetHandler(1, func(a *Arrival) Return {
		got <- len(a.Data)
		return Return{}
	}))
	eager := func(id uint32, n int) []byte {
		return pkt(header{kind: kindEager, handler: 1, id: id, length: uint64(n)}, make([]byte, n))
	}
	require.Equal(t, vfrdma.WCSuccess, p.send(t, eager(0, size-headerSize)))
	select {
	case n := <-got:
		assert.Equal(t, size-headerSize, n, "a packet of exactly PacketSize bytes is taken")
	case <-p.ctx.Done():
		require.FailNow(t, "the packet at the limit never reached its handler")
	}

	assert.NotEqual(t, vfrdma.WCSuccess, p.send(t, eager(1, size-headerSize+1)), "the target's device refused the packet")
	waitUntil(t, p.ctx, p.purged, "the peer whose packet overran a receive buffer was not purged")
	assert.Empty(t, got)
	p.refused(t)
}

// parse holds a message's user header to the receiver's MaxUHdr: at the
// limit it is taken, one word past it (or the 512 bytes against
// 256) refused, like one that is not whole words.
func TestParseRefusesAUserHeaderAboveTheReceiversMaxUHdr(t *testing.T) {
	const maxUHdr = 256
	var h header
	for _, kind := range []uint8{kindEager, kindFirst} {
		length := uint64(8) // the data in the packet: all of it, or half
		if kind == kindFirst {
			length = 16
		}
		packet := func(uhdr int) []byte {
			return pkt(header{kind: kind, uhdrLen: uint16(uhdr), length: length}, make([]byte, uhdr+8))
		}
		require.NoError(t, h.parse(packet(maxUHdr), 1<<20, maxUHdr), "kind %d at the limit", kind)
		assert.ErrorIs(t, h.parse(packet(maxUHdr+8), 1<<20, maxUHdr), errProtocol, "kind %d, one word past", kind)
		assert.ErrorIs(t, h.parse(packet(512), 1<<20, maxUHdr), errProtocol, "kind %d, 512 bytes", kind)
	}
}
