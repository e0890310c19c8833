package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pingpong --srq is checked before any device is touched (the test
// machine has none to open): UD is refused, and so is a count below 1,
// also an explicit 0.
func TestPingpongSRQFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--ud", "--srq", "2"}, "--srq needs RC QPs"},
		{[]string{"--srq", "2", "--ud"}, "--srq needs RC QPs"},
		{[]string{"--srq", "0"}, "--srq 0: want a number of connections, 1 or more"},
		{[]string{"--rc", "--srq=-1"}, "--srq -1: want a number of connections, 1 or more"},
		{[]string{"--srq", "4", "--iters", "0"}, "--iters 0: want 1 or more"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			e, out, _ := testEnv(t)
			err := cmdPingpong(e, tc.args)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Empty(t, out.String(), "nothing printed for a refused command")
		})
	}
}

// --srq 1 passes the flag checks: the command gets as far as the device.
func TestPingpongSRQFlagsAccepted(t *testing.T) {
	e, _, _ := testEnv(t)
	err := cmdPingpong(e, []string{"--rc", "--srq", "1", "--iters", "1"})
	require.Error(t, err, "the fake sysfs has a pvrdma function but no device to open")
	assert.NotContains(t, err.Error(), "--srq")
	assert.Contains(t, err.Error(), "open 0000:00:10.1")
}

func TestSRQInfoText(t *testing.T) {
	s := srqInfo{maxSRQWR: 12288, maxSGE: 2, MaxDepth: []int{8192, 4096}}
	assert.Equal(t, "8192 (1 SGE), 4096 (2 SGEs)", s.depthText())
	assert.Contains(t, s.limitText(), "max_srq_wr 12288")
	assert.Contains(t, s.limitText(), "one ring of 128 pages")
}
