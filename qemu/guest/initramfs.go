package guest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/u-root/u-root/pkg/cpio"

	"github.com/vfrdma/vfrdma/qemu/proto"
)

// Where things go in the image.
const (
	InitPath   = "/init"        // the kernel runs /init from an initramfs
	ModulesDir = "/lib/modules" // the kernel modules, flat
	BinDir     = "/bin"         // the programs, by Program.Name
)

// Spec says what goes into an initramfs.
type Spec struct {
	// Init is the host path of the static init binary (see BuildInit).
	Init string
	// Kernel supplies the modules the init loads, in its order. Nil: none.
	Kernel *Kernel
	// BindPVRDMA makes the init bind the pvrdma function's IOMMU group to
	// vfio-pci before it runs the programs. It needs the VFIO modules.
	BindPVRDMA bool
	// Programs run in this order.
	Programs []Program
	// Files are copied into the image (shared libraries, configuration),
	// their directories made as needed.
	Files []File
	// Net names the bench networks whose kernel interfaces the init brings
	// up (Manifest.Net).
	Net []string
}

// File is a host file and where it goes in the image.
type File struct {
	HostPath, Path string // Path is absolute
	Mode           uint64 // permission bits; 0 means 0o644
}

// Program is one program the init runs.
type Program struct {
	Name     string        // unique; its file name under /bin and Record.Prog
	HostPath string        // the static binary to copy into the image
	Args     []string      // arguments (for KindGoTest, after -test.v)
	Env      []string      // KEY=value added to the init's environment
	Kind     string        // KindGoTest or KindCmd
	Timeout  time.Duration // zero: DefaultTimeout
	Only     []int         // the VMs (by index) that run it; none: every VM
	Retry    time.Duration // rerun it while it fails, until this long after its start
	// OKIfOutput, if set, makes a failed exit a success when the program
	// printed this line after its exchange with its peer (see Step).
	OKIfOutput string
}

// Manifest returns the manifest the init will read for s.
func (s *Spec) Manifest() *Manifest {
	m := &Manifest{BindPVRDMA: s.BindPVRDMA, Net: s.Net, Steps: []Step{}}
	if s.Kernel != nil {
		for _, p := range s.Kernel.Modules {
			m.Modules = append(m.Modules, path.Join(ModulesDir, filepath.Base(p)))
		}
	}
	for _, p := range s.Programs {
		t := p.Timeout
		if t == 0 {
			t = DefaultTimeout
		}
		m.Steps = append(m.Steps, Step{
			Name:    p.Name,
			Path:    path.Join(BinDir, p.Name),
			Args:    p.Args,
			Env:     p.Env,
			Kind:    p.Kind,
			Timeout: t,
			Only:    p.Only,
			Retry:   p.Retry,

			OKIfOutput: p.OKIfOutput,
		})
	}
	return m
}

