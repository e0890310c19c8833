package vfio_test

import (
	"io/fs"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma/pci"
	"github.com/vfrdma/vfrdma/vfio"
	"github.com/vfrdma/vfrdma/vfio/vfiotest"
)

func TestAutoTakesTheCDevOnlyWhereTheKernelOffersBothNodes(t *testing.T) {
	for _, tc := range []struct {
		name          string
		iommufd, cdev bool
		want          vfio.Path
	}{
		{"neither", false, false, vfio.PathGroup},
		{"iommufd without a vfio-dev node", true, false, vfio.PathGroup},
		{"vfio-dev node without iommufd", false, true, vfio.PathGroup},
		{"both", true, true, vfio.PathCDev},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.k.SetIOMMUFDLoaded(tc.iommufd)
			if tc.cdev {
				e.k.LinkCDevs(t, e.sys.Root)
			}
			d := e.open(t)
			require.Equal(t, tc.want, d.Path())
			require.NoError(t, d.Close())
		})
	}
}

func TestPathsParseAndPrint(t *testing.T) {
	for s, want := range map[string]vfio.Path{"": vfio.PathAuto, "auto": vfio.PathAuto, "cdev": vfio.PathCDev, "group": vfio.PathGroup} {
		p, err := vfio.ParsePath(s)
		require.NoError(t, err, s)
		assert.Equal(t, want, p, s)
	}
	assert.Equal(t, "auto", vfio.PathAuto.String())
	_, err := vfio.ParsePath("iommufd")
	require.ErrorIs(t, err, vfio.ErrNotSupported)
	require.ErrorContains(t, err, "auto, cdev or group")
	e := newEnvOn(t, "container")
	_, err = vfio.Open(rdmaAddr, e.opts)
	require.ErrorIs(t, err, vfio.ErrNotSupported, "Open with a path that is none of the three")
}

func TestForcedCDevWithoutIOMMUFDNamesTheModuleAndTheGroupPath(t *testing.T) {
	e := newEnvOn(t, vfio.PathCDev)
	e.k.SetIOMMUFDLoaded(false)
	_, err := vfio.Open(rdmaAddr, e.opts)
	require.ErrorIs(t, err, vfio.ErrNoIOMMUFD)
	require.ErrorIs(t, err, fs.ErrNotExist)
	for _, want := range []string{"/dev/iommu", "CONFIG_IOMMUFD", "modprobe iommufd", "--vfio group"} {
		assert.ErrorContains(t, err, want)
	}
	require.Empty(t, e.k.Events(), "nothing was opened")
}

func TestForcedCDevWithoutAVFIODevNodeNamesTheKernelOptionAndTheGroupPath(t *testing.T) {
	e := newEnv(t) // no vfio-dev node in sysfs
	e.k.SetIOMMUFDLoaded(true)
	e.opts.Path = vfio.PathCDev
	_, err := vfio.Open(rdmaAddr, e.opts)
	require.ErrorIs(t, err, vfio.ErrNoCDev)
	for _, want := range []string{"0000:00:10.1 has no vfio-dev node", "CONFIG_VFIO_DEVICE_CDEV", "bound to vfio-pci", "--vfio group"} {
		assert.ErrorContains(t, err, want)
	}
	require.Empty(t, e.k.Events(), "nothing was opened")
}

func TestCDevOfADeviceBoundToAnotherIOMMUFDIsBusy(t *testing.T) {
	e := newEnvOn(t, vfio.PathCDev)
	first := e.open(t)
	_, err := vfio.Open(rdmaAddr, e.opts)
	require.ErrorIs(t, err, vfio.ErrBusy)
	require.ErrorIs(t, err, unix.EINVAL, "what the kernel answers a second bind of an open device")
	require.ErrorContains(t, err, "already bound to an iommufd")
	require.ErrorContains(t, err, "close that first")
	// The failed Open undid its work and left the first one alone.
	ev := e.k.Events()
	require.Equal(t, "close iommufd", ev[len(ev)-1], "the second Open's teardown: %q", ev)
	require.NotContains(t, ev, "close device "+rdmaName)
	_, err = first.ReadConfig16(0)
	require.NoError(t, err, "the first Open still works")
}

