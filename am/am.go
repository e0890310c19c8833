package am

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/event"
)

// Errors Amsend and the other calls return; each is returned inline, with
// nothing sent.
var (
	ErrDataLen   = errors.New("am: data longer than the maximum message size")              // LAPI_ERR_DATA_LEN
	ErrUHdrLen   = errors.New("am: user header too long or not a multiple of 8 bytes")      // LAPI_ERR_UHDR_LEN
	ErrNoHandler = errors.New("am: no header handler at that index")                        // LAPI_ERR_HDR_HNDLR_NULL
	ErrTarget    = errors.New("am: target task out of range")                               // LAPI_ERR_TGT
	ErrPurged    = errors.New("am: target purged")                                          // LAPI_ERR_TGT_PURGED
	ErrClosed    = errors.New("am: context closed")                                         //
	ErrCounter   = errors.New("am: counter index out of range")                             //
	ErrDropped   = errors.New("am: the target dropped a message (no handler or no buffer)") // Fence reports it
	errProtocol  = errors.New("am: protocol error")
	errInvalid   = errors.New("am: invalid configuration")
)

// Limits and defaults.
const (
	// MaxHandlers is the size of the handler table: indices 0 to
	// MaxHandlers-1.
	MaxHandlers = 256
	// MaxCounters is the size of the target counter table: indices 1 to
	// MaxCounters-1 (0 names no counter).
	MaxCounters = 256

	DefaultPacketSize = 16 << 10
	DefaultCredits    = 32
	DefaultMaxMessage = 64 << 20
	DefaultMaxUHdr    = 256
)

// barrierHandler is the wire index of the barrier's own messages.
const barrierHandler = 0xffff

// Config describes a context. Zero fields mean their defaults.
type Config struct {
	Tasks int // tasks in the job (at least 1)
	Self  int // this task's index, 0 to Tasks-1
	// Exchange gathers every task's address; required when Tasks > 1.
	Exchange Exchanger
	// PacketSize is the bytes a SEND carries, its 32-byte header included
	// (at least 256; default 16 KiB). Every task must use the same.
	PacketSize int
	// Credits is how many packets a task may have in flight to one peer
	// (at least 2; default 32). Receive buffers: Tasks × Credits.
	Credits int
	// MaxMessage is the largest message Amsend takes (default 64 MiB).
	MaxMessage int
	// MaxUHdr is the largest user header, a multiple of 8 that fits in a
	// packet (default 256).
	MaxUHdr int
	// Polling makes the progress goroutine spin on the CQ instead of
	// sleeping on its interrupt when idle: lower latency, a CPU spent.
	Polling bool
}

// Arrival is what a header handler gets. It is valid only during the call.
type Arrival struct {
	Src  int    // the origin task
	UHdr []byte // the user header
	Len  int    // the message's data length
	// Data is the whole data when the message came in one packet, nil
	// otherwise: the handler may consume it in the call and return no
	// buffer.
	Data []byte
}

// Return is what a header handler decides.
type Return struct {
	// Buf receives the data (at least Len bytes). Nil only for a message
	// that came in one packet (Arrival.Data); a nil or short Buf for a
	// longer message drops it, and the origin's Fence reports ErrDropped.
	Buf []byte
	// Completion, if set, runs once all the data is in Buf: on a goroutine
	// of its own, or on the progress goroutine if Inline.
	Completion func()
	Inline     bool
}

// HeaderHandler runs on the progress goroutine when a message's first
// packet arrives. It must not block; it may call Amsend.
type HeaderHandler func(a *Arrival) Return

// Counters names the counters of one Amsend; each is optional.
type Counters struct {
	// Tgt is the index of a counter registered at the target with
	// SetCounter (0: none). It counts once the completion handler returned,
	// or the data landed when there is none.
	Tgt int
	// Org counts once the data and user header have been copied out and
	// may be reused.
	Org *Counter
	// Cmpl counts once the target's completion handler returned (or the
	// data landed), as the target's acknowledgement says.
	Cmpl *Counter
}

// Stats count what a context did.
type Stats struct {
	Sent        uint64 // messages Amsend took
	Delivered   uint64 // of those, acknowledged by their target
	Failed      uint64 // dropped by the target, or to a purged task
	Received    uint64 // messages whose data landed here
	Packets     uint64 // data packets sent
	CtrlPackets uint64 // credit and acknowledgement packets sent
	// CreditStalls counts the times sending to a task stopped, with data
	// queued, for want of credits: the receiver had no more buffers for it.
	CreditStalls uint64
	Doorbells    uint64 // send and receive doorbells rung
}

