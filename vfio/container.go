package vfio

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma/pci"
	"github.com/vfrdma/vfrdma/vfio/internal/uapi"
)

// IOMMUType is a VFIO IOMMU model.
type IOMMUType uint32

// IOMMU models this package drives.
const (
	Type1   IOMMUType = uapi.Type1IOMMU
	Type1v2 IOMMUType = uapi.Type1v2IOMMU
)

func (t IOMMUType) String() string {
	switch t {
	case Type1:
		return "type1"
	case Type1v2:
		return "type1v2"
	case IOMMUFD:
		return "iommufd"
	}
	return "iommu type " + strconv.Itoa(int(t))
}

// Options configure OpenContainer and Open. The zero value (or nil) means
// defaults.
type Options struct {
	// DevDir holds the VFIO device nodes (the device cdevs under its
	// devices/); "" means "/dev/vfio".
	DevDir string
	// IOMMUDev is iommufd's node; "" means "/dev/iommu".
	IOMMUDev string
	// Path chooses how Open takes the device: PathAuto (the zero value)
	// takes its cdev where the kernel offers it and its group otherwise;
	// PathCDev and PathGroup insist.
	Path Path
	// SysfsRoot is the sysfs tree used to find a function's IOMMU group
	// and to name the members of a group that is not viable; "" means
	// "/sys".
	SysfsRoot string
	// IOMMU selects the IOMMU model; 0 means type1v2 when the kernel
	// offers it, else type1.
	IOMMU IOMMUType
	// IOVABase and IOVALimit bound the IOVA allocator's window
	// [IOVABase, IOVALimit); 0 means 1 MiB and 4 GiB.
	IOVABase, IOVALimit uint64
	// Kernel answers the package's opens, closes and ioctls of the VFIO
	// nodes; nil means the running kernel. A *vfiotest.Kernel (package
	// vfio/vfiotest) runs this package, and code above it, with no VFIO
	// on the machine.
	Kernel Kernel

	kernel uapi.Kernel // Kernel's implementation, or the real kernel (withDefaults)
}

// Kernel is the kernel side of VFIO as this package reaches it: every
// operation comes down to an open, a close or an ioctl on a VFIO node, and
// a Kernel answers them. The running kernel is the implementation Options
// uses when Kernel is nil; package vfiotest has the other, a fake. Only
// packages under vfio/ can implement Kernel: its method returns a type
// internal to them.
type Kernel interface {
	// VFIO returns the implementation of the system-call boundary.
	VFIO() uapi.Kernel
}

func (o *Options) withDefaults() Options {
	var r Options
	if o != nil {
		r = *o
	}
	if r.DevDir == "" {
		r.DevDir = "/dev/vfio"
	}
	if r.IOMMUDev == "" {
		r.IOMMUDev = defaultIOMMUDev
	}
	if r.SysfsRoot == "" {
		r.SysfsRoot = "/sys"
	}
	if r.IOVABase == 0 {
		r.IOVABase = defaultIOVABase
	}
	if r.IOVALimit == 0 {
		r.IOVALimit = defaultIOVALimit
	}
	if r.Kernel != nil {
		r.kernel = r.Kernel.VFIO()
	}
	if r.kernel == nil {
		r.kernel = uapi.Linux{}
	}
	return r
}

// IOMMUInfo describes the container's IOMMU once a group is attached.
type IOMMUInfo struct {
	Type      IOMMUType
	PageSizes uint64      // bitmap of supported IOMMU page sizes
	Ranges    []IOVARange // valid IOVA ranges; nil when the kernel reports none
	DMAAvail  int         // DMA mappings the kernel still accepts; -1 when not reported
}

// MinPageSize returns the smallest IOMMU page size (4096 when unknown).
func (i IOMMUInfo) MinPageSize() uint64 {
	if i.PageSizes == 0 {
		return 4096
	}
	return 1 << bits.TrailingZeros64(i.PageSizes)
}

// Mapping is one DMA mapping in the container's IOMMU.
type Mapping struct {
	IOVA  uint64
	Size  uint64
	Vaddr uint64
}

// Container is an IOMMU context holding groups and DMA mappings: on the
// group path a VFIO container (/dev/vfio/vfio, type1), on the cdev path an
// iommufd IOAS (/dev/iommu). It is safe for concurrent use.
type Container struct {
	k       uapi.Kernel
	opts    Options
	fd      int    // the container's fd, or the iommufd's
	iommufd bool   // the cdev path: fd is an iommufd, ioas the IOAS
	ioas    uint32 // the IOAS's ID

	mu     sync.Mutex
	closed bool
	want   IOMMUType // model to set when the first group attaches
	iommu  IOMMUType // model set; 0 while no group is attached
	info   IOMMUInfo
	page   uint64
	alloc  *iovaAllocator
	groups []*Group
	maps   map[uint64]Mapping // by IOVA
	bufs   map[*DMABuffer]struct{}
}

