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

const sampleFaults = `A note about the sample, ignored.

## max-takes-the-smaller
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

## max-ties-go-to-b
file: m.go
why it was chosen: ties are never tried
<<<<
a > b
====
a >= b
>>>>
`

// A faults file is read block by block, whole lines kept, notes ignored.
func TestParseFaultsReadsEachBlock(t *testing.T) {
	fs, err := parseFaults(strings.NewReader(sampleFaults), "f.txt")
	require.NoError(t, err)
	require.Len(t, fs, 2)
	assert.Equal(t, Fault{Name: "max-takes-the-smaller", File: "m.go", Old: "\tif a > b {\n\t\treturn a\n\t}", New: "\tif a > b {\n\t\treturn b\n\t}", Line: 3}, fs[0])
	assert.Equal(t, Fault{Name: "max-ties-go-to-b", File: "m.go", Old: "a > b", New: "a >= b", Line: 15}, fs[1])
}

// A malformed faults file is refused with where and why, never half read.
func TestParseFaultsRefusesAMalformedFile(t *testing.T) {
	for _, tc := range []struct{ text, want string }{
		{"", "no faults"},
		{"## a\n<<<<\nx\n====\ny\n>>>>\n", "outside a fault"},
		{"## a\nfile: m.go\n<<<<\nx\n>>>>\n", "before"},
		{"## a\nfile: m.go\n<<<<\nx\n====\ny\n", "not closed"},
		{"## a\nfile: m.go\n<<<<\n====\ny\n>>>>\n", "replaces nothing"},
		{"## a\nfile: m.go\n<<<<\nx\n====\nx\n>>>>\n", "changes nothing"},
		{"## a\nfile: m.go\n<<<<\nx\n====\ny\n>>>>\n## a\nfile: m.go\n<<<<\nz\n====\ny\n>>>>\n", "named twice"},
		{"## a\nfile: m.go\n## b\n", "no \"<<<<\" block"},
	} {
		_, err := parseFaults(strings.NewReader(tc.text), "f.txt")
		require.Error(t, err, tc.text)
		assert.Contains(t, err.Error(), tc.want, tc.text)
	}
}

// A fault's text must name one place in its file.
func TestAFaultMustMatchOnePlace(t *testing.T) {
	src := []byte("package m\n\nfunc f() int { return 1 + 1 }\n")
	m, err := Fault{Name: "x", Old: "return 1", New: "return 2"}.mutant("m.go", src)
	require.NoError(t, err)
	assert.Equal(t, 3, m.Line)
	assert.Equal(t, 16, m.Col)
	assert.Equal(t, "package m\n\nfunc f() int { return 2 + 1 }\n", string(m.Apply(src)))
	_, err = Fault{Name: "x", Old: "1", New: "2"}.mutant("m.go", src)
	assert.ErrorContains(t, err, "more than once")
	_, err = Fault{Name: "x", Old: "return 3", New: "return 2"}.mutant("m.go", src)
	assert.ErrorContains(t, err, "not in m.go")
}

// -faults runs each hand-written fault against the tests and scores them
// like mutants, naming each in the report.
func TestFaultsRunEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go test on a temporary module")
	}
	dir := writeModule(t, moduleCode, moduleTest)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "faults.txt"), []byte(sampleFaults), 0o644))
	var out bytes.Buffer
	sum, err := run(context.Background(), Config{Dir: dir, Faults: "faults.txt", Jobs: 2, Timeout: time.Minute}, &out)
	require.NoError(t, err, out.String())
	report := out.String()
	assert.Contains(t, report, "caught     m.go:5:1  max-takes-the-smaller: if a > b { return a } → if a > b { return b }  (m: TestMax failed)\n")
	assert.Contains(t, report, "SURVIVED   m.go:5:5  max-ties-go-to-b: a > b → a >= b\n")
	assert.Equal(t, []FileCounts{{File: "m.go", Counts: Counts{Caught: 1, Survived: 1}}}, sum.Files)

	_, err = run(context.Background(), Config{Dir: dir, Faults: "faults.txt", Files: []string{"m.go"}, Jobs: 1, Timeout: time.Minute}, &out)
	assert.ErrorContains(t, err, "give no files")
}
