package event

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Rule: Wait never outlives its ctx. Wait on a Chan set takes the token to
// see that the set is signaled and leaves it set; it used to put the token
// back with a blocking send. A Wake that claimed the flag before a
// TryWait's reset sends its token late, under the lowered flag: when that
// send lands between Wait's receive and its put-back, the channel is full
// and the put-back blocked for good, deaf to ctx (1 in 3 000 to 1 in
// 100 000 tries with free-running wakers). Here the late sender is a
// goroutine parked on the full channel while Wait takes the token, which
// hands the sender's token into the buffer at the receive: the put-back
// meets a full channel every time the sender parked first.
func TestWaitNeverOutlivesItsCtxWhenALateWakeFillsTheChannel(t *testing.T) {
	const rounds = 20
	for round := range rounds {
		f := &fakeSource{syncer: &fakeSyncer{}}
		ws, err := NewWaitSet(Chan)
		require.NoError(t, err)
		require.NoError(t, ws.Add(f))
		late := make(chan struct{})
		f.inReady = func(f *fakeSource, arm bool) {
			f.inReady = nil
			ws.Wake() // a Wake during TryWait: the token is in
			go func() {
				defer close(late)
				ws.sig.ch <- struct{}{} // the late send of a Wake that claimed the flag before the reset
			}()
			for range 100 { // let the sender park on the full channel
				runtime.Gosched()
			}
			time.Sleep(time.Millisecond)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		done := make(chan error, 1)
		go func() { done <- ws.Wait(ctx) }()
		select {
		case err := <-done:
			assert.NoError(t, err, "round %d: the set was signaled", round)
		case <-time.After(long):
			cancel()
			t.Fatalf("round %d: Wait still blocked %v after it began, with a ctx of 50ms", round, long)
		}
		cancel()
		<-late
		require.NoError(t, ws.Remove(f))
		require.NoError(t, ws.Close())
	}
}
