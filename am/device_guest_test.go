//go:build guest

package am

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/qemu/proto"
)

// openDevice opens the bench's pvrdma function: in the guest the tests run
// on QEMU's device.
func openDevice(t testing.TB) *vfrdma.Device {
	t.Helper()
	if os.Getenv(proto.EnvGuest) != "1" {
		t.Skip("in-guest test: run it on the bench with `go run ./cmd/pvvm -test am` (or `make test`)")
	}
	bdf := os.Getenv(proto.EnvBDF)
	require.NotEmpty(t, bdf, "%s is not set: the bench's init did not find the pvrdma function", proto.EnvBDF)
	d, err := vfrdma.Open(bdf, nil)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	return d
}
