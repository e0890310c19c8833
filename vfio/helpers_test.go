package vfio

import (
	"testing"

	"github.com/vfrdma/vfrdma/pci"
	"github.com/vfrdma/vfrdma/pci/pcitest"
)

// pciNoGroup returns a sysfs root where the pvrdma function, bound to
// vfio-pci, has no IOMMU group (a kernel without an IOMMU).
func pciNoGroup(t *testing.T) string {
	s := pcitest.New(t)
	s.AddDriver(t, "vfio-pci")
	s.AddFunction(t, pci.Function{Addr: rdmaAddr, Vendor: 0x15ad, Device: 0x0820, Driver: "vfio-pci", IOMMUGroup: -1})
	return s.Root
}
