package firmware_test

import (
	"context"
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/hw"
	"github.com/vfrdma/vfrdma/mmio"
	"github.com/vfrdma/vfrdma/pvsim"
)

// The channel's tests run on the device model (package pvsim), through the
// seams the real device uses: its BAR1 registers, DMA memory at device
// addresses, and MSI-X vector 0. The model plays QEMU 7.2 or a VMware
// device at interface versions 17 to 20, so each test says which device it
// is about.
//
// A few tests need a device that breaks its interface in a way no device
// (and so no model) is meant to: a response with the wrong cookie or the
// wrong acknowledgement, or an ERR the device never writes after a CTL.
// For those, tap (below) tampers with what the model wrote before the
// channel reads it: the one private stand-in left here, a thin layer over
// the model rather than a device of its own.

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The channel's register interface is what mmio.Region and a hw.Function's
// registers offer.
var (
	_ firmware.Regs = (*mmio.Region)(nil)
	_ firmware.Regs = hw.Registers(nil)
)

var (
	bg   = context.Background()
	le   = binary.LittleEndian
	qemu = pvsim.Config{QEMU: true}
)

// vmware is a VMware device at interface version v.
func vmware(v uint32) pvsim.Config { return pvsim.Config{Version: v} }

// bench wires a Channel and the device rings to a model, the way the root
// package's start wires them to a function.
type bench struct {
	t     testing.TB
	dev   *pvsim.Device
	regs  hw.Registers // the model's BAR1, untapped
	tap   *tap         // BAR1 as the channel reaches it
	vec0  hw.Vector    // the command-response vector
	ch    *firmware.Channel
	cmd   firmware.Page // the command slot
	resp  firmware.Page // the response slot
	async *firmware.AsyncRing
	cqn   *firmware.CQNotifyRing
	caps  firmware.Caps
	cfg   firmware.StartConfig
}

type benchOpts struct {
	dev       pvsim.Config // the device (the zero Config: a VMware device at version 20)
	ringPages int          // data pages per device ring (0: 1)
	opts      firmware.Options
	// wait, if set, is the channel's Options.Wait. Without it a device
	// that answers late (CommandDelay) is waited for on vector 0, and
	// one that answers inside the REQUEST write is not waited for.
	wait      func(b *bench, ctx context.Context) error
	noStart   bool
	configure func(*bench)
}

func newBench(t testing.TB, o benchOpts) *bench {
	t.Helper()
	if o.ringPages == 0 {
		o.ringPages = 1
	}
	m, err := pvsim.New(o.dev)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, m.Close()) })
	b := &bench{t: t, dev: m}
	b.regs, err = m.Registers()
	require.NoError(t, err)
	vecs, err := m.EnableVectors(3)
	require.NoError(t, err)
	b.vec0 = vecs[firmware.VectorResponse]
	dsr := b.page()
	b.cmd, b.resp = b.page(), b.page()
	b.tap = &tap{Registers: b.regs, cmd: b.cmd.Mem, resp: b.resp.Mem}
	ai, as, ap := b.newRing(o.ringPages)
	ci, cs, cp := b.newRing(o.ringPages)
	b.async, err = firmware.NewAsyncRing(as, ap)
	require.NoError(t, err)
	b.cqn, err = firmware.NewCQNotifyRing(cs, cp)
	require.NoError(t, err)
	switch {
	case o.wait != nil:
		o.opts.Wait = func(ctx context.Context) error { return o.wait(b, ctx) }
	case o.opts.Wait == nil && o.dev.CommandDelay > 0:
		o.opts.Wait = func(ctx context.Context) error {
			_, err := b.vec0.Wait(ctx)
			return err
		}
	}
	b.ch, err = firmware.NewChannel(b.tap, b.cmd.Mem, b.resp.Mem, &o.opts)
	require.NoError(t, err)
	b.cfg = firmware.StartConfig{
		DSR: firmware.DSR{
			GOS:        firmware.GOSInfo{Bits: firmware.GOSBits64, Type: firmware.GOSTypeLinux, Version: 1},
			CmdSlotDMA: b.cmd.DMA, RespSlotDMA: b.resp.DMA,
			AsyncRing: ai, CQRing: ci,
		},
		DSRMem: dsr.Mem, DSRDMA: dsr.DMA,
	}
	// A channel that waits for vector 0 needs it unmasked (the root
	// package unmasks at activation).
	b.cfg.Interrupts = o.opts.Wait != nil
	if o.configure != nil {
		o.configure(b)
	}
	t.Cleanup(func() {
		assert.NoError(t, b.ch.Close())
		assert.Empty(t, m.Hazards(), "what QEMU 7.2.0 would crash on, or corrupt memory over")
	})
	if !o.noStart {
		_, b.caps, err = b.ch.Start(bg, &b.cfg)
		require.NoError(t, err)
	}
	return b
}

