package am

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Rule 1 and 2 together, three tasks on one device: every task sends to
// every task, itself included, messages of 0 B, 8 B, one packet exactly,
// one byte more, 64 KiB and 1 MiB; every byte is checked in the completion
// handler, and org, tgt and cmpl reach exactly their expected values.
func TestEveryTaskToEveryTaskEveryByteCheckedAndCountersExact(t *testing.T) {
	d := openDevice(t)
	cs := newJob(t, d, 3, Config{})
	one := cs[0].OnePacket(16)
	sizes := []int{0, 8, one, one + 1, 64 << 10, 1 << 20}
	runTasks(t, cs, 3*time.Minute, func(ctx context.Context, c *Context) error { return allToAll(ctx, c, sizes) })
	for i, c := range cs {
		s := c.Stats()
		t.Logf("task %d: %+v (%.2f doorbells per packet)", i, s, float64(s.Doorbells)/float64(s.Packets+s.CtrlPackets))
	}
}

// Rule 1: the header handler gets the user header and the length on the
// first packet, and its buffer receives the data; the completion handler
// runs on a goroutine of its own, so one that blocks does not stop the
// next message's header handler; with Inline it runs on the progress
// goroutine, before the next message's header handler.
func TestCompletionHandlerRunsOnItsOwnGoroutineOrInlineWhenAsked(t *testing.T) {
	d := openDevice(t)
	cs := newJob(t, d, 2, Config{})
	ctx := withTimeout(t, time.Minute)
	t.Run("own goroutine", func(t *testing.T) {
		release := make(chan struct{})
		heads := make(chan int, 2)
		var ran atomic.Int32
		require.NoError(t, cs[1].SetHandler(2, func(a *Arrival) Return {
			heads <- int(a.UHdr[0])
			if a.UHdr[0] == 0 {
				return Return{Buf: make([]byte, a.Len), Completion: func() { <-release; ran.Add(1) }}
			}
			return Return{Buf: make([]byte, a.Len), Completion: func() { ran.Add(1) }}
		}))
		require.NoError(t, cs[0].SetHandler(2, func(*Arrival) Return { return Return{} }))
		cmpl := NewCounter()
		for i := range 2 {
			require.NoError(t, cs[0].Amsend(1, 2, []byte{byte(i), 0, 0, 0, 0, 0, 0, 0}, make([]byte, 100<<10), Counters{Cmpl: cmpl}))
		}
		for i := range 2 {
			select {
			case h := <-heads:
				assert.Equal(t, i, h, "header handlers run in message order")
			case <-ctx.Done():
				t.Fatalf("the header handler of message %d did not run while the first completion handler blocked", i)
			}
		}
		_, err := cmpl.Wait(ctx, 1) // the second message's completion
		require.NoError(t, err)
		assert.EqualValues(t, 1, ran.Load(), "only the unblocked completion handler has run")
		close(release)
		_, err = cmpl.Wait(ctx, 1)
		require.NoError(t, err)
		assert.EqualValues(t, 2, ran.Load())
	})
	t.Run("inline", func(t *testing.T) {
		// Written on task 1's progress goroutine, read here after task 0's
		// counter says the messages landed: that news comes through the
		// device, which the race detector does not see, hence the lock.
		var mu sync.Mutex
		var order []string
		note := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
		require.NoError(t, cs[1].SetHandler(3, func(a *Arrival) Return {
			i := string('0' + a.UHdr[0])
			note("header " + i)
			return Return{Buf: make([]byte, a.Len), Inline: true, Completion: func() { note("completion " + i) }}
		}))
		require.NoError(t, cs[0].SetHandler(3, func(*Arrival) Return { return Return{} }))
		cmpl := NewCounter()
		for i := range 3 {
			require.NoError(t, cs[0].Amsend(1, 3, []byte{byte(i), 0, 0, 0, 0, 0, 0, 0}, make([]byte, 40<<10), Counters{Cmpl: cmpl}))
		}
		_, err := cmpl.Wait(ctx, 3)
		require.NoError(t, err)
		mu.Lock()
		defer mu.Unlock()
		assert.Equal(t, []string{"header 0", "completion 0", "header 1", "completion 1", "header 2", "completion 2"}, order)
	})
}

