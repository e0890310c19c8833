package pci

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	upci "github.com/u-root/u-root/pkg/pci"
)

// Function is one PCI function as sysfs describes it.
type Function struct {
	Addr       Addr
	Vendor     uint16
	Device     uint16
	Class      uint32 // 24-bit class code: base class, subclass, programming interface
	Driver     string // bound driver, "" when none
	IOMMUGroup int    // IOMMU group number, -1 when the function has none
}

// String formats f like "0000:00:10.1 15ad:0820 (vfio-pci)".
func (f Function) String() string {
	drv := f.Driver
	if drv == "" {
		drv = "no driver"
	}
	return fmt.Sprintf("%v %04x:%04x (%s)", f.Addr, f.Vendor, f.Device, drv)
}

// IsBridge reports whether f is a PCI-to-PCI bridge (class 0x0604).
func (f Function) IsBridge() bool { return f.Class>>8 == 0x0604 }

// WriteFunc writes data to a sysfs attribute file in one write. Bus uses it
// for driver_override, bind, unbind and drivers_probe.
type WriteFunc func(path string, data []byte) error

// Bus reads and changes PCI state through a sysfs tree.
type Bus struct {
	root  string
	write WriteFunc
}

// NewBus returns a Bus over the sysfs tree at sysfsRoot ("" means "/sys").
func NewBus(sysfsRoot string) *Bus { return NewBusWith(sysfsRoot, nil) }

// NewBusWith is NewBus with the sysfs writes going through write instead of
// the file system (nil means the file system). It exists for fakes that
// emulate the kernel's side of those writes (package pcitest).
func NewBusWith(sysfsRoot string, write WriteFunc) *Bus {
	if sysfsRoot == "" {
		sysfsRoot = "/sys"
	}
	if write == nil {
		write = writeFile
	}
	return &Bus{root: sysfsRoot, write: write}
}

