package vfio

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma/pci"
	"github.com/vfrdma/vfrdma/vfio/internal/uapi"
)

// Path is the kernel interface Open takes a device through.
type Path string

// The paths (Options.Path).
const (
	// PathAuto takes the device cdev where the kernel offers it (the
	// function has a vfio-dev node in sysfs and /dev/iommu exists and
	// opens) and the group otherwise.
	PathAuto Path = ""
	// PathCDev takes the device through its cdev (/dev/vfio/devices/vfioN,
	// Linux 6.6+) with DMA mapped through iommufd (/dev/iommu).
	PathCDev Path = "cdev"
	// PathGroup takes the device through its IOMMU group (/dev/vfio/N) and
	// a type1 container (/dev/vfio/vfio).
	PathGroup Path = "group"
)

func (p Path) String() string {
	if p == PathAuto {
		return "auto"
	}
	return string(p)
}

// ParsePath parses "auto" (or ""), "cdev" or "group".
func ParsePath(s string) (Path, error) {
	switch s {
	case "", "auto":
		return PathAuto, nil
	case "cdev", "group":
		return Path(s), nil
	}
	return PathAuto, fmt.Errorf("%w: VFIO path %q: want auto, cdev or group", ErrNotSupported, s)
}

// IOMMUFD is the IOMMUInfo.Type of a Container on the cdev path: an
// iommufd IOAS, not a VFIO IOMMU model (it is no VFIO_CHECK_EXTENSION
// number, and Options.IOMMU does not take it).
const IOMMUFD IOMMUType = 1 << 31

// defaultIOMMUDev is iommufd's node.
const defaultIOMMUDev = "/dev/iommu"

// OpenIOMMUFD opens /dev/iommu and allocates an IOAS (IOMMU_IOAS_ALLOC):
// the cdev path's Container. Its IOMMU is there once the first device is
// attached (Group.OpenDevice), and its IOVA window is what the kernel then
// reports for the IOAS (IOMMU_IOAS_IOVA_RANGES), read again after every
// attach. Its groups hold no node: Container.OpenGroup names the group, and
// Group.OpenDevice opens, binds and attaches each device through its own
// cdev. Close destroys the IOAS (IOMMU_DESTROY) after closing the devices
// and unmapping what is left.
func OpenIOMMUFD(opts *Options) (*Container, error) {
	o := opts.withDefaults()
	const op = "open"
	fd, err := o.kernel.Open(o.IOMMUDev)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, opErr(op, "iommufd", wrapf(ErrNoIOMMUFD, err, "no %s", o.IOMMUDev))
		}
		return nil, opErr(op, "iommufd", fmt.Errorf("open %s: %w", o.IOMMUDev, permission(err, o.IOMMUDev)))
	}
	ioas, err := uapi.IOASAllocate(o.kernel, fd)
	if err != nil {
		_ = o.kernel.Close(fd)
		return nil, opErr(op, "iommufd", fmt.Errorf("IOMMU_IOAS_ALLOC: %w", err))
	}
	c := &Container{k: o.kernel, opts: o, fd: fd, iommufd: true, ioas: ioas, want: IOMMUFD,
		maps: map[uint64]Mapping{}, bufs: map[*DMABuffer]struct{}{}}
	return c, nil
}

// Path returns the path the container serves: PathCDev for an iommufd
// IOAS (OpenIOMMUFD), PathGroup for a type1 container (OpenContainer).
func (c *Container) Path() Path {
	if c.iommufd {
		return PathCDev
	}
	return PathGroup
}

// cdevNode returns the name of name's VFIO device cdev ("vfio3") from
// sysfs (bus/pci/devices/<name>/vfio-dev/), or "" when it has none.
func cdevNode(sysfsRoot, name string) (string, error) {
	dir := filepath.Join(sysfsRoot, "bus/pci/devices", name, "vfio-dev")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "vfio") {
			return e.Name(), nil
		}
	}
	return "", nil
}

