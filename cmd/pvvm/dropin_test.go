package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/qemu/proto"
)

// fakeDropin returns a directory as make dropin leaves build/vfrdma: the
// drop-in libibverbs.so.1 and the librdmacm.so.1 beside it (copies of this
// host's C library: the tests read their names and their libraries, never
// load them), and the header cgo writes.
func fakeDropin(t *testing.T) string {
	t.Helper()
	body, err := os.ReadFile(hostLib(t))
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "vfrdma")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for _, name := range []string{dropinName, "librdmacm.so.1"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), body, 0o755))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "libibverbs.h"), []byte("/* */\n"), 0o644))
	return dir
}

// needProgram skips the test when prog is not on this host's PATH.
func needProgram(t *testing.T, prog string) string {
	t.Helper()
	bin, err := exec.LookPath(prog)
	if err != nil {
		t.Skipf("%s is not installed (make setup installs ibverbs-utils, perftest and ucx-utils)", prog)
	}
	return bin
}

// Which image a command goes to and what runs it there: a program on this
// host's PATH aimed at vfrdma VMs (by @N, or unprefixed in a run without
// reference VMs) runs there over the drop-in; unprefixed in a mixed run it
// runs in the reference VMs; a pvctl command (even one a host program is
// also named, like info) and anything not on the PATH is pvctl.
func TestAHostProgramAimedAtVfrdmaVMsRunsThereOverTheDropin(t *testing.T) {
	for _, tc := range []struct {
		vms, ref int
		args     []string
		want     kind
	}{
		{1, 0, []string{"sh", "-c", "true"}, kindDropin},
		{2, 0, []string{"@1", "sh"}, kindDropin},
		{2, 0, []string{"retry", "A=1", "sh"}, kindDropin},
		{2, 0, []string{"info"}, kindPvctl},
		{2, 0, []string{"pingpong", "--vm"}, kindPvctl},
		{2, 0, []string{"no-such-program-here"}, kindPvctl},
		{3, 1, []string{"@0", "sh"}, kindDropin},
		{3, 1, []string{"@0,1", "sh"}, kindDropin},
		{3, 1, []string{"@2", "sh"}, kindRef},
		{3, 1, []string{"sh"}, kindRef},
		{3, 1, []string{"am", "--vm"}, kindPvctl},
		{3, 1, []string{"@1", "info"}, kindPvctl},
		{1, 1, []string{"sh"}, kindRef},
		{2, 2, []string{"@0", "sh"}, kindRef},
	} {
		c := config{vms: tc.vms, ref: tc.ref}
		cmds, err := parseCommands(tc.args, tc.vms)
		require.NoError(t, err, "%q", tc.args)
		got, err := c.kindOf(cmds[0])
		require.NoError(t, err, "%q", tc.args)
		assert.Equal(t, tc.want, got, "-vms %d -ref %d -- %q", tc.vms, tc.ref, tc.args)
	}
	c := config{vms: 3, ref: 1}
	cmds, err := parseCommands([]string{"@1,2", "sh"}, 3)
	require.NoError(t, err)
	_, err = c.kindOf(cmds[0])
	assert.ErrorContains(t, err, "for vfrdma VMs and reference VMs at once")
}

// plan keeps a vfrdma VM's commands in the order given, pvctl's and host
// programs' mixed (a VM runs them in that order), and sends the reference
// VMs' to their own image.
func TestPlanKeepsTheVfrdmaVMsCommandsInOrder(t *testing.T) {
	c := config{vms: 3, ref: 1, pvctlArgs: []string{
		"@0", "sh", "-c", "true", "+", "info", "+", "@2", "sh", "+", "@1", "retry", "sh", "-c", "false", "+", "list",
	}}
	require.NoError(t, c.plan())
	require.Len(t, c.cmds, 4)
	assert.Equal(t, []kind{kindDropin, kindPvctl, kindDropin, kindPvctl}, c.kinds)
	assert.Equal(t, "info", c.cmds[1].args[0])
	assert.Equal(t, []string{"sh", "-c", "false"}, c.cmds[2].args)
	require.Len(t, c.refCmds, 1)
	assert.Equal(t, []int{2}, c.refCmds[0].only)
	assert.Len(t, c.dropinCmds(), 2)

	pv := config{vms: 2, pvctlArgs: []string{"info", "+", "list"}}
	require.NoError(t, pv.plan())
	assert.Empty(t, pv.dropinCmds(), "pvctl alone needs no drop-in")
}