func TestCDevWhileTheGroupIsHeldThroughItsNodeIsBusy(t *testing.T) {
	t.Run("by another process", func(t *testing.T) {
		e := newEnvOn(t, vfio.PathCDev)
		e.group.SetBusy(true)
		_, err := vfio.Open(rdmaAddr, e.opts)
		require.ErrorIs(t, err, vfio.ErrBusy)
		require.ErrorIs(t, err, unix.EBUSY)
		require.ErrorContains(t, err, "IOMMU group 5 is held through the group interface (/dev/vfio/5)")
		e.group.SetBusy(false)
	})
	t.Run("by a group-path Open in this process", func(t *testing.T) {
		e := newEnvOn(t, vfio.PathGroup)
		e.open(t)
		e.opts.Path = vfio.PathCDev
		_, err := vfio.Open(rdmaAddr, e.opts)
		require.ErrorIs(t, err, vfio.ErrBusy)
		require.ErrorIs(t, err, unix.EBUSY)
	})
	t.Run("the group node while a cdev of the group is bound", func(t *testing.T) {
		e := newEnvOn(t, vfio.PathCDev)
		e.open(t)
		e.opts.Path = vfio.PathGroup
		_, err := vfio.Open(rdmaAddr, e.opts)
		require.ErrorIs(t, err, vfio.ErrBusy)
		require.ErrorIs(t, err, unix.EBUSY)
	})
}

func TestCDevBindRefusedNamesTheGroupMemberInTheWayOrInterruptRemapping(t *testing.T) {
	t.Run("a member on a host driver", func(t *testing.T) {
		e := newEnvOn(t, vfio.PathCDev)
		e.group.SetViable(false)
		require.NoError(t, e.sys.Bus().RestoreGroup(map[pci.Addr]string{nicAddr: "vmxnet3"}))
		_, err := vfio.Open(rdmaAddr, e.opts)
		require.ErrorIs(t, err, vfio.ErrGroupNotViable)
		require.ErrorIs(t, err, unix.EPERM)
		require.ErrorContains(t, err, "0000:00:10.0 (15ad:07b0) is bound to vmxnet3")
	})
	t.Run("no interrupt remapping", func(t *testing.T) {
		e := newEnvOn(t, vfio.PathCDev)
		e.k.Fail(vfiotest.IoctlBindIOMMUFD, unix.EPERM)
		_, err := vfio.Open(rdmaAddr, e.opts)
		require.ErrorIs(t, err, unix.EPERM)
		require.NotErrorIs(t, err, vfio.ErrGroupNotViable)
		require.ErrorContains(t, err, "intremap=on")
		require.ErrorContains(t, err, "allow_unsafe_interrupts")
	})
}

func TestCDevIOVAOutsideTheReportedRangesIsRefusedBeforeTheIoctlNamingTheWindow(t *testing.T) {
	e := newEnvOn(t, vfio.PathCDev)
	d := e.open(t)
	c := d.Container()
	m, err := vfio.AllocMemory(4096, &vfio.MemOptions{HugePages: vfio.HugeNever})
	require.NoError(t, err)
	defer m.Close()
	// The fake reports [0, 0xfedfffff] and [0xfef00000, 0x7fffffffff].
	for _, tc := range []struct {
		iova uint64
		ok   bool
	}{
		{0xfedff000, true},     // the last page below the MSI window
		{0xfee00000, false},    // the first page of it
		{0xfef00000, true},     // the first page above it
		{0x7ffffff000, true},   // the last page of the window
		{0x8000000000, false},  // one page past it
		{0x10000000000, false}, // far past it
	} {
		err := c.MapDMA(m.Bytes(), tc.iova)
		if tc.ok {
			require.NoError(t, err, "IOVA %#x", tc.iova)
			require.NoError(t, c.UnmapDMA(tc.iova, 4096))
			continue
		}
		require.ErrorIs(t, err, vfio.ErrRange, "IOVA %#x", tc.iova)
		require.NotErrorIs(t, err, unix.EINVAL, "IOVA %#x reached the kernel", tc.iova)
		require.ErrorContains(t, err, "[0x0-0xfedfffff 0xfef00000-0x7fffffffff]", "IOVA %#x", tc.iova)
		require.ErrorContains(t, err, "AllocIOVA", "IOVA %#x", tc.iova)
	}
	require.Empty(t, e.k.DMAMappings())
}

