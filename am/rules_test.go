//go:build !guest

package am

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/pvsim"
)

// Amsend rings its doorbell before it returns: the packets it posted do
// not wait for the progress goroutine's next round (up to probeEvery when
// nothing else wakes it).
func TestAmsendRingsItsDoorbellBeforeItReturns(t *testing.T) {
	d := openDevice(t)
	cs := newJob(t, d, 2, Config{})
	for _, c := range cs {
		require.NoError(t, c.SetHandler(1, func(*Arrival) Return { return Return{} }))
	}
	before := cs[0].Stats().Doorbells
	require.NoError(t, cs[0].Amsend(1, 1, nil, make([]byte, 8), Counters{}))
	assert.Greater(t, cs[0].Stats().Doorbells, before)
	require.NoError(t, cs[0].Fence(withTimeout(t, time.Minute)))
}

// A context with nothing to send rings no doorbell: the progress
// goroutine's rounds (the ticker wakes it every probeEvery) flush only
// queues that have deferred posts.
func TestAnIdleContextRingsNoDoorbell(t *testing.T) {
	d := openDevice(t)
	cs := newJob(t, d, 2, Config{})
	for _, c := range cs {
		require.NoError(t, c.SetHandler(1, func(*Arrival) Return { return Return{} }))
	}
	trafficBothWays(t, cs)
	ctx := withTimeout(t, 5*time.Minute) // a hang guard
	before := stillBells(t, ctx, cs)
	rounds(t, ctx, cs, polls(cs), 3) // rounds of the progress goroutines, woken by their tickers
	assert.Equal(t, before, bells(cs))
}

// Stats.Doorbells counts each doorbell the context rings, on its send
// queues and on its SRQ, for requests and acknowledgements alike: after
// traffic both ways the two contexts' counts add up to the send and SRQ
// doorbells the device received. (Fault caught: the doorbell that sends
// acknowledgements and credits counted down instead of up.)
func TestStatsCountEveryDoorbellTheContextRings(t *testing.T) {
	d, m := openModel(t, pvsim.Config{QEMU: true})
	cs := newJob(t, d, 2, Config{})
	for _, c := range cs {
		require.NoError(t, c.SetHandler(1, func(*Arrival) Return { return Return{} }))
	}
	trafficBothWays(t, cs)
	require.NotZero(t, cs[0].Stats().CtrlPackets+cs[1].Stats().CtrlPackets, "no control packet was sent")
	// Closed, the contexts ring no more (Stats is read after Close), and
	// their Close destroys queues with commands, which the model takes
	// from the same queue as doorbells, after them: once the Closes
	// return, the model has taken every doorbell the contexts rang.
	var got uint64
	for _, c := range cs {
		require.NoError(t, c.Close())
		got += c.Stats().Doorbells
	}
	st := m.Stats()
	assert.Equal(t, st.SQDoorbells+st.SRQDoorbells, got, "device: %d send and %d SRQ doorbells", st.SQDoorbells, st.SRQDoorbells)
}

// trafficBothWays has each of two tasks send the other 20 messages, then
// both meet in a Barrier and Fence: requests and acknowledgements have been
// posted on every QP.
func trafficBothWays(t *testing.T, cs []*Context) {
	t.Helper()
	runTasks(t, cs, time.Minute, func(ctx context.Context, c *Context) error {
		for range 20 {
			if err := c.Amsend(1-c.Self(), 1, nil, make([]byte, 8), Counters{}); err != nil {
				return err
			}
		}
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		return c.Fence(ctx) // the barrier's messages acknowledged
	})
}

func bells(cs []*Context) []uint64 {
	b := make([]uint64, len(cs))
	for i, c := range cs {
		b[i] = c.Stats().Doorbells
	}
	return b
}

// polls returns how many times each context's progress goroutine has
// polled its CQ: once a round.
func polls(cs []*Context) []uint64 {
	p := make([]uint64, len(cs))
	for i, c := range cs {
		p[i] = c.cq.Stats().Polls
	}
	return p
}

// rounds waits until each context's progress goroutine has polled its CQ
// k times more than from says: the round under way at from has ended, and
// k-1 rounds more have begun. Only a hang meets ctx's end.
func rounds(t *testing.T, ctx context.Context, cs []*Context, from []uint64, k uint64) {
	t.Helper()
	for i, c := range cs {
		for c.cq.Stats().Polls < from[i]+k {
			select {
			case <-ctx.Done():
				require.FailNow(t, "a progress goroutine stopped", "task %d polled %d times, waiting for %d", i, c.cq.Stats().Polls, from[i]+k)
			case <-time.After(time.Millisecond):
			}
		}
	}
}

