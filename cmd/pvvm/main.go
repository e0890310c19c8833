// Command pvvm runs the driver inside QEMU guests with the emulated pvrdma
// device, from the host.
//
//	pvvm [flags] -- ARGS...       boot a VM and run `pvctl ARGS` in it; print
//	                              its output and exit with its status ("+"
//	                              alone separates several pvctl command lines)
//	pvvm [flags] -test PKGS       build the in-guest tests of PKGS (a comma
//	                              list of package directories, or "all") and
//	                              run them in the VM(s)
//
// A command that names a program on the host's PATH (ibv_devinfo,
// ib_send_bw, ucx_perftest, ...) runs that program instead of pvctl: in
// the reference VMs (-ref) when unprefixed in a run that has them, and in
// the vfrdma VMs, over the drop-in libibverbs.so.1 that `make dropin`
// builds (pvvm runs it), when aimed at them by @N or unprefixed in a run
// without reference VMs. The image carries the program and the shared
// libraries it loads, the drop-in's libraries (build/vfrdma) at
// /usr/lib/vfrdma in place of the host's of those names (LD_LIBRARY_PATH
// in the program's environment), and no rdma-core provider.
//
// A command's standard output goes to pvvm's, its standard error to pvvm's
// (so `pvvm -- info --json > info.json` holds the JSON alone). With
// several VMs each line starts "vmN: " and each VM's lines come as a block
// once the run is over. A run of more than one command (counting each VM
// a command runs in) ends with a summary on stderr: each command, its VM,
// how it ended and how long it took. An empty command ("+" with nothing
// before or after it) is refused before anything is built.
//
// With -vms N the VMs share one software RDMA fabric and a control channel
// each, so tests can exchange QP addresses, and a management network
// (virtio-net, 192.168.100.N+1) for TCP between them. Tests whose names
// start with TestMultiVM need several VMs: a one-VM run leaves them out,
// and a several-VM run runs only them unless -run says otherwise.
//
// Every VM boots the stock guest kernel (Debian's 6.1, VFIO's group path),
// or with -kernel cdev (or VFRDMA_GUEST_KERNEL=cdev) the cdev kernel that
// make setup builds (6.12 with iommufd and the VFIO device cdev).
//
// Under -test the last line is "pvvm: N passed, N failed". A skipped test
// counts as failed unless -allow-skip is given: on the bench every in-guest
// test must be able to run.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vfrdma/vfrdma/qemu"
	"github.com/vfrdma/vfrdma/qemu/guest"
	"github.com/vfrdma/vfrdma/qemu/proto"
)

// multiVMPrefix names tests that need more than one VM.
const multiVMPrefix = "TestMultiVM"

// envKernel names the environment variable that chooses the guest kernel
// when -kernel is not given.
const envKernel = "VFRDMA_GUEST_KERNEL"

// kernelDefault is -kernel's default: $VFRDMA_GUEST_KERNEL, else the stock
// kernel.
func kernelDefault() string {
	if k := os.Getenv(envKernel); k != "" {
		return k
	}
	return guest.KernelStock
}

type config struct {
	vms       int
	tests     string
	run       string
	timeout   time.Duration
	limit     time.Duration // each command's own limit (0: the run's)
	dropUD    string        // the backend's SOFTVERBS_DROP_UD test hook
	counters  bool          // print every VM's backend counters
	verbose   bool
	allowSkip bool
	keep      bool
	debug     bool
	pvctlArgs []string
	vfio      string            // -vfio: the VFIO path of the vfrdma VMs' programs ("" leaves it to them)
	ref       int               // the last ref VMs run the reference stack
	kernel    string            // the guest kernel: guest.KernelStock or guest.KernelCdev
	doorbells bool              // count the doorbells each device received
	timeline  bool              // break a two-VM ping-pong's round trips down from the devices' timelines
	cmds      []command         // the vfrdma VMs' commands: pvctl's, and host programs over the drop-in (kinds)
	kinds     []kind            // each of cmds': kindPvctl or kindDropin
	refCmds   []command         // programs for the reference VMs
	progs     map[string]string // a program's name in the image → its command line
	programs  []program         // the images' programs, in order

	stdout, stderr io.Writer // pvvm's own (os.Stdout, os.Stderr)
}