// OpenContainer opens /dev/vfio/vfio, checks the VFIO API version and picks
// the IOMMU model. The IOMMU itself is set when the first group is attached
// (OpenGroup).
func OpenContainer(opts *Options) (*Container, error) {
	o := opts.withDefaults()
	const op = "open"
	path := filepath.Join(o.DevDir, "vfio")
	fd, err := o.kernel.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, opErr(op, "container", wrapf(ErrNoVFIO, err, "no %s", path))
		}
		return nil, opErr(op, "container", fmt.Errorf("open %s: %w", path, permission(err, path)))
	}
	c := &Container{k: o.kernel, opts: o, fd: fd, maps: map[uint64]Mapping{}, bufs: map[*DMABuffer]struct{}{}}
	if err := c.probe(); err != nil {
		_ = o.kernel.Close(fd)
		return nil, opErr(op, "container", err)
	}
	return c, nil
}

func (c *Container) probe() error {
	v, err := uapi.GetAPIVersion(c.k, c.fd)
	if err != nil {
		return fmt.Errorf("VFIO_GET_API_VERSION: %w", err)
	}
	if v != uapi.APIVersion {
		return wrapf(ErrNotSupported, nil, "kernel VFIO API version %d, this package speaks %d", v, uapi.APIVersion)
	}
	cands := []IOMMUType{Type1v2, Type1}
	if c.opts.IOMMU != 0 {
		cands = []IOMMUType{c.opts.IOMMU}
	}
	for _, t := range cands {
		ok, err := uapi.CheckExtension(c.k, c.fd, uint32(t))
		if err != nil {
			return fmt.Errorf("VFIO_CHECK_EXTENSION %v: %w", t, err)
		}
		if ok {
			c.want = t
			return nil
		}
	}
	return wrapf(ErrNotSupported, nil, "the kernel offers no %v IOMMU backend (modprobe vfio_iommu_type1; it also needs an IOMMU: intel_iommu=on or a vIOMMU)", cands)
}

// IOMMUInfo returns what the kernel reported about the IOMMU when the first
// group was attached.
func (c *Container) IOMMUInfo() (IOMMUInfo, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return IOMMUInfo{}, opErr("IOMMU info", "container", ErrClosed)
	}
	if c.iommu == 0 {
		return IOMMUInfo{}, opErr("IOMMU info", "container", errNoIOMMU)
	}
	i := c.info
	i.Ranges = slices.Clone(i.Ranges)
	return i, nil
}

var errNoIOMMU = fmt.Errorf("%w: no IOMMU yet (it is set when the first group is attached, or on the cdev path the first device)", ErrNotSupported)

// OpenGroup opens IOMMU group n (/dev/vfio/N), checks that it is viable,
// attaches it to the container and, for the first group, sets the IOMMU.
// On the cdev path (OpenIOMMUFD) the group has no node and nothing is
// opened: the Group names the IOMMU group, and its OpenDevice opens, binds
// and attaches each device alone.
func (c *Container) OpenGroup(n int) (*Group, error) {
	dev := "group " + strconv.Itoa(n)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, opErr("open", dev, ErrClosed)
	}
	for _, g := range c.groups {
		if g.n == n {
			return nil, opErr("open", dev, wrapf(ErrBusy, nil, "group %d is already open in this container", n))
		}
	}
	if c.iommufd {
		g := &Group{c: c, n: n, fd: -1, dev: dev, cdev: true}
		c.groups = append(c.groups, g)
		return g, nil
	}
	path := filepath.Join(c.opts.DevDir, strconv.Itoa(n))
	fd, err := c.k.Open(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, opErr("open", dev, wrapf(ErrNotBound, err,
			"no %s: bind IOMMU group %d to vfio-pci first (pci.Bus.BindGroup)", path, n))
	case errors.Is(err, unix.EBUSY):
		return nil, opErr("open", dev, wrapf(ErrBusy, err,
			"%s is held by another process or container", path))
	case err != nil:
		return nil, opErr("open", dev, fmt.Errorf("open %s: %w", path, permission(err, path)))
	}
	g := &Group{c: c, n: n, fd: fd, dev: dev}
	if err := c.attach(g); err != nil {
		_ = c.k.Close(fd) // closing the group fd detaches it from the container
		if len(c.groups) == 0 {
			c.iommu = 0
		}
		return nil, opErr("open", dev, err)
	}
	c.groups = append(c.groups, g)
	return g, nil
}