func writeFile(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func (b *Bus) devicesDir() string { return filepath.Join(b.root, "bus", "pci", "devices") }

func (b *Bus) deviceDir(a Addr) string { return filepath.Join(b.devicesDir(), a.String()) }

func (b *Bus) driverDir(name string) string {
	return filepath.Join(b.root, "bus", "pci", "drivers", name)
}

func (b *Bus) groupDevicesDir(group int) string {
	return filepath.Join(b.root, "kernel", "iommu_groups", strconv.Itoa(group), "devices")
}

// List returns every PCI function, sorted by address.
func (b *Bus) List() ([]Function, error) {
	ents, err := os.ReadDir(b.devicesDir())
	if err != nil {
		return nil, &OpError{Op: "list", Dev: b.devicesDir(), Err: err}
	}
	fns := make([]Function, 0, len(ents))
	for _, e := range ents {
		a, err := ParseAddr(e.Name())
		if err != nil {
			continue // not a function directory
		}
		f, err := b.read(a)
		if err != nil {
			return nil, &OpError{Op: "list", Dev: a.String(), Err: err}
		}
		fns = append(fns, f)
	}
	slices.SortFunc(fns, func(x, y Function) int { return x.Addr.Compare(y.Addr) })
	return fns, nil
}

// read reads one function's directory.
func (b *Bus) read(a Addr) (Function, error) {
	dir := b.deviceDir(a)
	p, err := upci.OnePCI(dir)
	if err != nil {
		return Function{}, err
	}
	f := Function{Addr: a, Vendor: p.Vendor, Device: p.Device, Class: p.Class, IOMMUGroup: -1}
	if f.Driver, err = linkBase(filepath.Join(dir, "driver")); err != nil {
		return Function{}, err
	}
	g, err := linkBase(filepath.Join(dir, "iommu_group"))
	if err != nil {
		return Function{}, err
	}
	if g != "" {
		if f.IOMMUGroup, err = strconv.Atoi(g); err != nil || f.IOMMUGroup < 0 {
			return Function{}, fmt.Errorf("iommu_group link points at %q, not a group number", g)
		}
	}
	return f, nil
}

// linkBase returns the last element of the target of the symlink at path, or
// "" when there is no such link.
func linkBase(path string) (string, error) {
	t, err := os.Readlink(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return filepath.Base(t), nil
}

// Lookup returns the function at a. A missing function is an error wrapping
// ErrNotFound whose message lists the VMware functions present.
func (b *Bus) Lookup(a Addr) (Function, error) {
	f, err := b.read(a)
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(b.deviceDir(a)); errors.Is(serr, fs.ErrNotExist) {
			return Function{}, &OpError{Op: "lookup", Dev: a.String(), Err: b.notFound()}
		}
	}
	if err != nil {
		return Function{}, &OpError{Op: "lookup", Dev: a.String(), Err: err}
	}
	return f, nil
}

// notFound builds ErrNotFound with the list of what is there of vendor 15ad.
func (b *Bus) notFound() error {
	fns, err := b.List()
	if err != nil {
		return fmt.Errorf("%w (and listing the bus failed: %v)", ErrNotFound, err)
	}
	var have []string
	for _, f := range fns {
		if f.Vendor == VendorVMware {
			have = append(have, f.String())
		}
	}
	if len(have) == 0 {
		return fmt.Errorf("%w; no VMware (%04x) functions present", ErrNotFound, VendorVMware)
	}
	return fmt.Errorf("%w; VMware (%04x) functions present: %s", ErrNotFound, VendorVMware, strings.Join(have, ", "))
}

// Find returns the functions with the given vendor and device IDs, sorted by
// address; none is not an error.
func (b *Bus) Find(vendor, device uint16) ([]Function, error) {
	fns, err := b.List()
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(fns, func(f Function) bool {
		return f.Vendor != vendor || f.Device != device
	}), nil
}

// GroupMembers returns a's IOMMU group number and every function in that
// group (a included), sorted by address. A function without a group is an
// error wrapping ErrNoIOMMUGroup.
func (b *Bus) GroupMembers(a Addr) (group int, members []Function, err error) {
	f, err := b.Lookup(a)
	if err != nil {
		return -1, nil, err
	}
	if f.IOMMUGroup < 0 {
		return -1, nil, &OpError{Op: "group members", Dev: a.String(), Err: ErrNoIOMMUGroup}
	}
	members, err = b.Group(f.IOMMUGroup)
	if err != nil {
		return -1, nil, err
	}
	return f.IOMMUGroup, members, nil
}

// Group returns the PCI functions in IOMMU group n, sorted by address.
func (b *Bus) Group(n int) ([]Function, error) {
	dev := "iommu group " + strconv.Itoa(n)
	ents, err := os.ReadDir(b.groupDevicesDir(n))
	if err != nil {
		return nil, &OpError{Op: "group members", Dev: dev, Err: err}
	}
	var members []Function
	for _, e := range ents {
		ma, err := ParseAddr(e.Name())
		if err != nil {
			continue // a non-PCI member; VFIO's PCI side cannot use such a group anyway
		}
		m, err := b.read(ma)
		if err != nil {
			return nil, &OpError{Op: "group members", Dev: ma.String(), Err: err}
		}
		members = append(members, m)
	}
	slices.SortFunc(members, func(x, y Function) int { return x.Addr.Compare(y.Addr) })
	return members, nil
}

// KeepsGroupViable reports whether f, as bound now, lets VFIO hand out its
// IOMMU group when the group is to be driven through vfioDriver (normally
// "vfio-pci"). The rule is the kernel's: a member may have no driver,
// vfioDriver or another VFIO driver (a vfio-pci variant), pci-stub, or be a
// bridge bound to pcieport.
func (f Function) KeepsGroupViable(vfioDriver string) bool {
	switch {
	case f.Driver == "", f.Driver == vfioDriver, f.Driver == "pci-stub":
		return true
	case strings.Contains(f.Driver, "vfio"):
		return true
	case f.Driver == "pcieport" && f.IsBridge():
		return true
	}
	return false
}

// CheckGroup checks that a's IOMMU group is viable for VFIO: every member is
// bound to driver (usually "vfio-pci"), to another VFIO driver, or to none.
// The error wraps ErrGroupNotViable and names every member in the way and
// its driver.
func (b *Bus) CheckGroup(a Addr, driver string) error {
	group, members, err := b.GroupMembers(a)
	if err != nil {
		return err
	}
	var bad []string
	for _, m := range members {
		if !m.KeepsGroupViable(driver) {
			bad = append(bad, fmt.Sprintf("%v (%04x:%04x) is bound to %s", m.Addr, m.Vendor, m.Device, m.Driver))
		}
	}
	if len(bad) > 0 {
		return &OpError{Op: "check group", Dev: a.String(), Err: fmt.Errorf(
			"%w: IOMMU group %d: %s; bind the whole group to %s (pci.BindGroup, or driver_override + drivers_probe) or unbind those members",
			ErrGroupNotViable, group, strings.Join(bad, "; "), driver)}
	}
	return nil
}

// ReadConfig returns a's PCI configuration space as sysfs exposes it (the
// first 64 bytes to everyone; all of it to root).
func (b *Bus) ReadConfig(a Addr) ([]byte, error) {
	c, err := os.ReadFile(filepath.Join(b.deviceDir(a), "config"))
	if err != nil {
		return nil, &OpError{Op: "read config", Dev: a.String(), Err: err}
	}
	return c, nil
}