// program is one command of a run as the images hold it.
type program struct {
	name string // its name in the image (proto.Record.Prog)
	only []int  // the VMs that run it; none: every VM of its kind
	ref  bool   // a reference VM's program
}

// runsIn reports whether VM vm runs p.
func (c *config) runsIn(p program, vm int) bool {
	if c.isRefVM(vm) != p.ref {
		return false
	}
	return len(p.only) == 0 || slices.Contains(p.only, vm)
}

// commandLine is the command line a program of the image runs.
func (c *config) commandLine(prog string) string {
	if l, ok := c.progs[prog]; ok {
		return l
	}
	return prog
}

// nameProgram records the command line behind a program of the image, as
// it was given (with its @VM and retry prefixes and its environment), for
// messages; k says what runs it (pvctl's command lines name pvctl).
func (c *config) nameProgram(prog string, k kind, cmd command) {
	if c.progs == nil {
		c.progs = map[string]string{}
	}
	c.programs = append(c.programs, program{name: prog, only: cmd.only, ref: k == kindRef})
	var words []string
	if len(cmd.only) > 0 {
		vms := make([]string, len(cmd.only))
		for i, vm := range cmd.only {
			vms[i] = strconv.Itoa(vm)
		}
		words = append(words, "@"+strings.Join(vms, ","))
	}
	if cmd.retry {
		words = append(words, "retry")
	}
	words = append(words, cmd.env...)
	if k == kindPvctl {
		words = append(words, "pvctl")
	}
	c.progs[prog] = strings.Join(append(words, cmd.args...), " ")
}

