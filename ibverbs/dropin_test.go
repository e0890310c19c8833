package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// buildDropin runs `make dropin` into a temporary build directory and
// returns the directory holding libibverbs.so.1.
func buildDropin(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the c-shared library (-short)")
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc")
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Dir(filepath.Dir(file))
	out := t.TempDir()
	cmd := exec.Command("make", "-s", "-C", root, "dropin", "OUT="+out)
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "make dropin: %s", b)
	lib := filepath.Join(out, "vfrdma")
	require.FileExists(t, filepath.Join(lib, "libibverbs.so.1"))
	return lib
}

// run runs a program with the drop-in on LD_LIBRARY_PATH and env.
func run(t *testing.T, lib string, env []string, name string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+lib)
	cmd.Env = append(cmd.Env, env...)
	b, err := cmd.CombinedOutput()
	return string(b), err
}

// TestDropin runs the drop-in under C programs on the model: the
// conformance program (tests/dropin_test.c) and rdma-core's ibv_devinfo.
func TestDropin(t *testing.T) {
	lib := buildDropin(t)

	t.Run("TheExportedSymbolsAreTheMapsAndNoOther", func(t *testing.T) {
		b, err := exec.Command("objdump", "-T", filepath.Join(lib, "libibverbs.so.1")).Output()
		require.NoError(t, err)
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 7 || f[3] == "*UND*" || (f[2] != "DF" && f[2] != "DO") {
				continue
			}
			assert.True(t, strings.HasPrefix(f[len(f)-2], "IBVERBS_"), "%s is exported outside the map's versions", line)
		}
		assert.Contains(t, string(b), "ibv_get_device_list")
	})

	t.Run("TheConformanceProgramPassesOnTheModel", func(t *testing.T) {
		if _, err := exec.LookPath("gcc"); err != nil {
			t.Skip("no gcc")
		}
		prog := filepath.Join(t.TempDir(), "dropin_test")
		b, err := exec.Command("gcc", "-O1", "-g", "-Wall", "-Werror", "-std=gnu11", "-o", prog, "tests/dropin_test.c",
			"-L"+lib, "-l:libibverbs.so.1", "-pthread").CombinedOutput()
		require.NoError(t, err, "%s", b)
		out, err := run(t, lib, []string{"VFRDMA_MODEL=v20"}, prog)
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "FAIL") {
				t.Error(line)
			}
		}
		require.NoError(t, err, "%s", out)
		assert.Contains(t, out, "0 failures")
	})

	t.Run("IbvDevinfoListsTheModelWithItsPortActive", func(t *testing.T) {
		if _, err := exec.LookPath("ibv_devinfo"); err != nil {
			t.Skip("no ibv_devinfo (ibverbs-utils)")
		}
		out, err := run(t, lib, []string{"VFRDMA_MODEL=v20"}, "ibv_devinfo", "-v")
		require.NoError(t, err, "%s", out)
		assert.Contains(t, out, "hca_id:\tvfrdma0")
		assert.Contains(t, out, "PORT_ACTIVE")
		assert.Contains(t, out, "link_layer:\t\tEthernet")
	})

	t.Run("WithNoModelAndNoBoundFunctionTheListIsEmpty", func(t *testing.T) {
		if _, err := exec.LookPath("ibv_devinfo"); err != nil {
			t.Skip("no ibv_devinfo (ibverbs-utils)")
		}
		out, _ := run(t, lib, []string{"VFRDMA_MODEL=", "VFRDMA_SYSFS=" + t.TempDir()}, "ibv_devinfo")
		assert.Contains(t, out, "No IB devices found")
	})

	t.Run("TheLibraryPrintsNothingUnlessAsked", func(t *testing.T) {
		out, err := run(t, lib, []string{"VFRDMA_MODEL=v99"}, "ibv_devinfo")
		assert.Error(t, err)
		assert.NotContains(t, out, "vfrdma:")
		out, _ = run(t, lib, []string{"VFRDMA_MODEL=v99", "VFRDMA_DEBUG=1"}, "ibv_devinfo")
		assert.Contains(t, out, "vfrdma:", "VFRDMA_DEBUG=1 prints why the model is refused")
	})
}
