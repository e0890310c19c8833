package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/qemu"
	"github.com/vfrdma/vfrdma/qemu/guest"
	"github.com/vfrdma/vfrdma/qemu/proto"
)

// fakeBench returns options whose QEMU is a stand-in that writes, as VM N's
// console, the records given for VM N, then runs until it is killed (the
// runner kills a VM once it reports done), as qemu/run_test.go's does.
func fakeBench(t *testing.T, records map[int][]proto.Record) *qemu.Options {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the bench checks it runs as root: run as root")
	}
	dir := t.TempDir()
	files := map[string]string{
		"qemu":    "#!/bin/sh\ncat \"" + dir + "/$SOFTVERBS_NODE.console\"\nexec sleep 600\n",
		"vmlinuz": "", "initrd": "", "backend/libibverbs.so.1": "",
	}
	for vm, recs := range records {
		var b bytes.Buffer
		b.WriteString("[    0.000000] Linux version 6.1.0\n")
		for _, r := range recs {
			b.Write(r.Encode())
		}
		files["vm"+string(rune('0'+vm))+".console"] = b.String()
	}
	for name, body := range files {
		p := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(body), 0o755))
	}
	return &qemu.Options{
		QEMU: filepath.Join(dir, "qemu"), BackendDir: filepath.Join(dir, "backend"),
		Kernel: filepath.Join(dir, "vmlinuz"), Initrd: filepath.Join(dir, "initrd"),
		Timeout: time.Minute,
	}
}

// planned is a config for args as main makes it, with its vfrdma VMs'
// programs named as buildSpec names them, printing into the buffers it returns.
func planned(t *testing.T, vms int, args ...string) (*config, *bytes.Buffer, *bytes.Buffer) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	c := &config{vms: vms, timeout: time.Minute, pvctlArgs: args, stdout: &stdout, stderr: &stderr}
	require.NoError(t, c.plan())
	lib := ""
	if len(c.dropinCmds()) > 0 {
		lib = fakeDropin(t)
	}
	_, _, err := c.vfPrograms(context.Background(), "pvctl", lib)
	require.NoError(t, err)
	return c, &stdout, &stderr
}

func out(prog, line string) proto.Record {
	return proto.Record{Event: proto.EventOut, Prog: prog, Line: line}
}

func errOut(prog, line string) proto.Record {
	return proto.Record{Event: proto.EventOut, Prog: prog, Line: line, Stream: proto.StreamStderr}
}

func start(prog string) proto.Record { return proto.Record{Event: proto.EventStart, Prog: prog} }

func exit(prog string, code int, elapsed float64) proto.Record {
	return proto.Record{Event: proto.EventExit, Prog: prog, Code: code, Elapsed: elapsed}
}

var done = proto.Record{Event: proto.EventDone}

// `pvvm -- info --json > info.json` captures the JSON alone: a command's
// stderr goes to pvvm's stderr, and a run of one command has no summary.
func TestACommandsStderrGoesToPvvmsStderr(t *testing.T) {
	opt := fakeBench(t, map[int][]proto.Record{0: {
		start("pvctl"), out("pvctl", `{"version": 17,`), errOut("pvctl", "pvctl: a warning"), out("pvctl", `"ports": 1}`),
		exit("pvctl", 0, 1.5), done,
	}})
	c, stdout, stderr := planned(t, 1, "info", "--json")
	code, err := runPvctl(context.Background(), c, opt)
	require.NoError(t, err)
	assert.Equal(t, 0, code)
	assert.Equal(t, "{\"version\": 17,\n\"ports\": 1}\n", stdout.String())
	assert.Equal(t, "pvctl: a warning\n", stderr.String())
}

