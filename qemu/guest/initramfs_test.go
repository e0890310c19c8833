package guest

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/u-root/u-root/pkg/cpio"

	"github.com/vfrdma/vfrdma/qemu/proto"
)

func writeFile(t *testing.T, path, content string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func fakeSpec(t *testing.T) Spec {
	dir := t.TempDir()
	return Spec{
		Init: writeFile(t, filepath.Join(dir, "guestinit"), "INIT"),
		Kernel: &Kernel{Modules: []string{
			writeFile(t, filepath.Join(dir, "irqbypass.ko"), "MOD1"),
			writeFile(t, filepath.Join(dir, "vfio.ko"), "MOD2"),
		}},
		BindPVRDMA: true,
		Programs: []Program{
			{Name: "vfio.test", HostPath: writeFile(t, filepath.Join(dir, "a.test"), "TESTBIN"), Kind: KindGoTest, Args: []string{"-test.run=X"}, Env: []string{"K=V"}, Timeout: 30 * time.Second},
			{Name: "pvctl", HostPath: writeFile(t, filepath.Join(dir, "pvctl"), strings.Repeat("P", 4099)), Kind: KindCmd},
		},
	}
}

func TestBuildInitramfs(t *testing.T) {
	spec := fakeSpec(t)
	var buf bytes.Buffer
	if err := BuildInitramfs(&buf, spec); err != nil {
		t.Fatal(err)
	}
	if buf.Len()%4 != 0 {
		t.Errorf("archive is %d bytes, not 4-aligned", buf.Len())
	}
	recs, err := cpio.ReadAllRecords(cpio.Newc.Reader(bytes.NewReader(buf.Bytes())))
	if err != nil {
		t.Fatal(err)
	}
	// The reader stops at the trailer; it must be the last record.
	if tail := buf.Bytes()[max(0, buf.Len()-128):]; !bytes.Contains(tail, []byte(cpio.Trailer+"\x00")) {
		t.Fatalf("no trailer at the end of the archive: %q", tail)
	}

	type want struct {
		mode         uint64
		content      string
		rmajor, rmin uint64
	}
	manifest, err := spec.Manifest().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	wants := map[string]want{
		"bin":                      {mode: cpio.S_IFDIR | 0o755},
		"dev":                      {mode: cpio.S_IFDIR | 0o755},
		"etc":                      {mode: cpio.S_IFDIR | 0o755},
		"etc/vfrdma":               {mode: cpio.S_IFDIR | 0o755},
		"lib":                      {mode: cpio.S_IFDIR | 0o755},
		"lib/modules":              {mode: cpio.S_IFDIR | 0o755},
		"proc":                     {mode: cpio.S_IFDIR | 0o555},
		"sys":                      {mode: cpio.S_IFDIR | 0o555},
		"tmp":                      {mode: cpio.S_IFDIR | 0o1777},
		"dev/console":              {mode: cpio.S_IFCHR | 0o600, rmajor: 5, rmin: 1},
		"init":                     {mode: cpio.S_IFREG | 0o755, content: "INIT"},
		"lib/modules/irqbypass.ko": {mode: cpio.S_IFREG | 0o644, content: "MOD1"},
		"lib/modules/vfio.ko":      {mode: cpio.S_IFREG | 0o644, content: "MOD2"},
		"bin/vfio.test":            {mode: cpio.S_IFREG | 0o755, content: "TESTBIN"},
		"bin/pvctl":                {mode: cpio.S_IFREG | 0o755, content: strings.Repeat("P", 4099)},
		"etc/vfrdma/manifest.json": {mode: cpio.S_IFREG | 0o644, content: string(manifest)},
	}
	seen := map[string]bool{}
	inos := map[uint64]string{}
	for _, r := range recs {
		w, ok := wants[r.Name]
		if !ok {
			t.Errorf("unexpected record %s", r.Info)
			continue
		}
		if seen[r.Name] {
			t.Errorf("record %s twice", r.Name)
		}
		seen[r.Name] = true
		// A parent directory must come before what it holds: the kernel
		// does not create missing directories.
		if d := filepath.Dir(r.Name); d != "." && !seen[d] {
			t.Errorf("%s comes before its directory %s", r.Name, d)
		}
		if r.Mode != w.mode {
			t.Errorf("%s: mode %#o, want %#o", r.Name, r.Mode, w.mode)
		}
		if r.Rmajor != w.rmajor || r.Rminor != w.rmin {
			t.Errorf("%s: device %d:%d, want %d:%d", r.Name, r.Rmajor, r.Rminor, w.rmajor, w.rmin)
		}
		if r.UID != 0 || r.GID != 0 || r.MTime != 0 {
			t.Errorf("%s: uid %d gid %d mtime %d, want zeros", r.Name, r.UID, r.GID, r.MTime)
		}
		if o, dup := inos[r.Ino]; dup || r.Ino == 0 {
			t.Errorf("%s: inode %d (also %q)", r.Name, r.Ino, o)
		}
		inos[r.Ino] = r.Name
		got, err := io.ReadAll(io.NewSectionReader(r.ReaderAt, 0, int64(r.FileSize)))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != w.content {
			t.Errorf("%s: content %.40q, want %.40q", r.Name, got, w.content)
		}
	}
	for name := range wants {
		if !seen[name] {
			t.Errorf("no record %s", name)
		}
	}

	// The manifest the init will read.
	a, err := cpio.ArchiveFromReader(cpio.Newc.Reader(bytes.NewReader(buf.Bytes())))
	if err != nil {
		t.Fatal(err)
	}
	rec, ok := a.Get(strings.TrimPrefix(proto.ManifestPath, "/"))
	if !ok {
		t.Fatal("no manifest in the archive")
	}
	data, _ := io.ReadAll(io.NewSectionReader(rec.ReaderAt, 0, int64(rec.FileSize)))
	m, err := UnmarshalManifest(data)
	if err != nil {
		t.Fatal(err)
	}
	wantM := &Manifest{
		Modules:    []string{"/lib/modules/irqbypass.ko", "/lib/modules/vfio.ko"},
		BindPVRDMA: true,
		Steps: []Step{
			{Name: "vfio.test", Path: "/bin/vfio.test", Args: []string{"-test.run=X"}, Env: []string{"K=V"}, Kind: KindGoTest, Timeout: 30 * time.Second},
			{Name: "pvctl", Path: "/bin/pvctl", Kind: KindCmd, Timeout: DefaultTimeout},
		},
	}
	if !reflect.DeepEqual(m, wantM) {
		t.Errorf("manifest\n got %+v\nwant %+v", m, wantM)
	}

	// Same inputs, same bytes.
	var again bytes.Buffer
	if err := BuildInitramfs(&again, spec); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), again.Bytes()) {
		t.Error("two builds of the same spec differ")
	}
}

