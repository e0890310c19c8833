// Package hw names what the driver needs of a PCI function: its register
// file, its doorbell page, its MSI-X vectors and DMA memory the device can
// reach. Those are the seams between the driver and whatever stands behind
// them: VFIO and a real (or QEMU's) device in production, a device model
// (package pvsim) in host tests, examples and tools.
//
// The root package's Open builds a Function over VFIO; OpenFunction takes
// any other.
package hw

import (
	"context"

	"github.com/vfrdma/vfrdma/vfio"
)

// Registers is BAR1, the register file, as 32-bit little-endian registers.
// *mmio.Region satisfies it.
type Registers interface {
	Load32(off int) (uint32, error)
	Store32(off int, v uint32) error
}

// Doorbells is a UAR page of BAR2: the driver only stores to it.
// *mmio.Region satisfies it.
type Doorbells interface {
	Store32(off int, v uint32) error
}

// Vector is an MSI-X vector: Wait blocks until it fires or ctx ends and
// returns how many times it fired since the last Wait. *vfio.Vector
// satisfies it.
type Vector interface {
	Wait(ctx context.Context) (uint64, error)
}

// Function is a PCI function under the driver. Its methods are called by
// one Open at a time; DMA allocation and mapping may be concurrent.
type Function interface {
	// Name is the function's name in errors ("0000:00:10.1").
	Name() string
	// Registers maps BAR1.
	Registers() (Registers, error)
	// Doorbells maps the first UAR page of BAR2.
	Doorbells() (Doorbells, error)
	// EnableVectors enables n MSI-X vectors and returns them by index.
	EnableVectors(n int) ([]Vector, error)
	// AllocDMA returns size bytes (rounded up to the page size) of zeroed
	// memory the device reaches at the buffer's IOVA. huge allows 2 MiB
	// pages where the size allows. The buffer's Close frees it.
	AllocDMA(size int, huge bool) (*vfio.DMABuffer, error)
	// MapDMA makes the caller's memory (page-aligned, whole pages) reachable
	// by the device and returns its IOVA; UnmapDMA undoes it.
	MapDMA(mem []byte) (iova uint64, err error)
	UnmapDMA(iova uint64, size int) error
	// Close disables the vectors and releases the function: every buffer
	// still allocated, the BAR mappings.
	Close() error
}

// UARLocator is a Function that knows the page frame number of its first
// UAR page in the bus address space. The driver tells the device in the
// DSR (a 32-bit field below interface version 19, 64-bit from it); QEMU
// ignores it. A Function without it makes the driver write 0.
type UARLocator interface {
	UARPFN() (uint64, error)
}