// Context is one task's end of an active-message job over a device: one
// RC QP per peer (two to itself), receive buffers from one SRQ, a progress
// goroutine, the handler and counter tables. A Context is safe for
// concurrent use.
type Context struct {
	cfg   Config
	d     *vfrdma.Device
	pd    *vfrdma.PD
	cq    *vfrdma.CQ
	srq   *vfrdma.SRQ
	sendM *vfrdma.MR
	recvM *vfrdma.MR
	ws    *event.WaitSet
	conns []*conn
	qps   []*vfrdma.QP
	byQPN map[uint32]*conn

	handlers [MaxHandlers]atomic.Pointer[HeaderHandler]
	counters [MaxCounters]atomic.Pointer[Counter]

	stop context.CancelFunc
	done chan struct{} // the progress goroutine ended
	tick atomic.Bool   // time to look for silent peers
	perr error         // why it ended, when not closed

	mu       sync.Mutex
	closed   bool
	free     []int32 // free send slots
	pending  int     // messages neither acknowledged nor failed
	failed   []error // failures since the last Fence
	changed  chan struct{}
	epoch    uint64
	arrived  map[uint64]int // barrier messages per epoch
	stats    Stats
	wr       [1]vfrdma.SendWR
	sge      [1]vfrdma.SGE
	maxAcks  int
	slotSize int
}

type conn struct {
	task    int
	out, in *vfrdma.QP // requests go out on out, acknowledgements on in

	// Under Context.mu.
	credits  int
	owed     int
	acks     []uint32
	sendq    []*outMsg
	sent     map[uint32]*outMsg // sent whole, not yet acknowledged
	nextID   uint32
	dirtyOut bool // deferred posts to ring
	dirtyIn  bool
	err      error
	inflight int  // send slots in use on this conn
	stalled  bool // out of credits with data queued (Stats.CreditStalls)

	// Liveness, under Context.mu: packets heard from the task, their count
	// at the last look, and whether a probe is on its way.
	heard, heardSeen uint64
	probing          bool

	rx *inMsg // progress goroutine only: the message being reassembled
}

type outMsg struct {
	id         uint32
	handler    uint16
	tgt        uint16
	uhdr, data []byte
	off        int
	started    bool
	org, cmpl  *Counter
}

type inMsg struct {
	id     uint32
	length uint64
	got    uint64
	ret    Return
	tgt    *Counter
	drop   bool
}

// A send's wr_id: sendTag, probeTag for a probe, and the slot.
const (
	sendTag  = 1 << 63
	probeTag = 1 << 62
)

// probeEvery is how often the progress goroutine looks for peers that owe
// it something and have been silent since the last look.
const probeEvery = 250 * time.Millisecond

// address is what a task publishes: its GID and, per task, the QPN of its
// QP to that task; for itself, the QP its own requests arrive on.
func (c *Context) address() []byte {
	gid := c.d.GID()
	b := append([]byte(nil), gid[:]...)
	for _, cn := range c.conns {
		b = binary.LittleEndian.AppendUint32(b, cn.in.QPN())
	}
	return b
}

