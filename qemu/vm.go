package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vfrdma/vfrdma/qemu/ethhub"
	"github.com/vfrdma/vfrdma/qemu/fabric"
	"github.com/vfrdma/vfrdma/qemu/mux"
	"github.com/vfrdma/vfrdma/qemu/proto"
)

// BackendDevice is the software backend's device name (QEMU's ibdev=).
const BackendDevice = "softverbs0"

// Sentinel errors of a run; each is wrapped with the detail that makes it
// actionable.
var (
	ErrNotRoot         = errors.New("bench: must run as root")
	ErrNoQEMU          = errors.New("bench: QEMU not found")
	ErrNoKernel        = errors.New("bench: guest kernel not found")
	ErrNoBackend       = errors.New("bench: RDMA backend not built")
	ErrQEMURefused     = errors.New("bench: QEMU refused to start")
	ErrQEMUExited      = errors.New("bench: QEMU exited before the guest finished")
	ErrTimeout         = errors.New("bench: guest timed out")
	ErrStopped         = errors.New("bench: run stopped")
	ErrConsoleFlood    = errors.New("bench: output flood")
	ErrGuestIncomplete = errors.New("bench: guest did not finish")
)

// Options configure a run. The zero value of each field means its default.
type Options struct {
	QEMU       string // QEMU binary (default qemu-system-x86_64 on PATH)
	BackendDir string // directory holding the backend's libibverbs.so.1 (required)
	Kernel     string // guest vmlinuz (required)
	Initrd     string // guest initramfs (required)
	// Initrds, if set, gives each VM its own initramfs (one per VM, in
	// order; Initrd is then the first): a run can mix vfrdma guests and
	// reference-stack guests.
	Initrds   []string
	WorkDir   string        // sockets and fabric; default a temporary directory removed after the run
	Memory    int           // guest RAM in MiB (default 512)
	Timeout   time.Duration // whole run (default 3 minutes)
	TailLines int           // console and QEMU-error lines kept per VM (default 60)
	OutputCap int64         // console+stderr bytes per VM before the run is stopped as a flood (default 64 MiB)
	Append    string        // extra kernel command line
	KeepAlive bool          // do not kill QEMU on the done record (wait for its own exit)
	// TraceDoorbells counts, on the device side, the UAR doorbells each
	// VM's pvrdma received (QEMU's pvrdma_uar_write trace event, logged to
	// a file of the run): VMResult.Doorbells. The vCPU thread writes
	// each event to the file as it happens, which slows the guest: a run
	// that measures a rate or a latency leaves it off (docs/benchmarks.md,
	// "The bench's speed").
	TraceDoorbells bool
	// Timeline records, on the device side and stamped with the host's
	// clock, each doorbell and each CQE the device wrote (QEMU's
	// pvrdma_uar_write and pvrdma_post_cqe trace events, and the thread
	// that ran each): VMResult.Timeline. The VMs of a run share the host's
	// clock, so one VM's send can be followed into the other's CQ.
	// It implies TraceDoorbells.
	Timeline bool
	// Env is added to every QEMU process's environment (and so reaches the
	// software backend: SOFTVERBS_DROP_UD=N, its test hook, for one).
	Env []string

	// OnRecord, if set, receives every record as it arrives, from the VM's
	// reader goroutine (calls for one VM are in order; different VMs race).
	OnRecord func(vm int, r proto.Record)
	// OnConsole, if set, receives every raw console line that is not a record.
	OnConsole func(vm int, line string)
	// Log receives the bench's debug messages (default: discarded).
	Log *slog.Logger
}

// VMResult is what one VM reported.
type VMResult struct {
	Index   int
	Records []proto.Record // every record but EventOut (those go to OnRecord only)
	Done    bool           // the init reported EventDone
	Tail    []string       // last console lines (kernel and non-record output)
	Stderr  []string       // last lines QEMU wrote to stderr
	Elapsed time.Duration
	Err     error
	// Killed is set when the guest asked the host to kill it
	// (proto.OpKill) and was: an expected end, not an error.
	Killed bool
	// Doorbells counts the UAR doorbells the VM's device received, by
	// class and operation ("QP SEND", "QP RECV", "CQ ARM", "CQ POLL", ...),
	// with Options.TraceDoorbells.
	Doorbells map[string]int
	// Timeline is the device's doorbells and CQEs in order, with
	// Options.Timeline; TimelineErr says why it could not be read.
	Timeline    []DeviceEvent
	TimelineErr error
	// Backend holds the VM's software-backend counters at the end of the
	// run: its traffic and every message the fabric dropped, by reason.
	Backend []fabric.Counter
	// QEMUState, for a VM stopped before it was done, says what its QEMU
	// process was doing then (scheduler state, CPU time, threads): a guest
	// that made no progress for lack of CPU is told from a stuck QEMU.
	QEMUState string
	// QEMUStacks, for a VM stopped before it was done, are its QEMU
	// threads' stacks (gdb's backtraces; empty when gdb is not installed).
	QEMUStacks []string
}

