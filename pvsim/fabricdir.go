package pvsim

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// A fabric across processes: the models of several processes on one host
// join one fabric by naming one directory (JoinFabric). Each process is a
// node of it with a listening Unix socket; a GID bound on a device of a
// node names that node in the directory. A packet for a GID no device of
// this process has goes to the node the directory names, over one stream
// connection per pair of nodes (so each sender's order holds), as a
// length-prefixed frame of the model's own; answers go back on the
// connection the request came on, and so does a notice once the peer's
// device has handled a request (its requester's timer counts it inside
// the model until then, as within one process). Everything a peer process sends is
// checked as it arrives; a stranger is refused at its first bytes. A node
// that dies is a peer gone: its packets stop, its connection closes, and
// RC requesters meet their retry limit as on a cut link.
//
// The directory's layout:
//
//	DIR/node/<name>.sock   a node's listening socket (name: 16 hex digits)
//	DIR/gid/<32 hex>       the name of the node that has the GID bound
//
// Unprivileged: nothing outside DIR is created or read.

// fabricMagic opens every connection: the dialer's first bytes.
var fabricMagic = [8]byte{'p', 'v', 's', 'i', 'm', 'F', 'B', 1}

const (
	// frameHeader is a frame's fixed part after its length (see encode).
	frameHeader = 112
	// maxFrame bounds a frame's length: the header and the largest
	// message the model moves in one packet.
	maxFrame = frameHeader + vmwMaxMsg
	// peerWriteTimeout bounds a write to a peer that does not read (a
	// stopped process): past it the connection is dropped, and with it
	// the packet, as a cut link loses it.
	peerWriteTimeout = 5 * time.Second
	// gidCacheFor is how long a GID's node is trusted without reading the
	// directory again.
	gidCacheFor = 100 * time.Millisecond
)

// ErrFabricFrame is what a peer process's frame that breaks the format is
// refused with (the connection is then closed).
var ErrFabricFrame = errors.New("pvsim: bad fabric frame")

// fabricNet is a Fabric's part across processes.
type fabricNet struct {
	f    *Fabric
	dir  string
	name string // this node's
	ln   *net.UnixListener

	mu     sync.Mutex
	peers  map[string]*peer // dialed, by node name
	conns  map[*peer]struct{}
	cache  map[[16]byte]gidRoute
	closed bool
	wg     sync.WaitGroup

	framesIn, framesOut, refused, undelivered atomic.Int64
}

type gidRoute struct {
	node string
	at   time.Time
}

// peer is one connection to another node: an endpoint answers go to.
type peer struct {
	n    *fabricNet
	node string // the dialed node's name; "" for an accepted connection
	c    net.Conn

	wmu  sync.Mutex
	buf  []byte
	dead atomic.Bool

	// The requests sent to the peer that its device has not handled yet,
	// each holding its requester QP's inModel count up (so the requester's
	// timer knows a slow peer from a loss, as within one process); the
	// peer's notice (a pktHandled frame) or the connection's end lets it
	// go.
	pmu     sync.Mutex
	pending map[uint64]modelCount
	token   uint64
}

// pktHandled is a frame of the fabric across processes only: the peer
// handled the request whose token it names (ran it, or dropped it).
const pktHandled = pktAtomicResp + 1

// remoteCount is a request's requester count in another process: the
// receiving device's handling of the request (its last Add, negative)
// sends the notice that counts it out there.
type remoteCount struct {
	p     *peer
	token uint64
	done  atomic.Bool
}

func (r *remoteCount) Add(delta int64) int64 {
	if delta < 0 && r.done.CompareAndSwap(false, true) {
		r.p.notice(r.token)
	}
	return 0
}

// notice tells the peer its request token was handled.
func (p *peer) notice(token uint64) {
	p.send(&packet{kind: pktHandled, orig: 0}, token)
}

