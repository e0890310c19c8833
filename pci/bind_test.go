package pci_test

import (
	"errors"
	"io/fs"
	"maps"
	"strings"
	"syscall"
	"testing"

	"github.com/vfrdma/vfrdma/pci"
	"github.com/vfrdma/vfrdma/pci/pcitest"
)

func TestBindRestoreGroup(t *testing.T) {
	s := pcitest.VMwareSlot(t)
	b := s.Bus()
	prev, err := b.BindGroup(rdma, "vfio-pci")
	if err != nil {
		t.Fatal(err)
	}
	want := map[pci.Addr]string{nic: "vmxnet3", rdma: ""}
	if !maps.Equal(prev, want) {
		t.Fatalf("previous = %v, want %v", prev, want)
	}
	for _, a := range []pci.Addr{nic, rdma} {
		if d := s.Driver(a); d != "vfio-pci" {
			t.Errorf("%v bound to %q after BindGroup", a, d)
		}
		if o := s.Override(a); o != "vfio-pci" {
			t.Errorf("%v driver_override %q", a, o)
		}
	}
	if d := s.Driver(e1k); d != "e1000e" {
		t.Errorf("function outside the group moved to %q", d)
	}
	wantWrites := []string{
		"bus/pci/devices/0000:00:10.0/driver_override=vfio-pci",
		"bus/pci/drivers/vmxnet3/unbind=0000:00:10.0",
		"bus/pci/drivers_probe=0000:00:10.0",
		"bus/pci/devices/0000:00:10.1/driver_override=vfio-pci",
		"bus/pci/drivers_probe=0000:00:10.1",
	}
	if got := s.Writes(); strings.Join(got, "\n") != strings.Join(wantWrites, "\n") {
		t.Errorf("writes:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(wantWrites, "\n"))
	}

	// Binding again is a no-op that reports vfio-pci as previous.
	again, err := b.BindGroup(nic, "vfio-pci")
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(again, map[pci.Addr]string{nic: "vfio-pci", rdma: "vfio-pci"}) {
		t.Fatalf("second BindGroup previous = %v", again)
	}

	if err := b.RestoreGroup(prev); err != nil {
		t.Fatal(err)
	}
	if d := s.Driver(nic); d != "vmxnet3" {
		t.Errorf("vmxnet3 function restored to %q", d)
	}
	if d := s.Driver(rdma); d != "" {
		t.Errorf("pvrdma function restored to %q", d)
	}
	for _, a := range []pci.Addr{nic, rdma} {
		if o := s.Override(a); o != "" {
			t.Errorf("%v driver_override %q after restore", a, o)
		}
	}
	// Restoring twice is harmless.
	if err := b.RestoreGroup(prev); err != nil {
		t.Fatal(err)
	}
}

func TestBindGroupDriverNotLoaded(t *testing.T) {
	s := pcitest.VMwareSlot(t)
	s.RemoveDriver(t, "vfio-pci")
	_, err := s.Bus().BindGroup(rdma, "vfio-pci")
	if !errors.Is(err, pci.ErrDriverNotLoaded) || !strings.Contains(err.Error(), "modprobe vfio-pci") {
		t.Fatalf("BindGroup without vfio-pci: %v", err)
	}
	if len(s.Writes()) != 0 {
		t.Fatalf("writes made: %v", s.Writes())
	}
}

func TestBindGroupProbeRefused(t *testing.T) {
	s := pcitest.VMwareSlot(t)
	s.RefuseProbe("vfio-pci", rdma)
	_, err := s.Bus().BindGroup(rdma, "vfio-pci")
	if !errors.Is(err, pci.ErrBind) {
		t.Fatalf("BindGroup with refused probe: %v", err)
	}
	if !strings.Contains(err.Error(), "0000:00:10.1") || !strings.Contains(err.Error(), "15ad:0820") {
		t.Fatalf("message %q does not name the function", err)
	}
	// The vmxnet3 function, moved first, is back on its driver.
	if d := s.Driver(nic); d != "vmxnet3" {
		t.Fatalf("vmxnet3 function left on %q after failed bind", d)
	}
	for _, a := range []pci.Addr{nic, rdma} {
		if o := s.Override(a); o != "" {
			t.Errorf("%v driver_override %q left after failed bind", a, o)
		}
	}
}

func TestBindGroupUndoFails(t *testing.T) {
	s := pcitest.VMwareSlot(t)
	s.RefuseProbe("vfio-pci", rdma)
	s.FailWrites(func(path string, _ []byte) error {
		if strings.HasSuffix(path, "vmxnet3/bind") {
			return &fs.PathError{Op: "write", Path: path, Err: syscall.EIO}
		}
		return nil
	})
	_, err := s.Bus().BindGroup(rdma, "vfio-pci")
	if !errors.Is(err, pci.ErrBind) || !errors.Is(err, syscall.EIO) || !strings.Contains(err.Error(), "undoing") {
		t.Fatalf("BindGroup with failing undo: %v", err)
	}
}

func TestBindGroupUnbindPermission(t *testing.T) {
	s := pcitest.VMwareSlot(t)
	s.FailWrites(func(path string, _ []byte) error {
		if strings.HasSuffix(path, "/unbind") {
			return &fs.PathError{Op: "write", Path: path, Err: syscall.EPERM}
		}
		return nil
	})
	_, err := s.Bus().BindGroup(rdma, "vfio-pci")
	if !errors.Is(err, pci.ErrPermission) || !strings.Contains(err.Error(), "unbind from vmxnet3") {
		t.Fatalf("BindGroup: %v", err)
	}
	s.FailWrites(nil)
	if d := s.Driver(nic); d != "vmxnet3" {
		t.Fatalf("vmxnet3 function on %q", d)
	}
	if o := s.Override(nic); o != "" {
		t.Fatalf("override %q left behind", o)
	}
}

func TestBindGroupSkipsBridges(t *testing.T) {
	s := pcitest.New(t)
	s.AddDriver(t, "pcieport")
	s.AddDriver(t, "vfio-pci")
	br := pci.Addr{Slot: 1}
	s.AddFunction(t, pci.Function{Addr: br, Class: 0x060400, Driver: "pcieport", IOMMUGroup: 2})
	s.AddFunction(t, pci.Function{Addr: rdma, Vendor: 0x15ad, Device: 0x0820, IOMMUGroup: 2})
	prev, err := s.Bus().BindGroup(rdma, "vfio-pci")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := prev[br]; ok || s.Driver(br) != "pcieport" {
		t.Fatalf("bridge touched: previous %v, driver %q", prev, s.Driver(br))
	}
	if s.Driver(rdma) != "vfio-pci" {
		t.Fatal("pvrdma not bound")
	}
}

func TestBindGroupBadArgs(t *testing.T) {
	s := pcitest.VMwareSlot(t)
	if _, err := s.Bus().BindGroup(rdma, ""); err == nil {
		t.Fatal("BindGroup with empty driver succeeded")
	}
	if _, err := s.Bus().BindGroup(pci.Addr{Bus: 7}, "vfio-pci"); !errors.Is(err, pci.ErrNotFound) {
		t.Fatalf("BindGroup(missing) = %v", err)
	}
}

func TestRestoreGroupDriverGone(t *testing.T) {
	s := pcitest.VMwareSlot(t)
	prev, err := s.Bus().BindGroup(rdma, "vfio-pci")
	if err != nil {
		t.Fatal(err)
	}
	s.RemoveDriver(t, "vmxnet3")
	err = s.Bus().RestoreGroup(prev)
	if !errors.Is(err, pci.ErrDriverNotLoaded) || !strings.Contains(err.Error(), "modprobe vmxnet3") {
		t.Fatalf("RestoreGroup = %v", err)
	}
	// The other member was still restored.
	if d := s.Driver(rdma); d != "" {
		t.Fatalf("pvrdma left on %q", d)
	}
}
