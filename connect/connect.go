package connect

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vfrdma/vfrdma"
)

// Format is the wire format of an exchange.
type Format int

// The formats (see the package documentation).
const (
	// Native is this package's own exchange.
	Native Format = iota
	// RDMACore is ibv_rc_pingpong's and ibv_ud_pingpong's: one endpoint,
	// one text message each way.
	RDMACore
	// RDMACoreSRQ is ibv_srq_pingpong's: 1 to RDMACoreSRQMessages
	// endpoints, RDMACoreSRQMessages text messages each way.
	RDMACoreSRQ
)

func (f Format) String() string {
	switch f {
	case Native:
		return "native"
	case RDMACore:
		return "rdma-core"
	case RDMACoreSRQ:
		return "rdma-core-srq"
	}
	return "Format(" + strconv.Itoa(int(f)) + ")"
}

// rdma-core's example programs' facts.
const (
	// RDMACorePort is the TCP port the pingpong programs use by default.
	RDMACorePort = 18515
	// RDMACoreQKey is the Q_Key ibv_ud_pingpong gives its QP and sends
	// with.
	RDMACoreQKey = 0x11111111
	// RDMACoreSRQMessages is how many address messages ibv_srq_pingpong
	// writes and reads each way, whatever its number of QPs.
	RDMACoreSRQMessages = 256
)

// Bounds of the native format, on what each end sends and accepts.
const (
	MaxEndpoints   = 4096     // endpoints in an Info
	MaxRegions     = 4096     // regions in an Info
	MaxData        = 64 << 10 // bytes of Info.Data
	MaxBarrierName = 255      // bytes of a barrier's name
)

// Sentinel errors, matched with errors.Is.
var (
	// ErrProtocol reports a peer that sent something that is not the
	// exchange: another protocol, another version, a count or length out
	// of bounds, a truncated message, a malformed field.
	ErrProtocol = errors.New("protocol violation")
	// ErrRefused reports a peer that refused what this end sent (native
	// format); the error carries its reason.
	ErrRefused = errors.New("the peer refused the exchange")
	// ErrTimeout reports a peer that broke off inside the exchange, for
	// Options.ExchangeTimeout: a message it began and did not finish,
	// this end's message it did not take, or (at the server) a first
	// message it did not begin.
	ErrTimeout = errors.New("the exchange timed out")
)

// Error is the error of a step of the exchange: the step (Op: "listen",
// "accept", "dial", "exchange", "ready", "barrier"), the peer's address
// (the listening address for listen and accept), and what went wrong.
type Error struct {
	Op   string
	Addr string
	Err  error
}