func errNoCDev(name string, group int) error {
	return wrapf(ErrNoCDev, nil,
		"%s has no vfio-dev node in sysfs: the kernel has no VFIO device cdev (CONFIG_VFIO_DEVICE_CDEV, Linux 6.6+) or %s is not bound to vfio-pci (pvctl bind, pci.Bus.BindGroup of IOMMU group %d); or take the group path (Options.Path group, pvctl --vfio group)",
		name, name, group)
}

// openCDevLocked opens the device called name of group g through its cdev, binds
// it to the container's iommufd and attaches it to the IOAS; c.mu is held.
func (g *Group) openCDevLocked(name string) (*Device, error) {
	c := g.c
	addr, err := pci.ParseAddr(name)
	if err != nil {
		return nil, err
	}
	f, err := pci.NewBus(c.opts.SysfsRoot).Lookup(addr)
	if err != nil {
		return nil, err
	}
	if f.IOMMUGroup != g.n {
		return nil, fmt.Errorf("%w: %s is in IOMMU group %d, not %d", ErrRange, name, f.IOMMUGroup, g.n)
	}
	node, err := cdevNode(c.opts.SysfsRoot, name)
	if err != nil {
		return nil, fmt.Errorf("read %s's vfio-dev in sysfs: %w", name, err)
	}
	if node == "" {
		return nil, errNoCDev(name, g.n)
	}
	path := filepath.Join(c.opts.DevDir, "devices", node)
	fd, err := c.k.Open(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, wrapf(ErrNoCDev, err, "sysfs names %s for %s but %s does not exist (is devtmpfs mounted on /dev?)", node, name, path)
	case err != nil:
		return nil, fmt.Errorf("open %s: %w", path, permission(err, path))
	}
	d := &Device{g: g, name: name, fd: fd, cdev: node, vectors: map[int][]*Vector{}}
	if err := c.bindLocked(d); err != nil {
		_ = c.k.Close(fd)
		return nil, err
	}
	if err := d.readInfo(); err != nil {
		_ = c.k.Close(fd)
		return nil, err
	}
	return d, nil
}

// bindLocked binds d's cdev to the iommufd, attaches it to the IOAS and
// reads the IOAS's window again; c.mu is held.
func (c *Container) bindLocked(d *Device) error {
	g := d.g
	if _, err := uapi.BindIOMMUFD(c.k, d.fd, c.fd); err != nil {
		switch {
		case errors.Is(err, unix.EBUSY):
			return wrapf(ErrBusy, err, "VFIO_DEVICE_BIND_IOMMUFD: IOMMU group %d is held through the group interface (/dev/vfio/%d) by another process, or by a group-path Open in this one; close that first", g.n, g.n)
		case errors.Is(err, unix.EINVAL):
			return wrapf(ErrBusy, err, "VFIO_DEVICE_BIND_IOMMUFD: %s is already bound to an iommufd (opened through its cdev by another process, or by another Open in this one); close that first", d.name)
		case errors.Is(err, unix.EPERM):
			if v := c.viability(g.n); !strings.Contains(v, "sysfs shows none") {
				return fmt.Errorf("%w: VFIO_DEVICE_BIND_IOMMUFD: %w: %s", ErrGroupNotViable, err, v)
			}
			return fmt.Errorf("VFIO_DEVICE_BIND_IOMMUFD: %w (another member of IOMMU group %d is owned by another iommufd (another process), or the platform cannot isolate MSI: in QEMU use -device intel-iommu,intremap=on; on hardware enable interrupt remapping, or load iommufd with allow_unsafe_interrupts=1)", err, g.n)
		}
		return fmt.Errorf("VFIO_DEVICE_BIND_IOMMUFD: %w", err)
	}
	if _, err := uapi.AttachIOMMUFDPT(c.k, d.fd, c.ioas); err != nil {
		return fmt.Errorf("VFIO_DEVICE_ATTACH_IOMMUFD_PT to IOAS %d: %w", c.ioas, err)
	}
	if err := c.readIOASInfoLocked(); err != nil {
		return err
	}
	c.iommu = IOMMUFD
	return nil
}

