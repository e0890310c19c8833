// Package pcitest builds fake sysfs trees for tests of code that uses package
// pci, and emulates the kernel's side of the writes that bind drivers.
//
// A Sysfs lays out, under a temporary directory, what Linux shows under /sys
// for PCI: bus/pci/devices/<addr> links to devices/pci0000:00/<addr>
// directories holding vendor, device, class, irq, resource, config and
// driver_override files, with driver and iommu_group links;
// kernel/iommu_groups/N/devices links; bus/pci/drivers/<name> directories
// with bind and unbind; and bus/pci/drivers_probe. Reads go to those files.
// Writes go through Sysfs.Write (handed to pci.NewBusWith by Bus), which
// does what the kernel would: driver_override, unbind, bind and
// drivers_probe move the driver link.
//
// A Sysfs is safe for concurrent use.
package pcitest

import (
	"encoding/binary"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/vfrdma/vfrdma/pci"
)

// Sysfs is a fake /sys tree.
type Sysfs struct {
	// Root is the directory standing in for /sys.
	Root string

	mu       sync.Mutex
	defaults map[[2]uint16]string // vendor, device → driver drivers_probe picks
	refuse   map[string]bool      // driver + " " + addr → probe fails
	fail     func(path string, data []byte) error
	writes   []string
}

// New returns an empty fake tree in t.TempDir() with a PCI bus and no
// functions or drivers.
func New(t testing.TB) *Sysfs {
	t.Helper()
	s := &Sysfs{
		Root:     t.TempDir(),
		defaults: map[[2]uint16]string{},
		refuse:   map[string]bool{},
	}
	for _, d := range []string{"bus/pci/devices", "bus/pci/drivers", "devices/pci0000:00", "kernel/iommu_groups"} {
		mustMkdir(t, filepath.Join(s.Root, d))
	}
	mustWrite(t, filepath.Join(s.Root, "bus/pci/drivers_probe"), "")
	return s
}

// VMwareSlot returns a tree shaped like the QEMU bench's guest: vmxnet3 at
// 0000:00:10.0 bound to vmxnet3, pvrdma at 0000:00:10.1 with no driver, both
// in IOMMU group 5, plus an unrelated function in group 1; drivers vmxnet3
// and vfio-pci are loaded and vmxnet3 is the default driver for 15ad:07b0.
func VMwareSlot(t testing.TB) *Sysfs {
	t.Helper()
	s := New(t)
	s.AddDriver(t, "vmxnet3")
	s.AddDriver(t, "vfio-pci")
	s.AddDriver(t, "e1000e")
	s.SetDefaultDriver(pci.VendorVMware, pci.DeviceVMXNET3, "vmxnet3")
	s.AddFunction(t, pci.Function{Addr: pci.Addr{Slot: 0x02}, Vendor: 0x8086, Device: 0x10d3, Class: 0x020000, Driver: "e1000e", IOMMUGroup: 1})
	s.AddFunction(t, pci.Function{Addr: pci.Addr{Slot: 0x10}, Vendor: pci.VendorVMware, Device: pci.DeviceVMXNET3, Class: 0x020000, Driver: "vmxnet3", IOMMUGroup: 5})
	s.AddFunction(t, pci.Function{Addr: pci.Addr{Slot: 0x10, Func: 1}, Vendor: pci.VendorVMware, Device: pci.DevicePVRDMA, Class: 0x028000, IOMMUGroup: 5})
	return s
}

// Bus returns a pci.Bus over the tree whose writes go through s.Write.
func (s *Sysfs) Bus() *pci.Bus { return pci.NewBusWith(s.Root, s.Write) }

// AddDriver registers a PCI driver (creates bus/pci/drivers/name).
func (s *Sysfs) AddDriver(t testing.TB, name string) {
	t.Helper()
	dir := filepath.Join(s.Root, "bus/pci/drivers", name)
	mustMkdir(t, dir)
	mustWrite(t, filepath.Join(dir, "bind"), "")
	mustWrite(t, filepath.Join(dir, "unbind"), "")
}

