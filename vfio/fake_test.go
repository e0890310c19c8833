package vfio

import (
	"encoding/binary"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma/vfio/internal/uapi"
)

// fakeKernel answers the VFIO interface the way Linux's vfio, vfio_iommu_type1
// and vfio-pci do, closely enough to test this package without a device. It
// hands out real file descriptors (memfds) as stand-ins so that fd leaks show
// up in /proc/self/fd, and a device's memfd holds its regions so that pread,
// pwrite and mmap of the device fd work.
type fakeKernel struct {
	t      testing.TB
	devDir string

	mu sync.Mutex
	// Configuration (set before use).
	noVFIO     bool
	apiVersion int
	extensions map[uint32]bool
	setErr     error // returned by VFIO_SET_IOMMU
	mapErr     error // returned by VFIO_IOMMU_MAP_DMA
	pgsizes    uint64
	ranges     []uapi.IOVARange // nil: no IOVA range capability
	dmaAvail   int              // <0: no DMA avail capability
	groups     map[int]*fakeGroup

	// State.
	fds map[int]*fakeFD
	log []string
}

type fakeFD struct {
	c *fakeContainer
	g *fakeGroup
	d *fakeDevice
}

type fakeContainer struct {
	iommu  uint32
	groups []*fakeGroup
	maps   map[uint64]uapi.DMAMap
}

type fakeGroup struct {
	n       int
	viable  bool
	open    bool
	c       *fakeContainer
	devices map[string]*fakeDevice
}

type fakeRegion struct {
	size  uint64
	flags uint32
	caps  [][]byte // capabilities, next fields filled in by the fake
	init  []byte   // initial contents
}

type fakeDevice struct {
	name    string
	flags   uint32
	regions []fakeRegion // by index; index 8 (VGA) answers EINVAL
	irqs    []uapi.IRQInfo
	fd      int // open memfd, -1 when closed
	enabled map[uint32][]int32
	resets  int
}

// regionShift spaces regions in the device memfd.
const regionShift = 24

func newFakeKernel(t testing.TB) *fakeKernel {
	k := &fakeKernel{
		t:          t,
		devDir:     t.TempDir(),
		apiVersion: uapi.APIVersion,
		extensions: map[uint32]bool{uapi.Type1IOMMU: true, uapi.Type1v2IOMMU: true},
		pgsizes:    0x40201000, // what the QEMU guest reports: 4K, 2M, 1G
		ranges:     []uapi.IOVARange{{Start: 0, End: 0xfedfffff}, {Start: 0xfef00000, End: 0x7fffffffff}},
		dmaAvail:   65535,
		groups:     map[int]*fakeGroup{},
		fds:        map[int]*fakeFD{},
	}
	t.Cleanup(func() {
		k.mu.Lock()
		defer k.mu.Unlock()
		for fd := range k.fds {
			t.Errorf("fake kernel: fd %d still open at the end of the test", fd)
			_ = unix.Close(fd)
		}
	})
	return k
}

// pvrdmaDevice is the pvrdma function as the QEMU bench's guest shows it.
func pvrdmaDevice(name string) *fakeDevice {
	msix := make([]byte, 8)
	binary.NativeEndian.PutUint16(msix, uapi.RegionInfoCapMSIXMappableID)
	binary.NativeEndian.PutUint16(msix[2:], 1)
	bar1 := make([]byte, 256)
	binary.LittleEndian.PutUint32(bar1[0x00:], 17)     // VERSION
	binary.LittleEndian.PutUint32(bar1[0x14:], 0xffff) // ERR
	cfg := make([]byte, 256)
	binary.LittleEndian.PutUint16(cfg[0:], 0x15ad)
	binary.LittleEndian.PutUint16(cfg[2:], 0x0820)
	binary.LittleEndian.PutUint16(cfg[4:], 0x0103)
	rw := uint32(uapi.RegionInfoFlagRead | uapi.RegionInfoFlagWrite)
	mm := rw | uapi.RegionInfoFlagMmap
	return &fakeDevice{
		name:  name,
		flags: uapi.DeviceFlagsPCI,
		regions: []fakeRegion{
			{size: 16 << 10, flags: mm, caps: [][]byte{msix}},
			{size: 256, flags: mm, init: bar1},
			{size: 8 << 20, flags: mm},
			{}, {}, {}, {},
			{size: 256, flags: rw, init: cfg},
			{}, // VGA: EINVAL
		},
		irqs: []uapi.IRQInfo{
			{Index: 0, Count: 1, Flags: uapi.IRQInfoEventfd | uapi.IRQInfoMaskable | uapi.IRQInfoAutomasked},
			{Index: 1, Count: 0, Flags: uapi.IRQInfoEventfd | uapi.IRQInfoNoResize},
			{Index: 2, Count: 3, Flags: uapi.IRQInfoEventfd | uapi.IRQInfoNoResize},
			{Index: 3, Count: 0, Flags: uapi.IRQInfoEventfd},
			{Index: 4, Count: 1, Flags: uapi.IRQInfoEventfd},
		},
		fd:      -1,
		enabled: map[uint32][]int32{},
	}
}