// settle counts out the request token names (0: every one pending, as the
// connection ends).
func (p *peer) settle(token uint64) {
	p.pmu.Lock()
	var out []modelCount
	if token == 0 {
		for _, c := range p.pending {
			out = append(out, c)
		}
		p.pending = nil
	} else if c, ok := p.pending[token]; ok {
		out = append(out, c)
		delete(p.pending, token)
	}
	p.pmu.Unlock()
	for _, c := range out {
		c.Add(-1)
	}
}

// JoinFabric returns a fabric whose devices reach, besides each other,
// the devices of every process that joined the same directory dir (made
// if missing). Close leaves it. The socket path (dir/node/<16 hex>.sock)
// must fit a Unix socket address (107 bytes): a short dir, such as one
// under /tmp, is best.
func JoinFabric(dir string) (*Fabric, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("pvsim: fabric directory: %w", err)
	}
	for _, sub := range []string{"node", "gid"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, fmt.Errorf("pvsim: fabric directory: %w", err)
		}
	}
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, fmt.Errorf("pvsim: fabric node name: %w", err)
	}
	name := hex.EncodeToString(id[:])
	sock := nodeSocket(dir, name)
	if len(sock) > 107 {
		return nil, fmt.Errorf("pvsim: fabric directory %s: the socket path %s is %d bytes, a Unix socket takes 107: use a shorter directory", dir, sock, len(sock))
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("pvsim: fabric directory %s: %w", dir, err)
	}
	ln.SetUnlinkOnClose(true)
	f := NewFabric()
	f.net = &fabricNet{f: f, dir: dir, name: name, ln: ln,
		peers: map[string]*peer{}, conns: map[*peer]struct{}{}, cache: map[[16]byte]gidRoute{}}
	f.net.wg.Add(1)
	go f.net.accept()
	return f, nil
}

func nodeSocket(dir, name string) string { return filepath.Join(dir, "node", name+".sock") }

func gidFile(dir string, g [16]byte) string {
	return filepath.Join(dir, "gid", hex.EncodeToString(g[:]))
}

// Close leaves the directory of a fabric JoinFabric returned: the node's
// socket and the GIDs it named go, its connections close, and its
// goroutines end before Close returns. Devices on it still reach each
// other. A Fabric from NewFabric needs no closing (Close returns nil).
func (f *Fabric) Close() error {
	n := f.net
	if n == nil {
		return nil
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	conns := make([]*peer, 0, len(n.conns))
	for p := range n.conns {
		conns = append(conns, p)
	}
	n.mu.Unlock()
	err := n.ln.Close()
	for _, p := range conns {
		p.close()
	}
	f.mu.RLock()
	for g := range f.gids {
		n.unpublish(g)
	}
	f.mu.RUnlock()
	n.wg.Wait()
	return err
}

// Dir returns the directory of a fabric JoinFabric returned, "" for one
// of this process only.
func (f *Fabric) Dir() string {
	if f.net == nil {
		return ""
	}
	return f.net.dir
}

// publish names this node as g's in the directory.
func (n *fabricNet) publish(g [16]byte) {
	path := gidFile(n.dir, g)
	tmp := path + "." + n.name
	if os.WriteFile(tmp, []byte(n.name+"\n"), 0o644) == nil {
		_ = os.Rename(tmp, path)
	}
}

// unpublish removes g's entry if it still names this node.
func (n *fabricNet) unpublish(g [16]byte) {
	path := gidFile(n.dir, g)
	if b, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(b)) == n.name {
		_ = os.Remove(path)
	}
}

// route returns the peer that has g, or nil.
func (n *fabricNet) route(g [16]byte) *peer {
	now := time.Now()
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	r, ok := n.cache[g]
	n.mu.Unlock()
	if !ok || now.Sub(r.at) > gidCacheFor {
		b, err := os.ReadFile(gidFile(n.dir, g))
		if err != nil {
			return nil
		}
		r = gidRoute{node: strings.TrimSpace(string(b)), at: now}
		if !validNodeName(r.node) || r.node == n.name {
			return nil
		}
		n.mu.Lock()
		n.cache[g] = r
		n.mu.Unlock()
	}
	return n.dial(r.node)
}

