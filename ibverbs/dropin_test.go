package main

import (
	"cmp"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

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
		t.Fatal("no gcc: make setup installs it")
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
			t.Fatal("no gcc: make setup installs it")
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

	t.Run("PollcostMeasuresAVerbsCostThroughTheDropin", func(t *testing.T) {
		if _, err := exec.LookPath("gcc"); err != nil {
			t.Fatal("no gcc: make setup installs it")
		}
		prog := filepath.Join(t.TempDir(), "pollcost")
		b, err := exec.Command("gcc", "-O2", "-Wall", "-Werror", "-std=gnu11", "-o", prog, "tests/pollcost.c",
			"-L"+lib, "-l:libibverbs.so.1").CombinedOutput()
		require.NoError(t, err, "%s", b)
		out, err := run(t, lib, []string{"VFRDMA_MODEL=qemu", "VFRDMA_POLL_PACE=every"}, prog, "1000")
		require.NoError(t, err, "%s", out)
		assert.Regexp(t, `^pollcost vfrdma0: empty ibv_poll_cq \d+ ns, ibv_ack_cq_events \d+ ns \(best of 5 rounds of 1000\)\n$`, out)
		assert.NotContains(t, out, "calls:", "no counts unasked")
		// VFRDMA_CALLS=1 counts the data path's calls: five rounds of
		// 1000 empty polls.
		out, err = run(t, lib, []string{"VFRDMA_MODEL=qemu", "VFRDMA_CALLS=1"}, prog, "1000")
		require.NoError(t, err, "%s", out)
		assert.Contains(t, out, "vfrdma: vfrdma0: calls: post_send 0 (0 WRs), post_recv 0 (0 WRs), poll_cq 5000 (5000 empty, 0 completions), req_notify_cq 0\n")
		out, err = run(t, lib, []string{"VFRDMA_MODEL=qemu", "VFRDMA_POLL_PACE=fast"}, prog, "1000")
		require.Error(t, err, "a pace that is no duration fails the open")
		assert.Contains(t, out, "cannot open vfrdma0")
	})

	t.Run("IbvDevinfoListsTheModelWithItsPortActive", func(t *testing.T) {
		if _, err := exec.LookPath("ibv_devinfo"); err != nil {
			t.Fatal("no ibv_devinfo: make setup installs ibverbs-utils")
		}
		out, err := run(t, lib, []string{"VFRDMA_MODEL=v20"}, "ibv_devinfo", "-v")
		require.NoError(t, err, "%s", out)
		assert.Contains(t, out, "hca_id:\tvfrdma0")
		assert.Contains(t, out, "PORT_ACTIVE")
		assert.Contains(t, out, "link_layer:\t\tEthernet")
	})

	t.Run("WithNoModelAndNoBoundFunctionTheListIsEmpty", func(t *testing.T) {
		if _, err := exec.LookPath("ibv_devinfo"); err != nil {
			t.Fatal("no ibv_devinfo: make setup installs ibverbs-utils")
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

// listening reports whether a TCP socket listens on port (from
// /proc/net/tcp and tcp6: connecting to learn it would be the server's
// one connection).
func listening(port int) bool {
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) > 3 && fs[3] == "0A" && strings.HasSuffix(fs[1], fmt.Sprintf(":%04X", port)) {
				return true
			}
		}
	}
	return false
}

// lockedBuffer is a buffer one goroutine writes while another reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// freePort returns a TCP port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Unmodified verbs programs between two processes on the host, each with
// its own device model (version 20) on one fabric directory
// (VFRDMA_FABRIC): rdma-core's pingpongs (RC, UD, SRQ) and perftest,
// whose one-sided programs (RDMA WRITE, READ, atomics) QEMU's device
// cannot carry. Every program exits 0, and the directory is left empty.
func TestVerbsProgramsRunBetweenTwoProcessesOnTheModelsFabric(t *testing.T) {
	lib := buildDropin(t)
	dir, err := os.MkdirTemp("", "vfab")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, tc := range []struct {
		prog  string
		args  []string
		want  string // in the client's output
		model string // VFRDMA_MODEL, v20 if empty
	}{
		{"ibv_rc_pingpong", []string{"-g", "0", "-n", "100", "-s", "4096"}, "100 iters in", ""},
		{"ibv_ud_pingpong", []string{"-g", "0", "-n", "100", "-s", "1024"}, "100 iters in", ""},
		{"ibv_srq_pingpong", []string{"-g", "0", "-n", "100", "-q", "4"}, "100 iters in", ""},
		{"ib_send_bw", []string{"-x", "0", "-n", "1000", "-s", "64"}, "MsgRate", ""},
		{"ib_send_lat", []string{"-x", "0", "-n", "300", "-s", "64"}, "t_typical", ""},
		{"ib_write_bw", []string{"-x", "0", "-n", "1000", "-s", "4096"}, "MsgRate", ""},
		{"ib_read_lat", []string{"-x", "0", "-n", "300", "-s", "64"}, "t_typical", ""},
		{"ib_atomic_bw", []string{"-x", "0", "-n", "500"}, "MsgRate", ""},
		// QEMU's device completes every send; perftest signals one in 100
		// (its default CQ moderation) and counts 100 per completion: the
		// drop-in shows only the signaled sends' completions.
		{"ib_send_bw", []string{"-x", "0", "-n", "1000", "-s", "64"}, "MsgRate", "qemu"},
	} {
		model := cmp.Or(tc.model, "v20")
		env := []string{"VFRDMA_MODEL=" + model, "VFRDMA_FABRIC=" + dir}
		t.Run(tc.prog+"/"+model, func(t *testing.T) {
			if _, err := exec.LookPath(tc.prog); err != nil {
				t.Fatalf("%s is not installed (make setup installs ibverbs-utils and perftest)", tc.prog)
			}
			port := freePort(t)
			args := append(append([]string(nil), tc.args...), "-p", fmt.Sprint(port))
			srv := exec.Command(tc.prog, args...)
			srv.Env = append(append(os.Environ(), "LD_LIBRARY_PATH="+lib), env...)
			var srvOut lockedBuffer // written by exec's copier, read here
			srv.Stdout, srv.Stderr = &srvOut, &srvOut
			require.NoError(t, srv.Start())
			done := make(chan error, 1)
			go func() { done <- srv.Wait() }()
			t.Cleanup(func() {
				_ = srv.Process.Kill()
				<-done
			})
			require.Eventually(t, func() bool { return listening(port) }, time.Minute, 5*time.Millisecond, "the server never listened")
			out, err := run(t, lib, env, tc.prog, append(args, "127.0.0.1")...)
			require.NoError(t, err, "client: %s\nserver: %s", out, srvOut.String())
			assert.Contains(t, out, tc.want)
			select {
			case err := <-done:
				done <- err
				require.NoError(t, err, "server: %s", srvOut.String())
			case <-time.After(time.Minute):
				t.Fatalf("the server did not end: %s", srvOut.String())
			}
		})
	}
	left, err := filepath.Glob(filepath.Join(dir, "*", "*"))
	require.NoError(t, err)
	assert.Empty(t, left, "every process left the fabric directory as it closed")
}
