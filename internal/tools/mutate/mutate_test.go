package main

import (
	"bytes"
	"context"
	"encoding/json"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// describe renders mutants as "op before → after", for comparisons.
func describe(ms []Mutant) []string {
	out := []string{}
	for _, m := range ms {
		out = append(out, string(m.Op)+" "+m.Change())
	}
	return out
}

func TestOperators(t *testing.T) {
	// Generate only parses, so the bodies need not type-check: err, T's
	// methods and fmt are never declared.
	const prelude = "package p\n\nvar g int\n\nfunc f(a, b int, ok bool, s string, t *T) (int, error) {\n\t"
	cases := []struct {
		name, body string
		want       []string
	}{
		{"less", "_ = a < b", []string{"comparison < → <="}},
		{"less or equal", "_ = a <= b", []string{"comparison <= → <"}},
		{"greater", "_ = a > b", []string{"comparison > → >="}},
		{"greater or equal", "_ = a >= b", []string{"comparison >= → >"}},
		{"equal", "_ = a == b", []string{"comparison == → !="}},
		{"not equal", "_ = a != b", []string{"comparison != → =="}},
		{"and", "_ = ok && a == b", []string{"logical && → ||", "comparison == → !="}},
		{"or", "_ = ok || ok", []string{"logical || → &&"}},
		{"negate if", "if ok {\n\t}", []string{"negate-if ok → !(ok)"}},
		{"negate compound if", "if ok && a < b {\n\t}", []string{
			"negate-if ok && a < b → !(ok && a < b)", "logical && → ||", "comparison < → <=",
		}},
		{"no negation of an equality", "if a == b {\n\t}", []string{"comparison == → !="}},
		{"plus and minus", "_ = a + b - 1", []string{"arithmetic + → -", "arithmetic - → +"}},
		{"string literal plus", `_ = "x" + s + s`, []string{}},
		{"plus string literal", `_ = s + "x"`, []string{}},
		{"local add-assign", "a += 2", []string{"arithmetic += → -="}},
		{"local sub-assign", "a -= b", []string{"arithmetic -= → +="}},
		{"string add-assign", `s += "x"`, []string{}},
		{"local increment", "a++", []string{"arithmetic ++ → --"}},
		{"local decrement", "a--", []string{"arithmetic -- → ++"}},
		{"local assignment", "a = b", []string{}},
		{"field store", "t.x = a", []string{"remove t.x = a → _ = a"}},
		{"element store", "t.s[0] = a", []string{"remove t.s[0] = a → _ = a", "int 0 → 1"}},
		{"pointee store", "*t = T{}", []string{"remove *t = T{} → _ = T{}"}},
		{"field sub-assign", "t.x -= 2", []string{"remove t.x -= 2 → _ = 2", "arithmetic -= → +="}},
		{"package variable store", "g = 3", []string{"remove g = 3 → _ = 3"}},
		{"package variable increment", "g++", []string{"remove g++ → (removed)", "arithmetic ++ → --"}},
		{"shadowed package variable", "g := 1\n\tg = 2\n\t_ = g", []string{}},
		{"multiple stores", "t.x, _ = a, b", []string{"remove t.x, _ = a, b → _, _ = a, b"}},
		{"store and local", "t.x, a = a, b", []string{}},
		{"call statement", "t.do(a)", []string{"remove t.do(a) → (removed)"}},
		{"error return", "if err := t.do(); err != nil {\n\t\treturn 0, err\n\t}", []string{
			"err-return err != nil → false", "comparison != → ==",
		}},
		{"wrapped error return", "if err != nil {\n\t\treturn 0, fmt.Errorf(\"f: %w\", err)\n\t}", []string{
			"err-return err != nil → false", "comparison != → ==",
		}},
		{"error dropped", "if err != nil {\n\t\treturn 0, nil\n\t}", []string{"comparison != → =="}},
		{"error returned by a closure", "if err != nil {\n\t\tgo func() error { return err }()\n\t}", []string{
			"comparison != → ==",
		}},
		{"true", "ok = true", []string{"bool true → false"}},
		{"false", "return 0, nil\n\t_ = false", []string{"bool false → true"}},
		{"literal in comparison", "_ = a < 10", []string{"comparison < → <=", "int 10 → 11"}},
		{"hex literal in comparison", "_ = 0x10 == a", []string{"int 0x10 → 0x11", "comparison == → !="}},
		{"literal in arithmetic", "_ = a + 10", []string{"arithmetic + → -"}},
		{"slice bounds", "_ = s[1:0x10]", []string{"int 1 → 2", "int 0x10 → 0x11"}},
		{"index", "_ = s[3]", []string{"int 3 → 4"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := prelude + tc.body + "\n}\n"
			ms, err := Generate("p.go", []byte(src), nil)
			require.NoError(t, err)
			assert.Equal(t, tc.want, describe(ms))
		})
	}
}

func TestOperatorsOutsideFunctionBodies(t *testing.T) {
	src := `package p

import "fmt"

var size = base + 1

type T struct{ x int }

// String only formats: its faults are not worth a test.
func (t T) String() string {
	if t.x > 0 {
		return fmt.Sprint(t.x + 1)
	}
	return ""
}

// Error is a plain function here, not a method: it is mutated.
func Error() bool { return true }
`
	ms, err := Generate("p.go", []byte(src), nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"arithmetic + → -", "bool true → false"}, describe(ms))
}

