package am

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// The variables of our own that LauncherExchanger reads.
const (
	// EnvAddr is task 0's host:port, the same on every task.
	EnvAddr = "VFRDMA_AM_ADDR"
	// EnvPort is task 0's port alone, under srun: task 0's host is then
	// the step's first node.
	EnvPort = "VFRDMA_AM_PORT"
	// EnvToken names the job; by default the launcher's job id does.
	EnvToken = "VFRDMA_AM_TOKEN"
)

// ErrNoLauncher is LauncherExchanger's error when this process is not a
// task a launcher started: none of the launchers' variables is set, or
// only those of a Slurm batch script or allocation shell. A program that
// also runs alone may take it to mean a job of one task.
var ErrNoLauncher = errors.New("am: not started by a launcher (srun, mpirun, mpiexec)")

// LauncherExchanger's other errors; each message names the variables.
var (
	errLauncherEnv      = errors.New("am: launcher variable malformed or out of range")
	errLauncherConflict = errors.New("am: launchers' variables disagree")
	errRendezvous       = errors.New("am: no usable rendezvous address")
	errNoToken          = errors.New("am: no job token")
)

// launch is what one launcher's variables say about this task.
type launch struct {
	name             string // for messages: "Open MPI's mpirun", ...
	prefix           string // of the token made from the job id: "ompi", ...
	rank, size       int    // size 0: the launcher sets none
	rankVar, sizeVar string
	job              string // the job id, the same on every task of the job ("": none)
	jobVars          string // where it is looked for, for messages
}

// LauncherExchanger returns this task's TCPExchanger in a job that a
// launcher started, so that an am job runs under the launcher a cluster
// has: its rank and size come from the variables the launcher set, task
// 0's address from VFRDMA_AM_ADDR, the job's token from VFRDMA_AM_TOKEN
// or else the launcher's job id. It reads nothing but env: os.Getenv in
// a program, a map in a test. Config takes the exchanger's Tasks and
// Self:
//
//	x, err := am.LauncherExchanger(os.Getenv)
//	...
//	c, err := am.New(ctx, d, am.Config{Tasks: x.Tasks, Self: x.Self, Exchange: x})
//
// The launchers, in the order they are looked for, and what is read of
// each:
//   - Open MPI's mpirun: OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE;
//     the job id is PMIX_NAMESPACE, else OMPI_MCA_ess_base_jobid, else
//     OMPI_MCA_orte_hnp_uri (Open MPI 4 and older set the last two).
//   - PMI, as MPICH's and Intel MPI's mpiexec (Hydra) and srun --mpi=pmi2
//     set it: PMI_RANK and PMI_SIZE; the job id is PMI_JOBID, which srun
//     sets and Hydra does not (under Hydra, set VFRDMA_AM_TOKEN).
//   - PMIx: PMIX_RANK, and PMIX_JOB_SIZE where the launcher sets it; the
//     job id is PMIX_NAMESPACE. OpenPMIx's server sets no size variable
//     (its clients ask it for the size): under srun --mpi=pmix, whose
//     namespace is slurm.pmix.<job>.<step>, Slurm's variables give the
//     size; elsewhere a PMIx rank without a size is an error.
//   - Slurm's srun: SLURM_PROCID; the size is SLURM_STEP_NUM_TASKS, else
//     SLURM_NTASKS, else SLURM_NPROCS; the job id is SLURM_JOB_ID and
//     SLURM_STEP_ID (each step is a job of its own). SLURM_PROCID without
//     SLURM_STEP_ID is a batch script or an allocation's shell, not a
//     task srun started: ErrNoLauncher.
//
// Slurm comes last because mpirun and mpiexec inside an allocation
// (salloc, sbatch) start their tasks through daemons that srun started:
// the tasks inherit Slurm variables that number the daemons, not the
// tasks. Where an MPI launcher's variables are set, Slurm's describe the
// allocation and are not read. The MPI launchers' variables must agree
// where more than one launcher set them (Open MPI sets PMIx's beside its
// own): a rank or size that differs is an error, and so is one that is
// not a decimal number, a rank not below the size, or a size not from 1
// to 4096 (what Config takes).
//
// VFRDMA_AM_ADDR is task 0's host:port, the same on every task (srun
// passes the environment on; with mpirun, -x VFRDMA_AM_ADDR). Under srun,
// VFRDMA_AM_PORT may stand in for it: task 0's host is then the first
// node of SLURM_STEP_NODELIST, and task 0 checks that it runs there
// (SLURMD_NODENAME). A job of one task needs no address.
//
// The token keeps other jobs' tasks out (see TCPExchanger): every task of
// a job must have the same and no other job may. A launcher's job id is
// both; a heterogeneous Slurm step's components may each see a job id of
// their own, and Hydra sets none: there, set VFRDMA_AM_TOKEN.
func LauncherExchanger(env func(string) string) (*TCPExchanger, error) {
	l, err := findLaunch(env)
	if err != nil {
		return nil, err
	}
	x := &TCPExchanger{Tasks: l.size, Self: l.rank}
	if x.Addr, err = rendezvous(env, l); err != nil {
		return nil, err
	}
	if x.Token, err = jobToken(env, l); err != nil {
		return nil, err
	}
	return x, nil
}

