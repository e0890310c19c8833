package guest

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// KernelDir is where `make setup` unpacks the guest kernel, relative to the
// repository root.
const KernelDir = ".cache/kernel"

// Kernel is the guest kernel that `make setup` unpacked: what the runner
// boots and the modules the init loads.
type Kernel struct {
	Dir     string   // the cache directory
	Vmlinuz string   // path of the compressed kernel image (bzImage)
	Vmlinux string   // path of the uncompressed kernel, "" until ExtractVmlinux made it
	Config  string   // path of the kernel's build config (may not exist)
	Version string   // uname -r of the guest, e.g. 6.1.0-56-amd64
	Modules []string // paths of the .ko files, in load order
}

// Image returns what to give QEMU's -kernel: the uncompressed kernel when
// the cache has one (QEMU boots it through its PVH entry point, which saves
// the guest the ~4 s that decompressing vmlinuz takes under TCG), else
// vmlinuz.
func (k *Kernel) Image() string {
	if k.Vmlinux != "" {
		return k.Vmlinux
	}
	return k.Vmlinuz
}

// moduleOrder is the load order the bench documents. It breaks ties in the
// order computed from the modules' own dependencies, and it is the whole
// order for modules whose metadata cannot be read (compressed ones).
var moduleOrder = []string{"irqbypass", "iommufd", "vfio", "vfio_iommu_type1", "vfio_virqfd", "vfio_pci_core", "vfio_pci"}

// The guest kernels the bench boots, by the name pvvm's -kernel takes.
const (
	// KernelStock is Debian's linux-image-amd64 (6.1) with its own VFIO
	// modules: the group/container path only. Its cache is KernelDir.
	KernelStock = "stock"
	// KernelCdev is Debian's 6.12 with iommufd and VFIO built out of tree
	// by `make setup` (CONFIG_IOMMUFD, CONFIG_VFIO_DEVICE_CDEV): /dev/iommu
	// and /dev/vfio/devices/vfioN beside the group path. Its cache is
	// CdevKernelDir, outside the checkout.
	KernelCdev = "cdev"
)

// EnvCache names the directory of the caches `make setup` keeps outside
// the checkout (default DefaultCache); setup and the bench read it alike.
const EnvCache = "VFRDMA_CACHE"

// DefaultCache is where `make setup` keeps what it builds outside the
// checkout, so that every clone on the machine shares it.
const DefaultCache = "/var/cache/vfrdma"

// CdevKernelDir returns the cdev guest kernel's cache: kernel-cdev under
// $VFRDMA_CACHE, or under DefaultCache.
func CdevKernelDir() string {
	dir := os.Getenv(EnvCache)
	if dir == "" {
		dir = DefaultCache
	}
	return filepath.Join(dir, "kernel-cdev")
}

// FindNamedKernel reads the cache of the guest kernel called name
// (KernelStock, or "" for it, or KernelCdev) for the repository at
// repoRoot.
func FindNamedKernel(repoRoot, name string) (*Kernel, error) {
	switch name {
	case "", KernelStock:
		return FindKernel(repoRoot)
	case KernelCdev:
		return FindKernelDir(CdevKernelDir())
	}
	return nil, fmt.Errorf("guest kernel %q: want %s or %s", name, KernelStock, KernelCdev)
}

// FindKernel reads the stock guest kernel's cache under repoRoot (see
// FindKernelDir).
func FindKernel(repoRoot string) (*Kernel, error) {
	return FindKernelDir(filepath.Join(repoRoot, KernelDir))
}

// FindKernelDir reads the guest kernel cache in dir. The modules are
// every .ko (or .ko.xz, .ko.zst) file in its modules directory, sorted so
// that each comes after the modules it depends on.
func FindKernelDir(dir string) (*Kernel, error) {
	notFound := func(what string) error {
		return fmt.Errorf("guest kernel not found in %s: run `make setup` (%s)", dir, what)
	}
	k := &Kernel{
		Dir:     dir,
		Vmlinuz: filepath.Join(dir, "vmlinuz"),
		Config:  filepath.Join(dir, "config"),
	}
	if st, err := os.Stat(k.Vmlinuz); err != nil || !st.Mode().IsRegular() {
		return nil, notFound("no vmlinuz")
	}
	if st, err := os.Stat(filepath.Join(dir, "vmlinux")); err == nil && st.Mode().IsRegular() {
		k.Vmlinux = filepath.Join(dir, "vmlinux")
	}
	v, err := os.ReadFile(filepath.Join(dir, "VERSION"))
	if err != nil {
		return nil, notFound("no VERSION")
	}
	k.Version = strings.TrimSpace(string(v))
	if k.Version == "" {
		return nil, notFound("empty VERSION")
	}
	if _, err := os.Stat(filepath.Join(dir, "modules")); err != nil {
		return nil, notFound("no modules directory")
	}
	mods, err := readModules(filepath.Join(dir, "modules"))
	if err != nil {
		return nil, fmt.Errorf("guest kernel in %s: %w", dir, err)
	}
	if len(mods) == 0 {
		return nil, notFound("no modules")
	}
	k.Modules, err = orderModules(mods)
	if err != nil {
		return nil, fmt.Errorf("guest kernel in %s: %w", dir, err)
	}
	return k, nil
}

