package main

import (
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/connect"
)

// exchanger swaps package connect's Info with the other end (its QPs as
// endpoints, the regions its one-sided peer names, and the command's own
// data): over TCP (connect's native format between two pvctl ends,
// rdma-core's with --rdma-core), or through the bench's rendezvous
// between VMs (the native format's hello, in base64).
type exchanger interface {
	swap(ctx context.Context, mine connect.Info) (connect.Info, error)
	// barrier returns once the other end called it with the same name.
	barrier(ctx context.Context, name string) error
	// server reports which end receives (the client sends first).
	server() bool
	close()
}

// peerFlags are the common flags that pick the other end.
type peerFlags struct {
	listen  string // TCP address to wait on (server)
	connect string // TCP address to dial (client)
	vm      bool   // through the bench's rendezvous (openRendezvous): VM 0 is the server
	tag     string // rendezvous key prefix
	// rdmaCore speaks rdma-core's pingpong exchange on --listen/--connect
	// (port 18515 by default): the peer is ibv_rc_pingpong or
	// ibv_ud_pingpong.
	rdmaCore bool
	// srq, with rdmaCore, speaks ibv_srq_pingpong's exchange instead
	// (pingpong --srq).
	srq bool
	// waitPeer is how long open waits for the other end: the client
	// retrying its dial, the server for the client (--wait-peer).
	waitPeer time.Duration
	// notes, if set, is told what open waits for: once after noteFirst,
	// then every noteEvery (defaultNoteFirst, defaultNoteEvery when 0).
	notes                io.Writer
	noteFirst, noteEvery time.Duration
}

// When a waiting end first says what it waits for, and how often after.
const (
	defaultNoteFirst = 2 * time.Second
	defaultNoteEvery = 10 * time.Second
	defaultWaitPeer  = 5 * time.Minute
)

// register declares the flags that pick the other end: --listen,
// --connect, --vm, --tag and --wait-peer, with the roles' words.
func (p *peerFlags) register(fs *flag.FlagSet, listen, connect, vm, tag string) {
	fs.StringVar(&p.listen, "listen", "", listen)
	fs.StringVar(&p.connect, "connect", "", connect)
	fs.BoolVar(&p.vm, "vm", false, vm)
	fs.StringVar(&p.tag, "tag", tag, "rendezvous key prefix for --vm (`KEY`)")
	fs.DurationVar(&p.waitPeer, "wait-peer", defaultWaitPeer, "how long to wait for the other end: the client retries its connection (saying on stderr what it waits for, after 2 s and then every 10 s), the server waits for its client")
}

// check refuses, before any device is reached, flags that pick the other
// end in two ways at once, an address that cannot be one, and the other
// end with --model (which runs both ends in this process).
func (p *peerFlags) check(e *env) error {
	n := 0
	for _, on := range []bool{p.listen != "", p.connect != "", p.vm} {
		if on {
			n++
		}
	}
	if n > 1 {
		return usageErrorf("--listen, --connect and --vm exclude each other: this end is the server (--listen), the client (--connect) or a bench VM (--vm)")
	}
	if p.listen != "" {
		if err := checkAddr("--listen", p.listen, true, p.rdmaCore); err != nil {
			return err
		}
	}
	if p.connect != "" {
		if err := checkAddr("--connect", p.connect, false, p.rdmaCore); err != nil {
			return err
		}
	}
	if p.rdmaCore && p.listen == "" && p.connect == "" {
		return usageErrorf("--rdma-core needs --listen ADDR or --connect HOST (the peer is an rdma-core program)")
	}
	if p.waitPeer <= 0 {
		return usageErrorf("--wait-peer %v: want a positive duration", p.waitPeer)
	}
	if p.vm && p.tag == "" {
		return usageErrorf("--tag \"\": --vm needs a rendezvous key prefix")
	}
	if e.model != "" && !p.loopback() && e.fabric == nil {
		return usageErrorf("--model runs both ends in this process: no --listen, --connect or --vm (two processes: --fabric DIR)")
	}
	p.notes = e.errOut
	return nil
}

