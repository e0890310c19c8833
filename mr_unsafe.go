package vfrdma

import (
	"os"
	"unsafe"
)

// pageAligned reports whether mem starts on a page boundary.
func pageAligned(mem []byte) bool {
	return uintptr(unsafe.Pointer(unsafe.SliceData(mem)))%uintptr(os.Getpagesize()) == 0
}

// wholePages returns mem extended to span bytes, the rest of its last page:
// the IOMMU maps pages, not bytes. The caller's memory must be a mapping
// that covers that page (it does: mappings are made of whole pages).
func wholePages(mem []byte, span uint64) []byte {
	return unsafe.Slice(unsafe.SliceData(mem), span)
}
