// Command guestinit is /init of the test bench's guest: PID 1 in a QEMU VM
// booted from the initramfs that package qemu/guest builds.
//
// It mounts proc, sysfs, devtmpfs and a tmpfs on /tmp, loads the VFIO
// modules, binds the pvrdma function's IOMMU group to vfio-pci when the
// manifest asks, runs the manifest's programs one after the other and
// reports everything as proto records on the console (ttyS0): start, output
// lines, test results, exit, errors, and finally done. Then it powers the VM
// off.
//
// Every wait is bounded: programs by their timeout, the rest by fixed limits,
// so the VM always reaches done and power-off. A panic in the init is
// recovered and reported (a panicking PID 1 would panic the kernel). Plain
// lines starting with "vfrdma-init: " are diagnostics for the console tail.
//
// It must be built static: CGO_ENABLED=0 (see guest.BuildInit).
package main

import (
	"fmt"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vfrdma/vfrdma/qemu/guest"
	"github.com/vfrdma/vfrdma/qemu/proto"
)

func main() {
	var rep *reporter
	defer func() {
		// Last resort for a panic outside safeRun: report, end, power off.
		if v := recover(); v != nil {
			if rep == nil {
				rep = newReporter(os.Stdout)
			}
			rep.errorf("", "init panicked: %v\n%s", v, debug.Stack())
			rep.emit(proto.Record{Event: proto.EventDone, Code: 1, Msg: "init panicked"})
			powerOff(rep)
		}
	}()
	mountErrs := mountAll()
	rep = newReporter(openConsole())
	for _, err := range mountErrs {
		rep.errorf("", "%v", err)
	}
	failed, total := safeRun(rep)
	done := proto.Record{Event: proto.EventDone}
	switch {
	case rep.errors() > 0 && failed == 0:
		done.Code, done.Msg = 1, fmt.Sprintf("%d init errors", rep.errors())
	case failed > 0:
		done.Code, done.Msg = 1, fmt.Sprintf("%d of %d programs failed", failed, total)
	}
	rep.emit(done)
	powerOff(rep)
}

// safeRun runs the manifest and recovers a panic of the init itself. It
// returns how many programs failed (did not run, or exited non-zero) out of
// how many.
func safeRun(rep *reporter) (failed, total int) {
	defer func() {
		if v := recover(); v != nil {
			rep.errorf("", "init panicked: %v\n%s", v, debug.Stack())
			failed = max(failed, 1)
		}
	}()
	return run(rep)
}

func run(rep *reporter) (failed, total int) {
	data, err := os.ReadFile(proto.ManifestPath)
	if err != nil {
		rep.errorf("", "read manifest: %v", err)
		return 0, 0
	}
	m, err := guest.UnmarshalManifest(data)
	if err != nil {
		rep.errorf("", "%v", err)
		return 0, 0
	}
	total = len(m.Steps)
	vm, vms, err := readCmdline("/proc/cmdline")
	if err != nil {
		rep.errorf("", "%v", err)
	}
	vmIndex, _ := strconv.Atoi(vm)
	bdf, setupErr := setup(rep, m, vmIndex)

	env := []string{
		"PATH=" + guest.BinDir, "HOME=/tmp", "TMPDIR=/tmp",
		proto.EnvGuest + "=1",
		proto.EnvVM + "=" + vm,
		proto.EnvVMs + "=" + vms,
	}
	if bdf != "" {
		env = append(env, proto.EnvBDF+"="+bdf)
	}
	for _, s := range m.Steps {
		if len(s.Only) > 0 && !slices.Contains(s.Only, vmIndex) {
			total-- // another VM's step
			continue
		}
		if setupErr != nil {
			rep.emit(proto.Record{Event: proto.EventExit, Prog: s.Name, Code: -1, Msg: "not run: " + setupErr.Error()})
			failed++
			continue
		}
		if !runStep(rep, s, env) {
			failed++
		}
	}
	return failed, total
}

// setup loads the modules and, if the manifest asks, binds the device. It
// returns the pvrdma function's address ("" if there is none and binding
// was not asked for). Its error, already reported, means the programs must
// not run.
func setup(rep *reporter, m *guest.Manifest, vm int) (bdf string, err error) {
	t0 := time.Now()
	if err := loadModules(m.Modules); err != nil {
		rep.errorf("", "%v", err)
		return "", err
	}
	if len(m.Modules) > 0 {
		rep.logf("loaded %d modules in %v", len(m.Modules), time.Since(t0).Round(time.Millisecond))
	}
	if len(m.Net) > 0 {
		t0 = time.Now()
		if err := netUp(m.Net, vm, 10*time.Second); err != nil {
			rep.errorf("", "%v", err)
			return "", err
		}
		rep.logf("brought %d interfaces up in %v", len(m.Net), time.Since(t0).Round(time.Millisecond))
	}
	if !m.BindPVRDMA {
		return findPVRDMA(), nil
	}
	t0 = time.Now()
	bdf, group, err := bindPVRDMA(bindWait)
	if err != nil {
		rep.errorf("", "%v", err)
		return "", err
	}
	rep.logf("bound the IOMMU group %s of %s to vfio-pci in %v", group, bdf, time.Since(t0).Round(time.Millisecond))
	return bdf, nil
}

// readCmdline returns the values of proto.CmdlineVM and proto.CmdlineVMs,
// "0" and "1" when absent.
func readCmdline(path string) (vm, vms string, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "0", "1", fmt.Errorf("read kernel command line: %w", err)
	}
	return parseCmdline(string(b))
}

func parseCmdline(s string) (vm, vms string, err error) {
	vm, vms = "0", "1"
	for _, f := range strings.Fields(s) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case proto.CmdlineVM:
			vm = v
		case proto.CmdlineVMs:
			vms = v
		}
	}
	var n, i int
	if _, e := fmt.Sscanf(vms, "%d", &n); e != nil || n < 1 || fmt.Sprint(n) != vms {
		err = fmt.Errorf("kernel command line: %s=%q is not a positive number", proto.CmdlineVMs, vms)
		vms = "1"
	}
	if _, e := fmt.Sscanf(vm, "%d", &i); e != nil || i < 0 || fmt.Sprint(i) != vm {
		err = fmt.Errorf("kernel command line: %s=%q is not a VM index", proto.CmdlineVM, vm)
		vm = "0"
	}
	return vm, vms, err
}
