package mmio

// storeU32 writes v to *p with a single MOVL (store_amd64.s).
//
//go:noescape
func storeU32(p *uint32, v uint32)

// storeU64 writes v to *p with a single MOVQ (store_amd64.s).
//
//go:noescape
func storeU64(p *uint64, v uint64)