// addGroup adds IOMMU group n with the given devices.
func (k *fakeKernel) addGroup(n int, viable bool, devs ...*fakeDevice) *fakeGroup {
	g := &fakeGroup{n: n, viable: viable, devices: map[string]*fakeDevice{}}
	for _, d := range devs {
		g.devices[d.name] = d
	}
	k.mu.Lock()
	k.groups[n] = g
	k.mu.Unlock()
	return g
}

func (k *fakeKernel) logf(format string, args ...any) {
	k.log = append(k.log, fmt.Sprintf(format, args...))
}

// events returns the log of closes and unmaps so far.
func (k *fakeKernel) events() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.log)
}

func (k *fakeKernel) memfd(name string, size int64) (int, error) {
	fd, err := unix.MemfdCreate("vfio-fake-"+name, unix.MFD_CLOEXEC)
	if err != nil {
		return -1, err
	}
	if size > 0 {
		if err := unix.Ftruncate(fd, size); err != nil {
			_ = unix.Close(fd)
			return -1, err
		}
	}
	return fd, nil
}

func (k *fakeKernel) Open(path string) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if filepath.Dir(path) != k.devDir {
		return -1, unix.ENOENT
	}
	base := filepath.Base(path)
	if base == "vfio" {
		if k.noVFIO {
			return -1, unix.ENOENT
		}
		fd, err := k.memfd("container", 0)
		if err != nil {
			return -1, err
		}
		k.fds[fd] = &fakeFD{c: &fakeContainer{maps: map[uint64]uapi.DMAMap{}}}
		return fd, nil
	}
	n, err := strconv.Atoi(base)
	if err != nil {
		return -1, unix.ENOENT
	}
	g, ok := k.groups[n]
	if !ok {
		return -1, unix.ENOENT
	}
	if g.open {
		return -1, unix.EBUSY
	}
	fd, err := k.memfd("group", 0)
	if err != nil {
		return -1, err
	}
	g.open = true
	k.fds[fd] = &fakeFD{g: g}
	return fd, nil
}

func (k *fakeKernel) Close(fd int) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	f, ok := k.fds[fd]
	if !ok {
		return unix.EBADF
	}
	delete(k.fds, fd)
	switch {
	case f.c != nil:
		k.logf("close container")
		for _, g := range f.c.groups {
			g.c = nil
		}
	case f.g != nil:
		k.logf("close group %d", f.g.n)
		for _, d := range f.g.devices {
			if d.fd >= 0 {
				k.logf("BAD: group %d closed with device %s open", f.g.n, d.name)
			}
		}
		f.g.open = false
		k.detach(f.g)
	case f.d != nil:
		k.logf("close device %s", f.d.name)
		for idx := range f.d.enabled {
			k.logf("BAD: device %s closed with IRQ index %d enabled", f.d.name, idx)
		}
		clear(f.d.enabled)
		f.d.fd = -1
	}
	return unix.Close(fd)
}

// detach removes g from its container; the last group takes the IOMMU and
// all mappings with it, as in vfio_iommu_type1.
func (k *fakeKernel) detach(g *fakeGroup) {
	c := g.c
	if c == nil {
		return
	}
	g.c = nil
	c.groups = slices.DeleteFunc(c.groups, func(x *fakeGroup) bool { return x == g })
	if len(c.groups) == 0 {
		c.iommu = 0
		clear(c.maps)
	}
}

