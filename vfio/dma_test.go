package vfio

import (
	"errors"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma/vfio/internal/uapi"
)

func TestAllocMemory(t *testing.T) {
	m, err := AllocMemory(100, &MemOptions{HugePages: HugeNever})
	if err != nil {
		t.Fatal(err)
	}
	b := m.Bytes()
	if len(b) != os.Getpagesize() || m.PageSize() != os.Getpagesize() {
		t.Fatalf("len %d, page %d", len(b), m.PageSize())
	}
	if slices.ContainsFunc(b, func(x byte) bool { return x != 0 }) {
		t.Fatal("memory not zeroed")
	}
	b[0], b[len(b)-1] = 1, 2
	addr := uapi.Addr(b)
	if !isMapped(t, addr) {
		t.Fatal("memory not in /proc/self/maps")
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if isMapped(t, addr) {
		t.Fatal("memory still mapped after Close")
	}
	if _, err := AllocMemory(0, nil); !errors.Is(err, ErrRange) {
		t.Fatalf("AllocMemory(0): %v", err)
	}
}

// TestAllocMemoryHuge runs whichever huge-page path this machine allows and
// says which one it ran: with free huge pages AllocMemory must use them,
// without it must fall back (HugeAuto) or explain (HugeRequired).
func TestAllocMemoryHuge(t *testing.T) {
	m, err := AllocMemory(3<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	switch m.PageSize() {
	case HugePageSize:
		t.Logf("huge pages available: 3 MiB took %d bytes of 2 MiB pages", len(m.Bytes()))
		if len(m.Bytes()) != 4<<20 || uapi.Addr(m.Bytes())%HugePageSize != 0 {
			t.Fatalf("huge allocation len %d at %#x", len(m.Bytes()), uapi.Addr(m.Bytes()))
		}
	case os.Getpagesize():
		t.Logf("no free huge pages here: HugeAuto fell back to %d-byte pages", m.PageSize())
		if len(m.Bytes()) != 3<<20 {
			t.Fatalf("fallback allocation len %d", len(m.Bytes()))
		}
		_, err := AllocMemory(4096, &MemOptions{HugePages: HugeRequired})
		if !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "nr_hugepages") {
			t.Fatalf("HugeRequired without huge pages: %v", err)
		}
	default:
		t.Fatalf("page size %d", m.PageSize())
	}
	// Small buffers never take a huge page under HugeAuto.
	s, err := AllocMemory(8192, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.PageSize() != os.Getpagesize() {
		t.Fatalf("8 KiB buffer on %d-byte pages", s.PageSize())
	}
}

// TestAllocMemoryMemlockLimit runs AllocMemory on a thread without
// CAP_IPC_LOCK under a small RLIMIT_MEMLOCK and checks the error says what
// to raise. Capabilities are per thread: the goroutine locks itself to a
// thread, drops the capability there, and never unlocks, so the thread dies
// with it.
func TestAllocMemoryMemlockLimit(t *testing.T) {
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &old); err != nil {
		t.Fatal(err)
	}
	lim := old
	lim.Cur = min(old.Cur, 64<<10)
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &lim); err != nil {
		t.Fatal(err)
	}
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
		m, err := AllocMemory(1<<20, &MemOptions{HugePages: HugeNever})
		if err == nil {
			m.Close()
			err = errors.New("AllocMemory succeeded")
		}
		done <- err
	}()
	err := <-done
	t.Log(err)
	if !errors.Is(err, ErrMemlock) || !isMemErr(err) {
		t.Fatalf("AllocMemory over the limit: %v", err)
	}
	for _, want := range []string{"RLIMIT_MEMLOCK is 65536 bytes", "ulimit -l", "CAP_IPC_LOCK", "1048576 bytes"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q lacks %q", err, want)
		}
	}
}

