package pvsim

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A pass over the timers fires those due when it begins, and no more: a
// timer that re-arms itself (as a retransmission re-arms the ACK timer)
// waits for the next pass, and the inbox is read in between. A chain of
// timers each re-arming the next a nanosecond on would otherwise run to
// its end in one pass, with the inbox unread.
func TestATimerPassFiresOnlyTheTimersDueWhenItBegins(t *testing.T) {
	const chain = 1_000_000
	d, err := New(Config{})
	require.NoError(t, err)
	defer d.Close()
	fired := 0 // on the device goroutine
	require.NoError(t, d.call(func() {
		var tick func()
		tick = func() {
			if fired++; fired < chain {
				d.w.after(time.Nanosecond, tick)
			}
		}
		d.w.after(0, tick)
	}))
	var seen int
	require.NoError(t, d.call(func() { seen = fired }))
	assert.Less(t, seen, chain, "the inbox was read before the chain ended")
}
