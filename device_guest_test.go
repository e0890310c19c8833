//go:build guest

package vfrdma

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/qemu/proto"
	"github.com/vfrdma/vfrdma/vfio"
)

// guestBDF returns the pvrdma function the bench's init bound to vfio-pci.
func guestBDF(t testing.TB) string {
	t.Helper()
	if os.Getenv(proto.EnvGuest) != "1" {
		t.Skip("in-guest test: run it on the bench with `go run ./cmd/pvvm -test .` (or `make test`)")
	}
	bdf := os.Getenv(proto.EnvBDF)
	if bdf == "" {
		t.Fatalf("%s is not set: the bench's init did not find the pvrdma function", proto.EnvBDF)
	}
	return bdf
}

func openGuest(t testing.TB) *Device {
	t.Helper()
	d, err := Open(guestBDF(t), nil)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// The bring-up path end to end: caps read and validated, port queried, the
// default GID bound, a PD and a CQ created and destroyed, Close.
func TestDeviceBringUp(t *testing.T) {
	d := openGuest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	c := d.Caps()
	t.Logf("version %d, fw %s, node GUID %016x, quirks %+v", d.Version(), c.FWVersion(), c.NodeGUID, d.Quirks())
	if d.Version() != 17 || c.FWVer != 14 {
		t.Errorf("version %d fw_ver %d; QEMU 7.2 reports 17 and 14", d.Version(), c.FWVer)
	}
	if c.MaxQP != 1024 || c.MaxSGE != 4 || c.MaxCQ != 2048 || c.MaxPD != 1024 || c.GIDTblLen != 255 || c.PhysPortCnt != 1 {
		t.Errorf("caps %+v: want max_qp 1024, max_sge 4, max_cq 2048, max_pd 1024, gid_tbl_len 255, one port", c)
	}
	if !d.Quirks().Emulated || !d.Quirks().CQArmBoth || !d.Quirks().NoAsyncEvents {
		t.Errorf("quirks %+v: QEMU's should be detected", d.Quirks())
	}
	// The modified EUI-64 of the vmxnet3 MAC 52:54:00:12:34:56: ff:fe in
	// the middle, the universal/local bit (0x02 of the first byte) flipped.
	if c.NodeGUID != 0x505400fffe123456 {
		t.Errorf("node GUID %016x: want 505400fffe123456, the EUI-64 of the vmxnet3 MAC 52:54:00:12:34:56", c.NodeGUID)
	}

	port, err := d.QueryPort(ctx)
	if err != nil {
		t.Fatalf("QueryPort: %v", err)
	}
	t.Logf("port 1: %+v", port)
	if port.GIDTblLen == 0 || port.MaxMTU == 0 {
		t.Errorf("port attributes %+v look empty", port)
	}

	gid := d.GID()
	if gid.String() != "fe80::5054:ff:fe12:3456" {
		t.Errorf("default GID %s, want fe80::5054:ff:fe12:3456", gid)
	}
	if g := d.GIDs(); g[0] != gid {
		t.Errorf("GID table %v, want the default GID at 0", g)
	}
	// A second GID, then gone again.
	other := gid
	other[15]++
	if err := d.BindGID(ctx, 1, other); err != nil {
		t.Fatalf("BindGID 1: %v", err)
	}
	if err := d.UnbindGID(ctx, 1); err != nil {
		t.Fatalf("UnbindGID 1: %v", err)
	}
	if err := d.BindGID(ctx, 300, other); !errors.Is(err, ErrInvalid) {
		t.Errorf("BindGID past the table: %v, want ErrInvalid", err)
	}

	pd, err := d.AllocPD(ctx)
	if err != nil {
		t.Fatalf("AllocPD: %v", err)
	}
	cqs := make([]*CQ, 0, 3)
	for _, n := range []int{1, 100, 4096} {
		cq, err := d.CreateCQ(ctx, n)
		if err != nil {
			t.Fatalf("CreateCQ(%d): %v", n, err)
		}
		if cq.Entries() < n || cq.Entries()&(cq.Entries()-1) != 0 {
			t.Errorf("CreateCQ(%d) holds %d entries", n, cq.Entries())
		}
		cqs = append(cqs, cq)
	}
	if _, err := d.CreateCQ(ctx, 5000); !errors.Is(err, ErrInvalid) {
		t.Errorf("CreateCQ(5000): %v, want ErrInvalid (the device holds at most 4096)", err)
	}
	for _, cq := range cqs {
		if err := cq.Close(); err != nil {
			t.Fatalf("CQ close: %v", err)
		}
		if err := cq.Close(); err != nil {
			t.Fatalf("second CQ close: %v", err)
		}
	}
	if err := pd.Close(); err != nil {
		t.Fatalf("PD close: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := d.AllocPD(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("AllocPD after Close: %v, want ErrClosed", err)
	}
}

// The device raises MSI-X vector 0 for every command it answers.
func TestCommandInterrupt(t *testing.T) {
	d := openGuest(t)
	v := d.vectors[firmware.VectorResponse].(*vfio.Vector)
	if _, err := v.Poll(); err != nil { // drop what Open's commands raised
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if _, err := d.QueryPort(ctx); err != nil {
			cancel()
			t.Fatal(err)
		}
		n, err := v.Wait(ctx)
		cancel()
		if err != nil {
			t.Fatalf("command %d: no vector-0 interrupt: %v", i, err)
		}
		if n < 1 {
			t.Fatalf("command %d: interrupt count %d", i, n)
		}
	}
}

type usage struct {
	fds, maps int // open fds, all mappings
	vfioMaps  int // mappings of VFIO device files (BARs)
	lockedKB  int // pinned memory (DMA buffers)
}

func measure(t *testing.T) usage {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	u := usage{fds: len(ents), maps: strings.Count(string(maps), "\n")}
	for _, l := range strings.Split(string(maps), "\n") {
		if strings.Contains(l, "vfio") {
			u.vfioMaps++
		}
	}
	for _, l := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(l, "VmLck:") {
			fmt.Sscanf(strings.TrimPrefix(l, "VmLck:"), "%d", &u.lockedKB)
		}
	}
	return u
}

// 200 open/close cycles, each creating and leaving a PD and a CQ for Close,
// leak no fd, mapping or pinned memory.
func TestOpenCloseCycles(t *testing.T) {
	bdf := guestBDF(t)
	ctx := context.Background()
	cycle := func() {
		d, err := Open(bdf, nil)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		if _, err := d.AllocPD(ctx); err != nil {
			t.Fatalf("AllocPD: %v", err)
		}
		if _, err := d.CreateCQ(ctx, 64); err != nil {
			t.Fatalf("CreateCQ: %v", err)
		}
		if err := d.Close(); err != nil { // destroys the PD and the CQ
			t.Fatalf("Close: %v", err)
		}
	}
	cycle() // warm up: lazily opened runtime files
	before := measure(t)
	start := time.Now()
	const cycles = 200
	for i := 0; i < cycles; i++ {
		cycle()
	}
	after := measure(t)
	t.Logf("%d cycles in %v (%v each); before %+v after %+v", cycles, time.Since(start), time.Since(start)/cycles, before, after)
	// Every cycle maps two BARs and pins several DMA buffers, so a leak
	// shows as hundreds; the Go runtime's own mappings may grow by a few.
	if after.fds != before.fds || after.vfioMaps != before.vfioMaps || after.lockedKB != before.lockedKB || after.maps > before.maps+cycles/20 {
		t.Fatalf("leak over %d cycles: before %+v, after %+v", cycles, before, after)
	}
	if _, err := os.Stat(journalPath(DefaultStateDir, bdf)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("journal left behind after clean closes: %v", err)
	}
}

const holderEnv = "VFRDMA_TEST_HOLDER"

// TestMain runs the test binary as the holder child of TestRecoverAfterKill,
// or as a lifecycle scenario's child, when asked to.
func TestMain(m *testing.M) {
	if os.Getenv(holderEnv) == "1" {
		holder()
	}
	if name := os.Getenv(scenarioEnv); name != "" {
		runScenario(name)
	}
	os.Exit(m.Run())
}

// holder opens the device, creates objects, says so, and waits to be killed.
func holder() {
	d, err := Open(os.Getenv(proto.EnvBDF), nil)
	if err != nil {
		fmt.Println("holder: open:", err)
		os.Exit(3)
	}
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		if _, err := d.AllocPD(ctx); err != nil {
			fmt.Println("holder: pd:", err)
			os.Exit(3)
		}
		if _, err := d.CreateCQ(ctx, 256); err != nil {
			fmt.Println("holder: cq:", err)
			os.Exit(3)
		}
	}
	fmt.Println("holder: ready")
	time.Sleep(time.Minute)
	os.Exit(4)
}