// RemoveDriver unregisters a driver, as rmmod would; functions bound to it
// lose their driver.
func (s *Sysfs) RemoveDriver(t testing.TB, name string) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	ents, _ := os.ReadDir(filepath.Join(s.Root, "bus/pci/devices"))
	for _, e := range ents {
		if s.driverLocked(e.Name()) == name {
			_ = os.Remove(filepath.Join(s.devDir(e.Name()), "driver"))
		}
	}
	if err := os.RemoveAll(filepath.Join(s.Root, "bus/pci/drivers", name)); err != nil {
		t.Fatal(err)
	}
}

// SetDefaultDriver makes drivers_probe bind functions with these IDs to
// driver when they have no driver_override (as the driver's ID table would).
func (s *Sysfs) SetDefaultDriver(vendor, device uint16, driver string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.defaults[[2]uint16{vendor, device}] = driver
}

// RefuseProbe makes driver's probe fail for a: bind and drivers_probe leave
// a unbound, as when a driver rejects a device.
func (s *Sysfs) RefuseProbe(driver string, a pci.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refuse[driver+" "+a.String()] = true
}

// FailWrites installs fn, called before every write is emulated; a non-nil
// result fails the write (for example &fs.PathError{Err: syscall.EACCES}).
// nil removes the hook.
func (s *Sysfs) FailWrites(fn func(path string, data []byte) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = fn
}

// Writes returns the writes made so far, each as "path-relative-to-Root=data"
// with trailing newlines removed.
func (s *Sysfs) Writes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.writes...)
}

// AddFunction adds a function. f.Driver, if set, must be a registered
// driver; f.IOMMUGroup < 0 means no group.
func (s *Sysfs) AddFunction(t testing.TB, f pci.Function) {
	t.Helper()
	name := f.Addr.String()
	real := filepath.Join(s.Root, "devices/pci0000:00", name)
	mustMkdir(t, real)
	mustWrite(t, filepath.Join(real, "vendor"), fmt.Sprintf("0x%04x\n", f.Vendor))
	mustWrite(t, filepath.Join(real, "device"), fmt.Sprintf("0x%04x\n", f.Device))
	mustWrite(t, filepath.Join(real, "class"), fmt.Sprintf("0x%06x\n", f.Class))
	mustWrite(t, filepath.Join(real, "irq"), "0\n")
	res := strings.Repeat("0x0000000000000000 0x0000000000000000 0x0000000000000000\n", 13)
	mustWrite(t, filepath.Join(real, "resource"), res)
	mustWrite(t, filepath.Join(real, "driver_override"), "(null)\n")
	cfg := make([]byte, 256)
	binary.LittleEndian.PutUint16(cfg[0:], f.Vendor)
	binary.LittleEndian.PutUint16(cfg[2:], f.Device)
	binary.LittleEndian.PutUint16(cfg[4:], 0x0103)
	cfg[9], cfg[10], cfg[11] = byte(f.Class), byte(f.Class>>8), byte(f.Class>>16)
	if err := os.WriteFile(filepath.Join(real, "config"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	mustLink(t, "../../../devices/pci0000:00/"+name, filepath.Join(s.Root, "bus/pci/devices", name))
	if f.Driver != "" {
		if _, err := os.Stat(filepath.Join(s.Root, "bus/pci/drivers", f.Driver)); err != nil {
			t.Fatalf("pcitest: AddFunction %v: driver %s not registered", f.Addr, f.Driver)
		}
		mustLink(t, "../../../bus/pci/drivers/"+f.Driver, filepath.Join(real, "driver"))
	}
	if f.IOMMUGroup >= 0 {
		g := strconv.Itoa(f.IOMMUGroup)
		mustMkdir(t, filepath.Join(s.Root, "kernel/iommu_groups", g, "devices"))
		mustLink(t, "../../../kernel/iommu_groups/"+g, filepath.Join(real, "iommu_group"))
		mustLink(t, "../../../../devices/pci0000:00/"+name, filepath.Join(s.Root, "kernel/iommu_groups", g, "devices", name))
	}
}

// Driver returns the driver a is bound to, "" for none.
func (s *Sysfs) Driver(a pci.Addr) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.driverLocked(a.String())
}

// Override returns a's driver_override, "" when unset.
func (s *Sysfs) Override(a pci.Addr) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.overrideLocked(a.String())
}

func (s *Sysfs) devDir(name string) string {
	return filepath.Join(s.Root, "devices/pci0000:00", name)
}

func (s *Sysfs) driverLocked(name string) string {
	t, err := os.Readlink(filepath.Join(s.devDir(name), "driver"))
	if err != nil {
		return ""
	}
	return filepath.Base(t)
}