// findLaunch picks the launcher that started this task (see
// LauncherExchanger for the rules).
func findLaunch(env func(string) string) (*launch, error) {
	var found []*launch
	for _, f := range []func(func(string) string) (*launch, error){ompiLaunch, pmiLaunch, pmixLaunch} {
		l, err := f(env)
		if err != nil {
			return nil, err
		}
		if l != nil {
			found = append(found, l)
		}
	}
	if len(found) == 0 {
		l, err := slurmLaunch(env)
		if err == nil && l == nil {
			err = fmt.Errorf("%w: none of OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK, SLURM_PROCID is set", ErrNoLauncher)
		}
		return l, err
	}
	l := found[0]
	for _, o := range found[1:] {
		if o.rank != l.rank {
			return nil, fmt.Errorf("%w: %s says %s=%d, %s says %s=%d", errLauncherConflict, l.name, l.rankVar, l.rank, o.name, o.rankVar, o.rank)
		}
		if o.size != 0 && l.size != 0 && o.size != l.size {
			return nil, fmt.Errorf("%w: %s says %s=%d, %s says %s=%d", errLauncherConflict, l.name, l.sizeVar, l.size, o.name, o.sizeVar, o.size)
		}
	}
	if l.size != 0 {
		return l, nil
	}
	// PMIx alone, without a size: srun --mpi=pmix's namespace says Slurm
	// launched the task and its variables hold the size.
	s, err := slurmLaunch(env)
	if err != nil || s == nil || l.job != "slurm.pmix."+s.job {
		return nil, fmt.Errorf("%w: %s=%d is set and PMIx gives no size (PMIX_JOB_SIZE is not set, and PMIX_NAMESPACE=%q is not srun's for this step): launch with srun or mpirun", errLauncherEnv, l.rankVar, l.rank, l.job)
	}
	if s.rank != l.rank {
		return nil, fmt.Errorf("%w: %s says %s=%d, %s says %s=%d", errLauncherConflict, l.name, l.rankVar, l.rank, s.name, s.rankVar, s.rank)
	}
	return s, nil
}