func main() {
	c := config{stdout: os.Stdout, stderr: os.Stderr}
	flag.IntVar(&c.vms, "vms", 1, "number of VMs on one shared fabric")
	flag.StringVar(&c.tests, "test", "", `run in-guest tests of these packages (comma-separated directories, or "all")`)
	flag.StringVar(&c.run, "run", "", "only tests matching this regexp (-test.run)")
	flag.DurationVar(&c.timeout, "timeout", 5*time.Minute, "hard limit for the whole run")
	flag.DurationVar(&c.limit, "limit", 0, "each command's own time limit: past it the command is killed and the run stopped (default: -timeout)")
	flag.StringVar(&c.dropUD, "drop-ud", "", "test hook: every VM's backend loses the Nth (,Mth...) UD datagram it receives (SOFTVERBS_DROP_UD)")
	flag.BoolVar(&c.counters, "counters", false, "print each VM's backend counters (traffic, and drops by reason) at the end")
	flag.BoolVar(&c.verbose, "v", false, "stream the console and every program's output")
	flag.BoolVar(&c.allowSkip, "allow-skip", false, "do not count skipped in-guest tests as failures")
	flag.BoolVar(&c.keep, "keep", false, "keep the built image in build/pvvm")
	flag.BoolVar(&c.debug, "debug", false, "log the bench's own steps to stderr")
	flag.BoolVar(&c.doorbells, "doorbells", false, "count, on the device side, the doorbells each VM's pvrdma received (QEMU's trace: a line per doorbell, written by the vCPU thread, which costs rate: ib_send_bw 64 B ran at 0.5-0.7x)")
	flag.BoolVar(&c.timeline, "timeline", false, "record each device's doorbells and CQEs on the host's clock (QEMU's trace) and break a two-VM ping-pong's round trips down: each transit and each end's turnaround (implies -doorbells; ib_send_bw 64 B ran at 0.25x)")
	flag.StringVar(&c.vfio, "vfio", "", "the VFIO path every program of the vfrdma VMs takes, in-guest tests included: auto, cdev or group (VFRDMA_VFIO in their environment; package vfio reads it in guest builds); the bench's guest kernel needs iommufd and the device cdev for cdev")
	flag.StringVar(&c.kernel, "kernel", kernelDefault(), "the guest kernel every VM boots: "+guest.KernelStock+" (Debian's 6.1, VFIO's group path only) or "+guest.KernelCdev+" (6.12 with iommufd and the VFIO device cdev, built by make setup); default $"+envKernel+", else "+guest.KernelStock)
	flag.IntVar(&c.ref, "ref", 0, "the last N VMs run the reference stack (Linux vmw_pvrdma + rdma-core) and rdma-core's or perftest's programs instead of pvctl")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: pvvm [flags] -- PVCTL-ARGS... [+ PVCTL-ARGS...]\n       pvvm [flags] -test PKGS\n       pvvm [flags] -- [@VM] PROGRAM ARGS... [+ ...]\n       pvvm -vms 2 -ref 1 -- [@VM] PVCTL-ARGS + [@VM] PROGRAM ARGS...\n\n"+
			"A command prefixed @N runs only in VM N; one prefixed retry runs again while it fails,\n"+
			"for up to 30 s (a client whose server in another VM may not be up yet). KEY=value\n"+
			"words before the program (after @N and retry) are its environment in the guest. A command\n"+
			"that names a program on this host's PATH (ibv_devinfo, ibv_rc_pingpong, ib_send_bw,\n"+
			"ucx_perftest, ...) runs that program: unprefixed with -ref, in the reference VMs; aimed\n"+
			"at vfrdma VMs (@N, or unprefixed without -ref), in them over the drop-in libibverbs\n"+
			"(make dropin; pvvm builds it). Anything else is pvctl in the vfrdma VMs.\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	c.pvctlArgs = flag.Args()
	if (c.tests == "") == (len(c.pvctlArgs) == 0) {
		flag.Usage()
		os.Exit(2)
	}
	if err := c.plan(); err != nil {
		fmt.Fprintln(os.Stderr, "pvvm:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code, err := run(ctx, &c)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "pvvm:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

func run(ctx context.Context, c *config) (int, error) {
	root, err := repoRoot()
	if err != nil {
		return 1, err
	}
	kernel, err := guest.FindNamedKernel(root, c.kernel)
	if err != nil {
		return 1, err
	}
	// The uncompressed kernel boots about 4 s faster under TCG (no xz
	// decompression in the guest); it is made once, next to the cache.
	if kernel.Vmlinux == "" {
		if err := guest.ExtractVmlinux(ctx, kernel); err != nil {
			return 1, err
		}
	}
	opt := &qemu.Options{
		BackendDir:     filepath.Join(root, "build", "softverbs"),
		Kernel:         kernel.Image(),
		Timeout:        c.timeout,
		TraceDoorbells: c.doorbells || c.timeline,
		Timeline:       c.timeline,
	}
	if c.dropUD != "" {
		opt.Env = append(opt.Env, "SOFTVERBS_DROP_UD="+c.dropUD)
	}
	if c.debug {
		opt.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	// The backend QEMU loads: make rebuilds it only when a source changed.
	if err := buildBackend(ctx, root, opt.BackendDir); err != nil {
		return 1, err
	}
	// Fail on a missing prerequisite before spending time on builds.
	opt.Initrd = kernel.Vmlinuz // placeholder so Check looks at everything else
	if err := qemu.Check(opt); err != nil {
		return 1, err
	}

	out := filepath.Join(root, "build", "pvvm")
	if err := os.MkdirAll(out, 0o755); err != nil {
		return 1, err
	}
	img, err := os.MkdirTemp(out, "img-")
	if err != nil {
		return 1, err
	}
	if !c.keep {
		defer os.RemoveAll(img)
	}
	t0 := time.Now()
	spec, err := buildSpec(ctx, c, root, img, kernel)
	if err != nil {
		return 1, err
	}
	if err := c.withMgmt(&spec, kernel); err != nil {
		return 1, err
	}
	opt.Initrd = filepath.Join(img, "initramfs.cpio")
	if err := guest.WriteInitramfs(opt.Initrd, spec); err != nil {
		return 1, err
	}
	if c.ref > 0 {
		rspec, err := refSpec(ctx, c, spec.Init, kernel, c.refCmds)
		if err != nil {
			return 1, err
		}
		refInitrd := filepath.Join(img, "initramfs-ref.cpio")
		if err := guest.WriteInitramfs(refInitrd, rspec); err != nil {
			return 1, err
		}
		for vm := 0; vm < c.vms; vm++ {
			if c.isRefVM(vm) {
				opt.Initrds = append(opt.Initrds, refInitrd)
			} else {
				opt.Initrds = append(opt.Initrds, opt.Initrd)
			}
		}
	}
	buildTime := time.Since(t0)

	if c.tests != "" {
		return runTests(ctx, c, opt, spec, buildTime)
	}
	return runPvctl(ctx, c, opt)
}

// plan checks the flags against each other and reads the command lines
// after "--" into c.cmds and c.refCmds: everything that can be refused is
// refused here, before anything is built or booted.
func (c *config) plan() error {
	switch c.vfio {
	case "", "auto", "cdev", "group":
	default:
		return fmt.Errorf("-vfio %s: want auto, cdev or group", c.vfio)
	}
	if c.kernel != "" && c.kernel != guest.KernelStock && c.kernel != guest.KernelCdev {
		return fmt.Errorf("-kernel %q: want %s or %s", c.kernel, guest.KernelStock, guest.KernelCdev)
	}
	if c.ref < 0 || c.ref > c.vms {
		return fmt.Errorf("-ref %d: want 0 to -vms (%d)", c.ref, c.vms)
	}
	if c.ref > 0 && c.tests != "" {
		return errors.New("-ref runs programs, not in-guest tests: give them after --")
	}
	if c.tests != "" {
		return nil
	}
	cmds, err := parseCommands(c.pvctlArgs, c.vms)
	if err != nil {
		return err
	}
	for _, cmd := range cmds {
		k, err := c.kindOf(cmd)
		if err != nil {
			return err
		}
		if k == kindRef {
			c.refCmds = append(c.refCmds, cmd)
		} else {
			c.cmds = append(c.cmds, cmd)
			c.kinds = append(c.kinds, k)
		}
	}
	return nil
}

// dropinCmds returns the vfrdma VMs' commands that run host programs over
// the drop-in.
func (c *config) dropinCmds() []command {
	var out []command
	for i, cmd := range c.cmds {
		if c.kinds[i] == kindDropin {
			out = append(out, cmd)
		}
	}
	return out
}

// withMgmt puts the management network into the vfrdma guests' image when
// the run has several VMs: the modules of its virtio-net NIC (from the
// reference modules `make setup` builds) and the interface up at
// 192.168.100.N+1. Every run of several VMs has it, so the vfrdma guests
// reach each other (pvctl --listen/--connect) and the reference guests
// (rdma-core's programs exchange QP addresses by TCP) over it; the
// reference image brings it up itself (refSpec).
func (c *config) withMgmt(spec *guest.Spec, kernel *guest.Kernel) error {
	if c.vms < 2 || c.ref == c.vms {
		return nil
	}
	mods, err := kernel.MgmtModules()
	if err != nil {
		return err
	}
	k := *kernel
	k.Modules = append(append([]string(nil), kernel.Modules...), mods...)
	spec.Kernel = &k
	spec.Net = append(spec.Net, proto.NetMgmt)
	return nil
}

// buildSpec builds the init and the programs into dir.
func buildSpec(ctx context.Context, c *config, root, dir string, kernel *guest.Kernel) (guest.Spec, error) {
	spec := guest.Spec{Init: filepath.Join(dir, "init"), Kernel: kernel, BindPVRDMA: true}
	type job struct {
		prog  guest.Program
		build func() error
	}
	jobs := []job{{build: func() error { return guest.BuildInit(ctx, root, spec.Init) }}}
	if c.tests == "" {
		bin := filepath.Join(dir, "pvctl")
		jobs = append(jobs, job{build: func() error {
			return guest.BuildProgram(ctx, filepath.Join(root, "cmd", "pvctl"), bin)
		}})
		dir := ""
		if len(c.dropinCmds()) > 0 {
			var err error
			if dir, err = buildDropin(ctx, root); err != nil {
				return spec, err
			}
		}
		progs, files, err := c.vfPrograms(ctx, bin, dir)
		if err != nil {
			return spec, err
		}
		for _, p := range progs {
			jobs = append(jobs, job{prog: p})
		}
		spec.Files = files
	} else {
		pkgs, err := guestTestPackages(root, c.tests)
		if err != nil {
			return spec, err
		}
		args := testArgs(c)
		for _, pkg := range pkgs {
			name := strings.ReplaceAll(pkg, "/", "_") + ".test"
			if pkg == "." {
				name = "vfrdma.test"
			}
			p := guest.Program{Name: name, HostPath: filepath.Join(dir, name), Args: args, Env: c.vfioEnv(nil), Kind: guest.KindGoTest, Timeout: c.timeout}
			pkgDir := filepath.Join(root, pkg)
			jobs = append(jobs, job{prog: p, build: func() error { return guest.BuildTestBinary(ctx, pkgDir, p.HostPath) }})
		}
	}
	// Two builders: the machine has two cores.
	errs := make([]error, len(jobs))
	for i := range jobs {
		if jobs[i].build == nil {
			jobs[i].build = func() error { return nil }
		}
	}
	sem := make(chan struct{}, 2)
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = j.build()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return spec, err
		}
	}
	for _, j := range jobs[1:] {
		if j.prog.Name != "" {
			spec.Programs = append(spec.Programs, j.prog)
		}
	}
	return spec, nil
}

// vfPrograms returns the vfrdma image's programs for c.cmds, in their
// order (a VM runs its programs in the image's order), and the files they
// need: pvctl's commands run pvctl (built at pvctl), host programs run
// over the drop-in built in dir (hostFiles, dropinStack; "" when none is
// asked for).
func (c *config) vfPrograms(ctx context.Context, pvctl, dir string) ([]guest.Program, []guest.File, error) {
	st := dropinStack(dir)
	var progs []guest.Program
	var hostBins []string
	npvctl, nhost := 0, 0
	for i, cmd := range c.cmds {
		if c.kinds[i] != kindDropin {
			progs = append(progs, c.pvctlProgram(npvctl, cmd, pvctl))
			npvctl++
			continue
		}
		p, err := c.hostProgram(nhost, cmd, st)
		if err != nil {
			return nil, nil, err
		}
		nhost++
		progs = append(progs, p)
		hostBins = append(hostBins, p.HostPath)
	}
	if len(hostBins) == 0 {
		return progs, nil, nil
	}
	files, err := hostFiles(ctx, hostBins, refExtraFiles, st)
	return progs, files, err
}

// pvctlProgram is the program of the vfrdma image that runs the i-th
// pvctl command, bin: "pvctl", then "pvctl-2", ... (the image holds one
// copy per name; they are a few MB each). It records the command's line
// for messages and the summary.
func (c *config) pvctlProgram(i int, cmd command, bin string) guest.Program {
	name := "pvctl"
	if i > 0 {
		name = fmt.Sprintf("pvctl-%d", i+1)
	}
	p := guest.Program{Name: name, HostPath: bin, Args: cmd.args, Env: c.vfioEnv(cmd.env), Kind: guest.KindCmd, Timeout: c.cmdLimit(), Only: cmd.only}
	if cmd.retry {
		p.Retry = retryFor
	}
	c.nameProgram(name, kindPvctl, cmd)
	return p
}

// vfioEnv is env with -vfio's VFRDMA_VFIO before it (a command's own
// KEY=value words come after, and win).
func (c *config) vfioEnv(env []string) []string {
	if c.vfio == "" {
		return env
	}
	return append([]string{"VFRDMA_VFIO=" + c.vfio}, env...)
}

// cmdLimit is the time limit of one command of a run.
func (c *config) cmdLimit() time.Duration {
	if c.limit > 0 && c.limit < c.timeout {
		return c.limit
	}
	return c.timeout
}

// splitCommands splits pvctl arguments at lone "+" into several command
// lines run one after the other in the same VM. Each "+" goes between two
// commands: an empty command (a "+" first, last or after another) is an
// error, as a run with none would boot a VM for nothing.
func splitCommands(args []string) ([][]string, error) {
	out := [][]string{{}}
	for _, a := range args {
		if a == "+" {
			out = append(out, []string{})
			continue
		}
		out[len(out)-1] = append(out[len(out)-1], a)
	}
	nonEmpty := func(cmds [][]string) int {
		n := 0
		for _, cmd := range cmds {
			if len(cmd) > 0 {
				n++
			}
		}
		return n
	}
	if nonEmpty(out) == 0 {
		return nil, errors.New(`no command after "--": give pvctl's arguments (pvvm -- info), or -test PKGS`)
	}
	for i, cmd := range out {
		if len(cmd) > 0 {
			continue
		}
		before := nonEmpty(out[:i])
		where := fmt.Sprintf("between commands %d and %d", before, before+1)
		switch {
		case before == 0:
			where = "before the first command"
		case nonEmpty(out[i:]) == 0:
			where = "after the last command"
		}
		return nil, fmt.Errorf("an empty command %s in %q: each \"+\" goes between two commands (pvvm -- list + info)", where, strings.Join(args, " "))
	}
	return out, nil
}

func testArgs(c *config) []string {
	var args []string
	switch {
	case c.run != "":
		args = append(args, "-test.run", c.run)
	case c.vms > 1:
		args = append(args, "-test.run", "^"+multiVMPrefix)
	default:
		args = append(args, "-test.skip", "^"+multiVMPrefix)
	}
	return args
}

// guestTestPackages returns the package directories (relative to root) named
// by list, or every package with a test file built only under the guest tag.
func guestTestPackages(root, list string) ([]string, error) {
	if list != "all" {
		var pkgs []string
		for _, p := range strings.Split(list, ",") {
			if strings.TrimSpace(p) == "" {
				continue
			}
			p = filepath.Clean(strings.TrimSpace(p))
			if !hasGuestTests(filepath.Join(root, p)) {
				return nil, fmt.Errorf("package %s has no in-guest tests (files with //go:build %s)", p, guest.GuestTag)
			}
			pkgs = append(pkgs, p)
		}
		return pkgs, nil
	}
	seen := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "build" || n == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, "_test.go") && isGuestFile(path) {
			rel, _ := filepath.Rel(root, filepath.Dir(path))
			seen[rel] = true
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var pkgs []string
	for p := range seen {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	if len(pkgs) == 0 {
		return nil, fmt.Errorf("no in-guest tests found under %s", root)
	}
	return pkgs, nil
}

func hasGuestTests(dir string) bool {
	files, _ := filepath.Glob(filepath.Join(dir, "*_test.go"))
	for _, f := range files {
		if isGuestFile(f) {
			return true
		}
	}
	return false
}

// isGuestFile reports whether a Go file's build constraint requires the
// guest tag.
func isGuestFile(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	head := make([]byte, 512)
	n, _ := io.ReadFull(f, head)
	for _, line := range strings.Split(string(head[:n]), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "//go:build ") {
			expr := strings.TrimPrefix(line, "//go:build ")
			return expr == guest.GuestTag || strings.HasPrefix(expr, guest.GuestTag+" &&")
		}
		if strings.HasPrefix(line, "package ") {
			return false
		}
	}
	return false
}

// buildBackend builds the software RDMA backend into dir with the
// project's own make target; its error carries the compiler's output.
func buildBackend(ctx context.Context, root, dir string) error {
	cmd := exec.CommandContext(ctx, "make", "-s", "-C", filepath.Join(root, "qemu", "softverbs"), "OUT="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return fmt.Errorf("building the RDMA backend needs make and gcc: run `make setup`")
		}
		return fmt.Errorf("building the RDMA backend (make softverbs): %w\n%s", err, out)
	}
	return nil
}

// buildDropin builds the drop-in libibverbs.so.1 with the project's own
// make target and returns the directory it is in; its error carries the
// build's output.
func buildDropin(ctx context.Context, root string) (string, error) {
	cmd := exec.CommandContext(ctx, "make", "-s", "-C", root, "dropin")
	out, err := cmd.CombinedOutput()
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return "", fmt.Errorf("building the drop-in libibverbs needs make and gcc: run `make setup`")
		}
		return "", fmt.Errorf("building the drop-in libibverbs (make dropin): %w\n%s", err, out)
	}
	lib := filepath.Join(root, dropinBuilt)
	if _, err := os.Stat(lib); err != nil {
		return "", fmt.Errorf("make dropin made no %s: %w", dropinBuilt, err)
	}
	return filepath.Dir(lib), nil
}

// dropinBuilt is where make dropin puts the drop-in, under the repository.
const dropinBuilt = "build/vfrdma/libibverbs.so.1"

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/vfrdma/vfrdma\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("not inside the vfrdma repository (no go.mod for github.com/vfrdma/vfrdma above %s)", dir)
		}
		dir = parent
	}
}
