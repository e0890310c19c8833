package vfrdma

import (
	"os"
	"unsafe"
)

// memAddr returns the virtual address of mem[0].
func memAddr(mem []byte) uintptr {
	return uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
}

// pageAligned reports whether mem starts on a page boundary.
func pageAligned(mem []byte) bool {
	return memAddr(mem)%uintptr(os.Getpagesize()) == 0
}

// hostPages returns the whole pages (of the host's page size) that hold
// mem: from its start rounded down to its end rounded up. The IOMMU maps
// pages, not bytes. The pages exist: mappings are made of whole pages, so
// the ones holding mem's first and last bytes are mapped in full; what
// lies there beside mem is the caller's to keep alive (RegisterMRAt).
func hostPages(mem []byte) []byte {
	page := uintptr(os.Getpagesize())
	va := memAddr(mem)
	head := va % page
	span := (head + uintptr(len(mem)) + page - 1) &^ (page - 1)
	return unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(mem)), -int(head))), span)
}