// Rule 1: a message that comes in one packet may be consumed inside the
// header handler, which returns no buffer; Arrival.Data is set for it and
// only for it. Its counters count as for any other.
func TestSinglePacketMessageConsumedInsideTheHeaderHandler(t *testing.T) {
	d := openDevice(t)
	cs := newJob(t, d, 2, Config{})
	ctx := withTimeout(t, time.Minute)
	one := cs[0].OnePacket(8)
	var sum, withData, without atomic.Int64
	require.NoError(t, cs[1].SetHandler(4, func(a *Arrival) Return {
		if a.Data == nil {
			without.Add(1)
			return Return{Buf: make([]byte, a.Len)}
		}
		withData.Add(1)
		s := int64(0)
		for _, b := range a.Data {
			s += int64(b)
		}
		sum.Add(s)
		return Return{} // consumed
	}))
	require.NoError(t, cs[0].SetHandler(4, func(*Arrival) Return { return Return{} }))
	tgt := NewCounter()
	require.NoError(t, cs[1].SetCounter(7, tgt))
	cmpl := NewCounter()
	want := int64(0)
	for _, n := range []int{0, 1, 8, one} {
		data := make([]byte, n)
		for i := range data {
			data[i] = byte(i)
			want += int64(byte(i))
		}
		require.NoError(t, cs[0].Amsend(1, 4, make([]byte, 8), data, Counters{Tgt: 7, Cmpl: cmpl}))
	}
	require.NoError(t, cs[0].Amsend(1, 4, make([]byte, 8), make([]byte, one+1), Counters{Tgt: 7, Cmpl: cmpl}))
	_, err := cmpl.Wait(ctx, 5)
	require.NoError(t, err)
	require.NoError(t, cs[0].Fence(ctx))
	assert.EqualValues(t, 4, withData.Load(), "messages with Data: 0 B, 1 B, 8 B, one packet")
	assert.EqualValues(t, 1, without.Load(), "one byte over one packet has no Data")
	assert.Equal(t, want, sum.Load(), "the data the handler consumed")
	assert.EqualValues(t, 5, tgt.Get())
}

// Rule 2: cmpl is not counted before the target's completion handler
// returned: the handler holds, and cmpl stays at 0 while org has counted
// and the data has landed.
func TestCmplIsNotCountedBeforeTheTargetCompletionHandlerReturned(t *testing.T) {
	d := openDevice(t)
	cs := newJob(t, d, 2, Config{})
	ctx := withTimeout(t, time.Minute)
	landed := make(chan struct{})
	release := make(chan struct{})
	var returned atomic.Bool
	require.NoError(t, cs[1].SetHandler(5, func(a *Arrival) Return {
		return Return{Buf: make([]byte, a.Len), Completion: func() {
			close(landed)
			<-release
			time.Sleep(50 * time.Millisecond)
			returned.Store(true)
		}}
	}))
	require.NoError(t, cs[0].SetHandler(5, func(*Arrival) Return { return Return{} }))
	tgt := NewCounter()
	require.NoError(t, cs[1].SetCounter(1, tgt))
	org, cmpl := NewCounter(), NewCounter()
	require.NoError(t, cs[0].Amsend(1, 5, nil, make([]byte, 200<<10), Counters{Tgt: 1, Org: org, Cmpl: cmpl}))
	_, err := org.Wait(ctx, 1)
	require.NoError(t, err, "org: the origin's buffer is free once copied out")
	select {
	case <-landed:
	case <-ctx.Done():
		t.Fatal("the completion handler never ran")
	}
	// Give an early acknowledgement every chance to arrive.
	time.Sleep(300 * time.Millisecond)
	assert.Zero(t, cmpl.Get(), "cmpl counted while the completion handler had not returned")
	assert.Zero(t, tgt.Get(), "tgt counted while the completion handler had not returned")
	close(release)
	_, err = cmpl.Wait(ctx, 1)
	require.NoError(t, err)
	assert.True(t, returned.Load(), "cmpl counted before the completion handler returned")
	assert.EqualValues(t, 1, tgt.Get())
}

