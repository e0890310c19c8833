package pvsim

import (
	"encoding/binary"
	"fmt"
	"sort"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma/vfio"
)

var le = binary.LittleEndian

// pageSize is the device's page size (and the model's IOMMU's).
const pageSize = 4096

// iovaBase is where the model's IOVA allocator starts: above 4 GiB, so
// that the high halves of DMA addresses (DSRHIGH) are exercised.
const iovaBase = 0x1_0000_0000

// mapping is one range of the model's IOMMU: device addresses iova ..
// iova+len(mem) reach mem.
type mapping struct {
	iova  uint64
	mem   []byte
	owner *Function
	// mmapped: the model allocated mem (AllocDMA) and unmaps it when the
	// mapping goes; otherwise it is the caller's (MapDMA).
	mmapped bool
}

// memory is the model's IOMMU: the translation table from device
// addresses to host memory, and the IOVA allocator. Every device access
// to DMA memory happens with mu held (the model's goroutine holds it
// while it handles one event), and a mapping is removed, and its memory
// unmapped, only with mu held: so the model never touches memory after the
// driver has freed it, and a device address not mapped is a DMA fault the
// model reports, never a crash.
type memory struct {
	mu   sync.Mutex
	maps []*mapping // sorted by iova, disjoint
	next uint64     // the next IOVA to hand out; IOVAs are never reused
}

// alloc reserves size bytes of IOVA space (size a multiple of the page
// size) with one unmapped guard page after it.
func (m *memory) allocIOVA(size uint64) uint64 {
	if m.next == 0 {
		m.next = iovaBase
	}
	a := m.next
	m.next += size + pageSize
	return a
}

func (m *memory) insert(mp *mapping) {
	i := sort.Search(len(m.maps), func(i int) bool { return m.maps[i].iova > mp.iova })
	m.maps = append(m.maps, nil)
	copy(m.maps[i+1:], m.maps[i:])
	m.maps[i] = mp
}

// find returns the mapping holding iova, or nil. mu is held.
func (m *memory) find(iova uint64) *mapping {
	i := sort.Search(len(m.maps), func(i int) bool { return m.maps[i].iova > iova })
	if i == 0 {
		return nil
	}
	mp := m.maps[i-1]
	if iova-mp.iova >= uint64(len(mp.mem)) {
		return nil
	}
	return mp
}

// bytes returns the n bytes the device reaches at iova, or nil if they do
// not all lie in one mapping. mu is held.
func (m *memory) bytes(iova uint64, n int) []byte {
	if n < 0 {
		return nil
	}
	mp := m.find(iova)
	if mp == nil {
		return nil
	}
	off := iova - mp.iova
	if uint64(n) > uint64(len(mp.mem))-off {
		return nil
	}
	return mp.mem[off : off+uint64(n) : off+uint64(n)]
}

// remove takes the mapping starting at iova out of the table (mu held)
// and returns it, or nil.
func (m *memory) remove(iova uint64) *mapping {
	i := sort.Search(len(m.maps), func(i int) bool { return m.maps[i].iova >= iova })
	if i == len(m.maps) || m.maps[i].iova != iova {
		return nil
	}
	mp := m.maps[i]
	m.maps = append(m.maps[:i], m.maps[i+1:]...)
	return mp
}

// release removes mp if it is still mapped and frees its memory if the
// model allocated it.
func (m *memory) release(mp *mapping) error {
	m.mu.Lock()
	ok := m.find(mp.iova) == mp
	if ok {
		m.remove(mp.iova)
	}
	m.mu.Unlock()
	if !ok || !mp.mmapped {
		return nil
	}
	return unix.Munmap(mp.mem)
}

// releaseOwned removes every mapping of owner (nil: every mapping) and
// frees the memory the model allocated.
func (m *memory) releaseOwned(owner *Function) error {
	m.mu.Lock()
	var gone []*mapping
	kept := m.maps[:0]
	for _, mp := range m.maps {
		if owner == nil || mp.owner == owner {
			gone = append(gone, mp)
		} else {
			kept = append(kept, mp)
		}
	}
	clear(m.maps[len(kept):])
	m.maps = kept
	m.mu.Unlock()
	var first error
	for _, mp := range gone {
		if mp.mmapped {
			if err := unix.Munmap(mp.mem); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// allocDMA is Function.AllocDMA: anonymous memory off the Go heap (not
// locked: the model needs no pinning), zeroed by the kernel, at a fresh
// IOVA.
func (m *memory) allocDMA(owner *Function, size int) (*vfio.DMABuffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("pvsim: allocate %d bytes of DMA memory: %w", size, vfio.ErrRange)
	}
	n := (size + pageSize - 1) &^ (pageSize - 1)
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("pvsim: mmap %d bytes: %w", n, err)
	}
	mp := &mapping{mem: b, owner: owner, mmapped: true}
	m.mu.Lock()
	mp.iova = m.allocIOVA(uint64(n))
	m.insert(mp)
	m.mu.Unlock()
	return vfio.NewDMABuffer(b, mp.iova, pageSize, func() error { return m.release(mp) }), nil
}

// mapDMA is Function.MapDMA.
func (m *memory) mapDMA(owner *Function, mem []byte) (uint64, error) {
	if len(mem) == 0 || len(mem)%pageSize != 0 {
		return 0, fmt.Errorf("pvsim: map %d bytes: not whole pages: %w", len(mem), vfio.ErrAlignment)
	}
	if addrOf(mem)%pageSize != 0 {
		return 0, fmt.Errorf("pvsim: map memory that does not start on a page boundary: %w", vfio.ErrAlignment)
	}
	mp := &mapping{mem: mem[:len(mem):len(mem)], owner: owner}
	m.mu.Lock()
	mp.iova = m.allocIOVA(uint64(len(mem)))
	m.insert(mp)
	m.mu.Unlock()
	return mp.iova, nil
}

// unmapDMA is Function.UnmapDMA: the range must be one MapDMA made.
func (m *memory) unmapDMA(iova uint64, size int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	mp := m.find(iova)
	if mp == nil || mp.iova != iova || mp.mmapped || len(mp.mem) != size {
		return fmt.Errorf("pvsim: unmap IOVA %#x (%d bytes): not a mapping MapDMA made: %w", iova, size, vfio.ErrRange)
	}
	m.remove(iova)
	return nil
}
