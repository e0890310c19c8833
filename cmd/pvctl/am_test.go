package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/connect"
)

func TestAMSizesParse(t *testing.T) {
	s, err := parseSizes("8, 4096,0")
	require.NoError(t, err)
	assert.Equal(t, []int{8, 4096, 0}, s)
	for _, bad := range []string{"", "8,x", "-1"} {
		_, err := parseSizes(bad)
		assert.Error(t, err, "%q", bad)
	}
}

func TestAMRefusesBadFlagsBeforeTouchingADevice(t *testing.T) {
	for _, args := range [][]string{{"--sizes", "8,y"}, {"--iters", "0"}, {"--bw-messages", "-1"}, {"--nope"}, {"--tests", "latency,speed"}, {"--tests", ""}} {
		e, _, _ := testEnv(t)
		assert.Error(t, cmdAM(e, args), "%v", args)
	}
}

// fakeExchanger swaps with a fixed peer.
type fakeExchanger struct {
	peer connect.Info
	srv  bool
}

func (f *fakeExchanger) swap(context.Context, connect.Info) (connect.Info, error) { return f.peer, nil }
func (f *fakeExchanger) barrier(context.Context, string) error                    { return nil }
func (f *fakeExchanger) server() bool                                             { return f.srv }
func (f *fakeExchanger) close()                                                   {}

// The all-gather over pvctl's exchanger puts each blob at its task.
func TestAMPeerExchangeOrdersByTask(t *testing.T) {
	for self := range 2 {
		x := amPeerExchange{x: &fakeExchanger{peer: connect.Info{Data: []byte("theirs")}}, self: self}
		all, err := x.AllGather(context.Background(), []byte("mine"))
		require.NoError(t, err)
		assert.Equal(t, "mine", string(all[self]))
		assert.Equal(t, "theirs", string(all[1-self]))
	}
}
