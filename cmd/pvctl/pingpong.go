package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/connect"
	"github.com/vfrdma/vfrdma/internal/perf"
)

// trafficFlags are the flags pingpong and bench share.
type trafficFlags struct {
	peerFlags
	rc, ud       bool
	size         int
	bdf          string
	pollDoorbell bool
	pollPace     time.Duration // Options.PollPace
	waitSpin     time.Duration // Options.Spin
	spin         bool          // pingpong: poll without ever sleeping (the default; --events clears it)
	events       bool          // sleep on the CQ's interrupt when polls find nothing (rdma-core's -e)
	// The one-sided flags (onesided.go), and the mode they select: "",
	// sideWrite, sideRead or sideAtomic.
	write, read, atomic bool
	sided               string
}

func (t *trafficFlags) register(fs *flag.FlagSet, defSize int) {
	fs.BoolVar(&t.rc, "rc", false, "reliable connected QPs (the default)")
	fs.BoolVar(&t.ud, "ud", false, "unreliable datagram QPs")
	fs.IntVar(&t.size, "size", defSize, fmt.Sprintf("message size in bytes, 0 to %d", maxSize))
	t.peerFlags.register(fs,
		"wait for the other end (this end is the server) on `ADDR`: HOST:PORT, or :PORT for every address (with --rdma-core HOST alone: port 18515)",
		"connect to the other end (this end is the client) at `HOST:PORT` (with --rdma-core HOST alone: port 18515)",
		"the other end is the other VM of a two-VM bench run (VM 0 is the server)", "pvctl")
	fs.BoolVar(&t.pollDoorbell, "poll-doorbell", true, "an empty CQ poll rings the CQ's POLL doorbell and looks again, as rdma-core's provider does: the default unless --events (on QEMU the doorbell harvests the backend's completions at once, where a guest that spins without it starves the emulated device of CPU)")
	fs.DurationVar(&t.pollPace, "poll-pace", 0, "ring the POLL doorbell at most once per this long per CQ (Options.PollPace; 0: the driver's default, 50µs on QEMU, every empty poll on VMware's device; negative: every empty poll)")
	fs.DurationVar(&t.waitSpin, "wait-spin", 0, "how long CQ.Wait polls before it sleeps, with --events (Options.Spin; 0: the driver's default; negative: never)")
	fs.BoolVar(&t.events, "events", false, "sleep on the CQ's interrupt when polls find nothing, after the driver's spin (rdma-core's -e); by default the ends poll without sleeping, as rdma-core's tools and perftest do")
	fs.BoolVar(&t.events, "e", false, "short for --events")
	fs.BoolVar(&t.rdmaCore, "rdma-core", false, "the other end is rdma-core's ibv_rc_pingpong / ibv_ud_pingpong, or with --srq ibv_srq_pingpong (give its -q the --srq count; --iters then counts round trips over all the QPs, as its -n does): its exchange on --listen/--connect (port 18515), its buffer contents and traffic")
}

// wait is how the tool waits for completions: polling without sleeping
// (perf.Spin), or with --events as the CQ's options say (perf.Sleep:
// CQ.WaitN, Options.Spin and then the CQ's interrupt).
func (t *trafficFlags) wait() perf.Wait {
	if t.events {
		return perf.Sleep
	}
	return perf.Spin
}

// waitMode names the wait in the tools' output: "spin" or "events".
func (t *trafficFlags) waitMode() string { return t.wait().String() }

func (t *trafficFlags) typ() (vfrdma.QPType, error) {
	if t.rc && t.ud {
		return 0, errors.New("--rc and --ud exclude each other")
	}
	if t.ud {
		return vfrdma.UD, nil
	}
	return vfrdma.RC, nil
}

// maxSize is the largest --size: a GiB (an MR holds a message per slot).
const maxSize = 1 << 30

// maxCount is the most messages, round trips or frames a flag may ask
// for: the tools keep a time per message.
const maxCount = 10_000_000