// readModules reads the .ko (or compressed) files of dir with the
// dependencies their metadata names (none readable for compressed ones).
func readModules(dir string) ([]module, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var mods []module
	for _, e := range ents {
		name, ok := moduleName(e.Name())
		if !ok || !e.Type().IsRegular() {
			continue
		}
		m := module{name: name, path: filepath.Join(dir, e.Name())}
		if !strings.HasSuffix(e.Name(), ".ko") {
			m.unknownDeps = true
		} else if m.deps, err = moduleDepends(m.path); err != nil {
			return nil, err
		}
		mods = append(mods, m)
	}
	return mods, nil
}

type module struct {
	name        string // as the kernel knows it: dashes turned into underscores
	path        string
	deps        []string
	unknownDeps bool
}

// moduleName returns the kernel's name for a module file name.
func moduleName(file string) (string, bool) {
	for _, ext := range []string{".ko", ".ko.xz", ".ko.zst", ".ko.gz"} {
		if base, ok := strings.CutSuffix(file, ext); ok && base != "" {
			return strings.ReplaceAll(base, "-", "_"), true
		}
	}
	return "", false
}

// moduleDepends reads the depends= entry of an uncompressed module's
// .modinfo section (NUL-separated key=value strings).
func moduleDepends(path string) ([]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("module %s: %w", filepath.Base(path), err)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("module %s: no .modinfo section", filepath.Base(path))
	}
	data, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("module %s: .modinfo: %w", filepath.Base(path), err)
	}
	var deps []string
	for kv := range bytes.SplitSeq(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			for d := range strings.SplitSeq(string(v), ",") {
				if d != "" {
					deps = append(deps, strings.ReplaceAll(d, "-", "_"))
				}
			}
		}
	}
	return deps, nil
}

// orderModules sorts modules so that dependencies load first; among modules
// that are ready at the same time, moduleOrder decides, then the name.
// Modules with unknown dependencies are placed by moduleOrder alone, which is
// only sound when every module is of that kind.
func orderModules(mods []module) ([]string, error) {
	rank := func(name string) int {
		if i := slices.Index(moduleOrder, name); i >= 0 {
			return i
		}
		return len(moduleOrder)
	}
	slices.SortFunc(mods, func(a, b module) int {
		if ra, rb := rank(a.name), rank(b.name); ra != rb {
			return ra - rb
		}
		return strings.Compare(a.name, b.name)
	})
	present := make(map[string]bool, len(mods))
	for _, m := range mods {
		present[m.name] = true
	}
	for _, m := range mods {
		for _, d := range m.deps {
			if !present[d] {
				return nil, fmt.Errorf("module %s depends on %s, which is not in the cache", m.name, d)
			}
		}
	}
	loaded := make(map[string]bool, len(mods))
	var out []string
	for len(out) < len(mods) {
		progress := false
		for _, m := range mods {
			if loaded[m.name] {
				continue
			}
			ready := true
			for _, d := range m.deps {
				ready = ready && loaded[d]
			}
			if ready {
				loaded[m.name] = true
				out = append(out, m.path)
				progress = true
				break // restart: the earliest-ranked ready module goes next
			}
		}
		if !progress {
			return nil, errors.New("modules depend on each other in a cycle")
		}
	}
	return out, nil
}

// RefModulesDir is where `make setup` puts the reference guest's modules
// (ib_core, ib_uverbs, vmxnet3, virtio_net and theirs, and vmw_pvrdma built
// out of tree), under the kernel cache.
const RefModulesDir = "ref-modules"

// RefModules returns the reference guest's modules, each after those it
// depends on.
func (k *Kernel) RefModules() ([]string, error) {
	dir := filepath.Join(k.Dir, RefModulesDir)
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("the reference guest's modules are not in %s: run `make setup` (%w)", dir, err)
	}
	mods, err := readModules(dir)
	if err != nil {
		return nil, fmt.Errorf("reference modules in %s: %w", dir, err)
	}
	if len(mods) == 0 {
		return nil, fmt.Errorf("no reference guest modules in %s: run `make setup`", dir)
	}
	order, err := orderModules(mods)
	if err != nil {
		return nil, err
	}
	// vmw_pvrdma takes the netdev of the slot's vmxnet3 function when it
	// probes, which needs no symbol of vmxnet3 but needs it probed: last.
	for i, p := range order {
		if n, _ := moduleName(filepath.Base(p)); n == "vmw_pvrdma" {
			order = append(append(order[:i:i], order[i+1:]...), p)
			break
		}
	}
	return order, nil
}

// MgmtModules returns the modules of the management network's NIC
// (virtio-net over PCI) from the reference modules, each after those it
// depends on: what a vfrdma guest loads to reach the other guests by TCP
// (it must not load vmxnet3 or vmw_pvrdma: the driver owns those functions).
func (k *Kernel) MgmtModules() ([]string, error) {
	all, err := k.RefModules()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range all {
		n, _ := moduleName(filepath.Base(p))
		if strings.HasPrefix(n, "virtio") || strings.HasSuffix(n, "failover") {
			out = append(out, p)
		}
	}
	return out, nil
}