// Rule 3: every error is returned inline, distinct, with nothing sent.
func TestAmsendErrorsAreInlineDistinctAndSendNothing(t *testing.T) {
	d := openDevice(t)
	cs := newJob(t, d, 2, Config{})
	c := cs[0]
	ctx := withTimeout(t, 2*time.Minute)
	require.NoError(t, c.SetHandler(1, func(a *Arrival) Return { return Return{Buf: make([]byte, a.Len)} }))
	require.NoError(t, cs[1].SetHandler(1, func(a *Arrival) Return { return Return{Buf: make([]byte, a.Len)} }))
	before := c.Stats()
	big := make([]byte, c.MaxMessage()+1)
	for _, tc := range []struct {
		name string
		err  error
		send func() error
	}{
		{"data over the maximum", ErrDataLen, func() error { return c.Amsend(1, 1, nil, big, Counters{}) }},
		{"user header not a multiple of 8", ErrUHdrLen, func() error { return c.Amsend(1, 1, make([]byte, 12), nil, Counters{}) }},
		{"user header over the maximum", ErrUHdrLen, func() error { return c.Amsend(1, 1, make([]byte, c.MaxUHdr()+8), nil, Counters{}) }},
		{"user header a byte over the maximum", ErrUHdrLen, func() error { return c.Amsend(1, 1, make([]byte, c.MaxUHdr()+1), nil, Counters{}) }},
		{"no handler at the index", ErrNoHandler, func() error { return c.Amsend(1, 9, nil, nil, Counters{}) }},
		{"handler index out of range", ErrNoHandler, func() error { return c.Amsend(1, MaxHandlers, nil, nil, Counters{}) }},
		{"handler index below 0", ErrNoHandler, func() error { return c.Amsend(1, -1, nil, nil, Counters{}) }},
		{"target below 0", ErrTarget, func() error { return c.Amsend(-1, 1, nil, nil, Counters{}) }},
		{"target past the last task", ErrTarget, func() error { return c.Amsend(2, 1, nil, nil, Counters{}) }},
		{"target counter index out of range", ErrCounter, func() error { return c.Amsend(1, 1, nil, nil, Counters{Tgt: MaxCounters}) }},
		{"target counter index below 0", ErrCounter, func() error { return c.Amsend(1, 1, nil, nil, Counters{Tgt: -1}) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.ErrorIs(t, tc.send(), tc.err)
		})
	}
	after := c.Stats()
	assert.Equal(t, before.Sent, after.Sent, "messages taken")
	assert.Equal(t, before.Packets, after.Packets, "packets sent")

	// The maximum itself works: sizes up to at least 64 MiB.
	require.GreaterOrEqual(t, c.MaxMessage(), 64<<20)
	whole := big[:c.MaxMessage()]
	for i := 0; i < len(whole); i += 4093 {
		whole[i] = byte(i/4093) | 1
	}
	var landed []byte
	require.NoError(t, c.SetHandler(2, func(a *Arrival) Return {
		buf := make([]byte, a.Len)
		return Return{Buf: buf, Completion: func() { landed = buf }}
	}))
	cmpl := NewCounter()
	require.NoError(t, c.Amsend(0, 2, nil, whole, Counters{Cmpl: cmpl}), "a message of the maximum size, to itself")
	_, err := cmpl.Wait(ctx, 1)
	require.NoError(t, err)
	require.True(t, bytes.Equal(whole, landed), "the maximum-size message landed whole")
	t.Logf("a %d-byte message to itself: %+v", len(whole), c.Stats())
	big, whole, landed = nil, nil, nil

	t.Run("target purged", func(t *testing.T) {
		require.NoError(t, c.Purge(ctx, 1))
		assert.ErrorIs(t, c.Amsend(1, 1, nil, nil, Counters{}), ErrPurged)
		assert.NoError(t, c.Amsend(0, 1, nil, nil, Counters{}), "other tasks are still served")
		assert.NoError(t, c.Fence(ctx))
	})
	t.Run("context closed", func(t *testing.T) {
		require.NoError(t, c.Close())
		assert.ErrorIs(t, c.Amsend(0, 1, nil, nil, Counters{}), ErrClosed)
		assert.ErrorIs(t, c.Fence(ctx), ErrClosed)
		assert.NoError(t, c.Close(), "Close is idempotent")
	})
}

// Rule 4: sending to yourself works like sending to any other task, also
// in a job of one task (no exchange).
func TestSendingToYourselfWorksLikeAnyOtherTask(t *testing.T) {
	d := openDevice(t)
	ctx := withTimeout(t, 2*time.Minute)
	c, err := New(ctx, d, Config{})
	require.NoError(t, err)
	defer c.Close()
	one := c.OnePacket(16)
	require.NoError(t, allToAll(ctx, c, []int{0, 8, one, one + 1, 64 << 10, 4 << 20}))
}

