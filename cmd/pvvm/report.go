package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/vfrdma/vfrdma/qemu"
	"github.com/vfrdma/vfrdma/qemu/fabric"
	"github.com/vfrdma/vfrdma/qemu/guest"
	"github.com/vfrdma/vfrdma/qemu/proto"
)

// stopGrace is how long the other VMs of a run go on after a command failed
// in one: long enough for a peer that noticed the failure to report it, short
// enough that a peer left waiting for the failed command costs seconds.
const stopGrace = 3 * time.Second

// runPvctl boots the VM(s) running pvctl, prints its output as it comes
// (prefixed by the VM when there are several), a command's stdout on
// c.stdout and its stderr on c.stderr, and returns the first non-zero
// exit status. In a run of several VMs, a command that fails (or
// is killed at its -limit) stops the whole run stopGrace later: its peer in
// another VM would wait for it until the run's -timeout. A failed run ends
// with a post-mortem of every VM: its commands' exits, its backend's
// counters (what the fabric dropped, by reason) and its console's tail. A
// run of more than one command ends with a summary of them (summary).
func runPvctl(ctx context.Context, c *config, opt *qemu.Options) (int, error) {
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	var mu sync.Mutex
	var stopping *time.Timer
	// One VM: its output as it comes. Several: each VM's output as a block
	// once they are done, so the reports do not interleave.
	held := make([][]heldLine, c.vms)
	opt.OnRecord = func(vm int, r proto.Record) {
		mu.Lock()
		defer mu.Unlock()
		prefix := ""
		if c.vms > 1 {
			prefix = fmt.Sprintf("vm%d: ", vm)
		}
		if r.Event == proto.EventExit && r.Code != 0 && c.vms > 1 && stopping == nil {
			cause := fmt.Errorf("vm%d: `%s` failed (%s): the run was stopped %v later", vm, c.commandLine(r.Prog), exitText(r), stopGrace)
			stopping = time.AfterFunc(stopGrace, func() { stop(cause) })
		}
		switch {
		case r.Event == proto.EventOut && isPvctl(r.Prog) && c.vms > 1:
			held[vm] = append(held[vm], heldLine{r.Stream, prefix + r.Line})
		case r.Event == proto.EventOut && isPvctl(r.Prog):
			fmt.Fprintln(c.streamOut(r.Stream), prefix+r.Line)
		case r.Event == proto.EventError:
			fmt.Fprintf(c.stderr, "pvvm: %sguest init: %s\n", prefix, r.Msg)
		case c.verbose && r.Event == proto.EventOut:
			fmt.Fprintf(c.stderr, "%s[%s] %s\n", prefix, r.Prog, r.Line)
		}
	}
	if c.verbose {
		opt.OnConsole = func(vm int, line string) { fmt.Fprintf(c.stderr, "vm%d console: %s\n", vm, line) }
	}
	res, err := qemu.Run(ctx, c.vms, opt)
	mu.Lock()
	if stopping != nil {
		stopping.Stop()
	}
	mu.Unlock()
	for _, lines := range held {
		for _, l := range lines {
			fmt.Fprintln(c.streamOut(l.stream), l.line)
		}
	}
	if err == nil && (c.doorbells || c.timeline) {
		for _, vm := range res.VMs {
			fmt.Fprintf(c.stdout, "vm%d: device-side doorbells (QEMU's pvrdma_uar_write):%s\n", vm.Index, doorbellText(vm.Doorbells))
		}
	}
	if err != nil {
		return 1, err
	}
	if c.timeline {
		if err := printBreakdown(c.stdout, res); err != nil {
			return 1, err
		}
	}
	if c.counters {
		for _, vm := range res.VMs {
			fmt.Fprintf(c.stdout, "vm%d: backend: %s\n", vm.Index, fabric.FormatCounters(vm.Backend))
		}
	}
	code, err := pvctlVerdict(res)
	if err != nil || code != 0 {
		postMortem(c.stderr, c, res, context.Cause(ctx))
	}
	summary(c.stderr, c, res)
	return code, err
}

// heldLine is a line of a command's output kept until its run is over.
type heldLine struct {
	stream string // proto.StreamStdout or proto.StreamStderr
	line   string
}

// streamOut is where pvvm prints a line a command wrote on stream: its
// stderr on pvvm's stderr, the rest on pvvm's stdout.
func (c *config) streamOut(stream string) io.Writer {
	if stream == proto.StreamStderr {
		return c.stderr
	}
	return c.stdout
}

