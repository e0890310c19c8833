//go:build !guest

package am

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The idle policy follows from the configuration and the CQ: Polling
// wins, even on a CQ that cannot be armed; a CQ that cannot be armed
// naps, whatever the spin; otherwise a positive spin (the least is one
// nanosecond) spins before it sleeps, and none sleeps at once.
func TestTheIdlePolicyIsPollingThenNappingThenSpinningThenSleeping(t *testing.T) {
	for _, tc := range []struct {
		polling, armable bool
		spin             time.Duration
		want             idlePolicy
	}{
		{true, true, time.Millisecond, idlePoll},
		{true, false, NapSpin, idlePoll},
		{true, true, -1, idlePoll},
		{false, false, NapSpin, idleSpinNap},
		{false, false, -1, idleSpinNap},
		{false, true, time.Millisecond, idleSpinSleep},
		{false, true, 1, idleSpinSleep},
		{false, true, 0, idleSleep},
		{false, true, -1, idleSleep},
	} {
		assert.Equal(t, tc.want, chooseIdle(tc.polling, tc.armable, tc.spin), "polling %v, armable %v, spin %v", tc.polling, tc.armable, tc.spin)
	}
}

// Each idle policy has its name, the one ProgressMode reports; a value
// that is none of them says so with its number.
func TestEachIdlePolicyHasItsName(t *testing.T) {
	for p, want := range map[idlePolicy]string{
		idlePoll:        "polling",
		idleSpinSleep:   "spin, then sleep",
		idleSleep:       "sleep",
		idleSpinNap:     "spin, then nap",
		idleSpinNap + 1: "idlePolicy(4)",
	} {
		assert.Equal(t, want, p.String())
	}
}

// A polling goroutine holds back for the whole hold; one that spins, for
// at most half its spin (what it holds goes before it sleeps or naps);
// one that does not spin, not at all.
func TestAnIdlePolicyHoldsBackAtMostHalfItsSpinUnlessItPolls(t *testing.T) {
	const hold = 200 * time.Microsecond
	for _, tc := range []struct {
		p    idlePolicy
		spin time.Duration
		want time.Duration
	}{
		{idlePoll, -1, hold},
		{idlePoll, time.Microsecond, hold},
		{idleSpinSleep, time.Millisecond, hold},
		{idleSpinSleep, 2 * hold, hold},
		{idleSpinSleep, 2*hold - 2, hold - 1},
		{idleSpinSleep, 1, 0},
		{idleSleep, 0, 0},
		{idleSleep, -1, 0},
		{idleSpinNap, NapSpin, hold},
		{idleSpinNap, -1, 0},
	} {
		assert.Equal(t, tc.want, tc.p.hold(hold, tc.spin), "%v, spin %v", tc.p, tc.spin)
	}
}

// schedContext is a two-task context with no device, 8 credits a task,
// 256-byte packets (maxAcks 56), a 200 µs hold and a repost batch of 4,
// for the scheduler's rules.
func schedContext(t *testing.T) (*Context, *conn) {
	t.Helper()
	c := hostContext(t, Config{Tasks: 2, Credits: 8, PacketSize: 256})
	c.ackHold, c.repostBatch = ackHold, 4
	return c, c.conns[1]
}

// withFree runs f with only n of c's send slots free.
func withFree(c *Context, n int, f func()) {
	free := c.free
	c.free = c.free[:n]
	defer func() { c.free = free }()
	f()
}

// Data rule: a data packet goes only with data queued to a task not
// purged, at least two credits (the last is left to a packet that returns
// credits) and more free send slots than tasks (one a task is left to
// control packets); with data queued, fewer than two credits is a credit
// stall.
func TestDataMayGoWithTwoCreditsAndMoreFreeSlotsThanTasks(t *testing.T) {
	c, cn := schedContext(t)
	tasks := c.cfg.Tasks
	for _, tc := range []struct {
		name    string
		queued  bool
		purged  bool
		credits int
		free    int
		mayGo   bool
		stalled bool
	}{
		{"nothing queued", false, false, 8, tasks + 1, false, false},
		{"queued, two credits, a slot over the tasks'", true, false, 2, tasks + 1, true, false},
		{"queued, all credits and slots", true, false, 8, len(c.free), true, false},
		{"queued, the last credit", true, false, 1, tasks + 1, false, true},
		{"queued, no credit", true, false, 0, tasks + 1, false, true},
		{"queued, in debt (a probe went without a credit)", true, false, -1, tasks + 1, false, true},
		{"queued, only the tasks' slots free", true, false, 8, tasks, false, false},
		{"queued, to a purged task", true, true, 8, tasks + 1, false, false},
		{"queued, to a purged task, no credit", true, true, 0, tasks + 1, false, false},
		{"nothing queued, no credit", false, false, 0, tasks + 1, false, false},
	} {
		cn.sendq, cn.err, cn.credits = nil, nil, tc.credits
		if tc.queued {
			cn.sendq = []*outMsg{{}}
		}
		if tc.purged {
			cn.err = ErrPurged
		}
		withFree(c, tc.free, func() {
			assert.Equal(t, tc.mayGo, c.dataMayGo(cn), "dataMayGo: %s", tc.name)
			assert.Equal(t, tc.stalled, creditStalled(cn), "creditStalled: %s", tc.name)
		})
	}
}

