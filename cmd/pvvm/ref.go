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

// kindOf says which image a command is for: a reference VM's (a program
// from the host, found on PATH) or a vfrdma VM's (pvctl).
func (c *config) forRef(cmd command) (bool, error) {
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
	switch {
	case len(cmd.only) == 0 && c.ref > 0 && c.ref < c.vms:
		// Unprefixed in a mixed run: a host program runs in the reference
		// VMs, anything else is pvctl in the vfrdma VMs.
		_, err := exec.LookPath(cmd.args[0])
		return err == nil && !isPvctlCommand(cmd.args[0]), nil
	case ref > 0 && vf > 0:
		return false, fmt.Errorf("%q is for vfrdma VMs and reference VMs at once (-ref %d makes the last %d reference VMs)", strings.Join(cmd.args, " "), c.ref, c.ref)
	}
	return ref > 0, nil
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
	spec.Programs, spec.Files, err = refPrograms(ctx, c, cmds, refExtraFiles)
	return spec, err
}

// refPrograms returns the reference image's programs for cmds and the files
// they need: rdma-core's provider, every shared library the programs and
// the provider load, and the extra files extra names for them (see
// refExtraFiles) with their own libraries.
func refPrograms(ctx context.Context, c *config, cmds []command, extra map[string][]string) ([]guest.Program, []guest.File, error) {
	var progs []guest.Program
	var files []guest.File
	need := map[string]bool{}
	for _, f := range refProvider {
		need[f] = true
	}
	for i, cmd := range cmds {
		bin, err := exec.LookPath(cmd.args[0])
		if err != nil {
			return nil, nil, fmt.Errorf("reference program %q: %w (make setup installs ibverbs-utils, perftest and ucx-utils)", cmd.args[0], err)
		}
		p := guest.Program{
			Name: fmt.Sprintf("ref%d-%s", i+1, filepath.Base(bin)), HostPath: bin,
			Args: cmd.args[1:], Env: cmd.env, Kind: guest.KindCmd, Timeout: c.cmdLimit(), Only: cmd.only,
		}
		if cmd.retry {
			p.Retry = retryFor
		}
		if strings.HasPrefix(filepath.Base(bin), "ib_") { // perftest
			p.OKIfOutput = perftestNoReport
		}
		c.nameProgram(p.Name, "", cmd)
		progs = append(progs, p)
		need[bin] = false // the program itself goes to /bin; its libraries:
		libs, err := sharedLibs(ctx, bin)
		if err != nil {
			return nil, nil, err
		}
		for _, l := range libs {
			need[l] = true
		}
		more, err := extraFiles(ctx, filepath.Base(bin), extra)
		if err != nil {
			return nil, nil, err
		}
		for _, f := range more {
			need[f] = true
		}
	}
	provLibs, err := sharedLibs(ctx, refProvider[1])
	if err != nil {
		return nil, nil, err
	}
	for _, l := range provLibs {
		need[l] = true
	}
	var paths []string
	for p, ok := range need {
		if ok {
			paths = append(paths, p)
		}
	}
	sort.Strings(paths)
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			return nil, nil, fmt.Errorf("reference stack: %w (make setup installs ibverbs-providers)", err)
		}
		files = append(files, guest.File{HostPath: p, Path: p, Mode: 0o755})
	}
	return progs, files, nil
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