// checkAddr checks a --listen or --connect address: HOST:PORT, the port 1
// to 65535, the host an IP address or a host name (a server may leave it
// out: every address); with --rdma-core the port may be left out (rdma-core's
// 18515).
func checkAddr(flagName, addr string, listen, rdmaCore bool) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		if !rdmaCore {
			return usageErrorf("%s %q: want HOST:PORT", flagName, addr)
		}
		host, port = strings.TrimSuffix(strings.TrimPrefix(addr, "["), "]"), strconv.Itoa(connect.RDMACorePort)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return usageErrorf("%s %q: port %q: want a number from 1 to 65535", flagName, addr, port)
	}
	switch {
	case host == "" && listen:
		return nil
	case host == "":
		return usageErrorf("%s %q: want the server's host before the port", flagName, addr)
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return nil
	}
	if strings.Trim(host, "0123456789.") == "" || strings.Contains(host, ":") {
		return usageErrorf("%s %q: %q is not an IP address", flagName, addr, host)
	}
	if !hostName(host) {
		return usageErrorf("%s %q: %q is neither an IP address nor a host name", flagName, addr, host)
	}
	return nil
}

// hostName reports a well-formed DNS name: dot-separated labels of 1 to 63
// letters, digits, hyphens (not first or last) and underscores, 253
// characters at most.
func hostName(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	for _, l := range strings.Split(s, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// loopback reports whether both ends are in this process.
func (p *peerFlags) loopback() bool {
	return p.listen == "" && p.connect == "" && !p.vm && !p.rdmaCore
}

// waitNotes says on w, once after first and then every every, what an end
// waits for (what's text, asked at each note), until the returned stop is
// called; stop returns once no note can follow.
func waitNotes(w io.Writer, first, every time.Duration, what func(waited time.Duration) string) (stop func()) {
	if w == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTimer(first)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fmt.Fprintf(w, "pvctl: %s\n", what(time.Since(start).Round(time.Second)))
				t.Reset(every)
			}
		}
	}()
	return func() {
		close(done)
		wg.Wait()
	}
}

// dialReason is what a failed dial says in a note: the system's words
// ("connection refused"), or the whole error.
func dialReason(err error) string {
	var se *os.SyscallError
	if errors.As(err, &se) {
		return se.Err.Error()
	}
	return err.Error()
}

