package vfio

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const mib = 1 << 20

func TestIOVAWindowDefault(t *testing.T) {
	a := newIOVAAllocator(nil, defaultIOVABase, defaultIOVALimit, 4096)
	assert.Equal(t, []span{{1 * mib, msiWindowStart}, {msiWindowEnd + 1, 1 << 32}}, a.free)
}

func TestIOVAWindowReported(t *testing.T) {
	// What the QEMU guest's kernel reports with intel-iommu (39-bit).
	valid := []IOVARange{{0, 0xfedfffff}, {0xfef00000, 0x7fffffffff}}
	a := newIOVAAllocator(valid, defaultIOVABase, defaultIOVALimit, 4096)
	assert.Equal(t, []span{{1 * mib, 0xfee00000}, {0xfef00000, 1 << 32}}, a.free)
	// A range ending at the top of the address space must not overflow.
	a = newIOVAAllocator([]IOVARange{{0, ^uint64(0)}}, 0, ^uint64(0), 4096)
	assert.Equal(t, []span{{0, alignDown(^uint64(0)-1+1, 4096)}}, a.free, "full window")
	// Unaligned reported bounds shrink inward; empty and inverted ranges
	// are dropped.
	a = newIOVAAllocator([]IOVARange{{0x100001, 0x300ffe}, {5, 4}, {0x400000, 0x400fff}}, 0, 1<<40, 4096)
	assert.Equal(t, []span{{0x101000, 0x300000}, {0x400000, 0x401000}}, a.free)
	// Overlapping input ranges are merged.
	a = newIOVAAllocator([]IOVARange{{0x200000, 0x3fffff}, {0x100000, 0x2fffff}}, 0, 1<<40, 4096)
	assert.Equal(t, []span{{0x100000, 0x400000}}, a.free, "merged window")
	a = newIOVAAllocator(nil, 10*mib, 5*mib, 4096)
	assert.Empty(t, a.free, "base above limit")
}

func TestIOVAAllocFree(t *testing.T) {
	a := newIOVAAllocator(nil, defaultIOVABase, defaultIOVALimit, 4096)
	total := a.freeBytes()
	x, ok := a.alloc(4096, 0)
	require.True(t, ok)
	require.Equal(t, uint64(1*mib), x, "first alloc")
	y, ok := a.alloc(2*mib, 2*mib)
	require.True(t, ok)
	require.Equal(t, uint64(2*mib), y, "aligned alloc")
	z, ok := a.alloc(4096, 0)
	require.True(t, ok)
	require.Equal(t, uint64(1*mib+4096), z, "third alloc: the gap before the aligned one")
	_, ok = a.alloc(100, 0)
	assert.False(t, ok, "unaligned size allocated")
	_, ok = a.alloc(0, 0)
	assert.False(t, ok, "zero size allocated")
	_, ok = a.alloc(1<<33, 0)
	assert.False(t, ok, "oversize allocated")
	for _, r := range [][2]uint64{{y, 2 * mib}, {x, 4096}, {z, 4096}} {
		require.NoError(t, a.release(r[0], r[1]))
	}
	assert.Equal(t, total, a.freeBytes(), "after freeing all: %x", a.free)
	assert.Len(t, a.free, 2, "after freeing all: %x", a.free)
	assert.ErrorIs(t, a.release(x, 4096), ErrRange, "double free")
	assert.ErrorIs(t, a.release(0, 4096), ErrRange, "free outside window")
	assert.ErrorIs(t, a.release(x+1, 4096), ErrAlignment, "unaligned free")
}

// checkAllocator verifies the allocator's invariants against the set of
// live allocations.
func checkAllocator(t *testing.T, a *iovaAllocator, live map[uint64]uint64, total uint64) {
	t.Helper()
	var used uint64
	for s, n := range live {
		used += n
		for _, f := range a.free {
			require.False(t, s < f.end && f.start < s+n, "live %#x+%#x overlaps free %x", s, n, f)
		}
	}
	for i, f := range a.free {
		require.False(t, f.start >= f.end || (i > 0 && a.free[i-1].end >= f.start), "free list not sorted/disjoint/merged: %x", a.free)
	}
	require.Equal(t, total, used+a.freeBytes(), "used %#x + free %#x against the window", used, a.freeBytes())
}

