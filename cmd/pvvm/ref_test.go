package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/qemu/guest"
)

// KEY=value words before the program, after @N and retry, are its
// environment; words after the program are its arguments, whatever they
// look like.
func TestParseCommandsReadsAnEnvironment(t *testing.T) {
	cmds, err := parseCommands([]string{
		"@0", "UCX_NET_DEVICES=vmw_pvrdma0:1", "UCX_TLS=rc_verbs", "ucx_perftest", "-t", "ucp_am_lat", "X=1",
		"+", "@1", "retry", "_A1=", "ucx_perftest", "192.168.100.1",
		"+", "am", "--sizes=8",
	}, 2)
	require.NoError(t, err)
	require.Len(t, cmds, 3)
	assert.Equal(t, command{
		args: []string{"ucx_perftest", "-t", "ucp_am_lat", "X=1"},
		env:  []string{"UCX_NET_DEVICES=vmw_pvrdma0:1", "UCX_TLS=rc_verbs"},
		only: []int{0},
	}, cmds[0])
	assert.Equal(t, command{args: []string{"ucx_perftest", "192.168.100.1"}, env: []string{"_A1="}, only: []int{1}, retry: true}, cmds[1])
	assert.Equal(t, command{args: []string{"am", "--sizes=8"}}, cmds[2])

	_, err = parseCommands([]string{"@0", "A=1", "B=2"}, 2)
	assert.ErrorContains(t, err, `"A=1 B=2": no command after its environment`)
}

func TestIsEnvWord(t *testing.T) {
	for w, want := range map[string]bool{
		"A=1": true, "UCX_IB_GID_INDEX=1": true, "_x9=": true, "a=b=c": true,
		"=1": false, "9A=1": false, "A-B=1": false, "--sizes=8": false, "ucx_perftest": false, "": false,
	} {
		assert.Equal(t, want, isEnvWord(w), "%q", w)
	}
}

// The program's environment reaches its Program (and so the guest's
// manifest) and the command line kept for messages.
func TestEnvironmentReachesTheProgram(t *testing.T) {
	c, _, _ := planned(t, 1, "SPIN=1", "am", "--vm")
	require.Len(t, c.cmds, 1)
	c2 := &config{vms: 1, timeout: time.Minute}
	p := c2.pvctlProgram(0, c.cmds[0], "pvctl")
	assert.Equal(t, []string{"SPIN=1"}, p.Env)
	assert.Equal(t, []string{"am", "--vm"}, p.Args)
	assert.Equal(t, "SPIN=1 pvctl am --vm", c2.progs["pvctl"])
	spec := guest.Spec{Programs: []guest.Program{p}}
	m := spec.Manifest()
	require.NoError(t, m.Validate())
	assert.Equal(t, []string{"SPIN=1"}, m.Steps[0].Env)
}

// hostLib returns a shared library of this host (the C library), to stand
// in for a dlopen'd module.
func hostLib(t *testing.T) string {
	t.Helper()
	sh, err := exec.LookPath("sh")
	require.NoError(t, err)
	libs, err := sharedLibs(context.Background(), sh)
	require.NoError(t, err)
	for _, l := range libs {
		if filepath.Base(l) == "libc.so.6" {
			return l
		}
	}
	t.Fatalf("no libc.so.6 among %s's libraries %q", sh, libs)
	return ""
}

// A program's extra files are every match of its patterns, with the
// libraries of those that are shared objects; a pattern matching nothing
// is an error; a program the table does not name has none.
func TestExtraFiles(t *testing.T) {
	dir := t.TempDir()
	body, err := os.ReadFile(hostLib(t))
	require.NoError(t, err)
	mod := filepath.Join(dir, "mods", "libmod.so.0")
	require.NoError(t, os.MkdirAll(filepath.Dir(mod), 0o755))
	require.NoError(t, os.WriteFile(mod, body, 0o755))
	conf := filepath.Join(dir, "prog.conf")
	require.NoError(t, os.WriteFile(conf, []byte("x\n"), 0o644))
	table := map[string][]string{
		"prog":    {filepath.Join(dir, "mods", "*.so.0"), conf},
		"missing": {filepath.Join(dir, "none", "*.so.0")},
	}
	ctx := context.Background()

	got, err := extraFiles(ctx, "prog", table)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(got), 3, "%q", got)
	assert.Equal(t, mod, got[0])
	assert.Equal(t, conf, got[len(got)-1])
	wantLibs, err := sharedLibs(ctx, mod)
	require.NoError(t, err)
	assert.Equal(t, wantLibs, got[1:len(got)-1], "the module's own libraries")

	none, err := extraFiles(ctx, "other", table)
	require.NoError(t, err)
	assert.Empty(t, none)

	_, err = extraFiles(ctx, "missing", table)
	assert.ErrorContains(t, err, "nothing matches")
}

// A reference command's program carries its environment, and the image
// its extra files and their libraries.
func TestRefProgramsCarryEnvAndExtraFiles(t *testing.T) {
	for _, f := range refProvider {
		if _, err := os.Stat(f); err != nil {
			t.Skipf("rdma-core's vmw_pvrdma provider is not installed (make setup installs ibverbs-providers): %v", err)
		}
	}
	dir := t.TempDir()
	body, err := os.ReadFile(hostLib(t))
	require.NoError(t, err)
	mod := filepath.Join(dir, "libmod.so.0")
	require.NoError(t, os.WriteFile(mod, body, 0o755))
	table := map[string][]string{"sh": {filepath.Join(dir, "*.so.0")}}

	c := &config{vms: 2, ref: 2, timeout: time.Minute}
	cmds, err := parseCommands([]string{"@1", "retry", "A=1", "B=x y", "sh", "-c", "true"}, 2)
	require.NoError(t, err)
	progs, files, err := hostPrograms(context.Background(), c, cmds, table, refStack())
	require.NoError(t, err)
	require.Len(t, progs, 1)
	assert.Equal(t, "ref1-sh", progs[0].Name)
	assert.Equal(t, []string{"A=1", "B=x y"}, progs[0].Env)
	assert.Equal(t, []string{"-c", "true"}, progs[0].Args)
	assert.Equal(t, []int{1}, progs[0].Only)
	assert.Equal(t, retryFor, progs[0].Retry)
	assert.Equal(t, "@1 retry A=1 B=x y sh -c true", c.progs["ref1-sh"])
	paths := map[string]bool{}
	for _, f := range files {
		paths[f.Path] = true
		assert.Equal(t, f.HostPath, f.Path)
	}
	assert.True(t, paths[mod], "the extra file: %v", paths)
	assert.True(t, paths[hostLib(t)], "the extra file's library")
	for _, f := range refProvider {
		assert.True(t, paths[f], "%s", f)
	}
}

// On a host with UCX, ucx_perftest's image holds the IB transport UCX
// dlopens and the libraries it needs (libibverbs, libmlx5).
func TestUCXPerftestImageHasItsTransports(t *testing.T) {
	if _, err := exec.LookPath("ucx_perftest"); err != nil {
		t.Skip("ucx_perftest is not installed (make setup installs ucx-utils)")
	}
	got, err := extraFiles(context.Background(), "ucx_perftest", refExtraFiles)
	require.NoError(t, err)
	bases := map[string]bool{}
	for _, f := range got {
		bases[filepath.Base(f)] = true
	}
	for _, want := range []string{"libuct_ib.so.0", "libibverbs.so.1", "libmlx5.so.1"} {
		assert.True(t, bases[want], "%s in %q", want, got)
	}
}
