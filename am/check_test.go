//go:build !guest

package am

import (
	"context"
	"encoding/binary"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
)

// peerJob is a host context of 3 tasks whose handler 1 gives every message
// a buffer of its length and counts what completed, inline.
type peerJob struct {
	c     *Context
	mu    sync.Mutex
	bufs  [][]byte
	slot  int
	ready int
}

func newPeerJob(t *testing.T) *peerJob {
	j := &peerJob{c: hostContext(t, Config{Tasks: 3, PacketSize: 256, MaxMessage: 1 << 16})}
	require.NoError(t, j.c.SetHandler(1, func(a *Arrival) Return {
		buf := make([]byte, a.Len)
		j.mu.Lock()
		j.bufs = append(j.bufs, buf)
		j.mu.Unlock()
		return Return{Buf: buf, Inline: true, Completion: func() { j.ready++ }}
	}))
	return j
}

// awaiting makes message id to task 1 one sent and awaiting its
// acknowledgement, and returns its Cmpl counter.
func (j *peerJob) awaiting(id uint32) *Counter {
	cmpl := NewCounter()
	j.c.mu.Lock()
	j.c.conns[1].sent[id] = &outMsg{id: id, cmpl: cmpl}
	j.c.pending++
	j.c.mu.Unlock()
	return cmpl
}

// send completes packet b from task src in the next receive buffer.
func (j *peerJob) send(t *testing.T, src int, b []byte) {
	t.Helper()
	repost, err := deliver(j.c, src, j.slot%j.c.bufs, b)
	require.NoError(t, err, "a peer's packet never stops the context")
	assert.True(t, repost)
	j.slot++
}

// refused asserts that task src was purged for a protocol error, that
// Stats counted it, that Fence reports it and Amsend to it says so, and
// that the other tasks go on.
func (j *peerJob) refused(t *testing.T, src int, want error) {
	t.Helper()
	c := j.c
	assert.EqualValues(t, 1, c.Stats().Refused)
	err := c.Amsend(src, 1, nil, nil, Counters{})
	assert.ErrorIs(t, err, ErrPurged)
	assert.ErrorIs(t, err, want)
	ferr := c.Fence(context.Background())
	assert.ErrorIs(t, ferr, ErrPurged, "Fence reports the purged task")
	assert.ErrorIs(t, ferr, want)
	other := (src + 1) % c.cfg.Tasks
	assert.NoError(t, c.conns[other].err, "task %d is not touched", other)
}

// A fragment must continue the message being reassembled: its length field
// equal to the message's. The seed of the issue: a fragment claiming a
// longer message was taken (only offset+body within its own length was
// checked) and ran the reassembly past the handler's buffer, and the next
// fragment panicked the progress goroutine ("slice bounds out of range").
func TestFragmentWhoseLengthDisagreesWithItsMessagePurgesItsSender(t *testing.T) {
	j := newPeerJob(t)
	first := make([]byte, 8+100)
	j.send(t, 1, pkt(header{kind: kindFirst, handler: 1, uhdrLen: 8, id: 0, length: 300}, first))
	j.send(t, 1, pkt(header{kind: kindFrag, id: 0, length: 5000, offset: 100}, make([]byte, 200)))
	require.NotPanics(t, func() {
		j.send(t, 1, pkt(header{kind: kindFrag, id: 0, length: 5000, offset: 300}, make([]byte, 200)))
	})
	j.refused(t, 1, errProtocol)
	assert.Zero(t, j.ready, "no completion for the refused message")
}

// A fragment of another message, or at another offset than the one
// reached, purges its sender; so does one with no message begun.
func TestFragmentNotContinuingItsMessagePurgesItsSender(t *testing.T) {
	for _, tc := range []struct {
		name string
		frag header
	}{
		{"another message", header{kind: kindFrag, id: 1, length: 300, offset: 100}},
		{"another offset", header{kind: kindFrag, id: 0, length: 300, offset: 150}},
		{"shorter message", header{kind: kindFrag, id: 0, length: 200, offset: 100}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := newPeerJob(t)
			j.send(t, 1, pkt(header{kind: kindFirst, handler: 1, uhdrLen: 8, length: 300}, make([]byte, 108)))
			j.send(t, 1, pkt(tc.frag, make([]byte, 100)))
			j.refused(t, 1, errProtocol)
		})
	}
	t.Run("no message begun", func(t *testing.T) {
		j := newPeerJob(t)
		j.send(t, 2, pkt(header{kind: kindFrag, id: 0, length: 300, offset: 0}, make([]byte, 100)))
		j.refused(t, 2, errProtocol)
	})
}

