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
	d, _ := openModel(t, pvsim.Config{QEMU: true})
	return d
}

// openModel opens the driver on a new model of cfg; the test closes both.
func openModel(t testing.TB, cfg pvsim.Config) (*vfrdma.Device, *pvsim.Device) {
	t.Helper()
	m, err := pvsim.New(cfg)
	require.NoError(t, err)
	d, err := vfrdma.OpenFunction(m, nil)
	if err != nil {
		m.Close()
		require.NoError(t, err, "OpenFunction")
	}
	t.Cleanup(func() { d.Close(); m.Close() })
	return d, m
}
