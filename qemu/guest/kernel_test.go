package guest

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFindKernelMissing(t *testing.T) {
	root := t.TempDir()
	_, err := FindKernel(root)
	if err == nil || !strings.Contains(err.Error(), "guest kernel not found in "+filepath.Join(root, KernelDir)+": run `make setup`") {
		t.Fatalf("FindKernel(empty) = %v", err)
	}
	// A half-written cache is reported the same way.
	dir := filepath.Join(root, KernelDir)
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "vmlinuz"), []byte("k"), 0o644)
	if _, err := FindKernel(root); err == nil || !strings.Contains(err.Error(), "run `make setup` (no VERSION)") {
		t.Fatalf("FindKernel(no VERSION) = %v", err)
	}
}

// TestFindKernelCompressed uses compressed module names, whose dependencies
// are not read: the documented order alone decides.
func TestFindKernelCompressed(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, KernelDir)
	os.MkdirAll(filepath.Join(dir, "modules"), 0o755)
	os.WriteFile(filepath.Join(dir, "vmlinuz"), []byte("k"), 0o644)
	os.WriteFile(filepath.Join(dir, "VERSION"), []byte("6.1.0-99-amd64\n"), 0o644)
	files := []string{"vfio-pci.ko.xz", "vfio.ko.xz", "irqbypass.ko.xz", "vfio-pci-core.ko.xz", "vfio_virqfd.ko.xz", "vfio_iommu_type1.ko.xz", "README"}
	for _, f := range files {
		os.WriteFile(filepath.Join(dir, "modules", f), nil, 0o644)
	}
	k, err := FindKernel(root)
	if err != nil {
		t.Fatal(err)
	}
	if k.Version != "6.1.0-99-amd64" || k.Vmlinuz != filepath.Join(dir, "vmlinuz") {
		t.Errorf("kernel %+v", k)
	}
	var got []string
	for _, m := range k.Modules {
		got = append(got, filepath.Base(m))
	}
	want := []string{"irqbypass.ko.xz", "vfio.ko.xz", "vfio_iommu_type1.ko.xz", "vfio_virqfd.ko.xz", "vfio-pci-core.ko.xz", "vfio-pci.ko.xz"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("modules %v, want %v", got, want)
	}
}