// The same message in whole fragments lands, every byte in place: the
// checks refuse nothing a well-behaved peer sends.
func TestFragmentsOfOneMessageLandInOrder(t *testing.T) {
	j := newPeerJob(t)
	data := make([]byte, 500)
	for i := range data {
		data[i] = byte(i * 7)
	}
	j.send(t, 1, pkt(header{kind: kindFirst, handler: 1, uhdrLen: 8, length: 500}, append(make([]byte, 8), data[:200]...)))
	j.send(t, 1, pkt(header{kind: kindFrag, length: 500, offset: 200}, data[200:420]))
	j.send(t, 1, pkt(header{kind: kindFrag, length: 500, offset: 420}, data[420:]))
	j.send(t, 1, pkt(header{kind: kindEager, handler: 1, id: 1, length: 3}, []byte{1, 2, 3}))
	require.Len(t, j.bufs, 2)
	assert.Equal(t, data, j.bufs[0])
	assert.Equal(t, []byte{1, 2, 3}, j.bufs[1])
	assert.Equal(t, 2, j.ready)
	assert.Zero(t, j.c.Stats().Refused)
	assert.Equal(t, []uint32{0, 1}, j.c.conns[1].acks)
}

// A fragment whose offset and length wrap a u64 around is refused on its
// own (offset+body was computed, and wrapped, in one sum).
func TestFragmentWhoseOffsetWrapsAroundIsRefused(t *testing.T) {
	var h header
	b := pkt(header{kind: kindFrag, length: 100, offset: ^uint64(0) - 5}, make([]byte, 20))
	assert.ErrorIs(t, h.parse(b, 1<<20, anyUHdr), errProtocol)
	b = pkt(header{kind: kindFrag, length: 1 << 40, offset: 0}, make([]byte, 20))
	assert.ErrorIs(t, h.parse(b, 1<<20, anyUHdr), errProtocol, "a fragment of a message over the maximum")
}

// An acknowledgement count whose ×4 wraps to the body's length is refused.
func TestAckCountThatWrapsAroundIsRefused(t *testing.T) {
	var h header
	assert.ErrorIs(t, h.parse(pkt(header{kind: kindCtrl, length: 1 << 62}, nil), 1<<20, anyUHdr), errProtocol)
}

// wc.ByteLen is the device's word: a receive longer than the buffer it was
// posted with purges the QP's task instead of slicing past the buffer.
func TestReceiveLongerThanItsBufferPurgesItsSender(t *testing.T) {
	j := newPeerJob(t)
	c := j.c
	wc := vfrdma.WC{WRID: uint64(c.bufs - 1), Status: vfrdma.WCSuccess, Opcode: vfrdma.WCRecv, ByteLen: uint32(c.cfg.PacketSize + 1), QPN: 2}
	var repost bool
	var err error
	require.NotPanics(t, func() { repost, err = c.recv(&wc) })
	require.NoError(t, err)
	assert.True(t, repost, "the buffer is ours: it goes back")
	j.refused(t, 1, errProtocol)
}

// A receive completion naming a buffer never posted purges the QP's task;
// nothing is reposted for it.
func TestReceiveCompletionForABufferNeverPostedPurgesItsSender(t *testing.T) {
	j := newPeerJob(t)
	c := j.c
	wc := vfrdma.WC{WRID: uint64(c.bufs), Status: vfrdma.WCSuccess, Opcode: vfrdma.WCRecv, ByteLen: 40, QPN: 3}
	var repost bool
	var err error
	require.NotPanics(t, func() { repost, err = c.recv(&wc) })
	require.NoError(t, err)
	assert.False(t, repost)
	j.refused(t, 2, vfrdma.ErrDeviceFault)
}

