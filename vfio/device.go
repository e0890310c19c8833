package vfio

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma/pci"
	"github.com/vfrdma/vfrdma/vfio/internal/uapi"
)

// vfio-pci region indexes.
const (
	RegionBAR0   = uapi.PCIBAR0RegionIndex
	RegionBAR1   = RegionBAR0 + 1
	RegionBAR2   = RegionBAR0 + 2
	RegionBAR3   = RegionBAR0 + 3
	RegionBAR4   = RegionBAR0 + 4
	RegionBAR5   = uapi.PCIBAR5RegionIndex
	RegionROM    = uapi.PCIROMRegionIndex
	RegionConfig = uapi.PCIConfigRegionIndex
	RegionVGA    = uapi.PCIVGARegionIndex
)

// vfio-pci IRQ indexes.
const (
	IRQINTx = uapi.PCIINTxIRQIndex
	IRQMSI  = uapi.PCIMSIIRQIndex
	IRQMSIX = uapi.PCIMSIXIRQIndex
	IRQErr  = uapi.PCIErrIRQIndex
	IRQReq  = uapi.PCIReqIRQIndex
)

// PCI configuration space: the command register and its bits.
const (
	ConfigCommand    = 0x04
	CommandIO        = 0x0001
	CommandMemory    = 0x0002
	CommandBusMaster = 0x0004
)

// DeviceInfo is what VFIO reports about a device.
type DeviceInfo struct {
	Flags      uint32 // VFIO_DEVICE_FLAGS_*
	NumRegions int    // highest region index + 1
	NumIRQs    int    // highest IRQ index + 1
	PCI        bool   // a vfio-pci device
	Resettable bool   // VFIO_DEVICE_RESET works
}

// Area is a part of a region, offsets from the region's start.
type Area struct {
	Offset, Size uint64
}

// Cap is a raw VFIO capability from an info buffer, header included.
type Cap struct {
	ID, Version uint16
	Data        []byte
}

// RegionInfo describes one device region (a BAR, the ROM, config space).
type RegionInfo struct {
	Index  int
	Size   uint64
	Offset uint64 // where the region starts in the device fd
	Flags  uint32 // VFIO_REGION_INFO_FLAG_*

	Readable, Writable, Mappable bool
	// SparseMmap, when not nil, lists the only areas that may be mapped.
	SparseMmap []Area
	// MSIXMappable says the MSI-X table in this region may be mapped too.
	MSIXMappable bool
	// Type and Subtype come from a region type capability (0 without one).
	Type, Subtype uint32
	// Caps is every capability the kernel reported, decoded or not.
	Caps []Cap
}

// IRQInfo describes one IRQ index.
type IRQInfo struct {
	Index      int
	Count      int // vectors in this index
	Flags      uint32
	Eventfd    bool // can signal an eventfd
	Maskable   bool
	Automasked bool // masked after each interrupt until unmasked (INTx)
	NoResize   bool // the vector count cannot change while enabled
}

type mapping struct {
	full []byte // as returned by mmap (page multiple)
	user []byte // what the caller got
}

// Device is a VFIO device: one PCI function. It is safe for concurrent use.
type Device struct {
	g    *Group
	name string
	fd   int
	cdev string // the cdev node ("vfio3") on the cdev path, "" on the group path

	info    DeviceInfo
	regions map[int]RegionInfo
	irqs    map[int]IRQInfo

	mu      sync.Mutex
	closed  bool
	maps    []mapping
	vectors map[int][]*Vector // by IRQ index
	owns    bool              // Open made the group and container for this device
}

