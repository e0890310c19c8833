package vfio_test

import (
	"io/fs"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma/mmio"
	"github.com/vfrdma/vfrdma/pci"
	"github.com/vfrdma/vfrdma/vfio"
	"github.com/vfrdma/vfrdma/vfio/internal/uapi"
	"github.com/vfrdma/vfrdma/vfio/vfiotest"
)

func TestOpenPVRDMA(t *testing.T) { forPaths(t, testOpenPVRDMA) }

func testOpenPVRDMA(t *testing.T, p vfio.Path) {
	e := newEnvOn(t, p)
	d := e.open(t)
	assert.Equal(t, rdmaName, d.Name())
	assert.Equal(t, 5, d.Group().Number())
	info := d.Info()
	assert.Equal(t, vfio.DeviceInfo{Flags: uapi.DeviceFlagsPCI, PCI: true, NumRegions: 9, NumIRQs: 5}, info)
	regs := d.Regions()
	require.Equal(t, []int{0, 1, 2, 7}, slices.Sorted(maps.Keys(regs)))
	if r := regs[vfio.RegionBAR0]; r.Size != 16<<10 || !r.Mappable || !r.MSIXMappable || len(r.Caps) != 1 {
		t.Errorf("BAR0 = %+v", r)
	}
	if r := regs[vfio.RegionBAR1]; r.Size != 256 || !r.Mappable || !r.Readable || !r.Writable || r.SparseMmap != nil {
		t.Errorf("BAR1 = %+v", r)
	}
	if r := regs[vfio.RegionBAR2]; r.Size != 8<<20 || !r.Mappable {
		t.Errorf("BAR2 = %+v", r)
	}
	if r := regs[vfio.RegionConfig]; r.Size != 256 || r.Mappable {
		t.Errorf("config = %+v", r)
	}
	irqs := d.IRQs()
	require.Equal(t, []int{vfio.IRQINTx, vfio.IRQMSIX, vfio.IRQReq}, slices.Sorted(maps.Keys(irqs)))
	if m := irqs[vfio.IRQMSIX]; m.Count != 3 || !m.Eventfd || !m.NoResize {
		t.Errorf("MSI-X = %+v", m)
	}
	if x, ok := d.IRQ(vfio.IRQINTx); !ok || !x.Automasked || !x.Maskable {
		t.Errorf("INTx = %+v", x)
	}
	ii, err := d.Container().IOMMUInfo()
	require.NoError(t, err)
	ranges := []vfio.IOVARange{{Start: 0, End: 0xfedfffff}, {Start: 0xfef00000, End: 0x7fffffffff}}
	assert.Equal(t, p, d.Path())
	assert.Equal(t, p, d.Container().Path())
	teardown := []string{"close device 0000:00:10.1", "close group 5", "close container"}
	if p == vfio.PathCDev {
		// iommufd reports the IOAS's ranges and its IOVA alignment, no
		// page-size bitmap and no mapping budget.
		assert.Equal(t, vfio.IOMMUInfo{Type: vfio.IOMMUFD, PageSizes: 0x1000, Ranges: ranges, DMAAvail: -1}, ii)
		assert.Equal(t, "vfio1", d.CDev(), "the pvrdma function's cdev (the second device of the fake)")
		teardown = []string{"bind 0000:00:10.1", "attach 0000:00:10.1 to IOAS 1", "close device 0000:00:10.1", "destroy IOAS 1", "close iommufd"}
	} else {
		assert.Equal(t, vfio.IOMMUInfo{Type: vfio.Type1v2, PageSizes: 0x40201000, Ranges: ranges, DMAAvail: 65535}, ii)
		assert.Empty(t, d.CDev())
	}
	assert.Equal(t, uint64(4096), ii.MinPageSize())

	require.NoError(t, d.Close())
	require.Equal(t, teardown, e.k.Events(), "teardown")
	require.NoError(t, d.Close(), "second Close")
	_, err = d.Map(vfio.RegionBAR1, 0, 0)
	require.ErrorIs(t, err, vfio.ErrClosed, "Map after Close")
	require.ErrorIs(t, d.Container().MapDMA(make([]byte, 4096), 1<<20), vfio.ErrClosed, "MapDMA after Close")
}

