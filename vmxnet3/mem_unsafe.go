package vmxnet3

import (
	"sync/atomic"
	"unsafe"
)

// Words of DMA memory the device writes while the driver reads them (and
// the reverse) are accessed atomically: on amd64 a plain aligned load or
// store, ordered with the accesses around it. b must hold 4 (8) bytes at
// a 4- (8-) byte aligned address; the layout guarantees it.

func atomicLoad32(b []byte) uint32 {
	_ = b[3]
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&b[0])))
}

func atomicStore32(b []byte, v uint32) {
	_ = b[3]
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&b[0])), v)
}

func atomicLoad64(b []byte) uint64 {
	_ = b[7]
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&b[0])))
}
