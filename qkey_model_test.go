package vfrdma_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
)

// SetQKey gives a UD QP its Q_Key after creation, in RESET or INIT (as
// libibverbs passes it with the move to INIT); Init takes it to the
// device. An RC QP, or a UD QP past INIT, refuses it with ErrQPState.
func TestSetQKeyReachesTheDeviceInResetOrInitOnlyAndOnUDOnly(t *testing.T) {
	ctx := ctxT(t)
	d, m := openModel(t, vmware(20), nil)
	pd, err := d.AllocPD(ctx)
	require.NoError(t, err)
	cq, err := d.CreateCQ(ctx, 16)
	require.NoError(t, err)
	ud, err := pd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.UD, SendCQ: cq, RecvCQ: cq, QKey: 1})
	require.NoError(t, err)
	require.NoError(t, ud.SetQKey(0x11111111))
	require.NoError(t, ud.Init(ctx))
	info, ok := m.QPByNumber(ud.QPN())
	require.True(t, ok)
	assert.Equal(t, uint32(0x11111111), info.QKey)
	require.NoError(t, ud.SetQKey(0x22222222), "INIT takes a Q_Key")
	require.NoError(t, ud.Init(ctx))
	info, _ = m.QPByNumber(ud.QPN())
	assert.Equal(t, uint32(0x22222222), info.QKey)
	require.NoError(t, ud.ReadyToReceive(ctx, vfrdma.Remote{}))
	assert.ErrorIs(t, ud.SetQKey(3), vfrdma.ErrQPState, "RTR takes none")

	rc, err := pd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: cq, RecvCQ: cq})
	require.NoError(t, err)
	assert.ErrorIs(t, rc.SetQKey(3), vfrdma.ErrQPState, "an RC QP has no Q_Key")
	require.NoError(t, ud.Close())
	assert.ErrorIs(t, ud.SetQKey(3), vfrdma.ErrClosed)
}
