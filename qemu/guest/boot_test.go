//go:build bench

package guest

// TestBootQEMU boots the initramfs in a real QEMU guest (TCG), end to end.
// It starts VMs, so it is not in the host tier: it runs with the bench tag
// (`go test -tags bench ./qemu/...`, the guest tier of `make test`), and
// there a missing qemu-system-x86_64 or guest kernel cache is a failure
// that says what to install.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/qemu/proto"
)

// bootLimit bounds one VM run, from QEMU start to its exit.
const bootLimit = 60 * time.Second

func TestBootQEMU(t *testing.T) {
	qemu, err := exec.LookPath("qemu-system-x86_64")
	require.NoError(t, err, "run `make setup` (Debian package qemu-system-x86)")
	root := repoRoot(t)
	k, err := FindKernel(root)
	require.NoError(t, err, "the guest kernel cache (make setup fetches it)")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	dir := t.TempDir()
	t0 := time.Now()
	if k.Vmlinux == "" {
		// Leave the shared cache alone: extract into this test's directory.
		kk := *k
		kk.Dir = dir
		if err := ExtractVmlinux(ctx, &kk); err != nil {
			t.Logf("booting vmlinuz: %v", err)
		} else {
			k = &kk
			t.Logf("extracted vmlinux in %v", time.Since(t0).Round(time.Millisecond))
		}
	}
	t0 = time.Now()
	bins := map[string]string{"init": filepath.Join(dir, "init"), "smoke": filepath.Join(dir, "smoke.test"), "cmd": filepath.Join(dir, "smokecmd")}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	wg.Go(func() { errs[0] = BuildInit(ctx, root, bins["init"]) })
	wg.Go(func() { errs[1] = BuildTestBinary(ctx, "testdata/smoke", bins["smoke"]) })
	wg.Go(func() { errs[2] = BuildProgram(ctx, "./testdata/smokecmd", bins["cmd"]) })
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	t.Logf("built the init and programs in %v", time.Since(t0).Round(time.Millisecond))

	t.Run("programs", func(t *testing.T) {
		t.Parallel()
		img := filepath.Join(dir, "programs.cpio")
		t0 := time.Now()
		err := WriteInitramfs(img, Spec{
			Init:   bins["init"],
			Kernel: k,
			Programs: []Program{
				{Name: "smoke.test", HostPath: bins["smoke"], Kind: KindGoTest, Env: []string{"WANT_VM=1", "WANT_VMS=2"}, Timeout: 20 * time.Second},
				{Name: "smokecmd", HostPath: bins["cmd"], Kind: KindCmd, Args: []string{"a", "b"}, Timeout: 5 * time.Second},
			},
		})
		require.NoError(t, err)
		st, _ := os.Stat(img)
		t.Logf("initramfs: %d KiB in %v", st.Size()>>10, time.Since(t0).Round(time.Millisecond))

		recs := boot(t, qemu, k, img, 1, 2, map[string]string{"host/key": "hello from the host"}, map[string]string{"smoke/key": "hello from the guest"})
		var tests []string
		var exits []string
		var sawCmdLine bool
		for _, r := range recs {
			switch r.Event {
			case proto.EventTest:
				tests = append(tests, r.Test+":"+r.Status)
			case proto.EventExit:
				exits = append(exits, fmt.Sprintf("%s:%d", r.Prog, r.Code))
			case proto.EventOut:
				sawCmdLine = sawCmdLine || (r.Prog == "smokecmd" && r.Line == "smokecmd: a b")
			case proto.EventError:
				assert.Fail(t, "init error", r.Msg)
			}
		}
		want := "TestEnv:pass TestModules:pass TestIOMMU:pass TestControl:pass TestSkipped:pass TestSkipped/sub:skip"
		assert.Equal(t, want, strings.Join(tests, " "), "tests")
		assert.Equal(t, "smoke.test:0 smokecmd:0", strings.Join(exits, " "), "exits")
		assert.True(t, sawCmdLine, "no output line from smokecmd")
		assert.Zero(t, recs[len(recs)-1].Code, "done %+v", recs[len(recs)-1])
	})

	// Binding without a pvrdma device must fail clearly, and the programs
	// must be reported as not run.
	t.Run("bind without device", func(t *testing.T) {
		t.Parallel()
		img := filepath.Join(dir, "bind.cpio")
		err := WriteInitramfs(img, Spec{
			Init: bins["init"], Kernel: k, BindPVRDMA: true,
			Programs: []Program{{Name: "smokecmd", HostPath: bins["cmd"], Kind: KindCmd}},
		})
		require.NoError(t, err)
		recs := boot(t, qemu, k, img, 0, 1, nil, nil)
		var got []string
		for _, r := range recs {
			if r.Event != proto.EventOut {
				got = append(got, r.Event)
			}
		}
		require.Equal(t, "error exit done", strings.Join(got, " "), "events")
		require.Len(t, recs, 3)
		assert.Contains(t, recs[0].Msg, "no 15ad:0820 function", "the error does not say the device is missing")
		assert.Equal(t, -1, recs[1].Code, "exit %+v", recs[1])
		assert.True(t, strings.HasPrefix(recs[1].Msg, "not run: "), "exit %+v", recs[1])
		assert.NotZero(t, recs[2].Code, "done %+v reports success", recs[2])
	})
}

