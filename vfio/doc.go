// Package vfio takes a PCI device from the kernel through VFIO and gives a
// userspace driver what it needs: register BARs mapped into memory,
// configuration space, MSI-X interrupts on eventfds, and DMA memory pinned
// outside the Go heap and mapped at IOVAs the package allocates.
//
// # Two paths, one Device
//
// The kernel offers two ways in, and Open takes either (Options.Path):
//
//   - The group path (PathGroup): the IOMMU group's node /dev/vfio/N,
//     attached to a container /dev/vfio/vfio with the type1 IOMMU, and the
//     device fd from VFIO_GROUP_GET_DEVICE_FD. The kernel documents this
//     model as legacy, to be deprecated.
//   - The cdev path (PathCDev, Linux 6.6+ with CONFIG_VFIO_DEVICE_CDEV and
//     CONFIG_IOMMUFD): the device's own node /dev/vfio/devices/vfioN (sysfs
//     names it under /sys/bus/pci/devices/<BDF>/vfio-dev/), bound to an
//     iommufd (/dev/iommu, VFIO_DEVICE_BIND_IOMMUFD) and attached to an
//     IOAS (IOMMU_IOAS_ALLOC, VFIO_DEVICE_ATTACH_IOMMUFD_PT); DMA is mapped
//     with IOMMU_IOAS_MAP at a fixed IOVA and unmapped with
//     IOMMU_IOAS_UNMAP, the usable window is what IOMMU_IOAS_IOVA_RANGES
//     reports (read again after every attach), and Close destroys the IOAS
//     (IOMMU_DESTROY).
//
// PathAuto, the default, takes the cdev where the kernel offers it (the
// function has a vfio-dev node and /dev/iommu opens) and the group
// otherwise. Either way Open returns the same Device over the same
// Container and Group types: regions, MSI-X, reset and DMA behave alike
// (the device fd's ioctls are the same), and Device.Path says which path
// was taken. What differs is reported, not hidden: IOMMUInfo.Type is
// IOMMUFD on the cdev path, which reports no page-size bitmap (PageSizes
// holds the IOVA alignment) and no mapping budget (DMAAvail -1), and an
// IOAS keeps its mappings when its last device closes where a type1
// container drops them with its last group.
//
// Ownership differs too. On the group path the process opens the whole
// group: it must be viable (every member on vfio-pci or on no driver),
// one process holds it, and the slot's vmxnet3 function (function 0, in
// the same group) comes from the same group fd. On the cdev path only a
// device is claimed: the process opens, binds and attaches each device it
// uses through its own node, and a member it does not open is left alone.
// The kernel still isolates by group: a bind fails (EPERM, reported as
// ErrGroupNotViable naming the member) while another member is on a
// kernel driver, or owned by another iommufd, so the vmxnet3 function
// must still be on vfio-pci (pci.Bus.BindGroup binds the whole group, as
// before); the driver above opens it through Group.OpenDevice as on the
// group path, which on the cdev path binds it to the same iommufd and
// attaches it to the same IOAS. A device bound elsewhere (another process,
// or another Open here) refuses the bind (ErrBusy, the kernel's EINVAL),
// and so does a device whose group is held through /dev/vfio/N (ErrBusy,
// EBUSY), and the group node refuses to open while a device of it is bound
// through its cdev.
//
// In the bench's guest builds (build tag guest) the environment variable
// VFRDMA_VFIO (auto, cdev or group) says what PathAuto means, so that a
// bench tier chooses the path of every Open in the guest, tests included;
// an explicit Options.Path wins.
//
// # Objects and lifecycle
//
// VFIO is decomposed as the kernel decomposes it:
//
//   - Container: the IOMMU context, /dev/vfio/vfio on the group path, an
//     iommufd IOAS on the cdev path (OpenIOMMUFD). It owns the DMA
//     mappings and the IOVA allocator.
//   - Group: an IOMMU group. On the group path its node /dev/vfio/N,
//     attached to the container; the first group attached sets the IOMMU
//     model (type1v2 preferred). On the cdev path it holds no node and
//     names the group its devices belong to.
//   - Device: one PCI function of a group. Its regions (BARs, config
//     space) are keyed by region index; its IRQs by IRQ index.
//
// Open does all of that for one PCI function and returns a Device that owns
// its group and container.
//
// Parents own their children, and Close is explicit, ordered and
// idempotent. Device.Close disables the device's interrupts and closes
// their eventfds, unmaps its regions, then closes the device fd.
// Container.Close closes every device of every group first (vfio-pci turns
// bus mastering off when the device fd is released, so the device can no
// longer DMA), then unmaps and frees all DMA memory still mapped, then
// closes the groups, then the container fd (on the cdev path it destroys
// the IOAS, then closes the iommufd). The driver above is expected to
// quiesce the device and free its DMA buffers before that; Close makes the
// teardown safe when it did not. Constructors undo their partial work on
// every error path.
//
// # DMA memory
//
// AllocMemory maps anonymous memory outside the Go heap, populated and
// locked (mlock), with 2 MiB huge pages when that fits and is available.
// Container.AllocDMA allocates such memory, an IOVA for it, and maps it in
// the IOMMU; DMABuffer.Close undoes all three. IOVAs come from the
// container's allocator: never the virtual address, never a physical
// address. The device may read and write a DMA buffer at any time while it
// is mapped; the memory never holds Go pointers. On both paths the kernel
// pins what is mapped against RLIMIT_MEMLOCK: a map refused for it (ENOMEM)
// is an error wrapping ErrMemlock that says how much to allow.
//
// The IOVA allocator hands out page-aligned ranges first-fit from a window
// that starts at 1 MiB (so that a zero or small bogus address from a driver
// bug faults in the IOMMU instead of reaching memory) and ends at 4 GiB
// (devices that do only 32-bit DMA work unchanged), intersected with the
// IOVA ranges the kernel reports as valid; both ends are Options. When the
// kernel reports no ranges, the x86 MSI window 0xfee00000-0xfeefffff is
// left out. A mapping outside the reported ranges is refused before the
// ioctl, with an error wrapping ErrRange that names them.
//
// # Interrupts
//
// Device.EnableMSIX binds each vector to an eventfd. A Vector is waited on
// through the Go runtime's poller (no thread is blocked), with a context.
//
// # Errors
//
// Failures are *OpError values naming the operation and the object (the
// container, a group, or a device address), wrapping the errno (matched
// with errors.Is, e.g. errors.Is(err, unix.EBUSY)) and, for conditions a
// caller branches on, a sentinel: ErrClosed, ErrNotSupported,
// ErrGroupNotViable, ErrNotBound, ErrBusy, ErrNoVFIO, ErrNoIOMMUFD,
// ErrNoCDev, ErrMemlock, ErrRange, ErrAlignment, ErrIOVASpace. Messages say what to do (which module to
// load, which group member is in the way, which limit to raise). The package
// never logs, prints or exits.
//
// # Concurrency
//
// Container, Group and Device are safe for concurrent use. A Vector is
// single-owner: one goroutine waits on it at a time (Close may come from
// another goroutine and wakes the waiter with ErrClosed). DMABuffer and
// Memory are plain values; their Close is safe to call concurrently with
// the container's.
//
// # Testing
//
// Every open, close and ioctl of a VFIO or iommufd node goes through the
// internal uapi package, and through Options.Kernel to the kernel that
// answers it: the running kernel by default, or package vfiotest's fake,
// which answers as vfio, vfio_iommu_type1, iommufd and vfio-pci do and lets
// this package (and code above it) run on a machine without VFIO, an IOMMU
// or root. The package's tests of the device run on both paths. The package's
// own tests run on that fake; the in-guest test (build tag guest) runs it
// against the real kernel and QEMU's pvrdma.
package vfio
