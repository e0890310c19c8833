//go:build !guest

package am

import (
	"context"
	"flag"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/pvsim"
)

// manyTasks is the size of the job TestAnAllToAllOfManyTasksOnALossFreeFabricRetransmitsNothing
// runs; 0 means 64, or 16 under the race detector or -short, which keep
// the host tier within its time.
var manyTasks = flag.Int("am.tasks", 0, "tasks of the loss-free all-to-all (0: 64, 16 under -race or -short)")

// 64 tasks in one process, each on a model of its own on one fabric
// (4160 QPs), run an all-to-all: every task sends every task, itself
// included, 0 B, 8 B, one packet exactly and one byte more, every byte
// checked. The fabric loses nothing, so nothing is sent twice, however
// far the models run behind the ACK timeout (the race detector, a loaded
// host): the fabric's retransmission and timeout counters stay at 0.
// Under -race or -short the job is 16 tasks; -am.tasks N runs N, e.g.
//
//	go test -race -run TestAnAllToAllOfManyTasksOnALossFreeFabricRetransmitsNothing ./am/ -am.tasks 64
func TestAnAllToAllOfManyTasksOnALossFreeFabricRetransmitsNothing(t *testing.T) {
	n := *manyTasks
	if n == 0 {
		n = 64
		if raceEnabled || testing.Short() {
			n = 16
		}
	}
	fab := pvsim.NewFabric()
	ds := make([]*vfrdma.Device, n)
	for i := range ds {
		ds[i], _ = openModel(t, pvsim.Config{Version: 20, Fabric: fab})
	}
	cs := newJobOn(t, ds, Config{})
	one := cs[0].OnePacket(16)
	sizes := []int{0, 8, one, one + 1}
	runTasks(t, cs, 8*time.Minute, func(ctx context.Context, c *Context) error { return allToAll(ctx, c, sizes) })
	s := fab.Stats()
	require.Positive(t, s.Packets)
	assert.Zero(t, s.Retransmits, "requests sent again")
	assert.Zero(t, s.Timeouts, "ACK timeouts that declared a loss")
	assert.Zero(t, s.Dropped, "packets dropped")
	t.Logf("%d tasks, %d packets; ACK timeouts that came due with the request or its answer still inside the models: %d",
		n, s.Packets, s.TimeoutsHeld)
}
