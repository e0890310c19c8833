package pvsim

import (
	"errors"
	"fmt"
)

// The pvrdma ring (pvrdma_ring.h, facts sheet §5): an 8-byte state of two
// 32-bit counters, prod_tail then cons_head, running over 0..2n-1 for n
// slots; slot = counter & (n-1); empty when they are equal, full when they
// differ by n. A counter with bits outside 2n-1 is invalid. The model uses
// the same mask arithmetic as Linux and QEMU, so that a ring of a slot
// count that is not a power of two (Linux's 3072-slot device rings)
// behaves as it does with them.

const (
	prodTailOff = 0
	consHeadOff = 4
)

func ringMask(n uint32) uint32 { return n<<1 - 1 }

func idxValid(idx, n uint32) bool { return idx&^ringMask(n) == 0 }

// ringFault reports a ring the device cannot use: an invalid counter, or
// state or data memory it cannot reach.
var errRingIndex = errors.New("ring index out of range")
var errDMAFault = errors.New("DMA fault: device address not mapped")

// devRing is a ring the device produces into and the driver consumes: a
// CQ, the async-event ring, the CQ-notification ring.
type devRing struct {
	state uint64   // IOVA of the ring state
	pages []uint64 // IOVAs of the data pages
	n     uint32   // slots
	elem  uint32   // element size, a power of two <= pageSize
}

// elemBytes returns the element at counter idx, or nil if its page is not
// mapped. The caller holds the memory lock.
func (d *Device) elemBytes(pages []uint64, elem, n, idx uint32) []byte {
	off := uint64(idx&(n-1)) * uint64(elem)
	p := off / pageSize
	if p >= uint64(len(pages)) {
		return nil
	}
	return d.dmaBytes(pages[p]+off%pageSize, int(elem))
}

// counters reads a ring state's two counters.
func (d *Device) counters(state uint64) (prod, cons uint32, err error) {
	b := d.dmaBytes(state, 8)
	if b == nil || !aligned4(b) {
		return 0, 0, errDMAFault
	}
	return load32(b[prodTailOff:]), load32(b[consHeadOff:]), nil
}

func (d *Device) setCounter(state uint64, off int, v uint32) error {
	b := d.dmaBytes(state+uint64(off), 4)
	if b == nil || !aligned4(b) {
		return errDMAFault
	}
	store32(b, v)
	return nil
}

// put writes one element into a device ring: fill fills it, then
// prod_tail is advanced. It returns errRingFull when the ring is full,
// errRingIndex for an invalid counter, errDMAFault for memory the device
// cannot reach.
func (d *Device) put(r *devRing, fill func([]byte)) error {
	if r.n == 0 {
		return errRingFull
	}
	prod, cons, err := d.counters(r.state)
	if err != nil {
		return err
	}
	if !idxValid(prod, r.n) || !idxValid(cons, r.n) {
		return errRingIndex
	}
	if prod == cons^r.n {
		return errRingFull
	}
	b := d.elemBytes(r.pages, r.elem, r.n, prod)
	if b == nil {
		return errDMAFault
	}
	fill(b)
	return d.setCounter(r.state, prodTailOff, (prod+1)&ringMask(r.n))
}

var errRingFull = errors.New("ring full")

// wqRing is a ring the driver produces into and the device consumes: a
// QP's send or receive queue, an SRQ.
type wqRing struct {
	state  uint64
	pages  []uint64
	n      uint32
	stride uint32
}

// fromCons makes pending count from cons_head.
const fromCons = ^uint32(0)

// pending returns cons_head and how many elements follow from's position:
// elements at counters from, from+1, ... up to prod_tail. from is the
// device's own fetch position, at or after cons_head (fromCons: cons_head
// itself). An invalid counter, or one that makes no sense against the
// others, is errRingIndex.
func (d *Device) pending(r *wqRing, from uint32) (cons, avail uint32, err error) {
	prod, cons, err := d.counters(r.state)
	if err != nil {
		return 0, 0, err
	}
	if from == fromCons {
		from = cons
	}
	mask := ringMask(r.n)
	if !idxValid(prod, r.n) || !idxValid(cons, r.n) {
		return cons, 0, errRingIndex
	}
	used := (prod - cons) & mask
	fetched := (from - cons) & mask
	if used > r.n || fetched > used {
		return cons, 0, errRingIndex
	}
	return cons, used - fetched, nil
}

// wqe returns the element at counter idx.
func (d *Device) wqe(r *wqRing, idx uint32) []byte {
	return d.elemBytes(r.pages, r.stride, r.n, idx)
}

func (d *Device) setConsHead(r *wqRing, v uint32) error {
	return d.setCounter(r.state, consHeadOff, v&ringMask(r.n))
}

// pageList walks a page directory (facts sheet §3) and returns the IOVAs
// of its first n entries: directory page → tables of 512 entries → pages.
// With oneTable, every entry must be in the first table, as QEMU reads
// only that one for rings. Every table and entry must be a non-zero,
// page-aligned address; the directory and tables must be mapped.
func (d *Device) pageList(pdir uint64, n int, oneTable bool) ([]uint64, error) {
	const entries = pageSize / 8
	if n <= 0 || n > entries*entries {
		return nil, fmt.Errorf("%d pages (1..%d)", n, entries*entries)
	}
	if oneTable && n > entries {
		return nil, fmt.Errorf("%d pages do not fit the one table the device reads", n)
	}
	if pdir == 0 || pdir%pageSize != 0 {
		return nil, fmt.Errorf("page directory address %#x", pdir)
	}
	dir := d.dmaBytes(pdir, pageSize)
	if dir == nil {
		return nil, fmt.Errorf("page directory %#x: %w", pdir, errDMAFault)
	}
	out := make([]uint64, n)
	var table []byte
	for i := range out {
		if i%entries == 0 {
			t := le.Uint64(dir[8*(i/entries):])
			if t == 0 || t%pageSize != 0 {
				return nil, fmt.Errorf("page table %d address %#x", i/entries, t)
			}
			if table = d.dmaBytes(t, pageSize); table == nil {
				return nil, fmt.Errorf("page table %d at %#x: %w", i/entries, t, errDMAFault)
			}
		}
		a := le.Uint64(table[8*(i%entries):])
		if a == 0 || a%pageSize != 0 {
			return nil, fmt.Errorf("page %d address %#x", i, a)
		}
		out[i] = a
	}
	return out, nil
}

// dmaBytes translates n bytes at a device address; nil (and a DMA fault
// counted) if they are not all mapped. The memory lock is held.
func (d *Device) dmaBytes(iova uint64, n int) []byte {
	b := d.mem.bytes(iova, n)
	if b == nil {
		d.ctr.dmaFaults.Add(1)
	}
	return b
}