// attach checks g and attaches it; c.mu is held.
func (c *Container) attach(g *Group) error {
	st, err := uapi.GroupGetStatus(c.k, g.fd)
	if err != nil {
		return fmt.Errorf("VFIO_GROUP_GET_STATUS: %w", err)
	}
	if st.Flags&uapi.GroupFlagsViable == 0 {
		return fmt.Errorf("%w: %s", ErrGroupNotViable, c.viability(g.n))
	}
	if st.Flags&uapi.GroupFlagsContainerSet != 0 {
		return wrapf(ErrBusy, nil, "group %d is already attached to a container", g.n)
	}
	if err := uapi.GroupSetContainer(c.k, g.fd, c.fd); err != nil {
		return fmt.Errorf("VFIO_GROUP_SET_CONTAINER: %w", err)
	}
	if c.iommu != 0 {
		return nil
	}
	if err := uapi.SetIOMMU(c.k, c.fd, uint32(c.want)); err != nil {
		if errors.Is(err, unix.EPERM) {
			return fmt.Errorf("VFIO_SET_IOMMU %v: %w (the IOMMU lacks interrupt remapping: in QEMU use -device intel-iommu,intremap=on; on hardware enable it, or load vfio_iommu_type1 with allow_unsafe_interrupts=1)", c.want, err)
		}
		return fmt.Errorf("VFIO_SET_IOMMU %v: %w", c.want, err)
	}
	c.iommu = c.want
	if err := c.readIOMMUInfo(); err != nil {
		return err
	}
	return nil
}

// viability names the members of group n that make it not viable.
func (c *Container) viability(n int) string {
	bus := pci.NewBus(c.opts.SysfsRoot)
	members, err := bus.Group(n)
	if err != nil {
		return fmt.Sprintf("group %d has a member bound to a non-VFIO driver (listing its members failed: %v)", n, err)
	}
	var bad []string
	for _, m := range members {
		if !m.KeepsGroupViable("vfio-pci") {
			bad = append(bad, fmt.Sprintf("%v (%04x:%04x) is bound to %s", m.Addr, m.Vendor, m.Device, m.Driver))
		}
	}
	if len(bad) == 0 {
		return fmt.Sprintf("group %d has a member bound to a non-VFIO driver (sysfs shows none now; retry)", n)
	}
	return fmt.Sprintf("group %d: %s; bind the whole group to vfio-pci (pci.Bus.BindGroup) or unbind those members",
		n, strings.Join(bad, "; "))
}

// readIOMMUInfo queries the IOMMU and builds the IOVA allocator; c.mu is
// held.
func (c *Container) readIOMMUInfo() error {
	raw, buf, err := uapi.IOMMUGetInfo(c.k, c.fd)
	if err != nil {
		return fmt.Errorf("VFIO_IOMMU_GET_INFO: %w", err)
	}
	info := IOMMUInfo{Type: c.iommu, DMAAvail: -1}
	if raw.Flags&uapi.IOMMUInfoPgsizes != 0 {
		info.PageSizes = raw.IOVAPgsizes
	}
	if raw.Flags&uapi.IOMMUInfoCaps != 0 && raw.CapOffset != 0 {
		caps, err := uapi.ParseCaps(buf, raw.CapOffset, binary.Size(raw))
		if err != nil {
			return fmt.Errorf("VFIO_IOMMU_GET_INFO: %w", err)
		}
		if cp, ok := uapi.Find(caps, uapi.IOMMUType1InfoCapIOVARangeID); ok {
			rs, err := uapi.IOVARanges(cp)
			if err != nil {
				return fmt.Errorf("VFIO_IOMMU_GET_INFO: %w", err)
			}
			info.Ranges = make([]IOVARange, len(rs))
			for i, r := range rs {
				info.Ranges[i] = IOVARange{Start: r.Start, End: r.End}
			}
		}
		if cp, ok := uapi.Find(caps, uapi.IOMMUType1InfoDMAAvailID); ok {
			n, err := uapi.DMAAvail(cp)
			if err != nil {
				return fmt.Errorf("VFIO_IOMMU_GET_INFO: %w", err)
			}
			info.DMAAvail = int(n)
		}
	}
	c.info = info
	c.page = max(info.MinPageSize(), uint64(os.Getpagesize()))
	if c.alloc == nil {
		c.alloc = newIOVAAllocator(info.Ranges, c.opts.IOVABase, c.opts.IOVALimit, c.page)
	}
	return nil
}

