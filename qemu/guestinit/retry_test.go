package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/qemu/guest"
	"github.com/vfrdma/vfrdma/qemu/proto"
)

// A retried step runs again while it fails by itself (its server is not up
// yet), until its Retry window has passed.
func TestRetryRerunsAFailedStep(t *testing.T) {
	count := filepath.Join(t.TempDir(), "count")
	body := `echo x >> ` + count + `; [ $(wc -l < ` + count + `) -ge 3 ]`
	recs, ok := runOne(t, guest.Step{Name: "p", Path: script(t, body), Kind: guest.KindCmd, Timeout: 5 * time.Second, Retry: 20 * time.Second})
	require.True(t, ok, "the third attempt succeeds: %+v", recs)
	b, err := os.ReadFile(count)
	require.NoError(t, err)
	assert.Equal(t, 3, strings.Count(string(b), "\n"), "attempts")
}

// A retried step killed at its time limit is not run again: it hung (a
// lost message), and the peer that served the hung attempt would not serve
// another; the step fails at once, naming the timeout.
func TestRetryDoesNotRerunAStepKilledAtItsLimit(t *testing.T) {
	count := filepath.Join(t.TempDir(), "count")
	body := `echo x >> ` + count + `; sleep 100`
	recs, ok := runOne(t, guest.Step{Name: "p", Path: script(t, body), Kind: guest.KindCmd, Timeout: 300 * time.Millisecond, Retry: 20 * time.Second})
	require.False(t, ok)
	exit := recs[len(recs)-1]
	require.Equal(t, proto.EventExit, exit.Event)
	assert.Equal(t, -1, exit.Code)
	assert.Equal(t, "killed: timeout after 300ms", exit.Msg)
	b, err := os.ReadFile(count)
	require.NoError(t, err)
	assert.Equal(t, 1, strings.Count(string(b), "\n"), "attempts")
}