// stillBells returns the contexts' doorbell counts once they hold still:
// the last acknowledgements' buffers go back to the SRQ (a doorbell) just
// after the Fences return, and what is rung may bring a packet that makes
// the peer ring. Still is the same counts across two rounds of every
// progress goroutine, three times in a row. What is left to ring after
// traffic is a few doorbells, each of which can break at most one spell:
// contexts that still ring after 50 spells ring when idle.
func stillBells(t *testing.T, ctx context.Context, cs []*Context) []uint64 {
	t.Helper()
	before := bells(cs)
	for spells, still := 0, 0; still < 3; spells++ {
		require.Less(t, spells, 50, "the contexts rang in spells of idling: %v doorbells", before)
		rounds(t, ctx, cs, polls(cs), 2)
		now := bells(cs)
		if slices.Equal(now, before) {
			still++
		} else {
			still, before = 0, now
		}
	}
	return before
}

// stalledJob is a two-task job whose task 1 has taken one message from
// task 0 and sits in its header handler: it owes task 0 one credit and has
// no acknowledgement queued yet. The returned function lets it go on.
func stalledJob(t *testing.T) (cs []*Context, release func()) {
	t.Helper()
	d := openDevice(t)
	cs = newJob(t, d, 2, Config{})
	entered, release := stallReceiver(t, cs)
	require.NoError(t, cs[0].Amsend(1, 1, nil, make([]byte, 8), Counters{}))
	select {
	case <-entered:
	case <-time.After(time.Minute):
		t.Fatal("task 1's header handler never ran")
	}
	return cs, release
}

// A purge with exactly one message outstanding fails that message: Fence
// returns ErrPurged and Failed counts one.
func TestPurgeWithOneMessageOutstandingFailsIt(t *testing.T) {
	cs, release := stalledJob(t)
	ctx := withTimeout(t, time.Minute)
	require.NoError(t, cs[0].Purge(ctx, 1))
	err := cs[0].Fence(ctx)
	assert.ErrorIs(t, err, ErrPurged)
	assert.NoError(t, ctx.Err())
	assert.EqualValues(t, 1, cs[0].Stats().Failed)
	release()
}

// A queue closed under the context fails it, whichever packet finds it
// closed: a data packet's post (Amsend's) or a control packet's (the
// acknowledgement the receiver owes). The context's calls then return
// ErrClosed, and its Fence does not wait for what can never come.
func TestAQueueClosedUnderTheContextFailsIt(t *testing.T) {
	t.Run("data", func(t *testing.T) {
		d := openDevice(t)
		cs := newJob(t, d, 2, Config{})
		for _, c := range cs {
			require.NoError(t, c.SetHandler(1, func(*Arrival) Return { return Return{} }))
		}
		ctx := withTimeout(t, time.Minute)
		require.NoError(t, cs[0].conns[1].out.Close())
		_ = cs[0].Amsend(1, 1, nil, make([]byte, 8), Counters{}) // taken or refused: either way it cannot go
		err := cs[0].Fence(ctx)
		assert.ErrorIs(t, err, vfrdma.ErrClosed)
		assert.NoError(t, ctx.Err())
	})
	t.Run("acknowledgement", func(t *testing.T) {
		cs, release := stalledJob(t)
		ctx := withTimeout(t, time.Minute)
		require.NoError(t, cs[1].conns[0].in.Close())
		release() // the message lands; its acknowledgement cannot be posted
		require.Eventually(t, func() bool {
			return cs[1].Amsend(0, 1, nil, nil, Counters{}) != nil
		}, time.Minute, time.Millisecond, "task 1 goes on as if its acknowledgement had left")
		assert.ErrorIs(t, cs[1].Fence(ctx), vfrdma.ErrClosed)
	})
}

