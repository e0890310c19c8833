// Command pvctl is the bring-up tool for the pvrdma NIC on the machine that
// has it (run it as root; inside the bench's VM, `go run ./cmd/pvvm -- ARGS`
// runs it there), or on the device model (--model) anywhere.
//
//	pvctl [--json] [--model SPEC [--fabric DIR]] [--sysfs DIR] [--vfio PATH] COMMAND [FLAGS] [ARGS]
//	pvctl help [COMMAND]             every command and its flags (or one command's); also -h, --help
//
//	pvctl list                       pvrdma and vmxnet3 functions, group, driver
//	pvctl bind [--dry-run] [--force] [BDF]
//	                                 bind the function's IOMMU group to vfio-pci
//	pvctl unbind [BDF]               give the group back to its earlier drivers
//	pvctl info [BDF]                 capabilities and port, like ibv_devinfo -v
//	pvctl regs [BDF]                 dump the BAR1 registers
//	pvctl pingpong [FLAGS] [BDF]     RC/UD ping-pong with every byte checked (--srq N: N QPs on one SRQ;
//	                                 --write: RDMA WRITE WITH IMMEDIATE, --read: RDMA READ)
//	pvctl bench [FLAGS] [BDF]        message rate, latency, doorbells per message (SEND; --write, --read,
//	                                 --atomic: one-sided, the target posting nothing)
//	pvctl am [FLAGS] [BDF]           active messages: latency, rate beside raw PostSend, bandwidth
//	pvctl eth [SUB] [FLAGS] [BDF]    vmxnet3 Ethernet: info, ping IP, serve, gen, sink
//
// `pvctl help` prints every command with its flags, from the flag sets the
// commands parse (one source: this comment and the README's pvctl section
// are checked against them by a test).
//
// The global flags come before the command: --json prints one JSON
// document instead of text (it may also follow the command); --model SPEC
// runs on the device model; --fabric DIR puts that model on a fabric
// other processes' models share (two pvctl processes then run both ends of
// pingpong, bench or am over --listen/--connect); --sysfs DIR finds PCI
// functions under DIR instead of /sys (tests point it at a fake tree);
// --vfio PATH takes the device through VFIO's device cdev and iommufd
// (cdev), its IOMMU group (group), or the cdev where the kernel offers it
// and the group otherwise (auto, the default).
//
// Exit status: 0 when the command did its work (help included; list also
// when it finds no function, its --json then printing []); 1 when it
// failed; 2 for a usage error (an unknown command or flag, a flag value out
// of range or two flags that exclude each other), told in one line on
// stderr before any device is opened.
//
// pingpong and bench poll their CQs without sleeping, as rdma-core's tools
// do; --events (-e) sleeps on the CQ's interrupt when polls find nothing.
// A client (--connect) whose server is not up yet retries for --wait-peer
// (5m by default), saying on stderr what it waits for after 2 s and every
// 10 s after that; a server (--listen) waits as long for its client.
//
// BDF defaults to the only pvrdma function present.
//
// JSON keys are snake_case. info's are ibv_devinfo -v's names (fw_ver,
// vendor_part_id, active_mtu, ...); GUIDs are strings in ibv_devinfo's
// form "xxxx:xxxx:xxxx:xxxx"; 64-bit values are "0x..." strings;
// enumerations are the names ibv_devinfo prints ("PORT_ACTIVE", "1024",
// "Ethernet"), "unknown (N)" for a code it has no name for.
//
// bind refuses to take a network interface from the kernel while it is up
// or has an address, unless --force; --dry-run prints what it would
// unbind and bind, and changes nothing.
//
// --model v17..v20|vmware|qemu[,rocev2] runs info, regs, pingpong, bench
// and am on the device model (package pvsim) at that interface version
// (vmware: 20; qemu: QEMU 7.2's device) instead of a device: no root,
// VFIO, QEMU or VM; the two ends of a ping-pong or bench are two QPs of
// the model in this process (no BDF, --listen, --connect or --vm). list,
// bind, unbind and eth, which need a machine's PCI functions or the slot's
// vmxnet3, refuse it. For example:
//
//	pvctl --model v20 pingpong --write
//	pvctl --model v20 bench --atomic --batches 1,32
//
// The one-sided modes (RC only) name the other end's buffer by the address
// and rkey the ends exchange; between two hosts the client initiates and
// the server, the target, checks its memory. On QEMU 7.2's device, which
// runs no one-sided operation, they fail at once (ErrNotSupported).
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/vfrdma/vfrdma/pci"
	"github.com/vfrdma/vfrdma/pvsim"
	"github.com/vfrdma/vfrdma/vfio"
)

