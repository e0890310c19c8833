//go:build !guest

package vfrdma_test

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// docs/design.md's package table is the map of the module. These rules
// hold it to the go command: every package has a row and every row is a
// package, each row's last column names exactly what its packages import,
// a package imports only packages of rows above its own, and the files the
// middle column names exist.

// designRow is a row of docs/design.md's package table.
type designRow struct {
	line    int      // in docs/design.md
	pkgs    []string // the row's packages, relative to the module root ("." for the root)
	c       bool     // a directory of C, not a Go package ("(C)" in the first cell)
	owns    string   // the middle column
	imports []string // the last column's packages, relative to the module root
	guest   []string // those it adds "with `-tags guest`"
}

var backticked = regexp.MustCompile("`([^`]+)`")

// designTable parses the table under "## Packages" in docs/design.md: the
// first cell names a row's packages in backticks ("root" is the module's
// root package), the last their imports, separated by commas ("—" for
// none; "root" is the root package; a clause "; with `-tags guest` also A,
// B" adds what the guest build imports besides).
func designTable(doc []byte) ([]designRow, error) {
	lines := strings.Split(string(doc), "\n")
	start := slices.Index(lines, "## Packages")
	if start < 0 {
		return nil, errors.New(`docs/design.md has no "## Packages" section`)
	}
	var rows []designRow
	header := 0 // table lines seen: the header and its rule come first
	for i := start + 1; i < len(lines) && !strings.HasPrefix(lines[i], "## "); i++ {
		l := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(l, "|") {
			continue
		}
		if header++; header <= 2 {
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), " | ")
		if len(cells) != 3 {
			return nil, fmt.Errorf("docs/design.md:%d: a package row has three cells (package, owns, imports), not %d", i+1, len(cells))
		}
		row := designRow{line: i + 1, owns: cells[1]}
		first := strings.TrimSpace(cells[0])
		if first == "root" || strings.HasPrefix(first, "root ") {
			row.pkgs = []string{"."}
		} else {
			for _, m := range backticked.FindAllStringSubmatch(first, -1) {
				row.pkgs = append(row.pkgs, strings.TrimSuffix(m[1], "/"))
			}
			row.c = strings.Contains(first, "(C)")
		}
		if len(row.pkgs) == 0 {
			return nil, fmt.Errorf("docs/design.md:%d: the first cell names no package in backticks", i+1)
		}
		clauses := strings.Split(cells[2], ";")
		row.imports = packageList(clauses[0])
		for _, c := range clauses[1:] {
			const guest = "with `-tags guest` also "
			c = strings.TrimSpace(c)
			if !strings.HasPrefix(c, guest) {
				return nil, fmt.Errorf("docs/design.md:%d: an imports clause %q: want %q and a list", i+1, c, guest)
			}
			row.guest = append(row.guest, packageList(strings.TrimPrefix(c, guest))...)
		}
		rows = append(rows, row)
	}
	if len(rows) == 0 {
		return nil, errors.New("docs/design.md's package table has no rows")
	}
	return rows, nil
}

// packageList reads a list of the last column: "—", or names separated by
// commas, "root" for the root package.
func packageList(s string) []string {
	s = strings.TrimSpace(s)
	if s == "—" {
		return nil
	}
	var out []string
	for name := range strings.SplitSeq(s, ",") {
		name = strings.Trim(strings.TrimSpace(name), "`")
		if name == "root" {
			name = "."
		}
		out = append(out, name)
	}
	return out
}

// modulePackages runs go list over the module with the given build tags
// and returns each package's imports of the module's packages, all by
// path relative to the module root ("." for the root).
func modulePackages(t *testing.T, tags string) map[string][]string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	require.NoError(t, err, "this test runs the go tool, which go test puts on PATH")
	mod, err := exec.Command(goTool, "list", "-m").Output()
	require.NoError(t, err, "go list -m")
	module := strings.TrimSpace(string(mod))
	rel := func(path string) (string, bool) {
		if path == module {
			return ".", true
		}
		return strings.CutPrefix(path, module+"/")
	}
	var stderr bytes.Buffer
	cmd := exec.Command(goTool, "list", "-tags", tags, "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go list -tags %q ./...: %s", tags, stderr.String())
	pkgs := map[string][]string{}
	for line := range strings.Lines(strings.TrimSpace(string(out))) {
		fields := strings.Fields(line)
		p, ok := rel(fields[0])
		require.True(t, ok, "go list: %s is not in module %s", fields[0], module)
		imports := []string{}
		for _, imp := range fields[1:] {
			if r, ok := rel(imp); ok {
				imports = append(imports, r)
			}
		}
		pkgs[p] = imports
	}
	return pkgs
}

