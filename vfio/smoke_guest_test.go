//go:build guest

// In-guest smoke test of pci, vfio and mmio against QEMU's emulated pvrdma.
// It runs as root inside the bench's VM, where the init has loaded the VFIO
// modules and bound the pvrdma function's IOMMU group to vfio-pci:
//
//	CGO_ENABLED=0 go test -c -tags guest ./vfio
//
// and then make test, or go run ./cmd/pvvm -test ./vfio.
package vfio_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/mmio"
	"github.com/vfrdma/vfrdma/pci"
	"github.com/vfrdma/vfrdma/qemu/proto"
	"github.com/vfrdma/vfrdma/vfio"
)

// guestAddr returns the pvrdma function under test, skipping (with how to
// run the test) outside the bench's guest. Inside it never skips: a missing
// address is a failure.
func guestAddr(t *testing.T) pci.Addr {
	t.Helper()
	if os.Getenv(proto.EnvGuest) != "1" {
		t.Skipf("in-guest test: it needs the QEMU bench's VM with the emulated pvrdma NIC; run it with `make test` or `go run ./cmd/pvvm -test ./vfio` (%s is not set here)", proto.EnvGuest)
	}
	bdf := os.Getenv(proto.EnvBDF)
	if bdf == "" {
		t.Fatalf("%s=1 but %s is not set: the guest init must name the pvrdma function", proto.EnvGuest, proto.EnvBDF)
	}
	a, err := pci.ParseAddr(bdf)
	if err != nil {
		t.Fatalf("%s: %v", proto.EnvBDF, err)
	}
	return a
}