// A process holding the device is killed mid-session: the next Open
// destroys what it left and the device works as before.
func TestRecoverAfterKill(t *testing.T) {
	bdf := guestBDF(t)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), holderEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		ok := false
		for sc.Scan() {
			t.Logf("child: %s", sc.Text())
			if sc.Text() == "holder: ready" && !ok {
				ok = true
				ready <- true
			}
		}
		if !ok {
			ready <- false
		}
	}()
	select {
	case ok := <-ready:
		if !ok {
			cmd.Wait()
			t.Fatal("the holder died before it was ready")
		}
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatal("the holder never got ready")
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	d, err := Open(bdf, nil)
	if err != nil {
		t.Fatalf("Open after the holder was killed: %v", err)
	}
	defer d.Close()
	// Two PDs, two CQs and the default GID binding.
	if d.Recovered() != 5 {
		t.Errorf("recovered %d leftover objects, want 5", d.Recovered())
	}
	ctx := context.Background()
	if _, err := d.QueryPort(ctx); err != nil {
		t.Fatalf("QueryPort: %v", err)
	}
	cq, err := d.CreateCQ(ctx, 256)
	if err != nil {
		t.Fatalf("CreateCQ after recovery: %v", err)
	}
	if err := cq.Close(); err != nil {
		t.Fatal(err)
	}
}
