package lifecycle

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The gate: calls after close are refused; close waits for the calls
// inside; a holder refuses calls until it lets go.
func TestGate(t *testing.T) {
	var g Gate
	require.True(t, g.Enter())
	closed := make(chan struct{})
	go func() {
		g.Close()
		close(closed)
	}()
	select {
	case <-closed:
		t.Fatal("close returned with a call inside")
	case <-time.After(10 * time.Millisecond):
	}
	assert.False(t, g.Enter(), "enter while closing")
	g.Exit()
	<-closed
	assert.False(t, g.Enter(), "enter after close")
	assert.True(t, g.IsShut())

	var h Gate
	h.Hold()
	assert.False(t, h.Enter(), "enter while held")
	h.Unhold()
	require.True(t, h.Enter(), "enter after unhold")
	h.Exit()
	h.Hold()
	h.ShutHeld()
	assert.False(t, h.Enter(), "enter after shutHeld")
	assert.False(t, h.EnterWait(), "enterWait of a shut gate")
}

// Shut refuses calls at once and reports the first Shut; Drain then waits
// for the calls inside (a closer with several gates shuts them all first).
func TestShutThenDrain(t *testing.T) {
	var g Gate
	require.True(t, g.Enter())
	assert.True(t, g.Shut(), "the first Shut")
	assert.False(t, g.Shut(), "a second Shut")
	assert.False(t, g.Enter(), "Enter after Shut")
	drained := make(chan struct{})
	go func() {
		g.Drain()
		close(drained)
	}()
	select {
	case <-drained:
		t.Fatal("Drain returned with a call inside")
	case <-time.After(10 * time.Millisecond):
	}
	g.Exit()
	<-drained
}

// BenchmarkGate: what the gate adds to every call it guards (an Enter and
// an Exit, two atomic adds), whatever the batch.
func BenchmarkGate(b *testing.B) {
	var g Gate
	b.ReportAllocs()
	for b.Loop() {
		if !g.Enter() {
			b.Fatal("shut")
		}
		g.Exit()
	}
}
