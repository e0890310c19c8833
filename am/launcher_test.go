//go:build !guest

package am

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// envOf is a process environment held in a map, as LauncherExchanger
// reads it.
func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// with returns a copy of env with the variables of more set (and those
// set to "" removed).
func with(env map[string]string, more map[string]string) map[string]string {
	e := maps.Clone(env)
	for k, v := range more {
		if v == "" {
			delete(e, k)
		} else {
			e[k] = v
		}
	}
	return e
}

// srunEnv is what srun sets for task rank of a step of n tasks spread
// over node01 and node02 (srun(1), OUTPUT ENVIRONMENT VARIABLES; Slurm's
// env_array_for_step and setup_env; slurmstepd adds SLURMD_NODENAME).
func srunEnv(job, step string, rank, n int) map[string]string {
	perNode := (n + 1) / 2
	node, local := rank/perNode, rank%perNode
	tasks := strconv.Itoa(n)
	return map[string]string{
		"SLURM_JOB_ID":              job,
		"SLURM_JOBID":               job,
		"SLURM_STEP_ID":             step,
		"SLURM_STEPID":              step,
		"SLURM_PROCID":              strconv.Itoa(rank),
		"SLURM_LOCALID":             strconv.Itoa(local),
		"SLURM_NODEID":              strconv.Itoa(node),
		"SLURM_STEP_NUM_TASKS":      tasks,
		"SLURM_NTASKS":              tasks,
		"SLURM_NPROCS":              tasks,
		"SLURM_STEP_NUM_NODES":      "2",
		"SLURM_NNODES":              "2",
		"SLURM_JOB_NUM_NODES":       "2",
		"SLURM_STEP_NODELIST":       "node[01-02]",
		"SLURM_NODELIST":            "node[01-02]",
		"SLURM_JOB_NODELIST":        "node[01-02]",
		"SLURM_STEP_TASKS_PER_NODE": fmt.Sprintf("%d(x2)", perNode),
		"SLURM_TASKS_PER_NODE":      fmt.Sprintf("%d(x2)", perNode),
		"SLURM_GTIDS":               strconv.Itoa(rank),
		"SLURM_CLUSTER_NAME":        "bench",
		"SLURM_SUBMIT_DIR":          "/home/user",
		"SLURMD_NODENAME":           fmt.Sprintf("node%02d", node+1),
	}
}

// ompi5Env is what Open MPI 5's mpirun (PRRTE) sets for task rank of n:
// Open MPI's documented variables and the PMIx server's.
func ompi5Env(rank, n int) map[string]string {
	return map[string]string{
		"OMPI_COMM_WORLD_RANK":       strconv.Itoa(rank),
		"OMPI_COMM_WORLD_SIZE":       strconv.Itoa(n),
		"OMPI_COMM_WORLD_LOCAL_RANK": strconv.Itoa(rank),
		"OMPI_COMM_WORLD_LOCAL_SIZE": strconv.Itoa(n),
		"OMPI_COMM_WORLD_NODE_RANK":  strconv.Itoa(rank),
		"OMPI_UNIVERSE_SIZE":         strconv.Itoa(n),
		"PMIX_RANK":                  strconv.Itoa(rank),
		"PMIX_NAMESPACE":             "prterun-node01-48211@1",
		"PMIX_SERVER_URI41":          "prterun-node01-48211@0.0;tcp4://10.0.0.1:41235",
		"PMIX_SECURITY_MODE":         "native",
	}
}

// ompi4Env is what Open MPI 4's mpirun (ORTE) sets.
func ompi4Env(rank, n int) map[string]string {
	return map[string]string{
		"OMPI_COMM_WORLD_RANK":       strconv.Itoa(rank),
		"OMPI_COMM_WORLD_SIZE":       strconv.Itoa(n),
		"OMPI_COMM_WORLD_LOCAL_RANK": strconv.Itoa(rank),
		"OMPI_COMM_WORLD_LOCAL_SIZE": strconv.Itoa(n),
		"OMPI_UNIVERSE_SIZE":         strconv.Itoa(n),
		"OMPI_MCA_ess_base_jobid":    "3826286593",
		"OMPI_MCA_ess_base_vpid":     strconv.Itoa(rank),
		"OMPI_MCA_orte_hnp_uri":      "3826286592.0;tcp://10.0.0.1:39633",
		"PMIX_RANK":                  strconv.Itoa(rank),
		"PMIX_NAMESPACE":             "3826286593",
	}
}

