//go:build !guest

package am_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/connect"
	"github.com/vfrdma/vfrdma/firmware"
)

// cellKind is the traffic a verbs cell carries.
type cellKind int

const (
	cellRC  cellKind = iota // RC QP pairs between two devices (or one): every opcode
	cellSRQ                 // RC QPs receiving from one SRQ, posted to from two goroutines
	cellUD                  // a UD QP on each device, datagrams to every other
)

var cellNames = [...]string{"RC", "SRQ", "UD"}

func (k cellKind) String() string { return cellNames[k] }

// The layout of a side's MR: a read-only pattern that sends and READs
// take their bytes from, receive buffers, READ landing slots,
// fetch-and-add result slots, the counters peers add to, and where peers'
// RDMA WRITEs land.
const (
	mrSize     = 128 << 10
	patLen     = 4096
	maxPayload = 256
	rxBuf      = 320 // a UD receive's 40 bytes of header room and the payload
	rxOff      = 4096
	rdOff      = 88 << 10
	rdSlots    = 8
	faaOff     = 96 << 10
	faaSlots   = 128
	ctrOff     = 100 << 10
	wrOff      = 104 << 10
	qkey       = 0x50a4
	maxQPs     = 4 // per side
	rqDepth    = 32
	// rxBufs is a QP's receive buffers: twice its receive queue, so that a
	// buffer is posted again only once the poller has looked at the
	// completion that freed it (one poll takes at most 32, and the queue
	// takes more only as polls free its slots).
	rxBufs   = 2 * rqDepth
	srqDepth = 64
	srqMax   = 128
)

// pattern is what every MR's first patLen bytes hold.
var pattern = func() []byte {
	b := make([]byte, patLen)
	for i := range b {
		b[i] = byte(i*7 + i>>8 + 0x5a)
	}
	return b
}()

// cell is one set of objects and its traffic, from set-up to checks.
type cell struct {
	s     *soak
	kind  cellKind
	nodes []*node
	sides []*side
	qps   []*cqp
	srq   *srqCell // cellSRQ

	stopPost, stopPoll chan struct{}
	posters, pollers   sync.WaitGroup

	mu      sync.Mutex
	wrs     map[uint64]*wrec
	sentImm map[uint32]*wrec // the send that carries each immediate value
	rxImm   map[uint32]int   // arrivals of each immediate value
}

// side is a cell's objects on one device.
type side struct {
	n      *node
	d      *vfrdma.Device
	pd     *vfrdma.PD
	cq     *vfrdma.CQ
	mr     *vfrdma.MR
	mem    []byte
	ahs    map[*side]*vfrdma.AH // UD: to each side
	failed atomic.Bool          // Poll reported the CQ failed (overrun, DEVICE_FATAL)
	// overflowed: the injector overflowed the CQ. A CQ that fails with
	// ErrCQOverrun without it took another object's CQ_ERR: a failure.
	overflowed atomic.Bool
	dead       atomic.Bool // the node raised DEVICE_FATAL while the cell lived
	nQP        int
}

// lost reports whether completions on the side may have been lost.
func (sd *side) lost() bool { return sd.failed.Load() || sd.dead.Load() || sd.n.dead.Load() }

// cqp is a cell's QP.
type cqp struct {
	idx    int // in cell.qps: the immediate values' top byte
	name   string
	sd     *side
	qp     *vfrdma.QP
	peer   *cqp // RC: the QP at the other end
	sigAll bool
	sends  bool // posts sends
	recvs  bool // posts receives of its own (not an SRQ's)
	fromSR bool // receives from the cell's SRQ
	rxBase int  // its receive buffers' offset in the MR
	ldBase int  // READ slots
	fBase  int  // fetch-and-add result slots

	// The poster's.
	seq, nRecv, nRead, nFAA int
	// Under cell.mu: the poller's.
	lastImm  int
	faaOld   map[uint64]bool
	faaOK    int
	outS     int // what the driver still counts outstanding once the QP is closed
	outR     int
	unclosed bool // its Close never went through
}

// srqCell is the SRQ of a cellSRQ and its buffers.
type srqCell struct {
	sd   *side
	srq  *vfrdma.SRQ
	mu   sync.Mutex
	free []int // receive buffer offsets not posted
	out  int   // what the driver counts posted and not completed, before Close
	open bool
}

// wrec is one work request.
type wrec struct {
	q        *cqp // nil: an SRQ receive
	recv     bool
	op       vfrdma.Opcode
	signaled bool
	imm      uint32
	hasImm   bool
	off, n   int // sends: pattern offset and length; receives: the buffer's offset
	slot     int // READ and fetch-and-add: where the result lands
	done     int
	status   vfrdma.WCStatus
}

// verbsWorker runs cells of a kind, one after the other, until ctx ends.
func (s *soak) verbsWorker(ctx context.Context, rng *rand.Rand, kind cellKind) {
	for ctx.Err() == nil {
		var ns []*node
		switch kind {
		case cellRC, cellSRQ:
			ns = []*node{s.nodes[rng.IntN(len(s.nodes))], s.nodes[rng.IntN(len(s.nodes))]}
		case cellUD:
			for _, i := range rng.Perm(len(s.nodes))[:2+rng.IntN(len(s.nodes)-1)] {
				ns = append(ns, s.nodes[i])
			}
		}
		life := time.Duration(200+rng.IntN(1300)) * time.Millisecond
		if !s.runCell(ctx, rng, kind, ns, life) {
			time.Sleep(20 * time.Millisecond) // a node is being reopened
		}
	}
}

