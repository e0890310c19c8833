package vfrdma

import (
	"errors"
	"strings"
	"testing"

	"github.com/vfrdma/vfrdma/pci"
	"github.com/vfrdma/vfrdma/pci/pcitest"
	"github.com/vfrdma/vfrdma/vfio"
)

// Open refuses bad input with an error that says what is wrong, before it
// touches the device.
func TestOpenBadInput(t *testing.T) {
	fs := pcitest.VMwareSlot(t)
	opts := &Options{SysfsRoot: fs.Root, StateDir: "-"}
	for _, tc := range []struct {
		bdf  string
		want error
		says string
	}{
		{"not-a-bdf", pci.ErrInvalidAddr, "not-a-bdf"},
		{"0000:00:1f.3", pci.ErrNotFound, "0000:00:1f.3"},
		{"0000:00:10.0", ErrInvalid, "not a pvrdma function"},
		{"0000:00:10.1", vfio.ErrNotBound, "vfio-pci"},
	} {
		d, err := Open(tc.bdf, opts)
		if err == nil {
			d.Close()
			t.Errorf("Open(%q) succeeded", tc.bdf)
			continue
		}
		var oe *OpError
		if !errors.Is(err, tc.want) || !errors.As(err, &oe) || oe.Op != "open" || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("Open(%q) = %v; want an open *OpError wrapping %v that mentions %q", tc.bdf, err, tc.want, tc.says)
		}
	}
}

// Open refuses a VFIO path other than auto, cdev and group before it
// touches sysfs or the device; either path still needs the function on
// vfio-pci.
func TestOpenRefusesAVFIOPathOtherThanAutoCDevOrGroup(t *testing.T) {
	fs := pcitest.VMwareSlot(t)
	_, err := Open("0000:00:10.1", &Options{SysfsRoot: fs.Root, StateDir: "-", VFIO: "iommufd"})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `Options.VFIO "iommufd"`) {
		t.Errorf("Open with VFIO iommufd = %v; want ErrInvalid naming Options.VFIO", err)
	}
	for _, p := range []vfio.Path{vfio.PathCDev, vfio.PathGroup} {
		_, err := Open("0000:00:10.1", &Options{SysfsRoot: fs.Root, StateDir: "-", VFIO: p})
		if !errors.Is(err, vfio.ErrNotBound) {
			t.Errorf("Open of an unbound function with VFIO %v = %v; want vfio.ErrNotBound", p, err)
		}
	}
	// Options.VFIO reaches vfio: the cdev forced on a function sysfs shows
	// no vfio-dev node for fails there, before any VFIO node is opened.
	_, err = fs.Bus().BindGroup(pci.Addr{Slot: 0x10, Func: 1}, "vfio-pci")
	if err != nil {
		t.Fatal(err)
	}
	_, err = Open("0000:00:10.1", &Options{SysfsRoot: fs.Root, StateDir: "-", VFIO: vfio.PathCDev})
	if !errors.Is(err, vfio.ErrNoCDev) {
		t.Errorf("Open with VFIO cdev of a function without a vfio-dev node = %v; want vfio.ErrNoCDev", err)
	}
}
