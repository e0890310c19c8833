//go:build guest

package guestctl

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/vfrdma/vfrdma/qemu/proto"
)

// vmIndex returns this VM's index and the run's VM count from the init's
// environment; outside the bench it fails the test with how to run it.
func vmIndex(t *testing.T) (vm, vms int) {
	t.Helper()
	if os.Getenv(proto.EnvGuest) != "1" {
		t.Skip("in-guest test: run it on the bench with `go run ./cmd/pvvm -vms 2 -test ./qemu/guestctl` (or `make test`)")
	}
	vm, err1 := strconv.Atoi(os.Getenv(proto.EnvVM))
	vms, err2 := strconv.Atoi(os.Getenv(proto.EnvVMs))
	if err1 != nil || err2 != nil {
		t.Fatalf("%s=%q %s=%q: the init did not say which VM this is", proto.EnvVM, os.Getenv(proto.EnvVM), proto.EnvVMs, os.Getenv(proto.EnvVMs))
	}
	return vm, vms
}

// Every VM of the run publishes a value and reads every other VM's, through
// the host's rendezvous: the mechanism multi-VM tests use to exchange QP
// numbers and GIDs.
func TestMultiVMRendezvous(t *testing.T) {
	vm, vms := vmIndex(t)
	if vms < 2 {
		t.Fatalf("%d VM(s): this test needs a multi-VM run (pvvm -vms 2)", vms)
	}
	c, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	mine := fmt.Sprintf("hello from vm%d, pid %d", vm, os.Getpid())
	if err := c.Put(fmt.Sprintf("rendezvous/%d", vm), mine); err != nil {
		t.Fatalf("put: %v", err)
	}
	for peer := 0; peer < vms; peer++ {
		got, err := c.Get(ctx, fmt.Sprintf("rendezvous/%d", peer))
		if err != nil {
			t.Fatalf("get vm%d's value: %v", peer, err)
		}
		if peer == vm && got != mine {
			t.Fatalf("own value came back as %q, want %q", got, mine)
		}
		t.Logf("vm%d says %q", peer, got)
	}
	// A key nobody writes times out with an error, not a hang.
	short, cancel2 := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel2()
	if v, err := c.Get(short, fmt.Sprintf("never/%d", vm)); err == nil {
		t.Fatalf("get of an unwritten key returned %q", v)
	}
}