type env struct {
	json  bool
	sysfs string
	model string // --model: the device model's spec, "" for a real device
	// fabricDir is --fabric: the directory of a model fabric that spans
	// processes (pvsim.JoinFabric), "" for none.
	fabricDir string
	// vfioFlag is --vfio as given ("auto" by default), vfio what run
	// parsed of it: the path every command that opens the device through
	// VFIO takes.
	vfioFlag string
	vfio     vfio.Path
	// getenv reads the environment a launcher set (am --launcher); nil:
	// os.Getenv. Tests set it.
	getenv func(string) string
	// fabric, if set (tests), connects the model to the models of the
	// other envs that share it: two ends can then be two envs of one
	// process, over --listen/--connect.
	fabric *pvsim.Fabric
	out    io.Writer // stdout: the command's report, help
	errOut io.Writer // stderr: errors and notes while waiting (nil: none)
	bus    *pci.Bus
	runDir string // where bind keeps what unbind restores
	// ifAddrs returns a network interface's addresses, for bind's check
	// that the interfaces it takes from the kernel are idle. run sets it
	// to the kernel's (net.InterfaceByName) only when --sysfs is the real
	// /sys; nil reads none.
	ifAddrs func(name string) ([]string, error)
	// reached counts the times a command reached for a device: a PCI
	// function looked up, or a model made. Flag errors come before it
	// (the tests check it stays 0).
	reached int
	// models are the device models the command made (--model), whose
	// figures run reports on stderr when the command ends.
	models []*pvsim.Device
}

type command struct {
	name    string
	usage   string // what follows "pvctl NAME" in its usage line
	summary string // one line, for the list of commands
	about   string // more, for pvctl help NAME ("" for none)
	// flags declares the command's own flags on fs (besides --json, which
	// every command takes). The command declares its flags with the same
	// function, so help shows what the command parses.
	flags func(e *env, fs *flag.FlagSet)
	run   func(e *env, args []string) error
}

func commands() []command {
	return []command{
		{name: "list", usage: "[--json]", run: cmdList,
			summary: "pvrdma and vmxnet3 functions with their IOMMU group and driver",
			about:   "Exits 0 when it could read the bus, also when it finds no function (--json then prints [])."},
		{name: "bind", usage: "[FLAGS] [BDF]", run: cmdBind, flags: func(e *env, fs *flag.FlagSet) { bindFlags(fs) },
			summary: "bind the function's whole IOMMU group to vfio-pci",
			about:   bindAbout},
		{name: "unbind", usage: "[--json] [BDF]", run: cmdUnbind,
			summary: "give the group back to the drivers it had before bind"},
		{name: "info", usage: "[--json] [BDF]", run: cmdInfo,
			summary: "open the device and show its capabilities and port (like ibv_devinfo -v)",
			about:   infoAbout},
		{name: "regs", usage: "[--json] [BDF]", run: cmdRegs,
			summary: "dump the BAR1 device registers (takes the device through VFIO)"},
		{name: "pingpong", usage: "[FLAGS] [BDF]", run: cmdPingpong, flags: func(e *env, fs *flag.FlagSet) { pingpongFlags(fs) },
			summary: "bounce messages and check every byte (RC or UD; --srq N, --write, --read; --listen/--connect/--vm for two hosts)"},
		{name: "bench", usage: "[FLAGS] [BDF]", run: cmdBench, flags: func(e *env, fs *flag.FlagSet) { benchFlags(fs) },
			summary: "send (or --write, --read, --atomic) message rate and latency per batch size (1 to 256 per doorbell)"},
		{name: "am", usage: "[FLAGS] [BDF]", run: cmdAM, flags: func(e *env, fs *flag.FlagSet) { amFlags(fs) },
			summary: "active messages: ping-pong latency, message rate beside raw PostSend, bandwidth (--listen/--connect/--vm for two hosts)"},
		{name: "eth", usage: "[info | ping IP | serve | gen | sink] [FLAGS] [BDF]", run: cmdEth, flags: func(e *env, fs *flag.FlagSet) { ethFlags(fs) },
			summary: "the slot's vmxnet3 Ethernet: info (link, MAC, counters), ping IP, serve, gen, sink",
			about:   ethUsage},
	}
}