func (e *Error) Error() string {
	switch e.Op {
	case "listen", "dial":
		return "connect: " + e.Op + " " + e.Addr + ": " + e.Err.Error()
	case "accept":
		return "connect: accept on " + e.Addr + ": " + e.Err.Error()
	}
	return "connect: " + e.Op + " with " + e.Addr + ": " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// Endpoint is what the peer of a QP needs to know of it.
type Endpoint struct {
	QPN uint32     // its QP number (24 bits, not 0)
	GID vfrdma.GID // the GID its packets come from and go to
	// PSN is its first send PSN (24 bits): the peer's receive PSN. The
	// peer connects with Remote(); this end passes PSN to QP.Connect.
	PSN uint32
	// MTU is its path MTU in bytes (256, 512, 1024, 2048 or 4096), or 0
	// for none said; two ends use the smaller. The rdma-core formats do
	// not carry it.
	MTU int
	// QKey is a UD QP's Q_Key, which datagrams to it must carry. The
	// rdma-core formats do not carry it: their endpoints have
	// RDMACoreQKey.
	QKey uint32
	// LID is the port's LID: 0 on RoCE. The rdma-core formats carry it.
	LID uint16
}

// Remote returns what an RC QP connects to to reach e.
func (e Endpoint) Remote() vfrdma.Remote {
	return vfrdma.Remote{QPN: e.QPN, GID: e.GID, PSN: e.PSN}
}

// check reports the field of e that is out of its range.
func (e Endpoint) check() error {
	switch {
	case e.QPN == 0 || e.QPN > 0xffffff:
		return fmt.Errorf("QPN %#x is not a 24-bit QP number (nor 0)", e.QPN)
	case e.PSN > 0xffffff:
		return fmt.Errorf("PSN %#x is not 24 bits", e.PSN)
	case e.MTU != 0 && (e.MTU < 256 || e.MTU > 4096 || e.MTU&(e.MTU-1) != 0):
		return fmt.Errorf("path MTU %d is none of 256, 512, 1024, 2048, 4096", e.MTU)
	}
	return nil
}

// Region is a memory region this end lets the peer name in its one-sided
// operations (RDMA WRITE, READ, atomics): the peer's work requests carry
// an address in [Addr, Addr+Len) and RKey.
type Region struct {
	Addr uint64 // the region's first byte, as the peer's requests name it
	RKey uint32 // the MR's remote key
	// Len is the region's length in bytes: 1 or more, and Addr+Len does
	// not pass 2^64.
	Len uint64
}

// RegionOf returns the region of mr: its address, remote key and length.
// The MR grants the peer what its Access says (AccessRemoteWrite and the
// like); Region says nothing of it.
func RegionOf(mr *vfrdma.MR) Region {
	return Region{Addr: mr.Addr(), RKey: mr.RKey(), Len: uint64(mr.Len())}
}

// Holds reports whether [off, off+n) lies within the region (n 0 or more).
func (r Region) Holds(off, n uint64) bool {
	return off <= r.Len && n <= r.Len-off
}

// check reports what of r is out of range.
func (r Region) check() error {
	switch {
	case r.Len == 0:
		return fmt.Errorf("region at %#x (rkey %#x) is empty: a region holds 1 byte or more", r.Addr, r.RKey)
	case r.Addr+r.Len-1 < r.Addr:
		return fmt.Errorf("region at %#x of %d bytes passes the end of the 64-bit address space", r.Addr, r.Len)
	}
	return nil
}

// Info is one end's half of the exchange.
type Info struct {
	// Endpoints are this end's QPs, in the order the peer pairs them with
	// its own.
	Endpoints []Endpoint
	// Regions are this end's memory regions for the peer's one-sided
	// operations, in the order the application gives them meaning.
	// Native format only.
	Regions []Region
	// Data is the application's, up to MaxData bytes, for what else its
	// two ends must agree on (a mode, a message size, an address of its
	// own). Native format only.
	Data []byte
}

// checkMine reports what in this end's Info the format cannot send.
func (f Format) checkMine(in Info) error {
	n := len(in.Endpoints)
	switch f {
	case Native:
		if n > MaxEndpoints {
			return fmt.Errorf("%d endpoints: at most %d", n, MaxEndpoints)
		}
		if len(in.Regions) > MaxRegions {
			return fmt.Errorf("%d regions: at most %d", len(in.Regions), MaxRegions)
		}
		if len(in.Data) > MaxData {
			return fmt.Errorf("%d bytes of data: at most %d", len(in.Data), MaxData)
		}
	case RDMACore, RDMACoreSRQ:
		if f == RDMACore && n != 1 {
			return fmt.Errorf("%d endpoints: rdma-core's rc/ud pingpong exchange carries one", n)
		}
		if n < 1 || n > RDMACoreSRQMessages {
			return fmt.Errorf("%d endpoints: ibv_srq_pingpong's exchange carries 1 to %d", n, RDMACoreSRQMessages)
		}
		if len(in.Regions) > 0 {
			return fmt.Errorf("%d regions: rdma-core's exchange carries none (its pingpongs make no one-sided requests)", len(in.Regions))
		}
		if len(in.Data) > 0 {
			return fmt.Errorf("%d bytes of data: rdma-core's exchange carries none", len(in.Data))
		}
	default:
		return fmt.Errorf("unknown format %v", f)
	}
	for i, e := range in.Endpoints {
		if err := e.check(); err != nil {
			return fmt.Errorf("endpoint %d: %w", i, err)
		}
	}
	for i, r := range in.Regions {
		if err := r.check(); err != nil {
			return fmt.Errorf("region %d: %w", i, err)
		}
	}
	return nil
}

// RandomPSN returns a random 24-bit PSN, to start a QP's send sequence at.
func RandomPSN() uint32 { return rand.Uint32() & 0xffffff }

// Options configure Listen, Dial and DialTCP. The zero value (or nil)
// speaks the native format with the default retry and exchange timeout.
type Options struct {
	Format Format
	// ExchangeTimeout (default DefaultExchangeTimeout) bounds, once a peer
	// is connected, each message of the exchange: the peer takes each of
	// this end's within it, sends each of its own whole within it of the
	// message's first byte, and, at the server, begins the first within
	// it of the first Exchange. The wait between the peer's messages (the
	// peer at work: connecting its QPs, posting receives, running until a
	// barrier) is bounded by the step's context alone. A failure wraps
	// ErrTimeout. It does not bound the dial or the accept.
	ExchangeTimeout time.Duration
	// Retry is the pause between dial attempts (default DefaultRetry).
	Retry time.Duration
	// AttemptTimeout bounds one dial attempt (default
	// DefaultAttemptTimeout); the context bounds them all.
	AttemptTimeout time.Duration
	// Progress, if set, is called, on the dialling goroutine, after each
	// attempt that failed and will be retried.
	Progress func(Progress)
}

func (o *Options) withDefaults() Options {
	var v Options
	if o != nil {
		v = *o
	}
	if v.Retry <= 0 {
		v.Retry = DefaultRetry
	}
	if v.AttemptTimeout <= 0 {
		v.AttemptTimeout = DefaultAttemptTimeout
	}
	if v.ExchangeTimeout <= 0 {
		v.ExchangeTimeout = DefaultExchangeTimeout
	}
	return v
}

// withPort adds RDMACorePort to an address without a port, in the
// rdma-core formats.
func (o *Options) withPort(addr string) string {
	if o.Format == Native {
		return addr
	}
	if _, _, err := net.SplitHostPort(addr); err == nil {
		return addr
	}
	return net.JoinHostPort(addr, strconv.Itoa(RDMACorePort))
}

// deadliner is a net.Conn or a TCP listener.
type deadliner interface{ SetDeadline(time.Time) error }

// watch gives d ctx's deadline and, once ctx ends, one in the past, which
// ends the read, write or accept under way; the func it returns takes both
// back.
func watch(ctx context.Context, d deadliner) (undo func()) {
	dl, _ := ctx.Deadline()
	_ = d.SetDeadline(dl)
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = d.SetDeadline(time.Unix(1, 0))
		close(fired)
	})
	return func() {
		if !stop() {
			<-fired
		}
		_ = d.SetDeadline(time.Time{})
	}
}

