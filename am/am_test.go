//go:build !guest

package am

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// LAPI_Waitcntr: Wait blocks until the value reaches v, then takes v back
// out; Get and Set read and set.
func TestCounterWaitTakesWhatItWaitedForAndGetSetReadAndSet(t *testing.T) {
	c := NewCounter()
	assert.Zero(t, c.Get())
	c.Set(5)
	assert.EqualValues(t, 5, c.Get())
	left, err := c.Wait(context.Background(), 3)
	require.NoError(t, err)
	assert.EqualValues(t, 2, left)
	assert.EqualValues(t, 2, c.Get())

	done := make(chan int64)
	go func() {
		left, err := c.Wait(context.Background(), 4)
		assert.NoError(t, err)
		done <- left
	}()
	c.add(1)
	select {
	case <-done:
		t.Fatal("Wait returned below its value")
	case <-time.After(20 * time.Millisecond):
	}
	c.add(2)
	assert.EqualValues(t, 1, <-done)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_, err = c.Wait(ctx, 100)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.EqualValues(t, 1, c.Get(), "a Wait that ended takes nothing")

	var z Counter // the zero Counter is ready
	z.add(1)
	_, err = z.Wait(context.Background(), 1)
	assert.NoError(t, err)
}

func TestCounterConcurrentAddsAndWaitsLoseNothing(t *testing.T) {
	c := NewCounter()
	const adders, per = 8, 1000
	var wg sync.WaitGroup
	for range adders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range per {
				c.add(1)
			}
		}()
	}
	taken := int64(0)
	for taken < adders*per {
		_, err := c.Wait(context.Background(), 10)
		require.NoError(t, err)
		taken += 10
	}
	wg.Wait()
	assert.Zero(t, c.Get())
}

// The wire header round-trips, and a packet that does not hold together is
// refused: the peer is another process.
func TestPacketHeaderRoundTripsAndBadPacketsAreRefused(t *testing.T) {
	const max = 1 << 20
	pkt := func(h header, body int) []byte {
		b := make([]byte, headerSize+body)
		h.put(b)
		return b
	}
	good := []struct {
		h    header
		body int
	}{
		{header{kind: kindEager, flags: flagTgtCounter, handler: 7, uhdrLen: 16, tgtCntr: 3, credits: 5, id: 9, length: 100}, 116},
		{header{kind: kindEager, id: 1}, 0},
		{header{kind: kindFirst, uhdrLen: 8, id: 2, length: 5000}, 1000},
		{header{kind: kindFrag, id: 2, length: 5000, offset: 992}, 4008},
		{header{kind: kindCtrl, credits: 12, length: 3}, 12},
	}
	for _, g := range good {
		var got header
		require.NoError(t, got.parse(pkt(g.h, g.body), max, anyUHdr), "%+v", g.h)
		assert.Equal(t, g.h, got)
	}
	bad := []struct {
		name string
		b    []byte
	}{
		{"shorter than a header", make([]byte, headerSize-1)},
		{"unknown kind", pkt(header{kind: 9}, 0)},
		{"user header past the packet", pkt(header{kind: kindEager, uhdrLen: 64, length: 0}, 32)},
		{"eager data not the message length", pkt(header{kind: kindEager, length: 10}, 9)},
		{"first packet holding the whole message", pkt(header{kind: kindFirst, length: 10}, 10)},
		{"message over the maximum", pkt(header{kind: kindFirst, length: max + 1}, 10)},
		{"fragment past the end", pkt(header{kind: kindFrag, length: 100, offset: 90}, 20)},
		{"empty fragment", pkt(header{kind: kindFrag, length: 100, offset: 10}, 0)},
		{"acks not filling the body", pkt(header{kind: kindCtrl, length: 2}, 12)},
	}
	for _, b := range bad {
		var h header
		assert.ErrorIs(t, h.parse(b.b, max, anyUHdr), errProtocol, b.name)
	}
}