func TestCDevMemlockTooLowSaysHowMuchToAllow(t *testing.T) {
	e := newEnvOn(t, vfio.PathCDev)
	d := e.open(t)
	e.k.Fail(vfiotest.IoctlMapDMA, unix.ENOMEM) // iommufd's RLIMIT_MEMLOCK accounting
	_, err := d.Container().AllocDMA(4096, nil)
	require.ErrorIs(t, err, vfio.ErrMemlock)
	require.ErrorIs(t, err, unix.ENOMEM)
	for _, want := range []string{"iommufd could not pin 4096 bytes", "RLIMIT_MEMLOCK", "ulimit -l", "CAP_IPC_LOCK"} {
		assert.ErrorContains(t, err, want)
	}
	e.k.Fail(vfiotest.IoctlMapDMA, nil)
	b, err := d.Container().AllocDMA(4096, nil)
	require.NoError(t, err)
	require.Equal(t, uint64(iovaBase), b.IOVA, "the failed allocation gave its IOVA back")
}

// On the cdev path the slot's vmxnet3 function (function 0, the same IOMMU
// group) is a second device, opened, bound and attached alone through its
// own cdev, into the same iommufd and IOAS.
func TestCDevSecondDeviceOfTheGroupJoinsTheSameIOAS(t *testing.T) {
	e := newEnvOn(t, vfio.PathCDev)
	d := e.open(t)
	b, err := d.Container().AllocDMA(4096, nil)
	require.NoError(t, err)
	nic, err := d.Group().OpenDevice(nicAddr.String())
	require.NoError(t, err)
	require.Same(t, d.Container(), nic.Container(), "one IOMMU context for both functions")
	require.Equal(t, vfio.PathCDev, nic.Path())
	require.Equal(t, "vfio0", nic.CDev())
	_, err = d.Group().OpenDevice(nicAddr.String())
	require.ErrorIs(t, err, vfio.ErrBusy, "the same function twice")
	_, _, err = d.Group().Status()
	require.ErrorIs(t, err, vfio.ErrNotSupported, "Status of a group without a node")
	require.Contains(t, e.k.DMAMappings(), b.IOVA, "the mapping made before the second attach")
	require.NoError(t, d.Close())
	ev := e.k.Events()
	iNIC := slices.Index(ev, "close device 0000:00:10.0")
	iRDMA := slices.Index(ev, "close device "+rdmaName)
	iDestroy := slices.Index(ev, "destroy IOAS 1")
	require.True(t, iNIC >= 0 && iRDMA >= 0 && iDestroy > iNIC && iDestroy > iRDMA, "teardown order %q", ev)
	require.Contains(t, ev, "attach 0000:00:10.0 to IOAS 1")
	for _, s := range ev {
		assert.False(t, strings.HasPrefix(s, "BAD"), s)
	}
}

func TestCDevAttachNarrowsTheIOVAWindowToTheIOASRanges(t *testing.T) {
	e := newEnvOn(t, vfio.PathCDev)
	d := e.open(t)
	iova, err := d.Container().AllocIOVA(4096, 0)
	require.NoError(t, err)
	require.Equal(t, uint64(iovaBase), iova)
	// The second device reserves the low 256 MiB (as the kernel narrows an
	// IOAS's ranges with each device's reserved regions).
	iommu := vfiotest.QEMUGuestIOMMU()
	iommu.Ranges = []vfio.IOVARange{{Start: 0x10000000, End: 0xfedfffff}, {Start: 0xfef00000, End: 0x7fffffffff}}
	e.k.SetIOMMU(iommu)
	_, err = d.Group().OpenDevice(nicAddr.String())
	require.NoError(t, err)
	ii, err := d.Container().IOMMUInfo()
	require.NoError(t, err)
	require.Equal(t, iommu.Ranges, ii.Ranges, "the ranges read again after the attach")
	next, err := d.Container().AllocIOVA(4096, 0)
	require.NoError(t, err)
	require.Equal(t, uint64(0x10000000), next, "the first IOVA of the narrowed window")
	// What was handed out before goes back only where it is still valid.
	require.NoError(t, d.Container().FreeIOVA(iova, 4096))
	again, err := d.Container().AllocIOVA(4096, 0)
	require.NoError(t, err)
	require.Equal(t, uint64(0x10001000), again)
}