func TestStoresToPackageVariablesOfOtherFiles(t *testing.T) {
	src := "package p\n\nfunc f() {\n\th = 1\n\tk = 2\n}\n"
	ms, err := Generate("p.go", []byte(src), map[string]bool{"h": true})
	require.NoError(t, err)
	assert.Equal(t, []string{"remove h = 1 → _ = 1"}, describe(ms))
}

func TestPackageVars(t *testing.T) {
	dir := t.TempDir()
	write := func(name, src string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644))
	}
	write("a.go", "package p\n\nvar A, B int\n\nconst C = 1\n")
	write("b.go", "package p\n\nvar (\n\tD = 1\n)\n")
	write("a_test.go", "package p\n\nvar T int\n")
	write("other.go", "package q\n\nvar Q int\n")
	write("broken.go", "package p\n\nvar")
	vars, err := packageVars(dir, "p", filepath.Join(dir, "b.go"))
	require.NoError(t, err)
	assert.Equal(t, map[string]bool{"A": true, "B": true}, vars)
}

// A file with comments, odd spacing, tabs, multi-line statements and
// non-ASCII text: planting a mutant must change its bytes Start:End and
// nothing else.
const sample = `// Package p is a sample.
package p

import "errors"

var hits int // package-level: a store worth removing

type ring struct {
	head, tail  int
	buf         []byte
	name        string // «ring»
}

func (r *ring) push(b byte) error {
	if r.tail-r.head >= len(r.buf) {
		return errors.New("full")
	}
	r.buf[r.tail%len(r.buf)] = b
	r.tail++
	hits   +=   1
	if err := r.check(
		true,
	); err != nil {
		return err
	}
	return nil
}

func (r *ring) check(strict bool) error {
	for i := 0; i < len(r.buf) && strict; i++ {
		_ = r.buf[0:i]
	}
	r.name = "ring " + r.name
	return nil
}
`

func TestApplyKeepsTheRestOfTheFile(t *testing.T) {
	src := []byte(sample)
	ms, err := Generate("p.go", src, nil)
	require.NoError(t, err)
	require.NotEmpty(t, ms)
	ops := make(map[Op]bool)
	for _, m := range ms {
		ops[m.Op] = true
		out := m.Apply(src)
		require.Equal(t, m.Before, string(src[m.Start:m.End]), m.Pos())
		require.Equal(t, string(src[:m.Start]), string(out[:m.Start]), m.Pos())
		require.Equal(t, m.After, string(out[m.Start:m.Start+len(m.After)]), m.Pos())
		require.Equal(t, string(src[m.End:]), string(out[m.Start+len(m.After):]), m.Pos())

		// Line and column point at Start.
		line := 1 + bytes.Count(src[:m.Start], []byte("\n"))
		col := m.Start - bytes.LastIndexByte(src[:m.Start], '\n')
		require.Equal(t, line, m.Line, m.Pos())
		require.Equal(t, col, m.Col, m.Pos())

		// Every mutant is still valid Go syntax.
		_, err := parser.ParseFile(token.NewFileSet(), "p.go", out, parser.SkipObjectResolution)
		require.NoError(t, err, "%s %s", m.Pos(), m.Change())
	}
	for _, op := range []Op{OpComparison, OpLogical, OpNegateIf, OpArithmetic, OpRemove, OpErrReturn, OpBool, OpInt} {
		assert.True(t, ops[op], "the sample has no %s mutant", op)
	}
}