func (k *fakeKernel) IoctlInt(fd int, req uint, arg uintptr) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	f, ok := k.fds[fd]
	if !ok {
		return -1, unix.EBADF
	}
	if f.c == nil {
		return -1, unix.ENOTTY
	}
	switch req {
	case uapi.IoctlCheckExtension:
		if k.extensions[uint32(arg)] {
			return 1, nil
		}
		return 0, nil
	case uapi.IoctlSetIOMMU:
		switch {
		case len(f.c.groups) == 0:
			return -1, unix.EINVAL
		case f.c.iommu != 0:
			return -1, unix.EBUSY
		case !k.extensions[uint32(arg)]:
			return -1, unix.EINVAL
		case k.setErr != nil:
			return -1, k.setErr
		}
		f.c.iommu = uint32(arg)
		return 0, nil
	}
	return -1, unix.ENOTTY
}

func (k *fakeKernel) Ioctl(fd int, req uint, arg []byte) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	f, ok := k.fds[fd]
	if !ok {
		return -1, unix.EBADF
	}
	switch {
	case f.c != nil:
		return k.containerIoctl(f.c, req, arg)
	case f.g != nil:
		return k.groupIoctl(f.g, req, arg)
	default:
		return k.deviceIoctl(f.d, req, arg)
	}
}

func u32(b []byte, off int) uint32 { return binary.NativeEndian.Uint32(b[off:]) }

func putU32(b []byte, off int, v uint32) { binary.NativeEndian.PutUint32(b[off:], v) }

// chain lays caps out back to back from offset fixed, linking their next
// fields; it returns the bytes that follow the fixed struct.
func chain(fixed int, caps [][]byte) []byte {
	var out []byte
	off := fixed
	for i, c := range caps {
		c = slices.Clone(c)
		next := 0
		if i < len(caps)-1 {
			next = off + len(c)
		}
		if len(c) >= 8 { // a cap cut short (corruption tests) stays as it is
			putU32(c, 4, uint32(next))
		}
		out = append(out, c...)
		off += len(c)
	}
	return out
}

// answerInfo implements the INFO argsz protocol: write the fixed part,
// then the chain if it fits, else the size needed.
func answerInfo(arg, fixed, caps []byte, flagCaps uint32, capOffsetAt int) {
	argsz := u32(arg, 0)
	copy(arg, fixed)
	if len(caps) == 0 {
		putU32(arg, 0, argsz)
		return
	}
	putU32(arg, 4, u32(fixed, 4)|flagCaps)
	need := uint32(len(fixed) + len(caps))
	if argsz < need {
		putU32(arg, 0, need)
		putU32(arg, capOffsetAt, 0)
		return
	}
	putU32(arg, 0, argsz)
	copy(arg[len(fixed):], caps)
	putU32(arg, capOffsetAt, uint32(len(fixed)))
}