// tableName is how the table writes a package.
func tableName(p string) string {
	if p == "." {
		return "root"
	}
	return p
}

// tableList is how the table writes a list of packages: sorted, "—" for
// none.
func tableList(ps []string) string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = tableName(p)
	}
	slices.Sort(out)
	if len(out) == 0 {
		return "—"
	}
	return strings.Join(out, ", ")
}

// designFacts is what the table is checked against: the module's packages
// and their imports with and without the guest tag, and the directory the
// table's paths are relative to.
type designFacts struct {
	host, guest map[string][]string
	root        string
}

// designProblems returns what is wrong with the table: a package of the
// module (with or without the guest tag) without a row; a row naming
// something that is not a package (or, marked (C), a directory holding no
// Go package); an imports column that is not what its packages import
// (test files aside, imports between the row's packages aside); an import
// of a package whose row is below; a file the middle column names that is
// not there (a bare name is in the row's first package, a path is from
// the root).
func designProblems(rows []designRow, f designFacts) []string {
	var problems []string
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	rowOf := map[string]int{} // package → its row's index
	for i, r := range rows {
		for _, p := range r.pkgs {
			if j, ok := rowOf[p]; ok {
				fail("docs/design.md:%d and :%d both name %s", rows[j].line, r.line, tableName(p))
			}
			rowOf[p] = i
			_, isHost := f.host[p]
			_, isGuest := f.guest[p]
			switch {
			case r.c && (isHost || isGuest):
				fail("docs/design.md:%d: %s is a Go package: drop the (C)", r.line, tableName(p))
			case r.c:
				if st, err := os.Stat(filepath.Join(f.root, p)); err != nil || !st.IsDir() {
					fail("docs/design.md:%d: %s is not a directory of the module", r.line, p)
				}
			case !isHost && !isGuest:
				fail("docs/design.md:%d names %s, which go list does not know (moved or removed? fix or drop the row)", r.line, tableName(p))
			}
		}
	}
	all := slices.Sorted(maps.Keys(f.host))
	for p := range f.guest {
		if _, ok := f.host[p]; !ok {
			all = append(all, p)
		}
	}
	for _, p := range all {
		if _, ok := rowOf[p]; !ok {
			fail("package %s has no row in docs/design.md's package table: add one (what it owns, what it imports) where its imports put it", tableName(p))
		}
	}

	// outside is what the row's packages import outside the row.
	outside := func(r designRow, pkgs map[string][]string) []string {
		set := map[string]bool{}
		for _, p := range r.pkgs {
			for _, imp := range pkgs[p] {
				if !slices.Contains(r.pkgs, imp) {
					set[imp] = true
				}
			}
		}
		return slices.Sorted(maps.Keys(set))
	}
	for i, r := range rows {
		if r.c {
			continue
		}
		host := outside(r, f.host)
		var guestOnly []string
		for _, imp := range outside(r, f.guest) {
			if !slices.Contains(host, imp) {
				guestOnly = append(guestOnly, imp)
			}
		}
		if got, want := tableList(r.imports), tableList(host); got != want {
			fail("docs/design.md:%d: %s: the module packages imported are %s; the table says %s", r.line, tableList(r.pkgs), want, got)
		}
		if got, want := tableList(r.guest), tableList(guestOnly); got != want {
			fail("docs/design.md:%d: %s: with -tags guest, the module packages imported besides are %s; the table says %s", r.line, tableList(r.pkgs), want, got)
		}
		for _, imp := range append(host, guestOnly...) {
			if j, ok := rowOf[imp]; ok && j > i {
				fail("docs/design.md:%d: %s imports %s, whose row (line %d) is below it: move one of the rows", r.line, tableList(r.pkgs), tableName(imp), rows[j].line)
			}
		}
	}

	for _, r := range rows {
		for _, m := range backticked.FindAllStringSubmatch(r.owns, -1) {
			name := m[1]
			if !fileName.MatchString(name) {
				continue
			}
			path := filepath.Join(f.root, name)
			if !strings.Contains(name, "/") {
				path = filepath.Join(f.root, r.pkgs[0], name)
			}
			if _, err := os.Stat(path); err != nil {
				fail("docs/design.md:%d names %s, which is not at %s", r.line, name, path)
			}
		}
	}
	return problems
}