func (p *peerFlags) open(ctx context.Context) (exchanger, error) {
	wait := p.waitPeer
	if wait <= 0 {
		wait = defaultWaitPeer
	}
	first, every := p.noteFirst, p.noteEvery
	if first <= 0 {
		first = defaultNoteFirst
	}
	if every <= 0 {
		every = defaultNoteEvery
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	opts := &connect.Options{}
	if p.rdmaCore {
		opts.Format = connect.RDMACore
		if p.srq {
			opts.Format = connect.RDMACoreSRQ
		}
	}
	switch {
	case p.vm:
		r, vm, err := openRendezvous()
		if err != nil {
			return nil, err
		}
		return &vmExchange{c: r, vm: vm, tag: p.tag}, nil
	case p.rdmaCore && p.listen == "" && p.connect == "":
		return nil, fmt.Errorf("--rdma-core needs --listen ADDR or --connect HOST (the peer is an rdma-core program)")
	case p.listen != "":
		ln, err := connect.Listen(ctx, p.listen, opts)
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		addr := ln.Addr().String()
		stop := waitNotes(p.notes, first, every, func(waited time.Duration) string {
			return fmt.Sprintf("waiting for the client on %s (%v of --wait-peer %v)", addr, waited, wait)
		})
		c, err := ln.Accept(wctx)
		stop()
		if err != nil {
			return nil, fmt.Errorf("waiting for the client on %s (--wait-peer %v): %w", addr, wait, err)
		}
		return &tcpExchange{c: c}, nil
	default:
		// The peer may still be starting, or its address not resolved
		// yet on a busy bench: Dial retries until --wait-peer ends, and
		// the notes say what this end waits for.
		var last atomic.Pointer[connect.Progress]
		opts.Progress = func(pr connect.Progress) { last.Store(&pr) }
		stop := waitNotes(p.notes, first, every, func(waited time.Duration) string {
			addr, reason := p.connect, "no answer yet"
			if pr := last.Load(); pr != nil {
				addr, reason = pr.Addr, dialReason(pr.Err)
			}
			return fmt.Sprintf("waiting for the server at %s: %s; retrying (%v of --wait-peer %v)", addr, reason, waited, wait)
		})
		c, err := connect.Dial(wctx, p.connect, opts)
		stop()
		switch {
		case err == nil:
			return &tcpExchange{c: c}, nil
		case ctx.Err() != nil:
			return nil, fmt.Errorf("connecting to %s: %w", p.connect, ctx.Err())
		case wctx.Err() != nil, errors.Is(err, context.DeadlineExceeded):
			// --wait-peer ran out (Dial can see the deadline pass a
			// moment before the context reads as done).
			addr, reason := p.connect, dialReason(err)
			var ce *connect.Error
			if errors.As(err, &ce) {
				addr = ce.Addr
			}
			if pr := last.Load(); pr != nil {
				reason = dialReason(pr.Err)
			}
			return nil, fmt.Errorf("no server at %s after --wait-peer %v (%s)", addr, wait, reason)
		}
		return nil, err
	}
}

// tcpExchange is an exchanger over a connection of package connect: the
// native format between two pvctl ends, or rdma-core's with --rdma-core.
type tcpExchange struct {
	c     *connect.Conn
	ready bool // the first barrier (connect's Ready) is behind
}

func (t *tcpExchange) swap(ctx context.Context, mine connect.Info) (connect.Info, error) {
	return t.c.Exchange(ctx, mine)
}

// barrier: the first is connect's Ready (pvctl's first barrier always
// comes after this end posted its receives), the later ones its named
// Barriers.
func (t *tcpExchange) barrier(ctx context.Context, name string) error {
	if !t.ready {
		if err := t.c.Ready(ctx); err != nil {
			return err
		}
		t.ready = true
		return nil
	}
	return t.c.Barrier(ctx, name)
}

func (t *tcpExchange) server() bool { return t.c.Server() }
func (t *tcpExchange) close()       { t.c.Close() }

// rendezvous is the bench's key/value store shared by the VMs of a run: a
// key is written once per run, and Get waits until it has a value (or ctx
// ends). The bench provides it to the pvctl it builds for its guests
// (rendezvous_guest.go: qemu/guestctl's Conn over the guest's control
// channel); pvctl itself depends on nothing of the bench.
type rendezvous interface {
	Put(key, value string) error
	Get(ctx context.Context, key string) (string, error)
	Close() error
}

// vmExchange swaps through a rendezvous, keyed by tag and VM index: VM 0
// and VM 1 of the run are the two ends.
type vmExchange struct {
	c   rendezvous
	vm  int
	tag string
}

// swap writes mine as connect's native hello (Info.MarshalBinary, in
// base64: the rendezvous holds text) and reads the other VM's, checked as
// connect checks a peer's.
func (v *vmExchange) swap(ctx context.Context, mine connect.Info) (connect.Info, error) {
	b, err := mine.MarshalBinary()
	if err != nil {
		return connect.Info{}, err
	}
	if err := v.c.Put(fmt.Sprintf("%s/%d", v.tag, v.vm), base64.StdEncoding.EncodeToString(b)); err != nil {
		return connect.Info{}, err
	}
	s, err := v.c.Get(ctx, fmt.Sprintf("%s/%d", v.tag, 1-v.vm))
	if err != nil {
		return connect.Info{}, err
	}
	b, err = base64.StdEncoding.DecodeString(s)
	if err != nil {
		return connect.Info{}, fmt.Errorf("the other VM's address: %w: not base64 (%w)", connect.ErrProtocol, err)
	}
	var theirs connect.Info
	if err := theirs.UnmarshalBinary(b); err != nil {
		return connect.Info{}, fmt.Errorf("the other VM's address: %w", err)
	}
	return theirs, nil
}

// barrier waits until the other VM reached the same point.
func (v *vmExchange) barrier(ctx context.Context, name string) error {
	if err := v.c.Put(fmt.Sprintf("%s/%s/%d", v.tag, name, v.vm), "1"); err != nil {
		return err
	}
	_, err := v.c.Get(ctx, fmt.Sprintf("%s/%s/%d", v.tag, name, 1-v.vm))
	return err
}

func (v *vmExchange) server() bool { return v.vm == 0 }
func (v *vmExchange) close()       { v.c.Close() }

// endpoint is one end of a test connection: a QP with its CQ and buffers.
type endpoint struct {
	pd   *vfrdma.PD
	cq   *vfrdma.CQ
	qp   *vfrdma.QP
	send *vfrdma.MR
	recv *vfrdma.MR
	slot int // bytes per buffer slot (UD: header room included)
	// msgSize, if set, is what benchSend sends (at most a slot).
	msgSize int
	depth   int
	ah      *vfrdma.AH
	peer    connect.Endpoint // the other end's QP
	qkey    uint32
	// psn is this end's first send PSN, random: a stale packet of an
	// earlier connection on a reused QPN does not fit the sequence.
	psn uint32
	// rwrs and rsges hold the chain repost builds (one SGE per WR).
	rwrs  []vfrdma.RecvWR
	rsges []vfrdma.SGE
	// sided is the one-sided mode ("" for SEND): recv is then also the
	// target region, with the remote rights the mode needs, and target
	// is the other end's.
	sided  string
	target connect.Region
}

const testQKey = 0x1ee7

// newEndpoint makes an endpoint: with a one-sided mode (sided), its
// receive MR is the target region and grants the mode's remote rights.
func newEndpoint(ctx context.Context, d *vfrdma.Device, pd *vfrdma.PD, typ vfrdma.QPType, depth, size int, qkey uint32, sided string) (*endpoint, error) {
	e := &endpoint{pd: pd, depth: depth, slot: size, qkey: qkey, sided: sided, psn: connect.RandomPSN()}
	if typ == vfrdma.UD {
		e.slot += vfrdma.UDHeaderRoom
	}
	var err error
	if e.cq, err = d.CreateCQ(ctx, 2*depth); err != nil {
		return nil, err
	}
	if e.qp, err = pd.CreateQP(ctx, &vfrdma.QPConfig{Type: typ, SendCQ: e.cq, RecvCQ: e.cq, SendDepth: depth, RecvDepth: depth, QKey: e.qkey, SignalAll: true}); err != nil {
		return nil, err
	}
	// An MR has a byte at least (--size 0: zero-length messages).
	if e.send, err = pd.AllocMR(ctx, max(depth*e.slot, 1), vfrdma.AccessLocalWrite); err != nil {
		return nil, err
	}
	if e.recv, err = pd.AllocMR(ctx, max(depth*e.slot, 1), vfrdma.AccessLocalWrite|remoteAccess(sided)); err != nil {
		return nil, err
	}
	if sided != "" {
		prepareTarget(e, sided)
	}
	return e, nil
}

// info is what the other end needs of e: its QP, and with a one-sided
// mode its target region and the terms (the mode, the slot size).
func (e *endpoint) info(d *vfrdma.Device) connect.Info {
	in := connect.Info{Endpoints: []connect.Endpoint{{QPN: e.qp.QPN(), GID: d.GID(), QKey: e.qkey, PSN: e.psn}}}
	if e.sided != "" {
		in.Regions = []connect.Region{connect.RegionOf(e.recv)}
		in.Data = terms{OneSided: e.sided, Slot: e.slot}.encode()
	}
	return in
}

func (e *endpoint) connect(ctx context.Context, peer connect.Info) error {
	if n := len(peer.Endpoints); n != 1 {
		return fmt.Errorf("the other end offers %d QPs, this end has 1: give both ends the same mode (--srq on both or neither)", n)
	}
	if err := e.checkPeer(peer); err != nil {
		return err
	}
	e.peer = peer.Endpoints[0]
	if e.qp.Type() == vfrdma.UD {
		ah, err := e.pd.CreateAH(vfrdma.AHAttr{DGID: e.peer.GID})
		if err != nil {
			return err
		}
		e.ah = ah
		return e.qp.Connect(ctx, vfrdma.Remote{}, 0)
	}
	return e.qp.Connect(ctx, e.peer.Remote(), e.psn)
}

// postRecv posts a receive into slot.
func (e *endpoint) postRecv(slot int) error {
	wr := [1]vfrdma.RecvWR{{WRID: uint64(slot), SGEs: []vfrdma.SGE{e.recv.SGE(slot*e.slot, e.slot)}}}
	_, err := e.qp.PostRecv(wr[:], 0)
	return err
}

// repost posts again, as one chain (one doorbell), the receives whose
// completions are in wcs: each into the slot its WRID names.
func (e *endpoint) repost(wcs []vfrdma.WC) error {
	if len(wcs) == 0 {
		return nil
	}
	if len(wcs) > len(e.rwrs) {
		e.rwrs = make([]vfrdma.RecvWR, len(wcs))
		e.rsges = make([]vfrdma.SGE, len(wcs))
	}
	for i, wc := range wcs {
		slot := int(wc.WRID)
		e.rsges[i] = e.recv.SGE(slot*e.slot, e.slot)
		e.rwrs[i] = vfrdma.RecvWR{WRID: wc.WRID, SGEs: e.rsges[i : i+1]}
	}
	_, err := e.qp.PostRecv(e.rwrs[:len(wcs)], 0)
	return err
}

// sendWR fills wr to send n bytes from slot, with sge (one element, the
// caller's) as its SGE list.
func (e *endpoint) sendWR(wr *vfrdma.SendWR, sge []vfrdma.SGE, id uint64, slot, n int) {
	sge[0] = e.send.SGE(slot*e.slot, n)
	*wr = vfrdma.SendWR{WRID: id, SGEs: sge[:1], AH: e.ah, RemoteQPN: e.peer.QPN, RemoteQKey: e.peer.QKey}
	if n == 0 {
		wr.SGEs = nil
	}
}

func withTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}