func TestSelectMutants(t *testing.T) {
	var ms []Mutant
	for i := range 20 {
		ms = append(ms, Mutant{File: "a.go", Line: 1 + i/2, Start: i, End: i + 1, Equivalent: i == 7})
	}

	assert.Equal(t, ms, selectMutants(ms, 0, 0, 1), "no -n, no -only: everything")
	assert.Equal(t, ms, selectMutants(ms, 0, 50, 1), "a sample larger than the file")
	assert.Equal(t, ms[6:8], selectMutants(ms, 4, 0, 1), "-only keeps one line")
	assert.Empty(t, selectMutants(ms, 99, 0, 1))

	a := selectMutants(ms, 0, 5, 1)
	runnable := 0
	for i, m := range a {
		if i > 0 {
			assert.Less(t, a[i-1].Start, m.Start, "a sample stays in source order")
		}
		if !m.Equivalent {
			runnable++
		}
	}
	assert.Equal(t, 5, runnable)
	assert.Contains(t, a, ms[7], "the equivalent is kept")
	assert.Equal(t, a, selectMutants(ms, 0, 5, 1), "the same seed, the same sample")
	differs := false
	for seed := uint64(2); seed < 10 && !differs; seed++ {
		differs = !assert.ObjectsAreEqual(a, selectMutants(ms, 0, 5, seed))
	}
	assert.True(t, differs, "other seeds draw other samples")
}

func TestParseLineRef(t *testing.T) {
	ref, err := parseLineRef("am/send.go:88")
	require.NoError(t, err)
	assert.Equal(t, lineRef{file: "am/send.go", line: 88}, ref)
	for _, bad := range []string{"am/send.go", "am/send.go:", "am/send.go:x", "am/send.go:0", ":3"} {
		_, err := parseLineRef(bad)
		assert.Error(t, err, bad)
	}
}

func TestParseFlags(t *testing.T) {
	cfg, min, err := parseFlags([]string{"-j", "2", "-n", "10", "-seed", "7", "-pkgs", "./a, ./b,", "-min", "80", "x.go", "y.go"}, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, Config{
		Files: []string{"x.go", "y.go"}, Pkgs: []string{"./a", "./b"},
		Timeout: 10 * time.Minute, Jobs: 2, N: 10, Seed: 7,
	}, cfg)
	assert.Equal(t, 80.0, min)

	cfg, _, err = parseFlags([]string{"-equivalents", "eq.txt", "x.go"}, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, "eq.txt", cfg.Marks)

	cfg, _, err = parseFlags([]string{"-only", "x.go:3"}, &bytes.Buffer{})
	require.NoError(t, err, "-only alone names the file")
	assert.Equal(t, "x.go:3", cfg.Only)

	_, _, err = parseFlags(nil, &bytes.Buffer{})
	assert.Error(t, err)
}

func TestOverlayJSON(t *testing.T) {
	dir := t.TempDir()
	orig := "/work/repo/doorbell/doorbell.go"
	path, err := writeOverlay(dir, orig, []byte("package doorbell\n"))
	require.NoError(t, err)

	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var overlay map[string]map[string]string
	require.NoError(t, json.Unmarshal(data, &overlay), "%s", data)
	require.Len(t, overlay, 1)
	require.Len(t, overlay["Replace"], 1)
	replacement := overlay["Replace"][orig]
	require.True(t, filepath.IsAbs(replacement), replacement)
	assert.Equal(t, dir, filepath.Dir(replacement))
	content, err := os.ReadFile(replacement)
	require.NoError(t, err)
	assert.Equal(t, "package doorbell\n", string(content))
}