// summary writes, after a run of more than one command (counting each VM
// a command runs in), one line per command and VM, in the order the VMs
// ran them: the VM, the command as given, how it ended (ok, its exit
// status, "did not finish" for one the run stopped, "not run" for one its
// VM never reached) and how long it took.
func summary(w io.Writer, c *config, res *qemu.Result) {
	type row struct{ vm, cmd, end, took string }
	var rows []row
	for _, vm := range res.VMs {
		exits := map[string]proto.Record{}
		for _, e := range vm.Exits() {
			exits[e.Prog] = e
		}
		started := map[string]bool{}
		for _, r := range vm.Records {
			if r.Event == proto.EventStart {
				started[r.Prog] = true
			}
		}
		for _, p := range c.programs {
			if !c.runsIn(p, vm.Index) {
				continue
			}
			r := row{vm: fmt.Sprintf("vm%d", vm.Index), cmd: c.commandLine(p.name)}
			switch e, ok := exits[p.name]; {
			case ok:
				r.end, r.took = exitText(e), fmt.Sprintf("%.1fs", e.Elapsed)
			case started[p.name]:
				r.end = "did not finish"
			default:
				r.end = "not run"
			}
			rows = append(rows, r)
		}
	}
	if len(rows) < 2 {
		return
	}
	fmt.Fprintf(w, "pvvm: %d commands:\n", len(rows))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintf(tw, "pvvm:   %s\t%s\t%s\t%s\n", r.vm, r.took, r.end, r.cmd)
	}
	tw.Flush()
}

// pvctlVerdict is a run's exit status: the first error, else the first
// non-zero exit status of a command.
func pvctlVerdict(res *qemu.Result) (int, error) {
	code := 0
	for _, vm := range res.VMs {
		if vm.Err != nil {
			return 1, vm.Err
		}
		for _, e := range vm.Errors() {
			return 1, fmt.Errorf("vm%d: guest init: %s", vm.Index, e.Msg)
		}
		exits := vm.Exits()
		if len(exits) == 0 {
			return 1, fmt.Errorf("vm%d reported no exit status for its commands; last console lines:\n  %s", vm.Index, strings.Join(vm.Tail, "\n  "))
		}
		for _, e := range exits {
			if e.Code < 0 {
				return 1, fmt.Errorf("vm%d: %s did not finish: %s", vm.Index, e.Prog, e.Msg)
			}
			if e.Code != 0 && code == 0 {
				code = e.Code
			}
		}
	}
	return code, nil
}

// postMortem writes what every VM of a failed run was doing, each line
// starting "pvvm: vmN": why the run stopped, each command's end, the
// backend's counters and the console's last lines.
func postMortem(w io.Writer, c *config, res *qemu.Result, cause error) {
	fmt.Fprintf(w, "pvvm: the run failed; every VM's state follows\n")
	if cause != nil {
		fmt.Fprintf(w, "pvvm: stopped: %v\n", cause)
	}
	for _, vm := range res.VMs {
		p := fmt.Sprintf("pvvm: vm%d", vm.Index)
		if vm.Err != nil {
			first, _, _ := strings.Cut(vm.Err.Error(), "\n")
			fmt.Fprintf(w, "%s: %s\n", p, first)
		}
		ended := map[string]bool{}
		for _, e := range vm.Exits() {
			ended[e.Prog] = true
			fmt.Fprintf(w, "%s: `%s`: %s after %.1fs\n", p, c.commandLine(e.Prog), exitText(e), e.Elapsed)
		}
		for _, r := range vm.Records {
			if r.Event == proto.EventStart && !ended[r.Prog] {
				fmt.Fprintf(w, "%s: `%s`: still running\n", p, c.commandLine(r.Prog))
			}
		}
		if vm.QEMUState != "" {
			fmt.Fprintf(w, "%s: QEMU when stopped: %s\n", p, vm.QEMUState)
		}
		if vm.Backend != nil {
			fmt.Fprintf(w, "%s: backend: %s\n", p, fabric.FormatCounters(vm.Backend))
		} else {
			fmt.Fprintf(w, "%s: backend: no counters (the VM's QEMU never opened the backend)\n", p)
		}
		tail := vm.Tail
		if len(tail) > postMortemLines {
			tail = tail[len(tail)-postMortemLines:]
		}
		for _, l := range tail {
			fmt.Fprintf(w, "%s console: %s\n", p, l)
		}
	}
	// The stacks last: long, and read only when the lines above do not say
	// enough.
	for _, vm := range res.VMs {
		for _, l := range vm.QEMUStacks {
			fmt.Fprintf(w, "pvvm: vm%d QEMU stack: %s\n", vm.Index, l)
		}
	}
}

// postMortemLines bounds each VM's console tail in a post-mortem.
const postMortemLines = 25

// exitText says how a command ended.
func exitText(r proto.Record) string {
	switch {
	case r.Code == 0:
		return "ok"
	case r.Msg != "":
		return fmt.Sprintf("exit %d, %s", r.Code, r.Msg)
	}
	return fmt.Sprintf("exit %d", r.Code)
}

