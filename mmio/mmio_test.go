package mmio_test

import (
	"encoding/binary"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/mmio"
)

func newRegion(t testing.TB, n int) ([]byte, *mmio.Region) {
	t.Helper()
	mem := make([]byte, n)
	r, err := mmio.New(mem)
	require.NoError(t, err)
	return mem, r
}

func TestLoadStore(t *testing.T) {
	mem, r := newRegion(t, 256)
	require.Equal(t, 256, r.Len())
	binary.LittleEndian.PutUint32(mem[0:], 17)
	v, err := r.Load32(0)
	require.NoError(t, err)
	assert.Equal(t, uint32(17), v)

	require.NoError(t, r.Store32(0x14, 0xdeadbeef))
	assert.Equal(t, uint32(0xdeadbeef), binary.LittleEndian.Uint32(mem[0x14:]), "memory after Store32")
	// A 32-bit store touches exactly four bytes.
	for i, b := range mem {
		if (i < 0x14 || i >= 0x18) && i >= 4 {
			assert.Zero(t, b, "Store32 wrote byte %#x", i)
		}
	}
	require.NoError(t, r.Store64(0xf8, 0x0102030405060708))
	assert.Equal(t, uint64(0x0102030405060708), binary.LittleEndian.Uint64(mem[0xf8:]), "memory after Store64")
	v64, err := r.Load64(0xf8)
	require.NoError(t, err)
	assert.Equal(t, uint64(0x0102030405060708), v64)
	v, err = r.Load32(0xfc)
	require.NoError(t, err)
	assert.Equal(t, uint32(0x01020304), v)
}

func TestChecks(t *testing.T) {
	_, r := newRegion(t, 256)
	cases := []struct {
		name string
		f    func() error
		want error
	}{
		{"Load32 end", func() error { _, err := r.Load32(256); return err }, mmio.ErrRange},
		{"Load32 straddle", func() error { _, err := r.Load32(254); return err }, mmio.ErrRange},
		{"Load32 negative", func() error { _, err := r.Load32(-4); return err }, mmio.ErrRange},
		{"Load32 misaligned", func() error { _, err := r.Load32(2); return err }, mmio.ErrAlignment},
		{"Load64 misaligned", func() error { _, err := r.Load64(4); return err }, mmio.ErrAlignment},
		{"Load64 end", func() error { _, err := r.Load64(252); return err }, mmio.ErrRange},
		{"Store32 end", func() error { return r.Store32(256, 1) }, mmio.ErrRange},
		{"Store32 misaligned", func() error { return r.Store32(1, 1) }, mmio.ErrAlignment},
		{"Store64 misaligned", func() error { return r.Store64(12, 1) }, mmio.ErrAlignment},
		{"Store64 huge", func() error { return r.Store64(int(^uint(0)>>1), 1) }, mmio.ErrRange},
		{"Load32 last", func() error { _, err := r.Load32(252); return err }, nil},
		{"Load64 last", func() error { _, err := r.Load64(248); return err }, nil},
	}
	for _, c := range cases {
		err := c.f()
		if c.want == nil {
			assert.NoError(t, err, c.name)
			continue
		}
		assert.ErrorIs(t, err, c.want, c.name)
		var ae *mmio.AccessError
		assert.ErrorAs(t, err, &ae, c.name)
	}
	var zero mmio.Region
	_, err := zero.Load32(0)
	assert.ErrorIs(t, err, mmio.ErrRange, "zero Region Load32")
}

func TestNewMisaligned(t *testing.T) {
	mem := make([]byte, 64)
	_, err := mmio.New(mem[4:])
	assert.ErrorIs(t, err, mmio.ErrAlignment)
	_, err = mmio.New(nil)
	assert.NoError(t, err)
}

func TestSub(t *testing.T) {
	mem, r := newRegion(t, 256)
	s, err := r.Sub(0x40, 0x10)
	require.NoError(t, err)
	require.NoError(t, s.Store32(0xc, 5))
	assert.Equal(t, byte(5), mem[0x4c], "Sub store landed elsewhere")
	assert.ErrorIs(t, s.Store32(0x10, 5), mmio.ErrRange, "store past Sub end")
	_, err = r.Sub(4, 8)
	assert.ErrorIs(t, err, mmio.ErrAlignment, "Sub misaligned")
	_, err = r.Sub(0xf8, 0x10)
	assert.ErrorIs(t, err, mmio.ErrRange, "Sub too long")
}

