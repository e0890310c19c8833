package vfiotest_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma/pci"
	"github.com/vfrdma/vfrdma/pci/pcitest"
	"github.com/vfrdma/vfrdma/vfio"
	"github.com/vfrdma/vfrdma/vfio/internal/uapi"
	"github.com/vfrdma/vfrdma/vfio/vfiotest"
)

var addr = pci.Addr{Slot: 0x10, Func: 1}

// open opens the pvrdma function of the bench's slot through package vfio
// on a fake kernel and sysfs, as a test of code above vfio does.
func open(t *testing.T) (*vfiotest.Kernel, *vfiotest.Device, *vfio.Device) {
	return openOn(t, vfio.PathGroup)
}

// openOn is open on path p; for the cdev path the fake offers iommufd and
// names the functions' cdevs in sysfs.
func openOn(t *testing.T, p vfio.Path) (*vfiotest.Kernel, *vfiotest.Device, *vfio.Device) {
	t.Helper()
	sys := pcitest.VMwareSlot(t)
	_, err := sys.Bus().BindGroup(addr, "vfio-pci")
	require.NoError(t, err)
	k := vfiotest.New(t)
	dev := vfiotest.PVRDMA(addr.String())
	k.AddGroup(5, true, vfiotest.PVRDMA("0000:00:10.0"), dev)
	if p == vfio.PathCDev {
		k.SetIOMMUFDLoaded(true)
		k.LinkCDevs(t, sys.Root)
	}
	d, err := vfio.Open(addr, &vfio.Options{Kernel: k, SysfsRoot: sys.Root, Path: p})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, d.Close()) })
	return k, dev, d
}

// The fake serves package vfio end to end, on either path: registers,
// interrupts, DMA.
func TestThroughVFIO(t *testing.T) {
	for _, p := range []vfio.Path{vfio.PathGroup, vfio.PathCDev} {
		t.Run(p.String(), func(t *testing.T) { testThroughVFIO(t, p) })
	}
}

func testThroughVFIO(t *testing.T, p vfio.Path) {
	k, dev, d := openOn(t, p)
	require.Equal(t, p, d.Path())
	var version [4]byte
	require.NoError(t, d.ReadRegion(vfio.RegionBAR1, 0, version[:]))
	assert.Equal(t, [4]byte{17, 0, 0, 0}, version, "VERSION")

	vecs, err := d.EnableMSIX(3)
	require.NoError(t, err)
	require.Len(t, dev.Eventfds(vfio.IRQMSIX), 3)
	require.NoError(t, dev.Raise(vfio.IRQMSIX, 1))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := vecs[1].Wait(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), n)
	assert.Error(t, dev.Raise(vfio.IRQMSIX, 3), "a vector that does not exist")
	assert.Error(t, dev.Raise(vfio.IRQINTx, 0), "an index that is not enabled")

	b, err := d.Container().AllocDMA(4096, nil)
	require.NoError(t, err)
	m := k.DMAMappings()
	require.Contains(t, m, b.IOVA)
	assert.Equal(t, uint64(4096), m[b.IOVA].Size)
	require.NoError(t, b.Close())
	assert.Empty(t, k.DMAMappings())
	want := []string{"unmap 0x100000"}
	if p == vfio.PathCDev {
		want = []string{"bind 0000:00:10.1", "attach 0000:00:10.1 to IOAS 1", "unmap 0x100000"}
	}
	assert.Equal(t, want, k.Events())
}

// A device cdev answers nothing but VFIO_DEVICE_BIND_IOMMUFD until it is
// bound, as the kernel blocks the fd.
func TestCDevRefusesEveryRequestUntilBound(t *testing.T) {
	k := vfiotest.New(t)
	dev := vfiotest.PVRDMA(addr.String())
	k.AddGroup(5, true, dev)
	k.SetIOMMUFDLoaded(true)
	u := k.VFIO()
	fd, err := u.Open(filepath.Join(vfiotest.DevDir, "devices", dev.CDev()))
	require.NoError(t, err)
	defer u.Close(fd)
	_, _, err = uapi.DeviceGetInfo(u, fd)
	require.ErrorIs(t, err, unix.EINVAL, "GET_INFO before the bind")
	x, err := u.Open(vfiotest.IOMMUDev)
	require.NoError(t, err)
	defer u.Close(x)
	_, err = uapi.BindIOMMUFD(u, fd, x)
	require.NoError(t, err)
	_, _, err = uapi.DeviceGetInfo(u, fd)
	require.NoError(t, err, "GET_INFO after the bind")
	_, err = uapi.BindIOMMUFD(u, fd, x)
	require.ErrorIs(t, err, unix.EINVAL, "a second bind of the fd")
}

// Without SetIOMMUFDLoaded there is no /dev/iommu, as on the bench's guest
// kernel.
func TestNoIOMMUFDUnlessLoaded(t *testing.T) {
	k := vfiotest.New(t)
	_, err := vfio.OpenIOMMUFD(&vfio.Options{Kernel: k})
	require.ErrorIs(t, err, vfio.ErrNoIOMMUFD)
	k.SetIOMMUFDLoaded(true)
	c, err := vfio.OpenIOMMUFD(&vfio.Options{Kernel: k})
	require.NoError(t, err)
	require.NoError(t, c.Close())
}

// An injected failure is the kernel's answer until it is cleared.
func TestFail(t *testing.T) {
	k, _, d := open(t)
	k.Fail(vfiotest.IoctlMapDMA, unix.ENOSPC)
	_, err := d.Container().AllocDMA(4096, nil)
	require.ErrorIs(t, err, unix.ENOSPC)
	k.Fail(vfiotest.IoctlMapDMA, nil)
	_, err = d.Container().AllocDMA(4096, nil)
	require.NoError(t, err)
}

// A device outside any group has no interrupts to raise.
func TestRaiseOutsideAGroup(t *testing.T) {
	dev := vfiotest.PVRDMA("0000:00:10.1")
	assert.Error(t, dev.Raise(vfio.IRQMSIX, 0))
	assert.Nil(t, dev.Eventfds(vfio.IRQMSIX))
	assert.Zero(t, dev.Resets())
}

// The nodes exist under DevDir only.
func TestDevDir(t *testing.T) {
	k := vfiotest.New(t)
	_, err := vfio.OpenContainer(&vfio.Options{Kernel: k, DevDir: t.TempDir()})
	require.ErrorIs(t, err, vfio.ErrNoVFIO)
	c, err := vfio.OpenContainer(&vfio.Options{Kernel: k, DevDir: vfiotest.DevDir})
	require.NoError(t, err)
	require.NoError(t, c.Close())
}
