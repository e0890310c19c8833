// Package vfiotest is a fake of the kernel's VFIO interface (the container
// and group nodes under /dev/vfio, vfio_iommu_type1 and vfio-pci) for
// tests of package vfio and of code above it, on machines without VFIO, an
// IOMMU or root.
//
// A Kernel answers the opens, closes and ioctls package vfio makes, at the
// system-call boundary and in the same byte layouts (<linux/vfio.h>), the
// way Linux's vfio, vfio_iommu_type1 and vfio-pci answer them: the API
// version and extension checks, a container that takes its IOMMU model
// when its first group attaches and drops it with all its mappings when
// the last group leaves, group viability and EBUSY for a group already
// open, the argsz protocol and capability chains of the INFO ioctls, DMA
// mappings checked against the IOVA ranges and for overlap, and
// SET_IRQS with eventfds. Pass it as vfio.Options.Kernel, with a fake
// sysfs (package pcitest) in which the function's group is bound to
// vfio-pci:
//
//	k := vfiotest.New(t)
//	k.AddGroup(5, true, vfiotest.PVRDMA("0000:00:10.1"))
//	d, err := vfio.Open(addr, &vfio.Options{Kernel: k, SysfsRoot: sys.Root})
//
// The fake hands out real file descriptors (memfds) as stand-ins, so that
// descriptor leaks show up in /proc/self/fd, and every descriptor still
// open when the test ends is reported as an error. A device's memfd holds
// its regions at the offsets VFIO_DEVICE_GET_REGION_INFO reports, so
// pread, pwrite and mmap of the device fd reach them as they would a BAR;
// nothing is behind them (what is written reads back). Device.Raise
// signals an interrupt's eventfd as the device would.
//
// It fakes the cdev path too: /dev/iommu (iommufd: IOAS allocation, its
// IOVA ranges, fixed-IOVA maps and unmaps, destroy) and the device cdevs
// under /dev/vfio/devices, with the kernel's rules for binding: a device
// fd is refused every request until VFIO_DEVICE_BIND_IOMMUFD, a device
// already bound refuses a second bind (EINVAL), a group held through its
// group node refuses it (EBUSY) and so does the group node while a device
// of it is bound (EBUSY), and a group another iommufd owns a device of, or
// that is not viable, refuses it (EPERM). iommufd is off as New makes the
// fake (the bench's guest kernel has none); SetIOMMUFDLoaded turns it on
// and LinkCDevs names each device's cdev in a fake sysfs, which is where
// package vfio finds it.
//
// Not modelled: the no-IOMMU mode, IOMMU_IOAS_MAP without a fixed IOVA,
// hardware page tables, PASIDs, type1's v1 and v2 differences (both are offered and behave alike),
// region permissions (every region's memfd is readable and writable), the
// pinning of the memory a mapping names (its address is only checked for
// alignment), changing the vectors of an enabled IRQ index in place, and
// the error IRQ and request IRQ semantics (they are plain eventfd indexes).
//
// A Kernel is safe for concurrent use. Its configuration (SetIOMMU, the
// groups, the fields of a Device) is meant to be set up before the code
// under test opens the nodes it concerns; a Device's fields are read by
// the fake without synchronization with the test that writes them.
package vfiotest

import (
	"encoding/binary"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma/vfio"
	"github.com/vfrdma/vfrdma/vfio/internal/uapi"
)

// DevDir is the directory whose nodes a Kernel answers for: vfio's default
// (vfio.Options.DevDir ""). Other paths do not exist. The fake never
// touches the file system there.
const DevDir = "/dev/vfio"

// Kernel is a fake of Linux's VFIO interface. It implements vfio.Kernel.
type Kernel struct {
	t testing.TB
	k *kernel
}

var _ vfio.Kernel = (*Kernel)(nil)

// kernel implements uapi.Kernel; its methods are the system calls.
type kernel struct {
	t testing.TB

	mu         sync.Mutex
	noVFIO     bool
	iommufd    bool      // /dev/iommu exists
	ioasAlign  *uint64   // IOMMU_IOAS_IOVA_RANGES' alignment, when set (SetIOASAlignment)
	cdevs      []*Device // by cdev number: vfioN is cdevs[N]
	nextID     uint32    // iommufd object IDs
	apiVersion int
	iommu      IOMMU
	fail       map[Ioctl]error
	groups     map[int]*Group
	fds        map[int]*fakeFD
	log        []string
}