func TestOpenStepByStep(t *testing.T) {
	e := newEnv(t)
	c, err := vfio.OpenContainer(e.opts)
	require.NoError(t, err)
	defer c.Close()
	_, err = c.IOMMUInfo()
	require.ErrorIs(t, err, vfio.ErrNotSupported, "IOMMUInfo before a group")
	_, err = c.AllocIOVA(4096, 0)
	require.ErrorIs(t, err, vfio.ErrNotSupported, "AllocIOVA before a group")
	g, err := c.OpenGroup(5)
	require.NoError(t, err)
	require.Same(t, c, g.Container(), "group's container")
	viable, set, err := g.Status()
	require.NoError(t, err)
	require.True(t, viable, "viable")
	require.True(t, set, "container set")
	_, err = c.OpenGroup(5)
	require.ErrorIs(t, err, vfio.ErrBusy, "OpenGroup twice")
	d, err := g.OpenDevice(rdmaName)
	require.NoError(t, err)
	_, err = g.OpenDevice(rdmaName)
	require.ErrorIs(t, err, vfio.ErrBusy, "OpenDevice twice")
	_, err = g.OpenDevice("0000:00:11.0")
	require.ErrorIs(t, err, unix.ENODEV, "OpenDevice(absent)")
	require.ErrorContains(t, err, "member of IOMMU group 5")
	nic, err := g.OpenDevice("0000:00:10.0")
	require.NoError(t, err)
	// Closing the group closes its devices first.
	require.NoError(t, g.Close())
	ev := e.k.Events()
	if len(ev) != 3 || ev[2] != "close group 5" || !strings.HasPrefix(ev[0], "close device") || !strings.HasPrefix(ev[1], "close device") {
		t.Fatalf("events %q", ev)
	}
	require.NoError(t, d.Close(), "closing a device of a closed group")
	require.NoError(t, nic.Close(), "closing a device of a closed group")
	_, _, err = g.Status()
	require.ErrorIs(t, err, vfio.ErrClosed, "Status after Close")
	_, err = g.OpenDevice(rdmaName)
	require.ErrorIs(t, err, vfio.ErrClosed, "OpenDevice after Close")
	// The group can be opened again in the same container.
	g2, err := c.OpenGroup(5)
	require.NoError(t, err)
	_, err = g2.OpenDevice(rdmaName)
	require.NoError(t, err)
	require.NoError(t, c.Close())
	_, err = c.OpenGroup(5)
	require.ErrorIs(t, err, vfio.ErrClosed, "OpenGroup after Close")
}