// WriteInitramfs builds the initramfs for spec into the file at out,
// replacing it.
func WriteInitramfs(out string, spec Spec) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(out), ".initramfs-*")
	if err != nil {
		return fmt.Errorf("guest: initramfs: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	bw := bufio.NewWriterSize(tmp, 1<<20)
	if err := BuildInitramfs(bw, spec); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("guest: initramfs: %w", err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		return fmt.Errorf("guest: initramfs: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("guest: initramfs: %w", err)
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return fmt.Errorf("guest: initramfs: %w", err)
	}
	return nil
}

// BuildInitramfs writes an uncompressed newc cpio archive for spec to w:
// the directories the init mounts on, /dev/console, /init, the modules
// under ModulesDir, the programs under BinDir and the manifest at
// proto.ManifestPath. Owners are root and times are zero, so the same
// inputs give the same bytes.
func BuildInitramfs(w io.Writer, spec Spec) error {
	if spec.Init == "" {
		return errors.New("guest: initramfs: no init binary in the spec")
	}
	m := spec.Manifest()
	manifest, err := m.Marshal()
	if err != nil {
		return err
	}
	b := &imageWriter{w: cpio.Newc.Writer(w)}
	for _, d := range []struct {
		name string
		perm uint64
	}{
		{"bin", 0o755}, {"dev", 0o755}, {"etc", 0o755}, {"etc/vfrdma", 0o755},
		{"lib", 0o755}, {"lib/modules", 0o755}, {"proc", 0o555}, {"sys", 0o555},
		{"tmp", 0o1777},
	} {
		b.dir(d.name, d.perm)
	}
	// The kernel opens /dev/console for the init's stdio before /init runs,
	// so it must exist before devtmpfs is mounted over /dev.
	b.record(cpio.CharDev("dev/console", 0o600, 5, 1))
	b.file(InitPath, spec.Init, 0o755)
	if spec.Kernel != nil {
		for i, p := range spec.Kernel.Modules {
			b.file(m.Modules[i], p, 0o644)
		}
	}
	for i, p := range spec.Programs {
		if p.HostPath == "" {
			b.fail(fmt.Errorf("program %s: no host path", p.Name))
		}
		b.file(m.Steps[i].Path, p.HostPath, 0o755)
	}
	made := map[string]bool{"bin": true, "dev": true, "etc": true, "etc/vfrdma": true, "lib": true, "lib/modules": true, "proc": true, "sys": true, "tmp": true}
	for _, f := range spec.Files {
		name := strings.TrimPrefix(path.Clean(f.Path), "/")
		if !path.IsAbs(f.Path) || name == "" {
			b.fail(fmt.Errorf("file %q: not an absolute path", f.Path))
			break
		}
		var parents []string
		for d := path.Dir(name); d != "." && !made[d]; d = path.Dir(d) {
			parents = append(parents, d)
		}
		for i := len(parents) - 1; i >= 0; i-- {
			b.dir(parents[i], 0o755)
			made[parents[i]] = true
		}
		mode := f.Mode
		if mode == 0 {
			mode = 0o644
		}
		b.file(name, f.HostPath, mode)
	}
	b.record(cpio.StaticRecord(manifest, cpio.Info{Name: proto.ManifestPath, Mode: cpio.S_IFREG | 0o644}))
	if b.err == nil {
		b.err = cpio.WriteTrailer(b.w)
	}
	if b.err != nil {
		return fmt.Errorf("guest: initramfs: %w", b.err)
	}
	return nil
}

// imageWriter writes records with fresh inode numbers and keeps the first
// error.
type imageWriter struct {
	w   cpio.RecordWriter
	ino uint64
	err error
}

func (b *imageWriter) fail(err error) {
	if b.err == nil {
		b.err = err
	}
}

func (b *imageWriter) record(r cpio.Record) {
	if b.err != nil {
		return
	}
	b.ino++
	r.Ino = b.ino
	r.NLink = 1
	if r.Mode&cpio.S_IFMT == cpio.S_IFDIR {
		r.NLink = 2
	}
	r.Name = cpio.Normalize(r.Name)
	if err := b.w.WriteRecord(r); err != nil {
		b.fail(fmt.Errorf("%s: %w", r.Name, err))
	}
}

func (b *imageWriter) dir(name string, perm uint64) {
	b.record(cpio.Directory(name, perm))
}

// file copies the host file src into the image at name.
func (b *imageWriter) file(name, src string, perm uint64) {
	if b.err != nil {
		return
	}
	f, err := os.Open(src)
	if err != nil {
		b.fail(err)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		b.fail(err)
		return
	}
	if !st.Mode().IsRegular() {
		b.fail(fmt.Errorf("%s is not a regular file", src))
		return
	}
	// A SectionReader is not an io.Closer, so the writer leaves f to us.
	b.record(cpio.Record{
		ReaderAt: io.NewSectionReader(f, 0, st.Size()),
		Info:     cpio.Info{Name: name, Mode: cpio.S_IFREG | perm, FileSize: uint64(st.Size())},
	})
}