type fakeFD struct {
	c *container
	g *Group
	d *Device
	x *ictx // an iommufd

	// A device cdev's fd: d is the device, cdev is set; bound is the
	// iommufd it is bound to (nil until VFIO_DEVICE_BIND_IOMMUFD), ioas
	// the IOAS it is attached to.
	cdev  bool
	bound *ictx
	ioas  *ioas
}

// ictx is an iommufd: its IOASes by ID.
type ictx struct {
	fd    int
	ioass map[uint32]*ioas
}

// ioas is an IOAS: its mappings by IOVA, and the device fds attached.
type ioas struct {
	id       uint32
	maps     map[uint64]uapi.IOASMap
	attached int
}

type container struct {
	iommu  uint32
	groups []*Group
	maps   map[uint64]uapi.DMAMap
}

// New returns a fake kernel with no groups, whose IOMMU is QEMUGuestIOMMU.
// When the test ends, every descriptor the fake handed out and the code
// under test left open is reported (t.Errorf) and closed.
func New(t testing.TB) *Kernel {
	t.Helper()
	k := &kernel{
		t:          t,
		apiVersion: uapi.APIVersion,
		iommu:      QEMUGuestIOMMU(),
		fail:       map[Ioctl]error{},
		groups:     map[int]*Group{},
		fds:        map[int]*fakeFD{},
	}
	t.Cleanup(func() {
		k.mu.Lock()
		defer k.mu.Unlock()
		for _, fd := range slices.Sorted(maps.Keys(k.fds)) {
			t.Errorf("vfiotest: fd %d (%s) still open at the end of the test", fd, k.fds[fd])
			_ = unix.Close(fd)
		}
	})
	return &Kernel{t: t, k: k}
}

func (f *fakeFD) String() string {
	switch {
	case f.c != nil:
		return "container"
	case f.g != nil:
		return "group " + strconv.Itoa(f.g.n)
	case f.x != nil:
		return "iommufd"
	case f.cdev:
		return "device cdev " + f.d.Name
	default:
		return "device " + f.d.Name
	}
}

// VFIO implements vfio.Kernel.
func (k *Kernel) VFIO() uapi.Kernel { return k.k }

// SetVFIOLoaded with false makes /dev/vfio/vfio absent, as on a machine
// where the vfio modules are not loaded (vfio.ErrNoVFIO).
func (k *Kernel) SetVFIOLoaded(loaded bool) {
	k.k.mu.Lock()
	defer k.k.mu.Unlock()
	k.k.noVFIO = !loaded
}

// IOMMUDev is the node of iommufd the fake answers for: vfio's default
// (vfio.Options.IOMMUDev "").
const IOMMUDev = "/dev/iommu"

// SetIOMMUFDLoaded with true makes /dev/iommu exist (New: it does not, as
// on the bench's guest kernel, which has no CONFIG_IOMMUFD).
func (k *Kernel) SetIOMMUFDLoaded(loaded bool) {
	k.k.mu.Lock()
	defer k.k.mu.Unlock()
	k.k.iommufd = loaded
}

// SetIOASAlignment makes IOMMU_IOAS_IOVA_RANGES report align as the IOVA
// alignment instead of the page size: a kernel answer to check.
func (k *Kernel) SetIOASAlignment(align uint64) {
	k.k.mu.Lock()
	defer k.k.mu.Unlock()
	k.k.ioasAlign = &align
}

// LinkCDevs makes the fake sysfs tree at sysfsRoot name each device's cdev
// as the kernel does for a device bound to vfio-pci with
// CONFIG_VFIO_DEVICE_CDEV: bus/pci/devices/<name>/vfio-dev/vfioN, for the
// devices of the groups added so far whose function is in the tree. The
// fake answers /dev/vfio/devices/vfioN for every device of its groups,
// linked or not.
func (k *Kernel) LinkCDevs(t testing.TB, sysfsRoot string) {
	t.Helper()
	k.k.mu.Lock()
	defer k.k.mu.Unlock()
	for n, d := range k.k.cdevs {
		dev := filepath.Join(sysfsRoot, "bus/pci/devices", d.Name)
		if _, err := os.Stat(dev); err != nil {
			continue
		}
		dir := filepath.Join(dev, "vfio-dev", "vfio"+strconv.Itoa(n))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatalf("vfiotest: %v", err)
		}
	}
}