// lookup returns the command called name.
func lookup(name string) (command, bool) {
	for _, c := range commands() {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// flagSet is the command's flag set, for help and the tests.
func (c command) flagSet() *flag.FlagSet {
	e := &env{}
	fs := newFlagSet(e, c.name)
	if c.flags != nil {
		c.flags(e, fs)
	}
	return fs
}

// globalFlags declares the flags that come before the command, with e's
// values as their defaults (/sys for an empty sysfs).
func globalFlags(e *env, fs *flag.FlagSet) {
	sysfs := e.sysfs
	if sysfs == "" {
		sysfs = "/sys"
	}
	fs.BoolVar(&e.json, "json", e.json, "print one JSON document instead of text (also accepted after the command)")
	fs.StringVar(&e.model, "model", e.model, modelHelp)
	fs.StringVar(&e.fabricDir, "fabric", e.fabricDir, "with --model: put the model on the fabric of directory `DIR`, which the models of other processes naming it share (two pvctl processes, each with --model and the same --fabric, then run pingpong, bench and am over --listen/--connect)")
	fs.StringVar(&e.sysfs, "sysfs", sysfs, "find PCI functions in the sysfs tree at `DIR` (tests use a fake one); bind reads network interfaces' addresses from the kernel only when it is /sys")
	vf := e.vfioFlag
	if vf == "" {
		vf = "auto"
	}
	fs.StringVar(&e.vfioFlag, "vfio", vf, "take the device through VFIO's `PATH`: cdev (its /dev/vfio/devices/vfioN and iommufd, Linux 6.6+), group (its IOMMU group /dev/vfio/N and a type1 container), or auto: the cdev where the kernel offers it, the group otherwise; info says which was taken")
}

// newFlagSet makes a command's flag set, with --json (bound to e.json).
func newFlagSet(e *env, name string) *flag.FlagSet {
	fs := flag.NewFlagSet("pvctl "+name, flag.ContinueOnError)
	fs.BoolVar(&e.json, "json", e.json, "print one JSON document instead of text")
	return fs
}

// errUsage is what usage errors are (errors.Is): pvctl exits 2 on them.
var errUsage = errors.New("usage")

// usageError is a usage error with its reason.
type usageError struct{ msg string }

func (u *usageError) Error() string        { return u.msg }
func (u *usageError) Is(target error) bool { return target == errUsage }

// usageErrorf makes a usage error: a bad flag value, flags that exclude
// each other, a wrong argument.
func usageErrorf(format string, a ...any) error {
	return &usageError{msg: fmt.Sprintf(format, a...)}
}

// parseFlags parses args into fs: flag.ErrHelp for -h or --help, a usage
// error (in pvctl's words, with two dashes) for a bad flag. The flag
// package prints nothing.
func parseFlags(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return err
	}
	return &usageError{msg: flagMessage(err.Error())}
}

// flagRef is a flag named the flag package's way, -name.
var flagRef = regexp.MustCompile(`(^|[ :])-([A-Za-z][A-Za-z0-9-]*)`)

// flagMessage rewrites the flag package's error in pvctl's style: flags
// with two dashes, "unknown flag --x" for an undefined one.
func flagMessage(msg string) string {
	msg = strings.Replace(msg, "flag provided but not defined:", "unknown flag", 1)
	msg = strings.Replace(msg, " for flag -", " for -", 1)
	msg = strings.Replace(msg, "flag needs an argument:", "a value is missing after", 1)
	return flagRef.ReplaceAllString(msg, "$1--$2")
}

func main() {
	e := &env{out: os.Stdout, errOut: os.Stderr, runDir: "/run/vfrdma"}
	os.Exit(run(e, os.Args[1:]))
}

// run runs pvctl with args on e and returns its exit status: 0 done (help
// included), 1 the command failed, 2 a usage error.
func run(e *env, args []string) int {
	gfs := flag.NewFlagSet("pvctl", flag.ContinueOnError)
	globalFlags(e, gfs)
	if err := parseFlags(gfs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printHelp(e.out)
			return 0
		}
		return e.usageFailed("", err)
	}
	if e.model != "" {
		if _, err := parseModel(e.model); err != nil {
			return e.usageFailed("", err)
		}
	}
	p, err := vfio.ParsePath(e.vfioFlag)
	if err != nil {
		return e.usageFailed("", usageErrorf("--vfio %s: want auto, cdev or group", e.vfioFlag))
	}
	e.vfio = p
	if p != vfio.PathAuto && e.model != "" {
		return e.usageFailed("", usageErrorf("--vfio %s: the model has no VFIO: give --model or --vfio, not both", e.vfioFlag))
	}
	if e.fabricDir != "" {
		if e.model == "" {
			return e.usageFailed("", usageErrorf("--fabric %s: the fabric is the model's: give --model too", e.fabricDir))
		}
		fab, err := pvsim.JoinFabric(e.fabricDir)
		if err != nil {
			fmt.Fprintln(e.stderr(), "pvctl:", err)
			return 1
		}
		defer fab.Close()
		e.fabric = fab
	}
	if e.bus == nil {
		e.bus = pci.NewBus(e.sysfs)
	}
	if e.ifAddrs == nil && filepath.Clean(e.sysfs) == "/sys" {
		e.ifAddrs = kernelIfAddrs
	}
	rest := gfs.Args()
	if len(rest) == 0 {
		return e.usageFailed("", usageErrorf("no command"))
	}
	if rest[0] == "help" {
		switch len(rest) {
		case 1:
			printHelp(e.out)
			return 0
		case 2:
			if c, ok := lookup(rest[1]); ok {
				printCommandHelp(e.out, c)
				return 0
			}
			return e.usageFailed("", usageErrorf("help: unknown command %q", rest[1]))
		default:
			return e.usageFailed("", usageErrorf("help: one command at most"))
		}
	}
	c, ok := lookup(rest[0])
	if !ok {
		return e.usageFailed("", usageErrorf("unknown command %q", rest[0]))
	}
	err = c.run(e, rest[1:])
	e.reportModels()
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		printCommandHelp(e.out, c)
		return 0
	case errors.Is(err, errUsage):
		return e.usageFailed(c.name, err)
	}
	fmt.Fprintln(e.stderr(), "pvctl:", err)
	return 1
}