func (k *fakeKernel) containerIoctl(c *fakeContainer, req uint, arg []byte) (int, error) {
	switch req {
	case uapi.IoctlGetAPIVersion:
		return k.apiVersion, nil
	case uapi.IoctlIOMMUGetInfo:
		if c.iommu == 0 {
			return -1, unix.EINVAL
		}
		if len(arg) < 16 {
			return -1, unix.EINVAL
		}
		fixed := uapi.Encode(&uapi.IOMMUType1Info{Argsz: u32(arg, 0), Flags: uapi.IOMMUInfoPgsizes, IOVAPgsizes: k.pgsizes})
		var caps [][]byte
		if k.ranges != nil {
			cp := uapi.Encode(&uapi.IOMMUType1InfoCapIOVARange{
				Header:  uapi.InfoCapHeader{ID: uapi.IOMMUType1InfoCapIOVARangeID, Version: 1},
				NrIOVAs: uint32(len(k.ranges)),
			})
			for _, r := range k.ranges {
				cp = append(cp, uapi.Encode(&r)...)
			}
			caps = append(caps, cp)
		}
		if k.dmaAvail >= 0 {
			caps = append(caps, uapi.Encode(&uapi.IOMMUType1InfoDMAAvail{
				Header: uapi.InfoCapHeader{ID: uapi.IOMMUType1InfoDMAAvailID, Version: 1},
				Avail:  uint32(k.dmaAvail),
			}))
		}
		if len(arg) < 24 { // an old caller without cap_offset
			copy(arg, fixed[:16])
			return 0, nil
		}
		answerInfo(arg, fixed, chain(24, caps), uapi.IOMMUInfoCaps, 16)
		return 0, nil
	case uapi.IoctlIOMMUMapDMA:
		var m uapi.DMAMap
		if err := uapi.Decode(arg, &m); err != nil || m.Argsz < 32 {
			return -1, unix.EINVAL
		}
		if c.iommu == 0 {
			return -1, unix.EINVAL
		}
		if m.Flags&^(uapi.DMAMapFlagRead|uapi.DMAMapFlagWrite) != 0 || m.Size == 0 ||
			m.Size%4096 != 0 || m.IOVA%4096 != 0 || m.Vaddr%4096 != 0 {
			return -1, unix.EINVAL
		}
		if k.ranges != nil && !slices.ContainsFunc(k.ranges, func(r uapi.IOVARange) bool {
			return m.IOVA >= r.Start && m.IOVA+m.Size-1 <= r.End
		}) {
			return -1, unix.EINVAL
		}
		for _, x := range c.maps {
			if m.IOVA < x.IOVA+x.Size && x.IOVA < m.IOVA+m.Size {
				return -1, unix.EEXIST
			}
		}
		if k.mapErr != nil {
			return -1, k.mapErr
		}
		c.maps[m.IOVA] = m
		return 0, nil
	case uapi.IoctlIOMMUUnmapDMA:
		var u uapi.DMAUnmap
		if err := uapi.Decode(arg, &u); err != nil || u.Argsz < 24 || u.Flags != 0 {
			return -1, unix.EINVAL
		}
		if c.iommu == 0 {
			return -1, unix.EINVAL
		}
		m, ok := c.maps[u.IOVA]
		if !ok || m.Size != u.Size {
			binary.NativeEndian.PutUint64(arg[16:], 0)
			return 0, nil // the kernel unmaps nothing and says so
		}
		delete(c.maps, u.IOVA)
		k.logf("unmap %#x", u.IOVA)
		binary.NativeEndian.PutUint64(arg[16:], m.Size)
		return 0, nil
	}
	return -1, unix.ENOTTY
}

func (k *fakeKernel) groupIoctl(g *fakeGroup, req uint, arg []byte) (int, error) {
	switch req {
	case uapi.IoctlGroupGetStatus:
		if len(arg) < 8 {
			return -1, unix.EINVAL
		}
		var flags uint32
		if g.viable {
			flags |= uapi.GroupFlagsViable
		}
		if g.c != nil {
			flags |= uapi.GroupFlagsContainerSet
		}
		putU32(arg, 4, flags)
		return 0, nil
	case uapi.IoctlGroupSetContainer:
		if len(arg) != 4 {
			return -1, unix.EINVAL
		}
		cf, ok := k.fds[int(int32(u32(arg, 0)))]
		if !ok || cf.c == nil {
			return -1, unix.EBADF
		}
		if g.c != nil {
			return -1, unix.EINVAL
		}
		if !g.viable {
			return -1, unix.EPERM
		}
		g.c = cf.c
		cf.c.groups = append(cf.c.groups, g)
		return 0, nil
	case uapi.IoctlGroupUnsetContainer:
		if g.c == nil {
			return -1, unix.EINVAL
		}
		k.detach(g)
		return 0, nil
	case uapi.IoctlGroupGetDeviceFD:
		if g.c == nil || g.c.iommu == 0 {
			return -1, unix.EINVAL
		}
		if len(arg) == 0 || arg[len(arg)-1] != 0 {
			return -1, unix.EINVAL
		}
		d, ok := g.devices[string(arg[:len(arg)-1])]
		if !ok {
			return -1, unix.ENODEV
		}
		fd, err := k.memfd("device", int64(len(d.regions))<<regionShift)
		if err != nil {
			return -1, err
		}
		for i, r := range d.regions {
			if len(r.init) > 0 {
				if _, err := unix.Pwrite(fd, r.init, int64(i)<<regionShift); err != nil {
					_ = unix.Close(fd)
					return -1, err
				}
			}
		}
		d.fd = fd
		k.fds[fd] = &fakeFD{d: d}
		return fd, nil
	}
	return -1, unix.ENOTTY
}