func validNodeName(s string) bool {
	if len(s) != 16 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// dial returns the connection to node, made if there is none.
func (n *fabricNet) dial(node string) *peer {
	n.mu.Lock()
	if p := n.peers[node]; p != nil && !p.dead.Load() {
		n.mu.Unlock()
		return p
	}
	n.mu.Unlock()
	c, err := net.DialTimeout("unix", nodeSocket(n.dir, node), time.Second)
	if err != nil {
		return nil
	}
	if _, err := c.Write(fabricMagic[:]); err != nil {
		c.Close()
		return nil
	}
	p := &peer{n: n, node: node, c: c}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		c.Close()
		return nil
	}
	if old := n.peers[node]; old != nil && !old.dead.Load() {
		n.mu.Unlock()
		c.Close() // another goroutine dialed first
		return old
	}
	n.peers[node] = p
	n.conns[p] = struct{}{}
	n.wg.Add(1)
	n.mu.Unlock()
	go p.read()
	return p
}

func (n *fabricNet) accept() {
	defer n.wg.Done()
	for {
		c, err := n.ln.Accept()
		if err != nil {
			return
		}
		p := &peer{n: n, c: c}
		n.mu.Lock()
		if n.closed {
			n.mu.Unlock()
			c.Close()
			return
		}
		n.conns[p] = struct{}{}
		n.wg.Add(1)
		n.mu.Unlock()
		go p.read()
	}
}

func (p *peer) close() {
	p.dead.Store(true)
	p.c.Close()
}

// gone forgets a connection that closed or broke.
func (p *peer) gone() {
	p.close()
	p.settle(0)
	n := p.n
	n.mu.Lock()
	delete(n.conns, p)
	if p.node != "" && n.peers[p.node] == p {
		delete(n.peers, p.node)
	}
	n.mu.Unlock()
}

// read takes frames from the connection until it ends: an accepted one
// must open with the magic. A frame that breaks the format ends the
// connection.
func (p *peer) read() {
	defer p.n.wg.Done()
	defer p.gone()
	r := bufio.NewReaderSize(p.c, 64<<10)
	if p.node == "" {
		var m [8]byte
		if _, err := io.ReadFull(r, m[:]); err != nil || m != fabricMagic {
			p.n.refused.Add(1)
			return
		}
	}
	for {
		pkt, err := readFrame(r)
		if err != nil {
			var cut *net.OpError // a peer process that died mid-frame
			if errors.Is(err, ErrFabricFrame) && !errors.As(err, &cut) && !p.dead.Load() {
				p.n.refused.Add(1)
			}
			return
		}
		p.n.framesIn.Add(1)
		if pkt.kind == pktHandled {
			p.settle(pkt.token)
			continue
		}
		if pkt.token != 0 {
			pkt.inModel = &remoteCount{p: p, token: pkt.token}
		}
		// Requests name their target's GID; answers the requester's.
		pkt.from = p
		if t := p.n.f.Lookup(pkt.dstGID); t == nil || !t.push(event{kind: evPacket, pkt: pkt}) {
			p.n.undelivered.Add(1)
			if pkt.inModel != nil {
				pkt.inModel.Add(-1) // dropped here: the requester's notice
			}
		}
	}
}

// push sends ev's packet to the peer: the endpoint's side of a packet
// from another process (answers), and the route of a packet to one.
func (p *peer) push(ev event) bool {
	if ev.pkt == nil || p.dead.Load() {
		return false
	}
	var token uint64
	if c := ev.pkt.inModel; c != nil && isRequest(ev.pkt) {
		p.pmu.Lock()
		p.token++
		token = p.token
		if p.pending == nil {
			p.pending = map[uint64]modelCount{}
		}
		p.pending[token] = c
		p.pmu.Unlock()
		c.Add(1)
	}
	if !p.send(ev.pkt, token) {
		if token != 0 {
			p.settle(token)
		}
		return false
	}
	return true
}

