package guest

import (
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
)

// xenElfnotePhys32Entry is the ELF note type (owner "Xen") that marks a
// PVH entry point; QEMU boots an uncompressed kernel only through it.
const xenElfnotePhys32Entry = 18

// ExtractVmlinux writes the kernel inside k.Vmlinuz, uncompressed, to
// vmlinux in k.Dir and sets k.Vmlinux. It does nothing if k.Vmlinux is
// already set. The payload must be xz (Debian's 6.1; the xz tool is
// run), zstd (Debian's 6.12; the zstd tool) or gzip, and the result must be an ELF file
// with a PVH entry point (CONFIG_PVH), which QEMU boots directly. The file
// appears atomically, so concurrent callers are safe.
// Extraction takes a few seconds; the file is about 65 MB.
func ExtractVmlinux(ctx context.Context, k *Kernel) (err error) {
	if k.Vmlinux != "" {
		return nil
	}
	img, err := os.ReadFile(k.Vmlinuz)
	if err != nil {
		return fmt.Errorf("guest: extract vmlinux: %w", err)
	}
	out := filepath.Join(k.Dir, "vmlinux")
	tmp, err := os.CreateTemp(k.Dir, ".vmlinux-*")
	if err != nil {
		return fmt.Errorf("guest: extract vmlinux: %w", err)
	}
	defer func() {
		tmp.Close()
		if err != nil {
			os.Remove(tmp.Name())
		}
	}()
	if err := decompressKernel(ctx, img, tmp); err != nil {
		return fmt.Errorf("guest: extract vmlinux from %s: %w", k.Vmlinuz, err)
	}
	if err := checkPVH(tmp); err != nil {
		return fmt.Errorf("guest: extract vmlinux from %s: %w", k.Vmlinuz, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		return fmt.Errorf("guest: extract vmlinux: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("guest: extract vmlinux: %w", err)
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return fmt.Errorf("guest: extract vmlinux: %w", err)
	}
	k.Vmlinux = out
	return nil
}

// decompressKernel decompresses the payload of a bzImage into w. The x86
// boot protocol (2.08 and later) says where it is: the header ("HdrS" at
// 0x202) gives setup_sects at 0x1f1, and payload_offset and payload_length
// at 0x248 and 0x24c, counted from the end of the setup code. The format
// comes from the payload's magic.
func decompressKernel(ctx context.Context, img []byte, w io.Writer) error {
	if len(img) < 0x250 || string(img[0x202:0x206]) != "HdrS" || binary.LittleEndian.Uint16(img[0x206:]) < 0x208 {
		return errors.New("not a bzImage with boot protocol 2.08 or later")
	}
	setupSects := int(img[0x1f1])
	if setupSects == 0 {
		setupSects = 4
	}
	off := uint64(setupSects+1)*512 + uint64(binary.LittleEndian.Uint32(img[0x248:]))
	n := uint64(binary.LittleEndian.Uint32(img[0x24c:]))
	if off+n > uint64(len(img)) || n == 0 {
		return fmt.Errorf("payload [%#x, +%#x) lies outside the %#x-byte image", off, n, len(img))
	}
	payload := img[off : off+n]
	var tool []string
	switch {
	case bytes.HasPrefix(payload, []byte("\xfd7zXZ\x00")):
		tool = []string{"xz", "-dc", "--single-stream"}
	case bytes.HasPrefix(payload, []byte("\x28\xb5\x2f\xfd")):
		// The kernel's build appends the uncompressed size (4 bytes) to
		// the stream, which the zstd tool takes for a frame it cannot
		// read ("unsupported format"), and it has no --single-stream.
		if len(payload) > 4 {
			payload = payload[:len(payload)-4]
		}
		tool = []string{"zstd", "-dcq"}
	case bytes.HasPrefix(payload, []byte("\x1f\x8b")):
		zr, err := gzip.NewReader(bytes.NewReader(payload))
		if err != nil {
			return err
		}
		zr.Multistream(false)
		_, err = io.Copy(w, zr)
		return err
	default:
		return fmt.Errorf("payload compressed in an unsupported format (magic % x)", payload[:min(len(payload), 6)])
	}
	cmd := exec.CommandContext(ctx, tool[0], tool[1:]...)
	cmd.Stdin = bytes.NewReader(payload)
	cmd.Stdout = w
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", tool[0], err, bytes.TrimSpace(stderr.Bytes()))
	}
	return nil
}

// checkPVH makes sure f is an ELF kernel with a PVH entry note.
func checkPVH(f io.ReaderAt) error {
	ef, err := elf.NewFile(f)
	if err != nil {
		return fmt.Errorf("not an ELF kernel: %w", err)
	}
	for _, p := range ef.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		data, err := io.ReadAll(p.Open())
		if err != nil {
			return err
		}
		if hasNote(data, ef.ByteOrder, "Xen", xenElfnotePhys32Entry) {
			return nil
		}
	}
	return errors.New("the kernel has no PVH entry point (CONFIG_PVH): boot vmlinuz instead")
}

// hasNote walks ELF notes: namesz, descsz, type, then name and desc, each
// padded to 4 bytes.
func hasNote(data []byte, bo binary.ByteOrder, owner string, typ uint32) bool {
	for len(data) >= 12 {
		namesz, descsz, t := bo.Uint32(data), bo.Uint32(data[4:]), bo.Uint32(data[8:])
		data = data[12:]
		n, d := (uint64(namesz)+3)&^3, (uint64(descsz)+3)&^3
		if uint64(len(data)) < n+d {
			return false
		}
		name := string(bytes.TrimRight(data[:namesz], "\x00"))
		if t == typ && name == owner {
			return true
		}
		data = data[n+d:]
	}
	return false
}
