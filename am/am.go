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
	"github.com/vfrdma/vfrdma/connect"
	"github.com/vfrdma/vfrdma/event"
	"github.com/vfrdma/vfrdma/vfio"
)

// Errors Amsend and the other calls return; each is returned inline, with
// nothing sent.
var (
	ErrDataLen   = errors.New("am: data longer than the maximum message size")         // LAPI_ERR_DATA_LEN
	ErrUHdrLen   = errors.New("am: user header too long or not a multiple of 8 bytes") // LAPI_ERR_UHDR_LEN
	ErrNoHandler = errors.New("am: no header handler at that index")                   // LAPI_ERR_HDR_HNDLR_NULL
	ErrTarget    = errors.New("am: target task out of range")                          // LAPI_ERR_TGT
	ErrPurged    = errors.New("am: target purged")                                     // LAPI_ERR_TGT_PURGED
	// ErrClosed is the driver's own (vfrdma.ErrClosed): the context was
	// closed, or the device or queues under it were.
	ErrClosed   = vfrdma.ErrClosed
	ErrCounter  = errors.New("am: counter index out of range")                             //
	ErrDropped  = errors.New("am: the target dropped a message (no handler or no buffer)") // Fence reports it
	errProtocol = errors.New("am: protocol error")
	errInvalid  = errors.New("am: invalid configuration")
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
	DefaultCredits    = 64 // for at most 31 tasks: see Config.Credits
	DefaultMaxMessage = 64 << 20
	DefaultMaxUHdr    = 256
)

// maxTasks is the most tasks a job may have.
const maxTasks = 1 << 12

// barrierHandler is the wire index of the barrier's own messages.
const barrierHandler = 0xffff

// Config describes a context. Zero fields mean their defaults.
type Config struct {
	Tasks int // tasks in the job (1 to 819, the most whose completions fit one CQ at 2 credits: see Credits)
	Self  int // this task's index, 0 to Tasks-1
	// Exchange gathers every task's address; required when Tasks > 1.
	Exchange Exchanger
	// PacketSize is the bytes a SEND carries, its 32-byte header included
	// (256 to 1 MiB; default 16 KiB). Every task must use the same: a
	// task's packet longer than a receive buffer is refused (see
	// Stats.Refused).
	PacketSize int
	// Credits is how many packets a task may have in flight to one peer
	// (at least 2). Receive buffers: Tasks × Credits. Every completion
	// that can be outstanding, Tasks × (2×Credits + 1), must fit one CQ
	// (4096 entries): New refuses a configuration that does not. The
	// default is DefaultCredits (64) up to 31 tasks, and for more as many
	// as fit (32 at 63 tasks, 2 at 819, the most tasks the default
	// serves). A window of 64 packets sends 8-byte messages a third
	// faster than 32 on the bench (docs/benchmarks.md), for 1 MiB of
	// receive buffers per peer at the default packet size.
	Credits int
	// MaxMessage is the largest message Amsend takes, and the largest a
	// task takes from its peers (at most 1 TiB; default 64 MiB).
	MaxMessage int
	// MaxUHdr is the largest user header Amsend takes, and the largest a
	// task takes from its peers: a multiple of 8 that fits in a packet
	// and in 16 bits, 8 to min(PacketSize-32, 65528) (default 256, or
	// less when the packet is smaller). Give every task the same
	// MaxMessage and MaxUHdr: a message over the target's is refused
	// there, and its origin purged (see Stats.Refused).
	MaxUHdr int
	// Polling makes the progress goroutine spin on the CQ instead of
	// sleeping on its interrupt when idle: lower latency, a CPU spent.
	Polling bool
	// Spin is how long the progress goroutine keeps polling a CQ that has
	// gone empty before it arms it and sleeps (0: the device's, CQ.Spin;
	// negative: it sleeps at once). Traffic that goes on within it costs
	// no interrupt; an idle context burns at most Spin each time it goes
	// idle. On a CQ that cannot be armed (CQ.Armable: Options.PollDoorbell
	// on QEMU's device) the goroutine naps instead of sleeping, pauses
	// that double from 20 µs to 1 ms between polls, woken early by work
	// to send; there 0 means NapSpin.
	Spin time.Duration
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
	// RecvDoorbells counts, of Doorbells, those that returned receive
	// buffers to the SRQ.
	RecvDoorbells uint64
	// RideAcks counts the acknowledgements that rode on a data packet;
	// the rest went in control packets (CtrlPackets).
	RideAcks uint64
	// Refused counts the tasks purged for breaking the protocol: a packet
	// that did not hold together, or did not continue what it claimed to
	// (a fragment of another message, length or offset), a packet longer
	// than a receive buffer (PacketSize), a user header longer than
	// MaxUHdr or a message longer than MaxMessage, credits never taken, a
	// message out of sequence; or a completion for a buffer or length the
	// device was never given. Each task counts once, at its first such
	// packet; what it sends after is dropped unread.
	Refused uint64
}