// readIOASInfoLocked reads the IOAS's usable IOVA ranges and alignment and
// narrows the IOVA allocator to them; c.mu is held.
func (c *Container) readIOASInfoLocked() error {
	rs, align, err := uapi.IOASRanges(c.k, c.fd, c.ioas)
	if err != nil {
		return fmt.Errorf("IOMMU_IOAS_IOVA_RANGES: %w", err)
	}
	if len(rs) == 0 {
		return fmt.Errorf("IOMMU_IOAS_IOVA_RANGES: IOAS %d reports no usable IOVA range", c.ioas)
	}
	if align == 0 || align&(align-1) != 0 || align > 1<<30 {
		return fmt.Errorf("IOMMU_IOAS_IOVA_RANGES: implausible IOVA alignment %#x", align)
	}
	info := IOMMUInfo{Type: IOMMUFD, PageSizes: align, DMAAvail: -1}
	for _, r := range rs {
		if r.Last < r.Start {
			return fmt.Errorf("IOMMU_IOAS_IOVA_RANGES: range %#x-%#x ends before it starts", r.Start, r.Last)
		}
		info.Ranges = append(info.Ranges, IOVARange{Start: r.Start, End: r.Last})
	}
	c.info = info
	if c.alloc == nil {
		c.page = max(info.MinPageSize(), uint64(os.Getpagesize()))
		c.alloc = newIOVAAllocator(info.Ranges, c.opts.IOVABase, c.opts.IOVALimit, c.page)
		return nil
	}
	c.alloc.restrict(info.Ranges)
	return nil
}

// ioasMapLocked maps mem at iova in the IOAS; c.mu is held and the
// arguments are checked.
func (c *Container) ioasMapLocked(mem []byte, iova uint64) error {
	size := uint64(len(mem))
	err := uapi.IOASMapFixed(c.k, c.fd, c.ioas, mem, iova, uapi.IOASMapReadable|uapi.IOASMapWriteable)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.ENOMEM):
		return memlockError("iommufd could not pin", int(size), err)
	case errors.Is(err, unix.EFAULT):
		return fmt.Errorf("IOMMU_IOAS_MAP at IOVA %#x, %#x bytes: %w (iommufd cannot pin this memory: map anonymous memory from AllocMemory, not a device BAR or other VM_PFNMAP memory)", iova, size, err)
	}
	return fmt.Errorf("IOMMU_IOAS_MAP at IOVA %#x, %#x bytes: %w", iova, size, err)
}

// closeIOASLocked destroys the IOAS; c.mu is held.
func (c *Container) closeIOASLocked() error {
	if err := uapi.IOMMUDestroyObject(c.k, c.fd, c.ioas); err != nil {
		return fmt.Errorf("IOMMU_DESTROY IOAS %d: %w", c.ioas, err)
	}
	return nil
}

// choosePath resolves Options.Path for f: PathAuto takes the cdev when f
// has a vfio-dev node and iommufd opens (it is there and this process may
// open it), the group otherwise. It returns the container for the path
// chosen.
func choosePath(o *Options, f pci.Function) (*Container, error) {
	want := o.Path
	if want == PathAuto {
		p, err := ParsePath(envPath)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", envPathVar, err)
		}
		want = p
	}
	switch want {
	case PathGroup:
		return OpenContainer(o)
	case PathCDev:
		node, err := cdevNode(o.SysfsRoot, f.Addr.String())
		if err != nil {
			return nil, opErr("open", f.Addr.String(), err)
		}
		if node == "" {
			return nil, opErr("open", f.Addr.String(), errNoCDev(f.Addr.String(), f.IOMMUGroup))
		}
		c, err := OpenIOMMUFD(o)
		if errors.Is(err, ErrNoIOMMUFD) {
			return nil, fmt.Errorf("%w (the cdev path was asked for: load iommufd, or take the group path: Options.Path group, pvctl --vfio group)", err)
		}
		return c, err
	case PathAuto:
		if node, err := cdevNode(o.SysfsRoot, f.Addr.String()); err != nil || node == "" {
			return OpenContainer(o)
		}
		c, err := OpenIOMMUFD(o)
		if errors.Is(err, ErrNoIOMMUFD) || errors.Is(err, fs.ErrPermission) {
			return OpenContainer(o)
		}
		return c, err
	}
	_, err := ParsePath(string(want))
	return nil, opErr("open", f.Addr.String(), err)
}
