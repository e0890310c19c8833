package guest

// TestBootQEMU boots the initramfs in a real QEMU guest (TCG), end to end.
// It is the slow tier of this package (about 5 s, two VMs in parallel):
// it skips only when qemu-system-x86_64 or the guest kernel cache is
// missing. Exclude it with -skip TestBootQEMU.

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

	"github.com/vfrdma/vfrdma/qemu/proto"
)

// bootLimit bounds one VM run, from QEMU start to its exit.
const bootLimit = 60 * time.Second

func TestBootQEMU(t *testing.T) {
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 not found: run `make setup` (Debian package qemu-system-x86)")
	}
	root := repoRoot(t)
	k, err := FindKernel(root)
	if err != nil {
		t.Skip(err)
	}
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
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
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
		if err != nil {
			t.Fatal(err)
		}
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
				t.Errorf("init error: %s", r.Msg)
			}
		}
		want := "TestEnv:pass TestModules:pass TestIOMMU:pass TestControl:pass TestSkipped:pass TestSkipped/sub:skip"
		if got := strings.Join(tests, " "); got != want {
			t.Errorf("tests %s\nwant %s", got, want)
		}
		if got := strings.Join(exits, " "); got != "smoke.test:0 smokecmd:0" {
			t.Errorf("exits %s", got)
		}
		if !sawCmdLine {
			t.Error("no output line from smokecmd")
		}
		if d := recs[len(recs)-1]; d.Code != 0 {
			t.Errorf("done %+v", d)
		}
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
		if err != nil {
			t.Fatal(err)
		}
		recs := boot(t, qemu, k, img, 0, 1, nil, nil)
		var got []string
		for _, r := range recs {
			if r.Event != proto.EventOut {
				got = append(got, r.Event)
			}
		}
		if strings.Join(got, " ") != "error exit done" || len(recs) != 3 {
			t.Fatalf("events %v, want error, exit, done", got)
		}
		if !strings.Contains(recs[0].Msg, "no 15ad:0820 function") {
			t.Errorf("error %q does not say the device is missing", recs[0].Msg)
		}
		if recs[1].Code != -1 || !strings.HasPrefix(recs[1].Msg, "not run: ") {
			t.Errorf("exit %+v", recs[1])
		}
		if recs[2].Code == 0 {
			t.Errorf("done %+v reports success", recs[2])
		}
	})
}

// boot runs QEMU on img, as VM vm of vms, until the guest reports done and powers off, serving
// the control channel from hostKV and checking that the guest put wantPut.
// It returns the records, the last being done.
func boot(t *testing.T, qemu string, k *Kernel, img string, vm, vms int, hostKV, wantPut map[string]string) []proto.Record {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "ctl.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
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
		"-append", fmt.Sprintf("console=ttyS0 intel_iommu=on panic=-1 loglevel=4 %s=%d %s=%d", proto.CmdlineVM, vm, proto.CmdlineVMs, vms),
	)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
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
		if err != nil {
			t.Errorf("%v", err)
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
	if done == 0 || err != nil {
		t.Fatalf("QEMU: %v (done seen: %v)\nstderr: %s\nconsole tail:\n%s", err, done != 0, stderr.String(), strings.Join(tail, "\n"))
	}
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
				if got[k] != v {
					t.Errorf("control channel: guest put %s=%q, want %q", k, got[k], v)
				}
			}
		case <-time.After(time.Second):
			t.Error("the guest never used the control channel")
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
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			t.Errorf("control channel: bad request %q: %v", sc.Bytes(), err)
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
