package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/internal/perf"
)

func TestReceiverFiguresPerMessage(t *testing.T) {
	var row benchRow
	row.addReceiver(recvWait, perf.RecvResult{
		Got: 1000, Elapsed: 2 * time.Second,
		CPU:     perf.CPU{User: 300 * time.Millisecond, Sys: 200 * time.Millisecond},
		Wakeups: 250, Empty: 300,
	})
	assert.Equal(t, recvWait, row.Receiver)
	assert.Equal(t, 1000, row.ReceivesChecked)
	assert.InDelta(t, 500.0, row.ReceiverCPUUSPerMsg, 1e-9, "500 ms over 1000 messages")
	assert.InDelta(t, 25.0, row.ReceiverCPUPercent, 1e-9, "0.5 s of 2 s")
	assert.InDelta(t, 500.0, row.ReceiverMsgPerSec, 1e-9)
	assert.InDelta(t, 0.25, row.WakeupsPerMsg, 1e-9)
	assert.InDelta(t, 0.3, row.EmptyPollsPerMsg, 1e-9)

	var empty benchRow
	empty.addReceiver(recvSpin, perf.RecvResult{})
	assert.Zero(t, empty.ReceiverCPUUSPerMsg, "no messages: no division by zero")
	assert.Zero(t, empty.ReceiverCPUPercent)
	assert.Zero(t, empty.WakeupsPerMsg)
}

func TestBenchJSONFields(t *testing.T) {
	var row benchRow
	row.addReceiver(recvWait, perf.RecvResult{Got: 10, Elapsed: time.Second, CPU: perf.CPU{User: time.Millisecond}, Wakeups: 5})
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