// isPvctl reports a command's step: pvctl's, or a host program's (in a
// reference VM, or over the drop-in in a vfrdma VM).
func isPvctl(prog string) bool {
	return prog == "pvctl" || strings.HasPrefix(prog, "pvctl-") || strings.HasPrefix(prog, "ref") || strings.HasPrefix(prog, "dropin")
}

// runTests runs the in-guest test binaries and prints one line per test,
// the output of what failed, and the summary line.
func runTests(ctx context.Context, c *config, opt *qemu.Options, spec guest.Spec, build time.Duration) (int, error) {
	var mu sync.Mutex
	output := map[string][]string{} // "vmN prog" → its output lines, for failures
	opt.OnRecord = func(vm int, r proto.Record) {
		mu.Lock()
		defer mu.Unlock()
		key := fmt.Sprintf("vm%d %s", vm, r.Prog)
		switch r.Event {
		case proto.EventOut:
			if len(output[key]) < 5000 {
				output[key] = append(output[key], r.Line)
			}
			if c.verbose {
				fmt.Printf("vm%d [%s] %s\n", vm, r.Prog, r.Line)
			}
		case proto.EventTest:
			fmt.Printf("vm%d %-28s %-40s %s (%.2fs)\n", vm, r.Prog, r.Test, strings.ToUpper(r.Status), r.Elapsed)
		case proto.EventError:
			fmt.Printf("vm%d init error: %s\n", vm, r.Msg)
		}
	}
	if c.verbose {
		opt.OnConsole = func(vm int, line string) { fmt.Printf("vm%d console: %s\n", vm, line) }
	}
	fmt.Printf("pvvm: image built in %.1fs; booting %d VM(s) with %d test program(s)\n", build.Seconds(), c.vms, len(spec.Programs))
	res, err := qemu.Run(ctx, c.vms, opt)
	if err != nil {
		return 1, err
	}

	passed, failed, skipped := 0, 0, 0
	var problems []string
	for _, vm := range res.VMs {
		if vm.Err != nil {
			problems = append(problems, fmt.Sprintf("vm%d: %v", vm.Index, vm.Err))
			failed++
		}
		for _, e := range vm.Errors() {
			problems = append(problems, fmt.Sprintf("vm%d: guest init: %s", vm.Index, e.Msg))
			failed++
		}
		failedProgs := map[string]bool{}
		for _, t := range vm.Tests() {
			switch t.Status {
			case proto.StatusPass:
				passed++
			case proto.StatusSkip:
				skipped++
				if !c.allowSkip {
					failed++
					failedProgs[t.Prog] = true
					problems = append(problems, fmt.Sprintf("vm%d: %s %s was skipped: an in-guest test must run on the bench", vm.Index, t.Prog, t.Test))
				}
			default:
				failed++
				failedProgs[t.Prog] = true
			}
		}
		ran := map[string]bool{}
		for _, e := range vm.Exits() {
			ran[e.Prog] = true
			if e.Code != 0 && !failedProgs[e.Prog] {
				failed++
				failedProgs[e.Prog] = true
				problems = append(problems, fmt.Sprintf("vm%d: %s exited with status %d %s", vm.Index, e.Prog, e.Code, e.Msg))
			}
		}
		if vm.Killed {
			// Killed on its own request: what it finished counts, what it
			// never reached is not a failure.
			fmt.Printf("vm%d: killed on request\n", vm.Index)
		}
		if vm.Err == nil && !vm.Killed {
			for _, p := range spec.Programs {
				if !ran[p.Name] {
					failed++
					problems = append(problems, fmt.Sprintf("vm%d: %s never ran", vm.Index, p.Name))
				}
			}
		}
		var progs []string
		for p := range failedProgs {
			progs = append(progs, p)
		}
		sort.Strings(progs)
		for _, p := range progs {
			key := fmt.Sprintf("vm%d %s", vm.Index, p)
			fmt.Printf("--- output of %s:\n", key)
			for _, l := range output[key] {
				fmt.Printf("    %s\n", l)
			}
		}
		fmt.Printf("vm%d: %.1fs\n", vm.Index, vm.Elapsed.Seconds())
	}
	for _, p := range problems {
		fmt.Println(p)
	}
	if passed == 0 && failed == 0 {
		failed++
		fmt.Println("pvvm: no test ran (check -run and the package list)")
	}
	if skipped > 0 {
		fmt.Printf("pvvm: %d skipped\n", skipped)
	}
	fmt.Printf("pvvm: %d passed, %d failed\n", passed, failed)
	if failed > 0 {
		return 1, nil
	}
	return 0, nil
}

func doorbellText(n map[string]int) string {
	if len(n) == 0 {
		return " none"
	}
	keys := make([]string, 0, len(n))
	for k := range n {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		name, _, _ := strings.Cut(k, " - ") // "CQ ARMSOL - not supported"
		fmt.Fprintf(&b, " %s=%d", strings.ReplaceAll(name, " ", "_"), n[k])
	}
	return b.String()
}