// Open opens the PCI function at addr through VFIO, on the path
// Options.Path chooses (PathAuto: the cdev where the kernel offers it, the
// group otherwise). It finds the function's IOMMU group in sysfs; on the
// group path it opens a container and the group and gets the device from
// the group; on the cdev path it opens iommufd and an IOAS, and opens,
// binds and attaches the device through its cdev. The function must
// already be bound to vfio-pci (pci.Bus.BindGroup). Either way it returns
// the same Device, which owns its container and group: its Close closes
// them too.
func Open(addr pci.Addr, opts *Options) (*Device, error) {
	o := opts.withDefaults()
	f, err := pci.NewBus(o.SysfsRoot).Lookup(addr)
	if err != nil {
		return nil, opErr("open", addr.String(), err)
	}
	if f.IOMMUGroup < 0 {
		return nil, opErr("open", addr.String(), pci.ErrNoIOMMUGroup)
	}
	if !strings.Contains(f.Driver, "vfio") {
		drv := f.Driver
		if drv == "" {
			drv = "no driver"
		}
		return nil, opErr("open", addr.String(), wrapf(ErrNotBound, nil,
			"%v has %s: bind its IOMMU group %d to vfio-pci first (pci.Bus.BindGroup)", addr, drv, f.IOMMUGroup))
	}
	c, err := choosePath(&o, f)
	if err != nil {
		return nil, err
	}
	g, err := c.OpenGroup(f.IOMMUGroup)
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	d, err := g.OpenDevice(addr.String())
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	d.owns = true
	return d, nil
}

// readInfo reads device, region and IRQ information.
func (d *Device) readInfo() error {
	k := d.g.c.k
	raw, _, err := uapi.DeviceGetInfo(k, d.fd)
	if err != nil {
		return fmt.Errorf("VFIO_DEVICE_GET_INFO: %w", err)
	}
	d.info = DeviceInfo{
		Flags:      raw.Flags,
		NumRegions: int(raw.NumRegions),
		NumIRQs:    int(raw.NumIRQs),
		PCI:        raw.Flags&uapi.DeviceFlagsPCI != 0,
		Resettable: raw.Flags&uapi.DeviceFlagsReset != 0,
	}
	if !d.info.PCI {
		return wrapf(ErrNotSupported, nil, "not a vfio-pci device (flags %#x)", raw.Flags)
	}
	if d.info.NumRegions > 64 || d.info.NumIRQs > 64 {
		return fmt.Errorf("implausible device info: %d regions, %d IRQ indexes", d.info.NumRegions, d.info.NumIRQs)
	}
	d.regions = map[int]RegionInfo{}
	for i := range d.info.NumRegions {
		r, err := readRegion(k, d.fd, i)
		if errors.Is(err, unix.EINVAL) {
			continue // vfio-pci refuses indexes the device lacks (VGA)
		}
		if err != nil {
			return err
		}
		if r.Size > 0 {
			d.regions[i] = r
		}
	}
	d.irqs = map[int]IRQInfo{}
	for i := range d.info.NumIRQs {
		raw, err := uapi.DeviceGetIRQInfo(k, d.fd, uint32(i))
		if errors.Is(err, unix.EINVAL) {
			continue
		}
		if err != nil {
			return fmt.Errorf("VFIO_DEVICE_GET_IRQ_INFO %d: %w", i, err)
		}
		if raw.Count == 0 {
			continue
		}
		d.irqs[i] = IRQInfo{
			Index:      i,
			Count:      int(raw.Count),
			Flags:      raw.Flags,
			Eventfd:    raw.Flags&uapi.IRQInfoEventfd != 0,
			Maskable:   raw.Flags&uapi.IRQInfoMaskable != 0,
			Automasked: raw.Flags&uapi.IRQInfoAutomasked != 0,
			NoResize:   raw.Flags&uapi.IRQInfoNoResize != 0,
		}
	}
	return nil
}

func readRegion(k uapi.Kernel, fd, index int) (RegionInfo, error) {
	raw, buf, err := uapi.DeviceGetRegionInfo(k, fd, uint32(index))
	if err != nil {
		return RegionInfo{}, fmt.Errorf("VFIO_DEVICE_GET_REGION_INFO %d: %w", index, err)
	}
	r := RegionInfo{
		Index:    index,
		Size:     raw.Size,
		Offset:   raw.Offset,
		Flags:    raw.Flags,
		Readable: raw.Flags&uapi.RegionInfoFlagRead != 0,
		Writable: raw.Flags&uapi.RegionInfoFlagWrite != 0,
		Mappable: raw.Flags&uapi.RegionInfoFlagMmap != 0,
	}
	if raw.Flags&uapi.RegionInfoFlagCaps == 0 || raw.CapOffset == 0 {
		return r, nil
	}
	if err := r.parseCaps(buf, raw.CapOffset, binary.Size(raw)); err != nil {
		return RegionInfo{}, fmt.Errorf("VFIO_DEVICE_GET_REGION_INFO %d: %w", index, err)
	}
	return r, nil
}

