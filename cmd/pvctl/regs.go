package main

import (
	"fmt"

	"github.com/vfrdma/vfrdma/firmware"
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

// cmdRegs reads the BAR1 registers through VFIO. Reads have no side effect
// on the device; nothing is written.
func cmdRegs(e *env, args []string) error {
	f, err := e.target(args)
	if err != nil {
		return err
	}
	d, err := vfio.Open(f.Addr, &vfio.Options{SysfsRoot: e.sysfs})
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
	vals := make([]regValue, 0, len(regNames))
	for _, rn := range regNames {
		v, err := r.Load32(rn.off)
		if err != nil {
			return err
		}
		vals = append(vals, regValue{Offset: rn.off, Name: rn.name, Value: v})
	}
	if e.json {
		return e.printJSON(map[string]any{"bdf": f.Addr.String(), "driver": f.Driver, "group": f.IOMMUGroup, "bar1_bytes": len(mem), "registers": vals})
	}
	fmt.Fprintf(e.out, "%s (IOMMU group %d, %s): BAR1, %d bytes\n", f.Addr, f.IOMMUGroup, f.Driver, len(mem))
	for _, v := range vals {
		fmt.Fprintf(e.out, "  0x%02x  %-8s 0x%08x  %d\n", v.Offset, v.Name, v.Value, v.Value)
	}
	return nil
}