// Tests returns the EventTest records.
func (v *VMResult) Tests() []proto.Record { return v.filter(proto.EventTest) }

// Exits returns the EventExit records.
func (v *VMResult) Exits() []proto.Record { return v.filter(proto.EventExit) }

// Errors returns the EventError records.
func (v *VMResult) Errors() []proto.Record { return v.filter(proto.EventError) }

func (v *VMResult) filter(ev string) []proto.Record {
	var out []proto.Record
	for _, r := range v.Records {
		if r.Event == ev {
			out = append(out, r)
		}
	}
	return out
}

// Result is a whole run.
type Result struct {
	VMs     []*VMResult
	Elapsed time.Duration
}

// Err returns the first VM error, if any.
func (r *Result) Err() error {
	var errs []error
	for _, v := range r.VMs {
		if v.Err != nil {
			errs = append(errs, fmt.Errorf("vm%d: %w", v.Index, v.Err))
		}
	}
	return errors.Join(errs...)
}

// Check reports the first missing prerequisite as one actionable error.
func Check(opt *Options) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w (the bench and its guest drive VFIO and QEMU as root): run `sudo make test`", ErrNotRoot)
	}
	if _, err := exec.LookPath(opt.qemu()); err != nil {
		return fmt.Errorf("%w: %s is not installed: run `make setup`", ErrNoQEMU, opt.qemu())
	}
	if opt.Kernel == "" {
		return fmt.Errorf("%w: no kernel given: run `make setup`", ErrNoKernel)
	}
	if _, err := os.Stat(opt.Kernel); err != nil {
		return fmt.Errorf("%w: %s: run `make setup`", ErrNoKernel, opt.Kernel)
	}
	lib := filepath.Join(opt.BackendDir, "libibverbs.so.1")
	if opt.BackendDir == "" {
		lib = "libibverbs.so.1 (no backend directory given)"
	}
	if _, err := os.Stat(lib); err != nil {
		return fmt.Errorf("%w: %s is missing: run `make softverbs`", ErrNoBackend, lib)
	}
	if _, err := os.Stat(opt.Initrd); err != nil {
		return fmt.Errorf("bench: initramfs %q: %w", opt.Initrd, err)
	}
	return nil
}

func (o *Options) qemu() string {
	if o.QEMU != "" {
		return o.QEMU
	}
	return "qemu-system-x86_64"
}