// parseCaps decodes a region's capability chain into r.
func (r *RegionInfo) parseCaps(buf []byte, first uint32, fixed int) error {
	caps, err := uapi.ParseCaps(buf, first, fixed)
	if err != nil {
		return err
	}
	for _, c := range caps {
		r.Caps = append(r.Caps, Cap{ID: c.ID, Version: c.Version, Data: slices.Clone(c.Data)})
		switch c.ID {
		case uapi.RegionInfoCapSparseMmapID:
			areas, err := uapi.SparseMmapAreas(c)
			if err != nil {
				return err
			}
			r.SparseMmap = make([]Area, 0, len(areas))
			for _, a := range areas {
				if a.Size == 0 {
					continue
				}
				if a.Offset > r.Size || a.Size > r.Size-a.Offset {
					return fmt.Errorf("%w: sparse mmap area %#x+%#x outside the %#x-byte region", uapi.ErrBadCaps, a.Offset, a.Size, r.Size)
				}
				r.SparseMmap = append(r.SparseMmap, Area{Offset: a.Offset, Size: a.Size})
			}
		case uapi.RegionInfoCapTypeID:
			if r.Type, r.Subtype, err = uapi.RegionType(c); err != nil {
				return err
			}
		case uapi.RegionInfoCapMSIXMappableID:
			r.MSIXMappable = true
		}
	}
	return nil
}

// Name returns the device's name (its PCI address).
func (d *Device) Name() string { return d.name }

// Path returns the path the device was opened through: PathCDev or
// PathGroup.
func (d *Device) Path() Path { return d.g.c.Path() }

// CDev returns the device's cdev node ("vfio3", under /dev/vfio/devices/)
// on the cdev path, "" on the group path.
func (d *Device) CDev() string { return d.cdev }

// Group returns the group the device belongs to.
func (d *Device) Group() *Group { return d.g }

// Container returns the container the device's group is attached to; DMA
// memory for the device is mapped there.
func (d *Device) Container() *Container { return d.g.c }

// Info returns the device information read at open.
func (d *Device) Info() DeviceInfo { return d.info }

// Regions returns the implemented regions (size > 0), keyed by region
// index.
func (d *Device) Regions() map[int]RegionInfo { return maps.Clone(d.regions) }

// Region returns the region with the given index.
func (d *Device) Region(index int) (RegionInfo, bool) {
	r, ok := d.regions[index]
	return r, ok
}

// IRQs returns the IRQ indexes with at least one vector, keyed by index.
func (d *Device) IRQs() map[int]IRQInfo { return maps.Clone(d.irqs) }

// IRQ returns the IRQ index with the given number.
func (d *Device) IRQ(index int) (IRQInfo, bool) {
	i, ok := d.irqs[index]
	return i, ok
}

