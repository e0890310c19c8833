//go:build !guest

package vfrdma

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// One Sync delivers every notification the ring held when it began, more
// than one batch of them included: it drains until a batch comes back
// short.
func TestOneSyncDrainsMoreNotificationsThanOneBatch(t *testing.T) {
	f := newEventDevice(t, 2, 32)
	n := len(f.d.notify.buf) + 44
	require.Less(t, n, int(f.nSlots), "the ring holds them all")
	for i := range n {
		f.notify(f.cqs[i%2].handle)
	}
	require.NoError(t, f.d.notify.Sync())
	left, err := f.d.cqNotify.Pending()
	require.NoError(t, err)
	assert.Zero(t, left, "notifications left in the ring after one Sync of %d", n)
}

// A fault of the notification ring (an index the device wrote out of
// range) is final: once a drain met it, waiting on any CQ reports it, even
// if the device writes a good index again.
func TestANotificationRingFaultIsFinalForEveryLaterWait(t *testing.T) {
	f := newEventDevice(t, 1, 32)
	good, err := f.nState.Load32(8)
	require.NoError(t, err)
	require.NoError(t, f.nState.Store32(8, 0xFFFF_FFF0)) // the producer index, out of range
	first := f.d.notify.Sync()
	require.Error(t, first, "a drain of a ring whose index is out of range")
	require.NoError(t, f.nState.Store32(8, good))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang guard
	defer cancel()
	err = f.cqs[0].Wait(ctx)
	require.Error(t, err, "Wait after the ring's fault")
	assert.NotErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorContains(t, err, first.Error())
}
