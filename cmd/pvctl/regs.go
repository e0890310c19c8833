package main

import (
	"fmt"

	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/hw"
	"github.com/vfrdma/vfrdma/mmio"
	"github.com/vfrdma/vfrdma/vfio"
)

// bar1 is the VFIO region index of the register BAR.
const bar1 = 1

var regNames = []struct {
	off  int
	name string
}{
	{firmware.RegVersion, "VERSION"}, {firmware.RegDSRLow, "DSRLOW"}, {firmware.RegDSRHigh, "DSRHIGH"},
	{firmware.RegCtl, "CTL"}, {firmware.RegRequest, "REQUEST"}, {firmware.RegErr, "ERR"},
	{firmware.RegICR, "ICR"}, {firmware.RegIMR, "IMR"}, {firmware.RegMACL, "MACL"}, {firmware.RegMACH, "MACH"},
}

type regValue struct {
	Offset int    `json:"offset"`
	Name   string `json:"name"`
	Value  uint32 `json:"value"`
}

// cmdRegs reads the BAR1 registers through VFIO (with --model, the
// model's, fresh, before any driver). Reads have no side effect on the
// device; nothing is written.
func cmdRegs(e *env, args []string) error {
	fs := newFlagSet(e, "regs")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	args = fs.Args()
	if err := e.checkBDF(args); err != nil {
		return err
	}
	if e.model != "" {
		return modelRegs(e, args)
	}
	f, err := e.target(args)
	if err != nil {
		return err
	}
	d, err := vfio.Open(f.Addr, &vfio.Options{SysfsRoot: e.sysfs, Path: e.vfio})
	if err != nil {
		return err
	}
	defer d.Close()
	mem, err := d.Map(bar1, 0, 0)
	if err != nil {
		return err
	}
	r, err := mmio.New(mem)
	if err != nil {
		return err
	}
	vals, err := readRegs(r)
	if err != nil {
		return err
	}
	if e.json {
		return e.printJSON(map[string]any{"bdf": f.Addr.String(), "driver": f.Driver, "iommu_group": f.IOMMUGroup, "bar1_bytes": len(mem), "registers": vals})
	}
	fmt.Fprintf(e.out, "%s (IOMMU group %d, %s): BAR1, %d bytes\n", f.Addr, f.IOMMUGroup, f.Driver, len(mem))
	printRegs(e, vals)
	return nil
}

// modelRegs is regs on --model: the registers of a model no driver has
// touched yet.
func modelRegs(e *env, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("--model runs on the model: no BDF (%s)", args[0])
	}
	m, err := e.newModel()
	if err != nil {
		return err
	}
	defer m.Close()
	r, err := m.Registers()
	if err != nil {
		return err
	}
	vals, err := readRegs(r)
	if err != nil {
		return err
	}
	if e.json {
		return e.printJSON(map[string]any{"model": e.model, "device_name": m.Name(), "registers": vals})
	}
	fmt.Fprintf(e.out, "%s (the device model, --model %s): BAR1, before any driver\n", m.Name(), e.model)
	printRegs(e, vals)
	return nil
}

func readRegs(r hw.Registers) ([]regValue, error) {
	vals := make([]regValue, 0, len(regNames))
	for _, rn := range regNames {
		v, err := r.Load32(rn.off)
		if err != nil {
			return nil, err
		}
		vals = append(vals, regValue{Offset: rn.off, Name: rn.name, Value: v})
	}
	return vals, nil
}

func printRegs(e *env, vals []regValue) {
	for _, v := range vals {
		fmt.Fprintf(e.out, "  0x%02x  %-8s 0x%08x  %d\n", v.Offset, v.Name, v.Value, v.Value)
	}
}