// SetAPIVersion sets what VFIO_GET_API_VERSION returns (New: the version
// package vfio speaks, VFIO_API_VERSION 0).
func (k *Kernel) SetAPIVersion(v int) {
	k.k.mu.Lock()
	defer k.k.mu.Unlock()
	k.k.apiVersion = v
}

// IOMMU is what the fake's type1 IOMMU offers and reports.
type IOMMU struct {
	// Types are the IOMMU models VFIO_CHECK_EXTENSION reports and
	// VFIO_SET_IOMMU accepts.
	Types []vfio.IOMMUType
	// PageSizes is the iova_pgsizes bitmap of VFIO_IOMMU_GET_INFO.
	PageSizes uint64
	// Ranges are the valid IOVA ranges (inclusive ends) of the IOVA range
	// capability, which mappings must lie in; nil reports no such
	// capability and allows any IOVA.
	Ranges []vfio.IOVARange
	// DMAAvail is what the DMA-available capability reports; negative
	// reports no such capability.
	DMAAvail int
}

// QEMUGuestIOMMU is what the kernel of the QEMU bench's guest reports with
// intel-iommu (39-bit): type1 and type1v2, 4 KiB, 2 MiB and 1 GiB pages,
// IOVAs up to 2^39 but the x86 MSI window, and 65535 mappings available.
func QEMUGuestIOMMU() IOMMU {
	return IOMMU{
		Types:     []vfio.IOMMUType{vfio.Type1, vfio.Type1v2},
		PageSizes: 0x40201000,
		Ranges:    []vfio.IOVARange{{Start: 0, End: 0xfedfffff}, {Start: 0xfef00000, End: 0x7fffffffff}},
		DMAAvail:  65535,
	}
}

// SetIOMMU sets the IOMMU that containers opened from now on offer.
func (k *Kernel) SetIOMMU(iommu IOMMU) {
	k.k.mu.Lock()
	defer k.k.mu.Unlock()
	iommu.Types = slices.Clone(iommu.Types)
	iommu.Ranges = slices.Clone(iommu.Ranges)
	k.k.iommu = iommu
}

// Ioctl names a request Fail can make the fake refuse.
type Ioctl int

// Requests Fail takes.
const (
	IoctlSetIOMMU        Ioctl = iota + 1 // VFIO_SET_IOMMU
	IoctlMapDMA                           // VFIO_IOMMU_MAP_DMA, and IOMMU_IOAS_MAP
	IoctlUnmapDMA                         // VFIO_IOMMU_UNMAP_DMA, and IOMMU_IOAS_UNMAP
	IoctlSetContainer                     // VFIO_GROUP_SET_CONTAINER
	IoctlGetDeviceFD                      // VFIO_GROUP_GET_DEVICE_FD
	IoctlSetIRQs                          // VFIO_DEVICE_SET_IRQS
	IoctlReset                            // VFIO_DEVICE_RESET
	IoctlBindIOMMUFD                      // VFIO_DEVICE_BIND_IOMMUFD
	IoctlAttachIOMMUFDPT                  // VFIO_DEVICE_ATTACH_IOMMUFD_PT
)

// Fail makes every later req that the fake would carry out fail with err
// instead (an errno, as the kernel returns), until Fail(req, nil). Checks
// of the request's own arguments and state come first, as in the kernel:
// e.g. Fail(IoctlSetIOMMU, unix.EPERM) is what a kernel without interrupt
// remapping answers, Fail(IoctlMapDMA, unix.ENOMEM) one whose locked-memory
// limit is reached.
func (k *Kernel) Fail(req Ioctl, err error) {
	k.k.mu.Lock()
	defer k.k.mu.Unlock()
	if err == nil {
		delete(k.k.fail, req)
		return
	}
	k.k.fail[req] = err
}

// failure returns the error injected for req (mu held).
func (k *kernel) failure(req Ioctl) error { return k.fail[req] }

// Group is an IOMMU group of the fake, /dev/vfio/N.
type Group struct {
	k       *kernel
	n       int
	viable  bool
	busy    bool // opened (by the code under test, or elsewhere: SetBusy)
	c       *container
	devices map[string]*Device
	owner   *ictx // the iommufd its bound cdevs are bound to
	owned   int   // how many of its devices are bound through their cdev
}

