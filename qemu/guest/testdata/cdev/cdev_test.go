//go:build guest

// Package cdev runs inside the cdev guest (pvvm -kernel cdev) and proves
// what that kernel offers the driver's cdev path: /dev/iommu, the pvrdma
// function's VFIO device cdev once the init has bound it to vfio-pci, and
// the iommufd sequence on it (bind, IOAS, attach, IOVA ranges, map,
// unmap). The ioctls are issued here with raw numbers from the kernel's
// uapi headers (include/uapi/linux/vfio.h, iommufd.h of 6.12): this is the
// bench's proof of the kernel, not the driver, whose ioctls live in uapi.
//
//	go run ./cmd/pvvm -kernel cdev -test qemu/guest/testdata/cdev
package cdev

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma/qemu/proto"
)

// _IO(';', nr): VFIO and iommufd number their ioctls without a size.
const (
	vfioDeviceGetInfo     = 0x3b00 + 100 + 7
	vfioDeviceBindIommufd = 0x3b00 + 100 + 18
	vfioDeviceAttachPT    = 0x3b00 + 100 + 19
	vfioDeviceDetachPT    = 0x3b00 + 100 + 20
	iommuDestroy          = 0x3b80
	iommuIOASAlloc        = 0x3b81
	iommuIOASIOVARanges   = 0x3b84
	iommuIOASMap          = 0x3b85
	iommuIOASUnmap        = 0x3b86
	iommuIOASMapFixedIOVA = 1 << 0
	iommuIOASMapWriteable = 1 << 1
	iommuIOASMapReadable  = 1 << 2
	vfioDeviceFlagsPCI    = 1 << 1
	pvrdmaRegions         = 9 // vfio-pci's region count: 6 BARs, ROM, config, VGA
)

type bindIommufd struct{ argsz, _, iommufd, outDevID uint32 }
type attachPT struct{ argsz, _, ptID uint32 }
type detachPT struct{ argsz, _ uint32 }
type ioasAlloc struct{ size, _, outIOASID uint32 }
type iovaRanges struct {
	size, ioasID, numIOVAs, _      uint32
	allowedIOVAs, outIOVAAlignment uint64
}
type iovaRange struct{ start, last uint64 }
type ioasMap struct {
	size, flags, ioasID, _ uint32
	userVA, length, iova   uint64
}
type ioasUnmap struct {
	size, ioasID uint32
	iova, length uint64
}
type destroy struct{ size, id uint32 }
type deviceInfo struct{ argsz, flags, numRegions, numIRQs, _, _ uint32 }

func ioctl[T any](fd int, req uintptr, arg *T) error {
	_, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), req, uintptr(unsafe.Pointer(arg)))
	if e != 0 {
		return e
	}
	return nil
}

// cdevOf returns the name (vfioN) of the device cdev of the function at bdf.
func cdevOf(t *testing.T, bdf string) string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join("/sys/bus/pci/devices", bdf, "vfio-dev"))
	require.NoError(t, err, "%s has no vfio-dev directory: not bound to vfio-pci, or VFIO without CONFIG_VFIO_DEVICE_CDEV", bdf)
	require.Len(t, ents, 1, "vfio-dev of %s", bdf)
	require.True(t, strings.HasPrefix(ents[0].Name(), "vfio"), "vfio-dev of %s holds %s", bdf, ents[0].Name())
	return ents[0].Name()
}

func pvrdmaBDF(t *testing.T) string {
	bdf := os.Getenv(proto.EnvBDF)
	require.NotEmpty(t, bdf, "%s is not set: the init found no pvrdma function", proto.EnvBDF)
	return bdf
}

func TestTheCdevKernelOffersDevIommu(t *testing.T) {
	st, err := os.Stat("/dev/iommu")
	require.NoError(t, err, "no /dev/iommu: iommufd.ko not loaded")
	assert.Equal(t, os.ModeDevice|os.ModeCharDevice, st.Mode().Type())
	mods, err := os.ReadFile("/proc/modules")
	require.NoError(t, err)
	for _, m := range []string{"iommufd", "vfio", "vfio_iommu_type1", "vfio_pci_core", "vfio_pci"} {
		assert.Contains(t, "\n"+string(mods), "\n"+m+" ", "module %s not loaded", m)
	}
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	require.NoError(t, err)
	t.Logf("kernel %s", strings.TrimSpace(string(b)))
}