// ctxErr returns why ctx ended, if it did (or its deadline passed) and
// that explains err.
func ctxErr(ctx context.Context, err error) error {
	if e := ctx.Err(); e != nil {
		return e
	}
	if dl, ok := ctx.Deadline(); ok && errors.Is(err, os.ErrDeadlineExceeded) && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}

// Listener waits for peers: the server's end. Accept takes one caller at
// a time (a second at once gets vfrdma.ErrBusy); Close is safe for
// concurrent use.
type Listener struct {
	ln     net.Listener
	o      Options
	busy   atomic.Bool
	closed atomic.Bool
	once   sync.Once
	err    error
}

// Listen listens on addr (host:port; in the rdma-core formats a host alone
// means RDMACorePort).
func Listen(ctx context.Context, addr string, opts *Options) (*Listener, error) {
	o := opts.withDefaults()
	addr = o.withPort(addr)
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, &Error{Op: "listen", Addr: addr, Err: err}
	}
	return &Listener{ln: ln, o: o}, nil
}

// Addr returns the address the Listener listens on.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Accept waits for a peer to connect, until ctx ends; the Conn it returns
// is the server's end.
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	addr := l.ln.Addr().String()
	if l.closed.Load() {
		return nil, &Error{Op: "accept", Addr: addr, Err: fmt.Errorf("%w: the Listener is closed", vfrdma.ErrClosed)}
	}
	if !l.busy.CompareAndSwap(false, true) {
		return nil, &Error{Op: "accept", Addr: addr, Err: fmt.Errorf("%w: another Accept is under way (one caller at a time)", vfrdma.ErrBusy)}
	}
	defer l.busy.Store(false)
	var c net.Conn
	var err error
	if d, ok := l.ln.(deadliner); ok {
		undo := watch(ctx, d)
		c, err = l.ln.Accept()
		undo()
	} else {
		c, err = l.ln.Accept()
	}
	if err != nil {
		switch e := ctxErr(ctx, err); {
		case l.closed.Load():
			err = fmt.Errorf("%w: the Listener was closed (%w)", vfrdma.ErrClosed, err)
		case e != nil:
			err = fmt.Errorf("%w waiting for the peer", e)
		}
		return nil, &Error{Op: "accept", Addr: addr, Err: err}
	}
	return newConn(c, l.o, true), nil
}

