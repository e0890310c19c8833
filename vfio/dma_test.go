package vfio_test

import (
	"errors"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma/vfio"
	"github.com/vfrdma/vfrdma/vfio/internal/uapi"
	"github.com/vfrdma/vfrdma/vfio/vfiotest"
)

func TestAllocMemory(t *testing.T) {
	m, err := vfio.AllocMemory(100, &vfio.MemOptions{HugePages: vfio.HugeNever})
	require.NoError(t, err)
	b := m.Bytes()
	require.Len(t, b, os.Getpagesize())
	require.Equal(t, os.Getpagesize(), m.PageSize())
	require.False(t, slices.ContainsFunc(b, func(x byte) bool { return x != 0 }), "memory not zeroed")
	b[0], b[len(b)-1] = 1, 2
	addr := uapi.Addr(b)
	require.True(t, isMapped(t, addr), "memory not in /proc/self/maps")
	require.NoError(t, m.Close())
	require.NoError(t, m.Close(), "second Close")
	require.False(t, isMapped(t, addr), "memory still mapped after Close")
	_, err = vfio.AllocMemory(0, nil)
	require.ErrorIs(t, err, vfio.ErrRange, "AllocMemory(0)")
}

// TestAllocMemoryHuge runs whichever huge-page path this machine allows and
// says which one it ran: with free huge pages AllocMemory must use them,
// without it must fall back (HugeAuto) or explain (HugeRequired).
func TestAllocMemoryHuge(t *testing.T) {
	m, err := vfio.AllocMemory(3<<20, nil)
	require.NoError(t, err)
	defer m.Close()
	switch m.PageSize() {
	case vfio.HugePageSize:
		t.Logf("huge pages available: 3 MiB took %d bytes of 2 MiB pages", len(m.Bytes()))
		require.Len(t, m.Bytes(), 4<<20, "huge allocation")
		require.Zero(t, uapi.Addr(m.Bytes())%vfio.HugePageSize, "huge allocation's alignment")
	case os.Getpagesize():
		t.Logf("no free huge pages here: HugeAuto fell back to %d-byte pages", m.PageSize())
		require.Len(t, m.Bytes(), 3<<20, "fallback allocation")
		_, err := vfio.AllocMemory(4096, &vfio.MemOptions{HugePages: vfio.HugeRequired})
		require.ErrorIs(t, err, vfio.ErrNotSupported, "HugeRequired without huge pages")
		require.ErrorContains(t, err, "nr_hugepages")
	default:
		t.Fatalf("page size %d", m.PageSize())
	}
	// Small buffers never take a huge page under HugeAuto.
	s, err := vfio.AllocMemory(8192, nil)
	require.NoError(t, err)
	defer s.Close()
	require.Equal(t, os.Getpagesize(), s.PageSize(), "8 KiB buffer's pages")
}

// TestAllocMemoryMemlockLimit runs AllocMemory on a thread without
// CAP_IPC_LOCK under a small RLIMIT_MEMLOCK and checks the error says what
// to raise. Capabilities are per thread: the goroutine locks itself to a
// thread, drops the capability there, and never unlocks, so the thread dies
// with it.
func TestAllocMemoryMemlockLimit(t *testing.T) {
	var old unix.Rlimit
	require.NoError(t, unix.Getrlimit(unix.RLIMIT_MEMLOCK, &old))
	lim := old
	lim.Cur = min(old.Cur, 64<<10)
	require.NoError(t, unix.Setrlimit(unix.RLIMIT_MEMLOCK, &lim))
	defer unix.Setrlimit(unix.RLIMIT_MEMLOCK, &old)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see above
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			done <- err
			return
		}
		data[0].Effective &^= 1 << unix.CAP_IPC_LOCK
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			done <- err
			return
		}
		m, err := vfio.AllocMemory(1<<20, &vfio.MemOptions{HugePages: vfio.HugeNever})
		if err == nil {
			m.Close()
			err = errors.New("AllocMemory succeeded")
		}
		done <- err
	}()
	err := <-done
	t.Log(err)
	require.ErrorIs(t, err, vfio.ErrMemlock, "AllocMemory over the limit")
	// The errno under it is the one mmap or mlock gave.
	require.True(t, errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EPERM), "errno of %v", err)
	for _, want := range []string{"RLIMIT_MEMLOCK is 65536 bytes", "ulimit -l", "CAP_IPC_LOCK", "1048576 bytes"} {
		assert.ErrorContains(t, err, want)
	}
}

