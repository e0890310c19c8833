package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/vfrdma/vfrdma/qemu/guest"
	"github.com/vfrdma/vfrdma/qemu/proto"
)

// The reference stack: Linux's vmw_pvrdma driver and rdma-core in a guest
// on the same bench, running rdma-core's and perftest's programs.

// refProvider is rdma-core's vmw_pvrdma provider and its configuration:
// libibverbs loads the provider named by a .driver file in
// /etc/libibverbs.d from its provider directory.
var refProvider = []string{
	"/etc/libibverbs.d/vmw_pvrdma.driver",
	"/usr/lib/x86_64-linux-gnu/libibverbs/libvmw_pvrdma-rdmav34.so",
}

// refExtraFiles lists, by a reference program's base name, the files it
// loads that ldd does not show (dlopen'd modules), as glob patterns: each
// match goes into the image at its own path, with the shared libraries
// ldd lists for it. UCX dlopens its transports from its module directory
// by their soname (lib<name>.so.<major>; a symlink here, copied as the
// file it names), libuct_ib among them.
var refExtraFiles = map[string][]string{
	"ucx_perftest": {"/usr/lib/x86_64-linux-gnu/ucx/*.so.0"},
}

// command is one command line of a run, with the VMs it is for.
type command struct {
	args  []string
	env   []string // KEY=value words before the program: its environment
	only  []int    // none: every VM of its kind
	retry bool     // rerun while it fails, for up to 30 s
}

// perftestNoReport is what perftest prints when its CPU-clock sampling
// fails (a linear fit with r^2 < 0.9: a loaded TCG host) after the traffic
// completed; the guest takes that exit as done (guest.Step.OKIfOutput).
const perftestNoReport = "Can't produce a report"

// retryFor bounds a "retry" command's reruns.
const retryFor = 30 * time.Second

// parseCommands splits the arguments at lone "+" and reads an "@N" (or
// "@N,M") prefix: that command runs only in those VMs; then "retry"; then,
// as a shell would, KEY=value words before the program: its environment.
func parseCommands(args []string, vms int) ([]command, error) {
	lines, err := splitCommands(args)
	if err != nil {
		return nil, err
	}
	var out []command
	for _, line := range lines {
		c := command{args: line}
		if strings.HasPrefix(line[0], "@") {
			for _, f := range strings.Split(line[0][1:], ",") {
				vm, err := strconv.Atoi(f)
				if err != nil || vm < 0 || vm >= vms {
					return nil, fmt.Errorf("%q: want @VM with VM from 0 to %d", line[0], vms-1)
				}
				c.only = append(c.only, vm)
			}
			c.args = line[1:]
			if len(c.args) == 0 {
				return nil, fmt.Errorf("%q: no command after it", line[0])
			}
		}
		if c.args[0] == "retry" {
			c.retry, c.args = true, c.args[1:]
			if len(c.args) == 0 {
				return nil, errors.New(`"retry": no command after it`)
			}
		}
		for len(c.args) > 0 && isEnvWord(c.args[0]) {
			c.env, c.args = append(c.env, c.args[0]), c.args[1:]
		}
		if len(c.args) == 0 {
			return nil, fmt.Errorf("%q: no command after its environment", strings.Join(c.env, " "))
		}
		out = append(out, c)
	}
	return out, nil
}

// isEnvWord reports whether w is a shell-style assignment, KEY=value with
// KEY a letter or underscore then letters, digits and underscores.
func isEnvWord(w string) bool {
	k, _, ok := strings.Cut(w, "=")
	if !ok || k == "" {
		return false
	}
	for i, r := range k {
		switch {
		case r == '_', r >= 'A' && r <= 'Z', r >= 'a' && r <= 'z':
		case i > 0 && r >= '0' && r <= '9':
		default:
			return false
		}
	}
	return true
}

// isRefVM reports whether VM vm runs the reference stack: the last ref of
// the run's VMs do.
func (c *config) isRefVM(vm int) bool { return vm >= c.vms-c.ref }

// kind is what runs a command: pvctl in the vfrdma VMs, a host program in
// the reference VMs, or a host program in the vfrdma VMs over the drop-in.
type kind int

const (
	kindPvctl  kind = iota // pvctl in the vfrdma VMs
	kindRef                // a host program in the reference VMs
	kindDropin             // a host program in the vfrdma VMs, over the drop-in libibverbs
)

