package scripts

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// make bench's pieces that run without a VM: its arguments, its results
// folder per run (tables, figures, charts, summary), its estimate and
// progress, with stand-ins for the comparisons (each a VM job of minutes)
// and the real chart tool; and the statistics the comparisons share.

// fakeComparison is a stand-in for scripts/sidebyside.sh or amside.sh:
// it uses their shared benchstat.sh as they do, says its progress, prints
// a table and writes the results file bench.sh asks for (TSV). Its
// arguments are echoed into the table so a test sees what it was given.
const fakeComparison = `#!/usr/bin/env bash
set -uo pipefail
cd "$REPO"
. scripts/benchstat.sh
progress_init FAKE 2
progress "first"
progress "second"
echo "| FAKE table | args: $* | ITERS=${ITERS:-unset} |"
tsv_start FAKE "FAKE $*"
case FAKE in
sidebyside)
  tsv_row rate msg/s 64 reference 1 $'100\n300\n200\n'
  tsv_row rate msg/s 64 "vfrdma, no flags" 32 $'400\n'
  tsv_row lat µs 64 reference "" $'10.5\n12.5\n' ;;
amside)
  tsv_row rt µs 8 "UCX ucp_am" "" $'500\n'
  tsv_row rate msg/s 8 "vfrdma am" "" $'30000\n' ;;
esac
exit 0
`

var (
	chartOnce sync.Once
	chartBin  string
	chartErr  error
)

// benchchart builds internal/tools/benchchart once for the tests.
func benchchart(t *testing.T) string {
	t.Helper()
	chartOnce.Do(func() {
		dir, err := os.MkdirTemp("", "benchchart")
		if err != nil {
			chartErr = err
			return
		}
		chartBin = filepath.Join(dir, "benchchart")
		out, err := exec.Command("go", "build", "-o", chartBin, "../internal/tools/benchchart").CombinedOutput()
		if err != nil {
			chartErr = errors.New(string(out))
		}
	})
	require.NoError(t, chartErr, "building benchchart")
	return chartBin
}

// benchEnv is a bench.sh run's setting: its results root and the
// stand-ins' directory.
type benchEnv struct {
	results, fakes string
	env            []string
}

func newBenchEnv(t *testing.T, amsideExit int) *benchEnv {
	t.Helper()
	top, err := filepath.Abs("..")
	require.NoError(t, err)
	e := &benchEnv{results: filepath.Join(t.TempDir(), "results"), fakes: t.TempDir()}
	for _, name := range []string{"sidebyside", "amside"} {
		script := fakeComparison
		if name == "amside" {
			script = strings.Replace(script, "exit 0", fmt.Sprintf("exit %d", amsideExit), 1)
		}
		script = strings.ReplaceAll(script, "FAKE", name)
		require.NoError(t, os.WriteFile(filepath.Join(e.fakes, name+".sh"), []byte(script), 0o755))
	}
	e.env = append(os.Environ(), "REPO="+top,
		"BENCH_RESULTS="+e.results,
		"BENCH_SIDEBYSIDE="+filepath.Join(e.fakes, "sidebyside.sh"),
		"BENCH_AMSIDE="+filepath.Join(e.fakes, "amside.sh"))
	return e
}

// run runs bench.sh with args; it returns the exit status and what it
// printed (both streams).
func (e *benchEnv) run(t *testing.T, chart string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{"bench.sh"}, args...)...)
	cmd.Env = append(e.env, "BENCH_CHART="+chart)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), string(out)
	}
	require.NoError(t, err)
	return 0, string(out)
}

// runs are the run folders under the results root, oldest first.
func (e *benchEnv) runs(t *testing.T) []string {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join(e.results, "2*"))
	require.NoError(t, err)
	return dirs
}

// bench.sh refuses what it does not take, exit status 2 with its usage,
// before it creates a folder or runs anything; the rounds are taken from
// 1 to 999 (both limits run below) and refused at 0 and 1000.
func TestBenchRefusesBadArgumentsWithItsUsage(t *testing.T) {
	e := newBenchEnv(t, 0)
	for _, args := range [][]string{{"-r", "0"}, {"-r", "1000"}, {"-r", "x"}, {"-r"}, {"--rounds", "-1"}, {"bogus"}, {"--quick"}} {
		code, out := e.run(t, "false", args...)
		assert.Equal(t, 2, code, "%v: %s", args, out)
		assert.Contains(t, out, "Usage: scripts/bench.sh", "%v", args)
		assert.NotContains(t, out, "run 1 of", "%v: nothing ran", args)
	}
	assert.Empty(t, e.runs(t), "no results folder for a refused command line")

	code, out := e.run(t, "false", "-h")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "-r ROUNDS")
}