// MapDMA maps mem into the IOMMU at iova, readable and writable by the
// device. mem must be memory mapped outside the Go heap (AllocMemory, or
// the caller's own mmap) and stay mapped until UnmapDMA; its start and
// length, and iova, must be aligned to the IOMMU page size. iova should
// come from AllocIOVA (or lie outside the allocator's window) and must not
// equal the virtual address. Most callers want AllocDMA instead.
func (c *Container) MapDMA(mem []byte, iova uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return opErr("map DMA", "container", c.mapLocked(mem, iova))
}

func (c *Container) mapLocked(mem []byte, iova uint64) error {
	if c.closed {
		return ErrClosed
	}
	if c.iommu == 0 {
		return errNoIOMMU
	}
	size, va := uint64(len(mem)), uapi.Addr(mem)
	if size == 0 || size%c.page != 0 || va%c.page != 0 || iova%c.page != 0 {
		return wrapf(ErrAlignment, nil, "vaddr %#x, IOVA %#x and size %#x must be non-zero multiples of the IOMMU page size %#x", va, iova, size, c.page)
	}
	if iova+size < iova {
		return wrapf(ErrRange, nil, "IOVA %#x + size %#x wraps around", iova, size)
	}
	if iova == va {
		return wrapf(ErrRange, nil, "IOVA %#x equals the virtual address; IOVAs come from AllocIOVA, never from the process's addresses", iova)
	}
	if rs := c.info.Ranges; len(rs) > 0 && !slices.ContainsFunc(rs, func(r IOVARange) bool {
		return iova >= r.Start && iova+size-1 <= r.End
	}) {
		return wrapf(ErrRange, nil, "IOVA range %#x-%#x is not inside one of the IOMMU's valid ranges %s (what the kernel reports; take IOVAs from AllocIOVA, or narrow Options.IOVABase and IOVALimit into a range)", iova, iova+size-1, fmtRanges(rs))
	}
	for _, m := range c.maps {
		if iova < m.IOVA+m.Size && m.IOVA < iova+size {
			return wrapf(ErrRange, unix.EEXIST, "IOVA range %#x-%#x overlaps the mapping at %#x-%#x", iova, iova+size-1, m.IOVA, m.IOVA+m.Size-1)
		}
	}
	if c.iommufd {
		if err := c.ioasMapLocked(mem, iova); err != nil {
			return err
		}
	} else if err := uapi.IOMMUMapDMA(c.k, c.fd, mem, iova, uapi.DMAMapFlagRead|uapi.DMAMapFlagWrite); err != nil {
		switch {
		case errors.Is(err, unix.ENOMEM):
			return memlockError("the IOMMU could not pin", int(size), err)
		case errors.Is(err, unix.ENOSPC):
			return fmt.Errorf("VFIO_IOMMU_MAP_DMA: %w (too many DMA mappings: vfio_iommu_type1's dma_entry_limit; use fewer, larger buffers)", err)
		}
		return fmt.Errorf("VFIO_IOMMU_MAP_DMA at IOVA %#x, %#x bytes: %w", iova, size, err)
	}
	c.maps[iova] = Mapping{IOVA: iova, Size: size, Vaddr: va}
	if c.info.DMAAvail > 0 {
		c.info.DMAAvail--
	}
	return nil
}

func fmtRanges(rs []IOVARange) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = fmt.Sprintf("%#x-%#x", r.Start, r.End)
	}
	return "[" + strings.Join(s, " ") + "]"
}

// UnmapDMA removes the mapping made by MapDMA at iova; size must be the
// mapping's size.
func (c *Container) UnmapDMA(iova, size uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return opErr("unmap DMA", "container", ErrClosed)
	}
	m, ok := c.maps[iova]
	if !ok || m.Size != size {
		return opErr("unmap DMA", "container", wrapf(ErrRange, nil, "no mapping of %#x bytes at IOVA %#x", size, iova))
	}
	return opErr("unmap DMA", "container", c.unmapLocked(m))
}

func (c *Container) unmapLocked(m Mapping) error {
	delete(c.maps, m.IOVA)
	if c.info.DMAAvail >= 0 {
		c.info.DMAAvail++
	}
	req, unmap := "VFIO_IOMMU_UNMAP_DMA", uapi.IOMMUUnmapDMA
	if c.iommufd {
		req = "IOMMU_IOAS_UNMAP"
		unmap = func(k uapi.Kernel, fd int, iova, size uint64) (uint64, error) {
			return uapi.IOASUnmapRange(k, fd, c.ioas, iova, size)
		}
	}
	n, err := unmap(c.k, c.fd, m.IOVA, m.Size)
	if err != nil {
		return fmt.Errorf("%s at IOVA %#x: %w", req, m.IOVA, err)
	}
	if n != m.Size {
		return fmt.Errorf("%s at IOVA %#x unmapped %#x bytes, not %#x", req, m.IOVA, n, m.Size)
	}
	return nil
}

