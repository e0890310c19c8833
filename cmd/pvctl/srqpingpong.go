package main

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/connect"
	"github.com/vfrdma/vfrdma/internal/perf"
)

// srqSide is one side of an SRQ ping-pong: n RC QPs whose receives come
// from one SRQ, with one CQ for everything (QEMU 7.2 sends every SRQ
// completion to one receive CQ).
type srqSide struct {
	cq     *vfrdma.CQ
	srq    *vfrdma.SRQ
	qps    []*vfrdma.QP
	conn   map[uint32]int // QPN → connection
	send   *vfrdma.MR     // one slot per connection
	recv   *vfrdma.MR     // one slot per SRQ receive
	size   int
	depth  int
	sends  int   // send completions
	recvs  []int // receives checked, per connection
	rwr    []vfrdma.RecvWR
	rsge   []vfrdma.SGE
	wcs    []vfrdma.WC
	swr    [1]vfrdma.SendWR
	sge    [1]vfrdma.SGE
	onRecv func(conn, seq int) error
	wait   perf.Wait     // spin, or with --events sleep as the CQ's options say
	stall  time.Duration // --stall: how long step waits for a completion
	// progress counts the completions of the run's sides, for the watch
	// that ends step's context after stall without one (perf.WatchQuiet).
	progress *atomic.Int64
	psns     []uint32 // each QP's first send PSN
	// rdmaCore: the peer is ibv_srq_pingpong, whose one buffer holds
	// zeros and then only what it receives: this end sends zeros and
	// checks that every byte received is 0, each receive slot poisoned
	// before it is posted so that a zero is one the peer sent.
	rdmaCore bool
	total    int // receives checked, all connections
	posted   int // sends posted
}

// srqPoison is what a receive slot holds until a message lands in it
// (--rdma-core, whose messages are zeros).
const srqPoison = 0xa5

func newSRQSide(ctx context.Context, d *vfrdma.Device, pd *vfrdma.PD, n int, t *trafficFlags, stall time.Duration) (*srqSide, error) {
	s := &srqSide{size: t.size, depth: max(16, 4*n), conn: map[uint32]int{}, recvs: make([]int, n), wait: t.wait(), stall: stall, rdmaCore: t.rdmaCore, progress: new(atomic.Int64)}
	var err error
	if s.cq, err = d.CreateCQ(ctx, 2*s.depth+8*n); err != nil {
		return nil, err
	}
	if s.srq, err = pd.CreateSRQ(ctx, &vfrdma.SRQConfig{Depth: s.depth, CQ: s.cq}); err != nil {
		return nil, err
	}
	for i := 0; i < n; i++ {
		qp, err := pd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: s.cq, RecvCQ: s.cq, SendDepth: 4, SRQ: s.srq, SignalAll: true})
		if err != nil {
			return nil, err
		}
		s.qps = append(s.qps, qp)
		s.conn[qp.QPN()] = i
		s.psns = append(s.psns, connect.RandomPSN())
	}
	if s.send, err = pd.AllocMR(ctx, n*max(s.size, 1), vfrdma.AccessLocalWrite); err != nil {
		return nil, err
	}
	if s.recv, err = pd.AllocMR(ctx, s.depth*max(s.size, 1), vfrdma.AccessLocalWrite); err != nil {
		return nil, err
	}
	s.rwr = make([]vfrdma.RecvWR, 0, s.depth)
	s.rsge = make([]vfrdma.SGE, s.depth)
	s.wcs = make([]vfrdma.WC, 16)
	if s.rdmaCore {
		clear(s.send.Bytes())
	}
	// Every receive buffer goes to the SRQ (the QPs exist: QEMU needs one).
	for slot := 0; slot < s.depth; slot++ {
		s.queueRecv(slot)
	}
	return s, s.repost()
}

func (s *srqSide) info(d *vfrdma.Device) connect.Info {
	var in connect.Info
	for i, qp := range s.qps {
		in.Endpoints = append(in.Endpoints, connect.Endpoint{QPN: qp.QPN(), GID: d.GID(), PSN: s.psns[i]})
	}
	return in
}

