package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A window larger than the queue, or negative, is refused before the
// device is touched.
func TestBenchRefusesABadWindow(t *testing.T) {
	for _, w := range []string{"513", "-1"} {
		e, out, _ := testEnv(t)
		err := cmdBench(e, []string{"--window", w})
		require.Error(t, err, "--window %s", w)
		assert.Contains(t, err.Error(), "--window "+w)
		assert.Empty(t, out.String())
	}
}