func TestOpenErrors(t *testing.T) {
	t.Run("no VFIO", func(t *testing.T) {
		e := newEnv(t)
		e.k.SetVFIOLoaded(false)
		_, err := vfio.Open(rdmaAddr, e.opts)
		require.ErrorIs(t, err, vfio.ErrNoVFIO)
		require.ErrorIs(t, err, fs.ErrNotExist)
		require.ErrorContains(t, err, "modprobe vfio-pci")
	})
	t.Run("API version", func(t *testing.T) {
		e := newEnv(t)
		e.k.SetAPIVersion(1)
		_, err := vfio.Open(rdmaAddr, e.opts)
		require.ErrorIs(t, err, vfio.ErrNotSupported)
		require.ErrorContains(t, err, "version 1")
	})
	t.Run("no type1", func(t *testing.T) {
		e := newEnv(t)
		iommu := vfiotest.QEMUGuestIOMMU()
		iommu.Types = nil
		e.k.SetIOMMU(iommu)
		_, err := vfio.Open(rdmaAddr, e.opts)
		require.ErrorIs(t, err, vfio.ErrNotSupported)
		require.ErrorContains(t, err, "vfio_iommu_type1")
	})
	t.Run("type1 only", func(t *testing.T) {
		e := newEnv(t)
		iommu := vfiotest.QEMUGuestIOMMU()
		iommu.Types = []vfio.IOMMUType{vfio.Type1}
		e.k.SetIOMMU(iommu)
		d := e.open(t)
		ii, err := d.Container().IOMMUInfo()
		require.NoError(t, err)
		require.Equal(t, vfio.Type1, ii.Type)
	})
	t.Run("type1v2 required", func(t *testing.T) {
		e := newEnv(t)
		iommu := vfiotest.QEMUGuestIOMMU()
		iommu.Types = []vfio.IOMMUType{vfio.Type1}
		e.k.SetIOMMU(iommu)
		e.opts.IOMMU = vfio.Type1v2
		_, err := vfio.Open(rdmaAddr, e.opts)
		require.ErrorIs(t, err, vfio.ErrNotSupported)
		require.ErrorContains(t, err, "type1v2")
	})
	t.Run("not viable", func(t *testing.T) {
		e := newEnv(t)
		e.group.SetViable(false)
		// sysfs shows who is in the way.
		require.NoError(t, e.sys.Bus().RestoreGroup(map[pci.Addr]string{nicAddr: "vmxnet3"}))
		_, err := vfio.Open(rdmaAddr, e.opts)
		require.ErrorIs(t, err, vfio.ErrGroupNotViable)
		require.ErrorContains(t, err, "0000:00:10.0 (15ad:07b0) is bound to vmxnet3")
	})
	t.Run("group node missing", func(t *testing.T) {
		e := newEnv(t)
		e.k.RemoveGroup(5)
		_, err := vfio.Open(rdmaAddr, e.opts)
		require.ErrorIs(t, err, vfio.ErrNotBound)
		require.ErrorContains(t, err, "BindGroup")
	})
	t.Run("group busy", func(t *testing.T) {
		e := newEnv(t)
		e.group.SetBusy(true)
		_, err := vfio.Open(rdmaAddr, e.opts)
		require.ErrorIs(t, err, vfio.ErrBusy)
		require.ErrorIs(t, err, unix.EBUSY)
		e.group.SetBusy(false)
	})
	t.Run("no interrupt remapping", func(t *testing.T) {
		e := newEnv(t)
		e.k.Fail(vfiotest.IoctlSetIOMMU, unix.EPERM)
		_, err := vfio.Open(rdmaAddr, e.opts)
		require.ErrorIs(t, err, unix.EPERM)
		require.ErrorContains(t, err, "intremap=on")
	})
	t.Run("not bound", func(t *testing.T) {
		e := newEnv(t)
		require.NoError(t, e.sys.Bus().RestoreGroup(map[pci.Addr]string{rdmaAddr: ""}))
		_, err := vfio.Open(rdmaAddr, e.opts)
		require.ErrorIs(t, err, vfio.ErrNotBound)
		require.ErrorContains(t, err, "no driver")
	})
	t.Run("no such function", func(t *testing.T) {
		e := newEnv(t)
		_, err := vfio.Open(pci.Addr{Slot: 0x11}, e.opts)
		require.ErrorIs(t, err, pci.ErrNotFound)
	})
	t.Run("not PCI", func(t *testing.T) {
		e := newEnv(t)
		e.rdma.PCI = false
		_, err := vfio.Open(rdmaAddr, e.opts)
		require.ErrorIs(t, err, vfio.ErrNotSupported)
	})
	t.Run("no IOMMU group", func(t *testing.T) {
		e := newEnv(t)
		e.opts.SysfsRoot = pciNoGroup(t)
		_, err := vfio.Open(rdmaAddr, e.opts)
		require.ErrorIs(t, err, pci.ErrNoIOMMUGroup)
		require.ErrorContains(t, err, "intel_iommu=on")
	})
	t.Run("corrupt region caps", func(t *testing.T) {
		e := newEnv(t)
		e.rdma.Regions[0].Caps = [][]byte{{3, 0, 1, 0}} // a header cut short
		_, err := vfio.Open(rdmaAddr, e.opts)
		require.ErrorIs(t, err, uapi.ErrBadCaps)
	})
	t.Run("device fd refused", func(t *testing.T) {
		e := newEnv(t)
		e.k.Fail(vfiotest.IoctlGetDeviceFD, unix.EIO)
		_, err := vfio.Open(rdmaAddr, e.opts)
		require.ErrorIs(t, err, unix.EIO)
		// Open undid its work: the group and the container are closed.
		require.Equal(t, []string{"close group 5", "close container"}, e.k.Events())
	})
}