// A progress goroutine that can no longer sleep (its wait set failed)
// fails the context rather than stop unnoticed: later calls return the
// error, and nothing waits for a progress that will not come.
func TestAProgressGoroutineThatCannotSleepFailsTheContext(t *testing.T) {
	d := openDevice(t)
	cs := newJob(t, d, 1, Config{})
	c := cs[0]
	require.NoError(t, c.SetHandler(1, func(*Arrival) Return { return Return{} }))
	require.NoError(t, c.ws.Remove(c.cq.Source()))
	require.NoError(t, c.ws.Close())
	c.ws.Wake() // its next round: TryWait on a closed set
	select {
	case <-c.done:
	case <-time.After(time.Minute):
		t.Fatal("the progress goroutine went on")
	}
	assert.Error(t, c.Amsend(0, 1, nil, nil, Counters{}), "a context without progress took a message")
	assert.Error(t, c.Fence(withTimeout(t, time.Minute)))
}

// Amsend's limits are inclusive where its doc says "at most": a user
// header of exactly MaxUHdr bytes, handler indices 0 and MaxHandlers-1,
// target counter MaxCounters-1 and the last task are all taken and
// delivered.
func TestAmsendTakesItsBoundaryValues(t *testing.T) {
	d := openDevice(t)
	cs := newJob(t, d, 2, Config{})
	got := make(chan int, 8)
	tgt := NewCounter()
	for _, c := range cs {
		for _, h := range []int{0, MaxHandlers - 1} {
			require.NoError(t, c.SetHandler(h, func(a *Arrival) Return {
				got <- len(a.UHdr)
				return Return{}
			}))
		}
		require.NoError(t, c.SetCounter(MaxCounters-1, tgt))
	}
	c := cs[0]
	last := c.Tasks() - 1
	require.NoError(t, c.Amsend(last, 0, make([]byte, c.MaxUHdr()), nil, Counters{}), "a user header of exactly MaxUHdr bytes, handler 0")
	require.NoError(t, c.Amsend(last, MaxHandlers-1, nil, nil, Counters{Tgt: MaxCounters - 1}), "the last handler and counter")
	require.NoError(t, c.Fence(withTimeout(t, time.Minute)))
	assert.Equal(t, c.MaxUHdr(), <-got)
	assert.Equal(t, 0, <-got)
	assert.EqualValues(t, 1, tgt.Get())
}

// A post the QP refuses (a VMware device raised a QP error: the driver
// moved the QP to ERR, and sends need RTS) purges the task it was for:
// Fence returns ErrPurged rather than wait for a message that never left.
func TestAPostRefusedByAQPInErrorPurgesItsTask(t *testing.T) {
	d, m := openModel(t, pvsim.Config{Version: 20})
	cs := newJob(t, d, 2, Config{})
	for _, c := range cs {
		require.NoError(t, c.SetHandler(1, func(*Arrival) Return { return Return{} }))
	}
	qp := cs[0].conns[1].out
	info, ok := m.QPByNumber(qp.QPN())
	require.True(t, ok)
	require.NoError(t, m.ErrorQP(info.Handle))
	require.Eventually(t, func() bool { return qp.State() == vfrdma.StateErr }, time.Minute, time.Millisecond, "the driver never took the QP error event")
	ctx := withTimeout(t, time.Minute)
	_ = cs[0].Amsend(1, 1, nil, make([]byte, 8), Counters{}) // taken or refused: it cannot leave
	assert.ErrorIs(t, cs[0].Fence(ctx), ErrPurged)
	assert.NoError(t, ctx.Err(), "Fence returned only when its context ended")
}

// The progress goroutine keeps polling for Config.Spin once its CQ goes
// empty, and arms the CQ and sleeps only after it: traffic within the spin
// costs no arm doorbell; with a negative Spin it arms as soon as a poll
// finds nothing, and so it does by default on QEMU's device, whose spin is
// none (CQ.Spin). (Faults caught: no spin; a spin that never ends.)
func TestTheProgressGoroutineSpinsBeforeItSleeps(t *testing.T) {
	arms := func(c *Context) uint64 { return c.cq.Stats().Doorbells } // the CQ's doorbells: its arms
	for _, tc := range []struct {
		spin  time.Duration
		sleep bool
	}{{time.Hour, false}, {time.Millisecond, true}, {-1, true}, {0, true}} {
		t.Run(tc.spin.String(), func(t *testing.T) {
			d := openDevice(t)
			cs := newJob(t, d, 2, Config{Spin: tc.spin})
			for _, c := range cs {
				require.NoError(t, c.SetHandler(1, func(*Arrival) Return { return Return{} }))
			}
			trafficBothWays(t, cs)
			if !tc.sleep {
				time.Sleep(3 * probeEvery) // idle rounds: still within the spin
				assert.Zero(t, arms(cs[0])+arms(cs[1]), "a CQ was armed within the spin")
				return
			}
			require.Eventually(t, func() bool { return arms(cs[0]) > 0 && arms(cs[1]) > 0 }, time.Minute, time.Millisecond,
				"the progress goroutines never armed their CQs to sleep")
		})
	}
}

