package vmxnet3

import (
	"unsafe"

	"github.com/vfrdma/vfrdma/internal/lifecycle"
)

// gate counts the calls that may touch the NIC's device memory (its DMA
// memory and BARs) and lets Close wait for them before it frees that
// memory: the driver's lifecycle gate (package lifecycle). The NIC has one
// per side (transmit, receive, control), each on cache lines of its own, so
// that a sender and a receiver on two CPUs do not share one.
type gate struct {
	lifecycle.Gate
	_ [64 - unsafe.Sizeof(lifecycle.Gate{})%64]byte
}
