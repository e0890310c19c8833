package vfiotest_test

import (
	"testing"

	"github.com/vfrdma/vfrdma/pci"
	"github.com/vfrdma/vfrdma/pci/pcitest"
	"github.com/vfrdma/vfrdma/vfio"
	"github.com/vfrdma/vfrdma/vfio/vfiotest"
)

// A test of code that opens a PCI function through package vfio, on a
// machine without VFIO: a fake sysfs in which the function's group is bound
// to vfio-pci, and a fake kernel holding that group. (The example is
// compiled, not run: t stands for the test's *testing.T.)
func Example() {
	var t *testing.T
	addr := pci.Addr{Slot: 0x10, Func: 1}
	sys := pcitest.VMwareSlot(t)
	if _, err := sys.Bus().BindGroup(addr, "vfio-pci"); err != nil {
		t.Fatal(err)
	}
	k := vfiotest.New(t) // reports descriptors left open at the end of the test
	dev := vfiotest.PVRDMA(addr.String())
	k.AddGroup(5, true, vfiotest.PVRDMA("0000:00:10.0"), dev)

	d, err := vfio.Open(addr, &vfio.Options{Kernel: k, SysfsRoot: sys.Root})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	vecs, err := d.EnableMSIX(3)
	if err != nil {
		t.Fatal(err)
	}
	_ = dev.Raise(vfio.IRQMSIX, 0) // the device interrupts: vecs[0].Wait returns
	_ = vecs
}
