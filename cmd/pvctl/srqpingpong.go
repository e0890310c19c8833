package main

import (
	"context"
	"fmt"
	"time"

	"github.com/vfrdma/vfrdma"
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
	poll   func(context.Context, *vfrdma.CQ, []vfrdma.WC) (int, error) // spinPoll, or waitPoll with --events
}

func newSRQSide(ctx context.Context, d *vfrdma.Device, pd *vfrdma.PD, n int, t *trafficFlags) (*srqSide, error) {
	s := &srqSide{size: t.size, depth: max(16, 4*n), conn: map[uint32]int{}, recvs: make([]int, n), poll: t.poller()}
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
	// Every receive buffer goes to the SRQ (the QPs exist: QEMU needs one).
	for slot := 0; slot < s.depth; slot++ {
		s.queueRecv(slot)
	}
	return s, s.repost()
}

func (s *srqSide) info(d *vfrdma.Device) peerInfo {
	p := peerInfo{GID: d.GID()}
	for _, qp := range s.qps {
		p.QPNs = append(p.QPNs, qp.QPN())
	}
	return p
}

func (s *srqSide) connect(ctx context.Context, peer peerInfo) error {
	if len(peer.QPNs) != len(s.qps) {
		return fmt.Errorf("the other end has %d SRQ QPs, this one %d: give both the same --srq", len(peer.QPNs), len(s.qps))
	}
	for i, qp := range s.qps {
		if err := qp.Connect(ctx, vfrdma.Remote{QPN: peer.QPNs[i], GID: peer.GID}, 0); err != nil {
			return err
		}
	}
	return nil
}

// queueRecv adds a receive into slot to the next repost chain.
func (s *srqSide) queueRecv(slot int) {
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
	b := s.send.Bytes()[c*max(s.size, 1):][:s.size]
	pattern(b, seq)
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

// step polls the CQ once (with --events sleeping on it when idle) and checks each
// receive against its connection's next sequence number.
func (s *srqSide) step(ctx context.Context) error {
	n, err := s.poll(ctx, s.cq, s.wcs)
	if err != nil {
		return err
	}
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
		if err := checkPattern(s.recv.Bytes()[slot*max(s.size, 1):][:s.size], seq); err != nil {
			return fmt.Errorf("connection %d: %w", c, err)
		}
		s.recvs[c]++
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
	}
	return nil
}

// maxSRQConns is the most connections pingpong --srq makes per side.
const maxSRQConns = 1024

// srqPingpong is pingpong --srq: n connections per side on one SRQ per
// side; on each, the client pings and the server echoes, every byte
// checked at both ends.
func srqPingpong(ctx context.Context, e *env, t *trafficFlags, d *vfrdma.Device, n, iters int) error {
	pd, err := d.AllocPD(ctx)
	if err != nil {
		return err
	}
	client, server, x, err := pair(ctx, &t.peerFlags, d, func() (*srqSide, error) {
		return newSRQSide(ctx, d, pd, n, t)
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
	if server != nil {
		server.onRecv = server.sendMsg // the echo: same connection, same sequence
	}
	start := time.Now()
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
	el := time.Since(start)
	// Every receive came from this process's SRQs, n*iters per side, and
	// what they rang is the doorbells of the chained reposts.
	var doorbells uint64
	sides := 0
	for _, s := range []*srqSide{client, server} {
		if s == nil {
			continue
		}
		var consumed uint64
		for _, v := range s.srq.Query().QPs {
			consumed += v.Consumed
		}
		if consumed != uint64(n*iters) {
			return fmt.Errorf("SRQ %d counted %d receives consumed, want %d", s.srq.Handle(), consumed, n*iters)
		}
		doorbells += s.srq.DoorbellStats().Doorbells
		sides++
	}
	r := pingpongResult{Transport: "RC", SRQQPs: n, Size: t.size, Iters: iters, Seconds: el.Seconds(), Wait: t.waitMode(),
		RoundTripUS: float64(el.Microseconds()) / float64(iters),
		MbitPerSec:  float64(2*t.size*iters*n*8) / el.Seconds() / 1e6, Checked: true,
		SRQDoorbellsPerRecv: float64(doorbells) / float64(sides*n*iters)}
	if e.json {
		return e.printJSON(r)
	}
	fmt.Fprintf(e.out, "RC SRQ pingpong: %s per side on one SRQ, %s of %s of %d bytes in %.2f s: %.1f µs per round, %.2f Mbit/s, every byte checked; %.3f SRQ doorbells per receive\n",
		count(n, "QP"), count(iters, "round"), count(n, "round trip"), t.size, r.Seconds, r.RoundTripUS, r.MbitPerSec, r.SRQDoorbellsPerRecv)
	return nil
}

// count is n and word, plural unless n is 1.
func count(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}
