package vfio_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/pci"
	"github.com/vfrdma/vfrdma/pci/pcitest"
	"github.com/vfrdma/vfrdma/vfio"
	"github.com/vfrdma/vfrdma/vfio/vfiotest"
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
		if n := vfiotest.RegionMaps(); n > 0 {
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

// isMapped reports whether addr lies in a mapping of this process.
func isMapped(t *testing.T, addr uint64) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
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

// The IOVA window package vfio documents: from 1 MiB to 4 GiB, without the
// x86 MSI window when the kernel reports no valid ranges.
const (
	iovaBase       = 1 << 20
	msiWindowStart = 0xfee00000
	msiWindowEnd   = 0xfeefffff
)

// env is a fake VFIO world shaped like the bench's guest: group 5 holding
// the vmxnet3 and pvrdma functions, bound to vfio-pci in sysfs.
type env struct {
	k     *vfiotest.Kernel
	sys   *pcitest.Sysfs
	opts  *vfio.Options
	rdma  *vfiotest.Device
	nic   *vfiotest.Device
	group *vfiotest.Group
}

// newEnv is the bench's guest of today: a kernel without iommufd, so Open
// (Options.Path auto) takes the group path.
func newEnv(t *testing.T) *env {
	t.Helper()
	k := vfiotest.New(t)
	sys := pcitest.VMwareSlot(t)
	_, err := sys.Bus().BindGroup(rdmaAddr, "vfio-pci")
	require.NoError(t, err)
	e := &env{k: k, sys: sys, rdma: vfiotest.PVRDMA(rdmaName), nic: vfiotest.PVRDMA("0000:00:10.0")}
	e.group = k.AddGroup(5, true, e.nic, e.rdma)
	e.opts = &vfio.Options{SysfsRoot: sys.Root, Kernel: k}
	return e
}

// newEnvOn is newEnv on a kernel that offers both paths (iommufd and the
// functions' cdevs), with Options.Path set to p.
func newEnvOn(t *testing.T, p vfio.Path) *env {
	t.Helper()
	e := newEnv(t)
	e.k.SetIOMMUFDLoaded(true)
	e.k.LinkCDevs(t, e.sys.Root)
	e.opts.Path = p
	return e
}

// forPaths runs test on the group path and on the cdev path: what the
// device does must not depend on the path it was opened through.
func forPaths(t *testing.T, test func(t *testing.T, p vfio.Path)) {
	for _, p := range []vfio.Path{vfio.PathGroup, vfio.PathCDev} {
		t.Run(p.String(), func(t *testing.T) { test(t, p) })
	}
}

// open opens the pvrdma function through Open.
func (e *env) open(t *testing.T) *vfio.Device {
	t.Helper()
	d, err := vfio.Open(rdmaAddr, e.opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// pciNoGroup returns a sysfs root where the pvrdma function, bound to
// vfio-pci, has no IOMMU group (a kernel without an IOMMU).
func pciNoGroup(t *testing.T) string {
	s := pcitest.New(t)
	s.AddDriver(t, "vfio-pci")
	s.AddFunction(t, pci.Function{Addr: rdmaAddr, Vendor: 0x15ad, Device: 0x0820, Driver: "vfio-pci", IOMMUGroup: -1})
	return s.Root
}
