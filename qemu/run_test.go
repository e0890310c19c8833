package qemu

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeQEMU is a stand-in for qemu-system-x86_64: the VM named vm1 dies at
// once, as a guest whose kernel panicked at boot; the others run (sleep)
// until they are killed.
const fakeQEMU = `#!/bin/sh
if [ "$SOFTVERBS_NODE" = vm1 ]; then
  echo "Kernel panic - not syncing: timer doesn't work through Interrupt-remapped IO-APIC"
  exit 0
fi
exec sleep 600
`

// A VM that dies stops the others of its run within seconds, instead of
// leaving them to wait for it until the run's limit; each VM says why it
// ended.
func TestAVMThatDiesStopsTheRun(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the bench checks it runs as root: run as root")
	}
	dir := t.TempDir()
	files := map[string]string{"qemu": fakeQEMU, "vmlinuz": "", "initrd": "", "backend/libibverbs.so.1": ""}
	for name, body := range files {
		p := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(body), 0o755))
	}
	opt := &Options{
		QEMU: filepath.Join(dir, "qemu"), BackendDir: filepath.Join(dir, "backend"),
		Kernel: filepath.Join(dir, "vmlinuz"), Initrd: filepath.Join(dir, "initrd"),
		Timeout: 5 * time.Minute, Log: discard(),
	}
	res, err := Run(context.Background(), 2, opt)
	require.NoError(t, err)
	require.Len(t, res.VMs, 2)
	assert.ErrorIs(t, res.VMs[1].Err, ErrQEMUExited)
	assert.Contains(t, res.VMs[1].Tail, "Kernel panic - not syncing: timer doesn't work through Interrupt-remapped IO-APIC")
	// Stopped by vm1's death, not by the run's limit (ErrTimeout).
	require.ErrorIs(t, res.VMs[0].Err, ErrStopped)
	assert.Contains(t, res.VMs[0].Err.Error(), "vm1 failed")
	assert.Contains(t, res.VMs[0].QEMUState, "state S", "a stopped VM says what its QEMU was doing")
}

func TestProcessStateDescribesARunningProcess(t *testing.T) {
	s := processState(os.Getpid())
	assert.Regexp(t, `^state [RSD], [0-9.]+ s CPU; threads \(state/wait/CPU\): .*[RSD]/[^/]+/[0-9.]+s`, s)
	assert.Contains(t, processState(1<<30), "unknown")
}

func TestThreadStacksOfAProcess(t *testing.T) {
	if _, err := exec.LookPath("gdb"); err != nil {
		t.Skip("gdb is not installed: stacks are left out of post-mortems")
	}
	c := exec.Command("sleep", "30")
	require.NoError(t, c.Start())
	defer c.Process.Kill()
	lines := threadStacks(c.Process.Pid)
	require.NotEmpty(t, lines)
	assert.Regexp(t, `^Thread 1 `, lines[0])
	assert.Contains(t, strings.Join(lines, "\n"), "sleep")
}
