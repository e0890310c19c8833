//go:build !guest

package am

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/pvsim"
)

// lockedKB reads VmLck, the process's locked memory in kB: a context's
// packet memory is locked (vfio.AllocMemory); nothing else the package's
// tests run locks any.
func lockedKB(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmLck:"); ok {
			f := strings.Fields(rest)
			require.NotEmpty(t, f)
			n, err := strconv.Atoi(f[0])
			require.NoError(t, err)
			return n
		}
	}
	require.FailNow(t, "no VmLck in /proc/self/status")
	return 0
}

// A destroy the device refuses at Close leaves that object (and what
// depends on it) with the device, and Close says so; the packet memory,
// whose MRs the device did let go, is freed all the same: only an MR
// that failed to close keeps its memory mapped.
func TestCloseFreesThePacketMemoryOfTheMRsThatWentWhenAnotherDestroyIsRefused(t *testing.T) {
	d, m := openModel(t, pvsim.Config{})
	before := lockedKB(t)
	c := newJob(t, d, 1, Config{})[0]
	require.Greater(t, lockedKB(t), before, "the context's packet memory is locked")
	require.NoError(t, m.InjectFault(pvsim.CommandFault{Cmd: firmware.CmdDestroyQP, Errno: syscall.EBUSY, Count: -1}))
	defer m.ClearFaults()
	err := c.Close()
	require.ErrorIs(t, err, syscall.EBUSY, "the refused destroys are reported")
	assert.Equal(t, before, lockedKB(t), "the packet memory went with its MRs")
	assert.NotZero(t, m.Objects().QPs, "the QPs the device would not destroy are still there")
}

// An MR the device does not let go keeps its memory (the device may still
// reach it); the other MR's goes.
func TestCloseKeepsOnlyTheMemoryOfAnMRTheDeviceDidNotLetGo(t *testing.T) {
	d, m := openModel(t, pvsim.Config{})
	before := lockedKB(t)
	c := newJob(t, d, 1, Config{})[0]
	whole := lockedKB(t) - before
	require.NoError(t, m.InjectFault(pvsim.CommandFault{Cmd: firmware.CmdDestroyMR, Errno: syscall.EBUSY}))
	defer m.ClearFaults()
	require.ErrorIs(t, c.Close(), syscall.EBUSY)
	kept := lockedKB(t) - before
	assert.Greater(t, kept, 0, "the refused MR's memory stays")
	assert.Less(t, kept, whole, "the other MR's memory went")
}

// New that fails part-way undoes what it made; where the device refuses
// to destroy something, New's error says so beside the cause.
func TestNewThatFailsSaysWhatItCouldNotUndo(t *testing.T) {
	d, m := openModel(t, pvsim.Config{})
	require.NoError(t, m.InjectFault(pvsim.CommandFault{Cmd: firmware.CmdCreateQP, Errno: syscall.ENOSPC}))
	require.NoError(t, m.InjectFault(pvsim.CommandFault{Cmd: firmware.CmdDestroySRQ, Errno: syscall.EBUSY}))
	defer m.ClearFaults()
	_, err := New(context.Background(), d, Config{Tasks: 1})
	require.ErrorIs(t, err, syscall.ENOSPC, "the cause")
	assert.ErrorIs(t, err, syscall.EBUSY, "what the clean-up could not undo")
	assert.Contains(t, err.Error(), "undoing")
}
