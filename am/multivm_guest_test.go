//go:build guest

package am

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/qemu/guestctl"
	"github.com/vfrdma/vfrdma/qemu/proto"
)

// ctlExchange is an all-gather over the bench's control channel: each VM
// is a task.
type ctlExchange struct {
	c     *guestctl.Conn
	tag   string
	tasks int
	self  int
}

func (x *ctlExchange) AllGather(ctx context.Context, mine []byte) ([][]byte, error) {
	if err := x.c.Put(fmt.Sprintf("%s/%d", x.tag, x.self), base64.StdEncoding.EncodeToString(mine)); err != nil {
		return nil, err
	}
	all := make([][]byte, x.tasks)
	for i := range all {
		s, err := x.c.Get(ctx, fmt.Sprintf("%s/%d", x.tag, i))
		if err != nil {
			return nil, fmt.Errorf("task %d's address: %w", i, err)
		}
		if all[i], err = base64.StdEncoding.DecodeString(s); err != nil {
			return nil, err
		}
	}
	return all, nil
}

// vmTask returns this VM's context in a job of one task per VM; the job
// needs at least three VMs (pvvm -vms 3).
func vmTask(t *testing.T, tag string, cfg Config) (*Context, *guestctl.Conn) {
	t.Helper()
	d := openDevice(t)
	vm, err1 := strconv.Atoi(os.Getenv(proto.EnvVM))
	vms, err2 := strconv.Atoi(os.Getenv(proto.EnvVMs))
	if err1 != nil || err2 != nil || vms < 3 {
		t.Fatalf("this test needs a run of three VMs (pvvm -vms 3 -test am); %s=%q %s=%q", proto.EnvVM, os.Getenv(proto.EnvVM), proto.EnvVMs, os.Getenv(proto.EnvVMs))
	}
	ctl, err := guestctl.Open()
	require.NoError(t, err)
	t.Cleanup(func() { ctl.Close() })
	cfg.Tasks, cfg.Self = vms, vm
	cfg.Exchange = &ctlExchange{c: ctl, tag: tag, tasks: vms, self: vm}
	c, err := New(withTimeout(t, 2*time.Minute), d, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c, ctl
}

// Three VMs, one task each: every task sends to every task, itself
// included, 0 B, 8 B, one packet exactly, one byte more, 64 KiB and 16 MiB;
// every byte checked in the completion handler, every counter exact.
func TestMultiVM3EveryTaskToEveryTaskEveryByteChecked(t *testing.T) {
	c, _ := vmTask(t, "am-all", Config{})
	one := c.OnePacket(16)
	sizes := []int{0, 8, one, one + 1, 64 << 10, 16 << 20}
	ctx := withTimeout(t, 5*time.Minute)
	start := time.Now()
	require.NoError(t, allToAll(ctx, c, sizes))
	s := c.Stats()
	t.Logf("task %d: %v; %+v; %.3f doorbells per packet", c.Self(), time.Since(start), s, float64(s.Doorbells)/float64(s.Packets+s.CtrlPackets))
}

// Across VMs: cmpl is provably not counted before the target's completion
// handler returned (the handler tells the origin it has begun, then holds
// until the origin lets it go), a one-packet message is consumed inside the
// header handler, and each error is returned inline with nothing sent.
func TestMultiVM3CmplAfterTheHandlerInlineConsumptionAndErrors(t *testing.T) {
	c, _ := vmTask(t, "am-rules", Config{})
	ctx := withTimeout(t, 2*time.Minute)
	const (
		hHeld    = 5 // the message whose completion handler holds
		hEntered = 6 // target → origin: the handler has begun
		hRelease = 7 // origin → target: let it return
		hConsume = 8 // consumed inside the header handler
	)
	entered, release := make(chan struct{}), make(chan struct{})
	var returned atomic.Bool
	var consumed atomic.Int64
	require.NoError(t, c.SetHandler(hHeld, func(a *Arrival) Return {
		buf := make([]byte, a.Len)
		src := a.Src
		return Return{Buf: buf, Completion: func() {
			if err := c.Amsend(src, hEntered, nil, nil, Counters{}); err != nil {
				t.Errorf("telling the origin: %v", err)
			}
			<-release
			time.Sleep(50 * time.Millisecond)
			returned.Store(true)
		}}
	}))
	require.NoError(t, c.SetHandler(hEntered, func(*Arrival) Return { close(entered); return Return{} }))
	require.NoError(t, c.SetHandler(hRelease, func(*Arrival) Return { close(release); return Return{} }))
	require.NoError(t, c.SetHandler(hConsume, func(a *Arrival) Return {
		if a.Data == nil || len(a.Data) != a.Len {
			t.Errorf("a one-packet message of %d bytes without its data in the header handler", a.Len)
			return Return{Buf: make([]byte, a.Len)}
		}
		for _, b := range a.Data {
			consumed.Add(int64(b))
		}
		return Return{}
	}))
	require.NoError(t, c.Barrier(ctx))

	switch c.Self() {
	case 0:
		org, cmpl := NewCounter(), NewCounter()
		require.NoError(t, c.Amsend(1, hHeld, nil, make([]byte, 300<<10), Counters{Org: org, Cmpl: cmpl}))
		select {
		case <-entered:
		case <-ctx.Done():
			t.Fatal("task 1's completion handler never said it began")
		}
		time.Sleep(300 * time.Millisecond) // room for an early acknowledgement
		assert.EqualValues(t, 1, org.Get(), "org: the data was copied out")
		assert.Zero(t, cmpl.Get(), "cmpl counted while task 1's completion handler held")
		require.NoError(t, c.Amsend(1, hRelease, nil, nil, Counters{}))
		_, err := cmpl.Wait(ctx, 1)
		require.NoError(t, err)
	case 2:
		one := c.OnePacket(0)
		data := make([]byte, one)
		for i := range data {
			data[i] = 1
		}
		cmpl := NewCounter()
		require.NoError(t, c.Amsend(0, hConsume, nil, data, Counters{Cmpl: cmpl}))
		_, err := cmpl.Wait(ctx, 1)
		require.NoError(t, err)
	}
	require.NoError(t, c.Barrier(ctx))
	switch c.Self() {
	case 0:
		assert.EqualValues(t, c.OnePacket(0), consumed.Load(), "what task 2's message carried, consumed in the header handler")
	case 1:
		assert.True(t, returned.Load())
	}

	before := c.Stats()
	for _, tc := range []struct {
		err  error
		send func() error
	}{
		{ErrDataLen, func() error { return c.Amsend(1, hConsume, nil, make([]byte, c.MaxMessage()+1), Counters{}) }},
		{ErrUHdrLen, func() error { return c.Amsend(1, hConsume, make([]byte, 4), nil, Counters{}) }},
		{ErrUHdrLen, func() error { return c.Amsend(1, hConsume, make([]byte, c.MaxUHdr()+8), nil, Counters{}) }},
		{ErrNoHandler, func() error { return c.Amsend(1, 99, nil, nil, Counters{}) }},
		{ErrTarget, func() error { return c.Amsend(c.Tasks(), hConsume, nil, nil, Counters{}) }},
		{ErrTarget, func() error { return c.Amsend(-1, hConsume, nil, nil, Counters{}) }},
		{ErrCounter, func() error { return c.Amsend(1, hConsume, nil, nil, Counters{Tgt: -1}) }},
	} {
		assert.ErrorIs(t, tc.send(), tc.err)
	}
	after := c.Stats()
	assert.Equal(t, before.Sent, after.Sent, "nothing was taken")
	assert.Equal(t, before.Packets, after.Packets, "nothing was sent")
	require.NoError(t, c.Barrier(ctx))
}

// A peer VM is killed in mid-transfer: the survivors' Fence and Barrier
// return ErrPurged within a bounded time (the QP's retries, and a probe
// when nothing was in flight), Amsend to the dead task is refused, and the
// counters count only what was delivered: everything between survivors,
// and to the dead task no more than its acknowledgements said.
func TestMultiVM3PeerKilledInMidTransfer(t *testing.T) {
	c, ctl := vmTask(t, "am-kill", Config{})
	const victim, perPeer, size = 2, 8, 4 << 20
	ctx := withTimeout(t, 3*time.Minute)
	started := make(chan struct{}, 64)
	tgt := NewCounter()
	require.NoError(t, c.SetCounter(1, tgt))
	require.NoError(t, c.SetHandler(1, func(a *Arrival) Return {
		started <- struct{}{}
		return Return{Buf: make([]byte, a.Len)}
	}))
	require.NoError(t, c.Barrier(ctx))
	if c.Self() == victim {
		// Die once a survivor's big message has begun to arrive.
		<-started
		<-started
		t.Logf("task %d: killing this VM in mid-transfer", c.Self())
		err := ctl.Kill()
		t.Fatalf("still alive after asking to be killed: %v", err)
	}
	if c.Self() > victim {
		return // a fourth VM, if any, stays out of it
	}
	require.NoError(t, c.Fence(ctx)) // the barrier's messages are acknowledged
	before := c.Stats()
	peer := 1 - c.Self()
	toPeer, toVictim := NewCounter(), NewCounter()
	data := make([]byte, size)
	for range perPeer {
		require.NoError(t, c.Amsend(victim, 1, nil, data, Counters{Tgt: 1, Cmpl: toVictim}))
		require.NoError(t, c.Amsend(peer, 1, nil, data[:size/4], Counters{Tgt: 1, Cmpl: toPeer}))
	}
	start := time.Now()
	err := c.Fence(ctx)
	took := time.Since(start)
	t.Logf("task %d: Fence returned after %v: %v", c.Self(), took, err)
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrPurged)
	assert.NoError(t, ctx.Err(), "Fence returned only when its context ended")
	assert.ErrorIs(t, c.Amsend(victim, 1, nil, nil, Counters{}), ErrPurged)

	_, err = toPeer.Wait(ctx, perPeer)
	require.NoError(t, err, "messages between survivors complete")
	s := c.Stats()
	assert.LessOrEqual(t, toVictim.Get(), int64(perPeer))
	assert.EqualValues(t, int64(perPeer)+toVictim.Get(), int64(s.Delivered-before.Delivered), "cmpl counts exactly what was acknowledged")
	assert.EqualValues(t, int64(perPeer)-toVictim.Get(), int64(s.Failed-before.Failed), "the rest failed")
	// The other survivor's messages to this task all landed.
	_, err = tgt.Wait(ctx, perPeer)
	assert.NoError(t, err, "tgt at %d of %d", tgt.Get(), perPeer)
	berr := c.Barrier(ctx)
	assert.ErrorIs(t, berr, ErrPurged, "a barrier with a dead task")
	assert.NoError(t, ctx.Err())
	t.Logf("task %d: %+v", c.Self(), s)
}