func TestCDevReadsMoreIOVARangesThanItFirstMadeRoomFor(t *testing.T) {
	e := newEnvOn(t, vfio.PathCDev)
	iommu := vfiotest.QEMUGuestIOMMU()
	iommu.Ranges = nil
	for i := range uint64(12) {
		iommu.Ranges = append(iommu.Ranges, vfio.IOVARange{Start: i << 32, End: i<<32 + 0x7fffffff})
	}
	e.k.SetIOMMU(iommu)
	d := e.open(t)
	ii, err := d.Container().IOMMUInfo()
	require.NoError(t, err)
	require.Equal(t, iommu.Ranges, ii.Ranges)
}

func TestCDevIOASKeepsItsMappingsWhenItsLastDeviceCloses(t *testing.T) {
	e := newEnvOn(t, vfio.PathCDev)
	c, err := vfio.OpenIOMMUFD(e.opts)
	require.NoError(t, err)
	defer c.Close()
	_, err = c.AllocIOVA(4096, 0)
	require.ErrorIs(t, err, vfio.ErrNotSupported, "AllocIOVA before a device is attached")
	g, err := c.OpenGroup(5)
	require.NoError(t, err)
	d, err := g.OpenDevice(rdmaName)
	require.NoError(t, err)
	b, err := c.AllocDMA(4096, nil)
	require.NoError(t, err)
	require.NoError(t, d.Close())
	require.NoError(t, g.Close())
	require.Len(t, c.Mappings(), 1, "an IOAS outlives its devices")
	require.Contains(t, e.k.DMAMappings(), b.IOVA)
	require.NoError(t, c.Close())
	require.Empty(t, e.k.DMAMappings())
	require.Equal(t, []string{"unmap 0x100000", "destroy IOAS 1", "close iommufd"}, e.k.Events()[len(e.k.Events())-3:])
	_, err = c.OpenGroup(5)
	require.ErrorIs(t, err, vfio.ErrClosed)
}

// On the cdev path a group's OpenDevice opens only functions of that
// IOMMU group (sysfs says which): a function of another group, though
// bound to vfio-pci and with a cdev of its own, is refused with ErrRange
// before its cdev is opened. (On the group path the kernel refuses it:
// VFIO_GROUP_GET_DEVICE_FD knows only the group's members.)
func TestCDevOpenDeviceRefusesAFunctionOfAnotherIOMMUGroup(t *testing.T) {
	e := newEnvOn(t, vfio.PathCDev)
	other := pci.Addr{Slot: 0x11}
	e.sys.AddFunction(t, pci.Function{Addr: other, Vendor: 0x15ad, Device: 0x07b0, Driver: "vfio-pci", IOMMUGroup: 7})
	e.k.AddGroup(7, true, vfiotest.PVRDMA(other.String()))
	e.k.LinkCDevs(t, e.sys.Root)
	d := e.open(t)
	before := len(e.k.Events())
	_, err := d.Group().OpenDevice(other.String())
	require.ErrorIs(t, err, vfio.ErrRange)
	assert.Contains(t, err.Error(), "IOMMU group 7, not 5")
	for _, ev := range e.k.Events()[before:] {
		assert.NotContains(t, ev, other.String(), "the other group's function reached the kernel")
	}
}

// The IOVA alignment IOMMU_IOAS_IOVA_RANGES reports is a kernel answer,
// checked before use: a power of two up to 1 GiB is taken (1 GiB itself
// too), and 0, one that is not a power of two, or 2 GiB fail the open,
// naming the value.
func TestCDevTakesAPowerOfTwoIOVAAlignmentUpTo1GiBAndRefusesAnyOther(t *testing.T) {
	for _, tc := range []struct {
		align uint64
		ok    bool
	}{
		{4096, true}, {1 << 30, true},
		{0, false}, {0x3000, false}, {1<<30 + 4096, false}, {1 << 31, false},
	} {
		e := newEnvOn(t, vfio.PathCDev)
		e.k.SetIOASAlignment(tc.align)
		d, err := vfio.Open(rdmaAddr, e.opts)
		if tc.ok {
			require.NoError(t, err, "alignment %#x", tc.align)
			require.NoError(t, d.Close())
			continue
		}
		require.Error(t, err, "alignment %#x", tc.align)
		assert.Contains(t, err.Error(), "implausible IOVA alignment", "alignment %#x", tc.align)
	}
}