// runCell builds a cell on ns, runs it for life (or until ctx ends or a
// node dies), tears it down and checks it; false if a node was dead.
func (s *soak) runCell(ctx context.Context, rng *rand.Rand, kind cellKind, ns []*node, life time.Duration) bool {
	ds, ok := acquire(ns...)
	if !ok {
		return false
	}
	defer release(ns...)
	c := &cell{s: s, kind: kind, nodes: ns, stopPost: make(chan struct{}), stopPoll: make(chan struct{}),
		wrs: map[uint64]*wrec{}, sentImm: map[uint32]*wrec{}, rxImm: map[uint32]int{}}
	sctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	err := c.setup(sctx, rng, ds)
	if err != nil {
		s.counts.cellsRefused.Add(1)
		onDevice, inDriver := c.failedQPs()
		switch {
		case onDevice && (errors.Is(err, syscall.EINVAL) || errors.Is(err, vfrdma.ErrQPState)):
			addTo(&s.counts.cmdRefused, "QP failed in set-up", 1)
		case inDriver && errors.Is(err, vfrdma.ErrQPState) && anyDead(ns...):
			addTo(&s.counts.cmdRefused, "device dead", 1) // DEVICE_FATAL moved every QP to ERR
		case inDriver && errors.Is(err, vfrdma.ErrQPState):
			s.errorf("stale event", "%v cell on %s: a QP in ERR in the driver only (an event not its own applied to it): %v", kind, c.where(), err)
		default:
			if cause := s.refused(err); cause == "other" {
				s.errorf("setup", "%v cell on %s: %v", kind, c.where(), err)
			}
		}
	} else {
		c.run(ctx, rng, life)
	}
	c.teardown()
	c.verify()
	return true
}

// failedQPs reports whether one of the cell's QPs is in ERR on its
// device (a QP fatal hit it in set-up: its next transition is refused,
// ERR going only to RESET), and whether one is in ERR in the driver only
// (DEVICE_FATAL, or an event not its own).
func (c *cell) failedQPs() (onDevice, inDriverOnly bool) {
	for _, q := range c.qps {
		info, ok := q.sd.n.m.QPByNumber(q.qp.QPN())
		switch {
		case ok && info.State == firmware.QPStateErr:
			onDevice = true
		case q.qp.State() == vfrdma.StateErr:
			inDriverOnly = true
		}
	}
	return onDevice, inDriverOnly
}

func (c *cell) where() string {
	var b bytes.Buffer
	for i, n := range c.nodes {
		if i > 0 {
			b.WriteString("→")
		}
		b.WriteString(n.m.Name())
	}
	return b.String()
}

// newSide makes a side's PD, CQ and MR on d.
func (c *cell) newSide(ctx context.Context, n *node, d *vfrdma.Device) (*side, error) {
	sd := &side{n: n, d: d, ahs: map[*side]*vfrdma.AH{}}
	c.sides = append(c.sides, sd)
	var err error
	if sd.pd, err = d.AllocPD(ctx); err != nil {
		return sd, err
	}
	n.cqMu.RLock()
	if sd.cq, err = d.CreateCQ(ctx, 1024); err != nil {
		n.cqMu.RUnlock()
		return sd, err
	}
	register(n, 'c', sd.cq.Handle(), c.kind.String()+" cell's CQ")
	cqSides.Store(regKey{n.i, 'c', sd.cq.Handle()}, sd)
	n.cqMu.RUnlock()
	all := vfrdma.AccessLocalWrite | vfrdma.AccessRemoteWrite | vfrdma.AccessRemoteRead | vfrdma.AccessRemoteAtomic
	if sd.mr, err = sd.pd.AllocMR(ctx, mrSize, all); err != nil {
		return sd, err
	}
	sd.mem = sd.mr.Bytes()
	copy(sd.mem, pattern)
	c.pollers.Add(1)
	go c.poller(sd)
	return sd, nil
}

// newQP makes a QP on sd.
func (c *cell) newQP(ctx context.Context, sd *side, cfg vfrdma.QPConfig, name string) (*cqp, error) {
	if sd.nQP == maxQPs {
		panic("soak: too many QPs on a side")
	}
	q := &cqp{idx: len(c.qps), name: name, sd: sd, sigAll: cfg.SignalAll, lastImm: -1, faaOld: map[uint64]bool{},
		rxBase: rxOff + sd.nQP*rxBufs*rxBuf, ldBase: rdOff + sd.nQP*rdSlots*maxPayload, fBase: faaOff + sd.nQP*faaSlots*8}
	sd.nQP++
	cfg.SendCQ, cfg.RecvCQ = sd.cq, sd.cq
	qp, err := sd.pd.CreateQP(ctx, &cfg)
	if err != nil {
		return nil, err
	}
	q.qp = qp
	c.qps = append(c.qps, q)
	register(sd.n, 'q', qp.QPN(), c.kind.String()+" cell's QP")
	return q, nil
}

