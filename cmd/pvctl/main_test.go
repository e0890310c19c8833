package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/pci"
	"github.com/vfrdma/vfrdma/pci/pcitest"
)

func testEnv(t *testing.T) (*env, *bytes.Buffer, *pcitest.Sysfs) {
	fs := pcitest.VMwareSlot(t)
	var out bytes.Buffer
	return &env{out: &out, sysfs: fs.Root, bus: fs.Bus(), runDir: t.TempDir()}, &out, fs
}

func TestListJSON(t *testing.T) {
	e, out, _ := testEnv(t)
	e.json = true
	if err := cmdList(e, nil); err != nil {
		t.Fatal(err)
	}
	var got []listEntry
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	if len(got) != 2 || got[0].Kind != "vmxnet3" || got[1].Kind != "pvrdma" || got[1].BDF != "0000:00:10.1" || got[0].Driver != "vmxnet3" {
		t.Fatalf("list = %+v", got)
	}
}

func TestBindUnbindRestoresDrivers(t *testing.T) {
	e, out, _ := testEnv(t)
	if err := cmdBind(e, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "bound to vfio-pci") || !strings.Contains(out.String(), "was vmxnet3") {
		t.Fatalf("bind said %q", out)
	}
	for _, bdf := range []string{"0000:00:10.0", "0000:00:10.1"} {
		a, _ := pci.ParseAddr(bdf)
		if f, _ := e.bus.Lookup(a); f.Driver != vfioDriver {
			t.Fatalf("%s has %q after bind", bdf, f.Driver)
		}
	}
	// A second bind keeps the first one's record of the earlier drivers.
	if err := cmdBind(e, nil); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := cmdUnbind(e, []string{"0000:00:10.1"}); err != nil {
		t.Fatal(err)
	}
	a, _ := pci.ParseAddr("0000:00:10.0")
	if f, _ := e.bus.Lookup(a); f.Driver != "vmxnet3" {
		t.Fatalf("vmxnet3 function has %q after unbind, want vmxnet3 back", f.Driver)
	}
	b, _ := pci.ParseAddr("0000:00:10.1")
	if f, _ := e.bus.Lookup(b); f.Driver != "" {
		t.Fatalf("pvrdma function has %q after unbind, want none (it had none)", f.Driver)
	}
}

func TestTargetErrors(t *testing.T) {
	e, _, _ := testEnv(t)
	if _, err := e.target([]string{"0000:00:10.0"}); err == nil || !strings.Contains(err.Error(), "not a pvrdma function") {
		t.Errorf("vmxnet3 as target: %v", err)
	}
	if _, err := e.target([]string{"0000:00:1f.7"}); !errors.Is(err, pci.ErrNotFound) {
		t.Errorf("missing function: %v", err)
	}
	if _, err := e.target([]string{"zz"}); !errors.Is(err, pci.ErrInvalidAddr) {
		t.Errorf("bad BDF: %v", err)
	}
	if _, err := e.target([]string{"a", "b"}); !errors.Is(err, errUsage) {
		t.Errorf("two BDFs: %v", err)
	}
}

// list on a machine without the NIC is no error: the text says so, and
// --json prints an empty list, not null.
func TestListWithoutTheNIC(t *testing.T) {
	e, out, _ := testEnv(t)
	e.bus = pcitest.New(t).Bus()
	require.NoError(t, cmdList(e, nil))
	assert.Equal(t, "no pvrdma function (15ad:0820) on this machine\n", out.String())
	out.Reset()
	e.json = true
	require.NoError(t, cmdList(e, nil))
	assert.Equal(t, "[]\n", out.String())
}