// Close stops listening; a Conn accepted stays open. Close is idempotent;
// Accept returns vfrdma.ErrClosed after it.
func (l *Listener) Close() error {
	l.once.Do(func() {
		l.closed.Store(true)
		l.err = l.ln.Close()
	})
	return l.err
}

// Conn is one end of an exchange: Exchange, then Ready, then any Barriers
// and further Exchanges (native format), then Close. It is single-owner (a
// step called while another runs gets vfrdma.ErrBusy); Close may be
// called from any goroutine and ends the step under way.
type Conn struct {
	c      *wire
	r      *bufio.Reader
	o      Options
	server bool
	peer   string
	step   int   // stepNew, stepExchanged, stepReady
	err    error // the first failure of the exchange: returned ever after
	mine   Info  // the rdma-core server's, written at Ready
	heard  bool  // the server's first Exchange ran: the client's first message is no longer due
	busy   atomic.Bool
	closed atomic.Bool
	once   sync.Once
	cerr   error
}

const (
	stepNew = iota
	stepExchanged
	stepReady
)

func newConn(c net.Conn, o Options, server bool) *Conn {
	w := &wire{Conn: c, limit: o.ExchangeTimeout, f: o.Format}
	return &Conn{c: w, r: bufio.NewReader(w), o: o, server: server, peer: c.RemoteAddr().String()}
}

// Dial connects to the server at addr (host:port; in the rdma-core
// formats a host alone means RDMACorePort), retrying while it is not up
// yet, until ctx ends (see DialTCP); the Conn it returns is the client's
// end.
func Dial(ctx context.Context, addr string, opts *Options) (*Conn, error) {
	o := opts.withDefaults()
	c, err := DialTCP(ctx, o.withPort(addr), &o)
	if err != nil {
		return nil, err
	}
	return newConn(c, o, false), nil
}

// Server reports whether this is the server's end (Accept's).
func (c *Conn) Server() bool { return c.server }

// Format returns the wire format the Conn speaks.
func (c *Conn) Format() Format { return c.o.Format }

// RemoteAddr returns the peer's address.
func (c *Conn) RemoteAddr() net.Addr { return c.c.RemoteAddr() }

// LocalAddr returns this end's address.
func (c *Conn) LocalAddr() net.Addr { return c.c.LocalAddr() }

// Close closes the connection. It is idempotent; every step returns
// vfrdma.ErrClosed after it.
func (c *Conn) Close() error {
	c.once.Do(func() {
		c.closed.Store(true)
		c.cerr = c.c.Close()
	})
	return c.cerr
}

// misuse is the error of a call out of order or with bad arguments: it
// does not break the Conn.
func (c *Conn) misuse(op, format string, args ...any) error {
	return &Error{Op: op, Addr: c.peer, Err: fmt.Errorf("%w: %s", vfrdma.ErrInvalid, fmt.Sprintf(format, args...))}
}

// enter begins a step: it refuses one on a closed Conn (vfrdma.ErrClosed),
// one while another runs (vfrdma.ErrBusy, the Conn being single-owner),
// and any on a broken Conn (its error). leave ends the step.
func (c *Conn) enter(op string) error {
	if c.closed.Load() {
		return &Error{Op: op, Addr: c.peer, Err: fmt.Errorf("%w: the Conn is closed", vfrdma.ErrClosed)}
	}
	if !c.busy.CompareAndSwap(false, true) {
		return &Error{Op: op, Addr: c.peer, Err: fmt.Errorf("%w: another step of the Conn is under way (a Conn is single-owner)", vfrdma.ErrBusy)}
	}
	if c.err != nil {
		c.busy.Store(false)
		return c.err
	}
	return nil
}

func (c *Conn) leave() { c.busy.Store(false) }

// run runs a step of the exchange under ctx; its failure breaks the Conn.
func (c *Conn) run(ctx context.Context, op string, step func() error) error {
	stop := c.c.start(ctx)
	err := step()
	stop()
	if err == nil {
		return nil
	}
	switch e := ctxErr(ctx, err); {
	case c.closed.Load():
		err = fmt.Errorf("%w: closed during the step (%w)", vfrdma.ErrClosed, err)
	case e != nil:
		err = fmt.Errorf("%w (%w)", e, err)
	}
	c.err = &Error{Op: op, Addr: c.peer, Err: err}
	return c.err
}