func TestRegionSparseMmap(t *testing.T) { forPaths(t, testRegionSparseMmap) }

func testRegionSparseMmap(t *testing.T, p vfio.Path) {
	e := newEnvOn(t, p)
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
	e.rdma.Regions[0].Caps = [][]byte{sparse, typ, unknown}
	d := e.open(t)
	r, _ := d.Region(vfio.RegionBAR0)
	require.Equal(t, []vfio.Area{{Offset: 0x1000, Size: 0x1000}, {Offset: 0x3000, Size: 0x1000}}, r.SparseMmap)
	if r.Type != 1<<31 || r.Subtype != 7 || len(r.Caps) != 3 || r.Caps[2].ID != 99 || r.MSIXMappable {
		t.Fatalf("region = %+v", r)
	}
	_, err := d.Map(vfio.RegionBAR0, 0, 0x1000)
	require.ErrorIs(t, err, vfio.ErrRange, "Map outside areas")
	_, err = d.Map(vfio.RegionBAR0, 0x1000, 0x2000)
	require.ErrorIs(t, err, vfio.ErrRange, "Map across areas")
	b, err := d.Map(vfio.RegionBAR0, 0x3000, 0x1000)
	require.NoError(t, err)
	require.NoError(t, d.Unmap(b))
	// A sparse area outside the region is corrupt.
	e2 := newEnv(t)
	bad := slices.Clone(sparse)
	copy(bad[16:], uapi.Encode(&uapi.RegionSparseMmapArea{Offset: 0x3000, Size: 0x2000}))
	e2.rdma.Regions[0].Caps = [][]byte{bad}
	_, err = vfio.Open(rdmaAddr, e2.opts)
	require.ErrorIs(t, err, uapi.ErrBadCaps, "area outside region")
}

func TestMapRegion(t *testing.T) { forPaths(t, testMapRegion) }