// The first failed completion of a task still in the job, on a device that
// is closing, names the close: the cause wraps vfrdma.ErrClosed (and so
// ends the context at once) rather than the flush the close caused. A
// later failure of a task already purged keeps its own cause, and the
// device is not asked again. (Fault caught: the device never asked while
// the context is alive, which purges the task with the bare flush and
// leaves Amsend to it returning ErrPurged instead of ErrClosed.)
func TestTheFirstFailedCompletionOnAClosingDeviceNamesTheClose(t *testing.T) {
	d := openDevice(t)
	cs := newJob(t, d, 2, Config{})
	gone := openDevice(t)
	require.NoError(t, gone.Close())
	c := cs[0]
	c.mu.Lock()
	live, cn := c.d, c.conns[1]
	c.d = gone // what closing() asks: a device that has closed
	c.mu.Unlock()
	t.Cleanup(func() { c.mu.Lock(); c.d = live; c.mu.Unlock() })
	flush := errors.New("send completed with WR_FLUSH_ERR")

	assert.ErrorIs(t, c.failedCompletion(cn, flush), vfrdma.ErrClosed, "the first failure on a closing device")
	c.mu.Lock()
	cn.err = fmt.Errorf("%w: task 1: earlier", ErrPurged)
	c.mu.Unlock()
	err := c.failedCompletion(cn, flush)
	assert.Equal(t, flush, err, "a task already purged: its cause as it came")
	c.mu.Lock()
	cn.err = nil
	c.mu.Unlock()
}

// With Options.PollDoorbell on QEMU's device a CQ is never armed (its
// POLL doorbell would deadlock the VM against an armed CQ's interrupt),
// so the progress goroutine cannot sleep on the interrupt: it spins, then
// naps between polls (pauses doubling to a millisecond), woken early by
// work to send. Traffic flows, before and after an idle spell, and an
// idle context polls about once per millisecond, not in a loop.
// (Faults caught: the CQ armed anyway, which fails the context with
// ErrNotSupported; a spin restarted after each nap, which polls in a
// loop.)
func TestOnACQThatCannotBeArmedTheProgressGoroutineNaps(t *testing.T) {
	m, err := pvsim.New(pvsim.Config{QEMU: true})
	require.NoError(t, err)
	d, err := vfrdma.OpenFunction(m, &vfrdma.Options{PollDoorbell: true})
	if err != nil {
		m.Close()
		require.NoError(t, err)
	}
	t.Cleanup(func() { d.Close(); m.Close() })
	cs := newJob(t, d, 2, Config{})
	for _, c := range cs {
		require.NoError(t, c.SetHandler(1, func(*Arrival) Return { return Return{} }))
		require.Equal(t, idleSpinNap, c.onIdle)
		assert.Equal(t, NapSpin, c.spin, "the default spin before the naps")
		assert.Equal(t, "spin, then nap", c.ProgressMode())
	}
	trafficBothWays(t, cs)
	time.Sleep(NapSpin + 20*time.Millisecond) // past the spin, the naps at their longest
	before, start := polls(cs[:1]), time.Now()
	time.Sleep(100 * time.Millisecond)
	// Over the time that passed, however long the sleep took: a napper
	// polls about once per napMax, a loop without naps thousands of times
	// as often; the bound is ten times the napper's rate.
	n, elapsed := polls(cs[:1])[0]-before[0], time.Since(start)
	assert.Less(t, n, uint64(10*elapsed/napMax), "an idle context polled %d times in %v: it does not nap", n, elapsed)
	rounds(t, withTimeout(t, time.Minute), cs[:1], before, 1) // an idle context goes on polling
	trafficBothWays(t, cs)                                    // after the idle spell: Amsend's Wake ends a nap
}