// hydraEnv is what MPICH's mpiexec (Hydra's proxy) sets: PMI_RANK,
// PMI_FD and PMI_SIZE, and no job id.
func hydraEnv(rank, n int) map[string]string {
	return map[string]string{
		"PMI_RANK": strconv.Itoa(rank),
		"PMI_SIZE": strconv.Itoa(n),
		"PMI_FD":   "6",
	}
}

// testAddr is task 0's address where no test dials it.
const testAddr = "node01:7470"

// srun: the rank is SLURM_PROCID, the size the step's, the token the job
// and step ids.
func TestLauncherExchangerTakesRankAndSizeFromSrun(t *testing.T) {
	for rank := range 4 {
		x, err := LauncherExchanger(envOf(with(srunEnv("4242", "0", rank, 4), map[string]string{EnvAddr: testAddr})))
		require.NoError(t, err)
		assert.Equal(t, TCPExchanger{Addr: testAddr, Tasks: 4, Self: rank, Token: "slurm:4242.0"}, *x)
	}
}

// mpirun: the rank and size are Open MPI's; the token its job's PMIx
// namespace, or ORTE's job id where there is none.
func TestLauncherExchangerTakesRankAndSizeFromMpirun(t *testing.T) {
	x, err := LauncherExchanger(envOf(with(ompi5Env(3, 8), map[string]string{EnvAddr: testAddr})))
	require.NoError(t, err)
	assert.Equal(t, TCPExchanger{Addr: testAddr, Tasks: 8, Self: 3, Token: "ompi:prterun-node01-48211@1"}, *x)

	x, err = LauncherExchanger(envOf(with(ompi4Env(1, 2), map[string]string{EnvAddr: testAddr})))
	require.NoError(t, err)
	assert.Equal(t, TCPExchanger{Addr: testAddr, Tasks: 2, Self: 1, Token: "ompi:3826286593"}, *x)

	older := with(ompi4Env(1, 2), map[string]string{EnvAddr: testAddr, "PMIX_RANK": "", "PMIX_NAMESPACE": ""})
	x, err = LauncherExchanger(envOf(older))
	require.NoError(t, err)
	assert.Equal(t, "ompi:3826286593", x.Token, "OMPI_MCA_ess_base_jobid")
	x, err = LauncherExchanger(envOf(with(older, map[string]string{"OMPI_MCA_ess_base_jobid": ""})))
	require.NoError(t, err)
	assert.Equal(t, "ompi:3826286592.0;tcp://10.0.0.1:39633", x.Token, "OMPI_MCA_orte_hnp_uri")
}

// mpiexec (Hydra): PMI's rank and size; Hydra sets no job id, so the
// token must be given.
func TestLauncherExchangerTakesRankAndSizeFromHydraAndItsTokenFromTheUser(t *testing.T) {
	x, err := LauncherExchanger(envOf(with(hydraEnv(2, 3), map[string]string{EnvAddr: testAddr, EnvToken: "run-17"})))
	require.NoError(t, err)
	assert.Equal(t, TCPExchanger{Addr: testAddr, Tasks: 3, Self: 2, Token: "run-17"}, *x)

	_, err = LauncherExchanger(envOf(with(hydraEnv(2, 3), map[string]string{EnvAddr: testAddr})))
	assert.ErrorIs(t, err, errNoToken)
	assert.ErrorContains(t, err, "PMI_JOBID")
	assert.ErrorContains(t, err, EnvToken)
}