func TestClassify(t *testing.T) {
	cases := []struct {
		name   string
		run    testRun
		status Status
		detail string
	}{
		{"passed", testRun{passed: true, output: "ok  \texample.com/m\t0.01s\n"}, Survived, ""},
		{"test failed", testRun{output: "--- FAIL: TestMax (0.00s)\n    m_test.go:7: Max(2, 1) = 1\nFAIL\nFAIL\texample.com/m\t0.002s\nFAIL\n"},
			Caught, "m: TestMax failed"},
		{"second package failed", testRun{output: "ok  \texample.com/a\t0.1s\n--- FAIL: TestB (0.00s)\n    --- FAIL: TestB/sub (0.00s)\nFAIL\nFAIL\texample.com/b\t0.2s\nFAIL\n"},
			Caught, "b: TestB failed"},
		{"panic", testRun{output: "--- FAIL: TestPush (0.00s)\npanic: runtime error: index out of range [3] with length 3 [recovered]\n\ngoroutine 7 [running]:\nFAIL\texample.com/m/event\t0.01s\nFAIL\n"},
			Caught, "event: TestPush panicked"},
		{"timeout", testRun{output: "panic: test timed out after 1s\n\trunning tests:\n\t\tTestSlow (1s)\n\ngoroutine 1 [running]:\nFAIL\texample.com/m\t1.012s\nFAIL\n"},
			Caught, "m: TestSlow timed out"},
		{"deadlock", testRun{output: "fatal error: all goroutines are asleep - deadlock!\n\ngoroutine 1 [chan receive]:\nFAIL\texample.com/m\t0.005s\nFAIL\n"},
			Caught, "m: test binary failed"},
		{"build failed", testRun{output: "# example.com/m [example.com/m.test]\n./m.go:5:2: declared and not used: x\nFAIL\texample.com/m [build failed]\nFAIL\texample.com/n [build failed]\nFAIL\n"},
			NotBuilt, "./m.go:5:2: declared and not used: x"},
		{"setup failed", testRun{output: "# example.com/m\nm.go:3:1: syntax error: non-declaration statement outside function body\nFAIL\texample.com/m [setup failed]\nFAIL\n"},
			NotBuilt, "m.go:3:1: syntax error: non-declaration statement outside function body"},
		{"unexplained", testRun{output: "\ngo: something odd\n"}, NotBuilt, "go: something odd"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, detail := classify(tc.run)
			assert.Equal(t, tc.status, status)
			assert.Equal(t, tc.detail, detail)
		})
	}
}

func TestRenameCopy(t *testing.T) {
	out := "# example.com/m\n../../tmp/mutate-1/m-2/s.go:7:37: invalid operation\nFAIL\texample.com/m [build failed]\n"
	assert.Equal(t, "# example.com/m\nsub/s.go:7:37: invalid operation\nFAIL\texample.com/m [build failed]\n",
		renameCopy(out, "/tmp/mutate-1/m-2", "/repo/sub/s.go", "sub/s.go"))
}

func TestReportLine(t *testing.T) {
	m := Mutant{File: "event/signal.go", Line: 88, Col: 12, Before: "<", After: "<="}
	assert.Equal(t, "caught     event/signal.go:88:12  < → <=  (event: TestX failed)", reportLine(Caught, m, "event: TestX failed"))
	assert.Equal(t, "SURVIVED   event/signal.go:88:12  < → <=", reportLine(Survived, m, ""))
	long := Mutant{File: "a.go", Line: 1, Col: 1, Before: "c.x = f(\n\t\ta,\n\t\tb)", After: ""}
	assert.Equal(t, "a.go:1:1  c.x = f( a, b) → (removed)", long.Pos()+"  "+long.Change())
}

