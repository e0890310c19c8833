package vfio

import (
	"errors"
	"io/fs"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma/mmio"
	"github.com/vfrdma/vfrdma/pci"
	"github.com/vfrdma/vfrdma/vfio/internal/uapi"
)

func TestOpenPVRDMA(t *testing.T) {
	e := newEnv(t)
	d := e.open(t)
	if d.Name() != rdmaName || d.Group().Number() != 5 {
		t.Fatalf("device %s in group %d", d.Name(), d.Group().Number())
	}
	info := d.Info()
	if !info.PCI || info.Resettable || info.NumRegions != 9 || info.NumIRQs != 5 {
		t.Fatalf("info = %+v", info)
	}
	regs := d.Regions()
	if got := slices.Sorted(mapsKeys(regs)); !slices.Equal(got, []int{0, 1, 2, 7}) {
		t.Fatalf("regions %v, want 0 1 2 7", got)
	}
	if r := regs[RegionBAR0]; r.Size != 16<<10 || !r.Mappable || !r.MSIXMappable || len(r.Caps) != 1 {
		t.Errorf("BAR0 = %+v", r)
	}
	if r := regs[RegionBAR1]; r.Size != 256 || !r.Mappable || !r.Readable || !r.Writable || r.SparseMmap != nil {
		t.Errorf("BAR1 = %+v", r)
	}
	if r := regs[RegionBAR2]; r.Size != 8<<20 || !r.Mappable {
		t.Errorf("BAR2 = %+v", r)
	}
	if r := regs[RegionConfig]; r.Size != 256 || r.Mappable {
		t.Errorf("config = %+v", r)
	}
	irqs := d.IRQs()
	if got := slices.Sorted(mapsKeys(irqs)); !slices.Equal(got, []int{IRQINTx, IRQMSIX, IRQReq}) {
		t.Fatalf("IRQ indexes %v", got)
	}
	if m := irqs[IRQMSIX]; m.Count != 3 || !m.Eventfd || !m.NoResize {
		t.Errorf("MSI-X = %+v", m)
	}
	if x, ok := d.IRQ(IRQINTx); !ok || !x.Automasked || !x.Maskable {
		t.Errorf("INTx = %+v", x)
	}
	ii, err := d.Container().IOMMUInfo()
	if err != nil {
		t.Fatal(err)
	}
	if ii.Type != Type1v2 || ii.PageSizes != 0x40201000 || ii.MinPageSize() != 4096 || ii.DMAAvail != 65535 ||
		!slices.Equal(ii.Ranges, []IOVARange{{0, 0xfedfffff}, {0xfef00000, 0x7fffffffff}}) {
		t.Fatalf("IOMMU info = %+v", ii)
	}

	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	want := []string{"close device 0000:00:10.1", "close group 5", "close container"}
	if got := e.k.events(); !slices.Equal(got, want) {
		t.Fatalf("teardown %q, want %q", got, want)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := d.Map(RegionBAR1, 0, 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("Map after Close: %v", err)
	}
	if err := d.Container().MapDMA(make([]byte, 4096), 1<<20); !errors.Is(err, ErrClosed) {
		t.Fatalf("MapDMA after Close: %v", err)
	}
}

func mapsKeys[V any](m map[int]V) func(func(int) bool) {
	return func(yield func(int) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func TestOpenStepByStep(t *testing.T) {
	e := newEnv(t)
	c, err := OpenContainer(e.opts)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.IOMMUInfo(); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("IOMMUInfo before a group: %v", err)
	}
	if _, err := c.AllocIOVA(4096, 0); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("AllocIOVA before a group: %v", err)
	}
	g, err := c.OpenGroup(5)
	if err != nil {
		t.Fatal(err)
	}
	if g.Container() != c {
		t.Fatal("group's container")
	}
	viable, set, err := g.Status()
	if err != nil || !viable || !set {
		t.Fatalf("Status = %v %v %v", viable, set, err)
	}
	if _, err := c.OpenGroup(5); !errors.Is(err, ErrBusy) {
		t.Fatalf("OpenGroup twice: %v", err)
	}
	d, err := g.OpenDevice(rdmaName)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.OpenDevice(rdmaName); !errors.Is(err, ErrBusy) {
		t.Fatalf("OpenDevice twice: %v", err)
	}
	if _, err := g.OpenDevice("0000:00:11.0"); !errors.Is(err, unix.ENODEV) || !strings.Contains(err.Error(), "member of IOMMU group 5") {
		t.Fatalf("OpenDevice(absent): %v", err)
	}
	nic, err := g.OpenDevice("0000:00:10.0")
	if err != nil {
		t.Fatal(err)
	}
	// Closing the group closes its devices first.
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	ev := e.k.events()
	if len(ev) != 3 || ev[2] != "close group 5" || !strings.HasPrefix(ev[0], "close device") || !strings.HasPrefix(ev[1], "close device") {
		t.Fatalf("events %q", ev)
	}
	if err := d.Close(); err != nil || nic.Close() != nil {
		t.Fatal("closing devices of a closed group")
	}
	if _, _, err := g.Status(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Status after Close: %v", err)
	}
	if _, err := g.OpenDevice(rdmaName); !errors.Is(err, ErrClosed) {
		t.Fatalf("OpenDevice after Close: %v", err)
	}
	// The group can be opened again in the same container.
	g2, err := c.OpenGroup(5)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g2.OpenDevice(rdmaName); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.OpenGroup(5); !errors.Is(err, ErrClosed) {
		t.Fatalf("OpenGroup after Close: %v", err)
	}
}

func TestOpenErrors(t *testing.T) {
	t.Run("no VFIO", func(t *testing.T) {
		e := newEnv(t)
		e.k.noVFIO = true
		_, err := Open(rdmaAddr, e.opts)
		if !errors.Is(err, ErrNoVFIO) || !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "modprobe vfio-pci") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("API version", func(t *testing.T) {
		e := newEnv(t)
		e.k.apiVersion = 1
		if _, err := Open(rdmaAddr, e.opts); !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "version 1") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("no type1", func(t *testing.T) {
		e := newEnv(t)
		e.k.extensions = map[uint32]bool{}
		if _, err := Open(rdmaAddr, e.opts); !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "vfio_iommu_type1") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("type1 only", func(t *testing.T) {
		e := newEnv(t)
		e.k.extensions = map[uint32]bool{uapi.Type1IOMMU: true}
		d := e.open(t)
		if ii, _ := d.Container().IOMMUInfo(); ii.Type != Type1 {
			t.Fatalf("IOMMU type %v", ii.Type)
		}
	})
	t.Run("type1v2 required", func(t *testing.T) {
		e := newEnv(t)
		e.k.extensions = map[uint32]bool{uapi.Type1IOMMU: true}
		e.opts.IOMMU = Type1v2
		if _, err := Open(rdmaAddr, e.opts); !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "type1v2") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("not viable", func(t *testing.T) {
		e := newEnv(t)
		e.group.viable = false
		// sysfs shows who is in the way.
		if err := e.sys.Bus().RestoreGroup(map[pci.Addr]string{nicAddr: "vmxnet3"}); err != nil {
			t.Fatal(err)
		}
		_, err := Open(rdmaAddr, e.opts)
		if !errors.Is(err, ErrGroupNotViable) || !strings.Contains(err.Error(), "0000:00:10.0 (15ad:07b0) is bound to vmxnet3") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("group node missing", func(t *testing.T) {
		e := newEnv(t)
		delete(e.k.groups, 5)
		if _, err := Open(rdmaAddr, e.opts); !errors.Is(err, ErrNotBound) || !strings.Contains(err.Error(), "BindGroup") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("group busy", func(t *testing.T) {
		e := newEnv(t)
		e.group.open = true
		if _, err := Open(rdmaAddr, e.opts); !errors.Is(err, ErrBusy) || !errors.Is(err, unix.EBUSY) {
			t.Fatalf("err = %v", err)
		}
		e.group.open = false
	})
	t.Run("no interrupt remapping", func(t *testing.T) {
		e := newEnv(t)
		e.k.setErr = unix.EPERM
		_, err := Open(rdmaAddr, e.opts)
		if !errors.Is(err, unix.EPERM) || !strings.Contains(err.Error(), "intremap=on") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("not bound", func(t *testing.T) {
		e := newEnv(t)
		if err := e.sys.Bus().RestoreGroup(map[pci.Addr]string{rdmaAddr: ""}); err != nil {
			t.Fatal(err)
		}
		_, err := Open(rdmaAddr, e.opts)
		if !errors.Is(err, ErrNotBound) || !strings.Contains(err.Error(), "no driver") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("no such function", func(t *testing.T) {
		e := newEnv(t)
		if _, err := Open(pci.Addr{Slot: 0x11}, e.opts); !errors.Is(err, pci.ErrNotFound) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("not PCI", func(t *testing.T) {
		e := newEnv(t)
		e.rdma.flags = 0
		if _, err := Open(rdmaAddr, e.opts); !errors.Is(err, ErrNotSupported) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("no IOMMU group", func(t *testing.T) {
		e := newEnv(t)
		sys := pciNoGroup(t)
		e.opts.SysfsRoot = sys
		if _, err := Open(rdmaAddr, e.opts); !errors.Is(err, pci.ErrNoIOMMUGroup) || !strings.Contains(err.Error(), "intel_iommu=on") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("corrupt region caps", func(t *testing.T) {
		e := newEnv(t)
		e.rdma.regions[0].caps = [][]byte{{3, 0, 1, 0}} // a header cut short
		if _, err := Open(rdmaAddr, e.opts); !errors.Is(err, uapi.ErrBadCaps) {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestRegionSparseMmap(t *testing.T) {
	e := newEnv(t)
	// BAR0 as vfio-pci shows it without MSI-X mapping support: two areas
	// around the MSI-X table, a type cap, and an unknown cap, together
	// larger than a first info buffer.
	sparse := uapi.Encode(&uapi.RegionInfoCapSparseMmap{
		Header:  uapi.InfoCapHeader{ID: uapi.RegionInfoCapSparseMmapID, Version: 1},
		NrAreas: 3,
	})
	for _, a := range []uapi.RegionSparseMmapArea{{Offset: 0x1000, Size: 0x1000}, {Offset: 0x3000, Size: 0x1000}, {Offset: 0x2000, Size: 0}} {
		sparse = append(sparse, uapi.Encode(&a)...)
	}
	typ := uapi.Encode(&uapi.RegionInfoCapType{Header: uapi.InfoCapHeader{ID: uapi.RegionInfoCapTypeID, Version: 1}, Type: 1 << 31, Subtype: 7})
	unknown := []byte{99, 0, 1, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}
	e.rdma.regions[0].caps = [][]byte{sparse, typ, unknown}
	d := e.open(t)
	r, _ := d.Region(RegionBAR0)
	if !slices.Equal(r.SparseMmap, []Area{{0x1000, 0x1000}, {0x3000, 0x1000}}) {
		t.Fatalf("sparse = %v", r.SparseMmap)
	}
	if r.Type != 1<<31 || r.Subtype != 7 || len(r.Caps) != 3 || r.Caps[2].ID != 99 || r.MSIXMappable {
		t.Fatalf("region = %+v", r)
	}
	if _, err := d.Map(RegionBAR0, 0, 0x1000); !errors.Is(err, ErrRange) {
		t.Fatalf("Map outside areas: %v", err)
	}
	if _, err := d.Map(RegionBAR0, 0x1000, 0x2000); !errors.Is(err, ErrRange) {
		t.Fatalf("Map across areas: %v", err)
	}
	b, err := d.Map(RegionBAR0, 0x3000, 0x1000)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Unmap(b); err != nil {
		t.Fatal(err)
	}
	// A sparse area outside the region is corrupt.
	e2 := newEnv(t)
	bad := slices.Clone(sparse)
	copy(bad[16:], uapi.Encode(&uapi.RegionSparseMmapArea{Offset: 0x3000, Size: 0x2000}))
	e2.rdma.regions[0].caps = [][]byte{bad}
	if _, err := Open(rdmaAddr, e2.opts); !errors.Is(err, uapi.ErrBadCaps) {
		t.Fatalf("area outside region: %v", err)
	}
}

func TestMapRegion(t *testing.T) {
	e := newEnv(t)
	d := e.open(t)
	bar1, err := d.Map(RegionBAR1, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(bar1) != 256 || cap(bar1) != 256 {
		t.Fatalf("BAR1 mapping len %d cap %d", len(bar1), cap(bar1))
	}
	regs, err := mmio.New(bar1)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := regs.Load32(0); err != nil || v != 17 {
		t.Fatalf("VERSION = %d, %v", v, err)
	}
	if v, _ := regs.Load32(0x14); v != 0xffff {
		t.Fatalf("ERR = %#x", v)
	}
	if err := regs.Store32(0x1c, 0); err != nil {
		t.Fatal(err)
	}
	// The store reached the device fd (shared mapping).
	var b4 [4]byte
	if err := d.ReadRegion(RegionBAR1, 0x20, b4[:]); err != nil {
		t.Fatal(err)
	}
	if err := regs.Store32(0x20, 0xabcd); err != nil {
		t.Fatal(err)
	}
	if err := d.ReadRegion(RegionBAR1, 0x20, b4[:]); err != nil || b4 != [4]byte{0xcd, 0xab, 0, 0} {
		t.Fatalf("ReadRegion after Store32 = % x, %v", b4, err)
	}
	uar, err := d.Map(RegionBAR2, 4096, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if d.Mappings() != 2 {
		t.Fatalf("Mappings = %d", d.Mappings())
	}
	for name, f := range map[string]func() error{
		"misaligned":  func() error { _, err := d.Map(RegionBAR2, 100, 4096); return err },
		"too long":    func() error { _, err := d.Map(RegionBAR2, 8<<20-4096, 8192); return err },
		"past end":    func() error { _, err := d.Map(RegionBAR2, 9<<20, 0); return err },
		"no region":   func() error { _, err := d.Map(RegionBAR4, 0, 0); return err },
		"not mmap":    func() error { _, err := d.Map(RegionConfig, 0, 0); return err },
		"unmap other": func() error { return d.Unmap(make([]byte, 4096)) },
		"read past":   func() error { return d.ReadRegion(RegionBAR1, 254, b4[:]) },
		"read none":   func() error { return d.ReadRegion(RegionBAR5, 0, b4[:]) },
	} {
		err := f()
		var want error = ErrRange
		switch name {
		case "misaligned":
			want = ErrAlignment
		case "not mmap":
			want = ErrNotSupported
		}
		if !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", name, err, want)
		}
	}
	if err := d.Unmap(uar); err != nil {
		t.Fatal(err)
	}
	if err := d.Unmap(uar); !errors.Is(err, ErrRange) {
		t.Fatalf("double Unmap: %v", err)
	}
	// BAR1 is left mapped: Close unmaps it (TestMain checks nothing is
	// left in /proc/self/maps).
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if n := fakeMappings(); n != 0 {
		t.Fatalf("%d device mappings after Close", n)
	}
}

func TestConfigAndBusMaster(t *testing.T) {
	e := newEnv(t)
	d := e.open(t)
	vid, err := d.ReadConfig16(0)
	if err != nil || vid != 0x15ad {
		t.Fatalf("vendor = %#x, %v", vid, err)
	}
	id, _ := d.ReadConfig32(0)
	if id != 0x082015ad {
		t.Fatalf("id = %#x", id)
	}
	cmd, err := d.EnableBusMaster()
	if err != nil || cmd != 0x0107 {
		t.Fatalf("EnableBusMaster = %#x, %v", cmd, err)
	}
	if c, _ := d.ReadConfig16(ConfigCommand); c != 0x0107 {
		t.Fatalf("command after = %#x", c)
	}
	// Idempotent.
	if cmd, err := d.EnableBusMaster(); err != nil || cmd != 0x0107 {
		t.Fatalf("EnableBusMaster again = %#x, %v", cmd, err)
	}
	if err := d.WriteConfig8(0x3c, 0x0b); err != nil {
		t.Fatal(err)
	}
	if v, _ := d.ReadConfig8(0x3c); v != 0x0b {
		t.Fatalf("interrupt line = %#x", v)
	}
	if err := d.WriteConfig32(0x40, 0xdeadbeef); err != nil {
		t.Fatal(err)
	}
	if v, _ := d.ReadConfig32(0x40); v != 0xdeadbeef {
		t.Fatalf("config 0x40 = %#x", v)
	}
	if _, err := d.ReadConfig32(0xfe); !errors.Is(err, ErrRange) {
		t.Fatalf("ReadConfig32 past end: %v", err)
	}
}

func TestReset(t *testing.T) {
	e := newEnv(t)
	d := e.open(t)
	if err := d.Reset(); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("Reset without support: %v", err)
	}
	_ = d.Close()
	e.rdma.flags |= uapi.DeviceFlagsReset
	d = e.open(t)
	if err := d.Reset(); err != nil {
		t.Fatal(err)
	}
	if e.rdma.resets != 1 {
		t.Fatalf("resets = %d", e.rdma.resets)
	}
}