func (s *Sysfs) overrideLocked(name string) string {
	b, _ := os.ReadFile(filepath.Join(s.devDir(name), "driver_override"))
	v := strings.TrimSpace(string(b))
	if v == "(null)" {
		return ""
	}
	return v
}

func errno(op, path string, e syscall.Errno) error {
	return &fs.PathError{Op: op, Path: path, Err: e}
}

// Write emulates a write to a sysfs attribute the way the kernel handles
// it. It is the pci.WriteFunc that Bus installs.
func (s *Sysfs) Write(path string, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	rel, err := filepath.Rel(s.Root, path)
	if err != nil || strings.HasPrefix(rel, "..") {
		return errno("write", path, syscall.ENOENT)
	}
	val := strings.TrimRight(string(data), "\n")
	s.writes = append(s.writes, rel+"="+val)
	if s.fail != nil {
		if err := s.fail(path, data); err != nil {
			return err
		}
	}
	if _, err := os.Stat(path); err != nil {
		return err // writing a file that does not exist: ENOENT, as on sysfs
	}
	parts := strings.Split(filepath.ToSlash(rel), "/")
	switch {
	case len(parts) == 3 && parts[0] == "bus" && parts[2] == "drivers_probe":
		return s.probe(val)
	case len(parts) == 5 && parts[0] == "bus" && parts[2] == "drivers" && parts[4] == "bind":
		return s.bind(val, parts[3], path)
	case len(parts) == 5 && parts[0] == "bus" && parts[2] == "drivers" && parts[4] == "unbind":
		if s.driverLocked(val) != parts[3] {
			return errno("write", path, syscall.ENODEV)
		}
		return os.Remove(filepath.Join(s.devDir(val), "driver"))
	case len(parts) >= 2 && parts[len(parts)-1] == "driver_override":
		if val == "" {
			val = "(null)"
		}
		return os.WriteFile(path, []byte(val+"\n"), 0o644)
	}
	return os.WriteFile(path, data, 0o644)
}

// probe is drivers_probe: bind name to its override or its default driver.
func (s *Sysfs) probe(name string) error {
	if _, err := os.Stat(s.devDir(name)); err != nil {
		return errno("write", "drivers_probe", syscall.ENODEV)
	}
	if s.driverLocked(name) != "" {
		return nil
	}
	drv := s.overrideLocked(name)
	if drv == "" {
		drv = s.defaultLocked(name)
	}
	if drv == "" {
		return nil
	}
	if _, err := os.Stat(filepath.Join(s.Root, "bus/pci/drivers", drv)); err != nil {
		return nil // no such driver: nothing binds, no error, as in the kernel
	}
	if s.refuse[drv+" "+name] {
		return nil // the probe failed; the kernel logs it and drivers_probe succeeds
	}
	return os.Symlink("../../../bus/pci/drivers/"+drv, filepath.Join(s.devDir(name), "driver"))
}

func (s *Sysfs) defaultLocked(name string) string {
	read := func(f string) uint16 {
		b, _ := os.ReadFile(filepath.Join(s.devDir(name), f))
		v, _ := strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(string(b)), "0x"), 16, 16)
		return uint16(v)
	}
	return s.defaults[[2]uint16{read("vendor"), read("device")}]
}

// bind is drivers/<drv>/bind: the driver must match (override or ID table)
// and the function must be free.
func (s *Sysfs) bind(name, drv, path string) error {
	if _, err := os.Stat(s.devDir(name)); err != nil {
		return errno("write", path, syscall.ENODEV)
	}
	if s.driverLocked(name) != "" {
		return errno("write", path, syscall.EBUSY)
	}
	if o := s.overrideLocked(name); o != "" && o != drv {
		return errno("write", path, syscall.ENODEV)
	}
	if s.overrideLocked(name) == "" && s.defaultLocked(name) != drv {
		return errno("write", path, syscall.ENODEV)
	}
	if s.refuse[drv+" "+name] {
		return errno("write", path, syscall.ENODEV)
	}
	return os.Symlink("../../../bus/pci/drivers/"+drv, filepath.Join(s.devDir(name), "driver"))
}

func mustMkdir(t testing.TB, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

func mustWrite(t testing.TB, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustLink(t testing.TB, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}
