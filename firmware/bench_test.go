package firmware

import (
	"context"
	"testing"

	"github.com/vfrdma/vfrdma/mmio"
)

// The channel's register interface is what mmio.Region offers.
var _ Regs = (*mmio.Region)(nil)

// bench wires a Channel and the device rings to a fakeDev, the way the root
// package wires them to a BAR and DMA memory.
type bench struct {
	t     testing.TB
	mem   *fakeMem
	dev   *fakeDev
	ch    *Channel
	async *AsyncRing
	cqn   *CQNotifyRing
	caps  Caps
	cfg   StartConfig
}

type benchOpts struct {
	version   uint32
	spec      bool // a device that follows the interface (no QEMU quirks)
	deferred  bool // responses arrive later, as on real hardware
	ringPages int  // data pages per device ring
	opts      Options
	noStart   bool
	configure func(*bench)
}

// newRing allocates and describes a device ring: state page, data pages,
// directory and table.
func (b *bench) newRing(data int) (RingPageInfo, Regs, [][]byte) {
	b.t.Helper()
	dir, tbl, st := b.mem.alloc(), b.mem.alloc(), b.mem.alloc()
	var addrs []uint64
	var pages [][]byte
	for range data {
		p := b.mem.alloc()
		addrs = append(addrs, p.DMA)
		pages = append(pages, p.Mem)
	}
	if err := WriteRingPageDir(dir, tbl, st.DMA, addrs); err != nil {
		b.t.Fatal(err)
	}
	regs, err := mmio.New(st.Mem)
	if err != nil {
		b.t.Fatal(err)
	}
	return RingPageInfo{NumPages: uint32(data + 1), PDirDMA: dir.DMA}, regs, pages
}

func newBench(t testing.TB, o benchOpts) *bench {
	t.Helper()
	if o.version == 0 {
		o.version = VersionRoCEv1
	}
	if o.ringPages == 0 {
		o.ringPages = 1
	}
	b := &bench{t: t, mem: newFakeMem()}
	b.dev = newFakeDev(b.mem, o.version)
	if o.spec {
		b.dev.spec, b.dev.swapSRQ = true, false
	}
	b.dev.deferred = o.deferred
	dsr, cmd, resp := b.mem.alloc(), b.mem.alloc(), b.mem.alloc()
	ai, as, ap := b.newRing(o.ringPages)
	ci, cs, cp := b.newRing(o.ringPages)
	var err error
	if b.async, err = NewAsyncRing(as, ap); err != nil {
		t.Fatal(err)
	}
	if b.cqn, err = NewCQNotifyRing(cs, cp); err != nil {
		t.Fatal(err)
	}
	if o.deferred && o.opts.Wait == nil {
		o.opts.Wait = func(ctx context.Context) error {
			b.dev.deliver()
			return ctx.Err()
		}
	}
	if b.ch, err = NewChannel(b.dev, cmd.Mem, resp.Mem, &o.opts); err != nil {
		t.Fatal(err)
	}
	b.cfg = StartConfig{
		DSR: DSR{
			GOS:        GOSInfo{Bits: GOSBits64, Type: GOSTypeLinux, Version: 1},
			CmdSlotDMA: cmd.DMA, RespSlotDMA: resp.DMA,
			AsyncRing: ai, CQRing: ci,
		},
		DSRMem: dsr.Mem, DSRDMA: dsr.DMA,
	}
	if o.configure != nil {
		o.configure(b)
	}
	if !o.noStart {
		if _, b.caps, err = b.ch.Start(context.Background(), &b.cfg); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if len(b.dev.crashes) > 0 {
			t.Errorf("the device would have crashed or corrupted memory: %q", b.dev.crashes)
		}
	})
	return b
}

// ringObject allocates a single-table ring object: state page plus data pages.
func (b *bench) ringObject(data int) (pdir uint64, state Page) {
	b.t.Helper()
	dir, tbl, st := b.mem.alloc(), b.mem.alloc(), b.mem.alloc()
	var addrs []uint64
	for range data {
		addrs = append(addrs, b.mem.alloc().DMA)
	}
	if err := WriteRingPageDir(dir, tbl, st.DMA, addrs); err != nil {
		b.t.Fatal(err)
	}
	return dir.DMA, st
}