// writeModule writes a one-package module with a test into a temporary
// directory and returns the directory.
func writeModule(t *testing.T, code, test string) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"go.mod":     "module example.com/m\n\ngo 1.22\n",
		"m.go":       code,
		"m_test.go":  test,
		defaultMarks: moduleMarks,
	}
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	}
	return dir
}

const moduleCode = `package m

// Max returns the larger of a and b.
func Max(a, b int) int {
	if a > b {
		return a
	}
	return b
}

// Zero is never called.
func Zero() bool { return false }
`

// moduleMarks is the module's equivalents file: Zero's mutant.
const moduleMarks = `# Zero's one mutant.
file:   m.go
func:   Zero
code:   return false
change: false → true
why:    nothing calls it
`

const moduleTest = `package m

import "testing"

func TestMax(t *testing.T) {
	if got := Max(2, 1); got != 2 {
		t.Fatalf("Max(2, 1) = %d", got)
	}
	if got := Max(1, 2); got != 2 {
		t.Fatalf("Max(1, 2) = %d", got)
	}
}
`

// A run judges each mutant of a file by the tests (caught, survived,
// equivalent as marked), scores them, and leaves the file as it was; -list
// runs nothing and -only keeps one line.
func TestARunJudgesEveryMutantAndLeavesTheFileAsItWas(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go test on a temporary module")
	}
	dir := writeModule(t, moduleCode, moduleTest)
	var out bytes.Buffer
	sum, err := run(context.Background(), Config{Dir: dir, Files: []string{"m.go"}, Jobs: 2, Timeout: time.Minute}, &out)
	require.NoError(t, err, out.String())
	report := out.String()
	t.Log(report)

	// a > b → a >= b returns the same value when a == b: it survives.
	// !(a > b) returns the smaller one: TestMax catches it.
	assert.Contains(t, report, "SURVIVED   m.go:5:7  > → >=\n")
	assert.Contains(t, report, "caught     m.go:5:5  a > b → !(a > b)  (m: TestMax failed)\n")
	assert.Contains(t, report, "equivalent m.go:12:27  false → true\n")
	assert.Equal(t, []FileCounts{{File: "m.go", Counts: Counts{Caught: 1, Survived: 1, Equivalent: 1}}}, sum.Files)
	score, ok := sum.Total.Score()
	require.True(t, ok)
	assert.Equal(t, 50.0, score)
	assert.Regexp(t, `(?m)^total\s+2\s+1\s+1\s+0\s+1\s+50\.0%`, report)

	// The working tree is untouched.
	code, err := os.ReadFile(filepath.Join(dir, "m.go"))
	require.NoError(t, err)
	assert.Equal(t, moduleCode, string(code))

	// -list runs nothing; -only keeps one line.
	out.Reset()
	_, err = run(context.Background(), Config{Dir: dir, Only: "m.go:5", List: true, Jobs: 1, Timeout: time.Minute}, &out)
	require.NoError(t, err)
	assert.Equal(t, "m.go:5:5  negate-if   a > b → !(a > b)\nm.go:5:7  comparison  > → >=\n2 mutants, 0 of them documented equivalent\n", out.String())
}

func TestBaselineMustPass(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go test on a temporary module")
	}
	failing := strings.Replace(moduleTest, "got != 2", "got != 3", 1)
	dir := writeModule(t, moduleCode, failing)
	var out bytes.Buffer
	_, err := run(context.Background(), Config{Dir: dir, Files: []string{"m.go"}, Jobs: 1, Timeout: time.Minute}, &out)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the tests fail without any mutant")
	assert.Contains(t, err.Error(), "Max(2, 1) = 2")
	assert.NotContains(t, out.String(), "caught")
}

func TestRejectsBadFiles(t *testing.T) {
	dir := writeModule(t, moduleCode, moduleTest)
	for _, name := range []string{"m_test.go", "go.mod", "../elsewhere.go"} {
		_, err := run(context.Background(), Config{Dir: dir, Files: []string{name}, Jobs: 1, Timeout: time.Minute, List: true}, &bytes.Buffer{})
		assert.Error(t, err, name)
	}
}