// setup builds the cell's objects and connects its QPs; the pollers
// start with the sides.
func (c *cell) setup(ctx context.Context, rng *rand.Rand, ds []*vfrdma.Device) error {
	switch c.kind {
	case cellRC:
		a, err := c.newSide(ctx, c.nodes[0], ds[0])
		if err != nil {
			return err
		}
		b, err := c.newSide(ctx, c.nodes[1], ds[1])
		if err != nil {
			return err
		}
		for i := range 1 + rng.IntN(3) {
			var pair [2]*cqp
			for j, sd := range []*side{a, b} {
				cfg := vfrdma.QPConfig{Type: vfrdma.RC, SendDepth: 32, RecvDepth: rqDepth, SignalAll: rng.IntN(2) == 0}
				q, err := c.newQP(ctx, sd, cfg, fmt.Sprintf("RC %d%c", i, 'a'+j))
				if err != nil {
					return err
				}
				q.sends, q.recvs = true, true
				pair[j] = q
			}
			pair[0].peer, pair[1].peer = pair[1], pair[0]
			if err := c.connect(ctx, pair[0], pair[1]); err != nil {
				return err
			}
		}
	case cellSRQ:
		r, err := c.newSide(ctx, c.nodes[0], ds[0])
		if err != nil {
			return err
		}
		snd, err := c.newSide(ctx, c.nodes[1], ds[1])
		if err != nil {
			return err
		}
		sq := &srqCell{sd: r}
		for i := range srqMax {
			sq.free = append(sq.free, rxOff+i*rxBuf)
		}
		c.srq = sq
		if sq.srq, err = r.pd.CreateSRQ(ctx, &vfrdma.SRQConfig{Depth: srqDepth, MaxDepth: srqMax, LowWatermark: 8, CQ: r.cq}); err != nil {
			return err
		}
		sq.open = true
		register(r.n, 's', sq.srq.Handle(), "SRQ cell's SRQ")
		for i := range 1 + rng.IntN(3) {
			rq, err := c.newQP(ctx, r, vfrdma.QPConfig{Type: vfrdma.RC, SendDepth: 8, SRQ: sq.srq}, fmt.Sprintf("SRQ %dr", i))
			if err != nil {
				return err
			}
			rq.fromSR = true
			sq2, err := c.newQP(ctx, snd, vfrdma.QPConfig{Type: vfrdma.RC, SendDepth: 32, RecvDepth: 2, SignalAll: rng.IntN(2) == 0}, fmt.Sprintf("SRQ %ds", i))
			if err != nil {
				return err
			}
			sq2.sends = true
			rq.peer, sq2.peer = sq2, rq
			if err := c.connect(ctx, rq, sq2); err != nil {
				return err
			}
		}
	case cellUD:
		for i, n := range c.nodes {
			sd, err := c.newSide(ctx, n, ds[i])
			if err != nil {
				return err
			}
			q, err := c.newQP(ctx, sd, vfrdma.QPConfig{Type: vfrdma.UD, SendDepth: 32, RecvDepth: rqDepth, QKey: qkey, SignalAll: rng.IntN(2) == 0}, fmt.Sprintf("UD %d", i))
			if err != nil {
				return err
			}
			q.sends, q.recvs = true, true
			if err := q.qp.Connect(ctx, vfrdma.Remote{}, 0); err != nil {
				return err
			}
		}
		for _, from := range c.sides {
			for _, to := range c.sides {
				ah, err := from.pd.CreateAH(vfrdma.AHAttr{DGID: to.d.GID()})
				if err != nil {
					return err
				}
				from.ahs[to] = ah
			}
		}
	}
	return nil
}

// connect connects x and y, each sending from a random first PSN, as a
// driver's user should: QPNs are reused at once, and a packet of an
// earlier connection still on the fabric must not fit the new one's
// sequence.
func (c *cell) connect(ctx context.Context, x, y *cqp) error {
	px, py := connect.RandomPSN(), connect.RandomPSN()
	if err := x.qp.Connect(ctx, vfrdma.Remote{QPN: y.qp.QPN(), GID: y.sd.d.GID(), PSN: py}, px); err != nil {
		return err
	}
	return y.qp.Connect(ctx, vfrdma.Remote{QPN: x.qp.QPN(), GID: x.sd.d.GID(), PSN: px}, py)
}

// run posts from a goroutine per QP (and two on the SRQ) until life is
// over, ctx ends, or a node dies.
func (c *cell) run(ctx context.Context, rng *rand.Rand, life time.Duration) {
	for _, q := range c.qps {
		if q.sends || q.recvs {
			c.posters.Add(1)
			go c.poster(q, rand.New(rand.NewPCG(rng.Uint64(), uint64(q.idx))))
		}
	}
	if c.srq != nil {
		for k := range 2 {
			c.posters.Add(1)
			go c.srqPoster(rand.New(rand.NewPCG(rng.Uint64(), uint64(100+k))))
		}
	}
	t := time.NewTimer(life)
	defer t.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-t.C:
			return
		case <-ctx.Done():
			return
		case <-tick.C:
			if anyDead(c.nodes...) {
				return
			}
		}
	}
}

