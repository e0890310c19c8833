package main

import (
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/vfrdma/vfrdma/pci"
)

type listEntry struct {
	BDF    string `json:"bdf"`
	Vendor string `json:"vendor"`
	Device string `json:"device"`
	Kind   string `json:"kind"`
	Group  int    `json:"iommu_group"`
	Driver string `json:"driver"`
}

func kind(f pci.Function) string {
	switch {
	case f.Vendor == pci.VendorVMware && f.Device == pci.DevicePVRDMA:
		return "pvrdma"
	case f.Vendor == pci.VendorVMware && f.Device == pci.DeviceVMXNET3:
		return "vmxnet3"
	}
	return ""
}

// cmdList lists the pvrdma and vmxnet3 functions. Finding none is no
// error: the text says so, --json prints [] (exit status 0 either way).
func cmdList(e *env, args []string) error {
	fs := newFlagSet(e, "list")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if e.model != "" {
		return errModel
	}
	if fs.NArg() != 0 {
		return usageErrorf("list takes no argument, not %q", strings.Join(fs.Args(), " "))
	}
	all, err := e.bus.List()
	if err != nil {
		return err
	}
	list := []listEntry{}
	for _, f := range all {
		k := kind(f)
		if k == "" {
			continue
		}
		list = append(list, listEntry{BDF: f.Addr.String(), Vendor: fmt.Sprintf("%04x", f.Vendor),
			Device: fmt.Sprintf("%04x", f.Device), Kind: k, Group: f.IOMMUGroup, Driver: f.Driver})
	}
	slices.SortFunc(list, func(a, b listEntry) int {
		if a.BDF < b.BDF {
			return -1
		}
		if a.BDF > b.BDF {
			return 1
		}
		return 0
	})
	if e.json {
		return e.printJSON(list)
	}
	if !slices.ContainsFunc(list, func(l listEntry) bool { return l.Kind == "pvrdma" }) {
		fmt.Fprintf(e.out, "no pvrdma function (%04x:%04x) on this machine\n", pci.VendorVMware, pci.DevicePVRDMA)
	}
	if len(list) == 0 {
		return nil
	}
	w := tabwriter.NewWriter(e.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "BDF\tID\tKIND\tGROUP\tDRIVER")
	for _, l := range list {
		drv := l.Driver
		if drv == "" {
			drv = "-"
		}
		group := "-"
		if l.Group >= 0 {
			group = fmt.Sprint(l.Group)
		}
		fmt.Fprintf(w, "%s\t%s:%s\t%s\t%s\t%s\n", l.BDF, l.Vendor, l.Device, l.Kind, group, drv)
	}
	return w.Flush()
}
