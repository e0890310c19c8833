package mmio

import (
	"errors"
	"fmt"
)

// Sentinel errors, matched with errors.Is.
var (
	// ErrRange reports an access that does not lie entirely inside the region.
	ErrRange = errors.New("mmio: offset out of range")
	// ErrAlignment reports an offset or base address that is not aligned to
	// the access width.
	ErrAlignment = errors.New("mmio: misaligned access")
)

// AccessError describes a rejected register access.
type AccessError struct {
	Op     string // "Load32", "Store64", ...
	Offset int    // byte offset into the region
	Len    int    // length of the region
	Err    error  // ErrRange or ErrAlignment
}

func (e *AccessError) Error() string {
	return fmt.Sprintf("mmio: %s at offset %#x of a %#x-byte region: %v", e.Op, e.Offset, e.Len, e.Err)
}

func (e *AccessError) Unwrap() error { return e.Err }

// Region is a window of device memory accessed as little-endian registers in
// the CPU's byte order (all supported targets are little-endian, as are PCI
// devices).
//
// The zero Region has length zero: every access fails with ErrRange.
type Region struct {
	mem []byte
}

// New returns a Region over mem, which must stay mapped for as long as the
// Region is used. The start of mem must be 8-byte aligned (a BAR mapping is
// page aligned; a Go allocation of 8 bytes or more is 8-byte aligned), so
// that alignment of an offset implies alignment of the address.
func New(mem []byte) (*Region, error) {
	if len(mem) > 0 && baseMisaligned(mem, 8) {
		return nil, &AccessError{Op: "New", Offset: 0, Len: len(mem), Err: ErrAlignment}
	}
	return &Region{mem: mem}, nil
}

// Len returns the length of the region in bytes.
func (r *Region) Len() int { return len(r.mem) }

// Sub returns the part of r of length n starting at off. off must be 8-byte
// aligned.
func (r *Region) Sub(off, n int) (*Region, error) {
	if off < 0 || n < 0 || off > len(r.mem) || n > len(r.mem)-off {
		return nil, &AccessError{Op: "Sub", Offset: off, Len: len(r.mem), Err: ErrRange}
	}
	if off%8 != 0 {
		return nil, &AccessError{Op: "Sub", Offset: off, Len: len(r.mem), Err: ErrAlignment}
	}
	return &Region{mem: r.mem[off : off+n : off+n]}, nil
}

// ok reports whether an access of width bytes at off lies inside the region
// and is aligned. It is small enough to be inlined into the accessors.
func (r *Region) ok(off, width int) bool {
	return off >= 0 && off <= len(r.mem)-width && off&(width-1) == 0
}

// fail builds the error for a rejected access, out of line so that the
// accessors stay small and the success path does not allocate.
//
//go:noinline
func (r *Region) fail(op string, off, width int) error {
	err := ErrAlignment
	if off < 0 || off > len(r.mem)-width {
		err = ErrRange
	}
	return &AccessError{Op: op, Offset: off, Len: len(r.mem), Err: err}
}

// Load32 reads the 32-bit register at off with one atomic load.
func (r *Region) Load32(off int) (uint32, error) {
	if !r.ok(off, 4) {
		return 0, r.fail("Load32", off, 4)
	}
	return load32(r.mem, off), nil
}

// Load64 reads the 64-bit register at off with one atomic load.
func (r *Region) Load64(off int) (uint64, error) {
	if !r.ok(off, 8) {
		return 0, r.fail("Load64", off, 8)
	}
	return load64(r.mem, off), nil
}

// Store32 writes v to the 32-bit register at off with one store instruction.
func (r *Region) Store32(off int, v uint32) error {
	if !r.ok(off, 4) {
		return r.fail("Store32", off, 4)
	}
	store32(r.mem, off, v)
	return nil
}

// Store64 writes v to the 64-bit register at off with one store instruction.
// Many devices (pvrdma under QEMU among them) implement only 32-bit register
// accesses; use Store64 only where the device documents 64-bit registers.
func (r *Region) Store64(off int, v uint64) error {
	if !r.ok(off, 8) {
		return r.fail("Store64", off, 8)
	}
	store64(r.mem, off, v)
	return nil
}