// Context is one task's end of an active-message job over a device: one
// RC QP per peer (two to itself), receive buffers from one SRQ, a progress
// goroutine, the handler and counter tables. A Context is safe for
// concurrent use. After Close (or once the device closed under it) every
// method returns an error wrapping ErrClosed; see the package doc.
type Context struct {
	cfg   Config
	d     *vfrdma.Device
	pd    *vfrdma.PD
	cq    *vfrdma.CQ
	srq   *vfrdma.SRQ
	sendM *vfrdma.MR
	recvM *vfrdma.MR
	// The packet memory: the context's own, registered with the device,
	// so that it stays mapped until Close even if the device closes under
	// the context.
	sendMem, recvMem []byte
	sendOwn, recvOwn *vfio.Memory
	bufs             int // receive buffers posted, Tasks × Credits
	ws               *event.WaitSet
	cqInSet          bool // the CQ is in ws (it can be armed)
	conns            []*conn
	spin             time.Duration // Config.Spin, or the CQ's (negative: none)
	onIdle           idlePolicy    // how the progress goroutine waits when idle
	// ackHold is how long an idle progress goroutine keeps an
	// acknowledgement back for a data packet to ride on, and taken
	// buffers back from the SRQ (idlePolicy.hold: none when it does not
	// spin).
	ackHold time.Duration
	// repostBatch is how many taken buffers go back to the SRQ at once
	// when the goroutine is busy.
	repostBatch int
	qps         []*vfrdma.QP
	byQPN       map[uint32]*conn
	psn         uint32 // the first send PSN of its QPs (random, 24 bits)

	handlers [MaxHandlers]atomic.Pointer[HeaderHandler]
	arrival  Arrival   // the header handler's, progress goroutine only
	spare    []*outMsg // message records to reuse, under mu
	counters [MaxCounters]atomic.Pointer[Counter]

	stop context.CancelFunc
	done chan struct{} // the progress goroutine ended
	tock chan struct{} // the ticker ended (nil: no ticker)
	tick atomic.Bool   // time to look for silent peers
	// calls counts the calls that use the device objects outside mu
	// (Purge); Close waits for them before it frees anything.
	calls sync.WaitGroup
	// closeMu serialises Close and its retries: each runs release.
	closeMu sync.Mutex
	// stopFree, under closeMu, unregisters freeMem from the device's
	// AfterClose: set while the device keeps an MR of the packet memory.
	stopFree func() bool

	mu       sync.Mutex
	closed   bool
	inRound  bool        // the progress goroutine is taking a round of completions: Amsend queues, the round's end sends
	perr     error       // why the context failed (the device or its queues closed under it, ...)
	down     atomic.Bool // closed or perr set: calls look here before their arguments
	free     []int32     // free send slots
	busy     []bool      // send slots posted and not completed
	pending  int         // messages neither acknowledged nor failed
	leaving  bool        // Close lingers: acknowledgements go at once
	failed   []error     // failures since the last Fence
	changed  chan struct{}
	epoch    uint64
	barriers int            // Barrier calls waiting for the tasks' messages
	arrived  map[uint64]int // barrier messages per epoch
	stats    Stats
	wr       [1]vfrdma.SendWR
	sge      [1]vfrdma.SGE
	maxAcks  int // acknowledgements a control packet holds
	slotSize int
}

