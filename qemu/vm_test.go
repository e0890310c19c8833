package qemu

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
		if tc.want == "" {
			assert.Empty(t, got, "qemuRefusal(%q)", tc.stderr)
			continue
		}
		assert.Contains(t, got, tc.want, "qemuRefusal(%q)", tc.stderr)
	}
}

func TestCheck(t *testing.T) {
	if os.Geteuid() != 0 {
		require.ErrorIs(t, Check(&Options{}), ErrNotRoot, "Check as non-root")
		return
	}
	dir := t.TempDir()
	kernel := filepath.Join(dir, "vmlinuz")
	initrd := filepath.Join(dir, "initrd")
	os.WriteFile(kernel, nil, 0o644)
	os.WriteFile(initrd, nil, 0o644)
	err := Check(&Options{QEMU: "no-such-qemu-binary"})
	assert.ErrorIs(t, err, ErrNoQEMU, "missing QEMU")
	assert.ErrorContains(t, err, "make setup", "missing QEMU")
	assert.ErrorIs(t, Check(&Options{QEMU: "true", Kernel: filepath.Join(dir, "nope")}), ErrNoKernel, "missing kernel")
	err = Check(&Options{QEMU: "true", Kernel: kernel, BackendDir: dir})
	assert.ErrorIs(t, err, ErrNoBackend, "missing backend")
	assert.ErrorContains(t, err, "make softverbs", "missing backend")
	os.WriteFile(filepath.Join(dir, "libibverbs.so.1"), nil, 0o644)
	assert.NoError(t, Check(&Options{QEMU: "true", Kernel: kernel, BackendDir: dir, Initrd: initrd}), "complete set-up")
}

func TestTailAndBudget(t *testing.T) {
	tl := newTail(3)
	for _, s := range []string{"a", "b", "c", "d", "e", "f", "g"} {
		tl.add(s)
	}
	require.Equal(t, "efg", strings.Join(tl.lines(), ""), "tail")
	var b outputBudget
	b.limit = 10
	var lines []string
	flooded := false
	scanLines(strings.NewReader("1234\n5678\nabcdef\nmore\n"), &b, func() { flooded = true }, func(s string) { lines = append(lines, s) })
	assert.True(t, flooded, "flooded")
	assert.Len(t, lines, 2, "lines %q", lines)
}
