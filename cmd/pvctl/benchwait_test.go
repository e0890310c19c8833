package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestReceiverFiguresPerMessage(t *testing.T) {
	var row benchRow
	row.addReceiver(recvWait, recvResult{got: 1000, elapsed: 2 * time.Second, cpu: 500 * time.Millisecond, sleeps: 250, empty: 300})
	assert.Equal(t, recvWait, row.Receiver)
	assert.Equal(t, 1000, row.ReceivesChecked)
	assert.InDelta(t, 500.0, row.ReceiverCPUUSPerMsg, 1e-9, "500 ms over 1000 messages")
	assert.InDelta(t, 25.0, row.ReceiverCPUPercent, 1e-9, "0.5 s of 2 s")
	assert.InDelta(t, 500.0, row.ReceiverMsgPerSec, 1e-9)
	assert.InDelta(t, 0.25, row.SleepsPerMsg, 1e-9)
	assert.InDelta(t, 0.3, row.EmptyPollsPerMsg, 1e-9)

	var empty benchRow
	empty.addReceiver(recvSpin, recvResult{})
	assert.Zero(t, empty.ReceiverCPUUSPerMsg, "no messages: no division by zero")
	assert.Zero(t, empty.ReceiverCPUPercent)
}

func TestRusageCPUAddsUserAndSystem(t *testing.T) {
	ru := unix.Rusage{Utime: unix.Timeval{Sec: 1, Usec: 250000}, Stime: unix.Timeval{Sec: 0, Usec: 500}}
	assert.Equal(t, 1250500*time.Microsecond, rusageCPU(&ru))
	cpu, err := func() (time.Duration, error) { return threadCPU() }()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, cpu, time.Duration(0))
}
