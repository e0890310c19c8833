package vfrdma

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/vfio"
	"github.com/vfrdma/vfrdma/wq"
)

// Access are the rights an MR grants.
type Access uint32

// Access flags (the verbs values the device takes in CREATE_MR). The
// remote rights let peers' one-sided operations name the MR by its RKey;
// remote write and remote atomic need local write too (the verbs rule).
// QEMU 7.2 runs no one-sided operation: there they grant nothing.
const (
	AccessLocalWrite   Access = firmware.AccessLocalWrite
	AccessRemoteWrite  Access = firmware.AccessRemoteWrite
	AccessRemoteRead   Access = firmware.AccessRemoteRead
	AccessRemoteAtomic Access = firmware.AccessRemoteAtomic

	accessKnown = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic
)

// checkAccess refuses rights the driver does not register (memory windows,
// zero-based and on-demand MRs) and the combinations verbs forbid.
func checkAccess(a Access) error {
	if a&^accessKnown != 0 {
		return fmt.Errorf("%w: MR access flags %#x", ErrNotSupported, uint32(a&^accessKnown))
	}
	if a&(AccessRemoteWrite|AccessRemoteAtomic) != 0 && a&AccessLocalWrite == 0 {
		return invalidf("MR access %#x: remote write and remote atomic need local write", uint32(a))
	}
	return nil
}

// MR is a registered memory region: memory the device may read and write
// at the addresses Addr() .. Addr()+Len(), through the key LKey. Work
// requests name it by SGEs (MR.SGE). Its methods are safe for concurrent
// use; the memory itself is shared with the device: what the device may
// write (receive buffers) must not be read before its completion arrives.
// It follows the lifecycle rule (doc.go): once it is closed, posts naming
// its key are refused and Bytes returns nil; the accessors of its fixed
// attributes (Addr, Len, keys, Handle) still answer.
type MR struct {
	pd     *PD
	handle uint32
	lkey   uint32
	rkey   uint32
	access Access
	addr   uint64 // the MR's address space base (its IOVA)
	mem    []byte
	own    *vfio.DMABuffer // AllocMR's memory, or nil
	mapped bool            // RegisterMR mapped mem at addr itself
	pdir   *vfio.DMABuffer // directory and tables
	region wq.Region       // what the post path checks SGEs against

	mu     sync.Mutex
	closed bool
}

// AllocMR allocates size bytes of pinned DMA memory (rounded up to the page
// size; 2 MiB pages where the size allows) and registers it.
func (pd *PD) AllocMR(ctx context.Context, size int, access Access) (*MR, error) {
	d := pd.d
	const op = "register MR"
	if err := pd.enter(); err != nil {
		return nil, d.opErr(op, err)
	}
	defer pd.exit()
	if err := d.checkMRSize(uint64(size)); err != nil {
		return nil, d.opErr(op, err)
	}
	if err := checkAccess(access); err != nil {
		return nil, d.opErr(op, err)
	}
	buf, err := d.fn.AllocDMA(size, true)
	if err != nil {
		return nil, d.opErr(op, err)
	}
	mr, err := pd.register(ctx, buf.Mem[:size], buf.IOVA, access)
	if err != nil {
		buf.Close()
		return nil, d.opErr(op, err)
	}
	mr.own = buf
	return mr, nil
}

// RegisterMR registers the caller's memory. It must start on a page
// boundary and stay valid, mapped and unmoved until the MR is closed:
// memory from the caller's own mmap, for example. The driver maps it in the
// IOMMU at an IOVA of its own; the device pins its pages.
func (pd *PD) RegisterMR(ctx context.Context, mem []byte, access Access) (*MR, error) {
	d := pd.d
	const op = "register MR"
	if err := pd.enter(); err != nil {
		return nil, d.opErr(op, err)
	}
	defer pd.exit()
	if len(mem) == 0 {
		return nil, d.opErr(op, invalidf("empty memory"))
	}
	if err := d.checkMRSize(uint64(len(mem))); err != nil {
		return nil, d.opErr(op, err)
	}
	if err := checkAccess(access); err != nil {
		return nil, d.opErr(op, err)
	}
	if !pageAligned(mem) {
		return nil, d.opErr(op, invalidf("memory does not start on a page boundary (AllocMR gives memory that does)"))
	}
	span := pageSpan(len(mem))
	// The IOMMU maps whole pages: the tail of the last page goes with it
	// (the device still reaches only the MR's length through its key).
	iova, err := d.fn.MapDMA(wholePages(mem, span))
	if err != nil {
		return nil, d.opErr(op, err)
	}
	mr, err := pd.register(ctx, mem, iova, access)
	if err != nil {
		d.fn.UnmapDMA(iova, int(span))
		return nil, d.opErr(op, err)
	}
	mr.mapped = true
	return mr, nil
}