// stopped reports whether the posters are to stop.
func (c *cell) stopped() bool {
	select {
	case <-c.stopPost:
		return true
	default:
		return false
	}
}

// postOK sorts a post's error: nil and a full queue go on; a QP out of
// RTS (a fault moved it to ERR) or closed stops its poster; anything
// else is a broken rule.
func (c *cell) postOK(q *cqp, what string, err error) (goOn bool) {
	switch {
	case err == nil, errors.Is(err, vfrdma.ErrQueueFull):
		return true
	case errors.Is(err, vfrdma.ErrQPState), errors.Is(err, vfrdma.ErrClosed):
		return false
	}
	c.s.errorf("post", "%v cell on %s: %s on %s: %v", c.kind, c.where(), what, q.name, err)
	return false
}

// record notes wrs before they are posted (a completion may come before
// PostSend returns); forget drops the ones the post refused.
func (c *cell) record(ws []*wrec, ids []uint64) {
	c.mu.Lock()
	for i, w := range ws {
		c.wrs[ids[i]] = w
		if w.hasImm {
			c.sentImm[w.imm] = w
		}
	}
	c.mu.Unlock()
}

func (c *cell) forget(ws []*wrec, ids []uint64) {
	c.mu.Lock()
	for i, w := range ws {
		delete(c.wrs, ids[i])
		if w.hasImm {
			delete(c.sentImm, w.imm)
		}
	}
	c.mu.Unlock()
}

// poster posts q's receives and sends until told to stop or q fails.
func (c *cell) poster(q *cqp, rng *rand.Rand) {
	defer c.posters.Done()
	rwrs := make([]vfrdma.RecvWR, 4)
	rsges := make([]vfrdma.SGE, 4)
	swrs := make([]vfrdma.SendWR, 3)
	ssges := make([]vfrdma.SGE, 3)
	recs := make([]*wrec, 4)
	ids := make([]uint64, 4)
	deferred := false
	for !c.stopped() {
		if q.recvs {
			k := 1 + rng.IntN(4)
			for j := range k {
				id := c.s.wrid.Add(1)
				off := q.rxBase + (q.nRecv+j)%rxBufs*rxBuf
				rsges[j] = q.sd.mr.SGE(off, rxBuf)
				rwrs[j] = vfrdma.RecvWR{WRID: id, SGEs: rsges[j : j+1]}
				recs[j], ids[j] = &wrec{q: q, recv: true, off: off}, id
			}
			c.record(recs[:k], ids[:k])
			n, err := q.qp.PostRecv(rwrs[:k], 0)
			c.forget(recs[n:k], ids[n:k])
			q.nRecv += n
			if !c.postOK(q, "PostRecv", err) {
				break
			}
		}
		if q.sends {
			k := 1 + rng.IntN(3)
			for j := range k {
				ids[j] = c.s.wrid.Add(1)
				recs[j] = c.sendWR(q, rng, ids[j], &swrs[j], ssges[j:j+1])
			}
			c.record(recs[:k], ids[:k])
			flags := vfrdma.PostFlags(0)
			if rng.IntN(3) == 0 {
				flags = vfrdma.FlagDefer
			}
			n, err := q.qp.PostSend(swrs[:k], flags)
			c.forget(recs[n:k], ids[n:k])
			deferred = flags == vfrdma.FlagDefer && n == k
			if !c.postOK(q, "PostSend", err) {
				break
			}
		}
		time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
	}
	if deferred {
		_ = q.qp.Ring() // what was deferred goes; if the QP failed, its flush completes it
	}
}

