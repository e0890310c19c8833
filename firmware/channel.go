package firmware

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultTimeout bounds the wait for one command's response when the caller
// gives no shorter deadline (Linux waits 10 s).
const DefaultTimeout = 10 * time.Second

// Options configure a Channel. The zero Options are valid: a synchronous
// device (QEMU) and a 10 s bound.
type Options struct {
	// Device names the device in errors, e.g. its PCI address.
	Device string
	// Wait, if set, blocks until the command-response interrupt (MSI-X
	// vector 0) fires or ctx is done, returning ctx's error then. Without
	// it the channel reads the response right after ERR, which is correct
	// for QEMU (it executes the command inside the REQUEST write). Real
	// hardware completes asynchronously and needs Wait. Stale interrupts are
	// harmless: the channel waits until the response slot carries the
	// command's cookie.
	Wait func(ctx context.Context) error
	// Timeout bounds each wait for a response; zero means DefaultTimeout.
	Timeout time.Duration
}

// Channel is the device's command channel: the BAR1 registers and the
// command and response slots. It also runs the bring-up steps, which share
// the ERR register with commands. A Channel is safe for concurrent use;
// commands run one at a time.
type Channel struct {
	regs    Regs
	cmd     []byte
	resp    []byte
	device  string
	wait    func(context.Context) error
	timeout time.Duration

	sem    chan struct{} // held while the slots and ERR are in use
	closed atomic.Bool

	// Guarded by sem.
	cookie uint64
	loaded bool

	qmu    sync.Mutex // guards quirks (read without sem by Quirks)
	quirks Quirks
}

// NewChannel returns a channel over regs (the BAR1 registers) and the
// command and response slots, DMA memory of at least CmdSlotSize and
// RespSlotSize bytes whose addresses go into the DSR. opts may be nil.
func NewChannel(regs Regs, cmdSlot, respSlot []byte, opts *Options) (*Channel, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if regs == nil {
		return nil, invalid("channel", "regs", 0, "a register region")
	}
	if len(cmdSlot) < CmdSlotSize {
		return nil, invalid("channel", "len(cmdSlot)", uint64(len(cmdSlot)), fmt.Sprintf(">= %d", CmdSlotSize))
	}
	if len(respSlot) < RespSlotSize {
		return nil, invalid("channel", "len(respSlot)", uint64(len(respSlot)), fmt.Sprintf(">= %d", RespSlotSize))
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	return &Channel{
		regs:    regs,
		cmd:     cmdSlot[:CmdSlotSize:CmdSlotSize],
		resp:    respSlot[:RespSlotSize:RespSlotSize],
		device:  o.Device,
		wait:    o.Wait,
		timeout: o.Timeout,
		sem:     make(chan struct{}, 1),
	}, nil
}

// Close marks the channel closed: later calls fail with ErrClosed. A
// command in progress completes first: Close waits for it (a wait bounded
// by the command's own timeout), so that once Close returns nothing
// touches the command and response slots or the registers, and the caller
// may unmap them. Close does not touch the device (see Reset) and is
// idempotent.
func (c *Channel) Close() error {
	c.closed.Store(true)
	c.sem <- struct{}{} // the command in progress, if any, has finished
	<-c.sem
	return nil
}

// Quirks returns what the channel knows of the device's deviations from its
// interface: set by LoadDSR, refined by the SRQ probe.
func (c *Channel) Quirks() Quirks {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	return c.quirks
}

func (c *Channel) setQuirks(f func(*Quirks)) {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	f(&c.quirks)
}

func (c *Channel) opErr(op string, st Status, err error) error {
	return &OpError{Op: op, Device: c.device, Status: st, Err: err}
}

// lock takes the channel, bounded by ctx.
func (c *Channel) lock(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return c.opErr(op, 0, fmt.Errorf("waiting for the command channel: %w", err))
	}
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		return c.opErr(op, 0, fmt.Errorf("waiting for the command channel: %w", ctx.Err()))
	}
	if c.closed.Load() {
		<-c.sem
		return c.opErr(op, 0, ErrClosed)
	}
	return nil
}

