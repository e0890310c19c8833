//go:build !guest

package am

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/pvsim"
)

// silentPeerJob is a two-task job on two models: task 1's header handler
// holds its first message (its device still acknowledges what arrives,
// its task returns nothing), and goSilent takes task 1's machine off the
// fabric (its port goes down, as when its VM dies). The hold ends with
// the test.
func silentPeerJob(t *testing.T, cfg Config) (cs []*Context, entered <-chan struct{}, goSilent func()) {
	t.Helper()
	ds, ms := modelNodes(t, 2, pvsim.Config{QEMU: true})
	cs = newJobOn(t, ds, cfg)
	entered, _ = stallReceiver(t, cs)
	return cs, entered, func() { require.NoError(t, ms[1].SetPort(false)) }
}

// Liveness rule: a message sent whole and never acknowledged, to a peer
// that has gone silent, with nothing else queued or in flight (the device
// acknowledged every packet), is not waited for forever: the ticker finds
// the peer silent, a probe goes to it, the probe's retries run out, and
// the task is purged; Fence returns ErrPurged.
func TestAMessageAwaitingTheAckOfAPeerGoneSilentIsProbedAndPurged(t *testing.T) {
	cs, entered, goSilent := silentPeerJob(t, Config{})
	ctx := withTimeout(t, time.Minute)
	require.NoError(t, cs[0].Amsend(1, 1, nil, make([]byte, 8), Counters{}))
	<-entered
	settle(t, ctx, cs[0], 1) // sent and acknowledged by the device: nothing in flight
	goSilent()
	err := cs[0].Fence(ctx)
	assert.ErrorIs(t, err, ErrPurged)
	assert.NoError(t, ctx.Err(), "Fence returned only when its context ended")
	assert.EqualValues(t, 1, cs[0].Stats().Failed)
}

// Liveness rule: a task starved of credits by a peer gone silent (data
// queued, nothing in flight) probes it even without a credit and is
// purged when the probe fails.
func TestASenderStarvedOfCreditsByAPeerGoneSilentIsProbedAndPurged(t *testing.T) {
	const credits = 4
	cs, entered, goSilent := silentPeerJob(t, Config{Credits: credits, PacketSize: 512})
	ctx := withTimeout(t, time.Minute)
	for range 3 * credits {
		require.NoError(t, cs[0].Amsend(1, 1, nil, make([]byte, 8), Counters{}))
	}
	<-entered
	require.Positive(t, settle(t, ctx, cs[0], 1).queued, "data queued for want of credits")
	goSilent()
	err := cs[0].Fence(ctx)
	assert.ErrorIs(t, err, ErrPurged)
	assert.NoError(t, ctx.Err(), "Fence returned only when its context ended")
	assert.EqualValues(t, 3*credits, cs[0].Stats().Failed)
}

// A stall is counted once, however often the sender looks while it lasts
// (every Amsend and progress round looks), and each new stall is counted
// again.
func TestACreditStallIsCountedOncePerStall(t *testing.T) {
	d := openDevice(t)
	const credits = 4
	cs := newJob(t, d, 2, Config{Credits: credits, PacketSize: 512})
	hold := make(chan chan struct{}, 1)
	for _, c := range cs {
		require.NoError(t, c.SetHandler(1, func(a *Arrival) Return {
			select {
			case h := <-hold:
				<-h
			default:
			}
			return Return{}
		}))
	}
	ctx := withTimeout(t, time.Minute)
	for round := 1; round <= 2; round++ {
		h := make(chan struct{})
		hold <- h
		before := cs[0].Stats().CreditStalls // the drain of the round before stalls too
		for range 3 * credits {
			require.NoError(t, cs[0].Amsend(1, 1, nil, make([]byte, 8), Counters{}))
		}
		settle(t, ctx, cs[0], 1)
		assert.EqualValues(t, 1, cs[0].Stats().CreditStalls-before, "round %d: one stall while the receiver holds", round)
		close(h)
		require.NoError(t, cs[0].Fence(ctx))
	}
}