func TestWriteInitramfs(t *testing.T) {
	spec := fakeSpec(t)
	out := filepath.Join(t.TempDir(), "initramfs.cpio")
	if err := WriteInitramfs(out, spec); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rr, err := cpio.Newc.NewFileReader(f)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := cpio.ReadAllRecords(rr)
	if err != nil || len(recs) != 16 {
		t.Fatalf("read back %d records, %v; want 16", len(recs), err)
	}
	// A failed build leaves no file behind.
	spec.Programs[0].HostPath = filepath.Join(t.TempDir(), "missing")
	bad := filepath.Join(filepath.Dir(out), "bad.cpio")
	if err := WriteInitramfs(bad, spec); err == nil {
		t.Fatal("built an image from a missing program")
	}
	ents, _ := os.ReadDir(filepath.Dir(out))
	if len(ents) != 1 {
		t.Errorf("directory holds %d files after a failed build, want 1", len(ents))
	}
}

func TestBuildInitramfsErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Spec)
		want string
	}{
		{"no init", func(s *Spec) { s.Init = "" }, "no init"},
		{"missing init", func(s *Spec) { s.Init += ".missing" }, "no such file"},
		{"duplicate program", func(s *Spec) { s.Programs[1].Name = s.Programs[0].Name }, "used twice"},
		{"bad kind", func(s *Spec) { s.Programs[0].Kind = "" }, "kind"},
		{"no host path", func(s *Spec) { s.Programs[1].HostPath = "" }, "no host path"},
		{"directory as program", func(s *Spec) { s.Programs[1].HostPath = t.TempDir() }, "not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := fakeSpec(t)
			tc.mod(&spec)
			err := BuildInitramfs(io.Discard, spec)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}
