//go:build bench

package qemu

// Tests that start QEMU: not in the host tier (`go test ./...` starts no
// VM); they run with the bench tag, in the guest tier of `make test`
// (`go test -tags bench ./qemu/...`), where a missing QEMU or guest
// kernel is a failure that says what to install.

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The refusals as the real QEMU words them: started with a mux socket that
// is gone, and with a verbs library that has no device.
func TestQEMURefusesForReal(t *testing.T) {
	qemuBin, err := exec.LookPath("qemu-system-x86_64")
	require.NoError(t, err, "qemu-system-x86_64 is not installed (make setup installs it)")
	dir := t.TempDir()
	// QEMU loads the kernel before it realizes devices: use the bench's.
	kernel, _ := filepath.Abs("../.cache/kernel/vmlinuz")
	_, err = os.Stat(kernel)
	require.NoError(t, err, "no guest kernel (make setup fetches it)")
	initrd := filepath.Join(dir, "initrd")
	os.WriteFile(initrd, []byte("not an archive"), 0o644)
	o := (&Options{Kernel: kernel, Initrd: initrd}).withDefaults()
	for _, tc := range []struct {
		name, lib, want string
		mux             bool
	}{
		{"mux gone", "/nonexistent", "MAD mux socket", false},
		{"kernel gone", "/nonexistent", "guest kernel", true},
		{"no RDMA device", "/usr/lib/x86_64-linux-gnu", "backend was not loaded", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			muxPath := filepath.Join(dir, "gone.sock")
			if tc.mux {
				ln, err := net.Listen("unix", filepath.Join(dir, tc.name+".sock"))
				require.NoError(t, err)
				defer ln.Close()
				muxPath = ln.Addr().String()
			}
			ctl, err := net.Listen("unix", filepath.Join(dir, tc.name+".ctl"))
			require.NoError(t, err)
			defer ctl.Close()
			oo := o
			if tc.name == "kernel gone" {
				oo.Kernel = filepath.Join(dir, "no-vmlinuz")
			}
			cmd := exec.Command(qemuBin, qemuArgs(&oo, 0, 1, muxPath, ctl.Addr().String(), "")...)
			cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+tc.lib)
			out, err := cmd.CombinedOutput()
			require.Error(t, err, "QEMU started; output:\n%s", out)
			got := qemuRefusal(strings.Split(string(out), "\n"), muxPath)
			assert.Contains(t, got, tc.want, "QEMU said:\n%s", out)
		})
	}
}
