package vfrdma_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/pvsim"
)

// After a PD's Close, every creation in it returns ErrClosed (not ErrBusy,
// which says the object is in use), and nothing is created on the device.
func TestEveryCreationInAClosedPDReturnsErrClosed(t *testing.T) {
	d, m := openModel(t, pvsim.Config{Version: 18}, nil)
	ctx := ctxT(t)
	cq, err := d.CreateCQ(ctx, 16)
	require.NoError(t, err)
	pd, err := d.AllocPD(ctx)
	require.NoError(t, err)
	require.NoError(t, pd.Close())
	before := m.Objects()

	mem, err := unix.Mmap(-1, 0, unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Munmap(mem) })
	creations := map[string]func() error{
		"AllocMR":    func() error { _, err := pd.AllocMR(ctx, 4096, vfrdma.AccessLocalWrite); return err },
		"RegisterMR": func() error { _, err := pd.RegisterMR(ctx, mem, vfrdma.AccessLocalWrite); return err },
		"CreateQP": func() error {
			_, err := pd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: cq, RecvCQ: cq})
			return err
		},
		"CreateSRQ": func() error { _, err := pd.CreateSRQ(ctx, &vfrdma.SRQConfig{CQ: cq}); return err },
		"CreateAH":  func() error { _, err := pd.CreateAH(vfrdma.AHAttr{HopLimit: 1}); return err },
	}
	for name, create := range creations {
		err := create()
		assert.ErrorIs(t, err, vfrdma.ErrClosed, name)
		assert.NotErrorIs(t, err, vfrdma.ErrBusy, name)
	}
	assert.Equal(t, before, m.Objects(), "nothing created on the device")
}

// Close is idempotent: a PD's second Close returns nil and destroys
// nothing more on the device.
func TestASecondPDCloseReturnsNil(t *testing.T) {
	d, m := openModel(t, pvsim.Config{Version: 18}, nil)
	ctx := ctxT(t)
	pd, err := d.AllocPD(ctx)
	require.NoError(t, err)
	require.NoError(t, pd.Close())
	after := m.Objects()
	assert.NoError(t, pd.Close(), "a second Close")
	assert.Equal(t, after, m.Objects())
}
