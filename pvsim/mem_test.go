package pvsim_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma/pvsim"
)

// DMA counts what is mapped for the device now, through every handle:
// a buffer counts from AllocDMA to its Close, a MapDMA range from the map
// to the unmap, and a handle's Close takes away what it mapped; the
// Device's Close takes away everything.
func TestDMACountsWhatIsMappedNowThroughEveryHandle(t *testing.T) {
	m, err := pvsim.New(pvsim.Config{})
	require.NoError(t, err)
	defer m.Close()
	assert.Equal(t, pvsim.DMAUse{}, m.DMA(), "a new model maps nothing")

	b, err := m.AllocDMA(5000, false)
	require.NoError(t, err)
	assert.Equal(t, pvsim.DMAUse{Buffers: 1, BufferBytes: 8192}, m.DMA(), "whole pages")
	mem := alignedPages(t, 2)
	iova, err := m.MapDMA(mem)
	require.NoError(t, err)
	assert.Equal(t, pvsim.DMAUse{Buffers: 1, BufferBytes: 8192, Maps: 1, MapBytes: 8192}, m.DMA())

	f := m.Function()
	_, err = f.AllocDMA(4096, false)
	require.NoError(t, err)
	_, err = f.MapDMA(alignedPages(t, 1))
	require.NoError(t, err)
	assert.Equal(t, pvsim.DMAUse{Buffers: 2, BufferBytes: 12288, Maps: 2, MapBytes: 12288}, m.DMA(), "every handle's")
	require.NoError(t, f.Close())
	assert.Equal(t, pvsim.DMAUse{Buffers: 1, BufferBytes: 8192, Maps: 1, MapBytes: 8192}, m.DMA(), "a handle's Close takes its own")

	require.NoError(t, b.Close())
	require.NoError(t, m.UnmapDMA(iova, len(mem)))
	assert.Equal(t, pvsim.DMAUse{}, m.DMA(), "freed and unmapped")

	_, err = m.AllocDMA(4096, false)
	require.NoError(t, err)
	require.NoError(t, m.Close())
	assert.Equal(t, pvsim.DMAUse{}, m.DMA(), "Close frees everything")
}

// alignedPages returns n pages of memory on a page boundary, unmapped at
// the end of the test.
func alignedPages(t *testing.T, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n*4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(b) })
	return b
}
