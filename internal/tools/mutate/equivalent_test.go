package main

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// marksSrc has a line with several mutants, the same code in two
// functions, and a method on a pointer and on a value.
const marksSrc = `package p

type T struct{ n int }

func (t *T) f(a, b int) bool {
	if a <= b {
		return false
	}
	return true
}

func (t T) g(a, b int) bool {
	if a <= b {
		return false
	}
	return true
}
`

// equivalents returns the positions and changes of the mutants marked
// equivalent.
func equivalents(ms []Mutant) []string {
	out := []string{}
	for _, m := range ms {
		if m.Equivalent {
			out = append(out, m.Pos()+" "+m.Change())
		}
	}
	return out
}

func TestMutantsNameTheirDeclaration(t *testing.T) {
	src := "package p\n\nvar size = 1 + 2\n\ntype L[K any] struct{ n int }\n\nfunc (l *L[K]) f() { l.n++ }\n\nfunc (l L[K]) g() int { return l.n + 1 }\n\nfunc h() { _ = true }\n"
	ms, err := Generate("p.go", []byte(src), nil)
	require.NoError(t, err)
	funcs := []string{}
	for _, m := range ms {
		funcs = append(funcs, m.Func)
	}
	assert.Equal(t, []string{"var size", "(*L).f", "(*L).f", "L.g", "h"}, funcs)
}

// A mark makes the mutant it names equivalent and no other: not the other
// mutants of its line, not the same change in another function, not one
// of another package; and a mark whose code spans lines names the mutant
// that starts inside it.
func TestAMarkMakesTheMutantItNamesEquivalentAndNoOther(t *testing.T) {
	ms, err := Generate("sub/p.go", []byte(marksSrc), nil)
	require.NoError(t, err)
	marks := []Mark{
		{File: "sub/p.go", Func: "(*T).f", Code: "if a <= b {", Change: "<= → <"},
		{File: "sub/p.go", Func: "T.g", Code: "return false\n}\nreturn true", Change: "true → false"},
		{File: "other/p.go", Func: "T.g", Code: "if a <= b {", Change: "<= → <"},
	}
	markEquivalents(ms, []byte(marksSrc), marks)
	assert.Equal(t, []string{"sub/p.go:6:7 <= → <", "sub/p.go:16:9 true → false"}, equivalents(ms))

	// Spaces and line breaks aside: the code's words in order.
	ms, err = Generate("sub/p.go", []byte(marksSrc), nil)
	require.NoError(t, err)
	markEquivalents(ms, []byte(marksSrc), []Mark{{File: "sub/p.go", Func: "T.g", Code: "a   <=\n b", Change: "<=   →  <"}})
	assert.Equal(t, []string{"sub/p.go:13:7 <= → <"}, equivalents(ms))
}

// writeTree writes files (path → content) under a new directory and
// returns it.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	}
	return dir
}