// AddGroup adds IOMMU group n (replacing one of that number) holding devs.
// A group that is not viable (a member bound to a host driver) cannot be
// attached to a container (EPERM); package vfio then reads sysfs to name
// the member in the way.
func (k *Kernel) AddGroup(n int, viable bool, devs ...*Device) *Group {
	g := &Group{k: k.k, n: n, viable: viable, devices: map[string]*Device{}}
	k.k.mu.Lock()
	defer k.k.mu.Unlock()
	for _, d := range devs {
		d.k = k.k
		d.fd = -1
		d.g = g
		d.cdevN = len(k.k.cdevs)
		k.k.cdevs = append(k.k.cdevs, d)
		if d.enabled == nil {
			d.enabled = map[int][]int32{}
		}
		g.devices[d.Name] = d
	}
	k.k.groups[n] = g
	return g
}

// RemoveGroup removes group n: its node no longer exists, as when the
// group is not bound to vfio-pci.
func (k *Kernel) RemoveGroup(n int) {
	k.k.mu.Lock()
	defer k.k.mu.Unlock()
	delete(k.k.groups, n)
}

// Number returns the group's number.
func (g *Group) Number() int { return g.n }

// SetViable sets whether the group is viable.
func (g *Group) SetViable(viable bool) {
	g.k.mu.Lock()
	defer g.k.mu.Unlock()
	g.viable = viable
}

// SetBusy with true makes the group's node refuse to open (EBUSY), as when
// another process holds it, and its devices' cdevs refuse to bind (EBUSY);
// false lets it open again. It must not be called while the code under
// test holds the group open.
func (g *Group) SetBusy(busy bool) {
	g.k.mu.Lock()
	defer g.k.mu.Unlock()
	g.busy = busy
}

// Device is a function of a group, as vfio-pci shows it. Set its fields
// before the device is opened; AddGroup adopts it.
type Device struct {
	// Name is the device's name in its group, its PCI address
	// ("0000:00:10.1").
	Name string
	// PCI and Resettable are the device flags VFIO_DEVICE_GET_INFO
	// reports (VFIO_DEVICE_FLAGS_PCI, VFIO_DEVICE_FLAGS_RESET); a device
	// without Resettable refuses VFIO_DEVICE_RESET (EINVAL).
	PCI, Resettable bool
	// Regions are the device's regions by region index. An index past the
	// end, and the VGA index (8), are refused (EINVAL) as vfio-pci refuses
	// them on a function without VGA; a zero Region is reported with size
	// 0 and no flags (an absent BAR).
	Regions []Region
	// IRQs are the device's IRQ indexes, by index.
	IRQs []IRQ

	k       *kernel
	fd      int // the open device fd (on the cdev path: the bound one), -1 when closed
	g       *Group
	cdevN   int             // its cdev is /dev/vfio/devices/vfio<cdevN>
	enabled map[int][]int32 // eventfds by enabled IRQ index
	resets  int
}

// CDev returns the device's cdev node name ("vfio1"): devices are numbered
// from 0 in the order AddGroup adopted them.
func (d *Device) CDev() string { return "vfio" + strconv.Itoa(d.cdevN) }

// Region is one region of a Device.
type Region struct {
	Size                         uint64
	Readable, Writable, Mappable bool
	// Caps are the region's capabilities as the kernel lays them out (an
	// 8-byte header: id, version, next; then the body), chained by the
	// fake, which fills in the next fields. A capability shorter than the
	// header is passed on as it is (to test a parser).
	Caps [][]byte
	// Init is the region's contents when the device is opened.
	Init []byte
}

// IRQ is one IRQ index of a Device.
type IRQ struct {
	Count                                   uint32
	Eventfd, Maskable, Automasked, NoResize bool
}

// PVRDMA returns the pvrdma function as the QEMU bench's guest shows it:
// BAR0 (MSI-X, 16 KiB, mappable with the MSI-X table), BAR1 (the 256-byte
// register file, VERSION 17, ERR 0xFFFF), BAR2 (8 MiB of UAR pages), a
// 256-byte configuration space (15ad:0820, command 0x0103), not
// resettable; INTx, MSI (no vectors), 3 MSI-X vectors, the error and
// request IRQs.
func PVRDMA(name string) *Device {
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
	return &Device{
		Name: name,
		PCI:  true,
		Regions: []Region{
			{Size: 16 << 10, Readable: true, Writable: true, Mappable: true, Caps: [][]byte{msix}},
			{Size: 256, Readable: true, Writable: true, Mappable: true, Init: bar1},
			{Size: 8 << 20, Readable: true, Writable: true, Mappable: true},
			{}, {}, {}, {},
			{Size: 256, Readable: true, Writable: true, Init: cfg},
			{}, // VGA: refused
		},
		IRQs: []IRQ{
			{Count: 1, Eventfd: true, Maskable: true, Automasked: true},
			{Count: 0, Eventfd: true, NoResize: true},
			{Count: 3, Eventfd: true, NoResize: true},
			{Count: 0, Eventfd: true},
			{Count: 1, Eventfd: true},
		},
		fd: -1,
	}
}