func TestOrderModules(t *testing.T) {
	mods := func(spec ...string) []module {
		var out []module
		for _, s := range spec {
			name, deps, _ := strings.Cut(s, ":")
			m := module{name: name, path: name}
			if deps != "" {
				m.deps = strings.Split(deps, ",")
			}
			out = append(out, m)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		in   []module
		want []string
		err  string
	}{
		{
			name: "the 6.1 VFIO set",
			in:   mods("vfio_pci:vfio_pci_core,vfio", "vfio_pci_core:vfio,vfio_virqfd,irqbypass", "vfio_virqfd", "vfio_iommu_type1:vfio", "vfio", "irqbypass"),
			want: []string{"irqbypass", "vfio", "vfio_iommu_type1", "vfio_virqfd", "vfio_pci_core", "vfio_pci"},
		},
		{
			name: "a dependency outranks the documented order",
			in:   mods("irqbypass:zzz", "zzz", "vfio"),
			want: []string{"vfio", "zzz", "irqbypass"},
		},
		{name: "missing dependency", in: mods("vfio_pci:vfio"), err: "depends on vfio, which is not in the cache"},
		{name: "cycle", in: mods("a:b", "b:a"), err: "cycle"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := orderModules(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// TestFindKernelCache reads the real cache when `make setup` has made one:
// the dependencies in the .ko files must give the documented order.
func TestFindKernelCache(t *testing.T) {
	root := repoRoot(t)
	k, err := FindKernel(root)
	if err != nil {
		t.Skipf("%v", err)
	}
	var got []string
	for _, m := range k.Modules {
		got = append(got, filepath.Base(m))
	}
	want := []string{"irqbypass.ko", "vfio.ko", "vfio_iommu_type1.ko", "vfio_virqfd.ko", "vfio-pci-core.ko", "vfio-pci.ko"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("modules %v, want %v", got, want)
	}
}

// repoRoot is the module root: two levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod at %s", root)
	}
	return root
}

// The cdev kernel's cache lies outside the checkout, under $VFRDMA_CACHE
// (make setup writes it there) or /var/cache/vfrdma.
func TestTheCdevKernelsCacheIsUnderVFRDMACacheOrVarCache(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(EnvCache, dir)
	assert.Equal(t, filepath.Join(dir, "kernel-cdev"), CdevKernelDir())
	t.Setenv(EnvCache, "")
	assert.Equal(t, "/var/cache/vfrdma/kernel-cdev", CdevKernelDir())
}

// FindNamedKernel reads the stock cache for "stock" and "", the cdev cache
// for "cdev", and refuses any other name; a missing cdev cache says to run
// make setup, naming where it looked. The cdev set (compressed names: the
// documented order alone decides) loads iommufd before vfio, which needs it.
func TestFindNamedKernelChoosesTheCacheByName(t *testing.T) {
	root := t.TempDir()
	cache := t.TempDir()
	t.Setenv(EnvCache, cache)
	_, err := FindNamedKernel(root, "6.12")
	require.ErrorContains(t, err, `guest kernel "6.12": want stock or cdev`)
	for _, name := range []string{"", KernelStock} {
		_, err = FindNamedKernel(root, name)
		require.ErrorContains(t, err, "guest kernel not found in "+filepath.Join(root, KernelDir)+": run `make setup`", "%q", name)
	}
	_, err = FindNamedKernel(root, KernelCdev)
	require.ErrorContains(t, err, "guest kernel not found in "+filepath.Join(cache, "kernel-cdev")+": run `make setup`")

	dir := filepath.Join(cache, "kernel-cdev")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "modules"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "vmlinuz"), []byte("k"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "VERSION"), []byte("6.12.117+deb12-amd64\n"), 0o644))
	for _, f := range []string{"vfio-pci.ko.xz", "vfio.ko.xz", "irqbypass.ko.xz", "vfio-pci-core.ko.xz", "iommufd.ko.xz", "vfio_iommu_type1.ko.xz"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "modules", f), nil, 0o644))
	}
	k, err := FindNamedKernel(root, KernelCdev)
	require.NoError(t, err)
	assert.Equal(t, "6.12.117+deb12-amd64", k.Version)
	assert.Equal(t, dir, k.Dir)
	var got []string
	for _, m := range k.Modules {
		got = append(got, filepath.Base(m))
	}
	assert.Equal(t, []string{"irqbypass.ko.xz", "iommufd.ko.xz", "vfio.ko.xz", "vfio_iommu_type1.ko.xz", "vfio-pci-core.ko.xz", "vfio-pci.ko.xz"}, got)
}

// TestFindKernelCdevCache reads the real cdev cache when `make setup` has
// made one: the modules' own dependencies give iommufd before vfio, and
// the management network's modules are there.
func TestFindKernelCdevCache(t *testing.T) {
	k, err := FindNamedKernel(repoRoot(t), KernelCdev)
	if err != nil {
		t.Skipf("%v", err)
	}
	var got []string
	for _, m := range k.Modules {
		got = append(got, filepath.Base(m))
	}
	assert.Equal(t, []string{"irqbypass.ko", "iommufd.ko", "vfio.ko", "vfio_iommu_type1.ko", "vfio-pci-core.ko", "vfio-pci.ko"}, got)
	mgmt, err := k.MgmtModules()
	require.NoError(t, err)
	got = got[:0]
	for _, m := range mgmt {
		got = append(got, filepath.Base(m))
	}
	assert.Equal(t, []string{"failover.ko", "net_failover.ko", "virtio_net.ko"}, got)
}