// page allocates a page of the model's DMA memory (freed with the model).
func (b *bench) page() firmware.Page {
	b.t.Helper()
	buf, err := b.dev.AllocDMA(firmware.PageSize, false)
	require.NoError(b.t, err)
	return firmware.Page{DMA: buf.IOVA, Mem: buf.Mem}
}

// pages allocates n pages and returns them and their device addresses.
func (b *bench) pages(n int) ([]uint64, []firmware.Page) {
	var a []uint64
	var p []firmware.Page
	for range n {
		pg := b.page()
		a = append(a, pg.DMA)
		p = append(p, pg)
	}
	return a, p
}

// newRing allocates and describes a device ring: state page, data pages,
// directory and table.
func (b *bench) newRing(data int) (firmware.RingPageInfo, firmware.Regs, [][]byte) {
	b.t.Helper()
	dir, tbl, st := b.page(), b.page(), b.page()
	addrs, pgs := b.pages(data)
	var mem [][]byte
	for _, p := range pgs {
		mem = append(mem, p.Mem)
	}
	require.NoError(b.t, firmware.WriteRingPageDir(dir, tbl, st.DMA, addrs))
	regs, err := mmio.New(st.Mem)
	require.NoError(b.t, err)
	return firmware.RingPageInfo{NumPages: uint32(data + 1), PDirDMA: dir.DMA}, regs, mem
}

// ringObject allocates a single-table ring object: state page plus data
// pages.
func (b *bench) ringObject(data int) (pdir uint64, state firmware.Page) {
	b.t.Helper()
	dir, tbl, st := b.page(), b.page(), b.page()
	addrs, _ := b.pages(data)
	require.NoError(b.t, firmware.WriteRingPageDir(dir, tbl, st.DMA, addrs))
	return dir.DMA, st
}

// reg reads a register of the model.
func (b *bench) reg(off int) uint32 {
	b.t.Helper()
	v, err := b.regs.Load32(off)
	require.NoError(b.t, err)
	return v
}

// sync returns once every command sent before has run: the device runs
// commands in order, and QUERY_PORT is answered.
func (b *bench) sync() {
	b.t.Helper()
	_, err := b.ch.QueryPort(bg, 1)
	require.NoError(b.t, err)
}

// tap is the model's register file as the channel reaches it. It records
// the code of every command the channel sends (read from the command slot
// when REQUEST is written, as a bus analyser would see it), and can make
// the device misbehave: afterRequest rewrites the response the model
// wrote, errRead replaces what ERR reads.
type tap struct {
	hw.Registers
	cmd, resp []byte

	mu           sync.Mutex
	log          []firmware.Cmd
	afterRequest func(cmd, resp []byte)
	errRead      func(v uint32) uint32
}

func (r *tap) Store32(off int, v uint32) error {
	if off == firmware.RegRequest && v == 0 {
		r.mu.Lock()
		r.log = append(r.log, firmware.Cmd(le.Uint32(r.cmd[8:])))
		after := r.afterRequest
		r.mu.Unlock()
		err := r.Registers.Store32(off, v)
		if after != nil {
			after(r.cmd, r.resp)
		}
		return err
	}
	return r.Registers.Store32(off, v)
}

func (r *tap) Load32(off int) (uint32, error) {
	v, err := r.Registers.Load32(off)
	r.mu.Lock()
	f := r.errRead
	r.mu.Unlock()
	if off == firmware.RegErr && f != nil {
		v = f(v)
	}
	return v, err
}

// sent returns the codes of the commands sent so far.
func (r *tap) sent() []firmware.Cmd {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]firmware.Cmd(nil), r.log...)
}

func (r *tap) tamper(after func(cmd, resp []byte), errRead func(uint32) uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.afterRequest, r.errRead = after, errRead
}

func gid(seed byte) (g [16]byte) {
	for i := range g {
		g[i] = seed + byte(i)
	}
	return g
}

// withTimeout is a context for one step of a test.
func withTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(bg, d)
	t.Cleanup(cancel)
	return ctx
}
