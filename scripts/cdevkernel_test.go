package scripts

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// metaShow is what `apt-cache show --no-all-versions linux-image-6.12-amd64`
// printed on the bench (the fields cdevkernel.sh reads).
const metaShow = `Package: linux-image-6.12-amd64
Source: linux-signed-6.12-amd64 (6.12.117+1~deb12u1)
Version: 6.12.117-1~deb12u1
Depends: linux-image-6.12.117+deb12-amd64 (= 6.12.117-1~deb12u1)
`

// cdevKernel runs setup.sh's cdev section (scripts/cdevkernel.sh) with
// VFRDMA_CACHE at cache, a fake apt-cache printing show for `show`, and a
// fake apt-get that logs its calls and fails to download. It returns the
// exit status and the output.
func cdevKernel(t *testing.T, cache, show string) (int, string) {
	t.Helper()
	bash, err := exec.LookPath("bash")
	require.NoError(t, err)
	bin := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(bin, "show"), []byte(show), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(bin, "apt-cache"), []byte("#!"+bash+"\n[ \"$1\" = show ] && cat "+filepath.Join(bin, "show")+"\n"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(bin, "apt-get"), []byte("#!"+bash+"\necho \"apt-get $*\" >&2\n[ \"$1\" = update ]\n"), 0o755))
	top, err := filepath.Abs("..")
	require.NoError(t, err)
	cmd := exec.Command(bash, "-c", `set -euo pipefail
die() { echo "setup: $*" >&2; exit 1; }
install_missing() { echo "install_missing $*" >&2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
source scripts/cdevkernel.sh`)
	cmd.Dir = top
	cmd.Env = []string{"PATH=" + bin + ":" + os.Getenv("PATH"), "VFRDMA_CACHE=" + cache, "HOME=" + t.TempDir()}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), string(out)
	}
	require.NoError(t, err)
	return 0, string(out)
}

// writeCdevCache makes a cache that holds package key.
func writeCdevCache(t *testing.T, key string) string {
	t.Helper()
	cache := t.TempDir()
	dir := filepath.Join(cache, "kernel-cdev")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "vmlinuz"), []byte("k"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "PACKAGE"), []byte(key+"\n"), 0o644))
	return cache
}

// A setup that finds the cdev kernel of the version apt offers in the
// cache builds nothing and downloads nothing: it only asks apt-cache.
func TestSetupKeepsACdevKernelCacheOfTheVersionAptOffers(t *testing.T) {
	cache := writeCdevCache(t, "linux-image-6.12.117+deb12-amd64 6.12.117-1~deb12u1")
	code, out := cdevKernel(t, cache, metaShow)
	assert.Zero(t, code, out)
	assert.Empty(t, out, "a setup that finds the cache said or did something")
}

// Another version of the same package (Debian rebuilt it under the same
// ABI name), or no cache at all, is built: setup names the package and
// version it builds. A build that fails leaves the cache it had alone.
func TestSetupRebuildsTheCdevKernelForAnotherPackageVersion(t *testing.T) {
	old := "linux-image-6.12.117+deb12-amd64 6.12.117-0~deb12u1"
	oldCache := writeCdevCache(t, old)
	for name, cache := range map[string]string{"other version": oldCache, "no cache": t.TempDir()} {
		code, out := cdevKernel(t, cache, metaShow)
		assert.Equal(t, 1, code, "%s: %s", name, out)
		assert.Contains(t, out, "setup: building the cdev guest kernel: linux-image-6.12.117+deb12-amd64 6.12.117-1~deb12u1", name)
		assert.Contains(t, out, "apt-get download -qq linux-image-6.12.117+deb12-amd64=6.12.117-1~deb12u1 linux-headers-6.12.117+deb12-amd64=6.12.117-1~deb12u1 linux-headers-6.12.117+deb12-common=6.12.117-1~deb12u1 linux-kbuild-6.12.117+deb12=6.12.117-1~deb12u1 linux-source-6.12=6.12.117-1~deb12u1", name)
		assert.Contains(t, out, "setup: apt-get download", name)
	}
	b, err := os.ReadFile(filepath.Join(oldCache, "kernel-cdev", "PACKAGE"))
	require.NoError(t, err)
	assert.Equal(t, old+"\n", string(b))
}

// A meta-package that does not pin its kernel package's version (or is
// not known to apt) stops setup, after one apt-get update, naming it.
func TestSetupStopsWhenAptCannotResolveTheCdevKernel(t *testing.T) {
	for name, show := range map[string]string{
		"unpinned": "Package: linux-image-6.12-amd64\nDepends: linux-image-6.12.117+deb12-amd64\n",
		"unknown":  "",
	} {
		code, out := cdevKernel(t, t.TempDir(), show)
		assert.Equal(t, 1, code, "%s: %s", name, out)
		assert.Contains(t, out, "apt-get update", name)
		assert.Contains(t, out, "setup: cannot resolve the kernel package behind linux-image-6.12-amd64", name)
	}
}
