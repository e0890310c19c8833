package main

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestCPUUseDelta(t *testing.T) {
	before := cpuUseOf(&unix.Rusage{
		Utime: unix.Timeval{Sec: 1, Usec: 900000},
		Stime: unix.Timeval{Sec: 0, Usec: 999999},
	})
	after := cpuUseOf(&unix.Rusage{
		Utime: unix.Timeval{Sec: 2, Usec: 100000}, // the microseconds wrap
		Stime: unix.Timeval{Sec: 1, Usec: 250000},
	})
	d := after.since(before)
	assert.Equal(t, 200*time.Millisecond, d.user)
	assert.Equal(t, 250001*time.Microsecond, d.sys)
	assert.Equal(t, 450001*time.Microsecond, d.total(), "user plus system")
	assert.Equal(t, cpuUse{}, after.since(after))
}

func TestReadCPUMoves(t *testing.T) {
	c0, err := readCPU()
	require.NoError(t, err)
	for end := time.Now().Add(20 * time.Millisecond); time.Now().Before(end); {
	}
	c1, err := readCPU()
	require.NoError(t, err)
	d := c1.since(c0)
	assert.Positive(t, d.total(), "20 ms of spinning costs CPU time")
}

func TestReceiverFiguresPerMessage(t *testing.T) {
	var row benchRow
	row.addReceiver(recvWait, recvResult{
		got: 1000, elapsed: 2 * time.Second,
		cpu:     cpuUse{user: 300 * time.Millisecond, sys: 200 * time.Millisecond},
		wakeups: 250, empty: 300,
	})
	assert.Equal(t, recvWait, row.Receiver)
	assert.Equal(t, 1000, row.ReceivesChecked)
	assert.InDelta(t, 500.0, row.ReceiverCPUUSPerMsg, 1e-9, "500 ms over 1000 messages")
	assert.InDelta(t, 25.0, row.ReceiverCPUPercent, 1e-9, "0.5 s of 2 s")
	assert.InDelta(t, 500.0, row.ReceiverMsgPerSec, 1e-9)
	assert.InDelta(t, 0.25, row.WakeupsPerMsg, 1e-9)
	assert.InDelta(t, 0.3, row.EmptyPollsPerMsg, 1e-9)

	var empty benchRow
	empty.addReceiver(recvSpin, recvResult{})
	assert.Zero(t, empty.ReceiverCPUUSPerMsg, "no messages: no division by zero")
	assert.Zero(t, empty.ReceiverCPUPercent)
	assert.Zero(t, empty.WakeupsPerMsg)
}

func TestBenchJSONFields(t *testing.T) {
	var row benchRow
	row.addReceiver(recvWait, recvResult{got: 10, elapsed: time.Second, cpu: cpuUse{user: time.Millisecond}, wakeups: 5})
	b, err := json.Marshal(benchResult{Mode: "receiver", ReceiverCPU: cpuScopeProcess, Rows: []benchRow{row}})
	require.NoError(t, err)
	var got struct {
		ReceiverCPU string           `json:"receiver_cpu"`
		Rows        []map[string]any `json:"rows"`
	}
	require.NoError(t, json.Unmarshal(b, &got))
	assert.Equal(t, "process", got.ReceiverCPU)
	require.Len(t, got.Rows, 1)
	r := got.Rows[0]
	assert.Equal(t, "wait", r["receiver"])
	assert.InDelta(t, 100.0, r["receiver_cpu_us_per_msg"], 1e-9)
	assert.InDelta(t, 0.5, r["wakeups_per_msg"], 1e-9)
}

func TestWatchQuiet(t *testing.T) {
	var progress atomic.Int64
	// Long enough that a loaded machine's scheduling never makes 10 ms of
	// sleep look like silence (80 ms did: a failure at load 9).
	const quiet = 2 * time.Second

	// Progress keeps it alive; silence ends it with errQuiet.
	ctx, stop := watchQuiet(context.Background(), &progress, quiet)
	defer stop()
	for i := 0; i < 50; i++ {
		time.Sleep(10 * time.Millisecond)
		progress.Add(1)
	}
	require.NoError(t, ctx.Err(), "still making progress")
	select {
	case <-ctx.Done():
	case <-time.After(20 * quiet):
		t.Fatal("no errQuiet after 20 quiet periods")
	}
	assert.ErrorIs(t, context.Cause(ctx), errQuiet)

	// stop, and the parent's end, are not errQuiet.
	ctx2, stop2 := watchQuiet(context.Background(), &progress, quiet)
	stop2()
	<-ctx2.Done()
	assert.False(t, errors.Is(context.Cause(ctx2), errQuiet))
	parent, cancel := context.WithCancel(context.Background())
	ctx3, stop3 := watchQuiet(parent, &progress, quiet)
	defer stop3()
	cancel()
	<-ctx3.Done()
	assert.ErrorIs(t, context.Cause(ctx3), context.Canceled)
}