// Map maps size bytes of region index starting at off into memory and
// returns them; size 0 means to the end of the region. off must be page
// aligned; a region smaller than a page (a 256-byte BAR) maps as one page
// of which the first size bytes are returned. When the region lists sparse
// mmap areas the range must lie inside one of them. The mapping is removed
// by Unmap or by Close; using the slice afterwards faults.
func (d *Device) Map(index int, off, size uint64) ([]byte, error) {
	const op = "map region"
	r, ok := d.regions[index]
	if !ok {
		return nil, opErr(op, d.name, wrapf(ErrRange, nil, "the device has no region %d", index))
	}
	if !r.Mappable {
		return nil, opErr(op, d.name, wrapf(ErrNotSupported, nil, "region %d cannot be mmap'd (use ReadRegion/WriteRegion)", index))
	}
	if off > r.Size {
		return nil, opErr(op, d.name, wrapf(ErrRange, nil, "offset %#x past the end of region %d (%#x bytes)", off, index, r.Size))
	}
	if size == 0 {
		size = r.Size - off
	}
	if size > r.Size-off {
		return nil, opErr(op, d.name, wrapf(ErrRange, nil, "%#x bytes at %#x do not fit region %d (%#x bytes)", size, off, index, r.Size))
	}
	page := uint64(os.Getpagesize())
	if off%page != 0 {
		return nil, opErr(op, d.name, wrapf(ErrAlignment, nil, "offset %#x is not page aligned", off))
	}
	if r.SparseMmap != nil && !slices.ContainsFunc(r.SparseMmap, func(a Area) bool {
		return off >= a.Offset && off+size <= a.Offset+a.Size
	}) {
		return nil, opErr(op, d.name, wrapf(ErrRange, nil, "%#x bytes at %#x of region %d are not inside one mmap-able area %v", size, off, index, r.SparseMmap))
	}
	length := alignUp(size, page)
	prot := 0
	if r.Readable {
		prot |= unix.PROT_READ
	}
	if r.Writable {
		prot |= unix.PROT_WRITE
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, opErr(op, d.name, ErrClosed)
	}
	mem, err := unix.Mmap(d.fd, int64(r.Offset+off), int(length), prot, unix.MAP_SHARED)
	if err != nil {
		return nil, opErr(op, d.name, fmt.Errorf("mmap region %d at %#x, %#x bytes: %w", index, off, length, err))
	}
	m := mapping{full: mem, user: mem[:size:size]}
	d.maps = append(d.maps, m)
	return m.user, nil
}

// Unmap removes a mapping returned by Map.
func (d *Device) Unmap(b []byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return opErr("unmap region", d.name, ErrClosed)
	}
	i := slices.IndexFunc(d.maps, func(m mapping) bool {
		return len(b) == len(m.user) && len(b) > 0 && &b[0] == &m.user[0]
	})
	if i < 0 {
		return opErr("unmap region", d.name, wrapf(ErrRange, nil, "not a mapping made by Map on this device"))
	}
	m := d.maps[i]
	d.maps = slices.Delete(d.maps, i, i+1)
	return opErr("unmap region", d.name, unix.Munmap(m.full))
}

// ReadRegion reads len(b) bytes at off of region index through the device
// fd (for regions that cannot be mapped, and config space).
func (d *Device) ReadRegion(index int, off uint64, b []byte) error {
	return d.regionIO("read region", index, off, b, false)
}

// WriteRegion writes b at off of region index through the device fd.
func (d *Device) WriteRegion(index int, off uint64, b []byte) error {
	return d.regionIO("write region", index, off, b, true)
}

func (d *Device) regionIO(op string, index int, off uint64, b []byte, write bool) error {
	r, ok := d.regions[index]
	if !ok {
		return opErr(op, d.name, wrapf(ErrRange, nil, "the device has no region %d", index))
	}
	if (write && !r.Writable) || (!write && !r.Readable) {
		return opErr(op, d.name, wrapf(ErrNotSupported, nil, "region %d does not allow this access (flags %#x)", index, r.Flags))
	}
	n := uint64(len(b))
	if off > r.Size || n > r.Size-off {
		return opErr(op, d.name, wrapf(ErrRange, nil, "%d bytes at %#x do not fit region %d (%#x bytes)", n, off, index, r.Size))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return opErr(op, d.name, ErrClosed)
	}
	for len(b) > 0 {
		var k int
		var err error
		if write {
			k, err = unix.Pwrite(d.fd, b, int64(r.Offset+off))
		} else {
			k, err = unix.Pread(d.fd, b, int64(r.Offset+off))
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return opErr(op, d.name, fmt.Errorf("region %d at %#x: %w", index, off, err))
		}
		if k == 0 {
			return opErr(op, d.name, fmt.Errorf("region %d at %#x: short transfer", index, off))
		}
		b, off = b[k:], off+uint64(k)
	}
	return nil
}

