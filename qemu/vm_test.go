package qemu

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestQEMURefusal(t *testing.T) {
	for _, tc := range []struct{ stderr, want string }{
		{"qemu-system-x86_64: -chardev socket,id=mad,path=/x: Failed to connect to '/x': No such file", "MAD mux socket"},
		{"rdma: Failed to get IB devices list", "backend was not loaded"},
		{"qemu-system-x86_64: -device pvrdma: Failed to find IB device softverbs0", "no device named"},
		{"qemu-system-x86_64: symbol lookup error: qemu-system-x86_64: undefined symbol: ibv_foo, version IBVERBS_1.1", "lacks a symbol"},
		{"pvrdma: Only shared memory backed ram is supported", "share=on"},
		{"pvrdma: Device on 10.0 must be vmxnet3", "vmxnet3"},
		{"'pvrdma' is not a valid device model name", "no pvrdma device"},
		{"something else entirely", ""},
	} {
		got := qemuRefusal(strings.Split(tc.stderr, "\n"), "/x")
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("qemuRefusal(%q) = %q, want it to mention %q", tc.stderr, got, tc.want)
		}
	}
}

func TestCheck(t *testing.T) {
	if os.Geteuid() != 0 {
		if err := Check(&Options{}); !errors.Is(err, ErrNotRoot) {
			t.Fatalf("Check as non-root = %v", err)
		}
		return
	}
	dir := t.TempDir()
	kernel := filepath.Join(dir, "vmlinuz")
	initrd := filepath.Join(dir, "initrd")
	os.WriteFile(kernel, nil, 0o644)
	os.WriteFile(initrd, nil, 0o644)
	if err := Check(&Options{QEMU: "no-such-qemu-binary"}); !errors.Is(err, ErrNoQEMU) || !strings.Contains(err.Error(), "make setup") {
		t.Errorf("missing QEMU: %v", err)
	}
	if err := Check(&Options{QEMU: "true", Kernel: filepath.Join(dir, "nope")}); !errors.Is(err, ErrNoKernel) {
		t.Errorf("missing kernel: %v", err)
	}
	if err := Check(&Options{QEMU: "true", Kernel: kernel, BackendDir: dir}); !errors.Is(err, ErrNoBackend) || !strings.Contains(err.Error(), "make softverbs") {
		t.Errorf("missing backend: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "libibverbs.so.1"), nil, 0o644)
	if err := Check(&Options{QEMU: "true", Kernel: kernel, BackendDir: dir, Initrd: initrd}); err != nil {
		t.Errorf("complete set-up: %v", err)
	}
}

func TestTailAndBudget(t *testing.T) {
	tl := newTail(3)
	for _, s := range []string{"a", "b", "c", "d", "e", "f", "g"} {
		tl.add(s)
	}
	if got := strings.Join(tl.lines(), ""); got != "efg" {
		t.Fatalf("tail = %q", got)
	}
	var b outputBudget
	b.limit = 10
	var lines []string
	flooded := false
	scanLines(strings.NewReader("1234\n5678\nabcdef\nmore\n"), &b, func() { flooded = true }, func(s string) { lines = append(lines, s) })
	if !flooded || len(lines) != 2 {
		t.Fatalf("flooded %v, lines %q", flooded, lines)
	}
}

// The refusals as the real QEMU words them: started with a mux socket that
// is gone, and with a verbs library that has no device.
func TestQEMURefusesForReal(t *testing.T) {
	qemuBin, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 is not installed (make setup installs it)")
	}
	dir := t.TempDir()
	// QEMU loads the kernel before it realizes devices: use the bench's.
	kernel, _ := filepath.Abs("../.cache/kernel/vmlinuz")
	if _, err := os.Stat(kernel); err != nil {
		t.Skipf("no guest kernel at %s (make setup fetches it)", kernel)
	}
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
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
				muxPath = ln.Addr().String()
			}
			ctl, err := net.Listen("unix", filepath.Join(dir, tc.name+".ctl"))
			if err != nil {
				t.Fatal(err)
			}
			defer ctl.Close()
			oo := o
			if tc.name == "kernel gone" {
				oo.Kernel = filepath.Join(dir, "no-vmlinuz")
			}
			cmd := exec.Command(qemuBin, qemuArgs(&oo, 0, 1, muxPath, ctl.Addr().String(), "")...)
			cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+tc.lib)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("QEMU started; output:\n%s", out)
			}
			got := qemuRefusal(strings.Split(string(out), "\n"), muxPath)
			if !strings.Contains(got, tc.want) {
				t.Fatalf("refusal %q, want it to mention %q; QEMU said:\n%s", got, tc.want, out)
			}
		})
	}
}
