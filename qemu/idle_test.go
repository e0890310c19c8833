package qemu

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeQEMUEnv, in a process's environment, makes the test binary stand in
// for QEMU (fakeQEMUMain) instead of running the tests.
const fakeQEMUEnv = "VFRDMA_TEST_FAKE_QEMU"

// fakeQEMUUp is the console line the stand-in prints once it is connected
// and its frames have crossed both switches.
const fakeQEMUUp = "fake-qemu: connected"

func TestMain(m *testing.M) {
	if os.Getenv(fakeQEMUEnv) != "" {
		os.Exit(fakeQEMUMain(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// fakeQEMUMain is a stand-in for qemu-system-x86_64 that uses every host
// end the bench gives a VM: it connects to each socket its arguments name
// (the two switches' stream netdevs, the MAD mux, the control channel),
// sends a broadcast frame into each switch and reads the other VM's, prints
// fakeQEMUUp on its console (stdout), and then waits to be killed.
func fakeQEMUMain(args []string) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "fake qemu:", err)
		return 1
	}
	var conns []net.Conn
	var nics []net.Conn
	for i := 0; i+1 < len(args); i++ {
		if args[i] != "-netdev" && args[i] != "-chardev" {
			continue
		}
		path := ""
		for _, kv := range strings.Split(args[i+1], ",") {
			if p, ok := strings.CutPrefix(kv, "addr.path="); ok {
				path = p
			} else if p, ok := strings.CutPrefix(kv, "path="); ok {
				path = p
			}
		}
		if path == "" {
			continue
		}
		c, err := net.Dial("unix", path)
		if err != nil {
			return fail(err)
		}
		conns = append(conns, c)
		if args[i] == "-netdev" {
			nics = append(nics, c)
		}
	}
	frame := make([]byte, 4+60)
	binary.BigEndian.PutUint32(frame, 60)
	copy(frame[4:10], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(frame[10:16], []byte{0x52, 0x54, 0, 0xfa, 0x4e, byte(os.Getpid())})
	// A broadcast into each switch, again every 50 ms until the other
	// VM's has come (the switch floods only to the ports it has), then
	// once more for the other VM, in case it came after this one's last.
	in := make([]byte, len(frame))
	for _, c := range nics {
		for {
			if _, err := c.Write(frame); err != nil {
				return fail(err)
			}
			if err := c.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
				return fail(err)
			}
			_, err := io.ReadFull(c, in)
			if err == nil {
				break
			}
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				return fail(err)
			}
		}
		if _, err := c.Write(frame); err != nil {
			return fail(err)
		}
	}
	fmt.Println(fakeQEMUUp)
	time.Sleep(10 * time.Minute) // the bench kills it
	runtime.KeepAlive(conns)
	return 0
}

// usage is what this process has used so far: CPU time and context
// switches, over all its threads.
type usage struct {
	cpu      time.Duration
	switches int64
}

func selfUsage(t *testing.T) usage {
	t.Helper()
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return usage{
		cpu:      time.Duration(ru.Utime.Nano() + ru.Stime.Nano()),
		switches: ru.Nvcsw + ru.Nivcsw,
	}
}

// While its guests run, the bench's host side (the two switches, the MAD
// mux, the control channels, the console and stderr readers) waits in
// blocking reads: over an idle second it uses no CPU to speak of and
// hardly wakes. A goroutine that polled (a read deadline in a loop, a
// spin) would wake hundreds of times a second or burn CPU, and take it
// from the VMs' vCPU threads on a small host.
func TestTheBenchSleepsWhileItsGuestsRun(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the bench checks it runs as root: run as root")
	}
	self, err := os.Executable()
	require.NoError(t, err)
	t.Setenv(fakeQEMUEnv, "1")
	dir := t.TempDir()
	for _, name := range []string{"vmlinuz", "initrd", "backend/libibverbs.so.1"} {
		p := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, nil, 0o644))
	}
	const vms = 2
	var mu sync.Mutex
	up := 0
	allUp := make(chan struct{})
	opt := &Options{
		QEMU: self, BackendDir: filepath.Join(dir, "backend"),
		Kernel: filepath.Join(dir, "vmlinuz"), Initrd: filepath.Join(dir, "initrd"),
		Timeout: 5 * time.Minute, Log: discard(),
		OnConsole: func(vm int, line string) {
			if line != fakeQEMUUp {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if up++; up == vms {
				close(allUp)
			}
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan *Result, 1)
	go func() {
		res, err := Run(ctx, vms, opt)
		assert.NoError(t, err)
		done <- res
	}()
	select {
	case <-allUp:
	case res := <-done:
		cancel()
		require.FailNow(t, "the run ended before both stand-ins connected", "%s", describeRun(res))
	case <-time.After(time.Minute): // a bound for a hang, not a speed test
		cancel()
		require.FailNow(t, "the stand-in QEMUs did not connect within a minute", "%s", describeRun(<-done))
	}

	// What the set-up left to do (a GC cycle, the heap's scavenging) is
	// done before the window opens.
	debug.FreeOSMemory()
	const window = time.Second
	before := selfUsage(t)
	time.Sleep(window)
	after := selfUsage(t)
	cancel()
	<-done

	cpu, switches := after.cpu-before.cpu, after.switches-before.switches
	t.Logf("over %v with both VMs up: %v CPU, %d context switches", window, cpu, switches)
	// Idle, the process wakes for the test's own sleep and little else
	// (measured: 4-24 switches and under 1 ms of CPU, under -race too).
	// A switch port read with a 1 ms deadline in a loop made 4 262 and
	// 90 ms; a VM's wait polled every 2 ms, 1 956.
	assert.Less(t, switches, int64(200), "context switches over %v while the guests run", window)
	assert.Less(t, cpu, 50*time.Millisecond, "CPU time over %v while the guests run", window)
}

// describeRun says how each VM of a run ended, with its stand-in's stderr.
func describeRun(res *Result) string {
	if res == nil {
		return "no result"
	}
	var b strings.Builder
	for _, v := range res.VMs {
		fmt.Fprintf(&b, "vm%d: %v; stderr %q\n", v.Index, v.Err, v.Stderr)
	}
	return b.String()
}