// fileName is a backticked name that is a file: a path with an extension
// the module's files have.
var fileName = regexp.MustCompile(`^[\w./-]+\.(go|md|sh|txt|c|h|json)$`)

// docs/design.md's package table is true: every package of the module has
// a row and every row is a package; each row's last column names what its
// packages import of the module and a package imports only packages of
// rows above its own; the files the middle column names exist.
func TestDesignPackageTableMatchesGoList(t *testing.T) {
	doc, err := os.ReadFile("docs/design.md")
	require.NoError(t, err)
	rows, err := designTable(doc)
	require.NoError(t, err)
	problems := designProblems(rows, designFacts{host: modulePackages(t, ""), guest: modulePackages(t, "guest"), root: "."})
	assert.Empty(t, strings.Join(problems, "\n"), "docs/design.md's package table is out of date")
}

// The table's checks catch what they are for: a package without a row, a
// row without a package, a package in two rows, an import the last column
// does not name or names wrongly (with and without the guest tag), a row
// below a package that imports it, a file that is not there, a (C) row
// that is a Go package or no directory, a row of another form.
func TestDesignPackageTableChecksCatchEachDrift(t *testing.T) {
	const table = "## Packages\n\n| package | owns | imports |\n|---|---|---|\n"
	good := table +
		"| `a` | the base, `a.go` | — |\n" +
		"| `b` (`b/sub`) | more | a |\n" +
		"| `c` | guest only, `docs/c.md` | — |\n" +
		"| root (`m`) | the API | a, b; with `-tags guest` also c |\n" +
		"| `cdir` (C) | C | — |\n"
	dir := t.TempDir()
	for _, d := range []string{"a", "cdir", "docs"} {
		require.NoError(t, os.Mkdir(filepath.Join(dir, d), 0o755))
	}
	for _, f := range []string{"a/a.go", "docs/c.md", "notes.md"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), nil, 0o644))
	}
	facts := designFacts{
		host:  map[string][]string{"a": {}, "b": {"a"}, "b/sub": {"b"}, ".": {"a", "b"}},
		guest: map[string][]string{"a": {}, "b": {"a"}, "b/sub": {"b"}, ".": {"a", "b", "c"}, "c": {}},
		root:  dir,
	}
	rows, err := designTable([]byte(good))
	require.NoError(t, err)
	require.Empty(t, designProblems(rows, facts), "the good table passes")

	for what, bad := range map[string]string{
		"a package without a row":      strings.Replace(good, "| `c` | guest only, `docs/c.md` | — |\n", "", 1),
		"a row without a package":      good + "| `gone` | nothing | — |\n",
		"a package in two rows":        good + "| `a` | again | — |\n",
		"an import not named":          strings.Replace(good, "| more | a |", "| more | — |", 1),
		"an import named that is not":  strings.Replace(good, "| the base, `a.go` | — |", "| the base, `a.go` | b |", 1),
		"a guest import not named":     strings.Replace(good, "a, b; with `-tags guest` also c", "a, b", 1),
		"a guest import named as host": strings.Replace(good, "a, b; with `-tags guest` also c", "a, b, c", 1),
		"a row below its importer":     strings.Replace(good, "| `b` (`b/sub`) | more | a |\n", "", 1) + "| `b` (`b/sub`) | more | a |\n",
		"a file that is not there":     strings.Replace(good, "`a.go`", "`gone.go`", 1),
		"a path that is not there":     strings.Replace(good, "`docs/c.md`", "`docs/gone.md`", 1),
		"a root file in a package row": strings.Replace(good, "| more |", "| more, `notes.md` |", 1),
		"a Go package marked (C)":      strings.Replace(good, "| `c` | guest only", "| `c` (C) | guest only", 1),
		"a (C) row that is no dir":     strings.Replace(good, "`cdir` (C)", "`nodir` (C)", 1),
	} {
		rows, err := designTable([]byte(bad))
		require.NoError(t, err, what)
		assert.NotEmpty(t, designProblems(rows, facts), "%s passes:\n%s", what, bad)
	}
	for what, bad := range map[string]string{
		"an imports clause of no form": strings.Replace(good, "with `-tags guest` also c", "and c", 1),
		"a row of two cells":           good + "| `x` | nothing |\n",
		"a row naming no package":      good + "| x | nothing | — |\n",
		"no table":                     "## Packages\n\nnone\n",
	} {
		_, err := designTable([]byte(bad))
		assert.Error(t, err, what)
	}
}