// A send completion for a slot not in flight (out of range, or completed
// already) purges the QP's task instead of freeing a slot twice.
func TestSendCompletionForASlotNotInFlightPurgesTheTask(t *testing.T) {
	for _, slot := range []uint64{0, 1 << 20} {
		j := newPeerJob(t)
		c := j.c
		free := len(c.free)
		require.NotPanics(t, func() { c.sendDone(&vfrdma.WC{WRID: sendTag | slot, QPN: 2}) })
		assert.Len(t, c.free, free, "no slot freed")
		j.refused(t, 1, vfrdma.ErrDeviceFault)
	}
	j := newPeerJob(t)
	c := j.c
	c.mu.Lock()
	s := c.takeSlot()
	c.mu.Unlock()
	c.sendDone(&vfrdma.WC{WRID: sendTag | uint64(s), QPN: 2})
	assert.Zero(t, c.Stats().Refused, "a slot in flight completes")
	c.sendDone(&vfrdma.WC{WRID: sendTag | uint64(s), QPN: 2})
	j.refused(t, 1, vfrdma.ErrDeviceFault)
}

// A packet may return only the credits its receiver took from it: more
// would let this task overrun the peer's buffers.
func TestCreditsNeverTakenAreRefused(t *testing.T) {
	j := newPeerJob(t)
	c := j.c
	c.conns[1].credits -= 3 // three packets out to task 1
	j.send(t, 1, pkt(header{kind: kindCtrl, credits: 3}, nil))
	assert.Zero(t, c.Stats().Refused, "the three it owes")
	j.send(t, 1, pkt(header{kind: kindCtrl, credits: 1}, nil))
	j.refused(t, 1, errProtocol)
}

// Messages from a task come with consecutive ids.
func TestMessageOutOfSequenceIsRefused(t *testing.T) {
	j := newPeerJob(t)
	j.send(t, 1, pkt(header{kind: kindEager, handler: 1, id: 0, length: 1}, []byte{1}))
	j.send(t, 1, pkt(header{kind: kindEager, handler: 1, id: 2, length: 1}, []byte{1}))
	j.refused(t, 1, errProtocol)
	assert.Equal(t, 1, j.ready)
}

// Barrier messages are eager, empty, with an 8-byte epoch: one claiming
// data is refused, and its fragment after it panics nothing. (Fault
// caught: a barrier message with data given no buffer and no drop, whose
// next fragment is copied into the nil buffer.)
func TestBarrierMessageWithDataIsRefused(t *testing.T) {
	j := newPeerJob(t)
	require.NotPanics(t, func() {
		j.send(t, 1, pkt(header{kind: kindFirst, handler: barrierHandler, uhdrLen: 8, length: 400}, append(barrierUHdr(1), make([]byte, 100)...)))
		j.send(t, 1, pkt(header{kind: kindFrag, length: 400, offset: 100}, make([]byte, 100)))
	})
	j.refused(t, 1, errProtocol)
}

// Each task sends one barrier message per barrier, at most one barrier
// ahead: repeats (which would make a barrier return early) and epochs far
// ahead (which would grow the table without bound) are refused.
func TestBarrierMessageRepeatedOrTooFarAheadIsRefused(t *testing.T) {
	barrier := func(id uint32, e uint64) []byte {
		return pkt(header{kind: kindEager, handler: barrierHandler, uhdrLen: 8, id: id}, barrierUHdr(e))
	}
	j := newPeerJob(t)
	j.send(t, 1, barrier(0, 1))
	assert.Equal(t, 1, j.c.arrived[1])
	j.send(t, 1, barrier(1, 1))
	j.refused(t, 1, errProtocol)
	assert.Equal(t, 1, j.c.arrived[1], "the repeat did not count")

	j = newPeerJob(t)
	j.send(t, 2, barrier(0, 2))
	j.refused(t, 2, errProtocol)
	assert.Empty(t, j.c.arrived)
}

