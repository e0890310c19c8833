package pci_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/vfrdma/vfrdma/pci"
	"github.com/vfrdma/vfrdma/pci/pcitest"
)

var (
	nic  = pci.Addr{Slot: 0x10}
	rdma = pci.Addr{Slot: 0x10, Func: 1}
	e1k  = pci.Addr{Slot: 0x02}
)

func TestList(t *testing.T) {
	s := pcitest.VMwareSlot(t)
	fns, err := s.Bus().List()
	if err != nil {
		t.Fatal(err)
	}
	want := []pci.Function{
		{Addr: e1k, Vendor: 0x8086, Device: 0x10d3, Class: 0x020000, Driver: "e1000e", IOMMUGroup: 1},
		{Addr: nic, Vendor: 0x15ad, Device: 0x07b0, Class: 0x020000, Driver: "vmxnet3", IOMMUGroup: 5},
		{Addr: rdma, Vendor: 0x15ad, Device: 0x0820, Class: 0x028000, Driver: "", IOMMUGroup: 5},
	}
	if !slices.Equal(fns, want) {
		t.Fatalf("List =\n%v\nwant\n%v", fns, want)
	}
}

func TestListNoGroup(t *testing.T) {
	s := pcitest.New(t)
	s.AddFunction(t, pci.Function{Addr: rdma, Vendor: 0x15ad, Device: 0x0820, IOMMUGroup: -1})
	f, err := s.Bus().Lookup(rdma)
	if err != nil {
		t.Fatal(err)
	}
	if f.IOMMUGroup != -1 || f.Driver != "" {
		t.Fatalf("Lookup = %+v", f)
	}
	_, _, err = s.Bus().GroupMembers(rdma)
	if !errors.Is(err, pci.ErrNoIOMMUGroup) || !strings.Contains(err.Error(), "intel_iommu=on") {
		t.Fatalf("GroupMembers without group: %v", err)
	}
	if _, err := s.Bus().BindGroup(rdma, "vfio-pci"); !errors.Is(err, pci.ErrNoIOMMUGroup) {
		t.Fatalf("BindGroup without group: %v", err)
	}
}

func TestListMissingSysfs(t *testing.T) {
	b := pci.NewBus(filepath.Join(t.TempDir(), "nope"))
	if _, err := b.List(); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("List on missing tree: %v", err)
	}
}

func TestNewBusDefault(t *testing.T) {
	// "" means /sys: on any Linux machine /sys/bus/pci/devices exists or
	// List fails naming that path; either way the root was /sys.
	_, err := pci.NewBus("").List()
	if err != nil && !strings.Contains(err.Error(), "/sys/bus/pci/devices") {
		t.Fatalf("NewBus(\"\").List: %v", err)
	}
}

func TestLookupNotFound(t *testing.T) {
	s := pcitest.VMwareSlot(t)
	_, err := s.Bus().Lookup(pci.Addr{Slot: 0x11, Func: 1})
	if !errors.Is(err, pci.ErrNotFound) {
		t.Fatalf("Lookup missing: %v", err)
	}
	msg := err.Error()
	for _, want := range []string{"0000:00:11.1", "0000:00:10.0 15ad:07b0 (vmxnet3)", "0000:00:10.1 15ad:0820 (no driver)"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not mention %q", msg, want)
		}
	}
	if strings.Contains(msg, "8086") {
		t.Errorf("error %q lists non-VMware functions", msg)
	}
	var oe *pci.OpError
	if !errors.As(err, &oe) || oe.Op != "lookup" || oe.Dev != "0000:00:11.1" {
		t.Errorf("error is %#v", err)
	}

	empty := pcitest.New(t)
	_, err = empty.Bus().Lookup(rdma)
	if !errors.Is(err, pci.ErrNotFound) || !strings.Contains(err.Error(), "no VMware (15ad) functions") {
		t.Fatalf("Lookup on empty bus: %v", err)
	}
}