// The vfrdma image's programs come in the commands' order, each host
// program with LD_LIBRARY_PATH at the drop-in's directory before its own
// environment, named dropinN-<program>; its command line for messages is
// the command as given.
func TestVfrdmaImageRunsHostProgramsWithTheDropinOnTheirLibraryPath(t *testing.T) {
	bin := needProgram(t, "sh")
	c := &config{vms: 2, timeout: time.Minute, limit: 20 * time.Second, pvctlArgs: []string{
		"@0", "sh", "-c", "true", "+", "info", "+", "@1", "retry", "X=1", "sh", "-c", "exit 0",
	}}
	require.NoError(t, c.plan())
	progs, _, err := c.vfPrograms(context.Background(), "/build/pvctl", fakeDropin(t))
	require.NoError(t, err)
	require.Len(t, progs, 3)

	assert.Equal(t, "dropin1-sh", progs[0].Name)
	assert.Equal(t, bin, progs[0].HostPath)
	assert.Equal(t, []string{"-c", "true"}, progs[0].Args)
	assert.Equal(t, []string{"LD_LIBRARY_PATH=/usr/lib/vfrdma"}, progs[0].Env)
	assert.Equal(t, []int{0}, progs[0].Only)
	assert.Equal(t, 20*time.Second, progs[0].Timeout)

	assert.Equal(t, "pvctl", progs[1].Name)
	assert.Equal(t, "/build/pvctl", progs[1].HostPath)
	assert.Equal(t, []string{"info"}, progs[1].Args)

	assert.Equal(t, "dropin2-sh", progs[2].Name)
	assert.Equal(t, []string{"LD_LIBRARY_PATH=/usr/lib/vfrdma", "X=1"}, progs[2].Env)
	assert.Equal(t, retryFor, progs[2].Retry)

	assert.Equal(t, "@0 sh -c true", c.commandLine("dropin1-sh"))
	assert.Equal(t, "@1 retry X=1 sh -c exit 0", c.commandLine("dropin2-sh"))
	assert.Equal(t, "pvctl info", c.commandLine("pvctl"))
	for _, p := range c.programs {
		assert.False(t, p.ref, "%s runs in the vfrdma VMs", p.name)
	}
	assert.True(t, c.runsIn(c.programs[0], 0))
	assert.False(t, c.runsIn(c.programs[0], 1))
	assert.True(t, isPvctl("dropin1-sh"), "a host program's output is a command's")
}

// The vfrdma image carries each host program's shared libraries, the
// drop-in's libraries (libibverbs.so.1 and the librdmacm.so.1 beside it)
// at /usr/lib/vfrdma with their own libraries, and never the host's
// libraries of those names, rdma-core's providers or their configuration.
func TestVfrdmaImageCarriesTheDropinInPlaceOfTheHostsLibibverbs(t *testing.T) {
	bin := needProgram(t, "ib_send_bw")
	ctx := context.Background()
	hostLibs, err := sharedLibs(ctx, bin)
	require.NoError(t, err)
	replaced := map[string]string{} // the host's libibverbs.so.1 and librdmacm.so.1
	for _, l := range hostLibs {
		if b := filepath.Base(l); b == dropinName || b == "librdmacm.so.1" {
			replaced[b] = l
		}
	}
	require.Len(t, replaced, 2, "ib_send_bw loads the host's libibverbs and librdmacm: %q", hostLibs)

	c := &config{vms: 1, timeout: time.Minute, pvctlArgs: []string{"ib_send_bw", "-x", "0"}}
	require.NoError(t, c.plan())
	dir := fakeDropin(t)
	progs, files, err := c.vfPrograms(ctx, "pvctl", dir)
	require.NoError(t, err)
	require.Len(t, progs, 1)
	assert.Equal(t, "dropin1-ib_send_bw", progs[0].Name)

	byPath := map[string]string{}
	for _, f := range files {
		byPath[f.Path] = f.HostPath
	}
	for base := range replaced {
		assert.Equal(t, filepath.Join(dir, base), byPath["/usr/lib/vfrdma/"+base], "the drop-in's %s", base)
	}
	assert.NotContains(t, byPath, "/usr/lib/vfrdma/libibverbs.h", "only the libraries")
	for path, host := range byPath {
		if b := filepath.Base(path); replaced[b] != "" {
			assert.Equal(t, "/usr/lib/vfrdma/"+b, path, "the only %s is the drop-in's", b)
			assert.Equal(t, dir, filepath.Dir(host))
		}
		assert.NotContains(t, path, "/etc/libibverbs.d", "no provider configuration")
		assert.NotContains(t, path, "/libibverbs/", "no rdma-core provider")
	}
	for _, l := range hostLibs {
		if replaced[filepath.Base(l)] == "" {
			assert.Contains(t, byPath, l, "the program's library %s", l)
		} else {
			assert.NotContains(t, byPath, l, "the host's %s is not carried", l)
		}
	}
	dropinLibs, err := sharedLibs(ctx, filepath.Join(dir, dropinName))
	require.NoError(t, err)
	for _, l := range dropinLibs {
		assert.Contains(t, byPath, l, "the drop-in's library %s", l)
	}
}