// The init binds the pvrdma function's whole IOMMU group (it and the
// vmxnet3 function) to vfio-pci; each function then has its own cdev.
func TestEveryFunctionBoundToVfioPCIHasADeviceCdev(t *testing.T) {
	bdf := pvrdmaBDF(t)
	fns, err := filepath.Glob(filepath.Join("/sys/bus/pci/devices", bdf, "iommu_group/devices/*"))
	require.NoError(t, err)
	require.NotEmpty(t, fns, "%s has no IOMMU group", bdf)
	for _, f := range fns {
		fn := filepath.Base(f)
		name := cdevOf(t, fn)
		st, err := os.Stat(filepath.Join("/dev/vfio/devices", name))
		require.NoError(t, err, "the cdev of %s", fn)
		assert.Equal(t, os.ModeDevice|os.ModeCharDevice, st.Mode().Type())
		t.Logf("%s: /dev/vfio/devices/%s", fn, name)
	}
	// The group path stays: the group's node is there too.
	group, err := os.Readlink(filepath.Join("/sys/bus/pci/devices", bdf, "iommu_group"))
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join("/dev/vfio", filepath.Base(group)))
	assert.NoError(t, err, "the group node beside the cdev")
}

// The iommufd sequence on the pvrdma function's cdev, each step checked.
func TestThePVRDMACdevBindsToIommufdAndMapsDMA(t *testing.T) {
	bdf := pvrdmaBDF(t)
	name := cdevOf(t, bdf)
	dev, err := syscall.Open(filepath.Join("/dev/vfio/devices", name), syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	require.NoError(t, err, "open the cdev")
	defer syscall.Close(dev)
	iommu, err := syscall.Open("/dev/iommu", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	require.NoError(t, err, "open /dev/iommu")
	defer syscall.Close(iommu)

	// Before the bind the device fd refuses device ioctls.
	info := deviceInfo{argsz: uint32(unsafe.Sizeof(deviceInfo{}))}
	err = ioctl(dev, vfioDeviceGetInfo, &info)
	t.Logf("VFIO_DEVICE_GET_INFO before the bind: %v", err)
	assert.Error(t, err, "a device ioctl before VFIO_DEVICE_BIND_IOMMUFD")

	bind := bindIommufd{argsz: uint32(unsafe.Sizeof(bindIommufd{})), iommufd: uint32(iommu)}
	require.NoError(t, ioctl(dev, vfioDeviceBindIommufd, &bind), "VFIO_DEVICE_BIND_IOMMUFD")
	t.Logf("VFIO_DEVICE_BIND_IOMMUFD: devid %d", bind.outDevID)

	// A second open of the same cdev cannot bind too.
	dev2, err := syscall.Open(filepath.Join("/dev/vfio/devices", name), syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err == nil {
		iommu2, err := syscall.Open("/dev/iommu", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
		require.NoError(t, err)
		b2 := bindIommufd{argsz: uint32(unsafe.Sizeof(bindIommufd{})), iommufd: uint32(iommu2)}
		err = ioctl(dev2, vfioDeviceBindIommufd, &b2)
		t.Logf("a second VFIO_DEVICE_BIND_IOMMUFD (another fd, another iommufd): %v (errno %d)", err, errnoOf(err))
		assert.Error(t, err, "a second bind of a bound device")
		syscall.Close(iommu2)
		syscall.Close(dev2)
	} else {
		t.Logf("a second open of the bound cdev: %v (errno %d)", err, errnoOf(err))
	}

	// While the device is bound through its cdev, its group cannot be
	// used: the group path and the cdev path exclude each other.
	group, err := os.Readlink(filepath.Join("/sys/bus/pci/devices", bdf, "iommu_group"))
	require.NoError(t, err)
	gfd, err := syscall.Open(filepath.Join("/dev/vfio", filepath.Base(group)), syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	t.Logf("open /dev/vfio/%s while the cdev is bound: %v (errno %d)", filepath.Base(group), err, errnoOf(err))
	if err == nil {
		syscall.Close(gfd)
	}
	assert.ErrorIs(t, err, syscall.EBUSY, "open the group of a device bound through its cdev")

	alloc := ioasAlloc{size: uint32(unsafe.Sizeof(ioasAlloc{}))}
	require.NoError(t, ioctl(iommu, iommuIOASAlloc, &alloc), "IOMMU_IOAS_ALLOC")
	attach := attachPT{argsz: uint32(unsafe.Sizeof(attachPT{})), ptID: alloc.outIOASID}
	require.NoError(t, ioctl(dev, vfioDeviceAttachPT, &attach), "VFIO_DEVICE_ATTACH_IOMMUFD_PT")
	t.Logf("IOAS %d, attached as pt %d", alloc.outIOASID, attach.ptID)

	info = deviceInfo{argsz: uint32(unsafe.Sizeof(deviceInfo{}))}
	require.NoError(t, ioctl(dev, vfioDeviceGetInfo, &info), "VFIO_DEVICE_GET_INFO after the bind")
	assert.NotZero(t, info.flags&vfioDeviceFlagsPCI, "flags %#x", info.flags)
	assert.Equal(t, uint32(pvrdmaRegions), info.numRegions)
	t.Logf("device info: flags %#x, %d regions, %d IRQ kinds", info.flags, info.numRegions, info.numIRQs)

	ranges := make([]iovaRange, 8)
	rq := iovaRanges{size: uint32(unsafe.Sizeof(iovaRanges{})), ioasID: alloc.outIOASID, numIOVAs: uint32(len(ranges)),
		allowedIOVAs: uint64(uintptr(unsafe.Pointer(&ranges[0])))}
	require.NoError(t, ioctl(iommu, iommuIOASIOVARanges, &rq), "IOMMU_IOAS_IOVA_RANGES")
	require.NotZero(t, rq.numIOVAs)
	require.LessOrEqual(t, rq.numIOVAs, uint32(len(ranges)))
	for _, r := range ranges[:rq.numIOVAs] {
		t.Logf("usable IOVA [%#x, %#x]", r.start, r.last)
	}
	t.Logf("IOVA alignment %#x", rq.outIOVAAlignment)

	const size = 1 << 16
	buf, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	require.NoError(t, err)
	defer syscall.Munmap(buf)
	iova := max(ranges[0].start, 1<<20)
	m := ioasMap{size: uint32(unsafe.Sizeof(ioasMap{})), flags: iommuIOASMapFixedIOVA | iommuIOASMapReadable | iommuIOASMapWriteable,
		ioasID: alloc.outIOASID, userVA: uint64(uintptr(unsafe.Pointer(&buf[0]))), length: size, iova: iova}
	require.NoError(t, ioctl(iommu, iommuIOASMap, &m), "IOMMU_IOAS_MAP at %#x", iova)

	// Past the last usable IOVA the map is refused.
	last := ranges[rq.numIOVAs-1].last
	if last < 1<<63 {
		out := m
		out.iova = (last + 1) &^ (size - 1)
		err := ioctl(iommu, iommuIOASMap, &out)
		t.Logf("IOMMU_IOAS_MAP past the last usable IOVA (%#x): %v (errno %d)", out.iova, err, errnoOf(err))
		assert.Error(t, err)
	}
	// Without FIXED_IOVA the kernel picks the IOVA.
	auto := m
	auto.flags &^= iommuIOASMapFixedIOVA
	auto.iova = 0
	require.NoError(t, ioctl(iommu, iommuIOASMap, &auto), "IOMMU_IOAS_MAP, kernel-chosen IOVA")
	t.Logf("kernel-chosen IOVA %#x", auto.iova)

	for _, iova := range []uint64{m.iova, auto.iova} {
		u := ioasUnmap{size: uint32(unsafe.Sizeof(ioasUnmap{})), ioasID: alloc.outIOASID, iova: iova, length: size}
		require.NoError(t, ioctl(iommu, iommuIOASUnmap, &u), "IOMMU_IOAS_UNMAP at %#x", iova)
		assert.Equal(t, uint64(size), u.length, "bytes unmapped")
	}
	detach := detachPT{argsz: uint32(unsafe.Sizeof(detachPT{}))}
	require.NoError(t, ioctl(dev, vfioDeviceDetachPT, &detach), "VFIO_DEVICE_DETACH_IOMMUFD_PT")
	d := destroy{size: uint32(unsafe.Sizeof(destroy{})), id: alloc.outIOASID}
	require.NoError(t, ioctl(iommu, iommuDestroy, &d), "IOMMU_DESTROY of the IOAS")
}

func errnoOf(err error) int {
	var e syscall.Errno
	if errors.As(err, &e) {
		return int(e)
	}
	return 0
}

// The other way round: while the group is open, the cdev cannot bind.
func TestACdevDoesNotBindWhileItsGroupIsOpen(t *testing.T) {
	bdf := pvrdmaBDF(t)
	group, err := os.Readlink(filepath.Join("/sys/bus/pci/devices", bdf, "iommu_group"))
	require.NoError(t, err)
	gfd, err := syscall.Open(filepath.Join("/dev/vfio", filepath.Base(group)), syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	require.NoError(t, err, "open the group")
	defer syscall.Close(gfd)
	dev, err := syscall.Open(filepath.Join("/dev/vfio/devices", cdevOf(t, bdf)), syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	require.NoError(t, err, "open the cdev")
	defer syscall.Close(dev)
	iommu, err := syscall.Open("/dev/iommu", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer syscall.Close(iommu)
	bind := bindIommufd{argsz: uint32(unsafe.Sizeof(bindIommufd{})), iommufd: uint32(iommu)}
	err = ioctl(dev, vfioDeviceBindIommufd, &bind)
	t.Logf("VFIO_DEVICE_BIND_IOMMUFD while /dev/vfio/%s is open: %v (errno %d)", filepath.Base(group), err, errnoOf(err))
	assert.ErrorIs(t, err, syscall.EBUSY)
}

// iommufd charges pinned pages to RLIMIT_MEMLOCK unless the caller has
// CAP_IPC_LOCK (root has it, so the bench's root never hits the limit):
// without it, a map past the limit fails with ENOMEM.
func TestAMapPastRLIMITMEMLOCKWithoutCAPIPCLOCKFailsWithENOMEM(t *testing.T) {
	bdf := pvrdmaBDF(t)
	dev, err := syscall.Open(filepath.Join("/dev/vfio/devices", cdevOf(t, bdf)), syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer syscall.Close(dev)
	iommu, err := syscall.Open("/dev/iommu", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer syscall.Close(iommu)
	bind := bindIommufd{argsz: uint32(unsafe.Sizeof(bindIommufd{})), iommufd: uint32(iommu)}
	require.NoError(t, ioctl(dev, vfioDeviceBindIommufd, &bind))
	alloc := ioasAlloc{size: uint32(unsafe.Sizeof(ioasAlloc{}))}
	require.NoError(t, ioctl(iommu, iommuIOASAlloc, &alloc))
	attach := attachPT{argsz: uint32(unsafe.Sizeof(attachPT{})), ptID: alloc.outIOASID}
	require.NoError(t, ioctl(dev, vfioDeviceAttachPT, &attach))

	const size = 1 << 20
	buf, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	require.NoError(t, err)
	defer syscall.Munmap(buf)
	m := ioasMap{size: uint32(unsafe.Sizeof(ioasMap{})), flags: iommuIOASMapFixedIOVA | iommuIOASMapReadable | iommuIOASMapWriteable,
		ioasID: alloc.outIOASID, userVA: uint64(uintptr(unsafe.Pointer(&buf[0]))), length: size, iova: 1 << 24}

	var old syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(unix.RLIMIT_MEMLOCK, &old))
	defer syscall.Setrlimit(unix.RLIMIT_MEMLOCK, &old)
	require.NoError(t, syscall.Setrlimit(unix.RLIMIT_MEMLOCK, &syscall.Rlimit{Cur: 64 << 10, Max: old.Max}))
	// Capabilities are per thread: drop CAP_IPC_LOCK from this one's
	// effective set for the map, and raise it again after.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var caps [2]unix.CapUserData
	require.NoError(t, unix.Capget(&hdr, &caps[0]))
	saved := caps
	caps[0].Effective &^= 1 << unix.CAP_IPC_LOCK
	require.NoError(t, unix.Capset(&hdr, &caps[0]))
	err = ioctl(iommu, iommuIOASMap, &m)
	require.NoError(t, unix.Capset(&hdr, &saved[0]))
	t.Logf("IOMMU_IOAS_MAP of 1 MiB, RLIMIT_MEMLOCK 64 KiB, without CAP_IPC_LOCK: %v (errno %d)", err, errnoOf(err))
	assert.ErrorIs(t, err, syscall.ENOMEM)

	// With CAP_IPC_LOCK the same map succeeds.
	require.NoError(t, ioctl(iommu, iommuIOASMap, &m), "the same map with CAP_IPC_LOCK")
}

// On the cdev path only the function opened must be bound to vfio-pci:
// with the slot's other function (vmxnet3) bound to no driver, pvrdma's
// cdev binds and attaches. (A kernel driver doing DMA on the other
// function would still keep the group from being claimed.) The vmxnet3
// function is given back to vfio-pci after.
func TestOnTheCdevPathOnlyTheOpenedFunctionNeedsVfioPCI(t *testing.T) {
	bdf := pvrdmaBDF(t)
	fns, err := filepath.Glob(filepath.Join("/sys/bus/pci/devices", bdf, "iommu_group/devices/*"))
	require.NoError(t, err)
	var others []string
	for _, f := range fns {
		if fn := filepath.Base(f); fn != bdf {
			others = append(others, fn)
		}
	}
	require.NotEmpty(t, others, "the slot's other function is not in pvrdma's group")
	for _, fn := range others {
		require.NoError(t, os.WriteFile("/sys/bus/pci/drivers/vfio-pci/unbind", []byte(fn), 0), "unbind %s from vfio-pci", fn)
		defer func() {
			assert.NoError(t, os.WriteFile("/sys/bus/pci/drivers_probe", []byte(fn), 0), "give %s back to vfio-pci", fn)
			_, err := os.Stat(filepath.Join("/sys/bus/pci/devices", fn, "vfio-dev"))
			assert.NoError(t, err, "%s is bound to vfio-pci again", fn)
		}()
		_, err := os.Stat(filepath.Join("/sys/bus/pci/devices", fn, "driver"))
		require.True(t, os.IsNotExist(err), "%s still has a driver: %v", fn, err)
	}
	dev, err := syscall.Open(filepath.Join("/dev/vfio/devices", cdevOf(t, bdf)), syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer syscall.Close(dev)
	iommu, err := syscall.Open("/dev/iommu", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer syscall.Close(iommu)
	bind := bindIommufd{argsz: uint32(unsafe.Sizeof(bindIommufd{})), iommufd: uint32(iommu)}
	require.NoError(t, ioctl(dev, vfioDeviceBindIommufd, &bind), "VFIO_DEVICE_BIND_IOMMUFD with %v bound to no driver", others)
	alloc := ioasAlloc{size: uint32(unsafe.Sizeof(ioasAlloc{}))}
	require.NoError(t, ioctl(iommu, iommuIOASAlloc, &alloc))
	attach := attachPT{argsz: uint32(unsafe.Sizeof(attachPT{})), ptID: alloc.outIOASID}
	require.NoError(t, ioctl(dev, vfioDeviceAttachPT, &attach), "VFIO_DEVICE_ATTACH_IOMMUFD_PT with %v bound to no driver", others)
}