// kindOf says which image a command is for and what runs it there. A
// command that names a program on this host's PATH (and is not a pvctl
// command) is that program: unprefixed in a run with reference VMs it
// runs in them; aimed at vfrdma VMs (by @N, or unprefixed in a run
// without reference VMs) it runs there over the drop-in. Anything else
// is pvctl in the vfrdma VMs.
func (c *config) kindOf(cmd command) (kind, error) {
	ref, vf := 0, 0
	vms := cmd.only
	if len(vms) == 0 {
		for vm := 0; vm < c.vms; vm++ {
			vms = append(vms, vm)
		}
	}
	for _, vm := range vms {
		if c.isRefVM(vm) {
			ref++
		} else {
			vf++
		}
	}
	_, err := exec.LookPath(cmd.args[0])
	host := err == nil && !isPvctlCommand(cmd.args[0])
	switch {
	case len(cmd.only) == 0 && c.ref > 0 && c.ref < c.vms:
		// Unprefixed in a mixed run: a host program runs in the reference
		// VMs, anything else is pvctl in the vfrdma VMs.
		if host {
			return kindRef, nil
		}
		return kindPvctl, nil
	case ref > 0 && vf > 0:
		return 0, fmt.Errorf("%q is for vfrdma VMs and reference VMs at once (-ref %d makes the last %d reference VMs)", strings.Join(cmd.args, " "), c.ref, c.ref)
	case ref > 0:
		return kindRef, nil
	case host:
		return kindDropin, nil
	}
	return kindPvctl, nil
}

func isPvctlCommand(name string) bool {
	switch name {
	case "list", "bind", "unbind", "info", "regs", "pingpong", "bench", "am", "eth":
		return true
	}
	return false
}

// refSpec is the reference guest's image: the same init and kernel, the
// reference modules (vmw_pvrdma among them), the kernel's network
// interfaces up on the bench's networks, and the programs with every
// shared library they load.
func refSpec(ctx context.Context, c *config, init string, kernel *guest.Kernel, cmds []command) (guest.Spec, error) {
	mods, err := kernel.RefModules()
	if err != nil {
		return guest.Spec{}, err
	}
	k := *kernel
	k.Modules = mods
	spec := guest.Spec{Init: init, Kernel: &k, Net: []string{proto.NetEth}}
	if c.vms > 1 {
		spec.Net = append(spec.Net, proto.NetMgmt)
	}
	spec.Programs, spec.Files, err = hostPrograms(ctx, c, cmds, refExtraFiles, refStack())
	return spec, err
}

// stack is what a host program runs on in a guest: the files every such
// program needs beside its own libraries, and the environment it runs in.
type stack struct {
	kind kind
	// prefix names the programs in the image: prefix1-ibv_devinfo, ...
	prefix string
	// env goes before the command's own environment.
	env []string
	// base is put into the image for every program, each with the shared
	// libraries it loads.
	base []guest.File
	// omit names (by base name) libraries of the programs the image does
	// not carry: the stack brings its own.
	omit map[string]bool
	// err, if set, is why the stack cannot be built (hostFiles returns it).
	err error
}

// refStack is the reference guests' stack: rdma-core's libibverbs with its
// vmw_pvrdma provider, each file at its host path.
func refStack() stack {
	st := stack{kind: kindRef, prefix: "ref"}
	for _, f := range refProvider {
		st.base = append(st.base, guest.File{HostPath: f, Path: f, Mode: 0o755})
	}
	return st
}

// Where the vfrdma image holds the drop-in's libraries (make dropin's
// directory: libibverbs.so.1, and the librdmacm.so.1 stand-in perftest's
// libraries load), found by the loader through LD_LIBRARY_PATH in the
// program's environment.
const (
	dropinDir  = "/usr/lib/vfrdma"
	dropinName = "libibverbs.so.1"
)

// dropinStack is the vfrdma guests' stack for host programs: every shared
// library in dir (make dropin's build/vfrdma: the drop-in libibverbs.so.1
// and what it puts beside it) at /usr/lib/vfrdma, in place of the host's
// libraries of those names, which the image does not carry; nor
// rdma-core's providers or their configuration. dir without
// libibverbs.so.1 is an error.
func dropinStack(dir string) stack {
	st := stack{kind: kindDropin, prefix: "dropin", env: []string{"LD_LIBRARY_PATH=" + dropinDir}, omit: map[string]bool{}}
	if _, err := os.Stat(filepath.Join(dir, dropinName)); err != nil {
		st.err = fmt.Errorf("the drop-in: %w (make dropin builds it)", err)
		return st
	}
	libs, err := filepath.Glob(filepath.Join(dir, "lib*.so.*"))
	if err != nil {
		st.err = err
		return st
	}
	for _, l := range libs {
		base := filepath.Base(l)
		st.base = append(st.base, guest.File{HostPath: l, Path: dropinDir + "/" + base, Mode: 0o755})
		st.omit[base] = true
	}
	return st
}

// hostPrograms returns an image's programs for cmds, host programs that
// run on st, and the files they need (hostFiles).
func hostPrograms(ctx context.Context, c *config, cmds []command, extra map[string][]string, st stack) ([]guest.Program, []guest.File, error) {
	var progs []guest.Program
	var bins []string
	for i, cmd := range cmds {
		p, err := c.hostProgram(i, cmd, st)
		if err != nil {
			return nil, nil, err
		}
		progs = append(progs, p)
		bins = append(bins, p.HostPath)
	}
	files, err := hostFiles(ctx, bins, extra, st)
	return progs, files, err
}

