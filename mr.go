package vfrdma

import (
	"context"
	"errors"
	"fmt"
	"math"
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
	addr   uint64 // the address of mem[0] in the MR's address space
	mem    []byte
	own    *vfio.DMABuffer // AllocMR's memory, or nil
	// mapLen bytes at IOVA mapIOVA: the pages holding mem, which
	// RegisterMR(At) mapped itself; mapLen is 0 otherwise.
	mapIOVA uint64
	mapLen  int
	pdir    *vfio.DMABuffer // directory and tables
	region  wq.Region       // what the post path checks SGEs against

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
	mr, err := pd.register(ctx, buf.Mem[:size], buf.IOVA, buf.IOVA, access)
	if err != nil {
		buf.Close()
		return nil, d.opErr(op, err)
	}
	mr.own = buf
	return mr, nil
}

// RegisterMR registers the caller's memory at an address of the driver's
// choosing: Addr() is the IOVA the driver maps it at. mem must start on a
// page boundary (RegisterMRAt takes any alignment) and stay valid, mapped
// and unmoved until the MR is closed: memory from the caller's own mmap,
// for example. The device pins its pages.
func (pd *PD) RegisterMR(ctx context.Context, mem []byte, access Access) (*MR, error) {
	return pd.registerUser(ctx, mem, 0, true, access)
}

// RegisterMRAt registers the caller's memory, of any alignment and of 1 to
// the device's max_mr_size bytes, at address addr: Addr() is addr, and an
// SGE {Addr: addr+off, Length: n, LKey: LKey()} names mem[off:off+n]; peers'
// one-sided operations name it by addr with RKey(). libibverbs' ibv_reg_mr
// passes the memory's own virtual address, ibv_reg_mr_iova its iova.
//
// addr must lie at the same offset in a 4 KiB page as mem[0] (the device
// reaches the MR through a list of 4 KiB pages that starts with the page
// holding mem[0], and places addr at its own in-page offset there: a
// virtual address always does), and addr+len(mem) must not pass 2^64;
// otherwise ErrInvalid.
//
// The IOMMU maps whole pages, so the pages holding mem's first and last
// bytes are mapped whole, beyond mem's ends: those bytes must stay valid,
// mapped and unmoved until the MR is closed, like mem itself (the device
// reaches only mem through the MR's keys). Memory from the C heap or the
// caller's mmap qualifies; so does a slice of the Go heap while the caller
// keeps it reachable (Go does not move heap objects, and the page holding
// a live object stays mapped), its pages then pinned for the MR's life.
// Several MRs may share a page (many small buffers of one allocator): each
// maps it at an IOVA of its own (VFIO's IOMMU refuses only overlapping
// IOVA ranges, not a page mapped twice), and under VFIO each mapping
// counts against the locked-memory limit.
//
// On QEMU 7.2's device an MR's pages must number its length in pages
// (pvrdma-device.md, CREATE_MR's nchunks), which an unaligned buffer
// spanning one page more breaks: there the driver registers it up to the
// end of its last page on the device (QEMU grants no remote access, so
// only the local checks, which keep to len(mem), bound it). QEMU 7.2 also
// keeps its mapping of an MR at address 0 after the MR is closed (a leak
// in QEMU, pvrdma-device.md): there give a non-zero address.
func (pd *PD) RegisterMRAt(ctx context.Context, mem []byte, addr uint64, access Access) (*MR, error) {
	return pd.registerUser(ctx, mem, addr, false, access)
}