func TestGuestPCI(t *testing.T) {
	addr := guestAddr(t)
	bus := pci.NewBus("")
	fns, err := bus.Find(pci.VendorVMware, pci.DevicePVRDMA)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(fns, func(f pci.Function) bool { return f.Addr == addr }) {
		t.Fatalf("15ad:0820 at %v not found; pvrdma functions: %v", addr, fns)
	}
	f, err := bus.Lookup(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pvrdma: %v class %#06x IOMMU group %d", f, f.Class, f.IOMMUGroup)
	if f.IOMMUGroup < 0 {
		t.Fatalf("%v has no IOMMU group", addr)
	}
	group, members, err := bus.GroupMembers(addr)
	if err != nil {
		t.Fatal(err)
	}
	if group != f.IOMMUGroup || len(members) != 2 {
		t.Fatalf("group %d members %v: want the vmxnet3 and pvrdma functions", group, members)
	}
	nic := pci.Addr{Domain: addr.Domain, Bus: addr.Bus, Slot: addr.Slot, Func: 0}
	for _, m := range members {
		if m.Driver != "vfio-pci" {
			t.Errorf("group member %v is bound to %q, want vfio-pci", m, m.Driver)
		}
	}
	if members[0].Addr != nic || members[0].Vendor != pci.VendorVMware || members[0].Device != pci.DeviceVMXNET3 {
		t.Errorf("group member 0 is %v, want vmxnet3 at %v", members[0], nic)
	}
	if err := bus.CheckGroup(addr, "vfio-pci"); err != nil {
		t.Fatal(err)
	}
	// Binding an already bound group is a no-op that reports vfio-pci.
	prev, err := bus.BindGroup(addr, "vfio-pci")
	if err != nil {
		t.Fatal(err)
	}
	for a, d := range prev {
		if d != "vfio-pci" {
			t.Errorf("BindGroup reports %v had %q", a, d)
		}
	}
}

func TestGuestVFIO(t *testing.T) {
	addr := guestAddr(t)
	f, err := pci.NewBus("").Lookup(addr)
	if err != nil {
		t.Fatal(err)
	}
	c, err := vfio.OpenContainer(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	g, err := c.OpenGroup(f.IOMMUGroup)
	if err != nil {
		t.Fatal(err)
	}
	viable, set, err := g.Status()
	if err != nil || !viable || !set {
		t.Fatalf("group status viable=%v container set=%v, %v", viable, set, err)
	}
	ii, err := c.IOMMUInfo()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("IOMMU %v, page sizes %#x, IOVA ranges %v, DMA mappings available %d", ii.Type, ii.PageSizes, ii.Ranges, ii.DMAAvail)
	if ii.PageSizes&4096 == 0 {
		t.Errorf("IOMMU page sizes %#x lack 4 KiB", ii.PageSizes)
	}

	d, err := g.OpenDevice(addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	info := d.Info()
	t.Logf("device info %+v", info)
	if !info.PCI {
		t.Fatal("not a vfio-pci device")
	}
	if err := d.Reset(); info.Resettable {
		if err != nil {
			t.Errorf("Reset: %v", err)
		}
	} else if !errors.Is(err, vfio.ErrNotSupported) {
		t.Errorf("Reset of a device without reset: %v, want ErrNotSupported", err)
	}
	for idx, r := range d.Regions() {
		t.Logf("region %d: size %#x offset %#x flags %#x sparse %v msix-mappable %v", idx, r.Size, r.Offset, r.Flags, r.SparseMmap, r.MSIXMappable)
	}
	expect := []struct {
		index    int
		size     uint64
		mappable bool
	}{
		{vfio.RegionBAR0, 16 << 10, true},
		{vfio.RegionBAR1, 256, true},
		{vfio.RegionBAR2, 8 << 20, true},
		{vfio.RegionConfig, 256, false},
	}
	for _, e := range expect {
		r, ok := d.Region(e.index)
		if !ok {
			t.Errorf("region %d missing", e.index)
			continue
		}
		if r.Size != e.size || (e.mappable && !r.Mappable) || !r.Readable || !r.Writable {
			t.Errorf("region %d: size %#x mappable %v, want size %#x mappable %v", e.index, r.Size, r.Mappable, e.size, e.mappable)
		}
	}
	msix, ok := d.IRQ(vfio.IRQMSIX)
	if !ok || msix.Count != 3 || !msix.Eventfd {
		t.Fatalf("MSI-X: %+v (present %v), want 3 vectors on eventfds", msix, ok)
	}

	id, err := d.ReadConfig32(0)
	if err != nil || id != 0x082015ad {
		t.Fatalf("config vendor/device = %#08x, %v", id, err)
	}
	before, err := d.ReadConfig16(vfio.ConfigCommand)
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := d.EnableBusMaster()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("command register %#04x -> %#04x", before, cmd)
	if cmd&vfio.CommandBusMaster == 0 || cmd&vfio.CommandMemory == 0 {
		t.Fatalf("command register %#04x: bus master or memory decoding off", cmd)
	}
	if before == 0x0103 && cmd != 0x0107 {
		t.Errorf("command register %#04x after enabling bus master, want 0x0107", cmd)
	}

	bar1, err := d.Map(vfio.RegionBAR1, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	regs, err := mmio.New(bar1)
	if err != nil {
		t.Fatal(err)
	}
	version, err := regs.Load32(0x00)
	if err != nil {
		t.Fatal(err)
	}
	if version != 17 {
		t.Fatalf("VERSION = %d, want 17", version)
	}
	errReg, _ := regs.Load32(0x14)
	t.Logf("BAR1 VERSION %d, ERR %#x", version, errReg)
	uar, err := d.Map(vfio.RegionBAR2, 0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Unmap(uar); err != nil {
		t.Fatal(err)
	}

	vecs, err := d.EnableMSIX(3)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vecs {
		if err := v.Trigger(); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n, err := v.Wait(ctx)
		cancel()
		if err != nil || n != 1 {
			t.Fatalf("%v after Trigger: %d, %v", v, n, err)
		}
		if n, err := v.Poll(); err != nil || n != 0 {
			t.Fatalf("%v Poll: %d, %v", v, n, err)
		}
	}
	if err := d.DisableIRQs(vfio.IRQMSIX); err != nil {
		t.Fatal(err)
	}
	if _, err := vecs[0].Poll(); err == nil {
		t.Fatal("vector usable after DisableIRQs")
	}
	// Enable again and leave it to Close.
	if _, err := d.EnableMSIX(3); err != nil {
		t.Fatal(err)
	}

	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if d.Mappings() != 0 {
		t.Fatalf("%d region mappings after Close", d.Mappings())
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestGuestDMA(t *testing.T) {
	addr := guestAddr(t)
	d, err := vfio.Open(addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c := d.Container()
	ii, err := c.IOMMUInfo()
	if err != nil {
		t.Fatal(err)
	}
	inRanges := func(iova, size uint64) bool {
		if ii.Ranges == nil {
			return true
		}
		return slices.ContainsFunc(ii.Ranges, func(r vfio.IOVARange) bool { return iova >= r.Start && iova+size-1 <= r.End })
	}

	buf, err := c.AllocDMA(4096, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("DMA buffer: %d bytes at IOVA %#x, %d-byte pages", len(buf.Mem), buf.IOVA, buf.PageSize)
	if !inRanges(buf.IOVA, uint64(len(buf.Mem))) || buf.IOVA%4096 != 0 {
		t.Fatalf("IOVA %#x outside the IOMMU's ranges %v or misaligned", buf.IOVA, ii.Ranges)
	}
	ms := c.Mappings()
	if len(ms) != 1 || ms[0].IOVA != buf.IOVA || ms[0].IOVA == ms[0].Vaddr {
		t.Fatalf("mappings %+v", ms)
	}
	for i := range buf.Mem {
		buf.Mem[i] = byte(i)
	}
	if err := buf.Close(); err != nil {
		t.Fatal(err)
	}
	if len(c.Mappings()) != 0 {
		t.Fatalf("mappings after Close: %+v", c.Mappings())
	}

	// The explicit path: pinned memory, an IOVA, map, unmap.
	mem, err := vfio.AllocMemory(3<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	iova, err := c.AllocIOVA(uint64(len(mem.Bytes())), uint64(mem.PageSize()))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.MapDMA(mem.Bytes(), iova); err != nil {
		t.Fatal(err)
	}
	if err := c.UnmapDMA(iova, uint64(len(mem.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if err := c.FreeIOVA(iova, uint64(len(mem.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if err := mem.Close(); err != nil {
		t.Fatal(err)
	}

	// A buffer left open is unmapped and freed by Close.
	if _, err := c.AllocDMA(8192, nil); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
}

// The bench's tier chooses the path through VFRDMA_VFIO (pvvm -vfio):
// Open with no Options.Path takes the path it names, and on the cdev path
// the device has its node and DMA goes through an iommufd IOAS.
func TestGuestOpenTakesThePathTheTierChose(t *testing.T) {
	addr := guestAddr(t)
	want := os.Getenv("VFRDMA_VFIO")
	d, err := vfio.Open(addr, nil)
	require.NoError(t, err)
	defer d.Close()
	t.Logf("VFRDMA_VFIO=%q: took the %v path (cdev node %q)", want, d.Path(), d.CDev())
	ii, err := d.Container().IOMMUInfo()
	require.NoError(t, err)
	switch want {
	case "cdev":
		require.Equal(t, vfio.PathCDev, d.Path())
		require.NotEmpty(t, d.CDev())
		require.Equal(t, vfio.IOMMUFD, ii.Type)
		require.NotEmpty(t, ii.Ranges, "the IOAS's usable ranges")
	case "group":
		require.Equal(t, vfio.PathGroup, d.Path())
		require.Empty(t, d.CDev())
	default:
		require.Contains(t, []vfio.Path{vfio.PathCDev, vfio.PathGroup}, d.Path())
	}
	b, err := d.Container().AllocDMA(4096, nil)
	require.NoError(t, err)
	require.NoError(t, b.Close())
	require.NoError(t, d.Close())
}