// A run says its estimate first, then each comparison's progress, and
// leaves in a folder of its own each comparison's tables (NAME.txt), its
// figures (NAME.tsv), its progress (NAME.log), its charts drawn from the
// figures (NAME-*.svg) and summary.md linking them; latest names the
// newest folder. A run's estimate is the pace of the newest run of its
// kind (full or short).
func TestBenchWritesTablesFiguresAndChartsIntoAFolderPerRun(t *testing.T) {
	e := newBenchEnv(t, 0)
	chart := benchchart(t)
	code, out := e.run(t, chart, "-r", "999")
	require.Equal(t, 0, code, out)
	assert.Regexp(t, `bench: sidebyside amside: about \d+ min in all`, out)
	assert.Contains(t, out, "sidebyside: 1000 round(s)", "the side-by-side's rounds: ROUNDS untraced, one traced")
	assert.Contains(t, out, "amside: 999 round(s)")
	assert.Contains(t, out, "pace of a quiet two-core machine", "no run before this one")
	assert.Contains(t, out, "sidebyside: run 1 of 2: first")
	assert.Contains(t, out, "amside: run 2 of 2: second")
	assert.Less(t, strings.Index(out, "about"), strings.Index(out, "run 1 of"), "the estimate comes before the runs")

	runs := e.runs(t)
	require.Len(t, runs, 1)
	dir := runs[0]
	latest, err := os.Readlink(filepath.Join(e.results, "latest"))
	require.NoError(t, err)
	assert.Equal(t, filepath.Base(dir), latest)

	txt, err := os.ReadFile(filepath.Join(dir, "sidebyside.txt"))
	require.NoError(t, err)
	assert.Equal(t, "| sidebyside table | args: 20000 1000 999 | ITERS=unset |\n", string(txt), "the table alone, from the full command")
	log, err := os.ReadFile(filepath.Join(dir, "amside.log"))
	require.NoError(t, err)
	assert.Contains(t, string(log), "amside: run 1 of 2: first")

	tsv, err := os.ReadFile(filepath.Join(dir, "sidebyside.tsv"))
	require.NoError(t, err)
	assert.Contains(t, string(tsv), "# bench: sidebyside\n")
	assert.Contains(t, string(tsv), "# command: sidebyside 20000 1000 999\n")
	assert.Contains(t, string(tsv), "rate\tmsg/s\t64\treference\t1\t200\t100\t300\t3\n", "the median, range and count of three runs")

	for _, svg := range []string{"sidebyside-rate.svg", "sidebyside-latency.svg", "amside-roundtrip.svg", "amside-rate.svg"} {
		b, err := os.ReadFile(filepath.Join(dir, svg))
		if assert.NoError(t, err, svg) {
			assert.Contains(t, string(b), "<svg", svg)
		}
	}
	summary, err := os.ReadFile(filepath.Join(dir, "summary.md"))
	require.NoError(t, err)
	assert.Contains(t, string(summary), "![sidebyside-rate](sidebyside-rate.svg)")
	assert.Contains(t, string(summary), "    | amside table |")

	// The next run, short: its command lines the short variant's, its
	// estimate the quiet machine's (no short run before it: a full run's
	// pace is not a short one's).
	code, out = e.run(t, chart, "--short", "amside")
	require.Equal(t, 0, code, out)
	assert.Contains(t, out, "short variant")
	assert.Contains(t, out, "pace of a quiet two-core machine")
	require.Len(t, e.runs(t), 2)
	latest, err = os.Readlink(filepath.Join(e.results, "latest"))
	require.NoError(t, err)
	assert.NotEqual(t, filepath.Base(dir), latest)
	txt, err = os.ReadFile(filepath.Join(e.results, latest, "amside.txt"))
	require.NoError(t, err)
	assert.Equal(t, "| amside table | args: 1 | ITERS=100 |\n", string(txt))
	_, err = os.Stat(filepath.Join(e.results, latest, "sidebyside.txt"))
	assert.ErrorIs(t, err, os.ErrNotExist, "only the comparison named ran")

	// A full run again: its estimate is the pace of the newest full run,
	// the first.
	code, out = e.run(t, chart, "-r", "1", "amside")
	require.Equal(t, 0, code, out)
	assert.Contains(t, out, "pace of the run in "+dir)
	assert.Len(t, e.runs(t), 3)
}

// A comparison that fails fails the run (exit 1, naming it and its log)
// after the others ran; its charts are not drawn.
func TestAFailedComparisonFailsTheBenchAfterTheOthersRan(t *testing.T) {
	e := newBenchEnv(t, 1)
	code, out := e.run(t, benchchart(t), "-r", "1")
	assert.Equal(t, 1, code, out)
	assert.Regexp(t, regexp.MustCompile(`=== amside: FAILED \(1\) .*amside\.log`), out)
	assert.Contains(t, out, "bench: failed: amside")
	dir := e.runs(t)[0]
	_, err := os.Stat(filepath.Join(dir, "sidebyside-rate.svg"))
	assert.NoError(t, err, "the side-by-side's charts")
	_, err = os.Stat(filepath.Join(dir, "amside-rate.svg"))
	assert.ErrorIs(t, err, os.ErrNotExist, "no charts of a failed comparison")
}