// connect connects QP i to the peer's QP i, which starts its sends at
// its endpoint's PSN.
func (s *srqSide) connect(ctx context.Context, peer connect.Info) error {
	if len(peer.Endpoints) != len(s.qps) {
		if s.rdmaCore {
			return fmt.Errorf("ibv_srq_pingpong has %d QPs, this end %d: give its -q the number of --srq", len(peer.Endpoints), len(s.qps))
		}
		return fmt.Errorf("the other end has %d SRQ QPs, this one %d: give both the same --srq", len(peer.Endpoints), len(s.qps))
	}
	for i, qp := range s.qps {
		if err := qp.Connect(ctx, peer.Endpoints[i].Remote(), s.psns[i]); err != nil {
			return err
		}
	}
	return nil
}

// queueRecv adds a receive into slot to the next repost chain.
func (s *srqSide) queueRecv(slot int) {
	if s.rdmaCore {
		fillByte(s.recv.Bytes()[slot*max(s.size, 1):][:s.size], srqPoison)
	}
	s.rsge[slot] = s.recv.SGE(slot*max(s.size, 1), s.size)
	s.rwr = append(s.rwr, vfrdma.RecvWR{WRID: uint64(slot), SGEs: s.rsge[slot : slot+1]})
	if s.size == 0 {
		s.rwr[len(s.rwr)-1].SGEs = nil
	}
}

// repost hands the queued receives back to the SRQ as one chain: one
// doorbell.
func (s *srqSide) repost() error {
	if len(s.rwr) == 0 {
		return nil
	}
	_, err := s.srq.PostRecv(s.rwr, 0)
	s.rwr = s.rwr[:0]
	return err
}

// sendMsg sends message seq on connection c.
func (s *srqSide) sendMsg(c, seq int) error {
	if !s.rdmaCore { // ibv_srq_pingpong's messages stay zeros
		pattern(s.send.Bytes()[c*max(s.size, 1):][:s.size], seq)
	}
	s.sge[0] = s.send.SGE(c*max(s.size, 1), s.size)
	s.swr[0] = vfrdma.SendWR{WRID: uint64(seq), SGEs: s.sge[:]}
	if s.size == 0 {
		s.swr[0].SGEs = nil
	}
	_, err := s.qps[c].PostSend(s.swr[:], 0)
	return err
}

// seq numbers message k of connection c among n.
func seqOf(k, c, n int) int { return k*n + c }

// step takes the CQ's next completions (with --events sleeping on it when
// idle; ctx, srqPingpong's stall watch, ends once none came for the stall
// time) and checks each
// receive: against its connection's next sequence number, or with
// --rdma-core for zeros.
func (s *srqSide) step(ctx context.Context) error {
	n, err := s.wait.Next(ctx, s.cq, s.wcs)
	if err != nil && perf.Quiet(ctx) {
		return fmt.Errorf("stalled: no completion for %v (this end completed %d sends and %d receives, posted %d sends)", s.stall, s.sends, s.total, s.posted)
	}
	if err != nil {
		return err
	}
	s.progress.Add(int64(n))
	for _, wc := range s.wcs[:n] {
		if wc.Status != vfrdma.WCSuccess {
			return fmt.Errorf("completion %+v", wc)
		}
		if wc.Opcode != vfrdma.WCRecv {
			s.sends++
			continue
		}
		c, ok := s.conn[wc.QPN]
		if !ok {
			return fmt.Errorf("a receive on QP %d, none of ours", wc.QPN)
		}
		seq := seqOf(s.recvs[c], c, len(s.qps))
		if int(wc.ByteLen) != s.size {
			return fmt.Errorf("connection %d, message %d: received %d bytes, want %d", c, seq, wc.ByteLen, s.size)
		}
		slot := int(wc.WRID)
		b := s.recv.Bytes()[slot*max(s.size, 1):][:s.size]
		if s.rdmaCore {
			err = checkZeros(b, s.total)
		} else {
			err = checkPattern(b, seq)
		}
		if err != nil {
			return fmt.Errorf("connection %d: %w", c, err)
		}
		s.recvs[c]++
		s.total++
		s.queueRecv(slot)
		if s.onRecv != nil {
			if err := s.onRecv(c, seq); err != nil {
				return err
			}
		}
	}
	return s.repost()
}

func (s *srqSide) until(ctx context.Context, cond func() bool) error {
	for !cond() {
		if err := s.step(ctx); err != nil {
			return err
		}
	}
	return nil
}

// allPast reports whether every connection has received more than k
// messages.
func (s *srqSide) allPast(k int) bool {
	for _, r := range s.recvs {
		if r <= k {
			return false
		}
	}
	return true
}

