package uapi

import (
	"encoding/binary"
	"errors"
	"testing"
)

// chain builds an info buffer: a fixed part of fixed bytes, then caps laid
// out back to back, each header's next pointing at the following one.
func chain(fixed int, caps ...[]byte) (buf []byte, first uint32) {
	buf = make([]byte, fixed)
	off := fixed
	for i, c := range caps {
		c = append([]byte(nil), c...)
		next := 0
		if i < len(caps)-1 {
			next = off + len(c)
		}
		binary.NativeEndian.PutUint32(c[4:], uint32(next))
		buf = append(buf, c...)
		off += len(c)
	}
	if len(caps) > 0 {
		first = uint32(fixed)
	}
	return buf, first
}

func capBytes(id, version uint16, body ...uint64) []byte {
	b := make([]byte, 8, 8+8*len(body))
	binary.NativeEndian.PutUint16(b, id)
	binary.NativeEndian.PutUint16(b[2:], version)
	for _, v := range body {
		b = binary.NativeEndian.AppendUint64(b, v)
	}
	return b
}

func u32pair(lo, hi uint32) uint64 { return uint64(lo) | uint64(hi)<<32 }

func TestParseCapsRegion(t *testing.T) {
	sparse := capBytes(RegionInfoCapSparseMmapID, 1, u32pair(2, 0), 0, 0x2000, 0x2000, 0x2000)
	typ := capBytes(RegionInfoCapTypeID, 1, u32pair(1<<31|0x8086, 1))
	msix := capBytes(RegionInfoCapMSIXMappableID, 1)
	buf, first := chain(32, sparse, typ, msix)
	caps, err := ParseCaps(buf, first, 32)
	if err != nil {
		t.Fatal(err)
	}
	if len(caps) != 3 || caps[0].ID != 1 || caps[1].ID != 2 || caps[2].ID != 3 || caps[0].Offset != 32 {
		t.Fatalf("caps = %+v", caps)
	}
	c, ok := Find(caps, RegionInfoCapSparseMmapID)
	if !ok {
		t.Fatal("sparse cap not found")
	}
	areas, err := SparseMmapAreas(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(areas) != 2 || areas[0] != (RegionSparseMmapArea{0, 0x2000}) || areas[1] != (RegionSparseMmapArea{0x2000, 0x2000}) {
		t.Fatalf("areas = %+v", areas)
	}
	c, _ = Find(caps, RegionInfoCapTypeID)
	ty, sub, err := RegionType(c)
	if err != nil || ty != 1<<31|0x8086 || sub != 1 {
		t.Fatalf("type = %#x/%d, %v", ty, sub, err)
	}
	if _, ok := Find(caps, 42); ok {
		t.Fatal("found absent cap")
	}
}

func TestParseCapsIOMMU(t *testing.T) {
	iova := capBytes(IOMMUType1InfoCapIOVARangeID, 1, u32pair(2, 0), 0, 0xfedfffff, 0xfef00000, 0x7fffffffff)
	mig := capBytes(IOMMUType1InfoCapMigrationID, 1, u32pair(1, 0), 0x1000, 1<<30)
	avail := append(capBytes(IOMMUType1InfoDMAAvailID, 1), 0xff, 0xff, 0, 0)
	buf, first := chain(24, iova, mig, avail)
	caps, err := ParseCaps(buf, first, 24)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := Find(caps, IOMMUType1InfoCapIOVARangeID)
	rs, err := IOVARanges(c)
	if err != nil || len(rs) != 2 || rs[1] != (IOVARange{0xfef00000, 0x7fffffffff}) {
		t.Fatalf("ranges = %+v, %v", rs, err)
	}
	c, _ = Find(caps, IOMMUType1InfoCapMigrationID)
	m, err := Migration(c)
	if err != nil || m.Flags != 1 || m.PgsizeBitmap != 0x1000 || m.MaxDirtyBitmapSize != 1<<30 {
		t.Fatalf("migration = %+v, %v", m, err)
	}
	c, _ = Find(caps, IOMMUType1InfoDMAAvailID)
	if n, err := DMAAvail(c); err != nil || n != 0xffff {
		t.Fatalf("avail = %d, %v", n, err)
	}
}

func TestParseCapsBad(t *testing.T) {
	good := capBytes(1, 1, 0)
	cases := map[string]func() ([]byte, uint32){
		"first inside fixed part": func() ([]byte, uint32) { b, _ := chain(32, good); return b, 8 },
		"first past end":          func() ([]byte, uint32) { b, _ := chain(32, good); return b, 1000 },
		"header cut":              func() ([]byte, uint32) { b, f := chain(32, good); return b[:36], f },
		"self loop": func() ([]byte, uint32) {
			b, f := chain(32, good)
			binary.NativeEndian.PutUint32(b[36:], 32)
			return b, f
		},
		"backwards": func() ([]byte, uint32) {
			b, f := chain(32, good, good)
			binary.NativeEndian.PutUint32(b[48+4:], 32)
			return b, f
		},
		"next inside header": func() ([]byte, uint32) {
			b, f := chain(32, good)
			binary.NativeEndian.PutUint32(b[36:], 36)
			return b, f
		},
		"next past end": func() ([]byte, uint32) {
			b, f := chain(32, good)
			binary.NativeEndian.PutUint32(b[36:], uint32(len(b)+1))
			return b, f
		},
	}
	for name, mk := range cases {
		b, f := mk()
		if caps, err := ParseCaps(b, f, 32); !errors.Is(err, ErrBadCaps) {
			t.Errorf("%s: caps %v, err %v; want ErrBadCaps", name, caps, err)
		}
	}
	if caps, err := ParseCaps(nil, 0, 32); err != nil || caps != nil {
		t.Errorf("no caps: %v %v", caps, err)
	}
}

func TestCapBodiesShort(t *testing.T) {
	for name, f := range map[string]func(Cap) error{
		"sparse":    func(c Cap) error { _, err := SparseMmapAreas(c); return err },
		"type":      func(c Cap) error { _, _, err := RegionType(c); return err },
		"iova":      func(c Cap) error { _, err := IOVARanges(c); return err },
		"avail":     func(c Cap) error { _, err := DMAAvail(c); return err },
		"migration": func(c Cap) error { _, err := Migration(c); return err },
	} {
		if err := f(Cap{Data: capBytes(1, 1)}); !errors.Is(err, ErrBadCaps) {
			t.Errorf("%s on a bare header: %v", name, err)
		}
	}
	// nr_areas claims more than the cap holds.
	c := Cap{ID: 1, Data: capBytes(1, 1, u32pair(3, 0), 0, 0x1000)}
	if _, err := SparseMmapAreas(c); !errors.Is(err, ErrBadCaps) {
		t.Errorf("sparse overclaim: %v", err)
	}
	c = Cap{ID: 1, Data: capBytes(1, 1, u32pair(0xffffffff, 0))}
	if _, err := IOVARanges(c); !errors.Is(err, ErrBadCaps) {
		t.Errorf("iova overclaim: %v", err)
	}
	c = Cap{ID: 1, Data: capBytes(1, 1, u32pair(1, 0), 0x2000, 0x1000)}
	if _, err := IOVARanges(c); !errors.Is(err, ErrBadCaps) {
		t.Errorf("iova end before start: %v", err)
	}
	c = Cap{ID: 1, Data: capBytes(1, 1, u32pair(1, 0), ^uint64(0), 2)}
	if _, err := SparseMmapAreas(c); !errors.Is(err, ErrBadCaps) {
		t.Errorf("sparse wrap: %v", err)
	}
}

// FuzzParseCaps feeds arbitrary info buffers (what the kernel, or a broken
// or hostile VFIO driver, could hand back) to the chain parser and the
// capability decoders: no panics, and every capability found lies inside
// the buffer, after the fixed part, in increasing order.
func FuzzParseCaps(f *testing.F) {
	sparse := capBytes(RegionInfoCapSparseMmapID, 1, u32pair(1, 0), 0, 0x1000)
	typ := capBytes(RegionInfoCapTypeID, 1, u32pair(1, 1))
	iova := capBytes(IOMMUType1InfoCapIOVARangeID, 1, u32pair(1, 0), 0x100000, 0xfedfffff)
	b, first := chain(32, sparse, typ)
	f.Add(b, first, uint8(32))
	b, first = chain(24, iova)
	f.Add(b, first, uint8(24))
	f.Add([]byte{}, uint32(0), uint8(0))
	f.Add(make([]byte, 48), uint32(32), uint8(32))
	f.Fuzz(func(t *testing.T, buf []byte, first uint32, minOff uint8) {
		caps, err := ParseCaps(buf, first, int(minOff))
		if err != nil {
			if !errors.Is(err, ErrBadCaps) {
				t.Fatalf("error %v does not wrap ErrBadCaps", err)
			}
			return
		}
		prev := -1
		for _, c := range caps {
			o := int(c.Offset)
			if o < int(minOff) || o <= prev || o+len(c.Data) > len(buf) || len(c.Data) < 8 {
				t.Fatalf("cap %+v out of place (prev %d, len %d)", c, prev, len(buf))
			}
			prev = o
			// Decoders must not panic whatever the body.
			_, _ = SparseMmapAreas(c)
			_, _, _ = RegionType(c)
			_, _ = IOVARanges(c)
			_, _ = DMAAvail(c)
			_, _ = Migration(c)
		}
	})
}