// Acknowledgement rule: acknowledgements go alone once half a packet of
// them has gathered, busy or not; otherwise only when the progress
// goroutine is idle, at once if wanted, after the hold if held (exactly
// the hold is enough, a nanosecond less is not; a context that holds
// nothing lets them go at its first idle round), never if none are
// queued.
func TestAcksGoAloneAtHalfAPacketOrWhenIdleAndWantedOrHeldTheHold(t *testing.T) {
	c, cn := schedContext(t)
	half := c.maxAcks / 2
	require.Equal(t, 28, half)
	for _, tc := range []struct {
		acks   int
		state  ackState
		idle   bool
		waited time.Duration // since ackAt
		noHold bool          // the context holds nothing (ackHold 0, ackAt zero)
		due    bool
	}{
		{0, acksNone, true, time.Hour, false, false},
		{0, acksNone, true, 0, true, false},
		{1, acksHeld, true, ackHold, false, true},
		{1, acksHeld, true, ackHold - 1, false, false},
		{1, acksHeld, false, time.Hour, false, false},
		{1, acksHeld, true, 0, true, true},
		{1, acksHeld, false, 0, true, false},
		{1, acksWanted, true, 0, false, true},
		{1, acksWanted, false, 0, false, false},
		{half, acksHeld, false, 0, false, true},
		{half - 1, acksHeld, false, 0, false, false},
		{half - 1, acksHeld, true, 0, false, false},
		{half - 1, acksWanted, true, 0, false, true},
	} {
		name := fmt.Sprintf("%d acks %v, idle %v, waited %v, no hold %v", tc.acks, tc.state, tc.idle, tc.waited, tc.noHold)
		cn.acks, cn.ackState = make([]uint32, tc.acks), tc.state
		c.ackHold = ackHold
		cn.ackAt = time.Now()
		now := cn.ackAt.Add(tc.waited)
		if tc.noHold {
			c.ackHold, cn.ackAt, now = 0, time.Time{}, time.Time{}
		}
		assert.Equal(t, tc.due, c.acksDue(cn, tc.idle, now), name)
	}
}

// Credit rule: credits go alone only once half a task's credits are owed
// (rounded down), busy or idle; fewer wait for another packet to carry
// them.
func TestCreditsGoAloneOnlyOnceHalfAreOwed(t *testing.T) {
	for _, credits := range []int{8, 9} {
		c := hostContext(t, Config{Tasks: 2, Credits: credits, PacketSize: 256})
		cn := c.conns[1]
		for owed, due := range map[int]bool{0: false, 1: false, 3: false, 4: true, 5: true, credits: true} {
			cn.owed = owed
			assert.Equal(t, due, c.creditsDue(cn), "%d of %d credits owed", owed, credits)
		}
	}
}

// Control rule: a control packet needs a free send slot and a credit,
// and spends the last credit only if it returns credits.
func TestAControlPacketNeedsASlotAndACreditTheLastOnlyIfItReturnsCredits(t *testing.T) {
	c, cn := schedContext(t)
	for _, tc := range []struct {
		free, credits, owed int
		mayGo               bool
	}{
		{1, 2, 0, true},
		{1, 8, 0, true},
		{0, 8, 4, false},
		{1, 1, 0, false},
		{1, 1, 1, true},
		{1, 0, 1, false},
		{1, -1, 1, false},
		{0, 1, 1, false},
	} {
		cn.credits, cn.owed = tc.credits, tc.owed
		withFree(c, tc.free, func() {
			assert.Equal(t, tc.mayGo, c.ctrlMayGo(cn), "%d slots free, %d credits, %d owed", tc.free, tc.credits, tc.owed)
		})
	}
}