// sendWR fills wr for q's next send and returns its record.
func (c *cell) sendWR(q *cqp, rng *rand.Rand, id uint64, wr *vfrdma.SendWR, sge []vfrdma.SGE) *wrec {
	n := rng.IntN(maxPayload + 1)
	off := rng.IntN(patLen - maxPayload)
	w := &wrec{q: q, op: vfrdma.OpSendWithImm, off: off, n: n}
	roll := rng.IntN(100)
	switch {
	case c.kind == cellUD:
	case c.kind == cellSRQ && roll < 25, c.kind == cellRC && roll < 15:
		w.op, w.off = vfrdma.OpSend, 0 // plain: the receiver checks the pattern from 0
	case c.kind == cellSRQ:
	case roll < 45:
	case roll < 60:
		w.op = vfrdma.OpRDMAWrite
	case roll < 70:
		w.op = vfrdma.OpRDMAWriteWithImm
	case roll < 85:
		w.op, w.n = vfrdma.OpRDMARead, 1+rng.IntN(maxPayload)
	default:
		w.op, w.n = vfrdma.OpAtomicFetchAdd, 8
	}
	*wr = vfrdma.SendWR{WRID: id, Opcode: w.op}
	w.signaled = q.sigAll || w.op == vfrdma.OpRDMARead || w.op == vfrdma.OpAtomicFetchAdd || rng.IntN(2) == 0
	if w.signaled {
		wr.Flags = vfrdma.SendSignaled
	}
	if w.op == vfrdma.OpSendWithImm || w.op == vfrdma.OpRDMAWriteWithImm {
		w.hasImm, w.imm = true, uint32(q.idx)<<24|uint32(q.seq)
		q.seq++
		wr.Imm = w.imm
	}
	switch w.op {
	case vfrdma.OpSend, vfrdma.OpSendWithImm:
		sge[0] = q.sd.mr.SGE(w.off, w.n)
	case vfrdma.OpRDMAWrite, vfrdma.OpRDMAWriteWithImm:
		sge[0] = q.sd.mr.SGE(w.off, w.n)
		wr.RemoteAddr, wr.RKey = q.peer.sd.mr.Addr()+uint64(wrOff+rng.IntN(mrSize-wrOff-maxPayload)), q.peer.sd.mr.RKey()
	case vfrdma.OpRDMARead:
		w.slot = q.ldBase + q.nRead%rdSlots*maxPayload
		q.nRead++
		sge[0] = q.sd.mr.SGE(w.slot, w.n)
		wr.RemoteAddr, wr.RKey = q.peer.sd.mr.Addr(), q.peer.sd.mr.RKey()
	case vfrdma.OpAtomicFetchAdd:
		w.slot = q.fBase + q.nFAA%faaSlots*8
		q.nFAA++
		sge[0] = q.sd.mr.SGE(w.slot, 8)
		wr.RemoteAddr, wr.RKey, wr.CompareAdd = q.peer.sd.mr.Addr()+uint64(ctrOff+8*q.idx), q.peer.sd.mr.RKey(), 1
	}
	if n == 0 && (w.op == vfrdma.OpSend || w.op == vfrdma.OpSendWithImm || w.op == vfrdma.OpRDMAWrite || w.op == vfrdma.OpRDMAWriteWithImm) {
		wr.SGEs = nil // a zero-length message
	} else {
		wr.SGEs = sge
	}
	if c.kind == cellUD {
		to := c.qps[rng.IntN(len(c.qps))]
		wr.AH, wr.RemoteQPN, wr.RemoteQKey = q.sd.ahs[to.sd], to.qp.QPN(), qkey
	}
	return w
}

// srqPoster keeps the SRQ stocked from the free buffers, from one of two
// goroutines.
func (c *cell) srqPoster(rng *rand.Rand) {
	defer c.posters.Done()
	sq := c.srq
	wrs := make([]vfrdma.RecvWR, 8)
	sges := make([]vfrdma.SGE, 8)
	recs := make([]*wrec, 8)
	ids := make([]uint64, 8)
	for !c.stopped() {
		sq.mu.Lock()
		k := min(1+rng.IntN(8), len(sq.free))
		if k == 0 {
			sq.mu.Unlock()
			time.Sleep(100 * time.Microsecond)
			continue
		}
		offs := append([]int(nil), sq.free[len(sq.free)-k:]...)
		sq.free = sq.free[:len(sq.free)-k]
		sq.mu.Unlock()
		for j, off := range offs {
			ids[j] = c.s.wrid.Add(1)
			sges[j] = sq.sd.mr.SGE(off, rxBuf)
			wrs[j] = vfrdma.RecvWR{WRID: ids[j], SGEs: sges[j : j+1]}
			recs[j] = &wrec{recv: true, off: off}
		}
		c.record(recs[:k], ids[:k])
		n, err := sq.srq.PostRecv(wrs[:k], 0)
		c.forget(recs[n:k], ids[n:k])
		sq.mu.Lock()
		sq.free = append(sq.free, offs[n:]...)
		sq.mu.Unlock()
		switch {
		case err == nil, errors.Is(err, vfrdma.ErrQueueFull):
		case errors.Is(err, vfrdma.ErrClosed):
			return
		default:
			c.s.errorf("post", "%v cell on %s: SRQ PostRecv: %v", c.kind, c.where(), err)
			return
		}
		if rng.IntN(50) == 0 {
			if err := sq.srq.Resize(srqDepth + rng.IntN(srqMax-srqDepth+1)); err != nil && !errors.Is(err, vfrdma.ErrBusy) && !errors.Is(err, vfrdma.ErrInvalid) {
				c.s.errorf("post", "%v cell: SRQ Resize: %v", c.kind, err)
			}
		}
		time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
	}
}

// poller polls a side's CQ and takes each completion, until told to stop
// or the CQ fails.
func (c *cell) poller(sd *side) {
	defer c.pollers.Done()
	wcs := make([]vfrdma.WC, 32)
	for {
		n, err := sd.cq.Poll(wcs)
		if err != nil {
			if errors.Is(err, vfrdma.ErrCQOverrun) || errors.Is(err, vfrdma.ErrDeviceFatal) {
				sd.failed.Store(true)
				if errors.Is(err, vfrdma.ErrCQOverrun) && !sd.overflowed.Load() {
					c.s.errorf("stale event", "%v cell on %s: CQ %d failed with no overrun injected on it: %v", c.kind, c.where(), sd.cq.Handle(), err)
				}
			} else {
				c.s.errorf("poll", "%v cell on %s: Poll: %v", c.kind, c.where(), err)
				sd.failed.Store(true) // nothing more comes from it
			}
			return
		}
		for i := range wcs[:n] {
			c.complete(sd, &wcs[i])
		}
		if n > 0 {
			continue
		}
		select {
		case <-c.stopPoll:
			return
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
		err = sd.cq.Wait(ctx)
		cancel()
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			c.s.errorf("poll", "%v cell on %s: Wait: %v", c.kind, c.where(), err)
			sd.failed.Store(true)
			return
		}
	}
}

