//go:build !guest

package am

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/pvsim"
)

// openDevice opens the driver on the device model (pvsim) in QEMU 7.2's
// mode: on the host the protocol's tests run over the same driver, rings
// and transport semantics as in the guest, with no VM.
func openDevice(t testing.TB) *vfrdma.Device {
	t.Helper()
	m, err := pvsim.New(pvsim.Config{QEMU: true})
	require.NoError(t, err)
	d, err := vfrdma.OpenFunction(m, nil)
	if err != nil {
		m.Close()
		require.NoError(t, err, "OpenFunction")
	}
	t.Cleanup(func() { d.Close() })
	return d
}