// New creates task cfg.Self's context on d, exchanges addresses with the
// other tasks and connects to each. Every task must call it with the same
// Tasks, PacketSize and Credits.
func New(ctx context.Context, d *vfrdma.Device, cfg Config) (_ *Context, err error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	c := &Context{cfg: cfg, d: d, byQPN: map[uint32]*conn{}, arrived: map[uint64]int{}, done: make(chan struct{})}
	c.slotSize = cfg.PacketSize
	c.maxAcks = (cfg.PacketSize - headerSize) / 4
	defer func() {
		if err != nil {
			c.release()
		}
	}()
	n, r := cfg.Tasks, cfg.Credits
	if max := d.MaxSRQDepth(1); n*r > max {
		return nil, fmt.Errorf("%w: %d tasks × %d credits need %d receive buffers; the SRQ holds at most %d", errInvalid, n, r, n*r, max)
	}
	if c.pd, err = d.AllocPD(ctx); err != nil {
		return nil, err
	}
	sendDepth := 2*r + 4
	slots := n * (r + 1)
	if c.cq, err = d.CreateCQ(ctx, min(4096, (n+1)*sendDepth+n*r)); err != nil {
		return nil, err
	}
	if c.srq, err = c.pd.CreateSRQ(ctx, &vfrdma.SRQConfig{Depth: n * r, CQ: c.cq}); err != nil {
		return nil, err
	}
	if c.sendM, err = c.pd.AllocMR(ctx, slots*cfg.PacketSize, vfrdma.AccessLocalWrite); err != nil {
		return nil, err
	}
	if c.recvM, err = c.pd.AllocMR(ctx, n*r*cfg.PacketSize, vfrdma.AccessLocalWrite); err != nil {
		return nil, err
	}
	newQP := func() (*vfrdma.QP, error) {
		qp, err := c.pd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: c.cq, RecvCQ: c.cq, SendDepth: sendDepth, SRQ: c.srq})
		if err == nil {
			c.qps = append(c.qps, qp)
		}
		return qp, err
	}
	for t := range n {
		cn := &conn{task: t, credits: r, sent: map[uint32]*outMsg{}}
		if cn.out, err = newQP(); err != nil {
			return nil, err
		}
		cn.in = cn.out
		if t == cfg.Self {
			if cn.in, err = newQP(); err != nil {
				return nil, err
			}
		}
		c.conns = append(c.conns, cn)
		c.byQPN[cn.out.QPN()] = cn
		c.byQPN[cn.in.QPN()] = cn
	}
	all := [][]byte{c.address()}
	if n > 1 {
		if cfg.Exchange == nil {
			return nil, fmt.Errorf("%w: %d tasks and no Exchange", errInvalid, n)
		}
		if all, err = cfg.Exchange.AllGather(ctx, all[0]); err != nil {
			return nil, err
		}
	}
	if len(all) != n {
		return nil, fmt.Errorf("%w: the exchange returned %d addresses for %d tasks", errProtocol, len(all), n)
	}
	for t, cn := range c.conns {
		b := all[t]
		if len(b) != 16+4*n {
			return nil, fmt.Errorf("%w: task %d's address is %d bytes, not %d", errProtocol, t, len(b), 16+4*n)
		}
		var gid vfrdma.GID
		copy(gid[:], b)
		qpn := binary.LittleEndian.Uint32(b[16+4*cfg.Self:])
		if t == cfg.Self {
			// Our requests go from out to in, acknowledgements back.
			if err = cn.out.Connect(ctx, vfrdma.Remote{QPN: cn.in.QPN(), GID: gid}, 0); err == nil {
				err = cn.in.Connect(ctx, vfrdma.Remote{QPN: cn.out.QPN(), GID: gid}, 0)
			}
		} else {
			err = cn.out.Connect(ctx, vfrdma.Remote{QPN: qpn, GID: gid}, 0)
		}
		if err != nil {
			return nil, fmt.Errorf("am: connecting to task %d: %w", t, err)
		}
	}
	for s := range slots {
		c.free = append(c.free, int32(s))
	}
	wrs := make([]vfrdma.RecvWR, n*r)
	sges := make([]vfrdma.SGE, n*r)
	for i := range wrs {
		sges[i] = c.recvM.SGE(i*cfg.PacketSize, cfg.PacketSize)
		wrs[i] = vfrdma.RecvWR{WRID: uint64(i), SGEs: sges[i : i+1]}
	}
	if _, err = c.srq.PostRecv(wrs, 0); err != nil {
		return nil, err
	}
	if c.ws, err = event.NewWaitSet(event.Chan); err != nil {
		return nil, err
	}
	if err = c.ws.Add(c.cq); err != nil {
		return nil, err
	}
	pctx, stop := context.WithCancel(context.Background())
	c.stop = stop
	go c.progress(pctx)
	go c.ticker(pctx)
	return c, nil
}

func (cfg *Config) fill() error {
	if cfg.Tasks == 0 {
		cfg.Tasks = 1
	}
	if cfg.PacketSize == 0 {
		cfg.PacketSize = DefaultPacketSize
	}
	if cfg.Credits == 0 {
		cfg.Credits = DefaultCredits
	}
	if cfg.MaxMessage == 0 {
		cfg.MaxMessage = DefaultMaxMessage
	}
	if cfg.MaxUHdr == 0 {
		cfg.MaxUHdr = min(DefaultMaxUHdr, (cfg.PacketSize-headerSize)&^7)
	}
	switch {
	case cfg.Tasks < 1 || cfg.Tasks > 1<<12:
		return fmt.Errorf("%w: %d tasks", errInvalid, cfg.Tasks)
	case cfg.Self < 0 || cfg.Self >= cfg.Tasks:
		return fmt.Errorf("%w: task %d of %d", ErrTarget, cfg.Self, cfg.Tasks)
	case cfg.PacketSize < 256 || cfg.PacketSize > 1<<20:
		return fmt.Errorf("%w: packet size %d (256 to 1 MiB)", errInvalid, cfg.PacketSize)
	case cfg.Credits < 2 || cfg.Credits > 4096:
		return fmt.Errorf("%w: %d credits (2 to 4096)", errInvalid, cfg.Credits)
	case cfg.MaxMessage < 0 || cfg.MaxMessage > 1<<40:
		return fmt.Errorf("%w: maximum message %d", errInvalid, cfg.MaxMessage)
	case cfg.MaxUHdr < 8 || cfg.MaxUHdr%8 != 0 || cfg.MaxUHdr > cfg.PacketSize-headerSize || cfg.MaxUHdr > 0xffff:
		return fmt.Errorf("%w: maximum user header %d (a multiple of 8 that fits a packet)", errInvalid, cfg.MaxUHdr)
	}
	return nil
}

