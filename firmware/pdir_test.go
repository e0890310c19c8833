package firmware

import (
	"errors"
	"testing"
)

func pages(m *fakeMem, n int) ([]uint64, []Page) {
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
		if got := TablesFor(n); got != want {
			t.Errorf("TablesFor(%d) = %d, want %d", n, got, want)
		}
	}
}

func TestWritePageDirMultiTable(t *testing.T) {
	m := newFakeMem()
	dir := m.alloc()
	_, tables := pages(m, 3)
	data, _ := pages(m, 1025)
	for i := range dir.Mem {
		dir.Mem[i] = 0xCC // stale: must be cleared
	}
	if err := WritePageDir(dir, tables, data); err != nil {
		t.Fatal(err)
	}
	for i := range 512 {
		want := uint64(0)
		if i < 3 {
			want = tables[i].DMA
		}
		if got := le.Uint64(dir.Mem[8*i:]); got != want {
			t.Fatalf("dir[%d] = %#x, want %#x", i, got, want)
		}
	}
	// Page i is in table (i >> 9) & 0x1ff, entry i & 0x1ff.
	for i, a := range data {
		if got := le.Uint64(tables[(i>>9)&0x1ff].Mem[8*(i&0x1ff):]); got != a {
			t.Fatalf("page %d: %#x, want %#x", i, got, a)
		}
	}
	if le.Uint64(tables[2].Mem[8:]) != 0 {
		t.Error("unused entry of the last table not zero")
	}
}

func TestWritePageDirInvalid(t *testing.T) {
	m := newFakeMem()
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
		if err := WritePageDir(tc.dir, tc.tbls, tc.data); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", tc.name, err)
		}
	}
}

func TestWriteRingPageDir(t *testing.T) {
	m := newFakeMem()
	dir, tbl, st := m.alloc(), m.alloc(), m.alloc()
	data, _ := pages(m, 7)
	if err := WriteRingPageDir(dir, tbl, st.DMA, data); err != nil {
		t.Fatal(err)
	}
	if le.Uint64(dir.Mem) != tbl.DMA || le.Uint64(dir.Mem[8:]) != 0 {
		t.Error("directory entry 0 is not the table, or entry 1 is set")
	}
	if le.Uint64(tbl.Mem) != st.DMA {
		t.Error("table entry 0 is not the ring-state page")
	}
	for i, a := range data {
		if le.Uint64(tbl.Mem[8*(i+1):]) != a {
			t.Errorf("entry %d", i+1)
		}
	}
	big, _ := pages(m, 511)
	if err := WriteRingPageDir(dir, tbl, st.DMA, big); err != nil {
		t.Errorf("511 data pages fit one table: %v", err)
	}
	for name, d := range map[string][]uint64{"none": nil, "512": append(big, 0x1000), "zero": {0x1000, 0}, "unaligned": {0x1001}} {
		if err := WriteRingPageDir(dir, tbl, st.DMA, d); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := WriteRingPageDir(dir, tbl, 0, data); !errors.Is(err, ErrInvalid) {
		t.Errorf("zero state page: %v", err)
	}
	if err := WriteRingPageDir(dir, Page{DMA: 0x5000}, st.DMA, data); !errors.Is(err, ErrInvalid) {
		t.Errorf("unmapped table: %v", err)
	}
}