// Raise signals vector of IRQ index on the device, as the device does when
// it interrupts: the vector's eventfd counts one more.
func (d *Device) Raise(index, vector int) error {
	if d.k == nil {
		return fmt.Errorf("vfiotest: raise on %s, which is in no group", d.Name)
	}
	d.k.mu.Lock()
	defer d.k.mu.Unlock()
	fds, ok := d.enabled[index]
	if !ok || vector < 0 || vector >= len(fds) || fds[vector] < 0 {
		return fmt.Errorf("vfiotest: raise IRQ index %d vector %d of %s, which is not enabled", index, vector, d.Name)
	}
	return signal(int(fds[vector]))
}

// Eventfds returns the eventfds bound to IRQ index (-1 for a vector
// without one), or nil when the index is not enabled.
func (d *Device) Eventfds(index int) []int {
	if d.k == nil {
		return nil
	}
	d.k.mu.Lock()
	defer d.k.mu.Unlock()
	fds, ok := d.enabled[index]
	if !ok {
		return nil
	}
	out := make([]int, len(fds))
	for i, fd := range fds {
		out[i] = int(fd)
	}
	return out
}

// Resets returns how many times the device was reset.
func (d *Device) Resets() int {
	if d.k == nil {
		return 0
	}
	d.k.mu.Lock()
	defer d.k.mu.Unlock()
	return d.resets
}

// Events returns what the fake saw, in order: "close container", "close
// group N", "close device NAME", "unmap 0xIOVA", on the cdev path "bind
// NAME", "attach NAME to IOAS N", "destroy IOAS N", "close iommufd", and
// lines starting with "BAD:" for a teardown out of order (a group closed
// with a device of it open, a device closed with an IRQ index enabled, an
// iommufd closed with an IOAS or a bound device left).
func (k *Kernel) Events() []string {
	k.k.mu.Lock()
	defer k.k.mu.Unlock()
	return slices.Clone(k.k.log)
}

// DMAMapping is one mapping of a container's IOMMU.
type DMAMapping struct {
	IOVA, Size, Vaddr uint64
	Read, Write       bool
}

// DMAMappings returns the DMA mappings of the open containers and of the
// IOASes of the open iommufds, by IOVA.
func (k *Kernel) DMAMappings() map[uint64]DMAMapping {
	k.k.mu.Lock()
	defer k.k.mu.Unlock()
	out := map[uint64]DMAMapping{}
	for _, f := range k.k.fds {
		if f.x != nil {
			for _, a := range f.x.ioass {
				for iova, m := range a.maps {
					out[iova] = DMAMapping{IOVA: m.IOVA, Size: m.Length, Vaddr: m.UserVA,
						Read: m.Flags&uapi.IOASMapReadable != 0, Write: m.Flags&uapi.IOASMapWriteable != 0}
				}
			}
		}
		if f.c == nil {
			continue
		}
		for iova, m := range f.c.maps {
			out[iova] = DMAMapping{IOVA: m.IOVA, Size: m.Size, Vaddr: m.Vaddr,
				Read: m.Flags&uapi.DMAMapFlagRead != 0, Write: m.Flags&uapi.DMAMapFlagWrite != 0}
		}
	}
	return out
}

// memfdPrefix names the fake's memfds; a device's is memfdPrefix+"device".
const memfdPrefix = "vfiotest-"

// RegionMaps counts the mappings of fake device regions in this process
// (mmaps of a device fd the fake handed out, by any Kernel). Package vfio
// unmaps every region at Close: a TestMain can check none is left.
func RegionMaps() int {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "memfd:"+memfdPrefix+"device")
}

func (k *kernel) logf(format string, args ...any) {
	k.log = append(k.log, fmt.Sprintf(format, args...))
}

