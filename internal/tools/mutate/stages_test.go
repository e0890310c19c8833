package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// userCode imports the module's package m; its test adds a line to the
// file "runs" each time it runs and checks what m's own test does not: Max of two negatives.
const (
	userCode = `package user

import "example.com/m"

// Larger is m.Max.
func Larger(a, b int) int { return m.Max(a, b) }
`
	userTest = `package user

import (
	"os"
	"testing"
)

func TestLarger(t *testing.T) {
	f, err := os.OpenFile("runs", os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("run\n")
	f.Close()
	if got := Larger(-1, -2); got != -1 {
		t.Fatalf("Larger(-1, -2) = %d", got)
	}
}
`
	ownCatches = `## own-test-catches
file: m.go
<<<<
	if a > b {
		return a
	}
====
	if a > b {
		return b
	}
>>>>
`
	onlyImporterCatches = `## only-the-importer-catches
file: m.go
<<<<
	if a > b {
====
	if a > b && a > 0 {
>>>>
`
)

// A mutant the file's own package catches is judged without running its
// importers' tests; one the own tests miss still meets the importers'.
func TestTheImportersTestsRunOnlyWhenTheOwnPackagesPass(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go test on a temporary module")
	}
	dir := writeModule(t, moduleCode, moduleTest)
	require.NoError(t, os.Mkdir(filepath.Join(dir, "user"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "user", "user.go"), []byte(userCode), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "user", "user_test.go"), []byte(userTest), 0o644))
	runs := filepath.Join(dir, "user", "runs")
	// try runs the faults and returns the report and how often the
	// importer's tests ran for the mutant (the baseline runs them once).
	try := func(name, faults string) (string, int) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(faults), 0o644))
		require.NoError(t, os.RemoveAll(runs))
		var out bytes.Buffer
		_, err := run(context.Background(), Config{Dir: dir, Faults: name, Jobs: 1, Timeout: time.Minute}, &out)
		require.NoError(t, err, out.String())
		data, err := os.ReadFile(runs)
		require.NoError(t, err, "the baseline runs every package's tests")
		return out.String(), strings.Count(string(data), "\n") - 1
	}

	report, n := try("own.txt", ownCatches)
	assert.Contains(t, report, "(m: TestMax failed)")
	assert.Zero(t, n, "the importer's tests ran although m's own had caught the mutant")

	report, n = try("importer.txt", onlyImporterCatches)
	assert.Contains(t, report, "(user: TestLarger failed)")
	assert.Equal(t, 1, n)
}