func (o *Options) withDefaults() Options {
	c := *o
	if c.Memory == 0 {
		c.Memory = 512
	}
	if c.Timeout == 0 {
		c.Timeout = 3 * time.Minute
	}
	if c.TailLines == 0 {
		c.TailLines = 60
	}
	if c.OutputCap == 0 {
		c.OutputCap = 64 << 20
	}
	if c.Log == nil {
		c.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

// failGrace is how long the other VMs of a run go on after one failed.
const failGrace = 3 * time.Second

// Run boots n VMs on one shared fabric, waits until each reports done (or
// fails), and returns what they reported. A VM that fails stops the others
// failGrace later (their error wraps ErrStopped and names it). The returned error is about the
// bench itself (prerequisites, set-up); per-VM failures are in the result
// (Result.Err joins them).
func Run(ctx context.Context, n int, opt *Options) (*Result, error) {
	if n < 1 || n > 8 {
		return nil, fmt.Errorf("bench: %d VMs: want 1 to 8", n)
	}
	if err := Check(opt); err != nil {
		return nil, err
	}
	o := opt.withDefaults()
	work := o.WorkDir
	if work == "" {
		// Unix socket paths are limited to 108 bytes: keep the directory short.
		d, err := os.MkdirTemp("", "pvvm-")
		if err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		defer os.RemoveAll(d)
		work = d
	}
	fab := fabric.Dir(filepath.Join(work, "fabric"))
	if err := os.MkdirAll(string(fab), 0o755); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}

	// The VMs' vmxnet3 functions share one Ethernet link: the bench's
	// switch when there are several; QEMU's user-mode network (its gateway
	// 10.0.2.2 answers ARP and ping, nothing leaves the machine) for one.
	// With several VMs there is also a management network, a virtio-net
	// NIC in every VM on a switch of its own, for what guests exchange over
	// TCP (rdma-core's programs exchange QP addresses that way).
	if len(o.Initrds) != 0 && len(o.Initrds) != n {
		return nil, fmt.Errorf("bench: %d initramfs images for %d VMs", len(o.Initrds), n)
	}
	ethSock, mgmtSock := "", ""
	if n > 1 {
		for _, sw := range []struct {
			name string
			path *string
		}{{"eth.sock", &ethSock}, {"mgmt.sock", &mgmtSock}} {
			hub, err := ethhub.Listen(filepath.Join(work, sw.name))
			if err != nil {
				return nil, fmt.Errorf("bench: %w", err)
			}
			defer hub.Close()
			*sw.path = hub.Path()
		}
	}

	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	// A VM that fails (its QEMU exits before the guest is done, a flood,
	// a kernel panic at boot) stops the others soon after: they may be
	// waiting for it, and would wait until the run's limit.
	ctx, stopOthers := context.WithCancelCause(ctx)
	defer stopOthers(nil)
	start := time.Now()
	kv := newRendezvous()
	res := &Result{VMs: make([]*VMResult, n)}
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		v := &VMResult{Index: i}
		res.VMs[i] = v
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			v.Err = runVM(ctx, &o, i, n, work, ethSock, mgmtSock, fab, kv, v)
			v.Elapsed = time.Since(t0)
			if v.Err != nil && n > 1 && ctx.Err() == nil {
				first, _, _ := strings.Cut(v.Err.Error(), "\n")
				cause := fmt.Errorf("vm%d failed (%s)", i, first)
				time.AfterFunc(failGrace, func() { stopOthers(cause) })
			}
		}()
	}
	wg.Wait()
	kv.close()
	res.Elapsed = time.Since(start)
	return res, nil
}