// together starts n goroutines running f and returns when all have
// returned. Each waits until all have started, so that on a machine with
// two or more CPUs their loops run at the same time.
func together(n int, f func(g int)) {
	var wg sync.WaitGroup
	var arrived atomic.Int32
	for g := range n {
		wg.Go(func() {
			arrived.Add(1)
			for arrived.Load() < int32(n) {
				runtime.Gosched()
			}
			f(g)
		})
	}
	wg.Wait()
}

// The loops of TestConcurrent run until each goroutine has seen the other
// change its register this many times (proof that they overlapped), or for
// at most maxRounds stores.
const (
	overlaps  = 20000
	maxRounds = 1 << 22
)

// TestConcurrent: concurrent accesses neither spill into a neighbour nor
// tear. Two writers own the two 32-bit halves of one 8-byte word and read
// their own back after every store: a 32-bit store done as a wider
// read-modify-write (what the assembly helper exists to avoid) loses the
// neighbour's value and the neighbour reads back a stale one. Then a writer
// stores 64-bit values whose halves are equal while a reader loads them: a
// store or a load split in two halves shows unequal halves.
func TestConcurrent(t *testing.T) {
	mem, r := newRegion(t, 32)
	var last [2]uint32
	together(2, func(g int) {
		off, other := 8+4*g, 8+4*(1-g)
		seen, prev := 0, uint32(0)
		i := uint32(1)
		for ; i <= maxRounds && seen < overlaps; i++ {
			// Plain comparisons in the loop: testify's cost more than the
			// accesses and would keep the two loops from overlapping.
			v := uint32(g+1)<<28 | i
			err := r.Store32(off, v)
			got, err2 := r.Load32(off)
			n, err3 := r.Load32(other)
			if err != nil || err2 != nil || err3 != nil || got != v {
				assert.NoError(t, err)
				assert.NoError(t, err2)
				assert.NoError(t, err3)
				assert.Equal(t, v, got, "register %#x read back another value: a store to %#x overwrote it", off, other)
				return
			}
			if n != prev {
				seen, prev = seen+1, n
			}
		}
		last[g] = uint32(g+1)<<28 | (i - 1)
	})
	for g := range 2 {
		off := 8 + 4*g
		assert.Equal(t, last[g], binary.LittleEndian.Uint32(mem[off:]), "register %#x in memory", off)
	}
	assert.Zero(t, binary.LittleEndian.Uint64(mem[0:]), "bytes before the registers were written")
	assert.Zero(t, binary.LittleEndian.Uint64(mem[16:]), "bytes after the registers were written")

	var final uint64
	together(2, func(g int) {
		if g == 0 { // the writer
			for i := uint64(1); i <= maxRounds; i++ {
				if err := r.Store64(16, i<<32|i); err != nil {
					assert.NoError(t, err)
					return
				}
				final = i<<32 | i
			}
			return
		}
		seen, prev := 0, uint64(0)
		for i := 0; i < maxRounds && seen < overlaps; i++ {
			v, err := r.Load64(16)
			if err != nil || uint32(v) != uint32(v>>32) {
				assert.NoError(t, err)
				assert.Equal(t, uint32(v), uint32(v>>32), "torn 64-bit register: %#x", v)
				return
			}
			if v != prev {
				seen, prev = seen+1, v
			}
		}
	})
	got, err := r.Load64(16)
	require.NoError(t, err)
	assert.Equal(t, final, got, "64-bit register after the writer's last store")
	assert.Equal(t, final, binary.LittleEndian.Uint64(mem[16:]), "64-bit register in memory")
	assert.Equal(t, last[1], binary.LittleEndian.Uint32(mem[12:]), "the 64-bit stores spilled into the register below")
	assert.Zero(t, binary.LittleEndian.Uint64(mem[24:]), "bytes after the 64-bit register were written")
}

func TestNoAllocs(t *testing.T) {
	_, r := newRegion(t, 256)
	n := testing.AllocsPerRun(100, func() {
		_ = r.Store32(0x10, 1)
		_, _ = r.Load32(0x10)
		_ = r.Store64(0x18, 1)
		_, _ = r.Load64(0x18)
	})
	assert.Zero(t, n, "register access allocates")
}

func BenchmarkStore32(b *testing.B) {
	_, r := newRegion(b, 256)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if err := r.Store32(0x10, uint32(i)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkLoad32(b *testing.B) {
	_, r := newRegion(b, 256)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Load32(0x10); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkStore64(b *testing.B) {
	_, r := newRegion(b, 256)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if err := r.Store64(0x18, uint64(i)); err != nil {
			b.Fatal(err)
		}
	}
}