// hostProgram is the i-th host program on st, for cmd: named
// <st.prefix><i+1>-<its base name> in the image, with st's environment
// before the command's. It records the command's line for messages.
func (c *config) hostProgram(i int, cmd command, st stack) (guest.Program, error) {
	bin, err := exec.LookPath(cmd.args[0])
	if err != nil {
		return guest.Program{}, fmt.Errorf("program %q: %w (make setup installs ibverbs-utils, perftest and ucx-utils)", cmd.args[0], err)
	}
	p := guest.Program{
		Name: fmt.Sprintf("%s%d-%s", st.prefix, i+1, filepath.Base(bin)), HostPath: bin,
		Args: cmd.args[1:], Env: append(slices.Clip(st.env), cmd.env...), Kind: guest.KindCmd,
		Timeout: c.cmdLimit(), Only: cmd.only,
	}
	if cmd.retry {
		p.Retry = retryFor
	}
	if strings.HasPrefix(filepath.Base(bin), "ib_") { // perftest
		p.OKIfOutput = perftestNoReport
	}
	c.nameProgram(p.Name, st.kind, cmd)
	return p, nil
}

// hostFiles lists the files an image needs for the host programs bins
// (which go to /bin) on st: st's base files, every shared library the
// programs and the base files load but those st.omit names, and the extra files extra
// names for the programs (see refExtraFiles) with their own libraries.
func hostFiles(ctx context.Context, bins []string, extra map[string][]string, st stack) ([]guest.File, error) {
	if st.err != nil {
		return nil, st.err
	}
	need := map[string]bool{}
	add := func(paths ...string) {
		for _, p := range paths {
			if !st.omit[filepath.Base(p)] {
				need[p] = true
			}
		}
	}
	for _, bin := range bins {
		libs, err := sharedLibs(ctx, bin)
		if err != nil {
			return nil, err
		}
		add(libs...)
		more, err := extraFiles(ctx, filepath.Base(bin), extra)
		if err != nil {
			return nil, err
		}
		add(more...)
	}
	var files []guest.File
	for _, f := range st.base {
		if _, err := os.Stat(f.HostPath); err != nil {
			return nil, fmt.Errorf("%s stack: %w (%s)", st.prefix, err, st.remedy())
		}
		files = append(files, f)
		if !strings.Contains(filepath.Base(f.HostPath), ".so") {
			continue // configuration
		}
		libs, err := sharedLibs(ctx, f.HostPath)
		if err != nil {
			return nil, err
		}
		add(libs...)
	}
	for _, f := range st.base {
		delete(need, f.HostPath) // in the image at its own path
	}
	var paths []string
	for p := range need {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("%s stack: %w (%s)", st.prefix, err, st.remedy())
		}
		files = append(files, guest.File{HostPath: p, Path: p, Mode: 0o755})
	}
	return files, nil
}

// remedy says what makes a missing file of the stack.
func (st stack) remedy() string {
	if st.kind == kindDropin {
		return "make dropin builds the drop-in; make setup installs the programs"
	}
	return "make setup installs ibverbs-providers"
}

// extraFiles lists the files table names for program prog (glob patterns,
// see refExtraFiles) and the shared libraries each of them loads. A
// pattern that matches nothing is an error: the program would fail in the
// guest in a less clear way.
func extraFiles(ctx context.Context, prog string, table map[string][]string) ([]string, error) {
	var out []string
	for _, pat := range table[prog] {
		matches, err := filepath.Glob(pat)
		if err != nil {
			return nil, fmt.Errorf("%s's extra files %q: %w", prog, pat, err)
		}
		if len(matches) == 0 {
			return nil, fmt.Errorf("%s's extra files: nothing matches %s (make setup installs ucx-utils)", prog, pat)
		}
		for _, m := range matches {
			out = append(out, m)
			if !strings.Contains(filepath.Base(m), ".so") {
				continue
			}
			libs, err := sharedLibs(ctx, m)
			if err != nil {
				return nil, err
			}
			out = append(out, libs...)
		}
	}
	return out, nil
}

// sharedLibs lists the shared libraries bin loads (ldd), the dynamic
// loader among them.
func sharedLibs(ctx context.Context, bin string) ([]string, error) {
	out, err := exec.CommandContext(ctx, "ldd", bin).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", bin, err)
	}
	var libs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			libs = append(libs, f[2])
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			libs = append(libs, f[0]) // the loader
		case len(f) >= 3 && f[1] == "=>" && f[2] == "not":
			return nil, fmt.Errorf("ldd %s: %s is not found", bin, f[0])
		}
	}
	return libs, nil
}