func runVM(ctx context.Context, o *Options, idx, n int, work, ethSock, mgmtSock string, fab fabric.Dir, kv *rendezvous, v *VMResult) error {
	node := "vm" + strconv.Itoa(idx)
	defer fab.RemoveNode(node)

	mx, err := mux.Listen(filepath.Join(work, node+".mux"), fab, node, o.Log)
	if err != nil {
		return err
	}
	defer mx.Close()

	// The guest may ask to be killed (proto.OpKill) from the control
	// channel's goroutine, once QEMU runs.
	var killedOnRequest atomic.Bool
	var started sync.Mutex
	var pid int
	onKill := func() {
		killedOnRequest.Store(true)
		started.Lock()
		defer started.Unlock()
		if pid > 0 {
			syscall.Kill(-pid, syscall.SIGKILL)
		}
	}
	ctl, err := listenControl(filepath.Join(work, node+".ctl"), kv, o.Log, onKill)
	if err != nil {
		return err
	}
	defer ctl.close()
	qmpPath := filepath.Join(work, node+".qmp")
	ctl.onSetLink = func(up bool) error { return qmpSetLink(qmpPath, "n0", up) }

	args := qemuArgs(o, idx, n, mx.Path(), ctl.path, ethSock)
	tracePath := ""
	if o.TraceDoorbells || o.Timeline {
		tracePath = filepath.Join(work, node+".trace")
		args = append(args, "-trace", "pvrdma_uar_write", "-D", tracePath)
		if o.Timeline {
			args = append(args, "-trace", "pvrdma_post_cqe", "-msg", "timestamp=on")
		}
		defer func() {
			v.Doorbells = countDoorbells(tracePath)
			if o.Timeline {
				v.Timeline, v.TimelineErr = readTimeline(tracePath)
			}
		}()
	}
	if mgmtSock != "" {
		args = append(args,
			"-netdev", "stream,id=m0,server=off,addr.type=unix,addr.path="+mgmtSock,
			"-device", "virtio-net-pci,netdev=m0,addr=11.0,romfile=,mac="+proto.NetMAC(proto.NetMgmt, idx))
	}
	args = append(args, "-qmp", "unix:"+qmpPath+",server=on,wait=off")
	cmd := exec.Command(o.qemu(), args...)
	cmd.Env = append(os.Environ(),
		"LD_LIBRARY_PATH="+o.BackendDir,
		"SOFTVERBS_FABRIC="+string(fab),
		"SOFTVERBS_NODE="+node,
		// QEMU polls the backend's CQ in its vCPU thread, under its big
		// lock, on every POLL doorbell: the backend's socket work stays in
		// the backend's own thread there (measured: 2-VM bench, 64 B,
		// batch 32, medians of 4, 125 000 msg/s with it, 151 000 without).
		"SOFTVERBS_POLL_PROGRESS=0",
	)
	cmd.Env = append(cmd.Env, o.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	o.Log.Debug("starting QEMU", "vm", idx, "args", args)
	started.Lock()
	err = cmd.Start()
	if err == nil {
		pid = cmd.Process.Pid
	}
	started.Unlock()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrQEMURefused, err)
	}
	kill := func() {
		if cmd.Process != nil {
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	}

	var budget outputBudget
	budget.limit = o.OutputCap
	flood := make(chan struct{})
	var floodOnce sync.Once
	onFlood := func() { floodOnce.Do(func() { close(flood); kill() }) }

	done := make(chan struct{})
	var doneOnce sync.Once
	errTail := newTail(o.TailLines)
	conTail := newTail(o.TailLines)
	var readers sync.WaitGroup
	readers.Add(2)
	go func() {
		defer readers.Done()
		scanLines(stderr, &budget, onFlood, func(line string) { errTail.add(line) })
	}()
	go func() {
		defer readers.Done()
		scanLines(stdout, &budget, onFlood, func(line string) {
			r, ok, perr := proto.Parse([]byte(line))
			if !ok || perr != nil {
				conTail.add(line)
				if o.OnConsole != nil {
					o.OnConsole(idx, line)
				}
				return
			}
			if o.OnRecord != nil {
				o.OnRecord(idx, r)
			}
			if r.Event != proto.EventOut {
				v.Records = append(v.Records, r)
			} else {
				conTail.add("[" + r.Prog + "] " + r.Line)
			}
			if r.Event == proto.EventDone {
				v.Done = true
				doneOnce.Do(func() { close(done) })
			}
		})
	}()

	exited := make(chan error, 1)
	go func() {
		readers.Wait() // the pipes must be drained before Wait closes them
		exited <- cmd.Wait()
	}()

	var runErr error
	select {
	case <-done:
		if !o.KeepAlive {
			kill()
		}
		<-exited
	case werr := <-exited:
		runErr = werr
	case <-flood:
		<-exited
	case <-ctx.Done():
		v.QEMUState = processState(cmd.Process.Pid)
		v.QEMUStacks = threadStacks(cmd.Process.Pid)
		kill()
		<-exited
	}
	v.Tail = conTail.lines()
	v.Stderr = errTail.lines()
	if cs, err := fab.Counters(node); err == nil {
		v.Backend = cs
	}

	select {
	case <-flood:
		return fmt.Errorf("%w: more than %d bytes of console and QEMU output (a bad WQE makes QEMU log without end); last QEMU lines:\n%s",
			ErrConsoleFlood, o.OutputCap, indent(v.Stderr))
	default:
	}
	if v.Done {
		return nil
	}
	if killedOnRequest.Load() {
		v.Killed = true
		return nil
	}
	if ctx.Err() != nil {
		if cause := context.Cause(ctx); !errors.Is(cause, context.DeadlineExceeded) {
			return fmt.Errorf("%w: %v; last console lines:\n%s", ErrStopped, cause, indent(v.Tail))
		}
		return fmt.Errorf("%w after %v; last console lines:\n%s", ErrTimeout, o.Timeout, indent(v.Tail))
	}
	if refusal := qemuRefusal(v.Stderr, mx.Path()); refusal != "" {
		return fmt.Errorf("%w: %s", ErrQEMURefused, refusal)
	}
	return fmt.Errorf("%w (%v); last QEMU lines:\n%s\nlast console lines:\n%s", ErrQEMUExited, runErr, indent(v.Stderr), indent(v.Tail))
}

