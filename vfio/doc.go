// Package vfio takes a PCI device from the kernel through VFIO (type1
// IOMMU) and gives a userspace driver what it needs: register BARs mapped
// into memory, configuration space, MSI-X interrupts on eventfds, and DMA
// memory pinned outside the Go heap and mapped at IOVAs the package
// allocates.
//
// # Objects and lifecycle
//
// VFIO is decomposed as the kernel decomposes it:
//
//   - Container (/dev/vfio/vfio): the IOMMU context. It owns the DMA
//     mappings and the IOVA allocator.
//   - Group (/dev/vfio/N): an IOMMU group attached to the container. The
//     first group attached sets the IOMMU model (type1v2 preferred).
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
// closes the groups, then the container fd. The driver above is expected to
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
// is mapped; the memory never holds Go pointers.
//
// The IOVA allocator hands out page-aligned ranges first-fit from a window
// that starts at 1 MiB (so that a zero or small bogus address from a driver
// bug faults in the IOMMU instead of reaching memory) and ends at 4 GiB
// (devices that do only 32-bit DMA work unchanged), intersected with the
// IOVA ranges the kernel reports as valid; both ends are Options. When the
// kernel reports no ranges, the x86 MSI window 0xfee00000-0xfeefffff is
// left out.
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
// ErrGroupNotViable, ErrNotBound, ErrBusy, ErrNoVFIO, ErrMemlock, ErrRange,
// ErrAlignment, ErrIOVASpace. Messages say what to do (which module to
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
// Every open, close and ioctl of a VFIO node goes through the internal
// uapi package, and through Options.Kernel to the kernel that answers it:
// the running kernel by default, or package vfiotest's fake, which answers
// as vfio, vfio_iommu_type1 and vfio-pci do and lets this package (and code
// above it) run on a machine without VFIO, an IOMMU or root. The package's
// own tests run on that fake; the in-guest test (build tag guest) runs it
// against the real kernel and QEMU's pvrdma.
package vfio
