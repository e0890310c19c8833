//go:build !amd64

package mmio

import "sync/atomic"

// storeU32 writes v to *p. Without an assembly helper for this architecture
// it uses sync/atomic: on arm64 that is STLR, a single store with release
// ordering (what a doorbell wants). On some other architectures sync/atomic
// stores are read-modify-writes (riscv64 uses AMOSWAP), which is exactly
// what this package avoids on amd64; a port that drives emulated devices
// there should add a one-instruction assembly helper like store_amd64.s.
func storeU32(p *uint32, v uint32) { atomic.StoreUint32(p, v) }

// storeU64 writes v to *p; see storeU32.
func storeU64(p *uint64, v uint64) { atomic.StoreUint64(p, v) }