// srun --mpi=pmi2 sets PMI's variables beside its own: they agree, and
// PMI_JOBID names the step.
func TestLauncherExchangerTakesSrunsPMI2Variables(t *testing.T) {
	env := with(srunEnv("4242", "1", 1, 2), map[string]string{
		"PMI_FD": "5", "PMI_JOBID": "4242.1", "PMI_RANK": "1", "PMI_SIZE": "2", EnvAddr: testAddr,
	})
	x, err := LauncherExchanger(envOf(env))
	require.NoError(t, err)
	assert.Equal(t, TCPExchanger{Addr: testAddr, Tasks: 2, Self: 1, Token: "pmi:4242.1"}, *x)
}

// srun --mpi=pmix sets PMIx's rank and namespace (slurm.pmix.<job>.<step>)
// and no size: Slurm's variables give it.
func TestLauncherExchangerTakesPMIxSizeFromSrunUnderMpiPMIx(t *testing.T) {
	env := with(srunEnv("4242", "0", 3, 4), map[string]string{
		"PMIX_RANK": "3", "PMIX_NAMESPACE": "slurm.pmix.4242.0", EnvAddr: testAddr,
	})
	x, err := LauncherExchanger(envOf(env))
	require.NoError(t, err)
	assert.Equal(t, TCPExchanger{Addr: testAddr, Tasks: 4, Self: 3, Token: "slurm:4242.0"}, *x)

	_, err = LauncherExchanger(envOf(with(env, map[string]string{"PMIX_RANK": "2"})))
	assert.ErrorIs(t, err, errLauncherConflict, "PMIx and Slurm disagree on the rank")
}

// PMIx with PMIX_JOB_SIZE: its own rank, size and namespace.
func TestLauncherExchangerTakesPMIxJobSizeWhereSet(t *testing.T) {
	env := map[string]string{"PMIX_RANK": "1", "PMIX_JOB_SIZE": "2", "PMIX_NAMESPACE": "ns-9", EnvAddr: testAddr}
	x, err := LauncherExchanger(envOf(env))
	require.NoError(t, err)
	assert.Equal(t, TCPExchanger{Addr: testAddr, Tasks: 2, Self: 1, Token: "pmix:ns-9"}, *x)
}

// A PMIx rank without a size is an error that says so, also inside a
// Slurm allocation whose step is another launcher's daemons (the
// namespace is not srun's): Slurm's size is not borrowed.
func TestLauncherExchangerPMIxWithoutASizeIsAnError(t *testing.T) {
	env := map[string]string{"PMIX_RANK": "1", "PMIX_NAMESPACE": "prterun-node01-77@1", EnvAddr: testAddr}
	_, err := LauncherExchanger(envOf(env))
	assert.ErrorIs(t, err, errLauncherEnv)
	assert.ErrorContains(t, err, "PMIx gives no size")

	inAlloc := with(srunEnv("4242", "3", 1, 2), env) // prted's step: one daemon per node
	_, err = LauncherExchanger(envOf(inAlloc))
	assert.ErrorIs(t, err, errLauncherEnv)
	assert.ErrorContains(t, err, "PMIx gives no size")
}

// Slurm's size is the step's (SLURM_STEP_NUM_TASKS: srun --preserve-env
// leaves SLURM_NTASKS the allocation's), else SLURM_NTASKS, else
// SLURM_NPROCS.
func TestLauncherExchangerSlurmSizeIsTheStepsThenNTasksThenNProcs(t *testing.T) {
	env := with(srunEnv("7", "0", 1, 2), map[string]string{EnvAddr: testAddr, "SLURM_NTASKS": "8", "SLURM_NPROCS": "8"})
	x, err := LauncherExchanger(envOf(env))
	require.NoError(t, err)
	assert.Equal(t, 2, x.Tasks, "SLURM_STEP_NUM_TASKS")

	env = with(env, map[string]string{"SLURM_STEP_NUM_TASKS": "", "SLURM_NTASKS": "3", "SLURM_NPROCS": "5"})
	x, err = LauncherExchanger(envOf(env))
	require.NoError(t, err)
	assert.Equal(t, 3, x.Tasks, "SLURM_NTASKS")

	env = with(env, map[string]string{"SLURM_NTASKS": ""})
	x, err = LauncherExchanger(envOf(env))
	require.NoError(t, err)
	assert.Equal(t, 5, x.Tasks, "SLURM_NPROCS")

	_, err = LauncherExchanger(envOf(with(env, map[string]string{"SLURM_NPROCS": ""})))
	assert.ErrorIs(t, err, errLauncherEnv)
	assert.ErrorContains(t, err, "SLURM_STEP_NUM_TASKS")
}