// endMessage tells the deadlines that the peer's message ended here.
func (c *Conn) endMessage() {
	var next []byte
	if n := c.r.Buffered(); n > 0 {
		next, _ = c.r.Peek(min(n, quoteMax+1))
	}
	c.c.endMessage(next)
}

// Exchange sends this end's Info and returns the peer's. The client sends
// first; in the rdma-core formats the server sends its own at Ready
// instead, once its QPs are connected, as rdma-core's server does (so the
// client's Exchange returns once the server called Ready). The
// peer's Info is checked: the fields are in range, the counts and lengths
// within the bounds, and in the rdma-core formats every message is
// well-formed and names a GID. What the peer sends is checked as it
// arrives: a peer of another protocol is refused at its first bytes that
// cannot be the exchange.
//
// The client calls its first Exchange as soon as it is connected (its QPs
// made before Dial, as rdma-core's programs make them): the server's
// first Exchange waits at most Options.ExchangeTimeout for its message
// to begin.
//
// In the native format Exchange may run again, before or after Ready (a
// second set of QPs over the same connection: a Barrier is then their
// Ready); the rdma-core formats exchange once.
func (c *Conn) Exchange(ctx context.Context, mine Info) (Info, error) {
	if err := c.enter("exchange"); err != nil {
		return Info{}, err
	}
	defer c.leave()
	if c.step != stepNew && c.o.Format != Native {
		return Info{}, c.misuse("exchange", "the %v exchange runs once per Conn", c.o.Format)
	}
	if err := c.o.Format.checkMine(mine); err != nil {
		return Info{}, c.misuse("exchange", "this end's Info: %v", err)
	}
	var peer Info
	err := c.run(ctx, "exchange", func() error {
		if c.server && !c.heard {
			c.heard = true
			c.c.expectFirst()
		}
		var err error
		if c.o.Format == Native {
			peer, err = c.nativeExchange(mine)
		} else {
			peer, err = c.rdmaCoreExchange(mine)
		}
		return err
	})
	if err != nil {
		return Info{}, err
	}
	c.step = max(c.step, stepExchanged)
	return peer, nil
}

// Ready is the barrier before the first send: call it once this end's QPs
// are connected and their receives posted. It tells the peer so, and
// returns once the peer said the same: from then on either end may send.
// In the rdma-core formats, the server writes its address messages here
// and waits for the client's "done"; the client writes "done" (an
// rdma-core server posted its receives before the exchange). Ready runs
// once per Conn: before Exchange, or a second time, it returns
// vfrdma.ErrInvalid.
func (c *Conn) Ready(ctx context.Context) error {
	if err := c.enter("ready"); err != nil {
		return err
	}
	defer c.leave()
	switch c.step {
	case stepNew:
		return c.misuse("ready", "Ready before Exchange")
	case stepReady:
		return c.misuse("ready", "Ready runs once per Conn (Barrier meets the peer again)")
	}
	err := c.run(ctx, "ready", func() error {
		if c.o.Format == Native {
			return c.nativeBarrier(readyName)
		}
		return c.rdmaCoreReady()
	})
	if err != nil {
		return err
	}
	c.step = stepReady
	return nil
}

// Barrier returns once the peer called Barrier with the same name: a
// different name is an error at both ends. It runs after Exchange, as
// often as the two ends need; the rdma-core formats have no barrier but
// Ready (ErrNotSupported).
func (c *Conn) Barrier(ctx context.Context, name string) error {
	if err := c.enter("barrier"); err != nil {
		return err
	}
	defer c.leave()
	if c.o.Format != Native {
		return &Error{Op: "barrier", Addr: c.peer, Err: fmt.Errorf("%w: %v exchange has no barrier but Ready", vfrdma.ErrNotSupported, c.o.Format)}
	}
	if c.step == stepNew {
		return c.misuse("barrier", "Barrier before Exchange")
	}
	if len(name) > MaxBarrierName {
		return c.misuse("barrier", "a barrier name of %d bytes: at most %d", len(name), MaxBarrierName)
	}
	return c.run(ctx, "barrier", func() error { return c.nativeBarrier(name) })
}