// A mark that names no mutant of its package (its code changed) is
// reported stale; one that names several, ambiguous; one whose mutant
// moved to another file of its package still marks it and is reported
// for its file name. A good mark is not reported.
func TestCheckMarksReportsStaleAmbiguousAndMisfiledMarks(t *testing.T) {
	root := writeTree(t, map[string]string{
		"sub/p.go":      marksSrc,
		"sub/q.go":      "package p\n\nfunc moved(x int) bool { return x > 0 }\n",
		"sub/p_test.go": "package p\n\nfunc inTest(x int) bool { return x > 0 }\n",
	})
	good := Mark{File: "sub/p.go", Func: "(*T).f", Code: "if a <= b {", Change: "<= → <", Line: 1}
	stale := Mark{File: "sub/p.go", Func: "(*T).f", Code: "if a < b {", Change: "< → <=", Line: 2}
	misfiled := Mark{File: "sub/p.go", Func: "moved", Code: "x > 0", Change: "> → >=", Line: 3}
	inTest := Mark{File: "sub/p_test.go", Func: "inTest", Code: "x > 0", Change: "> → >=", Line: 4}
	problems, err := checkMarks(root, []Mark{good, stale, misfiled, inTest}, nil)
	require.NoError(t, err)
	require.Len(t, problems, 3, "%q", problems)
	assert.Equal(t, `2: stale: no mutant of sub is sub/p.go (*T).f "if a < b {" < → <= (the code changed? update the mark or delete it)`, problems[0])
	assert.Equal(t, `3: sub/p.go moved "x > 0" > → >= is in sub/q.go, not sub/p.go: update the file`, problems[1])
	assert.Contains(t, problems[2], "4: stale", "test files are not mutated")

	ms, src, err := generateFile(root, "sub/q.go")
	require.NoError(t, err)
	markEquivalents(ms, src, []Mark{misfiled})
	assert.Equal(t, []string{"sub/q.go:3:35 > → >="}, equivalents(ms), "a mark holds when its code moves to another file of its package")

	root = writeTree(t, map[string]string{"sub/p.go": "package p\n\nfunc f(a, b int) bool { return a <= b || b <= a }\n"})
	twice := Mark{File: "sub/p.go", Func: "f", Code: "a <= b || b <= a", Change: "<= → <", Line: 5}
	problems, err = checkMarks(root, []Mark{twice}, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{`5: ambiguous: sub/p.go f "a <= b || b <= a" <= → < names 2 mutants (sub/p.go:3:34, sub/p.go:3:44): give more of the code`}, problems)

	// Only the packages asked for are checked.
	problems, err = checkMarks(root, []Mark{twice}, map[string]bool{"other": true})
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// The equivalents file's form: blocks of "key: value" lines apart by blank
// lines, values going on over indented lines, # notes; a block without
// one of the five keys, an unknown or repeated key, an indented line
// outside a block or a block given twice is refused with its line.
func TestParseMarksReadsBlocksAndRefusesMalformedOnes(t *testing.T) {
	const good = `# notes
file:   a/b.go
func:   (*T).f
code:   if x <= n {
change: <=  →  <
why:    x never equals n
        here

# another
file: a/c.go
func: g
code: n++
change: ++ → --
why: n is never read
`
	marks, err := parseMarks(strings.NewReader(good), "eq.txt")
	require.NoError(t, err)
	assert.Equal(t, []Mark{
		{File: "a/b.go", Func: "(*T).f", Code: "if x <= n {", Change: "<= → <", Why: "x never equals n here", Line: 2},
		{File: "a/c.go", Func: "g", Code: "n++", Change: "++ → --", Why: "n is never read", Line: 10},
	}, marks)

	block := "file: a.go\nfunc: f\ncode: x\nchange: < → <=\nwhy: w\n"
	for what, bad := range map[string]string{
		"eq.txt:1: the mark has no \"why\"":    strings.Replace(block, "why: w\n", "", 1),
		"eq.txt:3: want one of":                strings.Replace(block, "code: x", "line: x", 1),
		"eq.txt:3: \"func\" twice":             strings.Replace(block, "code: x", "func: x", 1),
		"eq.txt:1: an indented line outside":   "  x\n" + block,
		"eq.txt:7: the mark of line 1 again":   block + "\n" + block,
		"eq.txt:1: the mark has no \"change\"": strings.Replace(block, "change: < → <=\n", "", 1),
	} {
		_, err := parseMarks(strings.NewReader(bad), "eq.txt")
		require.Error(t, err, what)
		assert.Contains(t, err.Error(), what)
	}
}

// A run finds the module's equivalents file where it lives
// (internal/tools/mutate/equivalent.txt) or takes another by -equivalents;
// it reports the stale marks of the packages it mutates before anything
// else, and in its summary; an -equivalents file that is not there is an
// error, a module without the default file has no marks.
func TestARunReadsTheEquivalentsFileAndReportsItsStaleMarks(t *testing.T) {
	dir := writeModule(t, moduleCode, moduleTest)
	var out bytes.Buffer
	sum, err := run(context.Background(), Config{Dir: dir, Files: []string{"m.go"}, List: true, Jobs: 1, Timeout: time.Minute}, &out)
	require.NoError(t, err)
	assert.Contains(t, out.String(), "m.go:12:27  bool        false → true  (documented equivalent)\n")
	assert.Empty(t, sum.MarkProblems)

	stale := moduleMarks + "\nfile: m.go\nfunc: Max\ncode: if a < b {\nchange: < → <=\nwhy: gone\n"
	other := filepath.Join(dir, "other.txt")
	require.NoError(t, os.WriteFile(other, []byte(stale), 0o644))
	out.Reset()
	sum, err = run(context.Background(), Config{Dir: dir, Files: []string{"m.go"}, List: true, Jobs: 1, Timeout: time.Minute, Marks: "other.txt"}, &out)
	require.NoError(t, err)
	require.Len(t, sum.MarkProblems, 1)
	assert.True(t, strings.HasPrefix(out.String(), "other.txt:8: stale: no mutant of . is m.go Max \"if a < b {\" < → <= (the code changed? update the mark or delete it)\n"), out.String())
	assert.Contains(t, out.String(), "(documented equivalent)")

	_, err = run(context.Background(), Config{Dir: dir, Files: []string{"m.go"}, List: true, Jobs: 1, Timeout: time.Minute, Marks: "none.txt"}, &bytes.Buffer{})
	assert.ErrorIs(t, err, fs.ErrNotExist)

	require.NoError(t, os.Remove(filepath.Join(dir, filepath.FromSlash(defaultMarks))))
	out.Reset()
	sum, err = run(context.Background(), Config{Dir: dir, Files: []string{"m.go"}, List: true, Jobs: 1, Timeout: time.Minute}, &out)
	require.NoError(t, err)
	assert.Contains(t, out.String(), "0 of them documented equivalent")
	assert.Empty(t, sum.MarkProblems)
}

// moduleRootDir is this module's root, from the package's directory.
func moduleRootDir(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(root, "go.mod"))
	require.NoError(t, err, "the module root is three levels up")
	return root
}

// Every mark of the module's equivalents file names exactly one mutant,
// in the file it names: a mark left behind by a change to the code fails
// here, not silently in a mutation run.
func TestEveryMarkOfTheModuleNamesOneMutantOfItsFile(t *testing.T) {
	root := moduleRootDir(t)
	marks, err := loadMarks(filepath.Join(root, filepath.FromSlash(defaultMarks)), true)
	require.NoError(t, err)
	require.NotEmpty(t, marks)
	problems, err := checkMarks(root, marks, nil)
	require.NoError(t, err)
	assert.Empty(t, strings.Join(problems, "\n"), "marks of %s to fix", defaultMarks)
}

// No Go file of the module marks a mutant in a comment: the tool reads
// its marks from its equivalents file only, so such a comment would say
// what the tool does not do.
func TestNoGoFileOfTheModuleMarksAMutantInAComment(t *testing.T) {
	root := moduleRootDir(t)
	marker := []byte("mutation" + ": equivalent")
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			if p != root && (strings.HasPrefix(e.Name(), ".") || strings.HasPrefix(e.Name(), "_") || e.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		assert.False(t, bytes.Contains(b, marker), "%s marks a mutant in a comment: move the mark to %s", rel, defaultMarks)
		return nil
	})
	require.NoError(t, err)
}