// complete takes one completion: it must name a request posted on this
// side, not completed before, on its own QP; what it brought is checked.
func (c *cell) complete(sd *side, wc *vfrdma.WC) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.s
	w := c.wrs[wc.WRID]
	if w == nil {
		s.errorf("unknown completion", "%v cell on %s: wr_id %d was never posted here: %+v", c.kind, c.where(), wc.WRID, *wc)
		return
	}
	w.done++
	w.status = wc.Status
	addTo(&s.counts.status, wc.Status, 1)
	if w.done > 1 {
		s.errorf("duplicate completion", "%v cell on %s: wr_id %d completed %d times, now %+v", c.kind, c.where(), wc.WRID, w.done, *wc)
		return
	}
	if (wc.Opcode&vfrdma.WCRecv != 0) != w.recv {
		s.errorf("wrong completion", "%v cell: wr_id %d (receive %v) completed as opcode %v", c.kind, wc.WRID, w.recv, wc.Opcode)
	}
	if w.q == nil { // an SRQ receive: its buffer is free again
		c.srq.mu.Lock()
		c.srq.free = append(c.srq.free, w.off)
		c.srq.mu.Unlock()
	}
	q := w.q
	if q == nil && wc.Status == vfrdma.WCSuccess {
		for _, r := range c.qps {
			if r.fromSR && r.qp.QPN() == wc.QPN {
				q = r
			}
		}
		if q == nil {
			s.errorf("wrong QP", "%v cell: an SRQ receive completed on QP %d, not one of the SRQ's", c.kind, wc.QPN)
			return
		}
	} else if q != nil && wc.QPN != q.qp.QPN() {
		s.errorf("wrong QP", "%v cell: wr_id %d of %s (QPN %d) completed on QPN %d", c.kind, wc.WRID, q.name, q.qp.QPN(), wc.QPN)
		return
	}
	if wc.Status != vfrdma.WCSuccess {
		return
	}
	if w.recv {
		c.received(q, w, wc)
		return
	}
	if !w.signaled {
		s.errorf("unsignaled success", "%v cell: %s's unsignaled %v (wr_id %d) completed successfully", c.kind, q.name, w.op, wc.WRID)
	}
	switch w.op {
	case vfrdma.OpRDMARead:
		if got := sd.mem[w.slot : w.slot+w.n]; !bytes.Equal(got, pattern[:w.n]) {
			s.errorf("data", "%v cell: %s's READ of %d bytes brought %x…", c.kind, q.name, w.n, got[:min(16, len(got))])
		}
		s.counts.readsChecked.Add(1)
	case vfrdma.OpAtomicFetchAdd:
		old := binary.LittleEndian.Uint64(sd.mem[w.slot:])
		if q.faaOld[old] {
			s.errorf("atomic ran twice", "%v cell: %s's fetch-and-add returned %d twice", c.kind, q.name, old)
		}
		q.faaOld[old] = true
		q.faaOK++
		s.counts.faaChecked.Add(1)
	}
}

