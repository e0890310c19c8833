package mmio_test

import (
	"encoding/binary"
	"errors"
	"sync"
	"testing"

	"github.com/vfrdma/vfrdma/mmio"
)

func newRegion(t testing.TB, n int) ([]byte, *mmio.Region) {
	t.Helper()
	mem := make([]byte, n)
	r, err := mmio.New(mem)
	if err != nil {
		t.Fatal(err)
	}
	return mem, r
}

func TestLoadStore(t *testing.T) {
	mem, r := newRegion(t, 256)
	if r.Len() != 256 {
		t.Fatalf("Len = %d", r.Len())
	}
	binary.LittleEndian.PutUint32(mem[0:], 17)
	v, err := r.Load32(0)
	if err != nil || v != 17 {
		t.Fatalf("Load32(0) = %d, %v; want 17", v, err)
	}
	if err := r.Store32(0x14, 0xdeadbeef); err != nil {
		t.Fatal(err)
	}
	if got := binary.LittleEndian.Uint32(mem[0x14:]); got != 0xdeadbeef {
		t.Fatalf("memory after Store32 = %#x", got)
	}
	// A 32-bit store touches exactly four bytes.
	for i, b := range mem {
		if (i < 0x14 || i >= 0x18) && i >= 4 && b != 0 {
			t.Fatalf("Store32 wrote byte %#x", i)
		}
	}
	if err := r.Store64(0xf8, 0x0102030405060708); err != nil {
		t.Fatal(err)
	}
	if got := binary.LittleEndian.Uint64(mem[0xf8:]); got != 0x0102030405060708 {
		t.Fatalf("memory after Store64 = %#x", got)
	}
	v64, err := r.Load64(0xf8)
	if err != nil || v64 != 0x0102030405060708 {
		t.Fatalf("Load64 = %#x, %v", v64, err)
	}
	v, err = r.Load32(0xfc)
	if err != nil || v != 0x01020304 {
		t.Fatalf("Load32(0xfc) = %#x, %v", v, err)
	}
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
		if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		}
		var ae *mmio.AccessError
		if err != nil && !errors.As(err, &ae) {
			t.Errorf("%s: %T is not *AccessError", c.name, err)
		}
	}
	var zero mmio.Region
	if _, err := zero.Load32(0); !errors.Is(err, mmio.ErrRange) {
		t.Errorf("zero Region Load32: %v", err)
	}
}

func TestNewMisaligned(t *testing.T) {
	mem := make([]byte, 64)
	if _, err := mmio.New(mem[4:]); !errors.Is(err, mmio.ErrAlignment) {
		t.Fatalf("New(misaligned) = %v, want ErrAlignment", err)
	}
	if _, err := mmio.New(nil); err != nil {
		t.Fatalf("New(nil) = %v", err)
	}
}

func TestSub(t *testing.T) {
	mem, r := newRegion(t, 256)
	s, err := r.Sub(0x40, 0x10)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Store32(0xc, 5); err != nil {
		t.Fatal(err)
	}
	if mem[0x4c] != 5 {
		t.Fatal("Sub store landed elsewhere")
	}
	if err := s.Store32(0x10, 5); !errors.Is(err, mmio.ErrRange) {
		t.Fatalf("store past Sub end: %v", err)
	}
	if _, err := r.Sub(4, 8); !errors.Is(err, mmio.ErrAlignment) {
		t.Fatalf("Sub misaligned: %v", err)
	}
	if _, err := r.Sub(0xf8, 0x10); !errors.Is(err, mmio.ErrRange) {
		t.Fatalf("Sub too long: %v", err)
	}
}

func TestConcurrent(t *testing.T) {
	_, r := newRegion(t, 64)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				off := (g * 8) % 64
				if err := r.Store32(off, uint32(i)); err != nil {
					t.Error(err)
					return
				}
				if _, err := r.Load32(off); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestNoAllocs(t *testing.T) {
	_, r := newRegion(t, 256)
	n := testing.AllocsPerRun(100, func() {
		_ = r.Store32(0x10, 1)
		_, _ = r.Load32(0x10)
		_ = r.Store64(0x18, 1)
		_, _ = r.Load64(0x18)
	})
	if n != 0 {
		t.Fatalf("register access allocates %v times", n)
	}
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