// Control packets wait until they are worth sending (half the credits
// owed, or half a packet of acknowledgements) unless the progress goroutine
// is idle and acknowledgements wait, and an idle one still sends no packet
// that only returns a few credits; a control packet needs a free send slot
// and a credit, and the last credit goes only to a packet that returns
// credits.
func TestControlPacketsWaitUntilWorthSendingAndKeepTheLastCredit(t *testing.T) {
	const credits = 8
	c := hostContext(t, Config{Tasks: 2, Credits: credits, PacketSize: 256})
	c.ackHold = ackHold // a spinning context's
	half := c.maxAcks / 2
	acks := func(n int) []uint32 { return make([]uint32, n) }
	for _, tc := range []struct {
		name          string
		credits, owed int
		acks          []uint32
		free          int // send slots left free (-1: all)
		idle          bool
		due           bool
		held          bool // the acks have waited less than ackHold, for no one
		soon          bool // their origin waits for them
	}{
		{"nothing to send", credits, 0, nil, -1, true, false, false, false},
		{"busy, a few acks and credits owed", credits, 1, acks(1), -1, false, false, false, false},
		{"busy, credits owed, under half", credits, credits/2 - 1, nil, -1, false, false, false, false},
		{"busy, half the credits owed", credits, credits / 2, nil, -1, false, true, false, false},
		{"busy, half a packet of acks", credits, 0, acks(half), -1, false, true, false, false},
		{"busy, one ack short of half a packet", credits, 0, acks(half - 1), -1, false, false, false, false},
		{"idle, a few credits owed and no acks", credits, 1, nil, -1, true, false, false, false},
		{"idle, one ack and nothing owed", credits, 0, acks(1), -1, true, true, false, false},
		{"idle, one ack and a credit owed", credits, 1, acks(1), -1, true, true, false, false},
		{"idle, acks, only the last credit and none owed", 1, 0, acks(1), -1, true, false, false, false},
		{"idle, acks, the last credit and a credit owed", 1, 1, acks(1), -1, true, true, false, false},
		{"worth it, the last credit, returning credits", 1, credits / 2, nil, -1, false, true, false, false},
		{"worth it, but no credit", 0, credits / 2, acks(half), -1, true, false, false, false},
		{"worth it, in debt (a probe went without a credit)", -1, credits / 2, acks(half), -1, true, false, false, false},
		{"worth it, but no send slot", credits, credits / 2, acks(half), 0, true, false, false, false},
		{"worth it, one send slot", credits, credits / 2, acks(half), 1, true, true, false, false},
		{"idle, one ack held for a packet to ride on", credits, 0, acks(1), -1, true, false, true, false},
		{"idle, one ack held, and a credit owed", credits, 1, acks(1), -1, true, false, true, false},
		{"idle, one ack its origin waits for", credits, 0, acks(1), -1, true, true, true, true},
		{"busy, one ack its origin waits for", credits, 0, acks(1), -1, false, false, true, true},
		{"worth it, acks held", credits, credits / 2, acks(half), -1, false, true, true, false},
	} {
		cn := c.conns[1]
		cn.credits, cn.owed, cn.acks = tc.credits, tc.owed, tc.acks
		switch {
		case len(tc.acks) == 0:
			cn.ackState = acksNone
		case tc.soon:
			cn.ackState = acksWanted
		default:
			cn.ackState = acksHeld
		}
		cn.ackAt = time.Now()
		now := cn.ackAt.Add(c.ackHold) // held as long as it may be
		if tc.held {
			now = cn.ackAt.Add(c.ackHold / 2)
		}
		free := len(c.free)
		if tc.free >= 0 {
			free = tc.free
		}
		withFree(c, free, func() {
			assert.Equal(t, tc.due, c.ctrlDue(cn, tc.idle, now), tc.name)
		})
	}
}