// received checks an arrival on q: the immediate value names a send of
// q's peer not seen before (RC: after the one before it), and a SEND's
// bytes are the sender's. Under c.mu.
func (c *cell) received(q *cqp, w *wrec, wc *vfrdma.WC) {
	s := c.s
	buf := q.sd.mem[w.off : w.off+rxBuf]
	hdr := 0
	if c.kind == cellUD {
		hdr = vfrdma.UDHeaderRoom
	}
	if !wc.HasImm() {
		n := int(wc.ByteLen) - hdr
		if n < 0 || n > maxPayload || wc.Opcode != vfrdma.WCRecv {
			s.errorf("data", "%v cell: %s received %d bytes (opcode %v) with no immediate value", c.kind, q.name, wc.ByteLen, wc.Opcode)
			return
		}
		if !bytes.Equal(buf[hdr:hdr+n], pattern[:n]) {
			s.errorf("data", "%v cell: %s received a SEND of %d bytes that are not the sender's", c.kind, q.name, n)
		}
		return
	}
	sw := c.sentImm[wc.Imm]
	if sw == nil {
		s.errorf("data", "%v cell: %s received immediate value %#x, which nobody sent", c.kind, q.name, wc.Imm)
		return
	}
	c.rxImm[wc.Imm]++
	if k := c.rxImm[wc.Imm]; k > 1 {
		s.errorf("duplicate arrival", "%v cell: %s received %s's message %#x %d times", c.kind, q.name, sw.q.name, wc.Imm, k)
		return
	}
	switch {
	case c.kind == cellUD && sw.q.qp.QPN() != wc.SrcQP:
		s.errorf("data", "UD cell: %s received %#x from QPN %d, sent by %s (QPN %d)", q.name, wc.Imm, wc.SrcQP, sw.q.name, sw.q.qp.QPN())
	case c.kind != cellUD && sw.q != q.peer:
		s.errorf("data", "%v cell: %s received %#x, sent by %s, not its peer", c.kind, q.name, wc.Imm, sw.q.name)
	case c.kind != cellUD:
		seq := int(wc.Imm & 0xffffff)
		if seq <= q.lastImm {
			s.errorf("order", "%v cell: %s received %s's message %d after %d", c.kind, q.name, sw.q.name, seq, q.lastImm)
		}
		q.lastImm = seq
	}
	if sw.op == vfrdma.OpSendWithImm {
		n := int(wc.ByteLen) - hdr
		if n != sw.n || wc.Opcode != vfrdma.WCRecv {
			s.errorf("data", "%v cell: %s received %#x as %d bytes (opcode %v); %d were sent", c.kind, q.name, wc.Imm, n, wc.Opcode, sw.n)
		} else if !bytes.Equal(buf[hdr:hdr+n], pattern[sw.off:sw.off+n]) {
			s.errorf("data", "%v cell: %s received %#x with bytes that are not the sender's", c.kind, q.name, wc.Imm)
		}
	} else if wc.Opcode != vfrdma.WCRecvRDMAWithImm {
		s.errorf("data", "%v cell: %s received the WRITE with immediate %#x as opcode %v", c.kind, q.name, wc.Imm, wc.Opcode)
	}
	s.counts.immChecked.Add(1)
}

// closeObj closes an object, again while a command fault refuses it; a
// dead device's refusals are final (its Close shuts what it refused).
// It reports whether the object is closed.
func (c *cell) closeObj(sd *side, what string, f func() error) bool {
	for try := 0; ; try++ {
		err := f()
		if err == nil {
			return true
		}
		cause := c.s.refused(err)
		if cause == "device dead" || sd.n.dead.Load() {
			sd.dead.Store(true)
			return false
		}
		if cause == "other" && !errors.Is(err, vfrdma.ErrBusy) {
			c.s.errorf("close", "%v cell on %s: %s: %v", c.kind, c.where(), what, err)
		}
		if try == 20 {
			sd.n.lmu.Lock()
			sd.n.leftovers = append(sd.n.leftovers, f)
			sd.n.lmu.Unlock()
			return false
		}
		time.Sleep(time.Duration(try+1) * 5 * time.Millisecond)
	}
}

// teardown stops the posters, closes the QPs and the SRQ, waits for every
// request to complete (or for its CQ to fail), stops the pollers, reads
// what the fetch-and-adds left, and closes the rest.
func (c *cell) teardown() {
	close(c.stopPost)
	c.posters.Wait()
	for _, q := range c.qps {
		if !c.closeObj(q.sd, q.name+" Close", q.qp.Close) {
			q.unclosed = true
		}
		unregister(q.sd.n, 'q', q.qp.QPN())
	}
	if sq := c.srq; sq != nil && sq.open {
		sq.out = sq.srq.Outstanding()
		if !c.closeObj(sq.sd, "SRQ Close", sq.srq.Close) {
			sq.open = false
		}
		unregister(sq.sd.n, 's', sq.srq.Handle())
	}
	deadline := time.Now().Add(hangGuard)
	for !c.settled() {
		if time.Now().After(deadline) {
			c.s.hang("%v cell on %s: requests still outstanding %v after its QPs were closed: %s", c.kind, c.where(), hangGuard, c.pending())
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	close(c.stopPoll)
	c.pollers.Wait()
	for _, q := range c.qps {
		q.outS, q.outR = q.qp.Outstanding()
	}
	c.readCounters()
	for _, sd := range c.sides {
		if sd.cq != nil {
			handle := sd.cq.Handle()
			sd.n.cqMu.RLock()
			c.closeObj(sd, "CQ Close", sd.cq.Close)
			unregister(sd.n, 'c', handle)
			cqSides.CompareAndDelete(regKey{sd.n.i, 'c', handle}, sd)
			sd.n.cqMu.RUnlock()
		}
		if sd.mr != nil {
			c.closeObj(sd, "MR Close", sd.mr.Close)
		}
		if sd.pd != nil {
			c.closeObj(sd, "PD Close", sd.pd.Close)
		}
		if sd.n.dead.Load() {
			sd.dead.Store(true)
		}
	}
}

// settled reports whether every request that must complete has, and the
// driver counts nothing outstanding, on every side whose completions
// cannot have been lost.
func (c *cell) settled() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.wrs {
		if w.done == 0 && (w.recv || w.signaled) && !c.sideOf(w).lost() && !c.unclosed(w) {
			return false
		}
	}
	for _, q := range c.qps {
		if q.unclosed || q.sd.lost() {
			continue
		}
		if s, r := q.qp.Outstanding(); s+r > 0 {
			return false
		}
	}
	return true
}

func (c *cell) sideOf(w *wrec) *side {
	if w.q == nil {
		return c.srq.sd
	}
	return w.q.sd
}

// unclosed reports whether w's queue could not be closed (a destroy
// refused every time it was tried): its requests wait for the leftovers.
func (c *cell) unclosed(w *wrec) bool {
	if w.q == nil {
		return !c.srq.open && !c.srq.sd.lost()
	}
	return w.q.unclosed
}

// pending lists what a hung settle waits for.
func (c *cell) pending() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b bytes.Buffer
	for id, w := range c.wrs {
		if w.done == 0 && (w.recv || w.signaled) && !c.sideOf(w).lost() {
			name := "SRQ"
			if w.q != nil {
				name = w.q.name
			}
			fmt.Fprintf(&b, "[%s wr_id %d recv %v op %v] ", name, id, w.recv, w.op)
			if b.Len() > 2000 {
				break
			}
		}
	}
	for _, q := range c.qps {
		s, r := q.qp.Outstanding()
		fmt.Fprintf(&b, "%s: outstanding %d/%d state %v; ", q.name, s, r, q.qp.State())
	}
	return b.String()
}

