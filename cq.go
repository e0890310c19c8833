package vfrdma

import (
	"context"
	"math/bits"
	"sync"

	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/vfio"
)

// CQESize is the size of one completion-queue element.
const CQESize = 64

// maxCQEntries is the largest power-of-two CQ the device can hold: a CQ has
// at most firmware.MaxRingChunks pages, one of them the ring state.
const maxCQEntries = 1 << 12 // 64 data pages; 127 fit, 4096 is the power of two below 8128

// CQ pages: directory, table, ring state, then the CQE pages.
const (
	cqPgDir = iota
	cqPgTable
	cqPgState
	cqPgData
)

// CQ is a completion queue: a ring of CQEs the device writes in DMA memory.
// Create and Close are safe for concurrent use; polling (a later part of the
// API) is single-owner.
type CQ struct {
	d       *Device
	handle  uint32
	entries int
	buf     *vfio.DMABuffer

	mu     sync.Mutex
	closed bool
}

// CreateCQ creates a completion queue of at least entries CQEs (rounded up
// to a power of two; at most 4096 and the device's max_cqe).
func (d *Device) CreateCQ(ctx context.Context, entries int) (*CQ, error) {
	const op = "create CQ"
	if err := d.check(); err != nil {
		return nil, d.opErr(op, err)
	}
	limit := min(maxCQEntries, int(d.caps.MaxCQE))
	if entries < 1 || entries > limit {
		return nil, d.opErr(op, invalidf("%d CQ entries: want 1 to %d", entries, limit))
	}
	n := 1 << bits.Len(uint(entries-1))
	dataPages := (n*CQESize + firmware.PageSize - 1) / firmware.PageSize
	buf, err := d.vdev.Container().AllocDMA((cqPgData+dataPages)*firmware.PageSize, &vfio.MemOptions{HugePages: vfio.HugeNever})
	if err != nil {
		return nil, d.opErr(op, err)
	}
	page := func(i int) firmware.Page {
		off := i * firmware.PageSize
		return firmware.Page{DMA: buf.IOVA + uint64(off), Mem: buf.Mem[off : off+firmware.PageSize]}
	}
	data := make([]uint64, dataPages)
	for i := range data {
		data[i] = page(cqPgData + i).DMA
	}
	// The buffer is zeroed, so the ring counters start at 0 as the device
	// expects (it never initialises them).
	if err := firmware.WriteRingPageDir(page(cqPgDir), page(cqPgTable), page(cqPgState).DMA, data); err != nil {
		buf.Close()
		return nil, d.opErr(op, err)
	}
	resp, err := d.ch.CreateCQ(ctx, firmware.CreateCQRequest{
		PDirDMA: page(cqPgDir).DMA,
		CQE:     uint32(n),
		NChunks: uint32(1 + dataPages),
	})
	if err != nil {
		buf.Close()
		return nil, d.opErr(op, err)
	}
	cq := &CQ{d: d, handle: resp.CQHandle, entries: n, buf: buf}
	d.journal.add(kindCQ, cq.handle)
	d.mu.Lock()
	d.cqs[cq] = struct{}{}
	d.mu.Unlock()
	return cq, nil
}

// Handle returns the device's handle of the CQ.
func (cq *CQ) Handle() uint32 { return cq.handle }

// Entries returns the number of CQEs the ring holds.
func (cq *CQ) Entries() int { return cq.entries }

// Close destroys the CQ and frees its ring. It is idempotent.
func (cq *CQ) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), cq.d.opt.CommandTimeout)
	defer cancel()
	return cq.d.opErr("destroy CQ", cq.destroy(ctx))
}

func (cq *CQ) destroy(ctx context.Context) error {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.closed {
		return nil
	}
	if err := cq.d.ch.DestroyCQ(ctx, cq.handle); err != nil {
		return err
	}
	cq.closed = true
	cq.d.journal.remove(kindCQ, cq.handle)
	cq.d.mu.Lock()
	delete(cq.d.cqs, cq)
	cq.d.mu.Unlock()
	// Only now that the device has forgotten the ring may its memory go.
	return cq.buf.Close()
}