// mpirun and mpiexec inside an allocation start their tasks through
// daemons srun started: the tasks inherit the daemons' Slurm variables
// (or the batch script's), and the MPI launcher's are the task's.
func TestLauncherExchangerMPILauncherInsideASlurmAllocationWins(t *testing.T) {
	// Task 3 of 4 on node02, under the orted that srun started there:
	// the daemons' step has one task per other node.
	daemon := srunEnv("4242", "0", 0, 1)
	x, err := LauncherExchanger(envOf(with(daemon, with(ompi4Env(3, 4), map[string]string{EnvAddr: testAddr}))))
	require.NoError(t, err)
	assert.Equal(t, TCPExchanger{Addr: testAddr, Tasks: 4, Self: 3, Token: "ompi:3826286593"}, *x)

	// Task 1 on node01, forked by mpirun in the batch script, whose
	// variables it inherits (SLURM_PROCID without a step).
	batch := with(srunEnv("4242", "", 0, 4), map[string]string{"SLURM_STEP_NUM_TASKS": ""})
	x, err = LauncherExchanger(envOf(with(batch, with(ompi5Env(1, 4), map[string]string{EnvAddr: testAddr}))))
	require.NoError(t, err)
	assert.Equal(t, 1, x.Self)
	assert.Equal(t, 4, x.Tasks)

	// mpiexec (Hydra) with its proxies started by srun.
	x, err = LauncherExchanger(envOf(with(daemon, with(hydraEnv(2, 4), map[string]string{EnvAddr: testAddr, EnvToken: "t"}))))
	require.NoError(t, err)
	assert.Equal(t, 2, x.Self)
	assert.Equal(t, 4, x.Tasks)
}

// Two MPI launchers' variables that disagree are an error naming both.
func TestLauncherExchangerMPILaunchersThatDisagreeAreAnError(t *testing.T) {
	_, err := LauncherExchanger(envOf(with(ompi5Env(1, 4), map[string]string{"PMIX_RANK": "2", EnvAddr: testAddr})))
	assert.ErrorIs(t, err, errLauncherConflict)
	assert.ErrorContains(t, err, "OMPI_COMM_WORLD_RANK=1")
	assert.ErrorContains(t, err, "PMIX_RANK=2")

	_, err = LauncherExchanger(envOf(with(ompi5Env(1, 4), map[string]string{"PMI_RANK": "1", "PMI_SIZE": "3", EnvAddr: testAddr})))
	assert.ErrorIs(t, err, errLauncherConflict)
	assert.ErrorContains(t, err, "PMI_SIZE=3")
}

// No launcher's variables: ErrNoLauncher, naming those looked for; a
// Slurm batch script or allocation shell is not a task either.
func TestLauncherExchangerWithoutALauncherSaysSo(t *testing.T) {
	_, err := LauncherExchanger(envOf(map[string]string{EnvAddr: testAddr, "HOME": "/home/user"}))
	assert.ErrorIs(t, err, ErrNoLauncher)
	for _, v := range []string{"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"} {
		assert.ErrorContains(t, err, v)
	}

	batch := with(srunEnv("4242", "", 0, 4), map[string]string{"SLURM_STEP_NUM_TASKS": "", EnvAddr: testAddr})
	_, err = LauncherExchanger(envOf(batch))
	assert.ErrorIs(t, err, ErrNoLauncher)
	assert.ErrorContains(t, err, "srun")
}