func TestAllocDMA(t *testing.T) {
	e := newEnv(t)
	d := e.open(t)
	c := d.Container()
	b, err := c.AllocDMA(100, &MemOptions{HugePages: HugeNever})
	if err != nil {
		t.Fatal(err)
	}
	va := uapi.Addr(b.Mem)
	if b.IOVA != defaultIOVABase || b.IOVA == va || len(b.Mem) != 4096 || b.PageSize != 4096 {
		t.Fatalf("buffer at IOVA %#x (vaddr %#x), len %d, page %d", b.IOVA, va, len(b.Mem), b.PageSize)
	}
	km := e.k.mappings()
	if m, ok := km[b.IOVA]; !ok || m.Vaddr != va || m.Size != 4096 || m.Flags != uapi.DMAMapFlagRead|uapi.DMAMapFlagWrite {
		t.Fatalf("kernel mappings %+v", km)
	}
	if got := c.Mappings(); len(got) != 1 || got[0] != (Mapping{IOVA: b.IOVA, Size: 4096, Vaddr: va}) {
		t.Fatalf("Mappings = %+v", got)
	}
	ii, _ := c.IOMMUInfo()
	if ii.DMAAvail != 65534 {
		t.Fatalf("DMAAvail = %d", ii.DMAAvail)
	}
	b2, err := c.AllocDMA(3<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b2.IOVA%uint64(b2.PageSize) != 0 || b2.IOVA <= b.IOVA {
		t.Fatalf("second buffer at %#x (page %d)", b2.IOVA, b2.PageSize)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if b.Mem != nil || isMapped(t, va) {
		t.Fatal("buffer memory still there after Close")
	}
	if _, ok := e.k.mappings()[defaultIOVABase]; ok {
		t.Fatal("kernel mapping left after Close")
	}
	// The IOVA range is reused.
	b3, err := c.AllocDMA(4096, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b3.IOVA != defaultIOVABase {
		t.Fatalf("IOVA not reused: %#x", b3.IOVA)
	}
	// Container.Close frees what is left, after closing the device and
	// before closing the group.
	va2 := uapi.Addr(b2.Mem)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	ev := e.k.events()
	iDev := slices.Index(ev, "close device "+rdmaName)
	iGrp := slices.Index(ev, "close group 5")
	iUnmap := slices.IndexFunc(ev, func(s string) bool { return strings.HasPrefix(s, "unmap") && s != "unmap 0x100000" })
	if iDev < 0 || iGrp < 0 || iUnmap < 0 || !(iDev < iUnmap && iUnmap < iGrp) {
		t.Fatalf("teardown order %q", ev)
	}
	if isMapped(t, va2) {
		t.Fatal("buffer memory still mapped after Container.Close")
	}
	if err := b2.Close(); err != nil {
		t.Fatalf("buffer Close after Container.Close: %v", err)
	}
	if _, err := c.AllocDMA(4096, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("AllocDMA after Close: %v", err)
	}
	// A hand-made buffer (upper layers' tests) closes as a no-op.
	if err := (&DMABuffer{Mem: make([]byte, 64), IOVA: 0x1000}).Close(); err != nil {
		t.Fatal(err)
	}
}

func TestMapDMA(t *testing.T) {
	e := newEnv(t)
	d := e.open(t)
	c := d.Container()
	m, err := AllocMemory(8192, &MemOptions{HugePages: HugeNever})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	iova, err := c.AllocIOVA(8192, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.MapDMA(m.Bytes(), iova); err != nil {
		t.Fatal(err)
	}
	va := uapi.Addr(m.Bytes())
	cases := map[string]struct {
		mem  []byte
		iova uint64
		want error
	}{
		"overlap":        {m.Bytes()[:4096], iova + 4096, ErrRange},
		"identity":       {m.Bytes(), va, ErrRange},
		"odd size":       {m.Bytes()[:100], 0x10000000, ErrAlignment},
		"odd vaddr":      {m.Bytes()[1 : 4096+1], 0x10000000, ErrAlignment},
		"odd IOVA":       {m.Bytes()[:4096], 0x10000001, ErrAlignment},
		"MSI window":     {m.Bytes()[:4096], 0xfee00000, ErrRange},
		"beyond IOMMU":   {m.Bytes()[:4096], 1 << 40, ErrRange},
		"wraps":          {m.Bytes()[:8192], ^uint64(0) &^ 4095, ErrRange},
		"empty":          {nil, 0x10000000, ErrAlignment},
		"unmapped IOVA?": {m.Bytes()[4096:], 0x20000000, nil},
	}
	for name, tc := range cases {
		err := c.MapDMA(tc.mem, tc.iova)
		if tc.want == nil {
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
			continue
		}
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	if err := c.UnmapDMA(0x20000000, 4096); err != nil {
		t.Fatal(err)
	}
	if err := c.UnmapDMA(iova, 4096); !errors.Is(err, ErrRange) {
		t.Fatalf("UnmapDMA with the wrong size: %v", err)
	}
	if err := c.UnmapDMA(iova, 8192); err != nil {
		t.Fatal(err)
	}
	if len(c.Mappings()) != 0 || len(e.k.mappings()) != 0 {
		t.Fatalf("mappings left: %v %v", c.Mappings(), e.k.mappings())
	}
	if err := c.FreeIOVA(iova, 8192); err != nil {
		t.Fatal(err)
	}
	if err := c.FreeIOVA(iova, 8192); !errors.Is(err, ErrRange) {
		t.Fatalf("double FreeIOVA: %v", err)
	}
	if _, err := c.AllocIOVA(100, 0); !errors.Is(err, ErrAlignment) {
		t.Fatalf("AllocIOVA(100): %v", err)
	}
	if _, err := c.AllocIOVA(4096, 3); !errors.Is(err, ErrAlignment) {
		t.Fatalf("AllocIOVA align 3: %v", err)
	}
}

func TestMapDMAKernelErrors(t *testing.T) {
	e := newEnv(t)
	d := e.open(t)
	c := d.Container()
	e.k.mapErr = unix.ENOMEM
	_, err := c.AllocDMA(4096, nil)
	if !errors.Is(err, ErrMemlock) || !errors.Is(err, unix.ENOMEM) || !strings.Contains(err.Error(), "ulimit -l") {
		t.Fatalf("AllocDMA with the kernel out of locked memory: %v", err)
	}
	e.k.mapErr = unix.ENOSPC
	if _, err := c.AllocDMA(4096, nil); !errors.Is(err, unix.ENOSPC) || !strings.Contains(err.Error(), "dma_entry_limit") {
		t.Fatalf("AllocDMA with too many mappings: %v", err)
	}
	e.k.mapErr = nil
	// Nothing leaked: the first IOVA is free again.
	b, err := c.AllocDMA(4096, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b.IOVA != defaultIOVABase {
		t.Fatalf("IOVA %#x after failed allocations", b.IOVA)
	}
}

func TestIOVAExhausted(t *testing.T) {
	e := newEnv(t)
	e.opts.IOVABase, e.opts.IOVALimit = 1<<20, 1<<20+8192
	d := e.open(t)
	c := d.Container()
	var bufs []*DMABuffer
	for range 2 {
		b, err := c.AllocDMA(4096, nil)
		if err != nil {
			t.Fatal(err)
		}
		bufs = append(bufs, b)
	}
	if _, err := c.AllocDMA(4096, nil); !errors.Is(err, ErrIOVASpace) {
		t.Fatalf("third AllocDMA: %v", err)
	}
	bufs[0].Close()
	if _, err := c.AllocDMA(4096, nil); err != nil {
		t.Fatal(err)
	}
}

func TestNoIOVARangesReported(t *testing.T) {
	e := newEnv(t)
	e.k.ranges = nil
	e.k.dmaAvail = -1
	d := e.open(t)
	ii, _ := d.Container().IOMMUInfo()
	if ii.Ranges != nil || ii.DMAAvail != -1 {
		t.Fatalf("info = %+v", ii)
	}
	// Fill everything below the MSI window; the next range starts above it.
	if iova, err := d.Container().AllocIOVA(msiWindowStart-defaultIOVABase, 0); err != nil || iova != defaultIOVABase {
		t.Fatalf("AllocIOVA below the MSI window = %#x, %v", iova, err)
	}
	if iova, err := d.Container().AllocIOVA(4096, 0); err != nil || iova != msiWindowEnd+1 {
		t.Fatalf("AllocIOVA after the MSI window = %#x, %v", iova, err)
	}
}

func TestLastGroupClosedDropsMappings(t *testing.T) {
	e := newEnv(t)
	c, err := OpenContainer(e.opts)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	g, err := c.OpenGroup(5)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.AllocDMA(4096, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if len(c.Mappings()) != 0 {
		t.Fatalf("mappings after the last group left: %v", c.Mappings())
	}
	if err := b.Close(); err != nil {
		t.Fatalf("buffer Close after its IOMMU went away: %v", err)
	}
	if err := c.MapDMA(make([]byte, 4096), 1<<20); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("MapDMA without an IOMMU: %v", err)
	}
	// Attaching a group again sets the IOMMU again.
	if _, err := c.OpenGroup(5); err != nil {
		t.Fatal(err)
	}
	b, err = c.AllocDMA(4096, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b.IOVA != defaultIOVABase {
		t.Fatalf("IOVA %#x", b.IOVA)
	}
}

func TestConcurrentDMA(t *testing.T) {
	e := newEnv(t)
	d := e.open(t)
	c := d.Container()
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				b, err := c.AllocDMA(4096, nil)
				if err != nil {
					t.Error(err)
					return
				}
				b.Mem[0] = 1
				if err := b.Close(); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(c.Mappings()) != 0 {
		t.Fatalf("mappings left: %v", c.Mappings())
	}
}