func (c *Channel) unlock() { <-c.sem }

// Exec sends req and, if resp is not nil, waits for and decodes the
// response. With a nil resp only the status is checked, as Linux does for
// the commands the device does not answer (the DESTROY_* commands,
// CREATE_BIND, DESTROY_BIND, MODIFY_SRQ).
//
// The sequence: validate req (if it has limits), write it with a fresh
// cookie, clear the response slot, write 0 to REQUEST, read ERR. A non-zero
// ERR is an *OpError carrying the status: 0xFFFF wraps ErrNotSupported, a
// negative errno wraps that syscall.Errno. Then the response must carry the
// cookie and the expected acknowledgement (else ErrDeviceFault), a zero
// error byte (else its errno), and decode.
//
// ctx bounds the wait for the channel and is checked before the request
// is written; once it is written, the response is waited for up to the
// channel's timeout (Options.Timeout) whatever ctx says, so that an error
// means the device did not answer in that time, not that the caller
// stopped listening while it ran the command.
//
// Exec sends codes as they are: on QEMU 7.2 MODIFY_SRQ and QUERY_SRQ are
// swapped, so use Channel.ModifySRQ and Channel.QuerySRQ for those.
func (c *Channel) Exec(ctx context.Context, req Request, resp Response) error {
	if err := c.lock(ctx, req.Cmd().String()); err != nil {
		return err
	}
	defer c.unlock()
	return c.exec(ctx, req, resp)
}

func (c *Channel) exec(ctx context.Context, req Request, resp Response) error {
	op := opName(req)
	cookie, st, err := c.post(op, req)
	if err != nil {
		return err
	}
	if st != 0 {
		return c.opErr(op, st, st.err())
	}
	if resp == nil {
		return nil
	}
	if err := c.await(ctx, cookie); err != nil {
		return c.opErr(op, 0, err)
	}
	if err := CheckResponse(c.resp, cookie, ackOf(req)); err != nil {
		return c.opErr(op, 0, err)
	}
	if err := resp.Decode(c.resp); err != nil {
		return c.opErr(op, 0, err)
	}
	return nil
}

// post writes req with a new cookie, rings REQUEST and reads ERR.
func (c *Channel) post(op string, req Request) (uint64, Status, error) {
	if !c.loaded {
		return 0, 0, c.opErr(op, 0, fmt.Errorf("no command before LoadDSR (QEMU 7.2.0/7.2.1 crash on one): %w", ErrDSRNotLoaded))
	}
	if v, ok := req.(validator); ok {
		if err := v.Validate(); err != nil {
			return 0, 0, c.opErr(op, 0, err)
		}
	}
	c.cookie++
	cookie := c.cookie
	if err := EncodeRequest(c.cmd, cookie, req); err != nil {
		return 0, 0, c.opErr(op, 0, err)
	}
	clear(c.resp)
	if err := c.regs.Store32(RegRequest, 0); err != nil {
		return 0, 0, c.opErr(op, 0, fmt.Errorf("writing REQUEST: %w", err))
	}
	v, err := c.regs.Load32(RegErr)
	if err != nil {
		return 0, 0, c.opErr(op, 0, fmt.Errorf("reading ERR: %w", err))
	}
	return cookie, Status(v), nil
}

