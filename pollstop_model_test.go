package vfrdma_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/pvsim"
)

// With Options.PollDoorbell on QEMU's device an empty poll rings the POLL
// doorbell and CQs cannot be armed; StopPollDoorbell ends that for good:
// empty polls ring nothing, CQs arm, and Wait returns the completions
// that come (sleeping on the interrupt if they are not there yet).
func TestStopPollDoorbellEndsTheDoorbellAndLetsCQsArm(t *testing.T) {
	ctx := ctxT(t)
	d, _ := openModel(t, pvsim.Config{QEMU: true}, &vfrdma.Options{PollDoorbell: true, PollPace: -1})
	p := newRCPair(t, ctx, d, true, vfrdma.AccessLocalWrite)
	wcs := make([]vfrdma.WC, 4)
	assert.False(t, p.cq.Armable())
	assert.ErrorIs(t, p.cq.Arm(false), vfrdma.ErrNotSupported)
	n, err := p.cq.Poll(wcs)
	require.NoError(t, err)
	require.Zero(t, n)
	rung := p.cq.Stats().Doorbells
	assert.NotZero(t, rung, "an empty poll rang the POLL doorbell")

	d.StopPollDoorbell()
	n, err = p.cq.Poll(wcs)
	require.NoError(t, err)
	require.Zero(t, n)
	assert.Equal(t, rung, p.cq.Stats().Doorbells, "no POLL doorbell once stopped")
	assert.True(t, p.cq.Armable())
	require.NoError(t, p.cq.Arm(false), "the CQ arms")

	_, err = p.b.PostRecv([]vfrdma.RecvWR{{WRID: 1, SGEs: []vfrdma.SGE{p.mr.SGE(4096, 64)}}}, 0)
	require.NoError(t, err)
	_, err = p.a.PostSend([]vfrdma.SendWR{{WRID: 2, Flags: vfrdma.SendSignaled, SGEs: []vfrdma.SGE{p.mr.SGE(0, 8)}}}, 0)
	require.NoError(t, err)
	got := waitWCs(t, ctx, p.cq, 2)
	for _, wc := range got {
		assert.Equal(t, vfrdma.WCSuccess, wc.Status)
	}
}

// With ArmBesidePollDoorbell, CQs on QEMU's device arm beside the POLL
// doorbell, and the two take turns: while a CQ is armed on the device (no
// CQE since its arm) an empty poll rings no POLL doorbell, which would
// risk QEMU 7.2's deadlock (the model records it as a hazard); once the
// armed CQ's completion comes, empty polls ring it again.
func TestArmBesidePollDoorbellRingsNoPollWhileACQIsArmed(t *testing.T) {
	ctx := ctxT(t)
	d, m := openModel(t, pvsim.Config{QEMU: true}, &vfrdma.Options{PollDoorbell: true, PollPace: -1, ArmBesidePollDoorbell: true})
	p := newRCPair(t, ctx, d, true, vfrdma.AccessLocalWrite)
	other, err := d.CreateCQ(ctx, 16)
	require.NoError(t, err)
	t.Cleanup(func() { other.Close() })
	wcs := make([]vfrdma.WC, 4)
	emptyPoll := func(cq *vfrdma.CQ) {
		n, err := cq.Poll(wcs)
		require.NoError(t, err)
		require.Zero(t, n)
	}
	emptyPoll(other)
	rung := other.Stats().Doorbells
	require.NotZero(t, rung, "an empty poll rings the POLL doorbell")

	assert.True(t, p.cq.Armable())
	require.NoError(t, p.cq.Arm(false))
	for range 10 {
		emptyPoll(other)
		emptyPoll(p.cq)
	}
	assert.Equal(t, rung, other.Stats().Doorbells, "no POLL doorbell while a CQ is armed")
	assert.Empty(t, m.Hazards())

	// The armed CQ's completions spend its arm; the POLL doorbell rings
	// again.
	_, err = p.b.PostRecv([]vfrdma.RecvWR{{WRID: 1, SGEs: []vfrdma.SGE{p.mr.SGE(4096, 64)}}}, 0)
	require.NoError(t, err)
	_, err = p.a.PostSend([]vfrdma.SendWR{{WRID: 2, Flags: vfrdma.SendSignaled, SGEs: []vfrdma.SGE{p.mr.SGE(0, 8)}}}, 0)
	require.NoError(t, err)
	waitWCs(t, ctx, p.cq, 2)
	// Not at the CQE: QEMU raises the interrupt after it, wanting the big
	// lock while it holds the backend's, so the arm stays counted for a
	// grace (here an hour, then none).
	vfrdma.SetArmSpentGrace(t, d, time.Hour)
	emptyPoll(other)
	assert.Equal(t, rung, other.Stats().Doorbells, "a POLL doorbell right after the armed CQ's CQE")
	vfrdma.SetArmSpentGrace(t, d, 0)
	emptyPoll(other)
	assert.Equal(t, rung+1, other.Stats().Doorbells, "the POLL doorbell once the arm is spent")
	assert.Empty(t, m.Hazards())

	// A CQ destroyed while armed no longer holds the doorbell back.
	require.NoError(t, other.Arm(false))
	emptyPoll(p.cq)
	polls := p.cq.Stats().Doorbells
	require.NoError(t, other.Close())
	emptyPoll(p.cq)
	assert.Greater(t, p.cq.Stats().Doorbells, polls, "the POLL doorbell once the armed CQ is gone")
	assert.Empty(t, m.Hazards())
}

