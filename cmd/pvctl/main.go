// Command pvctl is the bring-up tool for the pvrdma NIC on the machine that
// has it (run it as root; inside the bench's VM, `go run ./cmd/pvvm -- ARGS`
// runs it there), or on the device model (--model) anywhere.
//
//	pvctl [--json] [--model M] COMMAND [ARGS]
//
//	pvctl list                       pvrdma and vmxnet3 functions, group, driver
//	pvctl bind [BDF]                 bind the function's IOMMU group to vfio-pci
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
// pingpong and bench poll their CQs without sleeping, as rdma-core's tools
// do; --events (-e) sleeps on the CQ's interrupt when polls find nothing.
//
// BDF defaults to the only pvrdma function present. --json prints one JSON
// document instead of text.
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

	"github.com/vfrdma/vfrdma/pci"
	"github.com/vfrdma/vfrdma/pvsim"
)

type env struct {
	json  bool
	sysfs string
	model string // --model: the device model's spec, "" for a real device
	// fabric, if set (tests), connects the model to the models of the
	// other envs that share it: two ends can then be two envs of one
	// process, over --listen/--connect.
	fabric *pvsim.Fabric
	out    io.Writer
	bus    *pci.Bus
	runDir string // where bind keeps what unbind restores
}

type command struct {
	name, args, help string
	run              func(e *env, args []string) error
	ownFlags         bool // run parses its own flags (--json among them)
}

func commands() []command {
	return []command{
		{"list", "", "pvrdma and vmxnet3 functions with their IOMMU group and driver", cmdList, false},
		{"bind", "[BDF]", "bind the function's whole IOMMU group to vfio-pci", cmdBind, false},
		{"unbind", "[BDF]", "give the group back to the drivers it had before bind", cmdUnbind, false},
		{"info", "[BDF]", "open the device and show its capabilities and port (like ibv_devinfo -v)", cmdInfo, false},
		{"regs", "[BDF]", "dump the BAR1 device registers (takes the device through VFIO)", cmdRegs, false},
		{"pingpong", "[FLAGS] [BDF]", "bounce messages and check every byte (--rc/--ud, --size, --iters, --srq N, --write, --read; --listen/--connect/--vm for two hosts)", cmdPingpong, true},
		{"bench", "[FLAGS] [BDF]", "send (or --write, --read, --atomic) message rate and latency for batch sizes 1-256 (--rc/--ud, --size, --messages, --batches)", cmdBench, true},
		{"am", "[FLAGS] [BDF]", "active messages: ping-pong latency, message rate beside raw PostSend, bandwidth (--sizes, --iters, --messages; --listen/--connect/--vm for two hosts)", cmdAM, true},
		{"eth", "[SUB] [FLAGS] [BDF]", "the slot's vmxnet3 Ethernet: info (link, MAC, counters), ping IP, serve, gen, sink", cmdEth, true},
	}
}

var errUsage = errors.New("usage")

func main() {
	e := &env{out: os.Stdout, runDir: "/run/vfrdma"}
	fs := flag.NewFlagSet("pvctl", flag.ContinueOnError)
	fs.BoolVar(&e.json, "json", false, "print JSON")
	fs.StringVar(&e.sysfs, "sysfs", "/sys", "sysfs root")
	fs.StringVar(&e.model, "model", "", modelHelp)
	fs.Usage = func() { usage(os.Stderr) }
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	e.bus = pci.NewBus(e.sysfs)
	args := fs.Args()
	if len(args) == 0 {
		usage(os.Stderr)
		os.Exit(2)
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		rest := args[1:]
		if !c.ownFlags {
			// Flags may also follow the command: pvctl list --json.
			sub := flag.NewFlagSet("pvctl "+c.name, flag.ContinueOnError)
			sub.BoolVar(&e.json, "json", e.json, "print JSON")
			if err := sub.Parse(rest); err != nil {
				os.Exit(2)
			}
			rest = sub.Args()
		}
		err := c.run(e, rest)
		if errors.Is(err, errUsage) {
			fmt.Fprintf(os.Stderr, "usage: pvctl %s %s\n", c.name, c.args)
			os.Exit(2)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "pvctl:", err)
			os.Exit(1)
		}
		return
	}
	fmt.Fprintf(os.Stderr, "pvctl: unknown command %q\n", args[0])
	usage(os.Stderr)
	os.Exit(2)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: pvctl [--json] [--model v17..v20|vmware|qemu[,rocev2]] COMMAND [ARGS]")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-7s %-6s %s\n", c.name, c.args, c.help)
	}
}

func (e *env) printJSON(v any) error {
	enc := json.NewEncoder(e.out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// target resolves the optional BDF argument: the one given, or the only
// pvrdma function present.
func (e *env) target(args []string) (pci.Function, error) {
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
