package vmxnet3

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/qemu/proto"
)

// noFault runs f with memory faults turned into panics, and reports one
// as an error: a NIC call that reads memory Close unmapped fails the test
// instead of killing the test binary.
func noFault(f func()) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("fault: %v", r)
		}
	}()
	f()
	return nil
}

// After Close every call that can fail returns ErrClosed, and none touches
// the memory or registers Close freed (Send's link check reads no unmapped
// shared area). A second Close returns nil.
func TestNICCallsAfterCloseReturnErrClosed(t *testing.T) {
	n, f := newTestNIC(t, nil)
	require.NoError(t, n.Close())
	bufs, sizes := [][]byte{make([]byte, 1514)}, []int{0}
	ctx := context.Background()
	calls := map[string]func() error{
		"Send":           func() error { _, err := n.Send([][]byte{frame(60, 1)}); return err },
		"Send nothing":   func() error { _, err := n.Send(nil); return err },
		"Recv":           func() error { _, err := n.Recv(bufs, sizes); return err },
		"RecvWait":       func() error { _, err := n.RecvWait(ctx, bufs, sizes); return err },
		"Link":           func() error { _, err := n.Link(); return err },
		"WaitLinkChange": func() error { _, _, err := n.WaitLinkChange(ctx, 0); return err },
		"Stats":          func() error { _, err := n.Stats(); return err },
	}
	for name, call := range calls {
		var err error
		require.NoError(t, noFault(func() { err = call() }), name)
		assert.ErrorIs(t, err, ErrClosed, name)
	}
	assert.NoError(t, n.Close(), "a second Close")
	// ErrClosed comes before any other check: a NIC without interrupts.
	n.rxIRQ, n.eventIRQ = nil, nil
	_, err := n.RecvWait(ctx, bufs, sizes)
	assert.ErrorIs(t, err, ErrClosed, "RecvWait without a receive interrupt")
	_, _, err = n.WaitLinkChange(ctx, 0)
	assert.ErrorIs(t, err, ErrClosed, "WaitLinkChange without an event interrupt")
	f.mu.Lock()
	defer f.mu.Unlock()
	assert.Zero(t, f.late, "register accesses after Close")
}

// Close wakes a RecvWait and a WaitLinkChange asleep with no deadline:
// they return ErrClosed, and Close does not wait for them to wake first.
func TestNICCloseWakesSleepers(t *testing.T) {
	n, f := newTestNIC(t, nil)
	errs := make(chan error, 2)
	go func() {
		_, err := n.RecvWait(context.Background(), [][]byte{make([]byte, 1514)}, []int{0})
		errs <- err
	}()
	go func() {
		_, _, err := n.WaitLinkChange(context.Background(), 0)
		errs <- err
	}()
	// Both are asleep once they have unmasked their vectors (or soon
	// after: either way they must come back with ErrClosed).
	for {
		f.mu.Lock()
		armed := !f.imr[vecRx] && !f.imr[vecEvent]
		f.mu.Unlock()
		if armed {
			break
		}
		runtime.Gosched()
	}
	require.NoError(t, n.Close())
	for range 2 {
		assert.ErrorIs(t, <-errs, ErrClosed)
	}
}

// Close races a sender, a receiver (sleeping in RecvWait at times), the control calls
// and a second Close, at a random moment, round after round, with the
// device delivering frames: no call faults or touches a register after
// Close freed the NIC, every call returns success or ErrClosed (once
// ErrClosed, always), and the frames received are whole and in order.
func TestNICCloseRacingCalls(t *testing.T) {
	rounds := 100
	if testing.Short() || os.Getenv(proto.EnvGuest) == "1" { // the guest's one CPU under TCG is slow
		rounds = 10
	}
	for round := range rounds {
		n, f := newTestNIC(t, &Options{TxRing: 32, RxRing: 32})
		f.discard = true
		var wg sync.WaitGroup
		var ops atomic.Int64 // calls made: Close comes after a random number
		// run calls op until it returns ErrClosed; any other error, or a
		// fault, fails the test.
		run := func(what string, op func() error) {
			wg.Go(func() {
				err := noFault(func() {
					for {
						ops.Add(1)
						err := op()
						if err == nil {
							continue
						}
						assert.ErrorIs(t, err, ErrClosed, "round %d: %s", round, what)
						return
					}
				})
				assert.NoError(t, err, "round %d: %s", round, what)
			})
		}
		out := [][]byte{frame(60, 1), frame(1514, 2)}
		run("Send", func() error { _, err := n.Send(out); return err })
		// Frame i carries i in its first 4 bytes: the device drops frames
		// when the ring is full, so the received ones are in order, not
		// consecutive.
		mk := func(i int) []byte {
			b := frame(60+i%1000, byte(i))
			binary.LittleEndian.PutUint32(b, uint32(i))
			return b
		}
		last := -1
		checkFrames := func(bufs [][]byte, sizes []int, got int) error {
			for k := range got {
				b := bufs[k][:sizes[k]]
				i := int(le32(b))
				if !assert.Greater(t, i, last, "round %d: frames out of order", round) ||
					!assert.Equal(t, mk(i), b, "round %d: frame %d", round, i) {
					return ErrClosed // stop the loop: the failure is recorded
				}
				last = i
			}
			return nil
		}
		// One receiver (the NIC has one receive side): Recv and RecvWait
		// in turns; RecvWait sleeps when nothing is there, and Close wakes
		// it.
		bufs, sizes := [][]byte{make([]byte, 1514), make([]byte, 1514)}, []int{0, 0}
		turn := 0
		run("Recv and RecvWait", func() error {
			var got int
			var err error
			if turn++; turn%4 == 0 {
				got, err = n.RecvWait(context.Background(), bufs, sizes)
			} else {
				got, err = n.Recv(bufs, sizes)
			}
			if err != nil {
				return err
			}
			return checkFrames(bufs, sizes, got)
		})
		run("Link", func() error { _, err := n.Link(); return err })
		run("Stats", func() error { _, err := n.Stats(); return err })
		wg.Go(func() { // the device: frames until the NIC resets it
			for i := 0; f.tryDeliver(mk(i)); i++ {
				if i%8 == 0 {
					runtime.Gosched()
				}
			}
		})
		// A random moment, counted in calls rather than in time or in
		// yields (with one CPU a yield can cost a busy goroutine's whole
		// time slice).
		for at := int64(rand.IntN(400)); ops.Load() < at; {
			runtime.Gosched()
		}
		wg.Go(func() { assert.NoError(t, n.Close(), "round %d: the second Close", round) })
		require.NoError(t, noFault(func() { assert.NoError(t, n.Close()) }), "round %d: Close", round)
		wg.Wait()
		f.mu.Lock()
		late := f.late
		f.mu.Unlock()
		require.Zero(t, late, "round %d: register accesses after Close", round)
		if t.Failed() {
			return
		}
	}
}