func TestAllocDMA(t *testing.T) { forPaths(t, testAllocDMA) }

func testAllocDMA(t *testing.T, p vfio.Path) {
	e := newEnvOn(t, p)
	d := e.open(t)
	c := d.Container()
	b, err := c.AllocDMA(100, &vfio.MemOptions{HugePages: vfio.HugeNever})
	require.NoError(t, err)
	va := uapi.Addr(b.Mem)
	require.Equal(t, uint64(iovaBase), b.IOVA, "the first IOVA")
	require.NotEqual(t, va, b.IOVA, "IOVA = vaddr")
	require.Len(t, b.Mem, 4096)
	require.Equal(t, 4096, b.PageSize)
	km := e.k.DMAMappings()
	require.Equal(t, vfiotest.DMAMapping{IOVA: b.IOVA, Size: 4096, Vaddr: va, Read: true, Write: true}, km[b.IOVA], "kernel mappings %+v", km)
	require.Equal(t, []vfio.Mapping{{IOVA: b.IOVA, Size: 4096, Vaddr: va}}, c.Mappings())
	ii, _ := c.IOMMUInfo()
	if p == vfio.PathGroup {
		require.Equal(t, 65534, ii.DMAAvail, "type1's mapping budget, one spent")
	} else {
		require.Equal(t, -1, ii.DMAAvail, "iommufd reports no mapping budget")
	}
	b2, err := c.AllocDMA(3<<20, nil)
	require.NoError(t, err)
	require.Zero(t, b2.IOVA%uint64(b2.PageSize), "second buffer at %#x (page %d)", b2.IOVA, b2.PageSize)
	require.Greater(t, b2.IOVA, b.IOVA, "second buffer")
	require.NoError(t, b.Close())
	require.NoError(t, b.Close(), "second Close")
	require.Nil(t, b.Mem, "buffer memory after Close")
	require.False(t, isMapped(t, va), "buffer memory still mapped after Close")
	require.NotContains(t, e.k.DMAMappings(), uint64(iovaBase), "kernel mapping left after Close")
	// The IOVA range is reused.
	b3, err := c.AllocDMA(4096, nil)
	require.NoError(t, err)
	require.Equal(t, uint64(iovaBase), b3.IOVA, "IOVA not reused")
	// Container.Close frees what is left, after closing the device and
	// before closing the group (on the cdev path: destroying the IOAS).
	va2 := uapi.Addr(b2.Mem)
	require.NoError(t, d.Close())
	ev := e.k.Events()
	iDev := slices.Index(ev, "close device "+rdmaName)
	last := "close group 5"
	if p == vfio.PathCDev {
		last = "destroy IOAS 1"
	}
	iGrp := slices.Index(ev, last)
	iUnmap := slices.IndexFunc(ev, func(s string) bool { return strings.HasPrefix(s, "unmap") && s != "unmap 0x100000" })
	if iDev < 0 || iGrp < 0 || iUnmap < 0 || !(iDev < iUnmap && iUnmap < iGrp) {
		t.Fatalf("teardown order %q", ev)
	}
	require.False(t, isMapped(t, va2), "buffer memory still mapped after Container.Close")
	require.NoError(t, b2.Close(), "buffer Close after Container.Close")
	_, err = c.AllocDMA(4096, nil)
	require.ErrorIs(t, err, vfio.ErrClosed, "AllocDMA after Close")
	// A hand-made buffer (upper layers' tests) closes as a no-op.
	require.NoError(t, (&vfio.DMABuffer{Mem: make([]byte, 64), IOVA: 0x1000}).Close())
}

func TestMapDMA(t *testing.T) { forPaths(t, testMapDMA) }

