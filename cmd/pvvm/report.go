package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
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
// (prefixed by the VM when there are several) and returns the first
// non-zero exit status. In a run of several VMs, a command that fails (or
// is killed at its -limit) stops the whole run stopGrace later: its peer in
// another VM would wait for it until the run's -timeout. A failed run ends
// with a post-mortem of every VM: its commands' exits, its backend's
// counters (what the fabric dropped, by reason) and its console's tail.
func runPvctl(ctx context.Context, c *config, opt *qemu.Options) (int, error) {
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	var mu sync.Mutex
	var stopping *time.Timer
	// One VM: its output as it comes. Several: each VM's output as a block
	// once they are done, so the reports do not interleave.
	held := make([][]string, c.vms)
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
			held[vm] = append(held[vm], prefix+r.Line)
		case r.Event == proto.EventOut && isPvctl(r.Prog):
			fmt.Println(prefix + r.Line)
		case r.Event == proto.EventError:
			fmt.Fprintf(os.Stderr, "pvvm: %sguest init: %s\n", prefix, r.Msg)
		case c.verbose && r.Event == proto.EventOut:
			fmt.Fprintf(os.Stderr, "%s[%s] %s\n", prefix, r.Prog, r.Line)
		}
	}
	if c.verbose {
		opt.OnConsole = func(vm int, line string) { fmt.Fprintf(os.Stderr, "vm%d console: %s\n", vm, line) }
	}
	res, err := qemu.Run(ctx, c.vms, opt)
	mu.Lock()
	if stopping != nil {
		stopping.Stop()
	}
	mu.Unlock()
	for _, lines := range held {
		for _, l := range lines {
			fmt.Println(l)
		}
	}
	if err == nil && (c.doorbells || c.timeline) {
		for _, vm := range res.VMs {
			fmt.Printf("vm%d: device-side doorbells (QEMU's pvrdma_uar_write):%s\n", vm.Index, doorbellText(vm.Doorbells))
		}
	}
	if err != nil {
		return 1, err
	}
	if c.timeline {
		if err := printBreakdown(os.Stdout, res); err != nil {
			return 1, err
		}
	}
	if c.counters {
		for _, vm := range res.VMs {
			fmt.Printf("vm%d: backend: %s\n", vm.Index, fabric.FormatCounters(vm.Backend))
		}
	}
	code, err := pvctlVerdict(res)
	if err != nil || code != 0 {
		postMortem(os.Stderr, c, res, context.Cause(ctx))
	}
	return code, err
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

// isPvctl reports a command's step: pvctl's, or a reference program's.
func isPvctl(prog string) bool {
	return prog == "pvctl" || strings.HasPrefix(prog, "pvctl-") || strings.HasPrefix(prog, "ref")
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
