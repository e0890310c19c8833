package guest

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"strings"
	"testing"
)

func note(owner string, typ uint32, desc []byte) []byte {
	var b bytes.Buffer
	name := append([]byte(owner), 0)
	binary.Write(&b, binary.LittleEndian, [3]uint32{uint32(len(name)), uint32(len(desc)), typ})
	b.Write(name)
	b.Write(make([]byte, (4-len(name)%4)%4))
	b.Write(desc)
	b.Write(make([]byte, (4-len(desc)%4)%4))
	return b.Bytes()
}

func TestHasNote(t *testing.T) {
	le := binary.LittleEndian
	notes := append(note("GNU", 3, make([]byte, 20)), note("Xen", xenElfnotePhys32Entry, []byte{1, 2, 3, 4, 5})...)
	if !hasNote(notes, le, "Xen", xenElfnotePhys32Entry) {
		t.Error("PVH note not found")
	}
	if hasNote(notes, le, "Xen", 99) || hasNote(notes, le, "GNU", xenElfnotePhys32Entry) {
		t.Error("found a note that is not there")
	}
	if hasNote(notes[:len(notes)-3], le, "Xen", xenElfnotePhys32Entry) || hasNote(nil, le, "Xen", 1) {
		t.Error("found a note in truncated data")
	}
}

// bzImage returns a minimal image in the layout decompressKernel reads.
func bzImage(payload []byte) []byte {
	img := make([]byte, 2*512) // setup_sects = 1
	img[0x1f1] = 1
	copy(img[0x202:], "HdrS")
	binary.LittleEndian.PutUint16(img[0x206:], 0x20f)
	binary.LittleEndian.PutUint32(img[0x248:], 16) // payload after 16 bytes of decompressor
	binary.LittleEndian.PutUint32(img[0x24c:], uint32(len(payload)))
	img = append(img, make([]byte, 16)...)
	img = append(img, payload...)
	return append(img, "trailing data"...)
}

func TestDecompressKernel(t *testing.T) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte("\x7fELF kernel"))
	zw.Close()
	var out bytes.Buffer
	if err := decompressKernel(context.Background(), bzImage(gz.Bytes()), &out); err != nil || out.String() != "\x7fELF kernel" {
		t.Fatalf("got %q, %v", out.String(), err)
	}
	for _, tc := range []struct {
		name string
		img  []byte
		want string
	}{
		{"not a bzImage", []byte("nothing here"), "not a bzImage"},
		{"unknown format", bzImage([]byte("LZ4?")), "unsupported format"},
		{"truncated", bzImage(gz.Bytes())[:1024+16+5], "outside"},
	} {
		if err := decompressKernel(context.Background(), tc.img, &out); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