func qemuArgs(o *Options, idx, n int, muxPath, ctlPath, ethSock string) []string {
	mem := strconv.Itoa(o.Memory) + "M"
	mac := proto.NetMAC(proto.NetEth, idx)
	// no_timer_check: at boot the kernel checks that the timer interrupt
	// reaches it through the IO-APIC within a few loops; under TCG on a busy
	// host it may not, and with interrupt remapping (intremap=on, needed
	// for VFIO) the kernel then panics ("timer doesn't work through
	// Interrupt-remapped IO-APIC"): seen in a loop of the VM tiers, where
	// the dead VM's peer then waited for it until the run's limit.
	cmdline := fmt.Sprintf("console=ttyS0 intel_iommu=on no_timer_check panic=-1 loglevel=4 %s=%d %s=%d",
		proto.CmdlineVM, idx, proto.CmdlineVMs, n)
	if o.Append != "" {
		cmdline += " " + o.Append
	}
	initrd := o.Initrd
	if len(o.Initrds) > idx {
		initrd = o.Initrds[idx]
	}
	netdev := "user,id=n0,restrict=on"
	if ethSock != "" {
		netdev = "stream,id=n0,server=off,addr.type=unix,addr.path=" + ethSock
	}
	return []string{
		"-accel", "tcg", "-cpu", "max", "-smp", "1",
		"-nodefaults", "-display", "none", "-no-reboot", "-no-user-config",
		// Thread names ("CPU 0/TCG", ...) for a post-mortem's thread list.
		"-name", fmt.Sprintf("vm%d,debug-threads=on", idx),
		"-machine", "q35,memory-backend=mem",
		"-object", "memory-backend-ram,id=mem,size=" + mem + ",share=on", "-m", mem,
		"-device", "intel-iommu,intremap=on",
		"-netdev", netdev,
		"-device", "vmxnet3,addr=10.0,multifunction=on,netdev=n0,romfile=,mac=" + mac,
		"-chardev", "socket,id=mad,path=" + muxPath,
		"-device", "pvrdma,addr=10.1,ibdev=" + BackendDevice + ",netdev=eth0,mad-chardev=mad",
		"-chardev", "socket,id=ctl,path=" + ctlPath,
		"-serial", "stdio", "-serial", "chardev:ctl",
		"-kernel", o.Kernel, "-initrd", initrd, "-append", cmdline,
	}
}

// countDoorbells reads a pvrdma_uar_write trace log: one line per
// doorbell, "... (cls=QP, op=SEND, obj=17, val=0)".
func countDoorbells(path string) map[string]int {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	n := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		_, rest, ok := strings.Cut(line, "(cls=")
		if !ok {
			continue
		}
		cls, rest, _ := strings.Cut(rest, ", op=")
		op, _, _ := strings.Cut(rest, ", obj=")
		n[cls+" "+op]++
	}
	return n
}

// qmpSetLink sets a netdev's link through QEMU's QMP socket at path: the
// greeting, capabilities negotiation, then set_link; events in between are
// skipped.
func qmpSetLink(path, netdev string, up bool) error {
	c, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		return fmt.Errorf("bench: QMP: %w", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	dec := json.NewDecoder(c)
	var greeting map[string]any
	if err := dec.Decode(&greeting); err != nil {
		return fmt.Errorf("bench: QMP greeting: %w", err)
	}
	for _, cmd := range []map[string]any{
		{"execute": "qmp_capabilities"},
		{"execute": "set_link", "arguments": map[string]any{"name": netdev, "up": up}},
	} {
		if err := json.NewEncoder(c).Encode(cmd); err != nil {
			return fmt.Errorf("bench: QMP %v: %w", cmd["execute"], err)
		}
		for {
			var rep struct {
				Return any `json:"return"`
				Error  *struct {
					Desc string `json:"desc"`
				} `json:"error"`
				Event string `json:"event"`
			}
			if err := dec.Decode(&rep); err != nil {
				return fmt.Errorf("bench: QMP %v: %w", cmd["execute"], err)
			}
			if rep.Event != "" {
				continue
			}
			if rep.Error != nil {
				return fmt.Errorf("bench: QMP %v: %s", cmd["execute"], rep.Error.Desc)
			}
			break
		}
	}
	return nil
}

// qemuRefusal turns QEMU's start-up errors into one line, or "".
func qemuRefusal(stderr []string, muxPath string) string {
	all := strings.Join(stderr, "\n")
	for _, k := range []struct{ match, say string }{
		{"Failed to connect", "it could not connect to the MAD mux socket " + muxPath + " (the bench's mux is gone)"},
		{"Failed to get IB devices list", "no RDMA device: the software backend was not loaded (LD_LIBRARY_PATH must name build/softverbs; run `make softverbs`)"},
		{"No IB devices were found", "the software backend lists no device"},
		{"Failed to find IB device", "the backend has no device named " + BackendDevice},
		{"symbol lookup error", "the software backend lacks a symbol QEMU imports: " + lastMatch(stderr, "symbol lookup error")},
		{"undefined symbol", "the software backend lacks a symbol QEMU imports: " + lastMatch(stderr, "undefined symbol")},
		{"Only shared memory backed ram is supported", "guest RAM is not a shared memory backend (share=on)"},
		{"must be vmxnet3", "function 0 of the pvrdma slot is not a vmxnet3 NIC"},
		{"is not a valid device model name", "this QEMU has no pvrdma device (Debian's qemu-system-x86 7.2 has it): run `make setup`"},
		{"could not open kernel file", "it could not open the guest kernel: run `make setup`: " + lastMatch(stderr, "could not open kernel file")},
		{"Could not open", lastMatch(stderr, "Could not open")},
	} {
		if strings.Contains(all, k.match) {
			return k.say
		}
	}
	return ""
}

func lastMatch(lines []string, s string) string {
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], s) {
			return strings.TrimSpace(lines[i])
		}
	}
	return ""
}