// checkCount refuses a count flag's value below 1 or above maxCount.
func checkCount(name string, v int, what string) error {
	if v < 1 || v > maxCount {
		return usageErrorf("--%s %d: want 1 or more %s, at most %d", name, v, what, maxCount)
	}
	return nil
}

// parse parses args into fs and checks, before any device is reached,
// what the flags and the BDF argument cannot run with.
func (t *trafficFlags) parse(e *env, fs *flag.FlagSet, args []string) error {
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := e.checkBDF(fs.Args()); err != nil {
		return err
	}
	if fs.NArg() == 1 {
		t.bdf = fs.Arg(0)
	}
	if t.rc && t.ud {
		return usageErrorf("--rc and --ud exclude each other")
	}
	if t.events {
		if err := t.noPollDoorbell(fs, "--events"); err != nil {
			return err
		}
	}
	if err := t.resolveSided(fs); err != nil {
		return err
	}
	if t.size < 0 || t.size > maxSize {
		return usageErrorf("--size %d: want 0 to %d bytes", t.size, maxSize)
	}
	return t.peerFlags.check(e)
}

// given reports whether the command line set the flag name.
func given(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// noPollDoorbell turns the POLL doorbell off for a mode that sleeps on
// interrupts, and refuses --poll-doorbell given beside it: on QEMU 7.2 the
// driver never arms a CQ while it polls with the doorbell.
func (t *trafficFlags) noPollDoorbell(fs *flag.FlagSet, mode string) error {
	if given(fs, "poll-doorbell") && t.pollDoorbell {
		return usageErrorf("--poll-doorbell and %s exclude each other: a CQ polled with the POLL doorbell is never armed on QEMU", mode)
	}
	t.pollDoorbell = false
	return nil
}

// openDevice opens the target device for traffic.
func (t *trafficFlags) openDevice(e *env) (*vfrdma.Device, error) {
	var args []string
	if t.bdf != "" {
		args = []string{t.bdf}
	}
	d, err := e.open(args, &vfrdma.Options{PollDoorbell: t.pollDoorbell, PollPace: t.pollPace, Spin: t.waitSpin})
	if err != nil {
		return nil, err
	}
	if err := t.checkDevice(d); err != nil {
		return nil, errors.Join(err, d.Close())
	}
	return d, nil
}

// setup creates the local end(s) and connects them: two ends in loopback,
// one end connected to the peer otherwise.
func (t *trafficFlags) setup(ctx context.Context, d *vfrdma.Device, depth, size int) (a, b *endpoint, x exchanger, err error) {
	typ, err := t.typ()
	if err != nil {
		return nil, nil, nil, err
	}
	if typ == vfrdma.UD && size > d.UDMaxPayload() {
		return nil, nil, nil, fmt.Errorf("--size %d: a UD message holds at most %d bytes (the path MTU)", size, d.UDMaxPayload())
	}
	pd, err := d.AllocPD(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	return pair(ctx, &t.peerFlags, d, func() (*endpoint, error) {
		qkey := uint32(testQKey)
		if t.rdmaCore {
			qkey = rdmaCoreQKey
		}
		return newEndpoint(ctx, d, pd, typ, depth, size, qkey, t.sided)
	})
}

// end is one end of a connection as pair connects it: an endpoint, or
// the QPs of one side of pingpong --srq.
type end interface {
	info(d *vfrdma.Device) connect.Info
	connect(ctx context.Context, peer connect.Info) error
}

// pair makes the local end(s) with mk and connects them: two ends to each
// other in loopback (x nil), otherwise one end to the peer's, whose info
// the returned exchanger swapped (b is then the zero E).
func pair[E end](ctx context.Context, p *peerFlags, d *vfrdma.Device, mk func() (E, error)) (a, b E, x exchanger, err error) {
	var none E
	if a, err = mk(); err != nil {
		return none, none, nil, err
	}
	if p.loopback() {
		if b, err = mk(); err != nil {
			return none, none, nil, err
		}
		if err := a.connect(ctx, b.info(d)); err != nil {
			return none, none, nil, err
		}
		if err := b.connect(ctx, a.info(d)); err != nil {
			return none, none, nil, err
		}
		return a, b, nil, nil
	}
	if x, err = p.open(ctx); err != nil {
		return none, none, nil, err
	}
	peer, err := x.swap(ctx, a.info(d))
	if err == nil {
		err = a.connect(ctx, peer)
	}
	if err != nil {
		x.close()
		return none, none, nil, err
	}
	// This end is connected; the caller posts its receives (if mk did
	// not) and meets the peer at a barrier before traffic.
	return a, none, x, nil
}

// Message seq's byte i is byte(seq + 13i). As 13·256 is a multiple of
// 256, the bytes repeat every 256, and the block depends on seq only
// modulo 256: the 256 blocks are made once, and pattern and checkPattern
// copy or compare the one they need whole (memmove and memequal). In a
// TCG guest a byte loop costs several ns a byte: building even one block
// per message was several µs of a 64-byte ping-pong's turnaround.
const patternPeriod = 256

var patternBlocks = sync.OnceValue(func() *[patternPeriod][patternPeriod]byte {
	var t [patternPeriod][patternPeriod]byte
	for s := range t {
		for i := range t[s] {
			t[s][i] = byte(s + i*13)
		}
	}
	return &t
})

func pattern(b []byte, seq int) {
	blk := &patternBlocks()[byte(seq)]
	for off := 0; off < len(b); off += patternPeriod {
		copy(b[off:], blk[:])
	}
}

func checkPattern(b []byte, seq int) error {
	blk := &patternBlocks()[byte(seq)]
	for off := 0; off < len(b); off += patternPeriod {
		chunk := b[off:min(off+patternPeriod, len(b))]
		if bytes.Equal(chunk, blk[:len(chunk)]) {
			continue
		}
		for i, v := range chunk {
			if v != blk[i] {
				return fmt.Errorf("iteration %d: byte %d is %#x, want %#x", seq, off+i, v, blk[i])
			}
		}
	}
	return nil
}

// checkMessage is how pingpong checks a received message (a test watches
// it to see every message checked).
var checkMessage = checkPattern

type pingpongResult struct {
	Transport   string  `json:"transport"`
	Operation   string  `json:"operation,omitempty"` // --write: RDMA_WRITE_WITH_IMM; --read: RDMA_READ (then Iters counts READs, RoundTripUS is per READ)
	Role        string  `json:"role,omitempty"`      // --read between hosts: "target" on the end that is read (it reports nothing else)
	SRQQPs      int     `json:"srq_qps,omitempty"`
	Size        int     `json:"size"`
	Iters       int     `json:"iters"` // with --srq: rounds of srq_qps round trips at once (with --rdma-core too: round trips over all the QPs, ibv_srq_pingpong's -n)
	Seconds     float64 `json:"seconds"`
	RoundTripUS float64 `json:"round_trip_us"` // with --srq: per round (with --rdma-core too: per round trip)
	// The median and 99th percentile of the round trips, each timed on
	// its own (ib_send_lat's t_typical is the median's half); a plain
	// ping-pong only.
	MedianUS   float64 `json:"round_trip_median_us,omitempty"`
	P99US      float64 `json:"round_trip_p99_us,omitempty"`
	MbitPerSec float64 `json:"mbit_per_s"`
	Checked    bool    `json:"data_checked"`
	// Wait is how the ends waited for completions: "spin" (polling, the
	// default) or "events" (sleeping on the CQ's interrupt, --events).
	Wait string `json:"wait"`
	// SRQDoorbellsPerRecv is pingpong --srq's SRQ doorbells per receive
	// consumed (below 1: receives reposted in chains).
	SRQDoorbellsPerRecv float64 `json:"srq_doorbells_per_recv,omitempty"`
}

// stalled is a ping-pong's error when no completion came for too long: a
// message was lost (or never sent). It says how far the run got and what
// the endpoint's queues hold, so a loss can be told from a bug.
func stalled(ep *endpoint, after time.Duration, sends, recvs, roundTrips int) error {
	sq, rq := ep.qp.Outstanding()
	ctx, cancel := withTimeout(2 * time.Second)
	defer cancel()
	state, err := ep.qp.QueryState(ctx)
	dev := state.String()
	if err != nil {
		dev = "query failed: " + err.Error()
	}
	st := ep.cq.Stats()
	return fmt.Errorf("stalled: no completion for %v after %d round trips (this end completed %d sends and %d receives); "+
		"QP %#x (%v) state %v, device says %s, outstanding %d sends and %d receives; CQ %#x: %d polls (%d empty), %d CQEs, %d flushed, %d dropped, %d interrupts",
		after, roundTrips, sends, recvs, ep.qp.QPN(), ep.qp.Type(), ep.qp.State(), dev, sq, rq,
		ep.cq.Handle(), st.Polls, st.Empty, st.CQEs, st.Flushed, st.Dropped, st.Interrupts)
}

// pingpongOpts are pingpong's flags.
type pingpongOpts struct {
	t           trafficFlags
	iters, srqs int
	stall       time.Duration
}

// pingpongFlags declares pingpong's flags on fs.
func pingpongFlags(fs *flag.FlagSet) *pingpongOpts {
	o := &pingpongOpts{}
	t := &o.t
	t.register(fs, 4096)
	fs.IntVar(&o.iters, "iters", 1000, "round trips")
	fs.BoolVar(&t.spin, "spin", true, "poll the CQ without ever sleeping on it, as rdma-core's pingpongs do without -e (the default; --events sleeps)")
	fs.IntVar(&o.srqs, "srq", 0, fmt.Sprintf("`N` RC connections per side (1 to %d) whose receives come from one shared receive queue per side", maxSRQConns))
	fs.DurationVar(&o.stall, "stall", 10*time.Second, "fail, with the queues' state, when no completion comes for this long (a lost message)")
	t.registerOneSided(fs, "one-sided: each message is an RDMA WRITE WITH IMMEDIATE into the other end's buffer (like ib_write_lat), its receive completion and every byte checked (RC only, not on QEMU)", "")
	return o
}

// parsePingpong parses pingpong's flags and refuses, before any device is
// reached, what they cannot run with.
func parsePingpong(e *env, args []string) (*pingpongOpts, error) {
	fs := newFlagSet(e, "pingpong")
	o := pingpongFlags(fs)
	t := &o.t
	if err := t.parse(e, fs, args); err != nil {
		return nil, err
	}
	srqGiven, spinGiven := given(fs, "srq"), given(fs, "spin")
	if t.events {
		if spinGiven && t.spin {
			return nil, usageErrorf("--spin and --events exclude each other")
		}
		t.spin = false
	}
	if !t.spin && !t.events { // --spin=false is --events
		t.events = true
		if err := t.noPollDoorbell(fs, "--spin=false"); err != nil {
			return nil, err
		}
	}
	if err := checkSRQFlags(t, o.srqs, srqGiven); err != nil {
		return nil, err
	}
	if srqGiven && t.sided != "" {
		return nil, usageErrorf("--%s and --srq exclude each other", t.sided)
	}
	if err := checkCount("iters", o.iters, "round trips"); err != nil {
		return nil, err
	}
	if o.stall <= 0 {
		return nil, usageErrorf("--stall %v: want a positive duration", o.stall)
	}
	return o, nil
}

// cmdPingpong bounces a message back and forth and checks every byte, in
// the spirit of ibv_rc_pingpong. Its steps, in order: set up (the device,
// the ends, the exchange with the peer and the connection: trafficFlags.setup),
// prime (receives posted, the first message written), meet the peer at
// the barrier, measure (the round trips, each timed, then the last checks
// and send completions), report. It runs no untimed round trips before
// it measures: an rdma-core peer counts every one (its -n).
func cmdPingpong(e *env, args []string) error {
	o, err := parsePingpong(e, args)
	if err != nil {
		return err
	}
	t := &o.t
	d, err := t.openDevice(e)
	if err != nil {
		return err
	}
	defer d.Close()
	ctx, cancel := withTimeout(5 * time.Minute)
	defer cancel()
	if o.srqs > 0 {
		return srqPingpong(ctx, e, t, d, o.srqs, o.iters, o.stall)
	}
	a, b, x, err := t.setup(ctx, d, 4, t.size)
	if err != nil {
		return err
	}
	if x != nil {
		defer x.close()
	}
	if t.sided == sideRead {
		return readPingpong(ctx, e, t, a, x, o.iters, o.stall)
	}
	p := newPingpong(t, o.iters, o.stall, a, b)
	if err := p.prime(); err != nil {
		return err
	}
	if x != nil {
		if err := x.barrier(ctx, "pingpong-ready"); err != nil {
			return err
		}
	}
	rtts, el, err := p.measure(ctx, x)
	if err != nil {
		return err
	}
	return p.report(e, rtts, el)
}

// pingpong is a ping-pong under way: its ends (b's endpoint nil between
// hosts) and what its steps share.
//
// Each end counts its completed sends and receives; a receive is checked
// against its own sequence number (one CQ carries both kinds, so the next
// message may come before the last echo's send completion). A consumed
// receive is owed: its bytes are checked and it is posted again right
// after this end's next send, off the path from a message's arrival to
// its reply, as perftest's latency tests repost theirs off that path.
// Each end keeps two receives posted, in two slots, so one is always
// waiting and the next message cannot land in a slot not yet checked. (A
// --write lands in slot 0 whatever receive it consumes: it is checked on
// arrival.)
type pingpong struct {
	t     *trafficFlags
	iters int
	stall time.Duration
	a, b  pingEnd
	hdr   int // bytes before the message in a receive slot (UD's header room)
	// deferCheck: a receive's bytes are checked when it is settled, not
	// on arrival (all but --write).
	deferCheck bool
	recvOp     vfrdma.WCOpcode // what a message's receive completion reports
	fill       func([]byte, int)
	check      func([]byte, int) error
	wait       perf.Wait
	wcs        []vfrdma.WC
	wr         [1]vfrdma.SendWR
	sge        [1]vfrdma.SGE
	// sctx is measure's context, which ends once no completion came for
	// the stall time (progress counts them).
	sctx     context.Context
	progress atomic.Int64
}

// pingEnd is one end of a ping-pong and its progress.
type pingEnd struct {
	*endpoint
	sends, recvs int
	owed         []vfrdma.WC // receives consumed, to check and post again
	owedSeq      []int       // the message each carried
	ready        int         // 1 + the message already written into its send slot (0: none)
}

func newPingpong(t *trafficFlags, iters int, stall time.Duration, a, b *endpoint) *pingpong {
	p := &pingpong{t: t, iters: iters, stall: stall, a: pingEnd{endpoint: a}, b: pingEnd{endpoint: b},
		deferCheck: t.sided != sideWrite, recvOp: vfrdma.WCRecv, wait: t.wait(), wcs: make([]vfrdma.WC, 4),
		fill: pattern, check: checkMessage}
	if a.qp.Type() == vfrdma.UD {
		p.hdr = vfrdma.UDHeaderRoom
	}
	if t.rdmaCore {
		p.fill, p.check = fillRdmaCore, checkRdmaCore
	}
	// A message is a SEND, or with --write an RDMA WRITE WITH IMMEDIATE
	// (the sequence number) into the peer's slot 0, which consumes the
	// receive the peer posted.
	if t.sided == sideWrite {
		p.recvOp = vfrdma.WCRecvRDMAWithImm
	}
	return p
}

// ends returns the ends this process runs: a, and b in loopback.
func (p *pingpong) ends() []*pingEnd {
	if p.b.endpoint == nil {
		return []*pingEnd{&p.a}
	}
	return []*pingEnd{&p.a, &p.b}
}

// prime posts each end's two receives (before the barrier: the peer may
// send once it passed it) and makes room for the owed receives.
func (p *pingpong) prime() error {
	for _, pe := range p.ends() {
		for slot := 0; slot < 2; slot++ {
			if err := pe.postRecv(slot); err != nil {
				return err
			}
		}
		pe.owed, pe.owedSeq = make([]vfrdma.WC, 0, 2), make([]int, 0, 2)
	}
	return nil
}

// measure runs the round trips, each timed on its own (into a slice made
// before the loop, so the timing allocates nothing in it): the server's
// from one message's arrival to the next's, the client's from one send to
// the next; in loopback a pings and b pongs. Then the last messages'
// checks, and the echoes' send completions. It returns the round trips
// and the time of it all.
func (p *pingpong) measure(ctx context.Context, x exchanger) ([]time.Duration, time.Duration, error) {
	var stop func()
	p.sctx, stop = perf.WatchQuiet(ctx, &p.progress, p.stall)
	defer stop()
	a, b := &p.a, &p.b
	rtts := make([]time.Duration, p.iters)
	start := time.Now()
	last := start
	for i := 0; i < p.iters; i++ {
		var err error
		switch {
		case b.endpoint != nil:
			err = p.ping(a, i, b)
		case x.server():
			if err = p.until(a, i+1, 0); err == nil {
				err = p.send(a, i)
			}
		default:
			err = p.ping(a, i, nil)
		}
		if err != nil {
			return nil, 0, err
		}
		now := time.Now()
		rtts[i], last = now.Sub(last), now
	}
	for _, pe := range p.ends() {
		if err := p.settle(pe, false); err != nil {
			return nil, 0, err
		}
	}
	for _, pe := range p.ends() {
		if err := p.until(pe, 0, p.iters); err != nil {
			return nil, 0, err
		}
	}
	return rtts, time.Since(start), nil
}

// ping is round trip i from a: its message out, b's echo (b is the peer,
// in this process in loopback) back, and a's send completed.
func (p *pingpong) ping(a *pingEnd, i int, b *pingEnd) error {
	if err := p.send(a, i); err != nil {
		return err
	}
	if b != nil {
		if err := p.until(b, i+1, 0); err != nil {
			return err
		}
		if err := p.send(b, i); err != nil {
			return err
		}
	}
	return p.until(a, i+1, i+1)
}

// send sends message seq from pe: a SEND, or an RDMA WRITE WITH IMMEDIATE
// (--write). Messages go out of two send slots in turn. Message seq+1 is
// written into its slot right after message seq is posted (off the round
// trip, as the reply to come cannot be sent before then) when the slot's
// last send, seq-1, has completed; otherwise when it is sent. The owed
// receives are settled after the post.
func (p *pingpong) send(pe *pingEnd, seq int) error {
	if pe.ready != seq+1 {
		p.fill(p.sendBuf(pe, seq), seq)
	}
	pe.sendWR(&p.wr[0], p.sge[:], uint64(seq), seq%2, p.t.size)
	if p.t.sided == sideWrite {
		p.wr[0].Opcode, p.wr[0].Imm, p.wr[0].RemoteAddr, p.wr[0].RKey = vfrdma.OpRDMAWriteWithImm, uint32(seq), pe.target.Addr, pe.target.RKey
	}
	if _, err := pe.qp.PostSend(p.wr[:], 0); err != nil {
		return err
	}
	if err := p.settle(pe, true); err != nil {
		return err
	}
	if pe.sends >= seq && seq+1 < p.iters {
		p.fill(p.sendBuf(pe, seq+1), seq+1)
		pe.ready = seq + 2
	}
	return nil
}

// sendBuf is message seq's send slot.
func (p *pingpong) sendBuf(pe *pingEnd, seq int) []byte {
	return pe.send.Bytes()[(seq%2)*pe.slot:][:p.t.size]
}

// settle checks the owed receives' bytes and, with repost, posts them
// again (one chain, one doorbell).
func (p *pingpong) settle(pe *pingEnd, repost bool) error {
	for i, wc := range pe.owed {
		if !p.deferCheck {
			break
		}
		if err := p.check(pe.recv.Bytes()[int(wc.WRID)*pe.slot+p.hdr:][:p.t.size], pe.owedSeq[i]); err != nil {
			return err
		}
	}
	var err error
	if repost {
		err = pe.repost(pe.owed)
	}
	pe.owed, pe.owedSeq = pe.owed[:0], pe.owedSeq[:0]
	return err
}

// until takes pe's completions until it has received recvs messages and
// completed sends sends.
func (p *pingpong) until(pe *pingEnd, recvs, sends int) error {
	for pe.recvs < recvs || pe.sends < sends {
		if err := p.step(pe); err != nil {
			return err
		}
	}
	return nil
}

// step takes pe's next completions: a send's is counted, a receive's
// checked (its opcode, immediate data and length; its bytes now with
// --write, at settle otherwise) and owed.
func (p *pingpong) step(pe *pingEnd) error {
	n, err := p.wait.Next(p.sctx, pe.cq, p.wcs)
	if err != nil && perf.Quiet(p.sctx) {
		return stalled(pe.endpoint, p.stall, pe.sends, pe.recvs, p.a.recvs)
	}
	if err != nil {
		return err
	}
	p.progress.Add(int64(n))
	for _, wc := range p.wcs[:n] {
		if wc.Status != vfrdma.WCSuccess {
			return fmt.Errorf("message %d: completion %+v", pe.recvs, wc)
		}
		if !isRecv(wc.Opcode) {
			pe.sends++
			continue
		}
		switch {
		case wc.Opcode != p.recvOp:
			return fmt.Errorf("message %d: receive completion opcode %v, want %v", pe.recvs, wc.Opcode, p.recvOp)
		case p.t.sided == sideWrite && (!wc.HasImm() || wc.Imm != uint32(pe.recvs)):
			return fmt.Errorf("message %d: the RDMA WRITE WITH IMMEDIATE's completion carries immediate data %#x (flags %#x), want %#x", pe.recvs, wc.Imm, wc.Flags, uint32(pe.recvs))
		}
		if int(wc.ByteLen) != p.t.size+p.hdr {
			return fmt.Errorf("message %d: received %d bytes, want %d", pe.recvs, int(wc.ByteLen)-p.hdr, p.t.size)
		}
		if !p.deferCheck {
			if err := p.check(pe.recv.Bytes()[p.hdr:][:p.t.size], pe.recvs); err != nil {
				return err
			}
		}
		pe.owed, pe.owedSeq = append(pe.owed, wc), append(pe.owedSeq, pe.recvs)
		pe.recvs++
	}
	return nil
}

// report prints the result: rtts are the round trips, el the time of the
// whole measure.
func (p *pingpong) report(e *env, rtts []time.Duration, el time.Duration) error {
	t, iters := p.t, p.iters
	typ, _ := t.typ()
	r := pingpongResult{Transport: typ.String(), Size: t.size, Iters: iters, Seconds: el.Seconds(),
		RoundTripUS: float64(el.Microseconds()) / float64(iters),
		MbitPerSec:  float64(2*t.size*iters*8) / el.Seconds() / 1e6, Checked: true, Wait: t.waitMode()}
	r.MedianUS, r.P99US = perf.US(perf.Quantile(rtts, 0.5)), perf.US(perf.Quantile(rtts, 0.99))
	how := ""
	if t.sided == sideWrite {
		r.Operation = vfrdma.OpRDMAWriteWithImm.String()
		how = " (RDMA WRITE WITH IMMEDIATE)"
	}
	if e.json {
		return e.printJSON(r)
	}
	fmt.Fprintf(e.out, "%s pingpong%s: %d round trips of %d bytes in %.2f s: %.1f µs per round trip (median %.1f µs, 99th percentile %.1f µs), %.2f Mbit/s, every byte checked; waiting: %s\n",
		r.Transport, how, iters, t.size, r.Seconds, r.RoundTripUS, r.MedianUS, r.P99US, r.MbitPerSec, r.Wait)
	return nil
}

// isRecv reports a receive's completion opcode.
func isRecv(op vfrdma.WCOpcode) bool {
	return op == vfrdma.WCRecv || op == vfrdma.WCRecvRDMAWithImm
}