// boot runs QEMU on img, as VM vm of vms, until the guest reports done and powers off, serving
// the control channel from hostKV and checking that the guest put wantPut.
// It returns the records, the last being done.
func boot(t *testing.T, qemu string, k *Kernel, img string, vm, vms int, hostKV, wantPut map[string]string) []proto.Record {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "ctl.sock")
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	defer ln.Close()
	puts := make(chan map[string]string, 1)
	go serveControl(t, ln, hostKV, puts)

	ctx, cancel := context.WithTimeout(context.Background(), bootLimit)
	defer cancel()
	cmd := exec.CommandContext(ctx, qemu,
		"-accel", "tcg", "-cpu", "max", "-smp", "1", "-m", "512M", "-machine", "q35",
		"-nodefaults", "-display", "none", "-no-reboot",
		"-device", "intel-iommu,intremap=on",
		"-device", "vmxnet3,addr=10.0,romfile=,netdev=n0", "-netdev", "user,id=n0",
		"-chardev", "socket,id=ctl,path="+sock,
		"-serial", "stdio", "-serial", "chardev:ctl",
		"-kernel", k.Image(), "-initrd", img,
		// no_timer_check: on a loaded host a TCG guest can miss the timer
		// interrupts the kernel counts at boot, and with interrupt
		// remapping it panics ("timer doesn't work through
		// Interrupt-remapped IO-APIC") instead of falling back.
		"-append", fmt.Sprintf("console=ttyS0 intel_iommu=on no_timer_check panic=-1 loglevel=4 %s=%d %s=%d", proto.CmdlineVM, vm, proto.CmdlineVMs, vms),
	)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	t0 := time.Now()
	require.NoError(t, cmd.Start())
	var recs []proto.Record
	var tail []string
	var first, done time.Duration
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		r, ok, err := proto.Parse(sc.Bytes())
		if !ok {
			tail = append(tail, sc.Text())
			if len(tail) > 100 {
				tail = tail[1:]
			}
			continue
		}
		if !assert.NoError(t, err) {
			continue
		}
		if first == 0 {
			first = time.Since(t0)
		}
		recs = append(recs, r)
		if r.Event == proto.EventDone {
			done = time.Since(t0)
		}
	}
	err = cmd.Wait()
	exited := time.Since(t0)
	require.True(t, done != 0 && err == nil, "QEMU: %v (done seen: %v)\nstderr: %s\nconsole tail:\n%s", err, done != 0, stderr.String(), strings.Join(tail, "\n"))
	t.Logf("QEMU start → first record %v, → done %v, → QEMU exit (guest power-off) %v", first.Round(time.Millisecond), done.Round(time.Millisecond), exited.Round(time.Millisecond))
	for _, l := range tail {
		if strings.HasPrefix(l, "vfrdma-init: ") {
			t.Log(l)
		}
	}
	if wantPut != nil {
		select {
		case got := <-puts:
			for k, v := range wantPut {
				assert.Equal(t, v, got[k], "control channel: what the guest put as %s", k)
			}
		case <-time.After(time.Second):
			assert.Fail(t, "the guest never used the control channel")
		}
	}
	return recs
}

// serveControl is a minimal host end of the control channel: one
// connection, gets answered from kv or from earlier puts, a missing key is
// an error at once. It sends what was put when the guest hangs up.
func serveControl(t *testing.T, ln net.Listener, kv map[string]string, puts chan<- map[string]string) {
	c, err := ln.Accept()
	if err != nil {
		return
	}
	defer c.Close()
	put := map[string]string{}
	defer func() { puts <- put }()
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		var req proto.Request
		var rep proto.Reply
		if err := json.Unmarshal(sc.Bytes(), &req); !assert.NoError(t, err, "control channel: bad request %q", sc.Bytes()) {
			rep.Error = "bad request"
		}
		switch req.Op {
		case proto.OpPut:
			put[req.Key] = req.Value
		case proto.OpGet:
			v, ok := kv[req.Key]
			if !ok {
				v, ok = put[req.Key]
			}
			if !ok {
				rep.Error = "no value for " + req.Key
			}
			rep.Value = v
		}
		b, _ := json.Marshal(rep)
		if _, err := c.Write(append(b, '\n')); err != nil {
			return
		}
	}
}