// Nothing a peer sends panics the receiver: a purged task's later packets
// are dropped, whatever they hold.
func TestPacketsOfAPurgedTaskAreDropped(t *testing.T) {
	j := newPeerJob(t)
	j.send(t, 1, pkt(header{kind: 9}, nil))
	j.send(t, 1, pkt(header{kind: kindFrag, length: 5000, offset: 4000}, make([]byte, 100)))
	j.send(t, 1, pkt(header{kind: kindEager, handler: 1, id: 0, length: 1}, []byte{1}))
	assert.EqualValues(t, 1, j.c.Stats().Refused)
	assert.Zero(t, j.ready)
	assert.Zero(t, j.c.conns[1].owed, "nothing owed to a purged task")
}

// The CQ holds every completion that can be outstanding at once: a send
// slot each and a receive buffer each. 64 tasks at 32 credits need 4160,
// over the 4096 a CQ holds: the configuration is refused with an error
// that names the limit. (Fault caught: a CQ capped at 4096 entries, which
// loses completions.)
func TestConfigThatCanOverflowTheCQIsRefused(t *testing.T) {
	cfg := Config{Tasks: 64, Self: 0, Credits: 32}
	require.NoError(t, cfg.fill())
	assert.Equal(t, 4160, cfg.cqEntries())
	err := cfg.fits(1<<20, 4096)
	require.ErrorIs(t, err, errInvalid)
	assert.Contains(t, err.Error(), "4160")
	assert.Contains(t, err.Error(), "at most 4096")

	cfg = Config{Tasks: 63, Credits: 32}
	require.NoError(t, cfg.fill())
	assert.LessOrEqual(t, cfg.cqEntries(), 4096)
	assert.NoError(t, cfg.fits(1<<20, 4096))

	cfg = Config{Tasks: 64, Credits: 16}
	require.NoError(t, cfg.fill())
	assert.NoError(t, cfg.fits(1<<20, 4096), "fewer credits fit")

	cfg = Config{Tasks: 8}
	require.NoError(t, cfg.fill())
	err = cfg.fits(100, 4096)
	assert.ErrorIs(t, err, errInvalid)
	assert.Contains(t, err.Error(), "at most 100")
}

// The default credits are DefaultCredits up to 31 tasks and, for more, as
// many as fit one CQ, the same on every task (they depend on Tasks
// alone); past the most tasks two credits serve, the error says why.
func TestDefaultCreditsFitTheCQ(t *testing.T) {
	for _, tc := range []struct{ tasks, credits int }{{1, DefaultCredits}, {31, DefaultCredits}, {32, 63}, {63, 32}, {64, 31}, {819, 2}} {
		cfg := Config{Tasks: tc.tasks}
		require.NoError(t, cfg.fill(), "%d tasks", tc.tasks)
		assert.Equal(t, tc.credits, cfg.Credits, "%d tasks", tc.tasks)
		assert.NoError(t, cfg.fits(1<<20, maxCQEntries), "%d tasks", tc.tasks)
	}
	cfg := Config{Tasks: 820}
	err := cfg.fill()
	require.ErrorIs(t, err, errInvalid)
	assert.Contains(t, err.Error(), "820 tasks")
	cfg = Config{Tasks: 8}
	require.NoError(t, cfg.fill())
	err = cfg.fits(100, 4096)
	assert.ErrorIs(t, err, errInvalid)
	assert.Contains(t, err.Error(), "at most 100")
}

// Stats may be read while the progress goroutine takes packets and other
// goroutines send: under -race, nothing it reads is written unguarded.
func TestStatsAreRaceFree(t *testing.T) {
	j := newPeerJob(t)
	c := j.c
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 200 {
			_, _ = deliver(c, 1, i%c.bufs, pkt(header{kind: kindEager, handler: 1, id: uint32(i), length: 1}, []byte{byte(i)}))
		}
	}()
	var last Stats
	for range 200 {
		s := c.Stats()
		assert.GreaterOrEqual(t, s.Received, last.Received)
		last = s
	}
	wg.Wait()
	assert.EqualValues(t, 200, c.Stats().Received)
}