// armBeside is a QEMU-mode model device with ArmBesidePollDoorbell, an
// RC pair on one CQ, and another CQ whose empty polls ring (or not) the
// POLL doorbell.
type armBeside struct {
	ctx   context.Context
	d     *vfrdma.Device
	m     *pvsim.Device
	p     *rcPair
	other *vfrdma.CQ
}

func newArmBeside(t *testing.T) *armBeside {
	t.Helper()
	a := &armBeside{ctx: ctxT(t)}
	a.d, a.m = openModel(t, pvsim.Config{QEMU: true}, &vfrdma.Options{PollDoorbell: true, PollPace: -1, ArmBesidePollDoorbell: true})
	a.p = newRCPair(t, a.ctx, a.d, true, vfrdma.AccessLocalWrite)
	var err error
	a.other, err = a.d.CreateCQ(a.ctx, 16)
	require.NoError(t, err)
	t.Cleanup(func() { a.other.Close() })
	return a
}

// emptyPoll polls cq, which must be empty.
func (a *armBeside) emptyPoll(t *testing.T, cq *vfrdma.CQ) {
	t.Helper()
	n, err := cq.Poll(make([]vfrdma.WC, 4))
	require.NoError(t, err)
	require.Zero(t, n)
}

// exchange sends one message across the pair and waits for both
// completions on the pair's CQ.
func (a *armBeside) exchange(t *testing.T, id uint64) {
	t.Helper()
	_, err := a.p.b.PostRecv([]vfrdma.RecvWR{{WRID: id, SGEs: []vfrdma.SGE{a.p.mr.SGE(4096, 64)}}}, 0)
	require.NoError(t, err)
	_, err = a.p.a.PostSend([]vfrdma.SendWR{{WRID: id + 1, Flags: vfrdma.SendSignaled, SGEs: []vfrdma.SGE{a.p.mr.SGE(0, 8)}}}, 0)
	require.NoError(t, err)
	waitWCs(t, a.ctx, a.p.cq, 2)
}

// The arm's grace is a bound tried at its value: with none, the first
// empty poll that finds the armed CQ's CQE counts the arm spent and rings
// the POLL doorbell.
func TestArmBesidePollDoorbellWithNoGraceTheFirstLookAfterTheCQESpendsTheArm(t *testing.T) {
	a := newArmBeside(t)
	vfrdma.SetArmSpentGrace(t, a.d, 0)
	require.NoError(t, a.p.cq.Arm(false))
	rung := a.other.Stats().Doorbells
	a.exchange(t, 1)
	a.emptyPoll(t, a.other)
	assert.Equal(t, rung+1, a.other.Stats().Doorbells, "the first empty poll after the CQE rings the POLL doorbell")
	assert.Empty(t, a.m.Hazards())
}

// A new arm starts its own grace: the mark of the last arm's spending is
// not carried over, or an arm whose CQE has just come would count as spent
// at once.
func TestArmBesidePollDoorbellANewArmStartsItsOwnGrace(t *testing.T) {
	a := newArmBeside(t)
	// The first arm, spent at the first look (no grace).
	vfrdma.SetArmSpentGrace(t, a.d, 0)
	require.NoError(t, a.p.cq.Arm(false))
	a.exchange(t, 1)
	rung := a.other.Stats().Doorbells
	a.emptyPoll(t, a.other)
	require.Equal(t, rung+1, a.other.Stats().Doorbells, "the first arm spent")
	// Longer ago than the grace now in force, the second arm's CQE is
	// seen for the first time: its grace starts there. (The second
	// arm's first look is at most a stall of the test away from the one
	// below, far less than the grace.)
	time.Sleep(time.Second)
	vfrdma.SetArmSpentGrace(t, a.d, 500*time.Millisecond)
	require.NoError(t, a.p.cq.Arm(false))
	a.exchange(t, 3)
	rung = a.other.Stats().Doorbells
	a.emptyPoll(t, a.other)
	assert.Equal(t, rung, a.other.Stats().Doorbells, "a POLL doorbell at the first look at the second arm's CQE")
	assert.Empty(t, a.m.Hazards())
}