// Mappings returns the DMA mappings currently in the IOMMU, sorted by IOVA
// (for diagnostics and leak checks).
func (c *Container) Mappings() []Mapping {
	c.mu.Lock()
	defer c.mu.Unlock()
	ms := make([]Mapping, 0, len(c.maps))
	for _, m := range c.maps {
		ms = append(ms, m)
	}
	slices.SortFunc(ms, func(a, b Mapping) int {
		if a.IOVA < b.IOVA {
			return -1
		}
		return 1
	})
	return ms
}

// AllocIOVA reserves size bytes of IOVA space aligned to align (0 means the
// IOMMU page size) and returns its start. size must be a multiple of the
// IOMMU page size.
func (c *Container) AllocIOVA(size, align uint64) (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	iova, err := c.allocIOVALocked(size, align)
	return iova, opErr("allocate IOVA", "container", err)
}

func (c *Container) allocIOVALocked(size, align uint64) (uint64, error) {
	if c.closed {
		return 0, ErrClosed
	}
	if c.alloc == nil {
		return 0, errNoIOMMU
	}
	if size == 0 || size%c.page != 0 || (align != 0 && align&(align-1) != 0) {
		return 0, wrapf(ErrAlignment, nil, "size %#x must be a non-zero multiple of the IOMMU page size %#x, align %#x a power of two", size, c.page, align)
	}
	iova, ok := c.alloc.alloc(size, align)
	if !ok {
		return 0, wrapf(ErrIOVASpace, nil, "no free IOVA range of %#x bytes aligned to %#x (%#x bytes free in the window [%#x, %#x))",
			size, max(align, c.page), c.alloc.freeBytes(), c.opts.IOVABase, c.opts.IOVALimit)
	}
	return iova, nil
}

// FreeIOVA returns a range obtained from AllocIOVA.
func (c *Container) FreeIOVA(iova, size uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return opErr("free IOVA", "container", ErrClosed)
	}
	if c.alloc == nil {
		return opErr("free IOVA", "container", errNoIOMMU)
	}
	return opErr("free IOVA", "container", c.alloc.release(iova, size))
}

// Close closes the container and everything in it, in order: every device
// of every group (interrupts off, regions unmapped, device fd closed), then
// every DMA mapping still in the IOMMU (DMA buffers still open are unmapped
// and freed: their Mem must no longer be used), then the groups, then (on
// the cdev path) the IOAS, then the container fd (or the iommufd). It is
// idempotent; errors from all steps are joined.
func (c *Container) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	groups := slices.Clone(c.groups)
	c.mu.Unlock()

	var errs []error
	for _, g := range groups {
		for _, d := range g.openDevices() {
			errs = append(errs, d.Close())
		}
	}

	c.mu.Lock()
	bufs := make([]*DMABuffer, 0, len(c.bufs))
	for b := range c.bufs {
		bufs = append(bufs, b)
	}
	for _, b := range bufs {
		errs = append(errs, c.releaseBufferLocked(b))
	}
	for _, m := range c.maps {
		if c.iommu != 0 {
			errs = append(errs, c.unmapLocked(m))
		}
	}
	c.maps = map[uint64]Mapping{}
	c.groups = nil
	c.mu.Unlock()
	for _, b := range bufs {
		errs = append(errs, b.mem.Close())
	}

	for _, g := range groups {
		errs = append(errs, g.closeFD())
	}
	if c.iommufd {
		c.mu.Lock()
		errs = append(errs, c.closeIOASLocked())
		c.mu.Unlock()
	}
	errs = append(errs, c.k.Close(c.fd))
	return opErr("close", "container", errors.Join(errs...))
}

// groupClosed is called by Group.Close with c.mu held. When the last group
// leaves a type1 container, the kernel drops the IOMMU and all its mappings
// with it; an IOAS keeps its mappings until it is destroyed.
func (c *Container) groupClosedLocked(g *Group) {
	c.groups = slices.DeleteFunc(c.groups, func(x *Group) bool { return x == g })
	if len(c.groups) == 0 && !c.closed && !c.iommufd {
		c.iommu = 0
		clear(c.maps)
	}
}