// faaCtr is where q's peer's counter for q's fetch-and-adds is.
func faaCtr(q *cqp) int { return ctrOff + 8*q.idx }

// readCounters checks what q's fetch-and-adds left in its peer's
// counter: at least the ones that succeeded, at most the ones posted, and
// above every value one returned. The QPs are closed: nothing adds any
// more.
func (c *cell) readCounters() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, q := range c.qps {
		if q.nFAA == 0 || q.peer.sd.lost() || q.sd.lost() || q.unclosed || q.peer.unclosed {
			continue
		}
		v := binary.LittleEndian.Uint64(q.peer.sd.mem[faaCtr(q):])
		if v < uint64(q.faaOK) || v > uint64(q.nFAA) {
			c.s.errorf("atomic", "%v cell: %s's counter is %d after %d fetch-and-adds posted, %d succeeded", c.kind, q.name, v, q.nFAA, q.faaOK)
		}
		for old := range q.faaOld {
			if old >= v {
				c.s.errorf("atomic", "%v cell: %s's fetch-and-add returned %d, the counter ended at %d", c.kind, q.name, old, v)
			}
		}
	}
}

// verify checks the ledger: each request completed once, or, where its
// CQ failed, is among what the driver still counts outstanding; each
// acknowledged message with an immediate value arrived.
func (c *cell) verify() {
	s := c.s
	c.mu.Lock()
	defer c.mu.Unlock()
	type miss struct{ sig, unsig, recv int }
	missing := map[*cqp]*miss{}
	srqMissing := 0
	for id, w := range c.wrs {
		must := w.recv || w.signaled
		if w.done == 1 || !must {
			if w.done == 1 {
				s.counts.wrs.Add(1)
			} else if w.q != nil { // an unsignaled send never completed: retired, reaped or lost
				m := missing[w.q]
				if m == nil {
					m = &miss{}
					missing[w.q] = m
				}
				m.unsig++
			}
			if w.done == 1 && w.hasImm && w.status == vfrdma.WCSuccess && c.kind != cellUD {
				peer := w.q.peer
				if !peer.sd.lost() && !peer.unclosed && c.rxImm[w.imm] != 1 {
					s.errorf("acked, not arrived", "%v cell on %s: %s's %v %#x completed successfully; %s received it %d times",
						c.kind, c.where(), w.q.name, w.op, w.imm, peer.name, c.rxImm[w.imm])
				}
			}
			continue
		}
		if !c.sideOf(w).lost() {
			if !c.unclosed(w) {
				s.errorf("never completed", "%v cell on %s: wr_id %d (%v, receive %v) never completed", c.kind, c.where(), id, w.op, w.recv)
			}
			continue
		}
		s.counts.wrsLost.Add(1)
		if w.q == nil {
			srqMissing++
			continue
		}
		m := missing[w.q]
		if m == nil {
			m = &miss{}
			missing[w.q] = m
		}
		if w.recv {
			m.recv++
		} else {
			m.sig++
		}
	}
	// Where completions were lost, what never completed is what the
	// driver still counts outstanding: every receive, every signaled
	// send, and of the unsignaled ones those it has not retired.
	for q, m := range missing {
		if !q.sd.lost() || q.unclosed {
			continue
		}
		if q.outR != m.recv {
			s.errorf("lost count", "%v cell: %s: %d receives never completed, the driver counts %d outstanding", c.kind, q.name, m.recv, q.outR)
		}
		if q.outS < m.sig || q.outS > m.sig+m.unsig {
			s.errorf("lost count", "%v cell: %s: %d signaled and %d unsignaled sends never completed, the driver counts %d outstanding", c.kind, q.name, m.sig, m.unsig, q.outS)
		}
	}
	if sq := c.srq; sq != nil && srqMissing > 0 && sq.sd.failed.Load() && !sq.sd.dead.Load() && sq.out < srqMissing {
		s.errorf("lost count", "SRQ cell: %d SRQ receives never completed, the driver counted %d outstanding", srqMissing, sq.out)
	}
	s.counts.cells.Add(1)
}