// isRequest reports an RC request (what a requester's timer waits on).
func isRequest(pkt *packet) bool {
	switch pkt.kind {
	case pktSend, pktWrite, pktRead, pktAtomic:
		return !pkt.ud
	}
	return false
}

// send writes pkt's frame, with token, to the peer.
func (p *peer) send(pkt *packet, token uint64) bool {
	if p.dead.Load() {
		return false
	}
	p.wmu.Lock()
	p.buf = encodeFrame(p.buf[:0], pkt, token)
	_ = p.c.SetWriteDeadline(time.Now().Add(peerWriteTimeout))
	_, err := p.c.Write(p.buf)
	if cap(p.buf) > 1<<20 {
		p.buf = nil // a large message's buffer is not kept
	}
	p.wmu.Unlock()
	if err != nil {
		p.gone()
		return false
	}
	p.n.framesOut.Add(1)
	return true
}

// Frame flags.
const (
	fUD = 1 << iota
	fWithImm
	fSolicited
	fFetchAdd
)

// encodeFrame appends p's frame: a little-endian u32 length of what
// follows, the fixed header, the payload.
func encodeFrame(b []byte, p *packet, token uint64) []byte {
	var h [4 + frameHeader]byte
	le := binary.LittleEndian
	le.PutUint32(h[0:], uint32(frameHeader+len(p.payload)))
	x := h[4:]
	x[0] = byte(p.kind)
	var fl byte
	if p.ud {
		fl |= fUD
	}
	if p.withImm {
		fl |= fWithImm
	}
	if p.solicited {
		fl |= fSolicited
	}
	if p.fetchAdd {
		fl |= fFetchAdd
	}
	x[1] = fl
	x[2] = p.gidType
	x[3] = byte(p.nak)
	copy(x[4:20], p.srcGID[:])
	copy(x[20:36], p.dstGID[:])
	le.PutUint32(x[36:], p.srcQPN)
	le.PutUint32(x[40:], p.dstQPN)
	le.PutUint32(x[44:], p.psn)
	le.PutUint32(x[48:], p.imm)
	le.PutUint64(x[52:], p.raddr)
	le.PutUint32(x[60:], p.rkey)
	le.PutUint32(x[64:], p.length)
	le.PutUint64(x[68:], p.cmp)
	le.PutUint64(x[76:], p.swap)
	le.PutUint32(x[84:], p.qkey)
	x[88] = p.tclass
	x[89] = p.hopLimit
	x[90] = p.rnrTimer
	le.PutUint32(x[92:], p.flow)
	le.PutUint64(x[96:], p.orig)
	le.PutUint64(x[104:], token)
	b = append(b, h[:]...)
	return append(b, p.payload...)
}

// readFrame reads and checks one frame.
func readFrame(r io.Reader) (*packet, error) {
	var h [4 + frameHeader]byte
	if _, err := io.ReadFull(r, h[:4]); err != nil {
		return nil, err
	}
	le := binary.LittleEndian
	size := le.Uint32(h[:4])
	if size < frameHeader || uint64(size) > maxFrame {
		return nil, fmt.Errorf("%w: length %d", ErrFabricFrame, size)
	}
	if _, err := io.ReadFull(r, h[4:]); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrFabricFrame, err)
	}
	p, err := decodeHeader(h[4:])
	if err != nil {
		return nil, err
	}
	if n := int64(size) - frameHeader; n > 0 {
		// Read as it arrives: a length alone does not make the reader
		// allocate it.
		var buf []byte
		if n <= 1<<20 {
			buf = make([]byte, n)
			if _, err := io.ReadFull(r, buf); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrFabricFrame, err)
			}
		} else {
			var w growBuf
			if _, err := io.CopyN(&w, r, n); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrFabricFrame, err)
			}
			buf = w.b
		}
		p.payload = buf
	}
	return p, nil
}

type growBuf struct{ b []byte }

func (w *growBuf) Write(p []byte) (int, error) { w.b = append(w.b, p...); return len(p), nil }