func (d *Device) checkMRSize(n uint64) error {
	if n == 0 || n > d.caps.MaxMRSize {
		return invalidf("MR of %d bytes: the device registers 1 to %d", n, d.caps.MaxMRSize)
	}
	return nil
}

// register writes the page directory of mem (mapped at iova, page-aligned)
// and creates the MR on the device.
func (pd *PD) register(ctx context.Context, mem []byte, iova uint64, access Access) (*MR, error) {
	d := pd.d
	npages := (len(mem) + firmware.PageSize - 1) / firmware.PageSize
	ntables := firmware.TablesFor(npages)
	pdir, err := d.fn.AllocDMA((1+ntables)*firmware.PageSize, false)
	if err != nil {
		return nil, err
	}
	pages := make([]uint64, npages)
	for i := range pages {
		pages[i] = iova + uint64(i*firmware.PageSize)
	}
	pg := func(i int) firmware.Page { return bufPage(pdir, i) }
	tables := make([]firmware.Page, ntables)
	for i := range tables {
		tables[i] = pg(1 + i)
	}
	if err := firmware.WritePageDir(pg(0), tables, pages); err != nil {
		pdir.Close()
		return nil, err
	}
	resp, err := d.ch.CreateMR(ctx, firmware.CreateMRRequest{
		Start:       iova,
		Length:      uint64(len(mem)),
		PDirDMA:     pdir.IOVA,
		PDHandle:    pd.handle,
		AccessFlags: uint32(access),
		NChunks:     uint32(npages),
	})
	if err != nil {
		pdir.Close()
		return nil, err
	}
	mr := &MR{pd: pd, handle: resp.MRHandle, lkey: resp.LKey, rkey: resp.RKey, access: access, addr: iova, mem: mem, pdir: pdir}
	d.journal.add(kindMR, mr.handle)
	if err := d.addMR(mr); err != nil {
		d.ch.DestroyMR(ctx, mr.handle)
		d.journal.remove(kindMR, mr.handle)
		pdir.Close()
		return nil, err
	}
	pd.hold(+1)
	return mr, nil
}

// Bytes returns the registered memory; nil once the MR is closed (its
// AllocMR memory is unmapped then).
func (mr *MR) Bytes() []byte {
	mr.mu.Lock()
	defer mr.mu.Unlock()
	if mr.closed {
		return nil
	}
	return mr.mem
}

// Addr returns the address of Bytes()[0] in the MR's address space, the
// address SGEs use.
func (mr *MR) Addr() uint64 { return mr.addr }

// Len returns the MR's length in bytes.
func (mr *MR) Len() int { return len(mr.mem) }

// LKey returns the local key SGEs carry.
func (mr *MR) LKey() uint32 { return mr.lkey }

// RKey returns the remote key peers put in SendWR.RKey to reach the MR by
// one-sided operations, within its remote rights (QEMU: always
// 0xFFFFFFFF; remote access is not emulated). On a version-20 device it is
// the physical adapter's key, unrelated to the handle.
func (mr *MR) RKey() uint32 { return mr.rkey }

// Access returns the rights the MR was registered with.
func (mr *MR) Access() Access { return mr.access }

// Handle returns the device's handle of the MR.
func (mr *MR) Handle() uint32 { return mr.handle }

// SGE returns the scatter/gather element for n bytes at offset off of the
// MR. It does not check the range; posting does.
func (mr *MR) SGE(off, n int) SGE {
	return SGE{Addr: mr.addr + uint64(off), Length: uint32(n), LKey: mr.lkey}
}

// Close deregisters the MR and releases its memory (AllocMR's) or its IOMMU
// mapping (RegisterMR's). It is idempotent. Work requests still naming the
// MR must have completed.
func (mr *MR) Close() error {
	return mr.pd.d.closeObject("deregister MR", mr.destroy)
}

func (mr *MR) destroy(ctx context.Context) error {
	mr.mu.Lock()
	defer mr.mu.Unlock()
	if mr.closed {
		return nil
	}
	d := mr.pd.d
	if err := d.ch.DestroyMR(ctx, mr.handle); err != nil {
		return err
	}
	mr.closed = true
	d.journal.remove(kindMR, mr.handle)
	d.removeMR(mr)
	mr.pd.hold(-1)
	err := mr.pdir.Close()
	switch {
	case mr.own != nil:
		err = errors.Join(err, mr.own.Close())
	case mr.mapped:
		err = errors.Join(err, d.fn.UnmapDMA(mr.addr, int(pageSpan(len(mr.mem)))))
	}
	return err
}

// pageSpan rounds n up to whole pages.
func pageSpan(n int) uint64 {
	page := uint64(os.Getpagesize())
	return (uint64(n) + page - 1) &^ (page - 1)
}