// usageFailed tells a usage error in one line on stderr, with a hint to
// the help, and returns exit status 2.
func (e *env) usageFailed(cmd string, err error) int {
	what, hint := "pvctl", "pvctl help"
	if cmd != "" {
		what, hint = what+" "+cmd, hint+" "+cmd
	}
	msg := strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
	fmt.Fprintf(e.stderr(), "%s: %s (see '%s')\n", what, msg, hint)
	return 2
}

// stderr is where errors and notes go.
func (e *env) stderr() io.Writer {
	if e.errOut == nil {
		return io.Discard
	}
	return e.errOut
}

func (e *env) printJSON(v any) error {
	enc := json.NewEncoder(e.out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// checkBDF checks a command's arguments before any device is reached: one
// BDF at most, well formed, and none with --model.
func (e *env) checkBDF(args []string) error {
	switch {
	case len(args) > 1:
		return usageErrorf("one BDF at most, not %q", strings.Join(args, " "))
	case len(args) == 0:
		return nil
	case e.model != "":
		return usageErrorf("--model runs on the model: no BDF (%s)", args[0])
	}
	if _, err := pci.ParseAddr(args[0]); err != nil {
		return usageErrorf("%v", err)
	}
	return nil
}

// target resolves the optional BDF argument: the one given, or the only
// pvrdma function present.
func (e *env) target(args []string) (pci.Function, error) {
	e.reached++
	switch len(args) {
	case 0:
		fns, err := e.bus.Find(pci.VendorVMware, pci.DevicePVRDMA)
		if err != nil {
			return pci.Function{}, err
		}
		switch len(fns) {
		case 0:
			return pci.Function{}, fmt.Errorf("no pvrdma function (%04x:%04x) on this machine", pci.VendorVMware, pci.DevicePVRDMA)
		case 1:
			return fns[0], nil
		default:
			return pci.Function{}, fmt.Errorf("%d pvrdma functions: name one (pvctl list shows them)", len(fns))
		}
	case 1:
		a, err := pci.ParseAddr(args[0])
		if err != nil {
			return pci.Function{}, err
		}
		f, err := e.bus.Lookup(a)
		if err != nil {
			return pci.Function{}, err
		}
		if f.Vendor != pci.VendorVMware || f.Device != pci.DevicePVRDMA {
			return pci.Function{}, fmt.Errorf("%s is %04x:%04x, not a pvrdma function (%04x:%04x)", a, f.Vendor, f.Device, pci.VendorVMware, pci.DevicePVRDMA)
		}
		return f, nil
	default:
		return pci.Function{}, errUsage
	}
}
