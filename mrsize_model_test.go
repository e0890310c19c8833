package vfrdma_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/pvsim"
)

// An MR may be as long as the device's max_mr_size and not a byte longer,
// whether the driver allocates its memory or the caller brings it.
func TestAnMRMayBeAsLongAsMaxMRSizeAndNotAByteLonger(t *testing.T) {
	const limit = 64 << 10
	d, _ := openModel(t, pvsim.Config{Version: 18, Caps: func(c *firmware.Caps) { c.MaxMRSize = limit }}, nil)
	ctx := ctxT(t)
	pd, err := d.AllocPD(ctx)
	require.NoError(t, err)

	mr, err := pd.AllocMR(ctx, limit, vfrdma.AccessLocalWrite)
	require.NoError(t, err, "AllocMR of max_mr_size bytes")
	require.NoError(t, mr.Close())
	_, err = pd.AllocMR(ctx, limit+1, vfrdma.AccessLocalWrite)
	assert.ErrorIs(t, err, vfrdma.ErrInvalid, "AllocMR a byte past max_mr_size")

	page := unix.Getpagesize()
	mem, err := unix.Mmap(-1, 0, limit+page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Munmap(mem) })
	mr, err = pd.RegisterMR(ctx, mem[:limit], vfrdma.AccessLocalWrite)
	require.NoError(t, err, "RegisterMR of max_mr_size bytes")
	require.NoError(t, mr.Close())
	_, err = pd.RegisterMR(ctx, mem[:limit+1], vfrdma.AccessLocalWrite)
	assert.ErrorIs(t, err, vfrdma.ErrInvalid, "RegisterMR a byte past max_mr_size")
}

// AllocMR registers the size asked for, not the pages (or huge page) its
// memory was rounded up to: the device is told that length, and Len and
// Bytes say it.
func TestAllocMRRegistersTheSizeAskedForNotTheRoundedMemory(t *testing.T) {
	d, m := openModel(t, pvsim.Config{Version: 18}, nil)
	ctx := ctxT(t)
	pd, err := d.AllocPD(ctx)
	require.NoError(t, err)
	for _, size := range []int{1, 100, 4095, 4097, 3 << 20} {
		mr, err := pd.AllocMR(ctx, size, vfrdma.AccessLocalWrite|vfrdma.AccessRemoteWrite)
		require.NoError(t, err, "AllocMR(%d)", size)
		assert.Equal(t, size, mr.Len(), "Len of AllocMR(%d)", size)
		assert.Len(t, mr.Bytes(), size, "Bytes of AllocMR(%d)", size)
		var length []uint64
		for _, info := range m.MRs() {
			if info.Handle == mr.Handle() {
				length = append(length, info.Length)
			}
		}
		assert.Equal(t, []uint64{uint64(size)}, length, "the length the device was given for AllocMR(%d)", size)
		require.NoError(t, mr.Close())
	}
}