// Acknowledgement state: the first acknowledgement queued is held, with
// its time; one its origin waits for makes the queue wanted until the
// queue is empty again (taking some leaves it wanted); an empty queue, or
// a purged task's, is none.
func TestAckStateIsWantedUntilTheQueueEmptiesAndHeldOtherwise(t *testing.T) {
	c, cn := schedContext(t)
	c.ack(cn, 1, false, true)
	assert.Equal(t, acksHeld, cn.ackState, "a first ack no one waits for")
	assert.False(t, cn.ackAt.IsZero(), "held since when")
	at := cn.ackAt
	c.ack(cn, 2, false, true)
	assert.Equal(t, acksHeld, cn.ackState)
	assert.Equal(t, at, cn.ackAt, "held since the first")
	c.ack(cn, 3, true, true)
	assert.Equal(t, acksWanted, cn.ackState, "an ack its origin waits for")
	c.ack(cn, 4, false, true)
	assert.Equal(t, acksWanted, cn.ackState, "wanted stays")
	c.takeAcks(cn, 3)
	assert.Equal(t, acksWanted, cn.ackState, "taking some leaves the rest wanted")
	c.takeAcks(cn, 1)
	assert.Equal(t, acksNone, cn.ackState, "the queue is empty")
	assert.Empty(t, cn.acks)

	c.ack(cn, 5, true, true)
	assert.Equal(t, acksWanted, cn.ackState, "a first ack its origin waits for")

	c.ackHold = 0
	c.takeAcks(cn, 1)
	cn.ackAt = time.Time{}
	c.ack(cn, 6, false, true)
	assert.True(t, cn.ackAt.IsZero(), "a context that holds nothing keeps no time")

	c.mu.Lock()
	c.fail(cn, errors.New("purged by the test"))
	c.mu.Unlock()
	assert.Equal(t, acksNone, cn.ackState, "purged")
	c.ack(cn, 7, true, true)
	assert.Equal(t, acksNone, cn.ackState, "nothing is queued for a purged task")
	assert.Empty(t, cn.acks)
}

// Liveness rule: a task is probed at a look only if it has said nothing
// since the last look, has no probe on its way, is not purged, owes this
// task something (an acknowledgement of a message sent, credits for data
// queued, its message for a Barrier that waits) and a send slot is free.
func TestAProbeGoesOnlyToASilentTaskThatOwesWithNoProbeOut(t *testing.T) {
	c, cn := schedContext(t)
	for _, tc := range []struct {
		name     string
		heard    bool // a packet came since the last look
		probing  bool
		purged   bool
		queued   bool // data queued to it
		sent     bool // a message awaiting its acknowledgement
		barriers int  // Barriers waiting
		epoch    uint64
		barrier  uint64 // the last barrier its message came for
		free     int
		due      bool
	}{
		{"silent, owes an ack", false, false, false, false, true, 0, 0, 0, 1, true},
		{"silent, owes credits for queued data", false, false, false, true, false, 0, 0, 0, 1, true},
		{"silent, owes its barrier message", false, false, false, false, false, 1, 3, 2, 1, true},
		{"silent, owes nothing", false, false, false, false, false, 0, 0, 0, 1, false},
		{"silent, its barrier message in", false, false, false, false, false, 1, 3, 3, 1, false},
		{"silent, a barrier message missing, no Barrier waiting", false, false, false, false, false, 0, 3, 2, 1, false},
		{"heard from, owes an ack", true, false, false, false, true, 0, 0, 0, 1, false},
		{"silent, owes an ack, a probe out", false, true, false, false, true, 0, 0, 0, 1, false},
		{"silent, owes an ack, purged", false, false, true, false, true, 0, 0, 0, 1, false},
		{"silent, owes an ack, no slot", false, false, false, false, true, 0, 0, 0, 0, false},
	} {
		cn.heard, cn.heardSeen = 5, 5
		if tc.heard {
			cn.heard++
		}
		cn.probing, cn.err, cn.sendq, cn.sent = tc.probing, nil, nil, map[uint32]*outMsg{}
		if tc.purged {
			cn.err = ErrPurged
		}
		if tc.queued {
			cn.sendq = []*outMsg{{}}
		}
		if tc.sent {
			cn.sent[0] = &outMsg{}
		}
		c.barriers, c.epoch, cn.barrier = tc.barriers, tc.epoch, tc.barrier
		withFree(c, tc.free, func() {
			assert.Equal(t, tc.due, c.probeDue(cn), tc.name)
		})
	}
}

// Repost rule: taken buffers go back to the SRQ once a batch has
// gathered, busy or idle, or when the goroutine is idle and has held them
// for the hold (exactly the hold is enough); none held, none go.
func TestTakenBuffersGoBackInABatchOrWhenIdleAfterTheHold(t *testing.T) {
	c, _ := schedContext(t)
	at := time.Now()
	for _, tc := range []struct {
		n      int
		idle   bool
		waited time.Duration
		due    bool
	}{
		{4, false, 0, true},
		{5, false, 0, true},
		{3, false, time.Hour, false},
		{3, true, ackHold, true},
		{3, true, ackHold - 1, false},
		{1, true, ackHold, true},
		{0, true, time.Hour, false},
	} {
		assert.Equal(t, tc.due, c.repostDue(tc.n, tc.idle, at.Add(tc.waited), at), "%d held, idle %v, for %v", tc.n, tc.idle, tc.waited)
	}
}
