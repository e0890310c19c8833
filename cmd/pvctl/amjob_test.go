package main

import (
	"bytes"
	"encoding/json"
	"os"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// launcherEnv is what Open MPI 4's mpirun sets for task rank of n, and the
// job's address.
func launcherEnv(rank, n int, addr string) func(string) string {
	vars := map[string]string{
		"OMPI_COMM_WORLD_RANK":    strconv.Itoa(rank),
		"OMPI_COMM_WORLD_SIZE":    strconv.Itoa(n),
		"OMPI_MCA_ess_base_jobid": "3826286593",
		"PMIX_RANK":               strconv.Itoa(rank),
		"PMIX_NAMESPACE":          "3826286593",
		"VFRDMA_AM_ADDR":          addr,
	}
	return func(k string) string { return vars[k] }
}

// am --launcher: the tasks of a launcher's job (here three runs in this
// process, each with the variables mpirun sets and its own model on one
// --fabric directory, as three processes are) run an all-to-all: every
// task sends and receives every message, every byte checked, its
// counters exact.
func TestAMLauncherJobIsAnAllToAllWithEveryByteCheckedAndCountersExact(t *testing.T) {
	dir, err := os.MkdirTemp("", "pvf")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	const n, messages = 3, 50
	addr := freeAddr(t)
	var outs, errOuts [n]bytes.Buffer
	var codes [n]int
	var wg sync.WaitGroup
	for i := range n {
		e := &env{out: &outs[i], errOut: &errOuts[i], getenv: launcherEnv(i, n, addr)}
		args := []string{"--model", "v20", "--fabric", dir, "--json", "am", "--launcher", "--sizes", "0,8,70000", "--messages", strconv.Itoa(messages)}
		wg.Go(func() { codes[i] = run(e, args) })
	}
	wg.Wait()
	for i := range n {
		require.Equal(t, 0, codes[i], "task %d: %s%s", i, outs[i].String(), errOuts[i].String())
		var r amJobResult
		require.NoError(t, json.Unmarshal(outs[i].Bytes(), &r), outs[i].String())
		each := int64(3 * messages * (n - 1))
		assert.Equal(t, i, r.Task)
		assert.Equal(t, n, r.Tasks)
		assert.EqualValues(t, each, r.Sent)
		assert.Equal(t, each, r.Received)
		assert.Equal(t, each, r.Checked)
		assert.Equal(t, each, r.Origin)
		assert.Equal(t, each, r.Complete)
		assert.Equal(t, each, r.Target)
	}
}

// Without a launcher's variables, or beside --listen, --launcher is
// refused before a device is reached.
func TestAMLauncherNeedsALauncher(t *testing.T) {
	var out, errOut bytes.Buffer
	e := &env{out: &out, errOut: &errOut, getenv: func(string) string { return "" }}
	assert.Equal(t, 1, run(e, []string{"--model", "v20", "am", "--launcher"}))
	assert.Contains(t, errOut.String(), "not started by a launcher")
	assert.Zero(t, e.reached)

	errOut.Reset()
	e = &env{out: &out, errOut: &errOut}
	assert.Equal(t, 2, run(e, []string{"--model", "v20", "am", "--launcher", "--listen", ":7470"}))
	assert.Contains(t, errOut.String(), "no --listen, --connect or --vm")
	assert.Zero(t, e.reached)
}
