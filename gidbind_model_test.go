package vfrdma_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
)

// BindGID takes the indices 0 to GIDTblLen-1: the last one binds on the
// device, GIDTblLen is refused with ErrInvalid before any command goes to
// the device, in both modes.
func TestBindGIDTakesTheLastIndexOfTheTableAndNotOneMore(t *testing.T) {
	for _, tc := range models {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t)
			d, m := openModel(t, tc.cfg, nil)
			n := int(d.Caps().GIDTblLen)
			require.Positive(t, n)
			g := d.GID()
			g[15] ^= 0xFF
			cmds := m.Stats().Commands
			err := d.BindGID(ctx, n, g)
			require.ErrorIs(t, err, vfrdma.ErrInvalid, "index %d of a %d-entry table", n, n)
			assert.Equal(t, cmds, m.Stats().Commands, "refused before the device was asked")
			assert.NotContains(t, d.GIDs(), n)

			require.NoError(t, d.BindGID(ctx, n-1, g), "the last index")
			assert.Equal(t, g, d.GIDs()[n-1])
			require.NoError(t, d.UnbindGID(ctx, n-1))
		})
	}
}

// An index UnbindGID freed is no longer a source GID: CreateAH refuses it
// with ErrInvalid as it refuses an index never bound, until it is bound
// again.
func TestAGIDIndexUnboundIsNoLongerASourceForAnAH(t *testing.T) {
	ctx := ctxT(t)
	d, _ := openModel(t, vmware(20), nil)
	pd, err := d.AllocPD(ctx)
	require.NoError(t, err)
	g := d.GID()
	g[15] ^= 0xFF
	_, err = pd.CreateAH(vfrdma.AHAttr{DGID: d.GID(), SGIDIndex: 3})
	require.ErrorIs(t, err, vfrdma.ErrInvalid, "never bound")
	require.NoError(t, d.BindGID(ctx, 3, g))
	_, err = pd.CreateAH(vfrdma.AHAttr{DGID: d.GID(), SGIDIndex: 3})
	require.NoError(t, err, "bound")
	require.NoError(t, d.UnbindGID(ctx, 3))
	_, err = pd.CreateAH(vfrdma.AHAttr{DGID: d.GID(), SGIDIndex: 3})
	require.ErrorIs(t, err, vfrdma.ErrInvalid, "unbound")
	require.NoError(t, d.BindGID(ctx, 3, g))
	_, err = pd.CreateAH(vfrdma.AHAttr{DGID: d.GID(), SGIDIndex: 3})
	require.NoError(t, err, "bound again")
}