// A rank or size that is not a decimal number, or out of range, is an
// error naming the variable; so is one of a pair set without the other.
func TestLauncherExchangerRefusesMalformedOrOutOfRangeRanksAndSizes(t *testing.T) {
	srun := with(srunEnv("4242", "0", 1, 4), map[string]string{EnvAddr: testAddr})
	for _, c := range []struct {
		env  map[string]string
		name string
	}{
		{with(srun, map[string]string{"SLURM_PROCID": "x"}), "SLURM_PROCID"},
		{with(srun, map[string]string{"SLURM_PROCID": "-1"}), "SLURM_PROCID"},
		{with(srun, map[string]string{"SLURM_PROCID": "+1"}), "SLURM_PROCID"},
		{with(srun, map[string]string{"SLURM_PROCID": " 1"}), "SLURM_PROCID"},
		{with(srun, map[string]string{"SLURM_PROCID": "1.0"}), "SLURM_PROCID"},
		{with(srun, map[string]string{"SLURM_PROCID": "4"}), "SLURM_PROCID=4 is not below SLURM_STEP_NUM_TASKS=4"},
		{with(srun, map[string]string{"SLURM_PROCID": "99999999999999999999"}), "SLURM_PROCID"},
		{with(srun, map[string]string{"SLURM_STEP_NUM_TASKS": "0"}), "SLURM_STEP_NUM_TASKS"},
		{with(srun, map[string]string{"SLURM_STEP_NUM_TASKS": "4097"}), "SLURM_STEP_NUM_TASKS"},
		{with(srun, map[string]string{"SLURM_STEP_NUM_TASKS": "4(x2)"}), "SLURM_STEP_NUM_TASKS"},
		{with(ompi5Env(1, 4), map[string]string{"OMPI_COMM_WORLD_SIZE": ""}), "OMPI_COMM_WORLD_SIZE"},
		{with(ompi5Env(1, 4), map[string]string{"OMPI_COMM_WORLD_RANK": ""}), "OMPI_COMM_WORLD_RANK"},
		{with(ompi5Env(1, 4), map[string]string{"OMPI_COMM_WORLD_RANK": "5"}), "OMPI_COMM_WORLD_RANK=5 is not below OMPI_COMM_WORLD_SIZE=4"},
		{with(hydraEnv(0, 2), map[string]string{"PMI_SIZE": "two"}), "PMI_SIZE"},
		{with(hydraEnv(0, 2), map[string]string{"PMI_SIZE": ""}), "PMI_SIZE"},
		{map[string]string{"PMIX_RANK": "r0", "PMIX_JOB_SIZE": "2"}, "PMIX_RANK"},
		{map[string]string{"PMIX_RANK": "2", "PMIX_JOB_SIZE": "2"}, "PMIX_RANK=2 is not below PMIX_JOB_SIZE=2"},
	} {
		_, err := LauncherExchanger(envOf(c.env))
		assert.ErrorIs(t, err, errLauncherEnv, "%s", c.name)
		assert.ErrorContains(t, err, c.name)
	}
}