func testMapRegion(t *testing.T, p vfio.Path) {
	e := newEnvOn(t, p)
	d := e.open(t)
	bar1, err := d.Map(vfio.RegionBAR1, 0, 0)
	require.NoError(t, err)
	require.Len(t, bar1, 256)
	require.Equal(t, 256, cap(bar1), "BAR1 mapping cap")
	regs, err := mmio.New(bar1)
	require.NoError(t, err)
	v, err := regs.Load32(0)
	require.NoError(t, err)
	require.Equal(t, uint32(17), v, "VERSION")
	v, _ = regs.Load32(0x14)
	require.Equal(t, uint32(0xffff), v, "ERR")
	require.NoError(t, regs.Store32(0x1c, 0))
	// The store reached the device fd (shared mapping).
	var b4 [4]byte
	require.NoError(t, d.ReadRegion(vfio.RegionBAR1, 0x20, b4[:]))
	require.NoError(t, regs.Store32(0x20, 0xabcd))
	require.NoError(t, d.ReadRegion(vfio.RegionBAR1, 0x20, b4[:]))
	require.Equal(t, [4]byte{0xcd, 0xab, 0, 0}, b4, "ReadRegion after Store32")
	uar, err := d.Map(vfio.RegionBAR2, 4096, 4096)
	require.NoError(t, err)
	require.Equal(t, 2, d.Mappings())
	for name, f := range map[string]func() error{
		"misaligned":  func() error { _, err := d.Map(vfio.RegionBAR2, 100, 4096); return err },
		"too long":    func() error { _, err := d.Map(vfio.RegionBAR2, 8<<20-4096, 8192); return err },
		"past end":    func() error { _, err := d.Map(vfio.RegionBAR2, 9<<20, 0); return err },
		"no region":   func() error { _, err := d.Map(vfio.RegionBAR4, 0, 0); return err },
		"not mmap":    func() error { _, err := d.Map(vfio.RegionConfig, 0, 0); return err },
		"unmap other": func() error { return d.Unmap(make([]byte, 4096)) },
		"read past":   func() error { return d.ReadRegion(vfio.RegionBAR1, 254, b4[:]) },
		"read none":   func() error { return d.ReadRegion(vfio.RegionBAR5, 0, b4[:]) },
	} {
		want := vfio.ErrRange
		switch name {
		case "misaligned":
			want = vfio.ErrAlignment
		case "not mmap":
			want = vfio.ErrNotSupported
		}
		assert.ErrorIs(t, f(), want, name)
	}
	require.NoError(t, d.Unmap(uar))
	require.ErrorIs(t, d.Unmap(uar), vfio.ErrRange, "double Unmap")
	// BAR1 is left mapped: Close unmaps it (TestMain checks nothing is
	// left in /proc/self/maps).
	require.NoError(t, d.Close())
	require.Zero(t, vfiotest.RegionMaps(), "device mappings after Close")
}

func TestConfigAndBusMaster(t *testing.T) { forPaths(t, testConfigAndBusMaster) }

func testConfigAndBusMaster(t *testing.T, p vfio.Path) {
	e := newEnvOn(t, p)
	d := e.open(t)
	vid, err := d.ReadConfig16(0)
	require.NoError(t, err)
	require.Equal(t, uint16(0x15ad), vid, "vendor")
	id, _ := d.ReadConfig32(0)
	require.Equal(t, uint32(0x082015ad), id)
	cmd, err := d.EnableBusMaster()
	require.NoError(t, err)
	require.Equal(t, uint16(0x0107), cmd, "EnableBusMaster")
	c, _ := d.ReadConfig16(vfio.ConfigCommand)
	require.Equal(t, uint16(0x0107), c, "command after")
	// Idempotent.
	cmd, err = d.EnableBusMaster()
	require.NoError(t, err)
	require.Equal(t, uint16(0x0107), cmd, "EnableBusMaster again")
	require.NoError(t, d.WriteConfig8(0x3c, 0x0b))
	v8, _ := d.ReadConfig8(0x3c)
	require.Equal(t, uint8(0x0b), v8, "interrupt line")
	require.NoError(t, d.WriteConfig32(0x40, 0xdeadbeef))
	v32, _ := d.ReadConfig32(0x40)
	require.Equal(t, uint32(0xdeadbeef), v32, "config 0x40")
	_, err = d.ReadConfig32(0xfe)
	require.ErrorIs(t, err, vfio.ErrRange, "ReadConfig32 past end")
}

func TestReset(t *testing.T) { forPaths(t, testReset) }

func testReset(t *testing.T, p vfio.Path) {
	e := newEnvOn(t, p)
	d := e.open(t)
	require.ErrorIs(t, d.Reset(), vfio.ErrNotSupported, "Reset without support")
	_ = d.Close()
	e.rdma.Resettable = true
	d = e.open(t)
	require.NoError(t, d.Reset())
	require.Equal(t, 1, e.rdma.Resets())
	e.k.Fail(vfiotest.IoctlReset, unix.EIO)
	require.ErrorIs(t, d.Reset(), unix.EIO, "a reset the kernel refuses")
	require.Equal(t, 1, e.rdma.Resets())
}