// With several VMs each VM's lines come as a block, prefixed, the stderr
// lines on stderr; a run of several commands ends with a summary on stderr:
// each command in each VM that runs it, how it ended and how long it took.
func TestARunOfSeveralCommandsEndsWithASummary(t *testing.T) {
	opt := fakeBench(t, map[int][]proto.Record{
		0: {start("pvctl"), out("pvctl", "list of vm0"), exit("pvctl", 0, 0.4), done},
		1: {
			start("pvctl"), out("pvctl", "list of vm1"), errOut("pvctl", "pvctl: list: no device"), exit("pvctl", 1, 0.2),
			start("pvctl-2"), done,
		},
	})
	c, stdout, stderr := planned(t, 2, "list", "+", "@1", "regs", "+", "@0", "retry", "bench")
	code, err := runPvctl(context.Background(), c, opt)
	require.NoError(t, err)
	assert.Equal(t, 1, code, "the first non-zero exit")
	assert.Equal(t, "vm0: list of vm0\nvm1: list of vm1\n", stdout.String())
	e := stderr.String()
	assert.Contains(t, e, "vm1: pvctl: list: no device\n")
	assert.NotContains(t, stdout.String(), "pvvm:", "no summary or post-mortem on stdout")
	assert.Contains(t, e, "pvvm: 4 commands:\n")
	assert.Regexp(t, `(?m)^pvvm:   vm0  0\.4s  ok +pvctl list$`, e)
	assert.Regexp(t, `(?m)^pvvm:   vm0 +not run +@0 retry pvctl bench$`, e)
	assert.Regexp(t, `(?m)^pvvm:   vm1  0\.2s  exit 1 +pvctl list$`, e)
	assert.Regexp(t, `(?m)^pvvm:   vm1 +did not finish +@1 pvctl regs$`, e)
	assert.Less(t, bytes.LastIndex(stderr.Bytes(), []byte("pvvm: the run failed")), bytes.Index(stderr.Bytes(), []byte("pvvm: 4 commands:")),
		"the summary comes last, after the post-mortem")
}

// Every run of several VMs has the management network in its vfrdma
// guests (pvctl --listen/--connect reach the other VM at 192.168.100.N+1):
// virtio-net's modules and the interface, never vmxnet3's or vmw_pvrdma
// (the driver owns those functions). A one-VM run and a run of reference
// VMs only leave the vfrdma image alone.
func TestEveryRunOfSeveralVMsHasTheManagementNetwork(t *testing.T) {
	dir := t.TempDir()
	refDir := filepath.Join(dir, guest.RefModulesDir)
	require.NoError(t, os.MkdirAll(refDir, 0o755))
	for _, m := range []string{"ib_core", "vmxnet3", "vmw_pvrdma", "failover", "net_failover", "virtio", "virtio_ring", "virtio_pci", "virtio_net"} {
		require.NoError(t, os.WriteFile(filepath.Join(refDir, m+".ko.xz"), nil, 0o644))
	}
	kernel := &guest.Kernel{Dir: dir, Modules: []string{"/k/vfio.ko"}}
	for _, tc := range []struct {
		name string
		c    config
		mgmt bool
	}{
		{"one VM", config{vms: 1}, false},
		{"two VMs", config{vms: 2}, true},
		{"two VMs, tests", config{vms: 2, tests: "all"}, true},
		{"three VMs, one reference", config{vms: 3, ref: 1}, true},
		{"reference VMs only", config{vms: 2, ref: 2}, false},
	} {
		spec := guest.Spec{Kernel: kernel}
		require.NoError(t, tc.c.withMgmt(&spec, kernel), tc.name)
		if !tc.mgmt {
			assert.Empty(t, spec.Net, tc.name)
			assert.Same(t, kernel, spec.Kernel, tc.name)
			continue
		}
		assert.Equal(t, []string{proto.NetMgmt}, spec.Net, tc.name)
		var names []string
		for _, p := range spec.Kernel.Modules {
			names = append(names, filepath.Base(p))
		}
		assert.Equal(t, "vfio.ko", names[0], "%s: the VFIO modules first", tc.name)
		assert.ElementsMatch(t, []string{"vfio.ko", "failover.ko.xz", "net_failover.ko.xz", "virtio.ko.xz", "virtio_ring.ko.xz", "virtio_pci.ko.xz", "virtio_net.ko.xz"}, names, tc.name)
		assert.Equal(t, []string{"/k/vfio.ko"}, kernel.Modules, "%s: the kernel's own list is left alone", tc.name)
	}
}
