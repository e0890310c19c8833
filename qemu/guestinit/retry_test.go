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

// A retried step that failed after its exchange with the peer (it printed
// the peer's address, as rdma-core's and perftest's clients do) is not run
// again: its server has served it, and a rerun could only wait out its
// time limit (perftest's client failing its report, "Correlation
// coefficient r^2 < 0.9", after the traffic: a 20 s hang in a loop of the
// reference tier). One that failed before it still is.
func TestRetryDoesNotRerunAStepPastItsExchange(t *testing.T) {
	count := filepath.Join(t.TempDir(), "count")
	body := `echo x >> ` + count + `; echo " remote address: LID 0000 QPN 0x0013"; exit 1`
	recs, ok := runOne(t, guest.Step{Name: "p", Path: script(t, body), Kind: guest.KindCmd, Timeout: 5 * time.Second, Retry: 20 * time.Second})
	require.False(t, ok)
	exit := recs[len(recs)-1]
	require.Equal(t, proto.EventExit, exit.Event)
	assert.Equal(t, 1, exit.Code)
	b, err := os.ReadFile(count)
	require.NoError(t, err)
	assert.Equal(t, 1, strings.Count(string(b), "\n"), "attempts")
}

// A program past its time limit gets SIGQUIT before SIGKILL: a Go program
// prints its goroutines' stacks on it, which say where it hung.
func TestAStepPastItsLimitIsAskedToQuitFirst(t *testing.T) {
	body := `trap 'echo got SIGQUIT; exit 3' QUIT; echo started; while :; do sleep 0.05; done`
	recs, ok := runOne(t, guest.Step{Name: "p", Path: script(t, body), Kind: guest.KindCmd, Timeout: 500 * time.Millisecond})
	require.False(t, ok)
	var lines []string
	for _, r := range recs {
		if r.Event == proto.EventOut {
			lines = append(lines, r.Line)
		}
	}
	require.NotEmpty(t, lines)
	assert.Equal(t, "started", lines[0])
	assert.Contains(t, lines, "got SIGQUIT")
	exit := recs[len(recs)-1]
	assert.Equal(t, "killed: timeout after 500ms", exit.Msg)
}

// A step with OKIfOutput that exits non-zero after its exchange, having
// printed that line (perftest's client: "Can't produce a report" when its
// clock sampling fails on a loaded host, after the traffic), counts as
// done and says so, whichever of the two lines came first (perftest's
// stdout reaches the pipe at its exit, after its stderr); the line with no
// exchange at all does not.
func TestOKIfOutputAfterTheExchange(t *testing.T) {
	body := `echo " remote address: LID 0000 QPN 0x0013"; echo "Correlation coefficient r^2: 0.84 < 0.9" >&2; echo "Can't produce a report" >&2; exit 1`
	recs, ok := runOne(t, guest.Step{Name: "p", Path: script(t, body), Kind: guest.KindCmd, Timeout: 5 * time.Second, Retry: 20 * time.Second, OKIfOutput: "Can't produce a report"})
	require.True(t, ok, "%+v", recs)
	exit := recs[len(recs)-1]
	assert.Equal(t, 0, exit.Code)
	assert.Contains(t, exit.Msg, "Can't produce a report")

	// As perftest's output reaches the pipe: its stderr at once, its
	// stdout (the addresses) when it exits.
	body = `echo "Correlation coefficient r^2: 0.78 < 0.9" >&2; echo "Can't produce a report" >&2; echo " remote address: LID 0000 QPN 0x0013"; exit 1`
	recs, ok = runOne(t, guest.Step{Name: "p", Path: script(t, body), Kind: guest.KindCmd, Timeout: 5 * time.Second, Retry: 20 * time.Second, OKIfOutput: "Can't produce a report"})
	require.True(t, ok, "the report's failure printed before the exchange's line: %+v", recs)
	assert.Equal(t, 0, recs[len(recs)-1].Code)

	body = `echo "Can't produce a report"; exit 1`
	recs, ok = runOne(t, guest.Step{Name: "p", Path: script(t, body), Kind: guest.KindCmd, Timeout: 5 * time.Second, OKIfOutput: "Can't produce a report"})
	require.False(t, ok, "no exchange: a failure")
	assert.Equal(t, 1, recs[len(recs)-1].Code)
}