// await returns once the response slot carries cookie.
func (c *Channel) await(ctx context.Context, cookie uint64) error {
	if le.Uint64(c.resp) == cookie {
		return nil
	}
	if c.wait == nil {
		return fmt.Errorf("%w: ERR is 0 but the response slot does not carry cookie %#x (it holds %#x), and no interrupt wait is configured",
			ErrDeviceFault, cookie, le.Uint64(c.resp))
	}
	// Sent, the command is waited for its own timeout whatever ctx says:
	// given up earlier, it may run all the same, and the caller would not
	// know what the device holds (a DESTROY reported failed that ran frees
	// a handle the device gives the next object).
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.timeout)
	defer cancel()
	for {
		err := c.wait(wctx)
		if le.Uint64(c.resp) == cookie {
			return nil
		}
		if err == nil {
			err = wctx.Err()
		}
		if err != nil {
			return fmt.Errorf("waiting for the response with cookie %#x (MSI-X vector 0): %w", cookie, err)
		}
	}
}

// ReadVersion reads the VERSION register.
func (c *Channel) ReadVersion(ctx context.Context) (uint32, error) {
	const op = "read VERSION"
	if err := c.lock(ctx, op); err != nil {
		return 0, err
	}
	defer c.unlock()
	v, err := c.regs.Load32(RegVersion)
	if err != nil {
		return 0, c.opErr(op, 0, err)
	}
	return v, nil
}

// LoadDSR hands the device the DSR at dsrDMA, whose memory is dsr (already
// filled with DSR.Encode for version): it writes DSRLOW, then DSRHIGH (which
// makes the device load the DSR and write the capabilities), then decodes
// and validates the capabilities and records the quirks they reveal.
// Commands are refused until LoadDSR succeeds. A device that wrote no
// capabilities gives an error wrapping ErrDSRNotLoaded.
func (c *Channel) LoadDSR(ctx context.Context, dsrDMA uint64, dsr []byte, version uint32) (Caps, error) {
	const op = "load DSR"
	if err := c.lock(ctx, op); err != nil {
		return Caps{}, err
	}
	defer c.unlock()
	if dsrDMA == 0 || dsrDMA%PageSize+DSRSize > PageSize {
		return Caps{}, c.opErr(op, 0, invalid("DSR", "address", dsrDMA, "non-zero, 280 bytes within one page"))
	}
	if len(dsr) < DSRSize {
		return Caps{}, c.opErr(op, 0, invalid("DSR", "length", uint64(len(dsr)), fmt.Sprintf(">= %d", DSRSize)))
	}
	c.loaded = false
	if err := c.regs.Store32(RegDSRLow, uint32(dsrDMA)); err != nil {
		return Caps{}, c.opErr(op, 0, fmt.Errorf("writing DSRLOW: %w", err))
	}
	if err := c.regs.Store32(RegDSRHigh, uint32(dsrDMA>>32)); err != nil {
		return Caps{}, c.opErr(op, 0, fmt.Errorf("writing DSRHIGH: %w", err))
	}
	caps, err := DecodeCaps(dsr)
	if err != nil {
		return Caps{}, c.opErr(op, 0, err)
	}
	if err := caps.Validate(version); err != nil {
		return caps, c.opErr(op, 0, err)
	}
	c.loaded = true
	q := QuirksFor(version, &caps)
	c.setQuirks(func(p *Quirks) { *p = q })
	return caps, nil
}

// SetInterruptMask writes IMR: IMRUnmaskAll enables the device's interrupts,
// IMRMaskAll disables them (QEMU drops, not latches, masked interrupts).
func (c *Channel) SetInterruptMask(ctx context.Context, mask uint32) error {
	const op = "write IMR"
	if err := c.lock(ctx, op); err != nil {
		return err
	}
	defer c.unlock()
	if err := c.regs.Store32(RegIMR, mask); err != nil {
		return c.opErr(op, 0, err)
	}
	return nil
}

// ctl writes a CTL value and, if check, requires ERR == 0 afterwards.
func (c *Channel) ctl(ctx context.Context, op string, v uint32, check bool) error {
	if err := c.lock(ctx, op); err != nil {
		return err
	}
	defer c.unlock()
	if err := c.regs.Store32(RegCtl, v); err != nil {
		return c.opErr(op, 0, fmt.Errorf("writing CTL: %w", err))
	}
	if !check {
		return nil
	}
	st, err := c.regs.Load32(RegErr)
	if err != nil {
		return c.opErr(op, 0, fmt.Errorf("reading ERR: %w", err))
	}
	if st != 0 {
		return c.opErr(op, Status(st), fmt.Errorf("%w: ERR is not 0 after CTL %d", ErrDeviceFault, v))
	}
	return nil
}