// Task 0's address is VFRDMA_AM_ADDR, host:port with a numeric port;
// without it (and, under srun, without VFRDMA_AM_PORT) the error says
// what to set. A job of one task needs none.
func TestLauncherExchangerNeedsTask0sAddress(t *testing.T) {
	_, err := LauncherExchanger(envOf(srunEnv("4242", "0", 1, 4)))
	assert.ErrorIs(t, err, errRendezvous)
	assert.ErrorContains(t, err, EnvAddr)
	assert.ErrorContains(t, err, EnvPort)

	_, err = LauncherExchanger(envOf(ompi5Env(1, 4)))
	assert.ErrorIs(t, err, errRendezvous)
	assert.ErrorContains(t, err, "mpirun -x "+EnvAddr)

	for _, bad := range []string{"node01", "node01:", "node01:http", "node01:0", "node01:70000", "node01:-1", "node01:7470:1"} {
		_, err = LauncherExchanger(envOf(with(srunEnv("4242", "0", 1, 4), map[string]string{EnvAddr: bad})))
		assert.ErrorIs(t, err, errRendezvous, bad)
		assert.ErrorContains(t, err, EnvAddr, bad)
	}
	x, err := LauncherExchanger(envOf(with(srunEnv("4242", "0", 1, 4), map[string]string{EnvAddr: "[fe80::1%eth0]:7470"})))
	require.NoError(t, err)
	assert.Equal(t, "[fe80::1%eth0]:7470", x.Addr)

	x, err = LauncherExchanger(envOf(srunEnv("4242", "0", 0, 1)))
	require.NoError(t, err, "one task exchanges with nobody")
	assert.Equal(t, TCPExchanger{Tasks: 1, Self: 0, Token: "slurm:4242.0"}, *x)
	all, err := x.AllGather(context.Background(), []byte{7})
	require.NoError(t, err)
	assert.Equal(t, [][]byte{{7}}, all)

	x, err = LauncherExchanger(envOf(hydraEnv(0, 1)))
	require.NoError(t, err, "one task needs no token either")
	all, err = x.AllGather(context.Background(), []byte{7})
	require.NoError(t, err)
	assert.Equal(t, [][]byte{{7}}, all)
}

// Under srun, VFRDMA_AM_PORT alone puts task 0 on the step's first node,
// which task 0 checks it runs on; VFRDMA_AM_ADDR wins over it; a node
// list whose first host cannot be read for certain is an error, and so
// is VFRDMA_AM_PORT under another launcher.
func TestLauncherExchangerUnderSrunPutsTask0OnTheStepsFirstNode(t *testing.T) {
	for rank := range 4 {
		x, err := LauncherExchanger(envOf(with(srunEnv("4242", "0", rank, 4), map[string]string{EnvPort: "7470"})))
		require.NoError(t, err)
		assert.Equal(t, "node01:7470", x.Addr)
	}
	x, err := LauncherExchanger(envOf(with(srunEnv("4242", "0", 1, 4), map[string]string{EnvPort: "7470", EnvAddr: "10.0.0.9:9"})))
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.9:9", x.Addr)

	// Task 0 placed elsewhere (an arbitrary distribution, say): it says so.
	_, err = LauncherExchanger(envOf(with(srunEnv("4242", "0", 0, 4), map[string]string{EnvPort: "7470", "SLURMD_NODENAME": "node02"})))
	assert.ErrorIs(t, err, errRendezvous)
	assert.ErrorContains(t, err, "task 0 runs on node02")

	_, err = LauncherExchanger(envOf(with(srunEnv("4242", "0", 1, 4), map[string]string{EnvPort: "7470", "SLURM_STEP_NODELIST": "node[01-04"})))
	assert.ErrorIs(t, err, errRendezvous)
	assert.ErrorContains(t, err, EnvAddr)
	_, err = LauncherExchanger(envOf(with(srunEnv("4242", "0", 1, 4), map[string]string{EnvPort: "7470", "SLURM_STEP_NODELIST": ""})))
	assert.ErrorIs(t, err, errRendezvous)
	_, err = LauncherExchanger(envOf(with(srunEnv("4242", "0", 1, 4), map[string]string{EnvPort: "http"})))
	assert.ErrorIs(t, err, errRendezvous)
	assert.ErrorContains(t, err, EnvPort)
	_, err = LauncherExchanger(envOf(with(ompi5Env(1, 4), map[string]string{EnvPort: "7470"})))
	assert.ErrorIs(t, err, errRendezvous, "only srun's step names task 0's node")
}