func memfd(name string, size int64) (int, error) {
	fd, err := unix.MemfdCreate(memfdPrefix+name, unix.MFD_CLOEXEC)
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

// regionShift spaces regions in the device memfd: region i is at i << 24.
const regionShift = 24

// Open implements uapi.Kernel.
func (k *kernel) Open(path string) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if path == IOMMUDev {
		return k.openIOMMUFD()
	}
	if filepath.Dir(path) == filepath.Join(DevDir, "devices") {
		return k.openCDev(filepath.Base(path))
	}
	if filepath.Dir(path) != DevDir {
		return -1, unix.ENOENT
	}
	base := filepath.Base(path)
	if base == "vfio" {
		if k.noVFIO {
			return -1, unix.ENOENT
		}
		fd, err := memfd("container", 0)
		if err != nil {
			return -1, err
		}
		k.fds[fd] = &fakeFD{c: &container{maps: map[uint64]uapi.DMAMap{}}}
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
	if g.busy || g.owned > 0 {
		return -1, unix.EBUSY
	}
	fd, err := memfd("group", 0)
	if err != nil {
		return -1, err
	}
	g.busy = true
	k.fds[fd] = &fakeFD{g: g}
	return fd, nil
}

// Close implements uapi.Kernel.
func (k *kernel) Close(fd int) error {
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
		for _, name := range slices.Sorted(maps.Keys(f.g.devices)) {
			if f.g.devices[name].fd >= 0 {
				k.logf("BAD: group %d closed with device %s open", f.g.n, name)
			}
		}
		f.g.busy = false
		k.detach(f.g)
	case f.x != nil:
		k.logf("close iommufd")
		for _, id := range slices.Sorted(maps.Keys(f.x.ioass)) {
			k.logf("BAD: iommufd closed with IOAS %d left", id)
		}
		for _, o := range k.fds {
			if o.bound == f.x {
				k.logf("BAD: iommufd closed with device %s bound", o.d.Name)
			}
		}
	case f.cdev && f.bound == nil:
		// A cdev opened and never bound: nothing to undo.
	case f.d != nil:
		k.logf("close device %s", f.d.Name)
		if f.cdev {
			k.unbind(f)
		}
		for _, idx := range slices.Sorted(maps.Keys(f.d.enabled)) {
			k.logf("BAD: device %s closed with IRQ index %d enabled", f.d.Name, idx)
		}
		clear(f.d.enabled)
		f.d.fd = -1
	}
	return unix.Close(fd)
}

// detach removes g from its container; the last group takes the IOMMU and
// all mappings with it, as in vfio_iommu_type1.
func (k *kernel) detach(g *Group) {
	c := g.c
	if c == nil {
		return
	}
	g.c = nil
	c.groups = slices.DeleteFunc(c.groups, func(x *Group) bool { return x == g })
	if len(c.groups) == 0 {
		c.iommu = 0
		clear(c.maps)
	}
}

func (k *kernel) offers(typ uint32) bool {
	return slices.Contains(k.iommu.Types, vfio.IOMMUType(typ))
}

// IoctlPtr implements uapi.Kernel: the array of IOMMU_IOAS_IOVA_RANGES.
func (k *kernel) IoctlPtr(fd int, req uint, arg []byte, at int, buf []byte) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	f, ok := k.fds[fd]
	if !ok {
		return -1, unix.EBADF
	}
	if f.x == nil || req != uapi.IoctlIOASIOVARanges || at != 16 || len(arg) < 32 {
		return -1, unix.ENOTTY
	}
	return k.iovaRanges(f.x, arg, buf)
}

// IoctlInt implements uapi.Kernel.
func (k *kernel) IoctlInt(fd int, req uint, arg uintptr) (int, error) {
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
		if k.offers(uint32(arg)) {
			return 1, nil
		}
		return 0, nil
	case uapi.IoctlSetIOMMU:
		switch {
		case len(f.c.groups) == 0:
			return -1, unix.EINVAL
		case f.c.iommu != 0:
			return -1, unix.EBUSY
		case !k.offers(uint32(arg)):
			return -1, unix.EINVAL
		}
		if err := k.failure(IoctlSetIOMMU); err != nil {
			return -1, err
		}
		f.c.iommu = uint32(arg)
		return 0, nil
	}
	return -1, unix.ENOTTY
}