func TestConfigDefaultsAndBadConfigsAreRefused(t *testing.T) {
	var cfg Config
	require.NoError(t, cfg.fill())
	assert.Equal(t, Config{Tasks: 1, PacketSize: DefaultPacketSize, Credits: DefaultCredits, MaxMessage: DefaultMaxMessage, MaxUHdr: DefaultMaxUHdr}, cfg)
	assert.GreaterOrEqual(t, cfg.MaxMessage, 64<<20, "the maximum message is at least 64 MiB")
	for _, bad := range []Config{
		{Tasks: -1},
		{Tasks: 2, Self: 2},
		{Self: -1},
		{PacketSize: 100},
		{Credits: 1},
		{MaxUHdr: 12},
		{PacketSize: 256, MaxUHdr: 256},
	} {
		c := bad
		assert.Error(t, c.fill(), "%+v", bad)
	}
}

// TCPExchanger: every task gets every task's blob, in task order.
func TestTCPExchangerGathersEveryTasksAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	const n = 4
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang guard
	defer cancel()
	res := make([][][]byte, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := n - 1; i >= 0; i-- { // the others start before task 0 listens
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := &TCPExchanger{Addr: addr, Tasks: n, Self: i, Token: "job-1"}
			res[i], errs[i] = x.AllGather(ctx, binary.LittleEndian.AppendUint32([]byte(fmt.Sprintf("task%d-", i)), uint32(i)))
		}()
	}
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i], "task %d", i)
		require.Len(t, res[i], n)
		for j, b := range res[i] {
			assert.Equal(t, binary.LittleEndian.AppendUint32([]byte(fmt.Sprintf("task%d-", j)), uint32(j)), b, "task %d's view of task %d", i, j)
		}
	}
}

func TestTCPExchangerEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := (&TCPExchanger{Addr: "127.0.0.1:1", Tasks: 2, Self: 1, Token: "t"}).AllGather(ctx, nil)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	_, err = (&TCPExchanger{Addr: "127.0.0.1:0", Tasks: 2, Self: 2, Token: "t"}).AllGather(ctx, nil)
	assert.ErrorIs(t, err, ErrTarget)
}