// ProgressMode names how the progress goroutine waits: on QEMU's device
// with no spin it sleeps on the interrupt at once; with a spin it spins
// first; with Polling it never sleeps.
func TestProgressModeSaysHowTheProgressGoroutineWaits(t *testing.T) {
	d := openDevice(t)
	for _, tc := range []struct {
		cfg  Config
		want string
	}{{Config{}, "sleep"}, {Config{Spin: time.Millisecond}, "spin, then sleep"}, {Config{Polling: true}, "polling"}} {
		cs := newJob(t, d, 1, tc.cfg)
		assert.Equal(t, tc.want, cs[0].ProgressMode(), "%+v", tc.cfg)
	}
}

// An acknowledgement that no one waits for (the message had no Cmpl
// counter) waits at its target for a data packet to ride on: the target's
// answer carries it, and no control packet goes. Here the hold is an hour,
// so only the answer can deliver it.
func TestAnAcknowledgementNoOneWaitsForRidesOnTheNextMessage(t *testing.T) {
	d := openDevice(t)
	cs := newHoldingJob(t, d, 2, Config{Polling: true}, time.Hour)
	got := make(chan int, 2)
	for _, c := range cs {
		require.NoError(t, c.SetHandler(1, func(a *Arrival) Return { got <- a.Src; return Return{} }))
	}
	ctx := withTimeout(t, time.Minute)
	require.NoError(t, cs[0].Amsend(1, 1, nil, make([]byte, 8), Counters{}))
	require.Equal(t, 0, <-got)
	assert.Zero(t, cs[0].Stats().Delivered, "held at the target")
	require.NoError(t, cs[1].Amsend(0, 1, nil, make([]byte, 8), Counters{}))
	require.Equal(t, 1, <-got)
	require.NoError(t, cs[0].Fence(ctx))
	assert.EqualValues(t, 1, cs[0].Stats().Delivered)
	assert.EqualValues(t, 1, cs[1].Stats().RideAcks)
	assert.Zero(t, cs[1].Stats().CtrlPackets)
}

// An acknowledgement its origin waits for (a Cmpl counter) is not held:
// it goes in a control packet as soon as the target is idle, though no
// data packet goes back.
func TestAnAcknowledgementItsOriginWaitsForGoesAtOnce(t *testing.T) {
	cs := pollingJob(t, time.Hour)
	ctx := withTimeout(t, time.Minute)
	cmpl := NewCounter()
	require.NoError(t, cs[0].Amsend(1, 1, nil, make([]byte, 8), Counters{Cmpl: cmpl}))
	_, err := cmpl.Wait(ctx, 1)
	require.NoError(t, err)
	assert.EqualValues(t, 1, cs[1].Stats().CtrlPackets)
	assert.Zero(t, cs[1].Stats().RideAcks)

	// The next message's origin waits for nothing: its acknowledgement is
	// held again, and rides on the answer.
	require.NoError(t, cs[0].Amsend(1, 1, nil, make([]byte, 8), Counters{}))
	require.Eventually(t, func() bool { return cs[1].Stats().Received == 2 }, time.Minute, time.Millisecond)
	require.NoError(t, cs[1].Amsend(0, 1, nil, make([]byte, 8), Counters{}))
	require.NoError(t, cs[0].Fence(ctx))
	assert.EqualValues(t, 1, cs[1].Stats().CtrlPackets, "no second control packet")
	assert.EqualValues(t, 1, cs[1].Stats().RideAcks)
}

// A held acknowledgement goes alone once it has waited the hold with no
// data packet to ride on: a Fence with nothing coming back returns.
func TestAHeldAcknowledgementGoesAloneAfterTheHold(t *testing.T) {
	cs := pollingJob(t, 20*time.Millisecond)
	ctx := withTimeout(t, time.Minute)
	require.NoError(t, cs[0].Amsend(1, 1, nil, make([]byte, 8), Counters{}))
	require.NoError(t, cs[0].Fence(ctx))
	assert.EqualValues(t, 1, cs[0].Stats().Delivered)
	assert.EqualValues(t, 1, cs[1].Stats().CtrlPackets)
}

