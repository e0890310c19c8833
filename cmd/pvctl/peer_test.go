package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// memRendezvous is the bench's rendezvous in memory: keys written once,
// Get waiting for them.
type memRendezvous struct {
	mu      sync.Mutex
	changed chan struct{} // closed and replaced at each Put
	kv      map[string]string
}

func newMemRendezvous() *memRendezvous {
	return &memRendezvous{changed: make(chan struct{}), kv: map[string]string{}}
}

func (m *memRendezvous) Put(key, value string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.kv[key]; ok {
		return errors.New("key " + key + " written twice")
	}
	m.kv[key] = value
	close(m.changed)
	m.changed = make(chan struct{})
	return nil
}

func (m *memRendezvous) Get(ctx context.Context, key string) (string, error) {
	for {
		m.mu.Lock()
		v, ok := m.kv[key]
		ch := m.changed
		m.mu.Unlock()
		if ok {
			return v, nil
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-ch:
		}
	}
}

func (m *memRendezvous) Close() error { return nil }

// Two VMs swap addresses and meet at barriers through the rendezvous; VM 0
// is the server, and a second exchange under another tag (as am makes)
// writes keys of its own.
func TestVMExchange(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r := newMemRendezvous()
	xs := [2]*vmExchange{{c: r, vm: 0, tag: "t"}, {c: r, vm: 1, tag: "t"}}
	assert.True(t, xs[0].server())
	assert.False(t, xs[1].server())
	for _, tag := range []string{"t", "t/am"} {
		var got [2]peerInfo
		var wg sync.WaitGroup
		for i, x := range xs {
			x := &vmExchange{c: x.c, vm: x.vm, tag: tag}
			wg.Go(func() {
				var err error
				got[i], err = x.swap(ctx, peerInfo{QPN: uint32(10 + i), QKey: testQKey})
				assert.NoError(t, err, "vm%d swap", i)
				assert.NoError(t, x.barrier(ctx, "done"), "vm%d barrier", i)
			})
		}
		wg.Wait()
		assert.Equal(t, peerInfo{QPN: 11, QKey: testQKey}, got[0], tag)
		assert.Equal(t, peerInfo{QPN: 10, QKey: testQKey}, got[1], tag)
	}
}

// A barrier the other VM never reaches ends with ctx.
func TestVMExchangeBarrierTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	x := &vmExchange{c: newMemRendezvous(), vm: 1, tag: "t"}
	require.ErrorIs(t, x.barrier(ctx, "alone"), context.DeadlineExceeded)
}

// The pingpong's pattern is byte(seq + 13i) at every size, written and
// checked a block at a time; a wrong byte anywhere is named by its index.
func TestPatternIsTheFormulaAndCheckNamesTheWrongByte(t *testing.T) {
	for _, size := range []int{0, 1, 255, 256, 257, 4096, 5000} {
		for _, seq := range []int{0, 1, 7, 255, 1000} {
			b := make([]byte, size)
			pattern(b, seq)
			for i := range b {
				require.Equal(t, byte(seq+i*13), b[i], "size %d seq %d byte %d", size, seq, i)
			}
			require.NoError(t, checkPattern(b, seq))
			if size == 0 {
				continue
			}
			for _, at := range []int{0, size / 2, size - 1} {
				b[at] ^= 0x40
				assert.ErrorContains(t, checkPattern(b, seq), fmt.Sprintf("byte %d is", at), "size %d seq %d", size, seq)
				b[at] ^= 0x40
			}
			assert.Error(t, checkPattern(b, seq+1), "the next message's pattern")
		}
	}
}