func testMapDMA(t *testing.T, p vfio.Path) {
	e := newEnvOn(t, p)
	d := e.open(t)
	c := d.Container()
	m, err := vfio.AllocMemory(8192, &vfio.MemOptions{HugePages: vfio.HugeNever})
	require.NoError(t, err)
	defer m.Close()
	iova, err := c.AllocIOVA(8192, 0)
	require.NoError(t, err)
	require.NoError(t, c.MapDMA(m.Bytes(), iova))
	va := uapi.Addr(m.Bytes())
	cases := map[string]struct {
		mem  []byte
		iova uint64
		want error
	}{
		"overlap":        {m.Bytes()[:4096], iova + 4096, vfio.ErrRange},
		"identity":       {m.Bytes(), va, vfio.ErrRange},
		"odd size":       {m.Bytes()[:100], 0x10000000, vfio.ErrAlignment},
		"odd vaddr":      {m.Bytes()[1 : 4096+1], 0x10000000, vfio.ErrAlignment},
		"odd IOVA":       {m.Bytes()[:4096], 0x10000001, vfio.ErrAlignment},
		"MSI window":     {m.Bytes()[:4096], 0xfee00000, vfio.ErrRange},
		"beyond IOMMU":   {m.Bytes()[:4096], 1 << 40, vfio.ErrRange},
		"wraps":          {m.Bytes()[:8192], ^uint64(0) &^ 4095, vfio.ErrRange},
		"empty":          {nil, 0x10000000, vfio.ErrAlignment},
		"unmapped IOVA?": {m.Bytes()[4096:], 0x20000000, nil},
	}
	for name, tc := range cases {
		err := c.MapDMA(tc.mem, tc.iova)
		if tc.want == nil {
			assert.NoError(t, err, name)
			continue
		}
		assert.ErrorIs(t, err, tc.want, name)
	}
	require.NoError(t, c.UnmapDMA(0x20000000, 4096))
	require.ErrorIs(t, c.UnmapDMA(iova, 4096), vfio.ErrRange, "UnmapDMA with the wrong size")
	require.NoError(t, c.UnmapDMA(iova, 8192))
	require.Empty(t, c.Mappings(), "mappings left")
	require.Empty(t, e.k.DMAMappings(), "kernel mappings left")
	require.NoError(t, c.FreeIOVA(iova, 8192))
	require.ErrorIs(t, c.FreeIOVA(iova, 8192), vfio.ErrRange, "double FreeIOVA")
	_, err = c.AllocIOVA(100, 0)
	require.ErrorIs(t, err, vfio.ErrAlignment, "AllocIOVA(100)")
	_, err = c.AllocIOVA(4096, 3)
	require.ErrorIs(t, err, vfio.ErrAlignment, "AllocIOVA align 3")
}

func TestMapDMAKernelErrors(t *testing.T) {
	e := newEnv(t)
	d := e.open(t)
	c := d.Container()
	e.k.Fail(vfiotest.IoctlMapDMA, unix.ENOMEM)
	_, err := c.AllocDMA(4096, nil)
	require.ErrorIs(t, err, vfio.ErrMemlock, "AllocDMA with the kernel out of locked memory")
	require.ErrorIs(t, err, unix.ENOMEM)
	require.ErrorContains(t, err, "ulimit -l")
	e.k.Fail(vfiotest.IoctlMapDMA, unix.ENOSPC)
	_, err = c.AllocDMA(4096, nil)
	require.ErrorIs(t, err, unix.ENOSPC, "AllocDMA with too many mappings")
	require.ErrorContains(t, err, "dma_entry_limit")
	e.k.Fail(vfiotest.IoctlMapDMA, nil)
	// Nothing leaked: the first IOVA is free again.
	b, err := c.AllocDMA(4096, nil)
	require.NoError(t, err)
	require.Equal(t, uint64(iovaBase), b.IOVA, "IOVA after failed allocations")
}

func TestUnmapDMAKernelError(t *testing.T) { forPaths(t, testUnmapDMAKernelError) }

func testUnmapDMAKernelError(t *testing.T, p vfio.Path) {
	e := newEnvOn(t, p)
	d := e.open(t)
	c := d.Container()
	b, err := c.AllocDMA(4096, nil)
	require.NoError(t, err)
	e.k.Fail(vfiotest.IoctlUnmapDMA, unix.EIO)
	require.ErrorIs(t, b.Close(), unix.EIO, "a DMA buffer's Close the kernel refuses")
	e.k.Fail(vfiotest.IoctlUnmapDMA, nil)
	require.NotEmpty(t, e.k.DMAMappings(), "the kernel kept the mapping")
}

