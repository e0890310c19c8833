package scripts

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// checkGo runs setup.sh's check_go against the repository's go.mod with
// PATH holding only the tools it needs and, if goScript is not "", a fake
// go running it; it returns the check's exit status and output (it writes
// only to stderr).
func checkGo(t *testing.T, goScript string, env ...string) (int, string) {
	t.Helper()
	bash, err := exec.LookPath("bash")
	require.NoError(t, err)
	bin := t.TempDir()
	for _, tool := range []string{"awk"} {
		p, err := exec.LookPath(tool)
		require.NoError(t, err)
		require.NoError(t, os.Symlink(p, filepath.Join(bin, tool)))
	}
	if goScript != "" {
		require.NoError(t, os.WriteFile(filepath.Join(bin, "go"), []byte("#!"+bash+"\n"+goScript+"\n"), 0o755))
	}
	top, err := filepath.Abs("..")
	require.NoError(t, err)
	cmd := exec.Command(bash, "-c", `set -euo pipefail; source scripts/gocheck.sh; check_go "$1"`, "check", top)
	cmd.Dir = top
	cmd.Env = append([]string{"PATH=" + bin, "HOME=" + t.TempDir()}, env...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), string(out)
	}
	require.NoError(t, err)
	return 0, string(out)
}

// goModVersion is the version go.mod's go line names.
func goModVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../go.mod")
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(b)
	require.NotNil(t, m, "go.mod has a go line")
	return string(m[1])
}

// A go older than go.mod's (Debian 12's 1.19) stops setup, naming it and
// the version needed, with the commands that install one from go.dev.
func TestSetupStopsOnAGoOlderThanGoMods(t *testing.T) {
	need := goModVersion(t)
	code, msg := checkGo(t, `[ "$1 $2" = "env GOVERSION" ] && echo go1.19.8 || echo "go version go1.19.8 linux/amd64"`)
	assert.Equal(t, 1, code, msg)
	assert.Contains(t, msg, "is go1.19.8; go.mod needs go "+need+" or newer")
	assert.Contains(t, msg, "curl -fsSL -o /tmp/go.tar.gz https://go.dev/dl/go"+need+".linux-amd64.tar.gz")
	assert.Contains(t, msg, "rm -rf /usr/local/go && tar -C /usr/local -xzf /tmp/go.tar.gz")
	assert.Contains(t, msg, "export PATH=/usr/local/go/bin:$PATH")
	assert.NotContains(t, msg, "sudo -i", "said only under sudo")

	code, msg = checkGo(t, `echo go1.19.8`, "SUDO_USER=someone")
	assert.Equal(t, 1, code, msg)
	assert.Contains(t, msg, "sudo resets PATH", "under sudo: why /usr/local/go/bin is not found")
}

// A go that cannot switch to go.mod's toolchain (Go 1.21+ downloads it, and
// here cannot) is judged by its own version.
func TestSetupJudgesAGoThatCannotSwitchByItsOwnVersion(t *testing.T) {
	code, msg := checkGo(t, `if [ "$1" = env ]; then echo "go: downloading go1.99.0: dial tcp: connection refused" >&2; exit 1; fi; echo "go version go1.22.3 linux/amd64"`)
	assert.Equal(t, 1, code, msg)
	assert.Contains(t, msg, "is go1.22.3; go.mod needs go")
}

func TestSetupStopsWithoutGo(t *testing.T) {
	code, msg := checkGo(t, "")
	assert.Equal(t, 1, code, msg)
	assert.Contains(t, msg, "go is not on PATH")
	assert.Contains(t, msg, "https://go.dev/dl/go"+goModVersion(t)+".linux-amd64.tar.gz")
}

// A go at or past go.mod's version passes, silently: a newer minor or
// release, a newer major one, a development build.
func TestSetupTakesAGoAtLeastGoMods(t *testing.T) {
	need := goModVersion(t)
	for _, v := range []string{"go" + need, "go1.99.0", "go2.0", "devel go1.99-abcdef Tue Jan 1 00:00:00 2030 +0000"} {
		code, msg := checkGo(t, `echo "`+v+`"`)
		assert.Equal(t, 0, code, "%s: %s", v, msg)
		assert.Empty(t, msg, v)
	}
	code, msg := checkGo(t, `echo "go1.9.7"`)
	assert.Equal(t, 1, code, "go1.9 is older than go1.26, though 9 > 2: %s", msg)
}