func FuzzIOVAAllocator(f *testing.F) {
	f.Add(uint64(1), []byte{1, 2, 3, 0x81, 4, 0x82})
	f.Add(uint64(42), []byte{10, 10, 10, 0x80, 0x80, 0x80, 7})
	f.Fuzz(func(t *testing.T, seed uint64, ops []byte) {
		rng := rand.New(rand.NewPCG(seed, 0))
		valid := []IOVARange{{0, 0xfedfffff}, {0xfef00000, 0x7fffffffff}}
		a := newIOVAAllocator(valid, 1*mib, 0xff000000, 4096)
		total := a.freeBytes()
		live := map[uint64]uint64{}
		var order []uint64
		for _, op := range ops {
			if op&0x80 != 0 && len(order) > 0 {
				i := int(op&0x7f) % len(order)
				s := order[i]
				order = slices.Delete(order, i, i+1)
				require.NoError(t, a.release(s, live[s]))
				delete(live, s)
			} else {
				size := uint64(op&0x3f+1) * 4096 * uint64(1+rng.IntN(64))
				align := uint64(4096) << rng.IntN(10)
				s, ok := a.alloc(size, align)
				if !ok {
					continue
				}
				require.False(t, s%align != 0 || s < 1*mib || s+size > 0xff000000 || (s < 0xfef00000 && s+size > 0xfee00000), "alloc(%#x, %#x) = %#x", size, align, s)
				live[s] = size
				order = append(order, s)
			}
			checkAllocator(t, a, live, total)
		}
		for _, s := range order {
			require.NoError(t, a.release(s, live[s]))
			delete(live, s)
		}
		require.Equal(t, a.window, a.free, "after freeing everything")
	})
}

// A release that overlaps free space is a double free and is refused,
// whether the free space lies after the range or before it (a free span
// that starts below the range and runs into it); nothing changes.
func TestIOVAReleaseOverlappingFreeSpaceOnEitherSideIsRefused(t *testing.T) {
	const p = 4096
	base := uint64(1 * mib)
	a := newIOVAAllocator([]IOVARange{{0, 1<<32 - 1}}, base, base+16*p, p)
	at, ok := a.alloc(8*p, p)
	require.True(t, ok)
	require.Equal(t, base, at)
	require.NoError(t, a.release(base+2*p, 2*p))
	before := slices.Clone(a.free)
	for _, r := range []struct{ start, size uint64 }{
		{base + 3*p, 2 * p}, // free space before it runs into it
		{base + 1*p, 2 * p}, // free space after its start
		{base + 7*p, 2 * p}, // the free space past the allocation
	} {
		assert.ErrorIs(t, a.release(r.start, r.size), ErrRange, "release %#x+%#x over free space", r.start, r.size)
		require.Equal(t, before, a.free, "a refused release changed the free list")
	}
}

// A range that ends exactly at the window's end is inside it: it can be
// released; one a page past it cannot.
func TestIOVAReleaseMayEndExactlyAtTheWindowsEndAndNotAPageLater(t *testing.T) {
	const p = 4096
	base := uint64(1 * mib)
	a := newIOVAAllocator([]IOVARange{{0, 1<<32 - 1}}, base, base+16*p, p)
	at, ok := a.alloc(16*p, p)
	require.True(t, ok)
	require.Equal(t, base, at)
	assert.ErrorIs(t, a.release(base+16*p, p), ErrRange, "release a page past the window")
	require.NoError(t, a.release(base+15*p, p), "release of the window's last page")
	at, ok = a.alloc(p, p)
	assert.True(t, ok, "the last page is free again")
	assert.Equal(t, base+15*p, at)
}
