package wq

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/mmio"
	"github.com/vfrdma/vfrdma/rings"
)

// A request for reaps is never lost between a poster and a poller that
// gives it up: a post published after the poller read the tail, whose
// poster found the request still held and asked for nothing, makes the
// poller keep the queue; with no such post the request is given up and
// the poster's next one is new. (Fault caught: the request given up
// whatever came meanwhile, the queue then full of consumed unsignaled
// sends nobody reaps.)
func TestAReapRequestIsNeverLostWhenThePollerGivesItUp(t *testing.T) {
	reg, err := mmio.New(make([]byte, doorbell.PageSize))
	require.NoError(t, err)
	state := make([]byte, 8)
	var w Queue
	stride := rings.SendStride(1)
	require.NoError(t, w.Init("QP 1", reg, state, make([]byte, 8*stride), stride, 8, 1, doorbell.OffsetQP, doorbell.QPSend|1))
	w.SetSelective()
	post := func(id uint64) {
		w.ClaimSend(id, false)
		require.NoError(t, w.End(false))
	}

	post(1)
	require.True(t, w.WantReap(), "the poster's first request")
	tail := w.tailP.Load()
	assert.False(t, w.giveUpReaps(tail), "nothing posted since: given up")
	assert.True(t, w.WantReap(), "the poster's next request is new")

	// The poller has read the tail; a post comes, its poster finds the
	// request held and asks nothing; then the poller gives it up.
	tail = w.tailP.Load()
	post(2)
	require.False(t, w.WantReap(), "held: the poster asks nothing")
	assert.True(t, w.giveUpReaps(tail), "the post since: the poller keeps the queue")
	assert.False(t, w.WantReap(), "and the request")
}
