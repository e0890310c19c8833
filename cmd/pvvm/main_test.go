package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/qemu"
	"github.com/vfrdma/vfrdma/qemu/fabric"
	"github.com/vfrdma/vfrdma/qemu/proto"
)

func TestSplitCommands(t *testing.T) {
	got, err := splitCommands([]string{"list", "--json", "+", "regs"})
	require.NoError(t, err)
	assert.Equal(t, [][]string{{"list", "--json"}, {"regs"}}, got)
}

// An empty command is refused before anything is built or booted: a "+"
// first, last or after another, or "+" alone (which booted a VM for
// nothing), each with where it is.
func TestEmptyCommandsAreRefusedBeforeBooting(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"+"}, `no command after "--"`},
		{[]string{"+", "+"}, `no command after "--"`},
		{[]string{"list", "+", "+"}, "after the last command"},
		{[]string{"list", "+"}, "after the last command"},
		{[]string{"+", "list"}, "before the first command"},
		{[]string{"list", "+", "+", "regs"}, "between commands 1 and 2"},
		{[]string{"@0", "+", "list"}, `"@0": no command after it`},
		{[]string{"list", "+", "retry"}, `"retry": no command after it`},
	} {
		c := config{vms: 2, pvctlArgs: tc.args}
		err := c.plan()
		require.Error(t, err, "%q", tc.args)
		assert.Contains(t, err.Error(), tc.want, "%q", tc.args)
		assert.Empty(t, c.cmds, "%q", tc.args)
	}
	c := config{vms: 1, pvctlArgs: []string{"list", "+", "regs", "--json"}}
	require.NoError(t, c.plan())
	assert.Equal(t, []command{{args: []string{"list"}}, {args: []string{"regs", "--json"}}}, c.cmds)
}

// plan refuses what the flags cannot mean together, also before anything
// is built.
func TestPlanRefusesFlagsThatDoNotGoTogether(t *testing.T) {
	c := config{vms: 1, ref: 2, pvctlArgs: []string{"info"}}
	assert.ErrorContains(t, c.plan(), "-ref 2: want 0 to -vms (1)")
	c = config{vms: 2, ref: 1, tests: "all"}
	assert.ErrorContains(t, c.plan(), "-ref runs programs, not in-guest tests")
	c = config{vms: 2, pvctlArgs: []string{"@2", "info"}}
	assert.ErrorContains(t, c.plan(), `"@2": want @VM with VM from 0 to 1`)
}

func TestTestArgs(t *testing.T) {
	for _, tc := range []struct {
		c    config
		want []string
	}{
		{config{vms: 1}, []string{"-test.skip", "^TestMultiVM"}},
		{config{vms: 2}, []string{"-test.run", "^TestMultiVM"}},
		{config{vms: 2, run: "^TestSmoke$"}, []string{"-test.run", "^TestSmoke$"}},
	} {
		if got := testArgs(&tc.c); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("testArgs(%+v) = %q, want %q", tc.c, got, tc.want)
		}
	}
}