// The token is the launcher's job id, the same on every task of a job
// and different for another job or step; VFRDMA_AM_TOKEN stands in for
// it; a job id too long for a token is hashed.
func TestLauncherExchangerTokenIsTheJobsOwn(t *testing.T) {
	token := func(env map[string]string) string {
		t.Helper()
		x, err := LauncherExchanger(envOf(with(env, map[string]string{EnvAddr: testAddr})))
		require.NoError(t, err)
		return x.Token
	}
	a0, a3 := token(srunEnv("100", "0", 0, 4)), token(srunEnv("100", "0", 3, 4))
	assert.Equal(t, a0, a3, "tasks of one step")
	assert.NotEqual(t, a0, token(srunEnv("100", "1", 0, 4)), "another step of the job")
	assert.NotEqual(t, a0, token(srunEnv("101", "0", 0, 4)), "another job")
	assert.NotEqual(t, a0, token(srunEnv("10", "00", 0, 4)), "the ids are kept apart")
	assert.Equal(t, "mine", token(with(srunEnv("100", "0", 0, 4), map[string]string{EnvToken: "mine"})))

	long := strings.Repeat("x", 2*maxToken)
	tl := token(with(ompi4Env(0, 2), map[string]string{"PMIX_NAMESPACE": "", "OMPI_MCA_ess_base_jobid": "", "OMPI_MCA_orte_hnp_uri": long}))
	assert.LessOrEqual(t, len(tl), maxToken)
	assert.True(t, strings.HasPrefix(tl, "ompi:sha256:"), tl)
	assert.Equal(t, tl, token(with(ompi4Env(1, 2), map[string]string{"PMIX_NAMESPACE": "", "OMPI_MCA_ess_base_jobid": "", "OMPI_MCA_orte_hnp_uri": long})))

	_, err := LauncherExchanger(envOf(with(srunEnv("100", "0", 0, 4), map[string]string{EnvAddr: testAddr, EnvToken: long})))
	assert.ErrorIs(t, err, errNoToken)
	assert.ErrorContains(t, err, EnvToken)
}

// Where the launcher sets no job id, the token must be given.
func TestLauncherExchangerNeedsATokenWhereTheLauncherSetsNoJobID(t *testing.T) {
	for _, env := range []map[string]string{
		hydraEnv(0, 2),
		with(ompi4Env(0, 2), map[string]string{"PMIX_NAMESPACE": "", "OMPI_MCA_ess_base_jobid": "", "OMPI_MCA_orte_hnp_uri": ""}),
		{"PMIX_RANK": "0", "PMIX_JOB_SIZE": "2"},
		with(srunEnv("", "0", 0, 2), nil),
	} {
		_, err := LauncherExchanger(envOf(with(env, map[string]string{EnvAddr: testAddr})))
		assert.ErrorIs(t, err, errNoToken)
		assert.ErrorContains(t, err, EnvToken)
		x, err := LauncherExchanger(envOf(with(env, map[string]string{EnvAddr: testAddr, EnvToken: "given"})))
		require.NoError(t, err)
		assert.Equal(t, "given", x.Token)
	}
}

// firstHost takes the first host of a Slurm host list, or refuses.
func TestFirstHostOfASlurmHostList(t *testing.T) {
	for list, want := range map[string]string{
		"node01":                 "node01",
		"node[01-04]":            "node01",
		"node[7,9-12]":           "node7",
		"node[010-012],gpu[1-2]": "node010",
		"a,b":                    "a",
		"gnode[10,20,25,37]":     "gnode10",
		"r[2-3]n[08,10]":         "r2n08",
		"n[001-003]-ib":          "n001-ib",
		"[5-6]x":                 "5x",
		"login.cluster_1":        "login.cluster_1",
	} {
		got, err := firstHost(list)
		require.NoError(t, err, list)
		assert.Equal(t, want, got, list)
	}
	for _, bad := range []string{"", ",node1", "node[01-04", "node01-04]", "node[]", "node[a-b]", "node[1-]", "node[-2]", "node[1,,2]", "node[000x333]", "node[1-4:2]", "node [1-2]", "node[1[2]]", "nöde1"} {
		_, err := firstHost(bad)
		assert.Error(t, err, "%q", bad)
	}
}