// checkSRQFlags checks --srq (n, given says whether it was on the command
// line) against the other flags before any device is touched.
func checkSRQFlags(t *trafficFlags, n int, given bool) error {
	switch {
	case given && (n < 1 || n > maxSRQConns):
		return usageErrorf("--srq %d: want a number of connections, 1 or more, at most %d", n, maxSRQConns)
	case given && t.ud:
		return usageErrorf("--srq needs RC QPs (--ud given): the SRQ ping-pong runs over connected QPs, like ibv_srq_pingpong")
	case given && t.rdmaCore && n > connect.RDMACoreSRQMessages:
		return usageErrorf("--srq %d with --rdma-core: ibv_srq_pingpong has at most %d QPs", n, connect.RDMACoreSRQMessages)
	}
	return nil
}

// maxSRQConns is the most connections pingpong --srq makes per side.
const maxSRQConns = 1024

// srqPingpong is pingpong --srq: n connections per side on one SRQ per
// side; on each, the client pings and the server echoes, every byte
// checked at both ends. Between pvctl ends the connections run in
// rounds: iters of them, a round trip on every connection each. With
// --rdma-core the traffic is ibv_srq_pingpong's (srqExchanges), and
// iters counts the round trips over all connections, as its -n does.
func srqPingpong(ctx context.Context, e *env, t *trafficFlags, d *vfrdma.Device, n, iters int, stall time.Duration) error {
	pd, err := d.AllocPD(ctx)
	if err != nil {
		return err
	}
	t.peerFlags.srq = true // with --rdma-core: ibv_srq_pingpong's exchange
	client, server, x, err := pair(ctx, &t.peerFlags, d, func() (*srqSide, error) {
		return newSRQSide(ctx, d, pd, n, t, stall)
	})
	if err != nil {
		return err
	}
	if x != nil {
		defer x.close()
		if x.server() {
			client, server = nil, client
		}
		// The receives are posted (newSRQSide): both sides may send.
		if err := x.barrier(ctx, "srq-pingpong-ready"); err != nil {
			return err
		}
	}
	// One watch for the run: a completion at either side (both sides in
	// loopback) is progress.
	var progress atomic.Int64
	for _, s := range []*srqSide{client, server} {
		if s != nil {
			s.progress = &progress
		}
	}
	sctx, stop := perf.WatchQuiet(ctx, &progress, stall)
	defer stop()
	start := time.Now()
	if t.rdmaCore {
		err = srqExchanges(sctx, client, server, iters)
	} else {
		err = srqRounds(sctx, client, server, n, iters)
	}
	if err != nil {
		return err
	}
	el := time.Since(start)
	// Every receive came from this process's SRQs, and what they rang is
	// the doorbells of the chained reposts.
	var doorbells uint64
	recvs := 0
	for _, s := range []*srqSide{client, server} {
		if s == nil {
			continue
		}
		var consumed uint64
		for _, v := range s.srq.Query().QPs {
			consumed += v.Consumed
		}
		if err := s.checkConsumed(consumed, n); err != nil {
			return err
		}
		doorbells += s.srq.DoorbellStats().Doorbells
		recvs += s.total
	}
	r := pingpongResult{Transport: "RC", SRQQPs: n, Size: t.size, Iters: iters, Seconds: el.Seconds(), Wait: t.waitMode(),
		RoundTripUS: float64(el.Microseconds()) / float64(iters), Checked: true,
		SRQDoorbellsPerRecv: float64(doorbells) / float64(recvs)}
	trips := iters
	if !t.rdmaCore {
		trips *= n
	}
	r.MbitPerSec = float64(2*t.size*trips*8) / el.Seconds() / 1e6
	if e.json {
		return e.printJSON(r)
	}
	if t.rdmaCore {
		fmt.Fprintf(e.out, "RC SRQ pingpong (ibv_srq_pingpong's traffic): %s on one SRQ, %s of %d bytes over them in %.2f s: %.1f µs per round trip, %.2f Mbit/s, every byte checked; %.3f SRQ doorbells per receive\n",
			count(n, "QP"), count(iters, "round trip"), t.size, r.Seconds, r.RoundTripUS, r.MbitPerSec, r.SRQDoorbellsPerRecv)
		return nil
	}
	fmt.Fprintf(e.out, "RC SRQ pingpong: %s per side on one SRQ, %s of %s of %d bytes in %.2f s: %.1f µs per round, %.2f Mbit/s, every byte checked; %.3f SRQ doorbells per receive\n",
		count(n, "QP"), count(iters, "round"), count(n, "round trip"), t.size, r.Seconds, r.RoundTripUS, r.MbitPerSec, r.SRQDoorbellsPerRecv)
	return nil
}

