package pci_test

import (
	"fmt"

	"github.com/vfrdma/vfrdma/pci"
)

// Hand the pvrdma function's IOMMU group to vfio-pci and give it back.
func ExampleBus_BindGroup() {
	bus := pci.NewBus("") // /sys
	fns, err := bus.Find(pci.VendorVMware, pci.DevicePVRDMA)
	if err != nil || len(fns) == 0 {
		fmt.Println("no pvrdma function:", err)
		return
	}
	prev, err := bus.BindGroup(fns[0].Addr, "vfio-pci")
	if err != nil {
		fmt.Println(err) // says modprobe vfio-pci, run as root, ...
		return
	}
	defer bus.RestoreGroup(prev)
	// ... open the group with package vfio ...
}