// Activate writes ACTIVATE to CTL and requires ERR == 0. On QEMU it starts
// the completion thread (stopping a running one first, which can block the
// write for seconds).
func (c *Channel) Activate(ctx context.Context) error {
	return c.ctl(ctx, "CTL ACTIVATE", CtlActivate, true)
}

// Unquiesce writes UNQUIESCE to CTL and, like Linux, requires ERR == 0 —
// except where the device leaves ERR untouched (Quirks.UnquiesceKeepsErr),
// since ERR then still holds the last command's status.
func (c *Channel) Unquiesce(ctx context.Context) error {
	return c.ctl(ctx, "CTL UNQUIESCE", CtlUnquiesce, !c.Quirks().UnquiesceKeepsErr)
}

// Reset writes RESET to CTL. ERR is not checked (QEMU leaves it as it was).
// On QEMU a reset only stops the completion thread, blocking for seconds;
// it frees no object, so destroy them all first.
func (c *Channel) Reset(ctx context.Context) error {
	return c.ctl(ctx, "CTL RESET", CtlReset, false)
}

// StartConfig describes a bring-up for Channel.Start.
type StartConfig struct {
	// DSR is written into DSRMem for the device's version.
	DSR DSR
	// DSRMem is the DSR's memory: DSRSize bytes within one page of DMA
	// memory at DSRDMA.
	DSRMem []byte
	DSRDMA uint64
	// Interrupts unmasks the device's interrupts (IMR = 0) before
	// activation; otherwise they are masked.
	Interrupts bool
	// NoActivate stops Start once the DSR is loaded: it writes neither IMR
	// nor CTL, and the caller calls SetInterruptMask and Activate when it
	// is ready (the root package first destroys what a crashed holder of
	// the device left on it, and activates QEMU's device only once).
	// Interrupts is then ignored.
	NoActivate bool
}

// Start brings the device up in the order of Linux's probe: read VERSION
// (17..20 supported), encode the DSR, LoadDSR (caps validated, quirks
// recorded), write IMR, ACTIVATE (the last two unless cfg.NoActivate). The
// device rings' counters must already be zero (NewAsyncRing and
// NewCQNotifyRing zero them). It returns the device's version, also with an
// error once VERSION was read, and capabilities; Quirks tells what to work
// around.
func (c *Channel) Start(ctx context.Context, cfg *StartConfig) (uint32, Caps, error) {
	version, err := c.ReadVersion(ctx)
	if err != nil {
		return 0, Caps{}, err
	}
	if version < MinVersion || version > MaxVersion {
		return version, Caps{}, c.opErr("start", 0, &FieldError{Where: "device", Field: "VERSION", Value: uint64(version),
			Want: fmt.Sprintf("%d..%d", MinVersion, MaxVersion), Err: ErrNotSupported})
	}
	if err := cfg.DSR.Encode(cfg.DSRMem, version); err != nil {
		return version, Caps{}, c.opErr("encode DSR", 0, err)
	}
	caps, err := c.LoadDSR(ctx, cfg.DSRDMA, cfg.DSRMem, version)
	if err != nil {
		return version, caps, err
	}
	if cfg.NoActivate {
		return version, caps, nil
	}
	mask := IMRMaskAll
	if cfg.Interrupts {
		mask = IMRUnmaskAll
	}
	if err := c.SetInterruptMask(ctx, mask); err != nil {
		return version, caps, err
	}
	if err := c.Activate(ctx); err != nil {
		return version, caps, err
	}
	return version, caps, nil
}
