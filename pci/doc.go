// Package pci finds PCI functions through sysfs and hands whole IOMMU groups
// to a driver such as vfio-pci.
//
// It reads the kernel's sysfs tree (/sys by default; the root is injectable
// so tests run against a fake tree, see package pcitest): the functions under
// bus/pci/devices (read through u-root's pkg/pci), their bound driver and
// IOMMU group (the driver and iommu_group links), and the members of a group
// (kernel/iommu_groups/N/devices).
//
// # Binding
//
// VFIO hands out a device only when its whole IOMMU group is viable: every
// member bound to a VFIO driver or to no driver at all. BindGroup moves every
// member of a function's group to one driver the way the kernel documents
// for vfio-pci: write the driver name to the member's driver_override, unbind
// it from its current driver, then ask the bus to probe it (drivers_probe),
// and check that the wanted driver took it. It returns the driver each member
// had, which RestoreGroup takes to put things back. PCI bridges in a group
// are left alone (the kernel allows them to keep their driver).
//
// # Errors
//
// Errors are *OpError values naming the operation and the function; the
// conditions a caller or an operator acts on are sentinels matched with
// errors.Is: ErrNotFound, ErrNoIOMMUGroup, ErrGroupNotViable,
// ErrDriverNotLoaded, ErrPermission, ErrBind, ErrInvalidAddr. Each message
// says what to do (which module to load, which member is in the way). The
// underlying errno stays reachable with errors.Is as well.
//
// # Concurrency
//
// A Bus holds no state but its sysfs root: its methods may be called from
// several goroutines. Binding, though, changes kernel state; two binds of the
// same group at once race in the kernel, not in this package.
package pci