func TestLookupCorrupt(t *testing.T) {
	s := pcitest.VMwareSlot(t)
	if err := os.WriteFile(filepath.Join(s.Root, "devices/pci0000:00/0000:00:10.1/vendor"), []byte("zz\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := s.Bus().Lookup(rdma)
	if err == nil || errors.Is(err, pci.ErrNotFound) {
		t.Fatalf("Lookup of corrupt function: %v", err)
	}
	if _, err := s.Bus().List(); err == nil {
		t.Fatal("List with a corrupt function succeeded")
	}
}

func TestFind(t *testing.T) {
	s := pcitest.VMwareSlot(t)
	fns, err := s.Bus().Find(pci.VendorVMware, pci.DevicePVRDMA)
	if err != nil {
		t.Fatal(err)
	}
	if len(fns) != 1 || fns[0].Addr != rdma {
		t.Fatalf("Find = %v", fns)
	}
	fns, err = s.Bus().Find(0x1234, 0x5678)
	if err != nil || len(fns) != 0 {
		t.Fatalf("Find(absent) = %v, %v", fns, err)
	}
}

func TestGroupMembers(t *testing.T) {
	s := pcitest.VMwareSlot(t)
	g, ms, err := s.Bus().GroupMembers(rdma)
	if err != nil {
		t.Fatal(err)
	}
	if g != 5 || len(ms) != 2 || ms[0].Addr != nic || ms[1].Addr != rdma {
		t.Fatalf("GroupMembers = %d, %v", g, ms)
	}
	if _, _, err := s.Bus().GroupMembers(pci.Addr{Bus: 9}); !errors.Is(err, pci.ErrNotFound) {
		t.Fatalf("GroupMembers(missing) = %v", err)
	}
}

func TestCheckGroup(t *testing.T) {
	s := pcitest.VMwareSlot(t)
	err := s.Bus().CheckGroup(rdma, "vfio-pci")
	if !errors.Is(err, pci.ErrGroupNotViable) {
		t.Fatalf("CheckGroup = %v", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "0000:00:10.0 (15ad:07b0) is bound to vmxnet3") || !strings.Contains(msg, "group 5") {
		t.Fatalf("CheckGroup message %q does not name the member", msg)
	}
	if _, err := s.Bus().BindGroup(rdma, "vfio-pci"); err != nil {
		t.Fatal(err)
	}
	if err := s.Bus().CheckGroup(rdma, "vfio-pci"); err != nil {
		t.Fatalf("CheckGroup after bind: %v", err)
	}
}

func TestCheckGroupAllowed(t *testing.T) {
	s := pcitest.New(t)
	for _, d := range []string{"pci-stub", "pcieport", "vfio-pci", "mlx5_vfio_pci"} {
		s.AddDriver(t, d)
	}
	s.AddFunction(t, pci.Function{Addr: pci.Addr{Slot: 1}, Class: 0x060400, Driver: "pcieport", IOMMUGroup: 3})
	s.AddFunction(t, pci.Function{Addr: pci.Addr{Slot: 2}, Driver: "pci-stub", IOMMUGroup: 3})
	s.AddFunction(t, pci.Function{Addr: pci.Addr{Slot: 3}, Driver: "mlx5_vfio_pci", IOMMUGroup: 3})
	s.AddFunction(t, pci.Function{Addr: pci.Addr{Slot: 4}, Driver: "vfio-pci", IOMMUGroup: 3})
	s.AddFunction(t, pci.Function{Addr: pci.Addr{Slot: 5}, IOMMUGroup: 3})
	if err := s.Bus().CheckGroup(pci.Addr{Slot: 4}, "vfio-pci"); err != nil {
		t.Fatal(err)
	}
	// pcieport on something that is not a bridge does not count.
	s.AddFunction(t, pci.Function{Addr: pci.Addr{Slot: 6}, Class: 0x020000, Driver: "pcieport", IOMMUGroup: 3})
	if err := s.Bus().CheckGroup(pci.Addr{Slot: 4}, "vfio-pci"); !errors.Is(err, pci.ErrGroupNotViable) {
		t.Fatalf("CheckGroup = %v", err)
	}
}

func TestReadConfig(t *testing.T) {
	s := pcitest.VMwareSlot(t)
	c, err := s.Bus().ReadConfig(rdma)
	if err != nil {
		t.Fatal(err)
	}
	if len(c) != 256 || c[0] != 0xad || c[1] != 0x15 || c[2] != 0x20 || c[3] != 0x08 {
		t.Fatalf("config = % x", c[:4])
	}
	if _, err := s.Bus().ReadConfig(pci.Addr{Bus: 3}); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("ReadConfig(missing) = %v", err)
	}
}

func TestFunctionString(t *testing.T) {
	f := pci.Function{Addr: rdma, Vendor: 0x15ad, Device: 0x820}
	if got := f.String(); got != "0000:00:10.1 15ad:0820 (no driver)" {
		t.Fatal(got)
	}
}

func TestOpErrorErrno(t *testing.T) {
	s := pcitest.VMwareSlot(t)
	s.FailWrites(func(path string, _ []byte) error {
		return &fs.PathError{Op: "open", Path: path, Err: syscall.EACCES}
	})
	_, err := s.Bus().BindGroup(rdma, "vfio-pci")
	if !errors.Is(err, pci.ErrPermission) || !errors.Is(err, syscall.EACCES) || !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("BindGroup without permission: %v", err)
	}
	if !strings.Contains(err.Error(), "root") {
		t.Fatalf("message %q does not say to run as root", err)
	}
}

func TestGroupByNumber(t *testing.T) {
	s := pcitest.VMwareSlot(t)
	ms, err := s.Bus().Group(5)
	if err != nil || len(ms) != 2 || ms[0].Addr != nic {
		t.Fatalf("Group(5) = %v, %v", ms, err)
	}
	if _, err := s.Bus().Group(99); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Group(99) = %v", err)
	}
}
