package main

import (
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/pci"
	"github.com/vfrdma/vfrdma/pci/pcitest"
)

// addNetdev gives the fake function bdf a network interface, as the
// kernel shows one: a directory in the function's net/, with its
// operstate and flags, and class/net/NAME linking to it.
func addNetdev(t *testing.T, s *pcitest.Sysfs, bdf, name, operstate, flags string) {
	t.Helper()
	dir := filepath.Join(s.Root, "devices/pci0000:00", bdf, "net", name)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "operstate"), []byte(operstate+"\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "flags"), []byte(flags+"\n"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(s.Root, "class/net"), 0o755))
	require.NoError(t, os.Symlink(dir, filepath.Join(s.Root, "class/net", name)))
}

const vmxnet3BDF = "0000:00:10.0"

// unchanged asserts that bind left the tree alone: no sysfs write, the
// vmxnet3 function on its driver, nothing kept for unbind.
func unchanged(t *testing.T, e *env, fake *pcitest.Sysfs) {
	t.Helper()
	assert.Empty(t, fake.Writes(), "sysfs writes")
	a, _ := pci.ParseAddr(vmxnet3BDF)
	assert.Equal(t, "vmxnet3", fake.Driver(a))
	ents, err := os.ReadDir(e.runDir)
	require.NoError(t, err)
	assert.Empty(t, ents, "bind's record for unbind")
}

// bind refuses to take the slot's vmxnet3 NIC from the kernel while its
// network interface is up (IFF_UP, or operstate up) or has an address,
// unless --force; an interface down and without address goes quietly.
func TestBindRefusesANetworkInterfaceInUse(t *testing.T) {
	for _, tc := range []struct {
		name, operstate, flags string
		addrs                  []string
		refused                bool
	}{
		{"up and running", "up", "0x1003", nil, true},
		{"administratively up, no carrier", "down", "0x1003", nil, true},
		{"operstate up", "up", "0x1002", nil, true},
		{"an IPv4 address", "down", "0x1002", []string{"10.0.2.15/24"}, true},
		{"an IPv6 address", "down", "0x1002", []string{"fe80::250:56ff:fe00:1/64"}, true},
		{"down, no address", "down", "0x1002", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, out, fake := testEnv(t)
			addNetdev(t, fake, vmxnet3BDF, "ens16", tc.operstate, tc.flags)
			e.ifAddrs = func(name string) ([]string, error) {
				assert.Equal(t, "ens16", name)
				return tc.addrs, nil
			}
			err := cmdBind(e, nil)
			if !tc.refused {
				require.NoError(t, err)
				a, _ := pci.ParseAddr(vmxnet3BDF)
				assert.Equal(t, vfioDriver, fake.Driver(a))
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), "network interface 0000:00:10.0's ens16")
			assert.Contains(t, err.Error(), "is in use")
			assert.Contains(t, err.Error(), "--force")
			assert.Empty(t, out.String())
			unchanged(t, e, fake)

			// --force takes it.
			require.NoError(t, cmdBind(e, []string{"--force"}))
			a, _ := pci.ParseAddr(vmxnet3BDF)
			assert.Equal(t, vfioDriver, fake.Driver(a))
		})
	}
}

