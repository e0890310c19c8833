package guest

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
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

// TestDecompressKernelZstdWithTheKernelsSizeTrailer builds the payload as
// the kernel's build does for CONFIG_KERNEL_ZSTD (Debian's 6.12, the cdev
// guest): a zstd frame, then the uncompressed size in 4 bytes, which the
// zstd tool refuses as an unknown frame unless it is cut off.
func TestDecompressKernelZstdWithTheKernelsSizeTrailer(t *testing.T) {
	_, err := exec.LookPath("zstd")
	require.NoError(t, err, "run `make setup` (Debian package zstd)")
	kernel := []byte("\x7fELF kernel compressed with zstd")
	cmd := exec.Command("zstd", "-cq")
	cmd.Stdin = bytes.NewReader(kernel)
	frame, err := cmd.Output()
	require.NoError(t, err)
	payload := binary.LittleEndian.AppendUint32(frame, uint32(len(kernel)))
	var out bytes.Buffer
	require.NoError(t, decompressKernel(context.Background(), bzImage(payload), &out))
	require.Equal(t, string(kernel), out.String())
}