// Data packets carry the credits and the acknowledgements their sender
// owes: a task that took a message and then sends one to its origin
// returns the credit and the acknowledgement in it, with no control
// packet. An Amsend made while the progress goroutine is in a round of
// handlers waits for the round's end, so that it carries what the round
// gathered.
func TestDataPacketsCarryTheCreditsAndAcksOwed(t *testing.T) {
	d := openDevice(t)
	// No spin, so nothing is held back: the buffer goes back to the SRQ
	// at the end of the round, before the round's packets go.
	cs := newJob(t, d, 2, Config{Spin: -1})
	entered, release := stallReceiver(t, cs)
	ctx := withTimeout(t, time.Minute)
	require.NoError(t, cs[0].Amsend(1, 1, nil, make([]byte, 8), Counters{}))
	<-entered // task 1 took it: it owes task 0 one credit, once the buffer is back
	owed := func() int {
		cs[1].mu.Lock()
		defer cs[1].mu.Unlock()
		return cs[1].conns[0].owed + cs[1].conns[0].unposted
	}
	require.Equal(t, 1, owed())
	// Task 0 holds task 1's message in its handler until the test has
	// looked: it sends nothing to task 1 meanwhile.
	arrived, done := make(chan struct{}), make(chan struct{})
	require.NoError(t, cs[0].SetHandler(2, func(a *Arrival) Return {
		close(arrived)
		<-done
		return Return{}
	}))
	require.NoError(t, cs[1].SetHandler(2, func(*Arrival) Return { return Return{} })) // handlers are registered on every task
	before := cs[1].Stats()
	require.NoError(t, cs[1].Amsend(0, 2, nil, make([]byte, 8), Counters{})) // from another goroutine than task 1's stuck progress
	assert.Equal(t, before.Packets, cs[1].Stats().Packets, "sent only at the round's end")
	release()
	<-arrived
	assert.Zero(t, owed(), "the data packet carried the owed credit")
	close(done)
	require.NoError(t, cs[1].Fence(ctx))
	require.NoError(t, cs[0].Fence(ctx))
	after := cs[1].Stats()
	assert.Equal(t, before.CtrlPackets, after.CtrlPackets, "no control packet")
	assert.Equal(t, before.RideAcks+1, after.RideAcks, "the acknowledgement rode on the data packet")
	assert.EqualValues(t, 1, cs[0].Stats().Delivered)
}

// A task that dies while a Barrier waits for it makes the Barrier return
// ErrPurged, not nil: the wait ends on the failure, and the failure is
// what it returns.
func TestABarrierWithATaskThatDiesDuringItReturnsErrPurged(t *testing.T) {
	ds, ms := modelNodes(t, 2, pvsim.Config{QEMU: true})
	cs := newJobOn(t, ds, Config{})
	ctx := withTimeout(t, time.Minute)
	done := make(chan error, 1)
	go func() { done <- cs[0].Barrier(ctx) }() // task 1 never joins it
	waitUntil(t, ctx, func() bool {            // the Barrier sent its messages and waits
		cs[0].mu.Lock()
		defer cs[0].mu.Unlock()
		return cs[0].barriers == 1
	}, "the Barrier never sent its messages")
	settle(t, ctx, cs[0], 1) // the barrier's message is out
	require.NoError(t, ms[1].SetPort(false))
	select {
	case err := <-done:
		assert.ErrorIs(t, err, ErrPurged)
	case <-ctx.Done():
		require.FailNow(t, "the Barrier outlived its context")
	}
}

// Liveness rule, the other way: a silent task is probed only while it owes
// this one something: an acknowledgement, credits for queued data, or its
// message for a Barrier that waits. A missing barrier message with no
// Barrier waiting (one that gave up), or a Barrier whose message from the
// task is in, is no reason. (Faults caught: the Barrier condition widened
// to any missing barrier message, which probes an idle peer at every tick
// while anything else is outstanding; a message that is in taken as
// missing.) The context has no device: a probe would post on a nil QP.
func TestATaskThatOwesNothingIsNotProbed(t *testing.T) {
	for _, tc := range []struct {
		name                string
		barriers            int    // Barriers waiting
		epoch, taskBarriers uint64 // this task's barrier epoch; the last the task's message was for
	}{
		{"a barrier message missing, no Barrier waiting", 0, 1, 0},
		{"a Barrier waiting, the task's message in", 1, 1, 1},
		{"a Barrier waiting, the task already in the next", 1, 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := hostContext(t, Config{Tasks: 2})
			cn := c.conns[1]
			c.mu.Lock()
			defer c.mu.Unlock()
			c.barriers, c.epoch, cn.barrier = tc.barriers, tc.epoch, tc.taskBarriers
			free := len(c.free)
			require.NotPanics(t, func() { c.probe(cn) }, "probed: posted on the task's (nil) QP")
			assert.False(t, cn.probing)
			assert.Zero(t, c.stats.CtrlPackets)
			assert.Len(t, c.free, free)
		})
	}
}
