package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/pvsim"
)

// modelHelp is --model's help text.
const modelHelp = "run on the device model (package pvsim) instead of a device: `SPEC` is v17..v20 " +
	"(VMware's device at that interface version; vmware is v20) or qemu (QEMU 7.2's device), " +
	"with ,rocev2 for RoCE v2 GIDs (v18+); no root, VFIO or VM needed, the two ends of pingpong, bench and am run in this process (or, with --fabric, in two)"

// parseModel parses a --model value (pvsim.ParseSpec).
func parseModel(spec string) (pvsim.Config, error) {
	cfg, err := pvsim.ParseSpec(spec)
	var se *pvsim.SpecError
	if errors.As(err, &se) {
		return cfg, usageErrorf("--model %q: %s", spec, se.Reason)
	}
	return cfg, err
}

// errModel refuses a command that needs a machine's PCI functions (list,
// bind, unbind) or the slot's vmxnet3 function (eth), which the model
// does not have.
var errModel = errors.New("this command works on a machine's PCI functions, not on --model (the model is a pvrdma function alone: info, regs, pingpong, bench and am run on it)")

// newModel makes the device model --model names (on e.fabric, if set).
func (e *env) newModel() (*pvsim.Device, error) {
	e.reached++
	cfg, err := parseModel(e.model)
	if err != nil {
		return nil, err
	}
	cfg.Fabric = e.fabric
	m, err := pvsim.New(cfg)
	if err == nil {
		e.models = append(e.models, m)
	}
	return m, err
}

// reportModels tells, on stderr, the figures of the models this process
// made (with --fabric, each process tells its own): what each device
// model moved and lost, and what crossed the fabric's directory. A
// retransmission or a drop on a loss-free run is a finding.
func (e *env) reportModels() {
	for _, m := range e.models {
		s := m.Stats()
		fmt.Fprintf(e.stderr(), "pvctl: model %s %s (pid %d): %d commands, %d doorbells, %d send and %d receive WQEs, %d CQEs; %d packets, %d dropped, %d retransmitted, %d ACK timeouts, %d RNR NAKs\n",
			e.model, m.Name(), os.Getpid(), s.Commands, s.Doorbells, s.SendWQEs, s.RecvWQEs, s.CQEs, s.Packets, s.Dropped, s.Retransmits, s.Timeouts, s.RNRNaks)
	}
	if e.fabric != nil && e.fabricDir != "" && len(e.models) > 0 {
		n := e.fabric.NetStats()
		fmt.Fprintf(e.stderr(), "pvctl: fabric %s (pid %d): %d frames out, %d in, %d refused, %d undelivered, %d peers at the end\n",
			e.fabricDir, os.Getpid(), n.FramesOut, n.FramesIn, n.Refused, n.Undelivered, n.Peers)
	}
}

// open opens the device the command targets: the model's with --model,
// else the function args name (or the only one present) through VFIO.
func (e *env) open(args []string, opts *vfrdma.Options) (*vfrdma.Device, error) {
	if e.model != "" {
		if len(args) > 0 {
			return nil, fmt.Errorf("--model runs on the model: no BDF (%s)", args[0])
		}
		m, err := e.newModel()
		if err != nil {
			return nil, err
		}
		var o vfrdma.Options
		if opts != nil {
			o = *opts
		}
		o.SysfsRoot = ""
		d, err := vfrdma.OpenFunction(m, &o)
		if err != nil {
			return nil, errors.Join(err, m.Close())
		}
		return d, nil
	}
	f, err := e.target(args)
	if err != nil {
		return nil, err
	}
	var o vfrdma.Options
	if opts != nil {
		o = *opts
	}
	o.SysfsRoot = e.sysfs
	o.VFIO = e.vfio
	return vfrdma.Open(f.Addr.String(), &o)
}