// Ioctl implements uapi.Kernel.
func (k *kernel) Ioctl(fd int, req uint, arg []byte) (int, error) {
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
	case f.x != nil:
		return k.iommufdIoctl(f.x, req, arg)
	case f.cdev:
		return k.cdevIoctl(fd, f, req, arg)
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

func (k *kernel) containerIoctl(c *container, req uint, arg []byte) (int, error) {
	switch req {
	case uapi.IoctlGetAPIVersion:
		return k.apiVersion, nil
	case uapi.IoctlIOMMUGetInfo:
		if c.iommu == 0 || len(arg) < 16 {
			return -1, unix.EINVAL
		}
		fixed := uapi.Encode(&uapi.IOMMUType1Info{Argsz: u32(arg, 0), Flags: uapi.IOMMUInfoPgsizes, IOVAPgsizes: k.iommu.PageSizes})
		var caps [][]byte
		if k.iommu.Ranges != nil {
			cp := uapi.Encode(&uapi.IOMMUType1InfoCapIOVARange{
				Header:  uapi.InfoCapHeader{ID: uapi.IOMMUType1InfoCapIOVARangeID, Version: 1},
				NrIOVAs: uint32(len(k.iommu.Ranges)),
			})
			for _, r := range k.iommu.Ranges {
				cp = append(cp, uapi.Encode(&uapi.IOVARange{Start: r.Start, End: r.End})...)
			}
			caps = append(caps, cp)
		}
		if k.iommu.DMAAvail >= 0 {
			caps = append(caps, uapi.Encode(&uapi.IOMMUType1InfoDMAAvail{
				Header: uapi.InfoCapHeader{ID: uapi.IOMMUType1InfoDMAAvailID, Version: 1},
				Avail:  uint32(k.iommu.DMAAvail),
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
		if k.iommu.Ranges != nil && !slices.ContainsFunc(k.iommu.Ranges, func(r vfio.IOVARange) bool {
			return m.IOVA >= r.Start && m.IOVA+m.Size-1 <= r.End
		}) {
			return -1, unix.EINVAL
		}
		for _, x := range c.maps {
			if m.IOVA < x.IOVA+x.Size && x.IOVA < m.IOVA+m.Size {
				return -1, unix.EEXIST
			}
		}
		if err := k.failure(IoctlMapDMA); err != nil {
			return -1, err
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
		if err := k.failure(IoctlUnmapDMA); err != nil {
			return -1, err
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

func (k *kernel) groupIoctl(g *Group, req uint, arg []byte) (int, error) {
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
		if err := k.failure(IoctlSetContainer); err != nil {
			return -1, err
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
		if err := k.failure(IoctlGetDeviceFD); err != nil {
			return -1, err
		}
		fd, err := d.memfd()
		if err != nil {
			return -1, err
		}
		d.fd = fd
		k.fds[fd] = &fakeFD{d: d}
		return fd, nil
	}
	return -1, unix.ENOTTY
}

// memfd makes a device fd: a memfd holding the regions, initialised.
func (d *Device) memfd() (int, error) {
	fd, err := memfd("device", int64(len(d.Regions))<<regionShift)
	if err != nil {
		return -1, err
	}
	for i, r := range d.Regions {
		if len(r.Init) > 0 {
			if _, err := unix.Pwrite(fd, r.Init, int64(i)<<regionShift); err != nil {
				_ = unix.Close(fd)
				return -1, err
			}
		}
	}
	return fd, nil
}

func (d *Device) flags() uint32 {
	var f uint32
	if d.PCI {
		f |= uapi.DeviceFlagsPCI
	}
	if d.Resettable {
		f |= uapi.DeviceFlagsReset
	}
	return f
}

func (r *Region) flags() uint32 {
	var f uint32
	if r.Readable {
		f |= uapi.RegionInfoFlagRead
	}
	if r.Writable {
		f |= uapi.RegionInfoFlagWrite
	}
	if r.Mappable {
		f |= uapi.RegionInfoFlagMmap
	}
	return f
}

func (q *IRQ) flags() uint32 {
	var f uint32
	for _, b := range []struct {
		on   bool
		flag uint32
	}{{q.Eventfd, uapi.IRQInfoEventfd}, {q.Maskable, uapi.IRQInfoMaskable}, {q.Automasked, uapi.IRQInfoAutomasked}, {q.NoResize, uapi.IRQInfoNoResize}} {
		if b.on {
			f |= b.flag
		}
	}
	return f
}

func (k *kernel) deviceIoctl(d *Device, req uint, arg []byte) (int, error) {
	switch req {
	case uapi.IoctlDeviceGetInfo:
		if len(arg) < 16 {
			return -1, unix.EINVAL
		}
		putU32(arg, 4, d.flags())
		putU32(arg, 8, uint32(len(d.Regions)))
		putU32(arg, 12, uint32(len(d.IRQs)))
		return 0, nil
	case uapi.IoctlDeviceGetRegionInfo:
		if len(arg) < 32 {
			return -1, unix.EINVAL
		}
		idx := u32(arg, 8)
		if idx >= uint32(len(d.Regions)) || idx == uapi.PCIVGARegionIndex {
			return -1, unix.EINVAL
		}
		r := &d.Regions[idx]
		fixed := uapi.Encode(&uapi.RegionInfo{Argsz: u32(arg, 0), Flags: r.flags(), Index: idx, Size: r.Size, Offset: uint64(idx) << regionShift})
		answerInfo(arg, fixed, chain(32, r.Caps), uapi.RegionInfoFlagCaps, 12)
		return 0, nil
	case uapi.IoctlDeviceGetIRQInfo:
		if len(arg) < 16 {
			return -1, unix.EINVAL
		}
		idx := u32(arg, 8)
		if idx >= uint32(len(d.IRQs)) {
			return -1, unix.EINVAL
		}
		putU32(arg, 4, d.IRQs[idx].flags())
		putU32(arg, 12, d.IRQs[idx].Count)
		return 0, nil
	case uapi.IoctlDeviceSetIRQs:
		return k.setIRQs(d, arg)
	case uapi.IoctlDeviceReset:
		if !d.Resettable {
			return -1, unix.EINVAL
		}
		if err := k.failure(IoctlReset); err != nil {
			return -1, err
		}
		d.resets++
		return 0, nil
	}
	return -1, unix.ENOTTY
}

// setIRQs is VFIO_DEVICE_SET_IRQS with ACTION_TRIGGER: eventfds bound to
// an index, the index disabled (DATA_NONE, count 0), or a loopback trigger
// of enabled vectors (DATA_NONE).
func (k *kernel) setIRQs(d *Device, arg []byte) (int, error) {
	var s uapi.IRQSet
	if err := uapi.Decode(arg, &s); err != nil || int(s.Argsz) != len(arg) {
		return -1, unix.EINVAL
	}
	if s.Index >= uint32(len(d.IRQs)) || s.Flags&uapi.IRQSetActionTrigger == 0 {
		return -1, unix.EINVAL
	}
	info := d.IRQs[s.Index]
	idx := int(s.Index)
	data := arg[20:]
	switch {
	case s.Flags&uapi.IRQSetDataNone != 0 && s.Count == 0:
		if err := k.failure(IoctlSetIRQs); err != nil {
			return -1, err
		}
		delete(d.enabled, idx)
		return 0, nil
	case s.Flags&uapi.IRQSetDataNone != 0:
		fds, ok := d.enabled[idx]
		if !ok || uint64(s.Start)+uint64(s.Count) > uint64(len(fds)) {
			return -1, unix.EINVAL
		}
		if err := k.failure(IoctlSetIRQs); err != nil {
			return -1, err
		}
		for _, fd := range fds[s.Start : s.Start+s.Count] {
			if fd >= 0 {
				if err := signal(int(fd)); err != nil {
					k.t.Errorf("vfiotest: %v", err)
				}
			}
		}
		return 0, nil
	case s.Flags&uapi.IRQSetDataEventfd != 0:
		if len(data) != 4*int(s.Count) || s.Start != 0 || s.Count > info.Count {
			return -1, unix.EINVAL
		}
		if _, on := d.enabled[idx]; on {
			return -1, unix.EINVAL // changing vectors in place is not modelled
		}
		fds := make([]int32, s.Count)
		for i := range fds {
			fds[i] = int32(u32(data, 4*i))
			var st unix.Stat_t
			if fds[i] >= 0 && unix.Fstat(int(fds[i]), &st) != nil {
				return -1, unix.EBADF
			}
		}
		if err := k.failure(IoctlSetIRQs); err != nil {
			return -1, err
		}
		d.enabled[idx] = fds
		return 0, nil
	}
	return -1, unix.EINVAL
}

// signal adds one to an eventfd, as the kernel does when an interrupt
// comes.
func signal(fd int) error {
	one := [8]byte{1}
	if _, err := unix.Write(fd, one[:]); err != nil {
		return fmt.Errorf("signal eventfd %d: %w", fd, err)
	}
	return nil
}
