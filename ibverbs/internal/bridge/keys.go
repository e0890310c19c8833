package bridge

import (
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

func unix_Getpagesize() int { return unix.Getpagesize() }

// keyTable translates the program's addresses to the driver's for MRs
// registered without PD.RegisterMRAt: key → the offset to add. Lookups
// take no lock and allocate nothing.
type keyTable struct {
	mu   sync.Mutex
	snap atomic.Pointer[map[uint32]int64]
}

func (k *keyTable) add(lkey, rkey uint32, delta int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	next := map[uint32]int64{}
	if p := k.snap.Load(); p != nil {
		for a, b := range *p {
			next[a] = b
		}
	}
	next[lkey] = delta
	next[rkey] = delta
	k.snap.Store(&next)
}

func (k *keyTable) remove(lkey, rkey uint32) {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.snap.Load()
	if p == nil {
		return
	}
	next := map[uint32]int64{}
	for a, b := range *p {
		if a != lkey && a != rkey {
			next[a] = b
		}
	}
	k.snap.Store(&next)
}

// translate returns the driver's address of addr in the MR of key.
func (k *keyTable) translate(key uint32, addr uint64) uint64 {
	p := k.snap.Load()
	if p == nil {
		return addr
	}
	if d, ok := (*p)[key]; ok {
		return uint64(int64(addr) + d)
	}
	return addr
}