// ucx_perftest over the drop-in: the vfrdma image holds UCX's dlopen'd
// IB transport and its libraries (libmlx5 among them), but not the host's
// libibverbs.
func TestVfrdmaImageHoldsUCXsTransportsButNotTheHostsLibibverbs(t *testing.T) {
	needProgram(t, "ucx_perftest")
	c := &config{vms: 2, timeout: time.Minute, pvctlArgs: []string{"@0", "UCX_NET_DEVICES=vfrdma0:1", "ucx_perftest", "-t", "ucp_am_lat"}}
	require.NoError(t, c.plan())
	progs, files, err := c.vfPrograms(context.Background(), "pvctl", fakeDropin(t))
	require.NoError(t, err)
	require.Len(t, progs, 1)
	assert.Equal(t, []string{"LD_LIBRARY_PATH=/usr/lib/vfrdma", "UCX_NET_DEVICES=vfrdma0:1"}, progs[0].Env)
	bases := map[string][]string{}
	for _, f := range files {
		bases[filepath.Base(f.Path)] = append(bases[filepath.Base(f.Path)], f.Path)
	}
	for _, want := range []string{"libuct_ib.so.0", "libmlx5.so.1", "libucp.so.0"} {
		assert.Contains(t, bases, want)
	}
	assert.Equal(t, []string{"/usr/lib/vfrdma/libibverbs.so.1"}, bases[dropinName])
	assert.Equal(t, []string{"/usr/lib/vfrdma/librdmacm.so.1"}, bases["librdmacm.so.1"], "libuct_rdmacm's librdmacm: the drop-in's")
}

// A run of only pvctl's commands carries no host files and needs no
// drop-in; the drop-in missing where one is needed is refused, saying how
// to build it.
func TestVfrdmaImageNeedsTheDropinOnlyForHostPrograms(t *testing.T) {
	c := &config{vms: 1, timeout: time.Minute, pvctlArgs: []string{"info", "+", "list"}}
	require.NoError(t, c.plan())
	progs, files, err := c.vfPrograms(context.Background(), "pvctl", "")
	require.NoError(t, err)
	assert.Len(t, progs, 2)
	assert.Empty(t, files)

	c = &config{vms: 1, timeout: time.Minute, pvctlArgs: []string{"sh", "-c", "true"}}
	require.NoError(t, c.plan())
	_, _, err = c.vfPrograms(context.Background(), "pvctl", t.TempDir())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "make dropin")
	assert.ErrorIs(t, err, os.ErrNotExist)
}

// A host program's output in a vfrdma VM is printed as pvctl's is, and the
// summary names it as given.
func TestAHostProgramsOutputInAVfrdmaVMIsPrinted(t *testing.T) {
	needProgram(t, "sh")
	opt := fakeBench(t, map[int][]proto.Record{
		0: {start("dropin1-sh"), out("dropin1-sh", "1000 iters in 0.50 seconds"), exit("dropin1-sh", 0, 0.5), done},
		1: {start("pvctl"), out("pvctl", "info of vm1"), exit("pvctl", 0, 0.3), done},
	})
	c, stdout, stderr := planned(t, 2, "@0", "sh", "-c", "true", "+", "@1", "info")
	code, err := runPvctl(context.Background(), c, opt)
	require.NoError(t, err)
	assert.Equal(t, 0, code)
	assert.Equal(t, "vm0: 1000 iters in 0.50 seconds\nvm1: info of vm1\n", stdout.String())
	assert.Regexp(t, `(?m)^pvvm:   vm0  0\.5s  ok +@0 sh -c true$`, stderr.String())
	assert.False(t, strings.Contains(stderr.String(), "LD_LIBRARY_PATH"), "the command as given")
}
