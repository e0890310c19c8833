package firmware

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pageAlloc hands out pages of Go memory at distinct, made-up DMA
// addresses: the directory writers only store the addresses, and the tests
// read them back.
type pageAlloc struct{ next uint64 }

func (m *pageAlloc) alloc() Page {
	m.next += PageSize
	return Page{DMA: 0x1_0000_0000 + m.next, Mem: make([]byte, PageSize)}
}

func pages(m *pageAlloc, n int) ([]uint64, []Page) {
	var a []uint64
	var p []Page
	for range n {
		pg := m.alloc()
		a = append(a, pg.DMA)
		p = append(p, pg)
	}
	return a, p
}

func TestTablesFor(t *testing.T) {
	for n, want := range map[int]int{0: 0, 1: 1, 512: 1, 513: 2, 1024: 2, 1025: 3, MaxPageDirPages: 512} {
		assert.Equal(t, want, TablesFor(n), "TablesFor(%d)", n)
	}
}

func TestWritePageDirMultiTable(t *testing.T) {
	m := &pageAlloc{}
	dir := m.alloc()
	_, tables := pages(m, 3)
	data, _ := pages(m, 1025)
	for _, p := range append([]Page{dir}, tables...) {
		for i := range p.Mem {
			p.Mem[i] = 0xCC // stale: must be cleared
		}
	}
	require.NoError(t, WritePageDir(dir, tables, data))
	for i := range 512 {
		want := uint64(0)
		if i < 3 {
			want = tables[i].DMA
		}
		require.Equal(t, want, le.Uint64(dir.Mem[8*i:]), "dir[%d]", i)
	}
	// Page i is in table (i >> 9) & 0x1ff, entry i & 0x1ff.
	for i, a := range data {
		require.Equal(t, a, le.Uint64(tables[(i>>9)&0x1ff].Mem[8*(i&0x1ff):]), "page %d", i)
	}
	for e := 1; e < EntriesPerPage; e++ {
		require.Zero(t, le.Uint64(tables[2].Mem[8*e:]), "unused entry %d of the last table", e)
	}
}

func TestWritePageDirInvalid(t *testing.T) {
	m := &pageAlloc{}
	dir := m.alloc()
	_, tables := pages(m, 2)
	data, _ := pages(m, 600)
	for _, tc := range []struct {
		name string
		dir  Page
		tbls []Page
		data []uint64
	}{
		{"no pages", dir, tables[:1], nil},
		{"too many pages", dir, tables, make([]uint64, MaxPageDirPages+1)},
		{"one table short", dir, tables[:1], data},
		{"one table over", dir, tables, data[:10]},
		{"zero page", dir, tables[:1], []uint64{0x1000, 0}},
		{"unaligned page", dir, tables[:1], []uint64{0x1000, 0x2008}},
		{"zero dir", Page{DMA: 0, Mem: dir.Mem}, tables[:1], data[:1]},
		{"small table", dir, []Page{{DMA: 0x3000, Mem: make([]byte, 100)}}, data[:1]},
	} {
		assert.ErrorIs(t, WritePageDir(tc.dir, tc.tbls, tc.data), ErrInvalid, tc.name)
	}
}

func TestWriteRingPageDir(t *testing.T) {
	m := &pageAlloc{}
	dir, tbl, st := m.alloc(), m.alloc(), m.alloc()
	data, _ := pages(m, 7)
	require.NoError(t, WriteRingPageDir(dir, tbl, st.DMA, data))
	assert.Equal(t, tbl.DMA, le.Uint64(dir.Mem), "directory entry 0 is the table")
	assert.Zero(t, le.Uint64(dir.Mem[8:]), "directory entry 1")
	assert.Equal(t, st.DMA, le.Uint64(tbl.Mem), "table entry 0 is the ring-state page")
	for i, a := range data {
		assert.Equal(t, a, le.Uint64(tbl.Mem[8*(i+1):]), "entry %d", i+1)
	}
	big, _ := pages(m, 511)
	assert.NoError(t, WriteRingPageDir(dir, tbl, st.DMA, big), "511 data pages fit one table")
	for name, d := range map[string][]uint64{"none": nil, "512": append(big, 0x1000), "zero": {0x1000, 0}, "unaligned": {0x1001}} {
		assert.ErrorIs(t, WriteRingPageDir(dir, tbl, st.DMA, d), ErrInvalid, name)
	}
	assert.ErrorIs(t, WriteRingPageDir(dir, tbl, 0, data), ErrInvalid, "zero state page")
	assert.ErrorIs(t, WriteRingPageDir(dir, Page{DMA: 0x5000}, st.DMA, data), ErrInvalid, "unmapped table")
}