// ompiLaunch reads Open MPI's variables (Open MPI's documentation,
// "Environment variables set for MPI applications").
func ompiLaunch(env func(string) string) (*launch, error) {
	l := &launch{name: "Open MPI's mpirun", prefix: "ompi"}
	ok, err := l.read(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", true)
	if !ok || err != nil {
		return nil, err
	}
	l.jobVars = "PMIX_NAMESPACE, OMPI_MCA_ess_base_jobid, OMPI_MCA_orte_hnp_uri"
	_, l.job = first(env, "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_hnp_uri")
	return l, nil
}

// pmiLaunch reads PMI-1's variables: Hydra's proxy sets PMI_RANK and
// PMI_SIZE (beside PMI_FD), Slurm's mpi/pmi2 plugin those and PMI_JOBID
// ("<job>.<step>").
func pmiLaunch(env func(string) string) (*launch, error) {
	l := &launch{name: "PMI (mpiexec, srun --mpi=pmi2)", prefix: "pmi"}
	ok, err := l.read(env, "PMI_RANK", "PMI_SIZE", true)
	if !ok || err != nil {
		return nil, err
	}
	l.jobVars, l.job = "PMI_JOBID", env("PMI_JOBID")
	return l, nil
}

// pmixLaunch reads PMIx's: a PMIx server sets PMIX_RANK and
// PMIX_NAMESPACE for each client it forks (PMIx_server_setup_fork).
func pmixLaunch(env func(string) string) (*launch, error) {
	l := &launch{name: "PMIx", prefix: "pmix"}
	ok, err := l.read(env, "PMIX_RANK", "PMIX_JOB_SIZE", false)
	if !ok || err != nil {
		return nil, err
	}
	l.jobVars, l.job = "PMIX_NAMESPACE", env("PMIX_NAMESPACE")
	return l, nil
}

// slurmLaunch reads what srun sets for the tasks of a step (srun(1),
// "OUTPUT ENVIRONMENT VARIABLES"; Slurm's env_array_for_step).
func slurmLaunch(env func(string) string) (*launch, error) {
	if env("SLURM_PROCID") == "" {
		return nil, nil
	}
	_, step := first(env, "SLURM_STEP_ID", "SLURM_STEPID")
	if step == "" {
		return nil, fmt.Errorf("%w: SLURM_PROCID is set and SLURM_STEP_ID is not: this is a Slurm batch script or an allocation's shell, not a task srun started; start the tasks with srun", ErrNoLauncher)
	}
	l := &launch{name: "Slurm's srun", prefix: "slurm", rankVar: "SLURM_PROCID", jobVars: "SLURM_JOB_ID"}
	var err error
	if l.rank, err = count(l.rankVar, env(l.rankVar), 0, maxTasks-1); err != nil {
		return nil, err
	}
	var size string
	l.sizeVar, size = first(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
	if size == "" {
		return nil, fmt.Errorf("%w: SLURM_PROCID is set and none of SLURM_STEP_NUM_TASKS, SLURM_NTASKS, SLURM_NPROCS is", errLauncherEnv)
	}
	if l.size, err = count(l.sizeVar, size, 1, maxTasks); err != nil {
		return nil, err
	}
	if err := l.inRange(); err != nil {
		return nil, err
	}
	if _, job := first(env, "SLURM_JOB_ID", "SLURM_JOBID"); job != "" {
		l.job = job + "." + step
	}
	return l, nil
}

// read reads the rank and size variables: ok if either is set, an error
// if one is malformed or out of range, or the size is missing and
// needed.
func (l *launch) read(env func(string) string, rankVar, sizeVar string, needSize bool) (ok bool, err error) {
	l.rankVar, l.sizeVar = rankVar, sizeVar
	rank, size := env(rankVar), env(sizeVar)
	if rank == "" && size == "" {
		return false, nil
	}
	if rank == "" || (size == "" && needSize) {
		set, unset := rankVar, sizeVar
		if rank == "" {
			set, unset = sizeVar, rankVar
		}
		return true, fmt.Errorf("%w: %s sets %s and not %s", errLauncherEnv, l.name, set, unset)
	}
	if l.rank, err = count(rankVar, rank, 0, maxTasks-1); err != nil {
		return true, err
	}
	if size != "" {
		if l.size, err = count(sizeVar, size, 1, maxTasks); err != nil {
			return true, err
		}
	}
	return true, l.inRange()
}

func (l *launch) inRange() error {
	if l.size != 0 && l.rank >= l.size {
		return fmt.Errorf("%w: %s=%d is not below %s=%d", errLauncherEnv, l.rankVar, l.rank, l.sizeVar, l.size)
	}
	return nil
}

// count parses a rank (lo 0) or a size (lo 1): decimal digits alone,
// from lo to hi.
func count(name, v string, lo, hi int) (int, error) {
	if !digits(v) {
		return 0, fmt.Errorf("%w: %s=%q is not a decimal number", errLauncherEnv, name, v)
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%w: %s=%s is not from %d to %d", errLauncherEnv, name, v, lo, hi)
	}
	return n, nil
}

// first returns the first of the variables that is set, and its value.
func first(env func(string) string, names ...string) (string, string) {
	for _, n := range names {
		if v := env(n); v != "" {
			return n, v
		}
	}
	return "", ""
}

// rendezvous returns task 0's address: VFRDMA_AM_ADDR, or under srun
// VFRDMA_AM_PORT on the step's first node; none for a job of one task.
func rendezvous(env func(string) string, l *launch) (string, error) {
	if addr := env(EnvAddr); addr != "" {
		_, port, err := net.SplitHostPort(addr)
		if err == nil {
			err = checkPort(port)
		}
		if err != nil {
			return "", fmt.Errorf("%w: %s=%q is not task 0's host:port: %v", errRendezvous, EnvAddr, addr, err)
		}
		return addr, nil
	}
	if l.size == 1 {
		return "", nil
	}
	port := env(EnvPort)
	if port == "" || l.prefix != "slurm" {
		how := fmt.Sprintf("mpirun -x %s=host:port", EnvAddr)
		if l.prefix == "slurm" {
			how = fmt.Sprintf("%s=host:port srun, or %s=port srun for task 0 on the step's first node", EnvAddr, EnvPort)
		}
		return "", fmt.Errorf("%w: %s is not set: set it to task 0's host:port on every task (%s)", errRendezvous, EnvAddr, how)
	}
	if err := checkPort(port); err != nil {
		return "", fmt.Errorf("%w: %s=%q: %v", errRendezvous, EnvPort, port, err)
	}
	nodes := env("SLURM_STEP_NODELIST")
	host, err := firstHost(nodes)
	if err != nil {
		return "", fmt.Errorf("%w: SLURM_STEP_NODELIST=%q: %v; set %s", errRendezvous, nodes, err, EnvAddr)
	}
	if node := env("SLURMD_NODENAME"); l.rank == 0 && node != "" && node != host {
		return "", fmt.Errorf("%w: task 0 runs on %s, not on the step's first node %s; set %s", errRendezvous, node, host, EnvAddr)
	}
	return net.JoinHostPort(host, port), nil
}

// checkPort accepts a port number from 1 to 65535 (not a service name:
// every task must read it the same).
func checkPort(port string) error {
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 || strings.Trim(port, "0123456789") != "" {
		return fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	return nil
}

// jobToken returns VFRDMA_AM_TOKEN, or else one made from the launcher's
// job id (hashed if it would be longer than a token may be).
func jobToken(env func(string) string, l *launch) (string, error) {
	if tok := env(EnvToken); tok != "" {
		if len(tok) > maxToken {
			return "", fmt.Errorf("%w: %s is %d bytes, at most %d", errNoToken, EnvToken, len(tok), maxToken)
		}
		return tok, nil
	}
	switch {
	case l.job != "":
		tok := l.prefix + ":" + l.job
		if len(tok) > maxToken {
			sum := sha256.Sum256([]byte(l.job))
			tok = l.prefix + ":sha256:" + hex.EncodeToString(sum[:])
		}
		return tok, nil
	case l.size == 1:
		return l.prefix + ":one task", nil // no one to keep out: the exchange goes nowhere
	}
	return "", fmt.Errorf("%w: %s sets no job id (none of %s is set): set %s to a string the same on every task of this job and no other", errNoToken, l.name, l.jobVars, EnvToken)
}

// firstHost returns the first host of a Slurm host list: its first
// entry, each bracketed range replaced by its first number, zero padding
// kept ("node[01-04],gpu7" → "node01"; "r[2-3]n[08,10]" → "r2n08"). A
// list it cannot read for certain (brackets that do not pair, a range of
// anything but digits, '-' and ',', a character no host name has) is an
// error rather than a guess: a wrong host sends every task astray.
func firstHost(list string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(list) && list[i] != ','; {
		switch c := list[i]; {
		case c == '[':
			end := strings.IndexByte(list[i:], ']')
			if end < 0 {
				return "", errors.New("a '[' without its ']'")
			}
			first, err := firstInRange(list[i+1 : i+end])
			if err != nil {
				return "", err
			}
			b.WriteString(first)
			i += end + 1
		case c == '-' || c == '.' || c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
			b.WriteByte(c)
			i++
		default:
			return "", fmt.Errorf("%q in a host name", c)
		}
	}
	if b.Len() == 0 {
		return "", errors.New("no first host")
	}
	return b.String(), nil
}

// firstInRange checks a bracketed range list ("01-04,07") and returns
// its first number.
func firstInRange(r string) (string, error) {
	for _, part := range strings.Split(r, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		if !digits(lo) || (isRange && !digits(hi)) {
			return "", fmt.Errorf("the range [%s] is not numbers and ranges of them", r)
		}
	}
	lo, _, _ := strings.Cut(r, ",")
	lo, _, _ = strings.Cut(lo, "-")
	return lo, nil
}

func digits(s string) bool { return s != "" && strings.Trim(s, "0123456789") == "" }