// After Close every call returns an error wrapping ErrClosed (the
// driver's, vfrdma.ErrClosed); a second Close returns nil.
func TestEveryCallAfterCloseReturnsErrClosed(t *testing.T) {
	c := hostContext(t, Config{Tasks: 2})
	require.NoError(t, c.SetHandler(1, func(*Arrival) Return { return Return{} }))
	require.NoError(t, c.Close())
	assert.NoError(t, c.Close(), "a second Close")
	ctx := context.Background()
	for name, err := range map[string]error{
		"Amsend":     c.Amsend(1, 1, nil, nil, Counters{}),
		"Amsend bad": c.Amsend(1, 7, nil, nil, Counters{}),
		"Fence":      c.Fence(ctx),
		"Barrier":    c.Barrier(ctx),
		"Purge":      c.Purge(ctx, 1),
		"SetHandler": c.SetHandler(2, func(*Arrival) Return { return Return{} }),
		"SetCounter": c.SetCounter(2, NewCounter()),
	} {
		assert.ErrorIs(t, err, vfrdma.ErrClosed, name)
		assert.ErrorIs(t, err, ErrClosed, name)
	}
	assert.NotPanics(t, func() { c.Stats() })
}

// When the device (or a queue) is closed under the context, the context
// fails as a whole with that ErrClosed: waiters are released, and every
// call returns it, not ErrPurged of one task.
func TestDeviceClosedUnderTheContextFailsEveryCallWithErrClosed(t *testing.T) {
	c := hostContext(t, Config{Tasks: 2})
	require.NoError(t, c.SetHandler(1, func(*Arrival) Return { return Return{} }))
	c.mu.Lock()
	c.conns[1].sent[0] = &outMsg{}
	c.pending = 1
	c.mu.Unlock()
	fenced := make(chan error, 1)
	go func() { fenced <- c.Fence(context.Background()) }()
	closedErr := &vfrdma.OpError{Op: "post send", Dev: "test", Err: vfrdma.ErrClosed}
	c.mu.Lock()
	c.fail(c.conns[1], closedErr) // what a post on a destroyed QP returns
	c.mu.Unlock()
	assert.ErrorIs(t, <-fenced, vfrdma.ErrClosed)
	for name, err := range map[string]error{
		"Amsend to the task": c.Amsend(1, 1, nil, nil, Counters{}),
		"Amsend to self":     c.Amsend(0, 1, nil, nil, Counters{}),
		"Fence":              c.Fence(context.Background()),
		"Purge":              c.Purge(context.Background(), 0),
		"SetHandler":         c.SetHandler(3, nil),
	} {
		assert.ErrorIs(t, err, vfrdma.ErrClosed, name)
	}
	assert.NoError(t, c.Close(), "Close after the device closed: nothing left to report")
}

// The zero Counter is ready to use (as event.Counter's is, the rule of the
// project): counted into and waited on without NewCounter.
func TestZeroCounterIsReadyToUse(t *testing.T) {
	var z Counter
	assert.Zero(t, z.Get())
	z.add(2)
	left, err := z.Wait(context.Background(), 1)
	require.NoError(t, err)
	assert.EqualValues(t, 1, left)
	z.Set(5)
	assert.EqualValues(t, 5, z.Get())
	c := hostContext(t, Config{Tasks: 2})
	assert.NoError(t, c.SetCounter(1, &Counter{}))
}

// Each message is acknowledged once, after it was sent: an ack of a
// message not awaiting one (never sent, or acknowledged already) is
// refused; the acks before it in the packet are taken.
func TestAckOfAMessageNotAwaitingOneIsRefused(t *testing.T) {
	j := newPeerJob(t)
	cmpl := j.awaiting(0)
	acks := func(ids ...uint32) []byte {
		var b []byte
		for _, id := range ids {
			b = binary.LittleEndian.AppendUint32(b, id)
		}
		return pkt(header{kind: kindCtrl, length: uint64(len(ids))}, b)
	}
	j.send(t, 1, acks(0, 0))
	assert.EqualValues(t, 1, cmpl.Get(), "the first ack is taken")
	j.refused(t, 1, errProtocol)

	j = newPeerJob(t)
	j.send(t, 2, acks(7))
	j.refused(t, 2, errProtocol)
}

