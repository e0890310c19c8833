package qemu

import (
	"errors"
	"io"
	"log/slog"
	"os"
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