// srqRounds runs iters rounds between pvctl ends (both in loopback): in
// each the client pings on every connection and the server echoes.
func srqRounds(ctx context.Context, client, server *srqSide, n, iters int) error {
	if server != nil {
		server.onRecv = server.sendMsg // the echo: same connection, same sequence
	}
	for k := 0; k < iters; k++ {
		if client != nil {
			for c := 0; c < n; c++ {
				if err := client.sendMsg(c, seqOf(k, c, n)); err != nil {
					return err
				}
			}
		}
		if server != nil {
			if err := server.until(ctx, func() bool { return server.allPast(k) }); err != nil {
				return err
			}
		}
		if client != nil {
			if err := client.until(ctx, func() bool { return client.allPast(k) }); err != nil {
				return err
			}
		}
	}
	for _, s := range []*srqSide{client, server} {
		if s != nil {
			if err := s.until(ctx, func() bool { return s.sends >= n*iters }); err != nil {
				return err
			}
		}
	}
	return nil
}

// srqExchanges runs ibv_srq_pingpong's traffic at one end (client or
// server is nil): iters round trips in all, each connection a ping-pong
// of its own. The client sends one message on every connection, then
// another on a connection each time that connection's echo arrives, until
// it has sent iters; the server echoes each message on the connection it
// came on, iters of them. Each end stops once it has received iters and
// its iters sends completed. ibv_srq_pingpong echoes every message of
// the first iters (it stops echoing only once iters of its sends have
// completed); as a client it may send up to one more message per
// connection than iters, which the server receives and leaves unanswered.
func srqExchanges(ctx context.Context, client, server *srqSide, iters int) error {
	s := server
	if client != nil {
		s = client
		for c := range min(len(s.qps), iters) {
			if err := s.send1(c); err != nil {
				return err
			}
		}
	}
	s.onRecv = func(c, _ int) error {
		if s.posted >= iters {
			return nil
		}
		return s.send1(c)
	}
	return s.until(ctx, func() bool { return s.total >= iters && s.sends >= iters })
}

// send1 posts the next send, on connection c.
func (s *srqSide) send1(c int) error {
	if err := s.sendMsg(c, s.posted); err != nil {
		return err
	}
	s.posted++
	return nil
}

// checkConsumed checks the receives the SRQ counted consumed against the
// ones this end checked: the same, but for an rdma-core client's
// messages past its -n, one per connection (n) at most, which the end
// stopped before it polled.
func (s *srqSide) checkConsumed(consumed uint64, n int) error {
	if consumed == uint64(s.total) || s.rdmaCore && consumed > uint64(s.total) && consumed < uint64(s.total+n) {
		return nil
	}
	return fmt.Errorf("SRQ %d counted %d receives consumed, this end checked %d", s.srq.Handle(), consumed, s.total)
}

// fillByte sets every byte of b to v, doubling the copy (memmove) rather
// than a byte loop.
func fillByte(b []byte, v byte) {
	if len(b) == 0 {
		return
	}
	b[0] = v
	for k := 1; k < len(b); k *= 2 {
		copy(b[k:], b[:k])
	}
}

// zeroBlock is what checkZeros compares a message with, a block at a time
// (memequal: in a TCG guest a byte loop costs several ns a byte).
var zeroBlock [4096]byte

// checkZeros checks a message from ibv_srq_pingpong: every byte 0.
func checkZeros(b []byte, seq int) error {
	for off := 0; off < len(b); off += len(zeroBlock) {
		chunk := b[off:min(off+len(zeroBlock), len(b))]
		if bytes.Equal(chunk, zeroBlock[:len(chunk)]) {
			continue
		}
		i := 0
		for chunk[i] == 0 {
			i++
		}
		v := chunk[i]
		why := "ibv_srq_pingpong's messages are zeros"
		if v == srqPoison {
			why = "the slot's poison: nothing landed there"
		}
		return fmt.Errorf("message %d: byte %d is %#x, want 0 (%s)", seq, off+i, v, why)
	}
	return nil
}

// count is n and word, plural unless n is 1.
func count(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}