// Tasks returns the number of tasks; Self this task's index.
func (c *Context) Tasks() int { return c.cfg.Tasks }

// Self returns this task's index.
func (c *Context) Self() int { return c.cfg.Self }

// MaxMessage returns the largest message Amsend takes.
func (c *Context) MaxMessage() int { return c.cfg.MaxMessage }

// MaxUHdr returns the largest user header.
func (c *Context) MaxUHdr() int { return c.cfg.MaxUHdr }

// OnePacket returns the most data a message with a user header of uhdr
// bytes can carry in one packet (Arrival.Data is set for it).
func (c *Context) OnePacket(uhdr int) int { return c.cfg.PacketSize - headerSize - uhdr }

// SetHandler registers h at index (LAPI_Addr_set); nil unregisters. Use
// the same index on every task: the origin names it.
func (c *Context) SetHandler(index int, h HeaderHandler) error {
	if index < 0 || index >= MaxHandlers {
		return fmt.Errorf("%w: handler index %d (0 to %d)", ErrNoHandler, index, MaxHandlers-1)
	}
	if h == nil {
		c.handlers[index].Store(nil)
	} else {
		c.handlers[index].Store(&h)
	}
	return nil
}

// SetCounter registers cnt at index (1 to MaxCounters-1) as a target
// counter origins may name; nil unregisters.
func (c *Context) SetCounter(index int, cnt *Counter) error {
	if index < 1 || index >= MaxCounters {
		return fmt.Errorf("%w: %d (1 to %d)", ErrCounter, index, MaxCounters-1)
	}
	c.counters[index].Store(cnt)
	return nil
}

// Stats returns the context's counts.
func (c *Context) Stats() Stats {
	c.mu.Lock()
	s := c.stats
	c.mu.Unlock()
	for _, qp := range c.qps {
		snd, rcv := qp.DoorbellStats()
		s.Doorbells += snd.Doorbells + rcv.Doorbells
	}
	s.Doorbells += c.srq.DoorbellStats().Doorbells
	return s
}

// Close stops the progress goroutine and frees the context's QPs, SRQ,
// CQ and memory. Messages not yet delivered are lost; calls blocked in
// Fence or Barrier return ErrClosed. Completion handlers already running
// on their own goroutines finish after it; their acknowledgements are
// dropped. Close is idempotent.
func (c *Context) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.notify()
	c.mu.Unlock()
	c.stop()
	<-c.done
	return c.release()
}

// release frees what New made, in reverse.
func (c *Context) release() error {
	var errs []error
	if c.ws != nil {
		_ = c.ws.Remove(c.cq)
		errs = append(errs, c.ws.Close())
	}
	for _, qp := range c.qps {
		errs = append(errs, qp.Close())
	}
	if c.srq != nil {
		errs = append(errs, c.srq.Close())
	}
	if c.cq != nil {
		errs = append(errs, c.cq.Close())
	}
	for _, mr := range []*vfrdma.MR{c.sendM, c.recvM} {
		if mr != nil {
			errs = append(errs, mr.Close())
		}
	}
	if c.pd != nil {
		errs = append(errs, c.pd.Close())
	}
	return errors.Join(errs...)
}

// notify wakes the goroutines blocked in Fence or Barrier. Under mu.
func (c *Context) notify() {
	if c.changed != nil {
		close(c.changed)
		c.changed = nil
	}
}

// waitFor blocks until cond (called under mu) holds, the context is
// closed, or ctx ends.
func (c *Context) waitFor(ctx context.Context, cond func() bool) error {
	c.mu.Lock()
	for {
		if c.closed {
			c.mu.Unlock()
			return ErrClosed
		}
		if cond() {
			c.mu.Unlock()
			return nil
		}
		if c.changed == nil {
			c.changed = make(chan struct{})
		}
		ch := c.changed
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		c.mu.Lock()
	}
}
