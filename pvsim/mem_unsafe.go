package pvsim

import (
	"sync/atomic"
	"unsafe"
)

// This file holds the package's only unsafe code: the address of a buffer
// (for alignment checks) and single 32-bit atomic loads and stores of ring
// counters in DMA memory, the accesses the device makes to them.
//
// Safety: callers pass slices of at least 4 bytes that the memory table
// returned with its lock held, checked 4-byte aligned by aligned4; the
// memory stays mapped while the lock is held.

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

func aligned4(b []byte) bool { return len(b) >= 4 && addrOf(b)%4 == 0 }

func load32(b []byte) uint32 {
	_ = b[3]
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(unsafe.SliceData(b))))
}

func store32(b []byte, v uint32) {
	_ = b[3]
	atomic.StoreUint32((*uint32)(unsafe.Pointer(unsafe.SliceData(b))), v)
}

// compareSwap64 and fetchAdd64 are the device's 8-byte atomics on an
// 8-byte aligned buffer (checked by the caller): atomic against the host
// CPU's atomics and the other devices' too. They return the original value.
func compareSwap64(b []byte, cmp, swap uint64) uint64 {
	_ = b[7]
	p := (*uint64)(unsafe.Pointer(unsafe.SliceData(b)))
	for {
		old := atomic.LoadUint64(p)
		if old != cmp || atomic.CompareAndSwapUint64(p, old, swap) {
			return old
		}
	}
}

func fetchAdd64(b []byte, add uint64) uint64 {
	_ = b[7]
	return atomic.AddUint64((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), add) - add
}
