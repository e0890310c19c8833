package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/pvsim"
)

func TestParseModel(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want pvsim.Config
		bad  bool
	}{
		{spec: "v17", want: pvsim.Config{Version: 17}},
		{spec: "V20", want: pvsim.Config{Version: 20}},
		{spec: "vmware", want: pvsim.Config{Version: 20}},
		{spec: "v18,rocev2", want: pvsim.Config{Version: 18, RoCEv2: true}},
		{spec: "qemu", want: pvsim.Config{QEMU: true}},
		{spec: "v16", bad: true},
		{spec: "v21", bad: true},
		{spec: "esxi", bad: true},
		{spec: "v20,fast", bad: true},
	} {
		got, err := parseModel(tc.spec)
		if tc.bad {
			assert.Error(t, err, tc.spec)
			continue
		}
		require.NoError(t, err, tc.spec)
		assert.Equal(t, tc.want, got, tc.spec)
	}
}

// pvctl --model VERSION info opens the model through the driver and shows
// the version it plays, with no device, root or VFIO.
func TestInfoOnTheModel(t *testing.T) {
	for _, spec := range []string{"qemu", "v18,rocev2", "v20"} {
		var out bytes.Buffer
		e := &env{out: &out, model: spec}
		require.NoError(t, cmdInfo(e, nil), spec)
		assert.Contains(t, out.String(), "port 1 state:          PORT_ACTIVE", spec)
	}
	e := &env{out: &bytes.Buffer{}, model: "v20"}
	assert.ErrorContains(t, cmdInfo(e, []string{"0000:00:10.1"}), "no BDF")
}

// pvctl --model VERSION regs reads the model's registers before any
// driver: its version, its MAC. The commands that work on a machine's PCI
// functions, or on the slot's vmxnet3 the model lacks, say so.
func TestRegsOnTheModel(t *testing.T) {
	for spec, version := range map[string]string{"v20": "0x00000014", "qemu": "0x00000011"} {
		var out bytes.Buffer
		e := &env{out: &out, model: spec}
		require.NoError(t, cmdRegs(e, nil), spec)
		assert.Contains(t, out.String(), "the device model, --model "+spec)
		assert.Contains(t, out.String(), "VERSION  "+version, spec)
	}
	for name, cmd := range map[string]func(*env, []string) error{"list": cmdList, "bind": cmdBind, "unbind": cmdUnbind, "eth": cmdEth} {
		e, out, _ := testEnv(t)
		e.model = "v20"
		assert.ErrorIs(t, cmd(e, nil), errModel, name)
		assert.Empty(t, out.String(), name)
	}
}

// pingpong and bench poll without sleeping by default, as rdma-core's
// tools do; --events (-e) sleeps on the interrupt. Each report says which.
// --spin or --send-spin beside --events is refused before any device is
// opened.
func TestPingpongAndBenchSpinByDefaultAndSleepWithEvents(t *testing.T) {
	for _, tc := range []struct {
		args []string
		wait string
	}{{nil, "spin"}, {[]string{"--events"}, "events"}, {[]string{"-e"}, "events"}, {[]string{"--spin=false"}, "events"}} {
		var out bytes.Buffer
		e := &env{out: &out, model: "qemu"}
		require.NoError(t, cmdPingpong(e, append([]string{"--iters", "20", "--size", "64"}, tc.args...)), "%v", tc.args)
		assert.Contains(t, out.String(), "waiting: "+tc.wait, "%v", tc.args)
	}
	for _, tc := range []struct {
		args []string
		text string
	}{{nil, "the sender spinning"}, {[]string{"--events"}, "the sender sleeping on events"}} {
		var out bytes.Buffer
		e := &env{out: &out, model: "qemu"}
		require.NoError(t, cmdBench(e, append([]string{"--messages", "200", "--batches", "1"}, tc.args...)), "%v", tc.args)
		assert.Contains(t, out.String(), tc.text, "%v", tc.args)
	}
	e := &env{out: &bytes.Buffer{}, model: "qemu"}
	assert.ErrorContains(t, cmdPingpong(e, []string{"--spin", "--events"}), "exclude each other")
	assert.ErrorContains(t, cmdBench(e, []string{"--send-spin", "--events"}), "exclude each other")
}
