package vfio

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// HugePages is the huge-page policy of AllocMemory.
type HugePages int

const (
	// HugeAuto uses 2 MiB huge pages when the size is at least 2 MiB and
	// the kernel has enough free (vm.nr_hugepages), and 4 KiB pages
	// otherwise. Smaller buffers never take a huge page: a 4 KiB ring
	// would pin 2 MiB.
	HugeAuto HugePages = iota
	// HugeNever always uses base pages.
	HugeNever
	// HugeRequired uses 2 MiB huge pages or fails.
	HugeRequired
)

// HugePageSize is the huge page size AllocMemory uses.
const HugePageSize = 2 << 20

// MemOptions configure AllocMemory and AllocDMA; nil means defaults.
type MemOptions struct {
	HugePages HugePages
}

// Memory is pinned memory outside the Go heap: an anonymous private
// mapping, locked in RAM (mlock), excluded from fork (MADV_DONTFORK), and
// zeroed when allocated. Its Close is idempotent and safe for concurrent
// use; the bytes themselves are the caller's to synchronise.
type Memory struct {
	b        []byte
	pageSize int
	closed   atomic.Bool
}

// AllocMemory allocates size bytes of pinned memory, rounded up to the page
// size used. A locked-memory limit too low for it is an error wrapping
// ErrMemlock that says what RLIMIT_MEMLOCK must be.
func AllocMemory(size int, opts *MemOptions) (*Memory, error) {
	const op = "allocate DMA memory"
	if size <= 0 {
		return nil, opErr(op, "", wrapf(ErrRange, nil, "size %d", size))
	}
	policy := HugeAuto
	if opts != nil {
		policy = opts.HugePages
	}
	if policy == HugeRequired || (policy == HugeAuto && size >= HugePageSize) {
		n := int(alignUp(uint64(size), HugePageSize))
		b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE,
			unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_HUGETLB|unix.MAP_HUGE_2MB|unix.MAP_POPULATE)
		if err == nil {
			m, err := pin(b, HugePageSize)
			return m, opErr(op, "", err)
		}
		if policy == HugeRequired {
			return nil, opErr(op, "", fmt.Errorf("%w: %d bytes of 2 MiB huge pages: %w (reserve them: echo N > /proc/sys/vm/nr_hugepages)",
				ErrNotSupported, n, err))
		}
		// No free huge pages: fall back to base pages.
	}
	page := os.Getpagesize()
	n := int(alignUp(uint64(size), uint64(page)))
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, opErr(op, "", fmt.Errorf("mmap %d bytes: %w", n, err))
	}
	m, err := pin(b, page)
	return m, opErr(op, "", err)
}

// pin locks b and keeps it out of forked children; on failure b is
// unmapped.
func pin(b []byte, page int) (*Memory, error) {
	if err := unix.Mlock(b); err != nil {
		_ = unix.Munmap(b)
		if isMemErr(err) {
			return nil, memlockError("cannot lock", len(b), err)
		}
		return nil, fmt.Errorf("mlock: %w", err)
	}
	if err := unix.Madvise(b, unix.MADV_DONTFORK); err != nil {
		_ = unix.Munmap(b)
		return nil, fmt.Errorf("madvise(MADV_DONTFORK): %w", err)
	}
	return &Memory{b: b, pageSize: page}, nil
}

// memlockError explains a failure to lock or pin size bytes: the limit, what
// is locked already, and the value the limit must be raised to.
func memlockError(what string, size int, err error) error {
	var rl unix.Rlimit
	limit := "unknown"
	if unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl) == nil {
		if rl.Cur == unix.RLIM_INFINITY {
			limit = "unlimited"
		} else {
			limit = strconv.FormatUint(rl.Cur, 10) + " bytes"
		}
	}
	locked := lockedBytes()
	need := uint64(locked) + uint64(size)
	return wrapf(ErrMemlock, err,
		"%s %d bytes of DMA memory: RLIMIT_MEMLOCK is %s with %d bytes already locked; raise it to at least %d bytes (ulimit -l %d, or LimitMEMLOCK=%d in a systemd unit), or run with CAP_IPC_LOCK",
		what, size, limit, locked, need, (need+1023)/1024, need)
}