// freeAddr returns a local TCP address nobody listens on (yet).
func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// dialWhenListening connects to addr once it listens.
func dialWhenListening(t *testing.T, ctx context.Context, addr string) net.Conn {
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return c
		}
		select {
		case <-ctx.Done():
			require.FailNowf(t, "nobody listens", "on %s: %v", addr, err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// A connection that says nothing does not hold up the exchange: task 0
// greets every connection on its own, with a deadline of its own. (Fault
// caught: task 0 reading each connection in turn with only ctx's
// deadline, where one silent stray blocks the whole job until ctx ends.)
func TestTCPExchangerSilentStrayDoesNotBlockTheJob(t *testing.T) {
	addr := freeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang guard
	defer cancel()
	x0 := &TCPExchanger{Addr: addr, Tasks: 2, Self: 0, Token: "job"}
	done := make(chan error, 1)
	go func() {
		_, err := x0.AllGather(ctx, []byte{0})
		done <- err
	}()
	stray := dialWhenListening(t, ctx, addr) // connects first, then says nothing
	defer stray.Close()
	x1 := &TCPExchanger{Addr: addr, Tasks: 2, Self: 1, Token: "job"}
	all, err := x1.AllGather(ctx, []byte{1})
	require.NoError(t, err)
	assert.Equal(t, [][]byte{{0}, {1}}, all)
	require.NoError(t, <-done)
	// Task 0 is done: the stray's connection is closed, not left open.
	_ = stray.SetReadDeadline(time.Now().Add(time.Minute)) // a hang guard
	_, err = stray.Read(make([]byte, 1))
	assert.Error(t, err)
	var ne net.Error
	assert.False(t, errors.As(err, &ne) && ne.Timeout(), "task 0 closed the stray's connection: %v", err)
}

// A connection still silent after Timeout is closed by task 0 while the
// exchange goes on. (The Timeout bounds a real task's greeting too: a
// second leaves a loaded machine ample time to greet.)
func TestTCPExchangerClosesAConnectionSilentPastItsTimeout(t *testing.T) {
	addr := freeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang guard
	defer cancel()
	x0 := &TCPExchanger{Addr: addr, Tasks: 2, Self: 0, Token: "job", Timeout: time.Second}
	done := make(chan error, 1)
	go func() {
		_, err := x0.AllGather(ctx, []byte{0})
		done <- err
	}()
	stray := dialWhenListening(t, ctx, addr)
	defer stray.Close()
	_ = stray.SetReadDeadline(time.Now().Add(time.Minute)) // a hang guard
	_, err := stray.Read(make([]byte, 1))
	var ne net.Error
	assert.False(t, errors.As(err, &ne) && ne.Timeout(), "task 0 closed the silent connection: %v", err)
	_, err = (&TCPExchanger{Addr: addr, Tasks: 2, Self: 1, Token: "job"}).AllGather(ctx, []byte{1})
	require.NoError(t, err)
	require.NoError(t, <-done)
}

// Only a connection presenting the job's token joins: another job's task
// (or a stray that speaks something else) is refused, and the job goes
// on. The token is required.
func TestTCPExchangerRefusesAConnectionWithoutTheJobToken(t *testing.T) {
	addr := freeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang guard
	defer cancel()
	x0 := &TCPExchanger{Addr: addr, Tasks: 2, Self: 0, Token: "job-A"}
	done := make(chan error, 1)
	go func() {
		_, err := x0.AllGather(ctx, []byte{0})
		done <- err
	}()
	garbage := dialWhenListening(t, ctx, addr)
	defer garbage.Close()
	_, err := garbage.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	require.NoError(t, err)
	_, err = (&TCPExchanger{Addr: addr, Tasks: 2, Self: 1, Token: "job-B"}).AllGather(ctx, []byte{66})
	require.Error(t, err, "another job's task is refused")
	assert.ErrorIs(t, err, errRefused, "and told so, whether task 0's close came as an EOF or a reset")
	assert.NotErrorIs(t, err, context.DeadlineExceeded)
	all, err := (&TCPExchanger{Addr: addr, Tasks: 2, Self: 1, Token: "job-A"}).AllGather(ctx, []byte{1})
	require.NoError(t, err)
	assert.Equal(t, [][]byte{{0}, {1}}, all, "the refused task's blob is nowhere")
	require.NoError(t, <-done)

	_, err = (&TCPExchanger{Addr: addr, Tasks: 2, Self: 1}).AllGather(ctx, nil)
	assert.ErrorIs(t, err, errInvalid, "no token")
}

// LocalExchangers: the tasks of one process gather every address, in task
// order; a task whose peers never come ends with its context.
func TestLocalExchangersGatherEveryTask(t *testing.T) {
	xs := LocalExchangers(3)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang guard
	defer cancel()
	res := make(chan [][]byte, 3)
	for i, x := range xs {
		go func() {
			all, err := x.AllGather(ctx, []byte{byte(i)})
			assert.NoError(t, err)
			res <- all
		}()
	}
	for range 3 {
		assert.Equal(t, [][]byte{{0}, {1}, {2}}, <-res)
	}
	short, stop := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer stop()
	_, err := LocalExchangers(2)[0].AllGather(short, nil)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

// A greeting with the job's token but a task index that no other task
// has (0, task 0's own, or Tasks, one past the last) is closed unanswered,
// and the job goes on with its real tasks.
func TestTCPExchangerRefusesAGreetingWithATaskIndexOutOfRange(t *testing.T) {
	for _, task := range []uint32{0, 2} {
		t.Run(fmt.Sprint(task), func(t *testing.T) {
			addr := freeAddr(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang guard
			defer cancel()
			x0 := &TCPExchanger{Addr: addr, Tasks: 2, Self: 0, Token: "job"}
			done := make(chan error, 1)
			go func() {
				_, err := x0.AllGather(ctx, []byte{0})
				done <- err
			}()
			bad := dialWhenListening(t, ctx, addr)
			defer bad.Close()
			x0.writeHead(bad)
			require.NoError(t, binary.Write(bad, binary.LittleEndian, task))
			writeBlob(bad, []byte{99})
			_ = bad.SetReadDeadline(time.Now().Add(time.Minute)) // a hang guard
			_, err := bad.Read(make([]byte, 1))
			require.Error(t, err, "closed unanswered")
			var ne net.Error
			assert.False(t, errors.As(err, &ne) && ne.Timeout(), "task 0 closed the connection: %v", err)

			all, err := (&TCPExchanger{Addr: addr, Tasks: 2, Self: 1, Token: "job"}).AllGather(ctx, []byte{1})
			require.NoError(t, err)
			assert.Equal(t, [][]byte{{0}, {1}}, all, "the refused greeting's blob is nowhere")
			require.NoError(t, <-done)
		})
	}
}

// Two greetings for one task index: the first holds the index and the
// repeat is closed unanswered; it is not counted as another task, so the
// job waits for its real tasks and gathers every one.
func TestTCPExchangerKeepsTheFirstGreetingOfATaskAndClosesTheRepeat(t *testing.T) {
	addr := freeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang guard
	defer cancel()
	x0 := &TCPExchanger{Addr: addr, Tasks: 3, Self: 0, Token: "job"}
	done := make(chan error, 1)
	go func() {
		_, err := x0.AllGather(ctx, []byte{0})
		done <- err
	}()
	// Two connections greet as task 1, with the same blob: whichever task 0
	// takes first holds the index.
	answered := make(chan bool, 2)
	for range 2 {
		c := dialWhenListening(t, ctx, addr)
		defer c.Close()
		x0.writeHead(c)
		require.NoError(t, binary.Write(c, binary.LittleEndian, uint32(1)))
		writeBlob(c, []byte{1})
		go func() {
			_ = c.SetReadDeadline(time.Now().Add(time.Minute)) // a hang guard
			n, _ := c.Read(make([]byte, 1))
			answered <- n > 0
		}()
	}
	// The repeat is closed unanswered before task 2 greets: had task 2
	// come first, the job would end without task 0 reading the repeat.
	require.False(t, <-answered, "the first connection to end is the repeat, closed unanswered")
	all, err := (&TCPExchanger{Addr: addr, Tasks: 3, Self: 2, Token: "job"}).AllGather(ctx, []byte{2})
	require.NoError(t, err)
	assert.Equal(t, [][]byte{{0}, {1}, {2}}, all)
	require.NoError(t, <-done)
	assert.True(t, <-answered, "the first greeting of task 1 answered")
}

// Set wakes a Wait it satisfies, as counting does: the waiter returns
// with what is left, not when its context ends.
func TestCounterSetWakesAWaitItSatisfies(t *testing.T) {
	c := NewCounter()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang guard
	defer cancel()
	type result struct {
		left int64
		err  error
	}
	done := make(chan result, 1)
	go func() {
		left, err := c.Wait(ctx, 3)
		done <- result{left, err}
	}()
	require.Eventually(t, func() bool { // the Wait sleeps on the counter
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.changed != nil
	}, time.Minute, time.Millisecond)
	c.Set(5)
	r := <-done
	require.NoError(t, r.err, "woken by Set, not by its context")
	assert.EqualValues(t, 2, r.left)
	assert.EqualValues(t, 2, c.Get())
}

// A job's Token may be as long as maxToken bytes, and task 0 takes a
// greeting that carries one; a byte more is refused with ErrInvalid
// before anything is sent.
func TestTCPExchangerTakesATokenOfMaxTokenBytesAndNotOneMore(t *testing.T) {
	addr := freeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang guard
	defer cancel()
	token := strings.Repeat("t", maxToken)
	done := make(chan error, 1)
	go func() {
		_, err := (&TCPExchanger{Addr: addr, Tasks: 2, Self: 0, Token: token}).AllGather(ctx, []byte{0})
		done <- err
	}()
	all, err := (&TCPExchanger{Addr: addr, Tasks: 2, Self: 1, Token: token}).AllGather(ctx, []byte{1})
	require.NoError(t, err)
	assert.Equal(t, [][]byte{{0}, {1}}, all)
	require.NoError(t, <-done)

	for self := range 2 {
		_, err = (&TCPExchanger{Addr: addr, Tasks: 2, Self: self, Token: token + "t"}).AllGather(ctx, nil)
		assert.ErrorIs(t, err, errInvalid, "task %d, a token of maxToken+1 bytes", self)
	}
}
