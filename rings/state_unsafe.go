package rings

import "unsafe"

// This file holds the package's only unsafe code: viewing the two 32-bit
// counters of a ring state as *uint32, so that sync/atomic can load and store
// them as single aligned 32-bit accesses, as the device expects.
//
// Safety: the caller (NewState) has checked that mem holds at least 8 bytes
// and that its first byte is 4-byte aligned, so both pointers are aligned
// and lie inside mem. The memory is either DMA memory mapped outside the Go
// heap (the GC ignores pointers into it; it must stay mapped while the State
// is used) or, in tests, a Go byte slice that the pointers keep alive.

// misaligned4 reports whether mem's first byte is not 4-byte aligned.
func misaligned4(mem []byte) bool {
	return uintptr(unsafe.Pointer(unsafe.SliceData(mem)))%4 != 0
}

// counters returns pointers to prod_tail (bytes 0..3) and cons_head (bytes
// 4..7) of mem.
func counters(mem []byte) (prod, cons *uint32) {
	_ = mem[StateSize-1]
	return (*uint32)(unsafe.Pointer(&mem[ProdTailOffset])), (*uint32)(unsafe.Pointer(&mem[ConsHeadOffset]))
}