// An answer sent from a header handler goes at the end of the progress
// goroutine's round, after the message it answers was acknowledged, and
// carries that acknowledgement: a ping-pong sends no control packets.
// The hold is an hour: only the answer can deliver the acknowledgement.
func TestAnAnswerFromAHandlerCarriesTheAcknowledgement(t *testing.T) {
	d := openDevice(t)
	cs := newHoldingJob(t, d, 2, Config{Polling: true}, time.Hour)
	pongs := make(chan struct{}, 1)
	require.NoError(t, cs[1].SetHandler(1, func(a *Arrival) Return {
		assert.NoError(t, cs[1].Amsend(a.Src, 2, nil, a.Data, Counters{}))
		return Return{}
	}))
	require.NoError(t, cs[0].SetHandler(1, func(*Arrival) Return { return Return{} }))
	require.NoError(t, cs[0].SetHandler(2, func(*Arrival) Return { pongs <- struct{}{}; return Return{} }))
	require.NoError(t, cs[1].SetHandler(2, func(*Arrival) Return { return Return{} }))
	ctx := withTimeout(t, 30*time.Second)
	const rounds = 5
	for range rounds {
		require.NoError(t, cs[0].Amsend(1, 1, nil, make([]byte, 8), Counters{}))
		<-pongs
	}
	require.NoError(t, cs[0].Fence(ctx), "every ping acknowledged by its pong")
	assert.EqualValues(t, rounds, cs[1].Stats().RideAcks, "each pong carried its ping's acknowledgement")
	assert.Zero(t, cs[1].Stats().CtrlPackets)
	assert.EqualValues(t, rounds-1, cs[0].Stats().RideAcks, "each ping carried the last pong's")
	assert.Zero(t, cs[0].Stats().CtrlPackets)
}

// A busy progress goroutine gives the buffers it took back to the SRQ
// repostBatch at a time, one doorbell each batch, and their credits with
// them. The hold is an hour: only a full batch goes back.
func TestTakenBuffersGoBackToTheSRQInBatches(t *testing.T) {
	cs := pollingJob(t, time.Hour)
	ctx := withTimeout(t, time.Minute)
	cmpl := NewCounter()
	send := func(n int) {
		t.Helper()
		for range n {
			require.NoError(t, cs[0].Amsend(1, 1, nil, make([]byte, 8), Counters{Cmpl: cmpl}))
		}
		_, err := cmpl.Wait(ctx, int64(n)) // taken, and acknowledged
		require.NoError(t, err)
	}
	send(repostBatch - 1)
	assert.Zero(t, cs[1].Stats().RecvDoorbells, "one buffer short of a batch: all held")
	send(1)
	assert.EqualValues(t, 1, cs[1].Stats().RecvDoorbells, "a batch: one doorbell")
	const more = 8 * repostBatch
	send(more)
	st := cs[1].Stats()
	assert.EqualValues(t, repostBatch+more, st.Received)
	assert.LessOrEqual(t, st.RecvDoorbells, uint64(1+more/repostBatch))
	assert.Positive(t, st.RecvDoorbells)
}

// pollingJob is a two-task job on one model whose progress goroutines
// poll, holding acknowledgements back for hold, with a handler at index 1
// that takes every message in the call.
func pollingJob(t *testing.T, hold time.Duration) []*Context {
	t.Helper()
	cs := newHoldingJob(t, openDevice(t), 2, Config{Polling: true}, hold)
	for _, c := range cs {
		require.NoError(t, c.SetHandler(1, func(*Arrival) Return { return Return{} }))
	}
	return cs
}

// A task that closes right after taking a message first lets its last
// exchanges end (Close lingers): the acknowledgement it was holding back
// (no one waited for it: the message had no Cmpl counter, and the hold is
// an hour) goes before it leaves, so the origin's Fence succeeds instead
// of finding the task gone, and a Barrier before the Close is a clean end
// of a job.
func TestATaskThatClosesSendsTheAcknowledgementsItHeldFirst(t *testing.T) {
	d := openDevice(t)
	cs := newHoldingJob(t, d, 2, Config{Polling: true}, time.Hour)
	got := make(chan int, 1)
	for _, c := range cs {
		require.NoError(t, c.SetHandler(1, func(a *Arrival) Return { got <- a.Src; return Return{} }))
	}
	require.NoError(t, cs[1].Amsend(0, 1, nil, make([]byte, 8), Counters{}))
	require.Equal(t, 1, <-got)
	assert.Zero(t, cs[1].Stats().Delivered, "held at the target")
	require.NoError(t, cs[0].Close())
	ctx := withTimeout(t, time.Minute)
	assert.NoError(t, cs[1].Fence(ctx), "task 0 acknowledged the message before it left")
	assert.EqualValues(t, 1, cs[1].Stats().Delivered)
	assert.Zero(t, cs[1].Stats().Failed)
}
