package mmio

import (
	"sync/atomic"
	"unsafe"
)

// The callers have checked that [off, off+width) lies inside mem and that off
// is aligned; New checked that mem's base is 8-byte aligned.

func baseMisaligned(mem []byte, align uintptr) bool {
	return uintptr(unsafe.Pointer(unsafe.SliceData(mem)))%align != 0
}

func ptr32(mem []byte, off int) *uint32 {
	return (*uint32)(unsafe.Pointer(unsafe.SliceData(mem[off:])))
}

func ptr64(mem []byte, off int) *uint64 {
	return (*uint64)(unsafe.Pointer(unsafe.SliceData(mem[off:])))
}

func load32(mem []byte, off int) uint32 { return atomic.LoadUint32(ptr32(mem, off)) }

func load64(mem []byte, off int) uint64 { return atomic.LoadUint64(ptr64(mem, off)) }

func store32(mem []byte, off int, v uint32) { storeU32(ptr32(mem, off), v) }

func store64(mem []byte, off int, v uint64) { storeU64(ptr64(mem, off), v) }
