// Package mmio gives bounds- and alignment-checked access to device registers
// in a memory-mapped region, such as a PCI BAR mapped through VFIO.
//
// # Access rules
//
// Loads are atomic loads (one naturally aligned MOV on amd64, which an
// emulator sees as one read). Stores are one plain store instruction issued
// from a tiny assembly helper on amd64. They are deliberately not
// sync/atomic stores: on amd64 atomic.Store is a locked XCHG, a
// read-modify-write that a hypervisor emulating the register may turn into a
// read followed by a write, and a read of a register can have side effects.
// On other architectures the store falls back to sync/atomic: on arm64 that
// is a single STLR (one store, release ordered); see store_other.go for the
// others.
//
// Every access checks that the offset lies inside the region and is aligned
// to the access width; a bad offset is an error wrapping ErrRange or
// ErrAlignment, never a panic and never a stray access. The checks are two
// compares, cheap next to the cost of the device access itself (a VM exit on
// an emulated device), so there is no unchecked variant.
//
// # Ordering
//
// The store helper is an opaque call, so the Go compiler emits every earlier
// store to memory before it, in program order. On amd64 the CPU keeps stores
// in program order, and uncached device memory (how VFIO maps BARs) is not
// reordered with earlier stores to ordinary memory. That is what a doorbell
// needs: fill the descriptor in DMA memory, then Store32 to the doorbell.
//
// # Lifecycle and concurrency
//
// A Region does not own its memory: whoever mapped it (vfio.Device.Map)
// unmaps it, after which the Region must not be used (an access would fault).
// A Region is immutable after New and safe for concurrent use; whether
// concurrent accesses to the same register make sense is the device's
// business. Accessing a BAR of a device that was reset or revoked may raise
// SIGBUS; diagnostic code may guard itself with debug.SetPanicOnFault.
package mmio