func (k *fakeKernel) deviceIoctl(d *fakeDevice, req uint, arg []byte) (int, error) {
	switch req {
	case uapi.IoctlDeviceGetInfo:
		if len(arg) < 16 {
			return -1, unix.EINVAL
		}
		putU32(arg, 4, d.flags)
		putU32(arg, 8, uint32(len(d.regions)))
		putU32(arg, 12, uint32(len(d.irqs)))
		if len(arg) >= 20 {
		}
		return 0, nil
	case uapi.IoctlDeviceGetRegionInfo:
		if len(arg) < 32 {
			return -1, unix.EINVAL
		}
		idx := u32(arg, 8)
		if idx >= uint32(len(d.regions)) || idx == uapi.PCIVGARegionIndex {
			return -1, unix.EINVAL
		}
		r := d.regions[idx]
		fixed := uapi.Encode(&uapi.RegionInfo{Argsz: u32(arg, 0), Flags: r.flags, Index: idx, Size: r.size, Offset: uint64(idx) << regionShift})
		answerInfo(arg, fixed, chain(32, r.caps), uapi.RegionInfoFlagCaps, 12)
		return 0, nil
	case uapi.IoctlDeviceGetIRQInfo:
		if len(arg) < 16 {
			return -1, unix.EINVAL
		}
		idx := u32(arg, 8)
		if idx >= uint32(len(d.irqs)) {
			return -1, unix.EINVAL
		}
		putU32(arg, 4, d.irqs[idx].Flags)
		putU32(arg, 12, d.irqs[idx].Count)
		return 0, nil
	case uapi.IoctlDeviceSetIRQs:
		var s uapi.IRQSet
		if err := uapi.Decode(arg, &s); err != nil || int(s.Argsz) != len(arg) {
			return -1, unix.EINVAL
		}
		if s.Index >= uint32(len(d.irqs)) || s.Flags&uapi.IRQSetActionTrigger == 0 {
			return -1, unix.EINVAL
		}
		info := d.irqs[s.Index]
		data := arg[20:]
		switch {
		case s.Flags&uapi.IRQSetDataNone != 0 && s.Count == 0:
			delete(d.enabled, s.Index)
			return 0, nil
		case s.Flags&uapi.IRQSetDataNone != 0:
			fds, ok := d.enabled[s.Index]
			if !ok || uint64(s.Start)+uint64(s.Count) > uint64(len(fds)) {
				return -1, unix.EINVAL
			}
			for _, fd := range fds[s.Start : s.Start+s.Count] {
				if fd >= 0 {
					fire(k.t, int(fd))
				}
			}
			return 0, nil
		case s.Flags&uapi.IRQSetDataEventfd != 0:
			if len(data) != 4*int(s.Count) || s.Start != 0 || s.Count > info.Count {
				return -1, unix.EINVAL
			}
			if _, on := d.enabled[s.Index]; on {
				return -1, unix.EINVAL // the fake does not support changing vectors in place
			}
			fds := make([]int32, s.Count)
			for i := range fds {
				fds[i] = int32(u32(data, 4*i))
				var st unix.Stat_t
				if fds[i] >= 0 && unix.Fstat(int(fds[i]), &st) != nil {
					return -1, unix.EBADF
				}
			}
			d.enabled[s.Index] = fds
			return 0, nil
		}
		return -1, unix.EINVAL
	case uapi.IoctlDeviceReset:
		if d.flags&uapi.DeviceFlagsReset == 0 {
			return -1, unix.EINVAL
		}
		d.resets++
		return 0, nil
	}
	return -1, unix.ENOTTY
}

// fire signals an eventfd once, as the kernel does when an interrupt comes.
func fire(t testing.TB, fd int) {
	one := [8]byte{1}
	if _, err := unix.Write(fd, one[:]); err != nil {
		t.Errorf("fake kernel: signal eventfd %d: %v", fd, err)
	}
}

// raise signals vector sub of IRQ index on device d as the device would.
func (k *fakeKernel) raise(d *fakeDevice, index uint32, sub int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	fds, ok := d.enabled[index]
	if !ok || sub >= len(fds) {
		k.t.Fatalf("fake kernel: raise on IRQ %d vector %d, which is not enabled", index, sub)
	}
	fire(k.t, int(fds[sub]))
}

// mappings returns the container's DMA mappings (there is at most one
// container in these tests).
func (k *fakeKernel) mappings() map[uint64]uapi.DMAMap {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, f := range k.fds {
		if f.c != nil {
			return maps.Clone(f.c.maps)
		}
	}
	return nil
}
