//go:build !guest

package am

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/pvsim"
)

// modelNodes opens n device models on one fabric, the driver on each: n
// machines in one process. The test closes them.
func modelNodes(t *testing.T, n int, cfg pvsim.Config) ([]*vfrdma.Device, []*pvsim.Device) {
	t.Helper()
	cfg.Fabric = pvsim.NewFabric()
	ds := make([]*vfrdma.Device, n)
	ms := make([]*pvsim.Device, n)
	for i := range n {
		ds[i], ms[i] = openModel(t, cfg)
	}
	return ds, ms
}

// Across devices, as across the bench's three VMs but on the device model:
// every task sends to every task, itself included, 0 B, 8 B, one packet
// exactly, one byte more, 64 KiB and 1 MiB; every byte is checked in the
// completion handler, every counter exact. On VMware's device (version
// 20: QP handles apart from numbers) and on QEMU's.
func TestThreeDevicesEveryTaskToEveryTaskEveryByteChecked(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  pvsim.Config
	}{{"qemu", pvsim.Config{QEMU: true}}, {"v20", pvsim.Config{Version: 20}}} {
		t.Run(tc.name, func(t *testing.T) {
			ds, _ := modelNodes(t, 3, tc.cfg)
			cs := newJobOn(t, ds, Config{})
			one := cs[0].OnePacket(16)
			sizes := []int{0, 8, one, one + 1, 64 << 10, 1 << 20}
			runTasks(t, cs, 2*time.Minute, func(ctx context.Context, c *Context) error { return allToAll(ctx, c, sizes) })
		})
	}
}

// A peer machine goes silent in mid-transfer (its port goes down: it
// neither sends nor receives, as when its VM is killed): the survivors' Fence and Barrier
// return ErrPurged (the QP's retries run out), Amsend to the dead task is
// refused, and the counters count only what was delivered: everything
// between survivors, and to the dead task no more than its
// acknowledgements said.
func TestPeerGoneSilentInMidTransferIsPurged(t *testing.T) {
	const victim, perPeer, size = 2, 8, 1 << 20
	ds, ms := modelNodes(t, 3, pvsim.Config{QEMU: true})
	cs := newJobOn(t, ds, Config{})
	ctx := withTimeout(t, 2*time.Minute)
	started := make(chan struct{}, 64)
	tgts := make([]*Counter, len(cs))
	for i, c := range cs {
		tgts[i] = NewCounter()
		require.NoError(t, c.SetCounter(1, tgts[i]))
		require.NoError(t, c.SetHandler(1, func(a *Arrival) Return {
			if i == victim {
				started <- struct{}{}
			}
			return Return{Buf: make([]byte, a.Len)}
		}))
	}
	runTasks(t, cs, time.Minute, func(ctx context.Context, c *Context) error { return c.Barrier(ctx) })
	runTasks(t, cs, time.Minute, func(ctx context.Context, c *Context) error { return c.Fence(ctx) })
	go func() { // the victim goes once a survivor's big message has begun to arrive
		<-started
		<-started
		assert.NoError(t, ms[victim].SetPort(false))
	}()

	survivors := cs[:victim]
	errs := make([]error, len(survivors))
	toPeer := []*Counter{NewCounter(), NewCounter()}
	toVictim := []*Counter{NewCounter(), NewCounter()}
	before := []Stats{survivors[0].Stats(), survivors[1].Stats()}
	data := make([]byte, size)
	done := make(chan int)
	for i, c := range survivors {
		go func() {
			defer func() { done <- i }()
			for range perPeer {
				if errs[i] = c.Amsend(victim, 1, nil, data, Counters{Tgt: 1, Cmpl: toVictim[i]}); errs[i] != nil {
					return
				}
				if errs[i] = c.Amsend(1-i, 1, nil, data[:size/4], Counters{Tgt: 1, Cmpl: toPeer[i]}); errs[i] != nil {
					return
				}
			}
			errs[i] = c.Fence(ctx)
		}()
	}
	<-done
	<-done
	for i, c := range survivors {
		assert.ErrorIs(t, errs[i], ErrPurged, "task %d: Fence", i)
		assert.NoError(t, ctx.Err(), "Fence returned only when its context ended")
		assert.ErrorIs(t, c.Amsend(victim, 1, nil, nil, Counters{}), ErrPurged)
		_, err := toPeer[i].Wait(ctx, perPeer)
		require.NoError(t, err, "task %d: messages between survivors complete", i)
		s := c.Stats()
		assert.LessOrEqual(t, toVictim[i].Get(), int64(perPeer))
		assert.EqualValues(t, int64(perPeer)+toVictim[i].Get(), int64(s.Delivered-before[i].Delivered), "task %d: cmpl counts exactly what was acknowledged", i)
		assert.EqualValues(t, int64(perPeer)-toVictim[i].Get(), int64(s.Failed-before[i].Failed), "task %d: the rest failed", i)
		_, err = tgts[i].Wait(ctx, perPeer)
		assert.NoError(t, err, "task %d: tgt at %d of %d", i, tgts[i].Get(), perPeer)
	}
	runTasks(t, survivors, time.Minute, func(ctx context.Context, c *Context) error {
		err := c.Barrier(ctx)
		if !assert.ErrorIs(t, err, ErrPurged, "a barrier with a dead task") {
			return err
		}
		return nil
	})
}

// newJobOn makes one task per device, task i on ds[i].
func newJobOn(t testing.TB, ds []*vfrdma.Device, cfg Config) []*Context {
	t.Helper()
	return startJob(t, ds, cfg, ackHold)
}