// decodeHeader checks every field of a frame's header.
func decodeHeader(x []byte) (*packet, error) {
	le := binary.LittleEndian
	p := &packet{kind: pktKind(x[0]), gidType: x[2], nak: nakKind(x[3])}
	if p.kind > pktHandled {
		return nil, fmt.Errorf("%w: kind %d", ErrFabricFrame, x[0])
	}
	fl := x[1]
	if fl&^(fUD|fWithImm|fSolicited|fFetchAdd) != 0 {
		return nil, fmt.Errorf("%w: flags %#x", ErrFabricFrame, fl)
	}
	p.ud, p.withImm, p.solicited, p.fetchAdd = fl&fUD != 0, fl&fWithImm != 0, fl&fSolicited != 0, fl&fFetchAdd != 0
	if p.nak > nakRemOp || p.nak != 0 && p.kind != pktNak {
		return nil, fmt.Errorf("%w: NAK %d on a packet of kind %d", ErrFabricFrame, x[3], x[0])
	}
	if p.ud && p.kind != pktSend {
		return nil, fmt.Errorf("%w: a datagram of kind %d", ErrFabricFrame, x[0])
	}
	copy(p.srcGID[:], x[4:20])
	copy(p.dstGID[:], x[20:36])
	p.srcQPN, p.dstQPN, p.psn = le.Uint32(x[36:]), le.Uint32(x[40:]), le.Uint32(x[44:])
	if p.srcQPN > 1<<24-1 || p.dstQPN > 1<<24-1 {
		return nil, fmt.Errorf("%w: QPN %#x or %#x past 24 bits", ErrFabricFrame, p.srcQPN, p.dstQPN)
	}
	if p.psn > psnMask {
		return nil, fmt.Errorf("%w: PSN %#x past 24 bits", ErrFabricFrame, p.psn)
	}
	p.imm = le.Uint32(x[48:])
	p.raddr, p.rkey, p.length = le.Uint64(x[52:]), le.Uint32(x[60:]), le.Uint32(x[64:])
	if p.length > vmwMaxMsg {
		return nil, fmt.Errorf("%w: length %d", ErrFabricFrame, p.length)
	}
	p.cmp, p.swap, p.qkey = le.Uint64(x[68:]), le.Uint64(x[76:]), le.Uint32(x[84:])
	p.tclass, p.hopLimit, p.rnrTimer = x[88], x[89], x[90]
	if p.rnrTimer > 31 {
		return nil, fmt.Errorf("%w: RNR timer %d", ErrFabricFrame, p.rnrTimer)
	}
	if x[91] != 0 {
		return nil, fmt.Errorf("%w: reserved byte %#x", ErrFabricFrame, x[91])
	}
	p.flow = le.Uint32(x[92:])
	if p.flow > 1<<20-1 {
		return nil, fmt.Errorf("%w: flow label %#x past 20 bits", ErrFabricFrame, p.flow)
	}
	p.orig = le.Uint64(x[96:])
	p.token = le.Uint64(x[104:])
	if p.kind == pktHandled && p.token == 0 {
		return nil, fmt.Errorf("%w: a notice with no token", ErrFabricFrame)
	}
	return p, nil
}

// FabricNetStats counts a cross-process fabric's traffic.
type FabricNetStats struct {
	FramesIn, FramesOut int64
	// Refused counts connections ended by what a peer sent: no magic, a
	// frame that breaks the format.
	Refused int64
	// Undelivered counts frames for a GID no device of this process has
	// (any more).
	Undelivered int64
	// Peers is the number of open connections.
	Peers int
}

// NetStats returns the cross-process counters of a fabric JoinFabric
// returned (zero for one of this process only).
func (f *Fabric) NetStats() FabricNetStats {
	n := f.net
	if n == nil {
		return FabricNetStats{}
	}
	n.mu.Lock()
	peers := len(n.conns)
	n.mu.Unlock()
	return FabricNetStats{FramesIn: n.framesIn.Load(), FramesOut: n.framesOut.Load(), Refused: n.refused.Load(), Undelivered: n.undelivered.Load(), Peers: peers}
}