// The results root keeps the last 30 runs, as make test keeps its logs:
// at 30 (29 before and the new one) all stay; at 31 the oldest goes.
func TestBenchKeepsTheLast30Runs(t *testing.T) {
	e := newBenchEnv(t, 0)
	for i := 1; i <= 29; i++ {
		require.NoError(t, os.MkdirAll(filepath.Join(e.results, fmt.Sprintf("20000101-%06d-1", i)), 0o755))
	}
	code, out := e.run(t, "true", "-r", "1", "amside")
	require.Equal(t, 0, code, out)
	runs := e.runs(t)
	assert.Len(t, runs, 30)
	assert.Contains(t, runs, filepath.Join(e.results, "20000101-000001-1"), "30 runs: the oldest stays")

	code, out = e.run(t, "true", "-r", "1", "amside")
	require.Equal(t, 0, code, out)
	runs = e.runs(t)
	assert.Len(t, runs, 30)
	assert.NotContains(t, runs, filepath.Join(e.results, "20000101-000001-1"), "31 runs: the oldest went")
	assert.Contains(t, runs, filepath.Join(e.results, "20000101-000002-1"))
}

// benchstat.sh's results rows: the median of an odd and an even number of
// runs, the range, the count, "-" for the range of one run, nothing for
// none or without TSV.
func TestTheResultsRowsHoldMedianRangeAndCount(t *testing.T) {
	tsv := filepath.Join(t.TempDir(), "r.tsv")
	cmd := exec.Command("bash", "-c", `set -euo pipefail; . scripts/benchstat.sh
tsv_row rate msg/s 64 none 1 $'1\n' # no TSV yet: nothing
tsv_start sidebyside "scripts/sidebyside.sh 1 2 3"
tsv_row rate msg/s 64 "vfrdma, no flags" 32 $'30\n10\n20\n'
tsv_row lat µs 4096 reference "" $'1.5\n2.5\n'
tsv_row db doorbells/msg 64 reference 1 $'2.58\n'
tsv_row rate msg/s 64 reference 1 ""
TSV= tsv_row rate msg/s 64 nothing 1 $'1\n'`)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "TSV="+tsv)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	b, err := os.ReadFile(tsv)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	require.Len(t, lines, 8, string(b))
	assert.Equal(t, "# bench: sidebyside", lines[0])
	assert.Regexp(t, `^# date: \d{4}-\d\d-\d\d \d\d:\d\d UTC$`, lines[1])
	assert.Regexp(t, `^# commit: [0-9a-f]{7,}( with uncommitted changes)?$`, lines[2])
	assert.Equal(t, "# command: scripts/sidebyside.sh 1 2 3", lines[3])
	assert.Equal(t, "figure\tunit\tsize\tstack\tbatch\tmedian\tmin\tmax\truns", lines[4])
	assert.Equal(t, "rate\tmsg/s\t64\tvfrdma, no flags\t32\t20\t10\t30\t3", lines[5])
	assert.Equal(t, "lat\tµs\t4096\treference\t\t2.00\t1.5\t2.5\t2", lines[6])
	assert.Equal(t, "db\tdoorbells/msg\t64\treference\t1\t2.58\t-\t-\t1", lines[7])
}

// make demo is the driver's own job, a few minutes: it runs no
// comparison (make bench's), and its closing words say where they are.
func TestTheDemoRunsNoComparisonAndSaysWhereTheyAre(t *testing.T) {
	b, err := os.ReadFile("demo.sh")
	require.NoError(t, err)
	demo := string(b)
	for _, c := range []string{"sidebyside.sh", "amside.sh", "bench.sh", "-ref"} {
		for _, line := range strings.Split(demo, "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue
			}
			assert.NotContains(t, line, c, "make demo runs a comparison")
		}
	}
	closing := demo[strings.LastIndex(demo, "<<'TXT'"):]
	assert.Contains(t, closing, "`make bench`")
	assert.Contains(t, closing, "docs/benchmarks.md")
	assert.Contains(t, closing, "build/bench-results/")

	mk, err := os.ReadFile("../Makefile")
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^bench: setup softverbs\n\t@bash scripts/bench\.sh \$\(BENCH_ARGS\)$`, string(mk), "make bench sets up first, as make demo does, and passes BENCH_ARGS")
	assert.Regexp(t, `(?m)^demo: setup softverbs\n\t@bash scripts/demo\.sh`, string(mk))
}