// ReadConfig8 reads a byte of PCI configuration space.
func (d *Device) ReadConfig8(off uint64) (uint8, error) {
	var b [1]byte
	err := d.ReadRegion(RegionConfig, off, b[:])
	return b[0], err
}

// ReadConfig16 reads a little-endian 16-bit configuration register.
func (d *Device) ReadConfig16(off uint64) (uint16, error) {
	var b [2]byte
	err := d.ReadRegion(RegionConfig, off, b[:])
	return binary.LittleEndian.Uint16(b[:]), err
}

// ReadConfig32 reads a little-endian 32-bit configuration register.
func (d *Device) ReadConfig32(off uint64) (uint32, error) {
	var b [4]byte
	err := d.ReadRegion(RegionConfig, off, b[:])
	return binary.LittleEndian.Uint32(b[:]), err
}

// WriteConfig8 writes a byte of configuration space.
func (d *Device) WriteConfig8(off uint64, v uint8) error {
	return d.WriteRegion(RegionConfig, off, []byte{v})
}

// WriteConfig16 writes a little-endian 16-bit configuration register.
func (d *Device) WriteConfig16(off uint64, v uint16) error {
	return d.WriteRegion(RegionConfig, off, binary.LittleEndian.AppendUint16(nil, v))
}

// WriteConfig32 writes a little-endian 32-bit configuration register.
func (d *Device) WriteConfig32(off uint64, v uint32) error {
	return d.WriteRegion(RegionConfig, off, binary.LittleEndian.AppendUint32(nil, v))
}

// EnableBusMaster sets Bus Master Enable in the command register (vfio-pci
// leaves it off when it takes a device; without it the device cannot DMA)
// and checks that it stuck. It returns the command register's new value.
func (d *Device) EnableBusMaster() (uint16, error) {
	cmd, err := d.ReadConfig16(ConfigCommand)
	if err != nil {
		return 0, err
	}
	if cmd&CommandBusMaster == 0 {
		if err := d.WriteConfig16(ConfigCommand, cmd|CommandBusMaster); err != nil {
			return 0, err
		}
		if cmd, err = d.ReadConfig16(ConfigCommand); err != nil {
			return 0, err
		}
	}
	if cmd&CommandBusMaster == 0 {
		return cmd, opErr("enable bus master", d.name, fmt.Errorf("the command register reads %#04x after setting bit 2", cmd))
	}
	return cmd, nil
}

// Reset resets the device through VFIO_DEVICE_RESET. Devices without a
// reset vfio-pci can use (FLR, PM reset, or a bus reset confined to the
// device) return an error wrapping ErrNotSupported; QEMU's pvrdma is one.
func (d *Device) Reset() error {
	if !d.info.Resettable {
		return opErr("reset", d.name, wrapf(ErrNotSupported, nil, "the device offers no reset to vfio-pci (no FLR, PM or confined bus reset)"))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return opErr("reset", d.name, ErrClosed)
	}
	return opErr("reset", d.name, uapi.DeviceReset(d.g.c.k, d.fd))
}

// Mappings returns how many region mappings are live (for leak checks).
func (d *Device) Mappings() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.maps)
}

// Close disables the device's interrupts and closes their eventfds, unmaps
// its regions and closes the device fd; for a Device from Open it then
// closes the group and container. It is idempotent.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	var errs []error
	for _, idx := range slices.Sorted(maps.Keys(d.vectors)) {
		errs = append(errs, d.disableLocked(idx))
	}
	for _, m := range d.maps {
		errs = append(errs, unix.Munmap(m.full))
	}
	d.maps = nil
	errs = append(errs, d.g.c.k.Close(d.fd))
	d.mu.Unlock()
	d.g.deviceClosed(d)
	if d.owns {
		errs = append(errs, d.g.c.Close())
	}
	return opErr("close", d.name, errors.Join(errs...))
}