// A target that drops a message (its handler gave no buffer for a message
// in several packets, or a short one) does not count it, and the origin's
// Fence says so.
func TestDroppedMessagesAreNotCountedAndFenceReportsThem(t *testing.T) {
	d := openDevice(t)
	cs := newJob(t, d, 2, Config{})
	ctx := withTimeout(t, time.Minute)
	one := cs[0].OnePacket(0)
	require.NoError(t, cs[1].SetHandler(6, func(a *Arrival) Return {
		if a.Len > one+100 {
			return Return{Buf: make([]byte, a.Len-1)} // short
		}
		return Return{} // no buffer
	}))
	require.NoError(t, cs[0].SetHandler(6, func(*Arrival) Return { return Return{} }))
	tgt := NewCounter()
	require.NoError(t, cs[1].SetCounter(2, tgt))
	cmpl := NewCounter()
	require.NoError(t, cs[0].Amsend(1, 6, nil, make([]byte, one+1), Counters{Tgt: 2, Cmpl: cmpl}))
	require.NoError(t, cs[0].Amsend(1, 6, nil, make([]byte, 3*one), Counters{Tgt: 2, Cmpl: cmpl}))
	require.NoError(t, cs[0].Amsend(1, 6, nil, make([]byte, 10), Counters{Tgt: 2, Cmpl: cmpl}))
	err := cs[0].Fence(ctx)
	assert.ErrorIs(t, err, ErrDropped)
	assert.EqualValues(t, 1, cmpl.Get(), "only the consumed message completes")
	assert.EqualValues(t, 1, tgt.Get())
	assert.NoError(t, cs[0].Fence(ctx), "Fence reports a failure once")
}

// Credits: a receiver is never flooded. Two tasks send 3000 messages each
// to a third with only 4 credits per peer, and a header handler that is
// slow now and then; every message arrives, none is refused (an RNR would
// stall, a drop would fail the QP).
func TestCreditsKeepAReceiverFromRunningOutOfBuffers(t *testing.T) {
	d := openDevice(t)
	cs := newJob(t, d, 3, Config{Credits: 4, PacketSize: 1024})
	var got atomic.Int64
	for _, c := range cs {
		require.NoError(t, c.SetHandler(1, func(a *Arrival) Return {
			if got.Add(1)%500 == 0 {
				time.Sleep(20 * time.Millisecond)
			}
			return Return{Buf: make([]byte, a.Len)}
		}))
	}
	const per = 3000
	runTasks(t, cs[:2], 3*time.Minute, func(ctx context.Context, c *Context) error {
		for i := range per {
			if err := c.Amsend(2, 1, nil, make([]byte, 8+i%3000), Counters{}); err != nil {
				return err
			}
		}
		return c.Fence(ctx)
	})
	assert.EqualValues(t, 2*per, got.Load())
	s := cs[2].Stats()
	assert.EqualValues(t, 2*per, s.Received)
	// The senders did run out of credits, and waited: without flow control
	// they would have gone on posting into a pool the receiver had not
	// refilled.
	stalls := cs[0].Stats().CreditStalls + cs[1].Stats().CreditStalls
	t.Logf("credit stalls: %d; receiver %+v", stalls, s)
	assert.Positive(t, stalls, "the senders never waited for credits")
}

// Fragments of one message go under few doorbells: they are posted
// deferred, and one doorbell rings per QP per round of sending.
func TestFragmentsAreBatchedUnderOneDoorbell(t *testing.T) {
	d := openDevice(t)
	ctx := withTimeout(t, time.Minute)
	c, err := New(ctx, d, Config{PacketSize: 4096})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetHandler(1, func(a *Arrival) Return { return Return{Buf: make([]byte, a.Len)} }))
	before := c.Stats()
	require.NoError(t, c.Amsend(0, 1, nil, make([]byte, 2<<20), Counters{}))
	require.NoError(t, c.Fence(ctx))
	s := c.Stats()
	packets := s.Packets - before.Packets
	bells := s.Doorbells - before.Doorbells
	t.Logf("2 MiB in %d packets, %d control packets, %d doorbells (send and SRQ)", packets, s.CtrlPackets-before.CtrlPackets, bells)
	assert.GreaterOrEqual(t, packets, uint64(512))
	assert.Less(t, bells, packets/2, "a doorbell per packet or close to it")
}

// The polling progress mode (Config.Polling) delivers like the sleeping
// one.
func TestPollingProgressDeliversLikeSleeping(t *testing.T) {
	d := openDevice(t)
	cs := newJob(t, d, 2, Config{Polling: true})
	one := cs[0].OnePacket(16)
	runTasks(t, cs, 2*time.Minute, func(ctx context.Context, c *Context) error {
		return allToAll(ctx, c, []int{0, 8, one, one + 1, 256 << 10})
	})
}