// lockedBytes returns VmLck from /proc/self/status (0 when unknown).
func lockedBytes() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Bytes()
		if rest, ok := bytes.CutPrefix(line, []byte("VmLck:")); ok {
			f := bytes.Fields(rest)
			if len(f) >= 1 {
				kb, err := strconv.ParseInt(string(f[0]), 10, 64)
				if err == nil {
					return kb * 1024
				}
			}
		}
	}
	return 0
}

// Bytes returns the memory. It must not be used after Close.
func (m *Memory) Bytes() []byte { return m.b }

// PageSize returns the page size backing the memory (4096 or HugePageSize).
func (m *Memory) PageSize() int { return m.pageSize }

// Close unmaps the memory. It is idempotent.
func (m *Memory) Close() error {
	if m == nil || m.closed.Swap(true) {
		return nil
	}
	return opErr("free DMA memory", "", unix.Munmap(m.b))
}

// DMABuffer is pinned memory mapped in a container's IOMMU for device DMA.
//
// Mem is the memory, IOVA the address the device uses for Mem[0]; IOVA+i
// addresses Mem[i]. The device may read or write any of it at any time
// while it is mapped, so hand it to the device only after initialising it
// and read what the device writes with the ordering the device protocol
// gives (index first, then body). Mem holds no Go pointers and must not be
// given any.
//
// A DMABuffer built by hand (for tests of upper layers) has no container:
// its Close does nothing. One from NewDMABuffer belongs to whoever made
// it (a device model): its Close calls the release function once.
type DMABuffer struct {
	Mem      []byte
	IOVA     uint64
	PageSize int // of the memory backing Mem

	c       *Container
	mem     *Memory
	closed  bool // guarded by c.mu
	release func() error
	once    sync.Once
}

// NewDMABuffer returns a buffer over memory that something other than a
// container maps for a device (a device model): Close calls release once
// and clears Mem.
func NewDMABuffer(mem []byte, iova uint64, pageSize int, release func() error) *DMABuffer {
	return &DMABuffer{Mem: mem, IOVA: iova, PageSize: pageSize, release: release}
}

// AllocDMA allocates size bytes (rounded up to the page size) of pinned,
// zeroed memory, an IOVA range for it aligned to its page size, and maps it
// in the IOMMU. DMABuffer.Close undoes all three; Container.Close does it
// for buffers still open.
func (c *Container) AllocDMA(size int, opts *MemOptions) (*DMABuffer, error) {
	const op = "allocate DMA buffer"
	m, err := AllocMemory(size, opts)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	iova, err := c.allocIOVALocked(uint64(len(m.b)), uint64(m.pageSize))
	if err != nil {
		_ = m.Close()
		return nil, opErr(op, "container", err)
	}
	if err := c.mapLocked(m.b, iova); err != nil {
		_ = c.alloc.release(iova, uint64(len(m.b)))
		_ = m.Close()
		return nil, opErr(op, "container", err)
	}
	b := &DMABuffer{Mem: m.b, IOVA: iova, PageSize: m.pageSize, c: c, mem: m}
	c.bufs[b] = struct{}{}
	return b, nil
}

// Close unmaps the buffer from the IOMMU, returns its IOVA range and frees
// the memory. It is idempotent.
func (b *DMABuffer) Close() error {
	if b == nil {
		return nil
	}
	if b.release != nil {
		var err error
		b.once.Do(func() {
			err = b.release()
			b.Mem = nil
		})
		return err
	}
	if b.c == nil {
		return nil
	}
	c := b.c
	c.mu.Lock()
	if b.closed {
		c.mu.Unlock()
		return nil
	}
	err := c.releaseBufferLocked(b)
	c.mu.Unlock()
	err = errors.Join(err, b.mem.Close())
	b.Mem = nil
	return opErr("free DMA buffer", "container", err)
}

// releaseBufferLocked unmaps b (if its mapping is still in the IOMMU) and
// frees its IOVA range; c.mu is held. The memory is freed by the caller
// after unlocking.
func (c *Container) releaseBufferLocked(b *DMABuffer) error {
	b.closed = true
	delete(c.bufs, b)
	var errs []error
	size := uint64(len(b.mem.b))
	if m, ok := c.maps[b.IOVA]; ok && c.iommu != 0 {
		errs = append(errs, c.unmapLocked(m))
	}
	if c.alloc != nil {
		errs = append(errs, c.alloc.release(b.IOVA, size))
	}
	return errors.Join(errs...)
}