func TestGuestPackages(t *testing.T) {
	root := t.TempDir()
	write := func(rel, body string) {
		p := filepath.Join(root, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a/x_guest_test.go", "// Copyright\n\n//go:build guest\n\npackage a\n")
	write("b/y_test.go", "package b\n")
	write("c/z_test.go", "//go:build guest && linux\n\npackage c\n")
	write("d/w_test.go", "//go:build !guest\n\npackage d\n")
	write("build/e/v_test.go", "//go:build guest\n\npackage e\n")
	got, err := guestTestPackages(root, "all")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "c"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("all = %q, want %q", got, want)
	}
	if _, err := guestTestPackages(root, "b"); err == nil {
		t.Fatal("package without guest tests accepted")
	}
	if got, err := guestTestPackages(root, "./a, c"); err != nil || !reflect.DeepEqual(got, []string{"a", "c"}) {
		t.Fatalf("list = %q, %v", got, err)
	}
}

// A failed run's messages name the command as it was given: its VM, its
// retry prefix and its arguments.
func TestCommandLineNamesTheCommandAsGiven(t *testing.T) {
	var c config
	c.nameProgram("pvctl-2", kindPvctl, command{args: []string{"pingpong", "--ud"}, only: []int{0}})
	c.nameProgram("ref1-ibv_ud_pingpong", kindRef, command{args: []string{"ibv_ud_pingpong", "-g", "1"}, only: []int{1, 2}, retry: true})
	assert.Equal(t, "@0 pvctl pingpong --ud", c.commandLine("pvctl-2"))
	assert.Equal(t, "@1,2 retry ibv_ud_pingpong -g 1", c.commandLine("ref1-ibv_ud_pingpong"))
	assert.Equal(t, "other", c.commandLine("other"), "an unknown program is named as it is")
}

func TestCommandLimitIsBoundedByTheRun(t *testing.T) {
	c := config{timeout: 2 * time.Minute}
	assert.Equal(t, 2*time.Minute, c.cmdLimit(), "no -limit: the run's")
	c.limit = 20 * time.Second
	assert.Equal(t, 20*time.Second, c.cmdLimit())
	c.limit = time.Hour
	assert.Equal(t, 2*time.Minute, c.cmdLimit(), "never past the run's")
}

// The post-mortem of a failed run shows every VM, not only the failed one:
// each command's end, the backend's drops and the console's tail.
func TestPostMortemShowsEveryVM(t *testing.T) {
	var c config
	c.nameProgram("pvctl", kindPvctl, command{args: []string{"pingpong"}, only: []int{0}})
	c.nameProgram("ref1-ibv_ud_pingpong", kindRef, command{args: []string{"ibv_ud_pingpong"}, only: []int{1}})
	res := &qemu.Result{VMs: []*qemu.VMResult{
		{Index: 0, Records: []proto.Record{{Event: proto.EventStart, Prog: "pvctl"}, {Event: proto.EventExit, Prog: "pvctl", Code: 1, Elapsed: 7}},
			Backend: []fabric.Counter{{Name: "drop_injected", Value: 1}}, Tail: []string{"zero-tail"}},
		{Index: 1, Records: []proto.Record{{Event: proto.EventStart, Prog: "ref1-ibv_ud_pingpong"}}, Tail: []string{"one-tail"}},
	}}
	var b strings.Builder
	postMortem(&b, &c, res, errors.New("vm0 failed"))
	out := b.String()
	for _, want := range []string{
		"pvvm: stopped: vm0 failed",
		"pvvm: vm0: `@0 pvctl pingpong`: exit 1 after 7.0s",
		"pvvm: vm0: backend: drop_injected=1",
		"pvvm: vm0 console: zero-tail",
		"pvvm: vm1: `@1 ibv_ud_pingpong`: still running",
		"pvvm: vm1: backend: no counters",
		"pvvm: vm1 console: one-tail",
	} {
		assert.Contains(t, out, want)
	}
}

// -vfio puts VFRDMA_VFIO in every vfrdma program's environment, before the
// command's own KEY=value words (which win); a value other than auto, cdev
// or group is refused before anything is built.
func TestVFIOFlagSetsEveryVfrdmaProgramsPath(t *testing.T) {
	c := config{vms: 1, vfio: "cdev", pvctlArgs: []string{"info", "+", "VFRDMA_VFIO=group", "regs"}}
	require.NoError(t, c.plan())
	progs, _, err := c.vfPrograms(context.Background(), "pvctl", "")
	require.NoError(t, err)
	require.Len(t, progs, 2)
	assert.Equal(t, []string{"VFRDMA_VFIO=cdev"}, progs[0].Env)
	assert.Equal(t, []string{"VFRDMA_VFIO=cdev", "VFRDMA_VFIO=group"}, progs[1].Env)
	c = config{vms: 1, vfio: "iommufd", tests: "all"}
	assert.ErrorContains(t, c.plan(), "-vfio iommufd: want auto, cdev or group")
	c = config{vms: 1}
	assert.Nil(t, c.vfioEnv(nil), "no -vfio: the programs choose")
}

// -kernel takes stock or cdev (default $VFRDMA_GUEST_KERNEL, else stock);
// any other name is refused before anything is built or booted.
func TestPlanRefusesAKernelThatIsNeitherStockNorCdev(t *testing.T) {
	for _, k := range []string{"", "stock", "cdev"} {
		c := config{vms: 1, kernel: k, pvctlArgs: []string{"info"}}
		assert.NoError(t, c.plan(), "-kernel %q", k)
	}
	c := config{vms: 1, kernel: "6.12", pvctlArgs: []string{"info"}}
	assert.ErrorContains(t, c.plan(), `-kernel "6.12": want stock or cdev`)
	assert.Empty(t, c.cmds)
	t.Setenv(envKernel, "cdev")
	assert.Equal(t, "cdev", kernelDefault())
	t.Setenv(envKernel, "")
	assert.Equal(t, "stock", kernelDefault())
}