func indent(lines []string) string {
	if len(lines) == 0 {
		return "  (none)"
	}
	return "  " + strings.Join(lines, "\n  ")
}

// outputBudget counts bytes across a VM's output streams.
type outputBudget struct {
	mu    sync.Mutex
	used  int64
	limit int64
}

func (b *outputBudget) spend(n int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used += int64(n)
	return b.used <= b.limit
}

// scanLines reads r line by line (long lines cut at 64 KiB), charging the
// budget; past it, it calls onFlood and then only drains r.
func scanLines(r io.Reader, b *outputBudget, onFlood func(), line func(string)) {
	br := bufio.NewReaderSize(r, 64<<10)
	over := false
	for {
		s, err := br.ReadSlice('\n')
		if len(s) > 0 {
			if !over && !b.spend(len(s)) {
				over = true
				onFlood()
			}
			if !over {
				line(strings.TrimRight(string(s), "\r\n"))
			}
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}

// tail keeps the last n lines.
type tail struct {
	mu  sync.Mutex
	buf []string
	n   int
}

func newTail(n int) *tail { return &tail{n: n} }

func (t *tail) add(s string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(s) > 512 {
		s = s[:512] + "…"
	}
	t.buf = append(t.buf, s)
	if len(t.buf) > 2*t.n {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.n:]...)
	}
}

func (t *tail) lines() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.buf) > t.n {
		return append([]string(nil), t.buf[len(t.buf)-t.n:]...)
	}
	return append([]string(nil), t.buf...)
}

// processState describes a running process from /proc: its scheduler
// state, the CPU time it has used, and each thread by name with its state,
// kernel wait channel and CPU time (QEMU names its threads: "CPU 0/TCG",
// "rdma_comp_...", the backend's "softverbs"): a vCPU thread asleep on a
// futex is a deadlock, one running is a starved or busy guest.
func processState(pid int) string {
	st, err := procStat(fmt.Sprintf("/proc/%d", pid))
	if err != nil {
		return "unknown: " + err.Error()
	}
	var threads []string
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	for _, t := range tasks {
		ts, err := procStat(t)
		if err != nil {
			continue
		}
		comm, _ := os.ReadFile(filepath.Join(t, "comm"))
		wchan, _ := os.ReadFile(filepath.Join(t, "wchan"))
		w := strings.TrimSpace(string(wchan))
		if w == "" || w == "0" {
			w = "-"
		}
		threads = append(threads, fmt.Sprintf("%s %s/%s/%.1fs", strings.TrimSpace(string(comm)), ts.state, w, ts.cpu))
	}
	sort.Strings(threads)
	return fmt.Sprintf("state %s, %.1f s CPU; threads (state/wait/CPU): %s", st.state, st.cpu, strings.Join(threads, ", "))
}

type procState struct {
	state string
	cpu   float64 // seconds, user and system
}

// procStat reads a process's or a thread's stat file (dir is /proc/PID or
// /proc/PID/task/TID).
func procStat(dir string) (procState, error) {
	b, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return procState{}, err
	}
	// The fields after the command name, which is in parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return procState{}, errors.New("bad stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return procState{}, errors.New("short stat")
	}
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	const hz = 100 // USER_HZ on Linux
	return procState{state: f[0], cpu: (utime + stime) / hz}, nil
}

// threadStacks returns the backtraces of a process's threads, taken with
// gdb if it is installed (nil otherwise); it takes a few seconds.
func threadStacks(pid int) []string {
	gdb, err := exec.LookPath("gdb")
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, gdb, "-q", "-batch", "-p", strconv.Itoa(pid),
		"-ex", "set pagination off", "-ex", "thread apply all bt 15").CombinedOutput()
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "Thread ") || strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	return lines
}