func TestIOVAExhausted(t *testing.T) { forPaths(t, testIOVAExhausted) }

func testIOVAExhausted(t *testing.T, p vfio.Path) {
	e := newEnvOn(t, p)
	e.opts.IOVABase, e.opts.IOVALimit = 1<<20, 1<<20+8192
	d := e.open(t)
	c := d.Container()
	var bufs []*vfio.DMABuffer
	for range 2 {
		b, err := c.AllocDMA(4096, nil)
		require.NoError(t, err)
		bufs = append(bufs, b)
	}
	_, err := c.AllocDMA(4096, nil)
	require.ErrorIs(t, err, vfio.ErrIOVASpace, "third AllocDMA")
	bufs[0].Close()
	_, err = c.AllocDMA(4096, nil)
	require.NoError(t, err)
}

func TestNoIOVARangesReported(t *testing.T) {
	e := newEnv(t)
	iommu := vfiotest.QEMUGuestIOMMU()
	iommu.Ranges, iommu.DMAAvail = nil, -1
	e.k.SetIOMMU(iommu)
	d := e.open(t)
	ii, _ := d.Container().IOMMUInfo()
	require.Nil(t, ii.Ranges)
	require.Equal(t, -1, ii.DMAAvail)
	// Fill everything below the MSI window; the next range starts above it.
	iova, err := d.Container().AllocIOVA(msiWindowStart-iovaBase, 0)
	require.NoError(t, err)
	require.Equal(t, uint64(iovaBase), iova, "AllocIOVA below the MSI window")
	iova, err = d.Container().AllocIOVA(4096, 0)
	require.NoError(t, err)
	require.Equal(t, uint64(msiWindowEnd+1), iova, "AllocIOVA after the MSI window")
}

func TestLastGroupClosedDropsMappings(t *testing.T) {
	e := newEnv(t)
	c, err := vfio.OpenContainer(e.opts)
	require.NoError(t, err)
	defer c.Close()
	g, err := c.OpenGroup(5)
	require.NoError(t, err)
	b, err := c.AllocDMA(4096, nil)
	require.NoError(t, err)
	require.NoError(t, g.Close())
	require.Empty(t, c.Mappings(), "mappings after the last group left")
	require.NoError(t, b.Close(), "buffer Close after its IOMMU went away")
	require.ErrorIs(t, c.MapDMA(make([]byte, 4096), 1<<20), vfio.ErrNotSupported, "MapDMA without an IOMMU")
	// Attaching a group again sets the IOMMU again.
	_, err = c.OpenGroup(5)
	require.NoError(t, err)
	b, err = c.AllocDMA(4096, nil)
	require.NoError(t, err)
	require.Equal(t, uint64(iovaBase), b.IOVA)
}

func TestConcurrentDMA(t *testing.T) { forPaths(t, testConcurrentDMA) }

func testConcurrentDMA(t *testing.T, p vfio.Path) {
	e := newEnvOn(t, p)
	d := e.open(t)
	c := d.Container()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 20 {
				b, err := c.AllocDMA(4096, nil)
				if !assert.NoError(t, err) {
					return
				}
				b.Mem[0] = 1
				if !assert.NoError(t, b.Close()) {
					return
				}
			}
		})
	}
	wg.Wait()
	require.Empty(t, c.Mappings(), "mappings left")
}

// A buffer made by NewDMABuffer (a device model's memory) calls its
// release function once: Close is idempotent, and a second or third Close
// returns nil without releasing again.
func TestNewDMABufferCloseReleasesOnceThoughCalledAgain(t *testing.T) {
	calls := 0
	failure := errors.New("the model's release failed")
	b := vfio.NewDMABuffer(make([]byte, 4096), 0x100000, 4096, func() error { calls++; return failure })
	assert.ErrorIs(t, b.Close(), failure, "the first Close returns the release's error")
	assert.Nil(t, b.Mem, "the memory is the buffer's no more")
	assert.NoError(t, b.Close())
	assert.NoError(t, b.Close())
	assert.Equal(t, 1, calls)
}