// bind --dry-run prints what bind would unbind and bind, and whether it
// would refuse (exiting as bind would), and writes nothing.
func TestBindDryRunChangesNothing(t *testing.T) {
	e, out, fake := testEnv(t)
	addNetdev(t, fake, vmxnet3BDF, "ens16", "up", "0x1003")
	e.ifAddrs = func(string) ([]string, error) { return []string{"10.0.2.15/24"}, nil }

	err := cmdBind(e, []string{"--dry-run"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "bind would refuse")
	for _, s := range []string{
		"bind --dry-run: IOMMU group 5 to vfio-pci; nothing changed",
		"0000:00:10.0 15ad:07b0: would unbind from vmxnet3 and bind to vfio-pci",
		"network interface ens16 (operstate up, up, addresses 10.0.2.15/24): IN USE, goes away",
		"0000:00:10.1 15ad:0820: would bind to vfio-pci (it has no driver)",
		"bind would refuse:",
	} {
		assert.Contains(t, out.String(), s)
	}
	unchanged(t, e, fake)

	out.Reset()
	require.NoError(t, cmdBind(e, []string{"--dry-run", "--force"}))
	assert.Contains(t, out.String(), "would unbind from vmxnet3")
	assert.NotContains(t, out.String(), "refuse")
	unchanged(t, e, fake)

	out.Reset()
	e.json = true
	require.Error(t, cmdBind(e, []string{"--dry-run"}))
	var doc struct {
		DryRun bool     `json:"dry_run"`
		Plan   bindPlan `json:"plan"`
	}
	require.NoError(t, json.Unmarshal(out.Bytes(), &doc), out.String())
	assert.True(t, doc.DryRun)
	assert.NotEmpty(t, doc.Plan.Refused)
	require.Len(t, doc.Plan.Members, 2)
	assert.Equal(t, "bind", doc.Plan.Members[0].Action)
	require.Len(t, doc.Plan.Members[0].Netdevs, 1)
	assert.True(t, doc.Plan.Members[0].Netdevs[0].Up)
	unchanged(t, e, fake)

	// A second dry run after a bind: every member on vfio-pci already.
	e.json = false
	require.NoError(t, cmdBind(e, []string{"--force"}))
	out.Reset()
	require.NoError(t, cmdBind(e, []string{"--dry-run"}))
	assert.Contains(t, out.String(), "0000:00:10.0 15ad:07b0: on vfio-pci already, left alone")
}

// Addresses come from the kernel only when --sysfs is the real /sys: a
// fake tree's interfaces are not this machine's.
func TestBindReadsTheKernelsAddressesOnlyOnTheRealSysfs(t *testing.T) {
	_, _, _, e := runPvctl(t, "help")
	assert.Nil(t, e.ifAddrs, "a fake sysfs")
	e = &env{out: &nopWriter{}, runDir: t.TempDir()}
	require.Equal(t, 0, run(e, []string{"help"}))
	assert.NotNil(t, e.ifAddrs, "/sys")
}

type nopWriter struct{}

func (*nopWriter) Write(b []byte) (int, error) { return len(b), nil }

// What bind cannot read about a network interface (its operstate, its
// flags, its addresses) stops it, naming the interface, before any change.
func TestBindStopsWhenItCannotTellANetworkInterfaceIsIdle(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spoil func(t *testing.T, dir string, e *env)
		want  string
	}{
		{"no operstate", func(t *testing.T, dir string, e *env) { require.NoError(t, os.Remove(filepath.Join(dir, "operstate"))) }, "operstate"},
		{"no flags", func(t *testing.T, dir string, e *env) { require.NoError(t, os.Remove(filepath.Join(dir, "flags"))) }, "flags"},
		{"bad flags", func(t *testing.T, dir string, e *env) {
			require.NoError(t, os.WriteFile(filepath.Join(dir, "flags"), []byte("0xzz\n"), 0o644))
		}, `flags "0xzz\n"`},
		{"addresses unreadable", func(t *testing.T, dir string, e *env) {
			e.ifAddrs = func(string) ([]string, error) { return nil, errors.New("no such network interface") }
		}, "no such network interface"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, out, fake := testEnv(t)
			addNetdev(t, fake, vmxnet3BDF, "ens16", "down", "0x1002")
			tc.spoil(t, filepath.Join(fake.Root, "class/net/ens16"), e)
			for _, args := range [][]string{nil, {"--force"}, {"--dry-run"}} {
				err := cmdBind(e, args)
				require.Error(t, err, "%v", args)
				assert.Contains(t, err.Error(), "0000:00:10.0: network interface ens16: ", "%v", args)
				assert.Contains(t, err.Error(), tc.want, "%v", args)
			}
			assert.Empty(t, out.String())
			unchanged(t, e, fake)
		})
	}
}

// A function's net directory bind cannot read stops it too.
func TestBindStopsWhenItCannotListNetworkInterfaces(t *testing.T) {
	e, _, fake := testEnv(t)
	require.NoError(t, os.WriteFile(filepath.Join(fake.Root, "devices/pci0000:00", vmxnet3BDF, "net"), nil, 0o644))
	err := cmdBind(e, []string{"--dry-run"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), vmxnet3BDF+"/net")
	unchanged(t, e, fake)
}

// The kernel's addresses: each interface's, with its prefix; an
// interface that is not there is an error.
func TestKernelIfAddrs(t *testing.T) {
	ifs, err := net.Interfaces()
	require.NoError(t, err)
	require.NotEmpty(t, ifs)
	as, err := kernelIfAddrs(ifs[0].Name)
	require.NoError(t, err)
	want, err := ifs[0].Addrs()
	require.NoError(t, err)
	assert.Len(t, as, len(want))
	for _, a := range as {
		assert.Contains(t, a, "/")
	}
	_, err = kernelIfAddrs("pvctl-none0")
	assert.Error(t, err)
}