type conn struct {
	task    int
	out, in *vfrdma.QP // requests go out on out, acknowledgements on in

	// Under Context.mu.
	credits  int
	owed     int      // credits to return: buffers the task used, back in the SRQ
	unposted int      // buffers the task used, not yet back in the SRQ
	acks     []uint32 // acknowledgements to send the task, oldest first
	ackState ackState // what acks wait for before they go alone
	// ackAt is when acks last went from empty to not (set only when the
	// context holds acknowledgements back: zero otherwise).
	ackAt    time.Time
	sendq    []*outMsg
	sendBack []*outMsg          // sendq's array, from its start
	sent     map[uint32]*outMsg // sent whole, not yet acknowledged
	nextID   uint32
	rxNext   uint32 // the id the task's next message must have
	barrier  uint64 // the last barrier the task sent its message for
	unrung   queues // the queues with deferred posts whose doorbell has not rung
	err      error
	// stalled: data is queued and waits for credits (creditStalled), a
	// spell Stats.CreditStalls has counted; a data packet that goes ends
	// it.
	stalled bool

	// Liveness, under Context.mu: packets heard from the task, their count
	// at the last look, and whether a probe is on its way (posted, its
	// completion not yet taken).
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
	soon   bool // its origin waits for the acknowledgement (flagAckSoon)
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
	b := make([]byte, addrPSN, addressLen(len(c.conns)))
	copy(b, gid[:])
	b = binary.LittleEndian.AppendUint32(b, c.psn)
	for _, cn := range c.conns {
		b = binary.LittleEndian.AppendUint32(b, cn.in.QPN())
	}
	return b
}

// New creates task cfg.Self's context on d, exchanges addresses with the
// other tasks and connects to each. Every task must call it with the same
// Tasks, PacketSize and Credits. If it fails part-way it undoes what it
// made, as Close does; what the device refused to destroy is named in
// its error beside the cause, and stays with the device until the
// device's Close, which destroys it: the packet memory of an MR it
// refused to deregister is freed then.
func New(ctx context.Context, d *vfrdma.Device, cfg Config) (*Context, error) {
	return newContext(ctx, d, cfg, ackHold)
}