// registerUser is RegisterMR (atIOVA: at the IOVA it maps mem at, which
// must be page-aligned) and RegisterMRAt (at addr).
func (pd *PD) registerUser(ctx context.Context, mem []byte, addr uint64, atIOVA bool, access Access) (*MR, error) {
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
	va := uint64(memAddr(mem))
	if atIOVA {
		if !pageAligned(mem) {
			return nil, d.opErr(op, invalidf("memory does not start on a page boundary (AllocMR gives memory that does; RegisterMRAt takes any)"))
		}
	} else {
		if uint64(len(mem))-1 > math.MaxUint64-addr {
			return nil, d.opErr(op, invalidf("MR of %d bytes at address %#x passes 2^64: give a lower address", len(mem), addr))
		}
		if addr%firmware.PageSize != va%firmware.PageSize {
			return nil, d.opErr(op, invalidf("address %#x lies at offset %#x of its 4 KiB page, the memory at %#x: give an address at the memory's offset (its virtual address does)",
				addr, addr%firmware.PageSize, va%firmware.PageSize))
		}
	}
	pages := hostPages(mem)
	iova, err := d.fn.MapDMA(pages)
	if err != nil {
		return nil, d.opErr(op, err)
	}
	// The IOVA of mem[0], and of the 4 KiB page holding it (the host's
	// pages may be larger than the device's).
	at := iova + (va - uint64(memAddr(pages)))
	if atIOVA {
		addr = at
	}
	mr, err := pd.register(ctx, mem, addr, at&^(firmware.PageSize-1), access)
	if err != nil {
		d.fn.UnmapDMA(iova, len(pages))
		return nil, d.opErr(op, err)
	}
	mr.mapIOVA, mr.mapLen = iova, len(pages)
	return mr, nil
}

func (d *Device) checkMRSize(n uint64) error {
	if n == 0 || n > d.caps.MaxMRSize {
		return invalidf("MR of %d bytes: the device registers 1 to %d", n, d.caps.MaxMRSize)
	}
	return nil
}

// register writes the page directory of mem, whose first 4 KiB page is at
// IOVA page (the rest follow it), and creates the MR on the device with
// Start = addr and the pages from the one holding mem[0] to the one holding
// its last byte. That is how the devices reach it: QEMU 7.2 maps the
// pages listed into one host range and registers its backend MR at that
// range plus Start's in-page offset, with iova Start (rdma_rm_alloc_mr);
// Linux's vmw_pvrdma creates a user MR with start = the memory's virtual
// address and the pages of its memory from the one holding its first byte
// (pvrdma_reg_user_mr); pvsim reads an SGE's address a at byte
// a - Start + Start mod 4096 of the pages (mrAccess). So addr must sit at
// mem[0]'s offset in its page, which the callers check.
func (pd *PD) register(ctx context.Context, mem []byte, addr, page uint64, access Access) (*MR, error) {
	d := pd.d
	head := int(addr % firmware.PageSize)
	npages := (head + len(mem) + firmware.PageSize - 1) / firmware.PageSize
	length := uint64(len(mem))
	if d.emulated && npages != (len(mem)+firmware.PageSize-1)/firmware.PageSize {
		// QEMU 7.2 takes exactly ceil(length/4096) pages
		// (pvrdma_map_to_pdir, since CVE-2021-3582's fix) and registers
		// length bytes from Start's in-page offset: registering to the end
		// of the last page keeps both.
		length = uint64(npages*firmware.PageSize - head)
		if length > d.caps.MaxMRSize {
			return nil, invalidf("MR of %d bytes at page offset %#x: QEMU registers it as %d bytes, past max_mr_size %d", len(mem), head, length, d.caps.MaxMRSize)
		}
	}
	ntables := firmware.TablesFor(npages)
	pdir, err := d.fn.AllocDMA((1+ntables)*firmware.PageSize, false)
	if err != nil {
		return nil, err
	}
	pages := make([]uint64, npages)
	for i := range pages {
		pages[i] = page + uint64(i*firmware.PageSize)
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
		Start:       addr,
		Length:      length,
		PDirDMA:     pdir.IOVA,
		PDHandle:    pd.handle,
		AccessFlags: uint32(access),
		NChunks:     uint32(npages),
	})
	if err != nil {
		pdir.Close()
		return nil, err
	}
	mr := &MR{pd: pd, handle: resp.MRHandle, lkey: resp.LKey, rkey: resp.RKey, access: access, addr: addr, mem: mem, pdir: pdir}
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
	case mr.mapLen > 0:
		err = errors.Join(err, d.fn.UnmapDMA(mr.mapIOVA, mr.mapLen))
	}
	return err
}