// FuzzFirstHost: no list panics firstHost, and what it returns is one
// host name: no brackets, commas or spaces.
func FuzzFirstHost(f *testing.F) {
	for _, s := range []string{"node[01-04]", "a,b", "r[2-3]n[08,10]", "node[", "]", "[,]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, list string) {
		h, err := firstHost(list)
		if err != nil {
			return
		}
		if h == "" || strings.ContainsAny(h, "[], \t") {
			t.Fatalf("firstHost(%q) = %q", list, h)
		}
	})
}

// gatherJob runs tasks from to n-1 of a job as srun would start them,
// each with its own environment, the later ones first (before task 0
// listens); each task's blob names the job and the task. It returns what
// each gathered, and its error.
func gatherJob(ctx context.Context, job, addr string, n, from int) ([][][]byte, []error) {
	res := make([][][]byte, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for rank := n - 1; rank >= from; rank-- {
		env := with(srunEnv(job, "0", rank, n), map[string]string{EnvAddr: addr})
		wg.Go(func() {
			x, err := LauncherExchanger(envOf(env))
			if err == nil {
				res[rank], err = x.AllGather(ctx, fmt.Appendf(nil, "job %s task %d", job, x.Self))
			}
			errs[rank] = err
		})
	}
	wg.Wait()
	return res, errs
}

// checkJob checks that tasks from to n-1 of a job gathered every task's
// blob, in task order.
func checkJob(t *testing.T, job string, n, from int, res [][][]byte, errs []error) {
	t.Helper()
	for rank := from; rank < n; rank++ {
		if assert.NoError(t, errs[rank], "job %s task %d", job, rank) {
			assert.Equal(t, blobsOf(job, n), res[rank], "job %s task %d", job, rank)
		}
	}
}

func blobsOf(job string, n int) [][]byte {
	var want [][]byte
	for i := range n {
		want = append(want, fmt.Appendf(nil, "job %s task %d", job, i))
	}
	return want
}

// End to end: the tasks of an srun step, each with its own environment,
// gather every task's blob over TCP on the loopback.
func TestLauncherExchangerGathersASrunJobOverTCP(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang guard
	defer cancel()
	const n = 4
	res, errs := gatherJob(ctx, "4242", freeAddr(t), n, 0)
	checkJob(t, "4242", n, 0, res, errs)
}

// Two jobs at once, on addresses of their own, do not mix; a task of one
// sent to the other's task 0 by mistake is refused by the token, and the
// other job goes on.
func TestLauncherExchangerKeepsTwoSlurmJobsApart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang guard
	defer cancel()
	const n = 3
	addrA, addrB := freeAddr(t), freeAddr(t)

	// Job A's task 0 first, and job B's task 1 misdirected to it.
	xa0, err := LauncherExchanger(envOf(with(srunEnv("100", "0", 0, n), map[string]string{EnvAddr: addrA})))
	require.NoError(t, err)
	a0 := make(chan [][]byte, 1)
	go func() {
		all, err := xa0.AllGather(ctx, []byte("job 100 task 0"))
		assert.NoError(t, err)
		a0 <- all
	}()
	stray, err := LauncherExchanger(envOf(with(srunEnv("200", "0", 1, n), map[string]string{EnvAddr: addrA})))
	require.NoError(t, err)
	_, err = stray.AllGather(ctx, []byte("job 200 task 1, lost"))
	assert.ErrorIs(t, err, errRefused)
	assert.NoError(t, ctx.Err())

	var resA, resB [][][]byte
	var errsA, errsB []error
	var wg sync.WaitGroup
	wg.Go(func() { resA, errsA = gatherJob(ctx, "100", addrA, n, 1) })
	wg.Go(func() { resB, errsB = gatherJob(ctx, "200", addrB, n, 0) })
	wg.Wait()
	assert.Equal(t, blobsOf("100", n), <-a0, "job 100 task 0")
	checkJob(t, "100", n, 1, resA, errsA)
	checkJob(t, "200", n, 0, resB, errsB)
}