// Acknowledgements riding on a message's first packet are held to the same
// rule: one of a message awaiting it is taken (and the message with it),
// one of anything else purges the sender.
func TestRidingAckOfAMessageNotAwaitingOneIsRefused(t *testing.T) {
	j := newPeerJob(t)
	cmpl := j.awaiting(0)
	j.send(t, 1, pkt(header{kind: kindEager, handler: 1, id: 0, length: 2, flags: flagAcksOne, offset: 0}, []byte("hi")))
	assert.EqualValues(t, 1, cmpl.Get(), "the ack is taken")
	assert.Equal(t, 1, j.ready, "and the message it rode on")
	j.send(t, 1, pkt(header{kind: kindEager, handler: 1, id: 1, length: 2, flags: 2 * flagAcksOne, offset: 0}, []byte("hi"))) // message 0, acknowledged already, twice
	j.refused(t, 1, errProtocol)
}

// The fields of a message's first packet are checked on their own: target
// counter in range and flagged, known flags, a user header of whole
// 8-byte words; and packets of other kinds carry none of them.
func TestFirstPacketFieldsAreCheckedOnTheirOwn(t *testing.T) {
	for name, b := range map[string][]byte{
		"target counter out of range":  pkt(header{kind: kindEager, flags: flagTgtCounter, tgtCntr: MaxCounters, length: 1}, []byte{1}),
		"target counter 0 flagged":     pkt(header{kind: kindEager, flags: flagTgtCounter, length: 1}, []byte{1}),
		"target counter not flagged":   pkt(header{kind: kindEager, tgtCntr: 3, length: 1}, []byte{1}),
		"unknown flag":                 pkt(header{kind: kindEager, flags: 0x80, length: 1}, []byte{1}),
		"user header not whole words":  pkt(header{kind: kindEager, uhdrLen: 4, length: 1}, make([]byte, 5)),
		"fragment naming a handler":    pkt(header{kind: kindFrag, handler: 3, length: 100, offset: 10}, make([]byte, 10)),
		"ctrl packet naming a counter": pkt(header{kind: kindCtrl, flags: flagTgtCounter, tgtCntr: 1}, nil),
	} {
		var h header
		assert.ErrorIs(t, h.parse(b, 1<<20, anyUHdr), errProtocol, name)
	}
}

// Close releases the calls blocked in Fence and Barrier with ErrClosed,
// and a Close racing them, or another Close, returns.
func TestCloseReleasesItsWaiters(t *testing.T) {
	c := hostContext(t, Config{Tasks: 2})
	c.mu.Lock()
	c.conns[1].sent[0] = &outMsg{}
	c.pending = 1 // a message never acknowledged
	c.mu.Unlock()
	errs := make(chan error, 4)
	for range 2 {
		go func() { errs <- c.Fence(context.Background()) }()
		go func() { errs <- c.Barrier(context.Background()) }()
	}
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			assert.NoError(t, c.Close())
		}()
	}
	wg.Wait()
	for range 4 {
		assert.ErrorIs(t, <-errs, vfrdma.ErrClosed)
	}
}

// A barrier message has one shape: one eager packet, an 8-byte user
// header (the epoch) and no data. Each other shape is refused on its own:
// data in an eager packet, a longer user header, none.
func TestBarrierMessageOfAnyOtherShapeIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"eager with data", pkt(header{kind: kindEager, handler: barrierHandler, uhdrLen: 8, length: 8}, append(barrierUHdr(1), make([]byte, 8)...))},
		{"a 16-byte user header", pkt(header{kind: kindEager, handler: barrierHandler, uhdrLen: 16}, append(barrierUHdr(1), barrierUHdr(1)...))},
		{"no user header", pkt(header{kind: kindEager, handler: barrierHandler}, nil)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := newPeerJob(t)
			require.NotPanics(t, func() { j.send(t, 1, tc.b) })
			j.refused(t, 1, errProtocol)
		})
	}
}
