package vfio

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vfrdma/vfrdma/pci"
	"github.com/vfrdma/vfrdma/pci/pcitest"
)

// TestMain checks that the tests leave no file descriptor and no device
// mapping behind.
func TestMain(m *testing.M) {
	// Start the runtime poller first: it keeps its own fds for the life of
	// the process.
	r, w, err := os.Pipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	r.Close()
	w.Close()
	before := openFDs()
	code := m.Run()
	if code == 0 {
		if leaked := diff(openFDs(), before); len(leaked) > 0 {
			fmt.Fprintf(os.Stderr, "leaked file descriptors: %v\n", leaked)
			code = 1
		}
		if n := fakeMappings(); n > 0 {
			fmt.Fprintf(os.Stderr, "%d device region mappings left in /proc/self/maps\n", n)
			code = 1
		}
	}
	os.Exit(code)
}

// openFDs lists this process's fds with what they point at.
func openFDs() []string {
	ents, _ := os.ReadDir("/proc/self/fd")
	var out []string
	for _, e := range ents {
		t, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil {
			continue // the directory fd of ReadDir itself
		}
		out = append(out, e.Name()+" -> "+t)
	}
	return out
}

func diff(now, before []string) []string {
	var out []string
	for _, s := range now {
		if !slices.Contains(before, s) {
			out = append(out, s)
		}
	}
	return out
}

// fakeMappings counts mappings of fake device memfds.
func fakeMappings() int {
	b, _ := os.ReadFile("/proc/self/maps")
	return strings.Count(string(b), "memfd:vfio-fake-device")
}

// isMapped reports whether addr lies in a mapping of this process.
func isMapped(t *testing.T, addr uint64) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		var lo, hi uint64
		if _, err := fmt.Sscanf(line, "%x-%x", &lo, &hi); err == nil && addr >= lo && addr < hi {
			return true
		}
	}
	return false
}

var (
	nicAddr  = pci.Addr{Slot: 0x10}
	rdmaAddr = pci.Addr{Slot: 0x10, Func: 1}
	rdmaName = "0000:00:10.1"
)

// env is a fake VFIO world shaped like the bench's guest: group 5 holding
// the vmxnet3 and pvrdma functions, bound to vfio-pci in sysfs.
type env struct {
	k     *fakeKernel
	sys   *pcitest.Sysfs
	opts  *Options
	rdma  *fakeDevice
	group *fakeGroup
}

func newEnv(t *testing.T) *env {
	t.Helper()
	k := newFakeKernel(t)
	sys := pcitest.VMwareSlot(t)
	if _, err := sys.Bus().BindGroup(rdmaAddr, "vfio-pci"); err != nil {
		t.Fatal(err)
	}
	e := &env{k: k, sys: sys, rdma: pvrdmaDevice(rdmaName)}
	nic := pvrdmaDevice("0000:00:10.0")
	e.group = k.addGroup(5, true, nic, e.rdma)
	e.opts = &Options{DevDir: k.devDir, SysfsRoot: sys.Root, kernel: k}
	return e
}

// open opens the pvrdma function through Open.
func (e *env) open(t *testing.T) *Device {
	t.Helper()
	d, err := Open(rdmaAddr, e.opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}
