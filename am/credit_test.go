//go:build !guest

package am

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stallReceiver makes task 1 of a two-task job stop taking packets: its
// header handler blocks (on the progress goroutine) until the returned
// function is called, so it returns no credits meanwhile.
func stallReceiver(t *testing.T, cs []*Context) (entered <-chan struct{}, release func()) {
	t.Helper()
	in, out := make(chan struct{}, 1), make(chan struct{})
	for _, c := range cs {
		require.NoError(t, c.SetHandler(1, func(a *Arrival) Return {
			select {
			case in <- struct{}{}:
				<-out
			default:
			}
			return Return{Buf: make([]byte, a.Len)}
		}))
	}
	done := false
	release = func() {
		if !done {
			done = true
			close(out)
		}
	}
	t.Cleanup(release)
	return in, release
}

// settled is a sender's state for one task once settle returns, read at
// once: the credits it has left, the messages still queued, and its
// Stats.Packets and Stats.CtrlPackets.
type settled struct {
	credits, queued int
	packets, ctrl   uint64
}

// settle waits until the sender has done all it can for task tgt before
// the task answers: every send it posted has completed (each send slot is
// free again), and it sends nothing more (nothing queued, or only what
// waits for credits: fewer than two left). Only a hang meets ctx's end.
func settle(t *testing.T, ctx context.Context, c *Context, tgt int) settled {
	t.Helper()
	for {
		c.mu.Lock()
		cn := c.conns[tgt]
		s := settled{cn.credits, len(cn.sendq), c.stats.Packets, c.stats.CtrlPackets}
		done := len(c.free) == len(c.busy) && (s.queued == 0 || s.credits < 2)
		c.mu.Unlock()
		if done {
			return s
		}
		select {
		case <-ctx.Done():
			require.FailNow(t, "the sender never settled", "%+v", s)
		case <-time.After(time.Millisecond):
		}
	}
}

// Credit rule: a data packet never spends a task's last credit; it is
// left to a packet that returns credits, so that two tasks sending to
// each other can always tell the other it may go on. With the receiver
// stalled, the sender stops at one credit with data still queued, and
// counts the stall. (The ticker's probes of the silent receiver go
// without a credit: each takes one more.)
func TestDataNeverSpendsTheLastCredit(t *testing.T) {
	d := openDevice(t)
	const credits = 4
	cs := newJob(t, d, 2, Config{Credits: credits, PacketSize: 1024})
	entered, release := stallReceiver(t, cs)
	ctx := withTimeout(t, time.Minute)
	for range 3 * credits {
		require.NoError(t, cs[0].Amsend(1, 1, nil, make([]byte, 64), Counters{}))
	}
	select {
	case <-entered:
	case <-ctx.Done():
		require.FailNow(t, "the receiver's handler never ran")
	}
	s := settle(t, ctx, cs[0], 1)
	assert.EqualValues(t, credits-1, s.packets, "data packets to the stalled receiver: every credit but the last")
	assert.Equal(t, 1, s.credits+int(s.ctrl), "credits left with data queued and the receiver silent, the probes' aside (%d)", s.ctrl)
	assert.Positive(t, s.queued, "data still queued")
	assert.Positive(t, cs[0].Stats().CreditStalls)
	release()
	require.NoError(t, cs[0].Fence(ctx))
	assert.EqualValues(t, 3*credits, cs[1].Stats().Received)
}

// Credit rule, both ways at once: two tasks flooding each other with more
// packets than they have credits for both finish (a rule that let data
// spend the last credit would leave both with owed credits and none to
// send them with).
func TestTwoTasksFloodingEachOtherBothFinish(t *testing.T) {
	d := openDevice(t)
	cs := newJob(t, d, 2, Config{Credits: 2, PacketSize: 512})
	for _, c := range cs {
		require.NoError(t, c.SetHandler(1, func(a *Arrival) Return { return Return{Buf: make([]byte, a.Len)} }))
	}
	runTasks(t, cs, 2*time.Minute, func(ctx context.Context, c *Context) error {
		for i := range 400 {
			if err := c.Amsend(1-c.Self(), 1, nil, make([]byte, 1+i%2000), Counters{}); err != nil {
				return err
			}
		}
		return c.Fence(ctx)
	})
	for _, c := range cs {
		assert.EqualValues(t, 400, c.Stats().Received)
	}
}

// Send-slot rule: data leaves one send slot per task free, for the
// acknowledgements and credits that let the tasks go on. With only Tasks
// slots free, a message stays queued; once slots come back, it goes.
// (Credits alone rarely let the slots run that low: most tasks must be at
// their last credit with a probe in flight at once; the test takes the
// slots away instead.)
func TestDataLeavesASendSlotPerTaskForAcknowledgements(t *testing.T) {
	d := openDevice(t)
	cs := newJob(t, d, 2, Config{})
	got := make(chan struct{}, 4)
	for _, c := range cs {
		require.NoError(t, c.SetHandler(1, func(a *Arrival) Return {
			got <- struct{}{}
			return Return{}
		}))
	}
	ctx := withTimeout(t, time.Minute)
	c := cs[0]
	c.mu.Lock()
	keep := c.cfg.Tasks
	taken := append([]int32(nil), c.free[keep:]...)
	c.free = c.free[:keep]
	c.mu.Unlock()
	before := c.Stats()
	require.NoError(t, c.Amsend(1, 1, nil, make([]byte, 8), Counters{}))
	assert.Equal(t, before.Packets, c.Stats().Packets, "a data packet took one of the last Tasks slots")
	c.mu.Lock()
	c.free = append(c.free, taken...)
	c.mu.Unlock()
	require.NoError(t, c.Amsend(1, 1, nil, make([]byte, 8), Counters{}))
	require.NoError(t, c.Fence(ctx))
	assert.Len(t, got, 2)
}
