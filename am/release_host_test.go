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

// A second Close retries the deregistration the device refused, returns
// its error while the device still refuses, and frees the MR's memory
// once the device lets go; a Close after that returns nil.
func TestASecondCloseRetriesTheRefusedDeregistrationAndFreesItsMemory(t *testing.T) {
	d, m := openModel(t, pvsim.Config{})
	base := m.Objects()
	before := lockedKB(t)
	c := newJob(t, d, 1, Config{})[0]
	require.NoError(t, m.InjectFault(pvsim.CommandFault{Cmd: firmware.CmdDestroyMR, Errno: syscall.EBUSY, Count: -1}))
	defer m.ClearFaults()
	require.ErrorIs(t, c.Close(), syscall.EBUSY)
	require.Greater(t, lockedKB(t), before, "the refused MRs' memory stays")
	assert.ErrorIs(t, c.Close(), syscall.EBUSY, "a retry the device refuses again says so")
	assert.Greater(t, lockedKB(t), before, "and the memory stays")
	m.ClearFaults()
	require.NoError(t, c.Close(), "the retry the device accepts")
	assert.Equal(t, before, lockedKB(t), "the MRs' memory went with them")
	assert.Equal(t, base, m.Objects(), "the device holds nothing of the context")
	assert.NoError(t, c.Close(), "a Close after one that freed everything")
	assert.ErrorIs(t, c.Amsend(0, 1, nil, nil, Counters{}), ErrClosed)
}

// A second Close retries every destroy the device refused (QPs, SRQ, CQ,
// PD), not only the MRs'.
func TestASecondCloseRetriesEveryRefusedDestroy(t *testing.T) {
	d, m := openModel(t, pvsim.Config{})
	base := m.Objects()
	c := newJob(t, d, 1, Config{})[0]
	for _, cmd := range []firmware.Cmd{firmware.CmdDestroyQP, firmware.CmdDestroySRQ, firmware.CmdDestroyCQ, firmware.CmdDestroyPD} {
		require.NoError(t, m.InjectFault(pvsim.CommandFault{Cmd: cmd, Errno: syscall.EBUSY, Count: -1}))
	}
	defer m.ClearFaults()
	require.ErrorIs(t, c.Close(), syscall.EBUSY)
	kept := m.Objects()
	require.NotZero(t, kept.QPs)
	require.NotZero(t, kept.SRQs)
	require.NotZero(t, kept.CQs)
	require.NotZero(t, kept.PDs)
	m.ClearFaults()
	require.NoError(t, c.Close())
	assert.Equal(t, base, m.Objects(), "the retry destroyed what the first Close could not")
}

// Context, then device, the documented order: what the context's Close
// could not deregister, the device's Close destroys, and it then frees
// the packet memory, with no further Close of the context.
func TestClosingTheDeviceFreesThePacketMemoryOfTheMRsItKeptFromAClosedContext(t *testing.T) {
	d, m := openModel(t, pvsim.Config{})
	before := lockedKB(t)
	c := newJob(t, d, 1, Config{})[0]
	require.NoError(t, m.InjectFault(pvsim.CommandFault{Cmd: firmware.CmdDestroyMR, Errno: syscall.EBUSY, Count: -1}))
	defer m.ClearFaults()
	require.ErrorIs(t, c.Close(), syscall.EBUSY)
	require.Greater(t, lockedKB(t), before)
	require.Error(t, d.Close(), "the device still refuses the MRs' destroys")
	assert.Equal(t, before, lockedKB(t), "the device's Close freed the kept memory")
	assert.Equal(t, pvsim.DMAUse{}, m.DMA(), "the device maps nothing")
	assert.NoError(t, c.Close(), "the context's Close after the device's")
}

// After DEVICE_FATAL the device refuses every destroy; closing the
// context, then the device, still leaks nothing.
func TestAfterDeviceFatalClosingTheContextThenTheDeviceLeaksNothing(t *testing.T) {
	d, m := openModel(t, pvsim.Config{})
	before := lockedKB(t)
	c := newJob(t, d, 1, Config{})[0]
	require.NoError(t, m.Fatal())
	require.Error(t, c.Close(), "the dead device refuses the destroys")
	require.Greater(t, lockedKB(t), before, "the packet memory stays while the device may reach it")
	assert.Error(t, c.Close(), "a retry the dead device refuses again")
	_ = d.Close() // the dead device refuses the destroys: it shuts them all the same
	assert.Equal(t, before, lockedKB(t), "the device's Close freed the packet memory")
	assert.Equal(t, pvsim.DMAUse{}, m.DMA(), "the device maps nothing")
	assert.NoError(t, c.Close(), "the context's Close after the device's")
}

// Memory New's failed clean-up could not free (the device refused to
// deregister its MR) goes when the device is closed.
func TestThePacketMemoryNewsCleanUpKeptGoesWithTheDevice(t *testing.T) {
	d, m := openModel(t, pvsim.Config{})
	before := lockedKB(t)
	require.NoError(t, m.InjectFault(pvsim.CommandFault{Cmd: firmware.CmdCreateQP, Errno: syscall.ENOSPC}))
	require.NoError(t, m.InjectFault(pvsim.CommandFault{Cmd: firmware.CmdDestroyMR, Errno: syscall.EBUSY, Count: -1}))
	defer m.ClearFaults()
	_, err := New(context.Background(), d, Config{Tasks: 1})
	require.ErrorIs(t, err, syscall.ENOSPC, "the cause")
	require.ErrorIs(t, err, syscall.EBUSY, "what the clean-up could not undo")
	require.Greater(t, lockedKB(t), before, "the MRs' memory stays while the device may reach it")
	m.ClearFaults()
	require.NoError(t, d.Close())
	assert.Equal(t, before, lockedKB(t), "the device's Close freed it")
}
