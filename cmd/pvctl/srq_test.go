package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// --srq is checked before any device is touched: UD is refused, and so is
// a negative count.
func TestPingpongSRQFlags(t *testing.T) {
	e, _, _ := testEnv(t)
	err := cmdPingpong(e, []string{"--ud", "--srq", "2"})
	assert.ErrorContains(t, err, "--srq needs RC QPs")
	err = cmdPingpong(e, []string{"--srq", "-1"})
	assert.ErrorContains(t, err, "want a number of connections")
}