// newContext is New with hold, the most an idle progress goroutine keeps
// acknowledgements and taken buffers back (the context's idle policy
// bounds it: idlePolicy.hold), instead of ackHold.
func newContext(ctx context.Context, d *vfrdma.Device, cfg Config, hold time.Duration) (_ *Context, err error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	c := &Context{cfg: cfg, d: d, byQPN: map[uint32]*conn{}, arrived: map[uint64]int{}, done: make(chan struct{}), psn: connect.RandomPSN()}
	c.slotSize = cfg.PacketSize
	c.maxAcks = (cfg.PacketSize - headerSize) / ackSize
	defer func() {
		if err == nil {
			return
		}
		if rerr := c.release(); rerr != nil {
			err = errors.Join(err, fmt.Errorf("am: undoing the context: the device kept some of it until it closes: %w", rerr))
		}
	}()
	n, r := cfg.Tasks, cfg.Credits
	if err := cfg.fits(d.MaxSRQDepth(1), min(maxCQEntries, int(d.Caps().MaxCQE))); err != nil {
		return nil, err
	}
	if c.pd, err = d.AllocPD(ctx); err != nil {
		return nil, err
	}
	sendDepth := 2*r + 4
	slots := cfg.sendSlots()
	c.bufs = n * r
	c.busy = make([]bool, slots)
	if c.cq, err = d.CreateCQ(ctx, cfg.cqEntries()); err != nil {
		return nil, err
	}
	c.spin = cfg.Spin
	armable := c.cq.Armable()
	switch {
	case c.spin == 0 && !armable:
		// The CQ polls with the POLL doorbell (no interrupt): spinning
		// then harvests the backend at once, the mode that wins on
		// QEMU's device (docs/benchmarks.md), before the naps begin.
		c.spin = NapSpin
	case c.spin == 0:
		c.spin = c.cq.Spin()
	}
	c.onIdle = chooseIdle(cfg.Polling, armable, c.spin)
	c.ackHold = c.onIdle.hold(hold, c.spin)
	c.repostBatch = max(1, min(cfg.Credits/2, repostBatch))
	if c.srq, err = c.pd.CreateSRQ(ctx, &vfrdma.SRQConfig{Depth: c.bufs, CQ: c.cq}); err != nil {
		return nil, err
	}
	if c.sendOwn, err = vfio.AllocMemory(slots*cfg.PacketSize, nil); err != nil {
		return nil, err
	}
	c.sendMem = c.sendOwn.Bytes()[:slots*cfg.PacketSize]
	if c.sendM, err = c.pd.RegisterMR(ctx, c.sendOwn.Bytes(), vfrdma.AccessLocalWrite); err != nil {
		return nil, err
	}
	if c.recvOwn, err = vfio.AllocMemory(c.bufs*cfg.PacketSize, nil); err != nil {
		return nil, err
	}
	c.recvMem = c.recvOwn.Bytes()[:c.bufs*cfg.PacketSize]
	if c.recvM, err = c.pd.RegisterMR(ctx, c.recvOwn.Bytes(), vfrdma.AccessLocalWrite); err != nil {
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
		if len(b) != addressLen(n) {
			return nil, fmt.Errorf("%w: task %d's address is %d bytes, not %d", errProtocol, t, len(b), addressLen(n))
		}
		var gid vfrdma.GID
		copy(gid[:], b[:addrPSN])
		psn := addressPSN(b)
		if psn > 0xffffff {
			return nil, fmt.Errorf("%w: task %d's first PSN %#x is not 24 bits", errProtocol, t, psn)
		}
		qpn := addressQPN(b, cfg.Self)
		if t == cfg.Self {
			// Our requests go from out to in, acknowledgements back.
			if err = cn.out.Connect(ctx, vfrdma.Remote{QPN: cn.in.QPN(), GID: gid, PSN: psn}, c.psn); err == nil {
				err = cn.in.Connect(ctx, vfrdma.Remote{QPN: cn.out.QPN(), GID: gid, PSN: psn}, c.psn)
			}
		} else {
			err = cn.out.Connect(ctx, vfrdma.Remote{QPN: qpn, GID: gid, PSN: psn}, c.psn)
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
	c.stats.Doorbells++
	if c.ws, err = event.NewWaitSet(event.Chan); err != nil {
		return nil, err
	}
	// A CQ that cannot be armed stays out of the set: the set then only
	// carries Wake (work to send), and the progress goroutine naps
	// between polls instead of sleeping on the interrupt (idleSpinNap).
	if armable {
		if err = c.ws.Add(c.cq.Source()); err != nil {
			return nil, err
		}
		c.cqInSet = true
	}
	pctx, stop := context.WithCancel(context.Background())
	c.stop = stop
	c.tock = make(chan struct{})
	go c.progress(pctx)
	go c.ticker(pctx)
	return c, nil
}

// maxCQEntries is the most entries vfrdma.CreateCQ gives a CQ (the
// device's 128-page ring limit), below the device's own max_cqe.
const maxCQEntries = 4096

// sendSlots is the number of send buffers: Credits+1 per task (a data
// packet leaves one credit, and the context one slot per task, to
// credits and acknowledgements).
func (cfg *Config) sendSlots() int { return cfg.Tasks * (cfg.Credits + 1) }

// cqEntries is the most completions the context's CQ can hold at once:
// every send is signalled and takes a send slot until its completion is
// polled, and every receive buffer can complete before the progress
// goroutine polls.
func (cfg *Config) cqEntries() int { return cfg.sendSlots() + cfg.Tasks*cfg.Credits }

// fits refuses a configuration the device cannot hold: more receive
// buffers than an SRQ of maxSRQ, or more completions outstanding than a CQ
// of maxCQ holds (the CQ would overflow and lose them).
func (cfg *Config) fits(maxSRQ, maxCQ int) error {
	n, r := cfg.Tasks, cfg.Credits
	if n*r > maxSRQ {
		return fmt.Errorf("%w: %d tasks × %d credits need %d receive buffers; the SRQ holds at most %d", errInvalid, n, r, n*r, maxSRQ)
	}
	if e := cfg.cqEntries(); e > maxCQ {
		return fmt.Errorf("%w: %d tasks × %d credits can have %d completions outstanding (%d sends, %d receives); a CQ holds at most %d: use fewer credits or tasks",
			errInvalid, n, r, e, cfg.sendSlots(), n*r, maxCQ)
	}
	return nil
}

func (cfg *Config) fill() error {
	if cfg.Tasks == 0 {
		cfg.Tasks = 1
	}
	if cfg.PacketSize == 0 {
		cfg.PacketSize = DefaultPacketSize
	}
	if cfg.Credits == 0 && cfg.Tasks > 0 && cfg.Tasks <= maxTasks {
		// The same on every task: it depends on Tasks alone.
		cfg.Credits = min(DefaultCredits, (maxCQEntries/cfg.Tasks-1)/2)
		if cfg.Credits < 2 {
			return fmt.Errorf("%w: %d tasks: even 2 credits each overflow one CQ (%d entries)", errInvalid, cfg.Tasks, maxCQEntries)
		}
	}
	if cfg.MaxMessage == 0 {
		cfg.MaxMessage = DefaultMaxMessage
	}
	if cfg.MaxUHdr == 0 {
		cfg.MaxUHdr = min(DefaultMaxUHdr, (cfg.PacketSize-headerSize)&^7)
	}
	switch {
	case cfg.Tasks < 1 || cfg.Tasks > maxTasks:
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
		return fmt.Errorf("%w: maximum user header %d (a multiple of 8, 8 to %d with %d-byte packets)", errInvalid, cfg.MaxUHdr, min(cfg.PacketSize-headerSize, 0xffff)&^7, cfg.PacketSize)
	}
	return nil
}

// NapSpin is the progress goroutine's default spin on a CQ that cannot
// be armed (Options.PollDoorbell on QEMU's device), before it naps. Longer
// than an active message's round trip there (about 0.9 ms polling), so a
// ping-pong never naps: measured in docs/benchmarks.md, 1 ms spins match
// polling's latency and rate, where 200 µs left them 1.6 times slower.
const NapSpin = time.Millisecond

// ProgressMode says how the progress goroutine waits for work, as New
// chose once: "polling" (Config.Polling), "spin, then sleep" on the CQ's
// interrupt, "sleep" (no spin), or "spin, then nap" (a CQ that cannot be
// armed: Options.PollDoorbell on QEMU's device).
func (c *Context) ProgressMode() string { return c.onIdle.String() }

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

// err returns why the context takes no more calls: ErrClosed after Close,
// the cause when it failed (the device closed under it, ...), or nil.
// Under mu.
func (c *Context) err() error {
	if c.closed {
		return fmt.Errorf("am: context closed: %w", ErrClosed)
	}
	return c.perr
}

// usable is err for the calls that do not hold mu.
func (c *Context) usable() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err()
}

// SetHandler registers h at index (LAPI_Addr_set); nil unregisters. Use
// the same index on every task: the origin names it.
func (c *Context) SetHandler(index int, h HeaderHandler) error {
	if err := c.usable(); err != nil {
		return err
	}
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
	if err := c.usable(); err != nil {
		return err
	}
	if index < 1 || index >= MaxCounters {
		return fmt.Errorf("%w: %d (1 to %d)", ErrCounter, index, MaxCounters-1)
	}
	c.counters[index].Store(cnt)
	return nil
}

// Stats returns the context's counts; it may be called at any time, after
// Close too. Doorbells are those the context rang.
func (c *Context) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// Close stops the progress goroutine and frees the context's QPs, SRQ,
// CQ and memory. It first lingers, at most two seconds, until the
// acknowledgements the task owes its peers have gone (even those it was
// holding back), so that peers fencing what they sent it do not find it
// gone: a job's tasks may Barrier and Close. Messages not yet delivered
// are lost; calls blocked in
// Fence or Barrier return ErrClosed, and every call after it returns an
// error wrapping ErrClosed. Completion handlers already running on their
// own goroutines finish after it; their acknowledgements are dropped.
//
// Close the context before its device. If the device is closed first,
// the context fails with an error wrapping ErrClosed (its progress
// goroutine ends, later calls return that error), and Close still frees
// the context's own memory.
//
// If the device refuses a destroy (a command error, a device that raised
// DEVICE_FATAL), Close returns the error; what the device kept stays with
// it, and the packet memory of an MR it kept stays mapped, since the
// device may still reach it (the other MR's is freed). A later Close
// retries what is left and returns nil once all of it is freed; a Close
// after one that freed everything returns nil. The device's Close
// destroys what the device kept (a dead device's, it shuts all the same)
// and then frees the kept packet memory (Device.AfterClose): closed in
// that order, context then device, a context leaks nothing even when its
// own Close could free nothing.
func (c *Context) Close() error {
	c.closeMu.Lock()
	defer c.closeMu.Unlock()
	c.linger()
	c.mu.Lock()
	first := !c.closed
	c.closed = true
	c.down.Store(true)
	c.notify()
	c.mu.Unlock()
	if first {
		c.stop()
		c.ws.Wake() // the progress goroutine may sleep in the set
		<-c.done
		if c.tock != nil {
			<-c.tock
		}
		c.calls.Wait()
	}
	return c.release()
}

// closeLinger bounds how long Close waits for the task's last exchanges
// (linger).
const closeLinger = 2 * time.Second

// linger lets the task's peers have what they wait for from it before
// Close stops the progress goroutine, as a socket's linger does: the
// acknowledgements it owes them, which a held acknowledgement would
// otherwise never bring (their Fence, and the Barrier after it, would find
// the task gone). They go at once (leaving), in control packets posted
// before the QPs' destruction, which the device carries out after them.
// Its own messages need nothing of it: a peer acknowledges them as it
// lingers in turn. Linger waits at most closeLinger (acknowledgements with
// no credit to go on hold it that long), and not at all once the context
// is closed or failed, or its progress goroutine has ended.
func (c *Context) linger() {
	c.mu.Lock()
	c.leaving = true
	c.mu.Unlock()
	deadline := time.Now().Add(closeLinger)
	for pause := 20 * time.Microsecond; time.Now().Before(deadline); pause = min(2*pause, time.Millisecond) {
		c.mu.Lock()
		done := c.closed || c.perr != nil || !c.owesAcks()
		c.mu.Unlock()
		if done {
			return
		}
		select {
		case <-c.done:
			return // no progress goroutine (any more) to send them
		default:
		}
		if c.ws != nil {
			c.ws.Wake() // a sleeping progress goroutine sends what is owed
		}
		time.Sleep(pause)
	}
}

// owesAcks reports whether a live peer waits for acknowledgements from
// this task that can go: a control packet to it may go (ctrlMayGo).
// Under mu.
func (c *Context) owesAcks() bool {
	for _, cn := range c.conns {
		if cn.err == nil && len(cn.acks) > 0 && c.ctrlMayGo(cn) {
			return true
		}
	}
	return false
}

// release frees what New made, in reverse; under closeMu, or in New
// before anyone else has the context. Each call frees what the calls
// before it could not: every Close it makes is idempotent, so what is
// gone costs nothing. Objects the device's Close destroyed already are
// not an error. The packet memory goes only once the device can no
// longer reach it: an MR the device kept keeps its own memory mapped,
// and only its own, until a later release gets it deregistered or the
// device's Close has run (freeMem, registered with AfterClose while an
// MR is kept).
func (c *Context) release() error {
	var errs []error
	gone := func(err error) bool {
		if err == nil || errors.Is(err, vfrdma.ErrClosed) {
			return true
		}
		errs = append(errs, err)
		return false
	}
	if c.ws != nil {
		if c.cqInSet {
			_ = c.ws.Remove(c.cq.Source())
		}
		gone(c.ws.Close())
	}
	for _, qp := range c.qps {
		gone(qp.Close())
	}
	if c.srq != nil {
		gone(c.srq.Close())
	}
	if c.cq != nil {
		gone(c.cq.Close())
	}
	kept := false
	free := func(mr *vfrdma.MR, mem *vfio.Memory) {
		if mr != nil && !gone(mr.Close()) {
			kept = true
			return
		}
		gone(mem.Close()) // nil: not yet allocated
	}
	free(c.sendM, c.sendOwn)
	free(c.recvM, c.recvOwn)
	if c.pd != nil {
		gone(c.pd.Close())
	}
	switch {
	case kept && c.stopFree == nil:
		c.stopFree = c.d.AfterClose(c.freeMem)
	case !kept && c.stopFree != nil:
		c.stopFree()
		c.stopFree = nil
	}
	return errors.Join(errs...)
}

// freeMem frees the packet memory once the device is closed (its
// AfterClose), when an MR of it was kept: the device reaches it no more.
// Memory's Close is idempotent and safe beside release's.
func (c *Context) freeMem() {
	_ = c.sendOwn.Close() // an munmap of our own mapping: it fails only on a bug
	_ = c.recvOwn.Close()
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
			return fmt.Errorf("am: context closed: %w", ErrClosed)
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
