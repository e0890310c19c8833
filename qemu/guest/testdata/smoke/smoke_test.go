//go:build guest

// Package smoke runs inside the guest during TestBootQEMU: it checks what
// the init promises programs (environment, modules, control channel).
package smoke

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vfrdma/vfrdma/qemu/guestctl"
	"github.com/vfrdma/vfrdma/qemu/proto"
)

func TestEnv(t *testing.T) {
	// The runner's command line sets the VM index and count; the manifest
	// says what they are.
	for k, want := range map[string]string{proto.EnvGuest: "1", proto.EnvVM: os.Getenv("WANT_VM"), proto.EnvVMs: os.Getenv("WANT_VMS")} {
		if got := os.Getenv(k); got != want {
			t.Errorf("%s=%q, want %q", k, got, want)
		}
	}
	if wd, _ := os.Getwd(); wd != "/tmp" {
		t.Errorf("working directory %q, want /tmp", wd)
	}
}

func TestModules(t *testing.T) {
	b, err := os.ReadFile("/proc/modules")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"irqbypass", "vfio", "vfio_iommu_type1", "vfio_virqfd", "vfio_pci_core", "vfio_pci"} {
		if !strings.Contains(string(b), m+" ") {
			t.Errorf("module %s not loaded:\n%s", m, b)
		}
	}
	if _, err := os.Stat("/dev/vfio/vfio"); err != nil {
		t.Error(err)
	}
}

// TestIOMMU checks that the vIOMMU is on: the vmxnet3 function the bench
// puts at 00:10.0 must be in an IOMMU group.
func TestIOMMU(t *testing.T) {
	l, err := os.Readlink("/sys/bus/pci/devices/0000:00:10.0/iommu_group")
	if err != nil {
		t.Fatalf("vmxnet3 at 00:10.0 has no IOMMU group: %v", err)
	}
	t.Logf("IOMMU group %s", l)
}

func TestControl(t *testing.T) {
	c, err := guestctl.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Put("smoke/key", "hello from the guest"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := c.Get(ctx, "host/key")
	if err != nil || v != "hello from the host" {
		t.Fatalf("Get = %q, %v", v, err)
	}
}

func TestSkipped(t *testing.T) {
	t.Run("sub", func(t *testing.T) { t.Skip("skipped on purpose") })
}
