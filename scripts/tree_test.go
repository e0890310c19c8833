package scripts

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A fresh clone holds only the project: no symbolic link the repository
// tracks points outside it (a link to a developer's cache would make a
// clone share, or lose, that machine's files), and nothing under the
// caches and outputs that make setup and make test write is tracked.
func TestTheRepositoryTracksNoLinkOutOfItAndNoCache(t *testing.T) {
	out, err := exec.Command("git", "-C", "..", "ls-files", "-s").Output()
	require.NoError(t, err, "git ls-files")
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		meta, path, ok := strings.Cut(line, "\t")
		require.True(t, ok, "git ls-files -s line %q", line)
		for _, dir := range []string{".cache", "build"} {
			assert.False(t, path == dir || strings.HasPrefix(path, dir+"/"), "%s is tracked: it is written by make setup or make test", path)
		}
		if !strings.HasPrefix(meta, "120000 ") {
			continue
		}
		target, err := exec.Command("git", "-C", "..", "cat-file", "-p", strings.Fields(meta)[1]).Output()
		require.NoError(t, err)
		to := string(target)
		inside := !filepath.IsAbs(to) && !strings.HasPrefix(filepath.Clean(filepath.Join(filepath.Dir(path), to)), "..")
		assert.True(t, inside, "the tracked link %s points outside the repository, to %s", path, to)
	}
}

// A script a reader runs by its name (the usage lines say scripts/X.sh)
// is executable and names bash: run by /bin/sh, a bash script fails at
// its first bash-only line (set -o pipefail). The scripts that are only
// sourced say so in their first line.
func TestEveryScriptRunByItsNameIsExecutableBash(t *testing.T) {
	files, err := filepath.Glob("*.sh")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		first, _, _ := strings.Cut(string(data), "\n")
		if strings.Contains(strings.ToLower(first), "sourced") {
			continue
		}
		assert.Equal(t, "#!/usr/bin/env bash", first, "%s's first line", f)
		st, err := os.Stat(f)
		require.NoError(t, err)
		assert.NotZero(t, st.Mode()&0o100, "%s is not executable", f)
	}
}
