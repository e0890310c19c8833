package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// defaultMarks is the equivalents file, relative to the module root: the
// tool's own list of the module's equivalent mutants.
const defaultMarks = "internal/tools/mutate/equivalent.txt"

// A Mark names one equivalent mutant: one that cannot change what the
// code does, so that no test can catch it. The equivalents file holds one
// block per mark, blocks apart by blank lines:
//
//	file:   event/waitset.go
//	func:   Spin
//	code:   if d <= 0 {
//	change: <= → <
//	why:    a spin of 0 then ends at its 16th look, having found nothing
//
// file is the file the mutant is in, relative to the module root; func the
// declaration around it as the tool names it (f, T.m, (*T).m, var v);
// code a piece of the source that holds where the mutant starts (the
// mutated text and as much around it, over several lines if need be, as
// tells it from any other); change the mutant as -list shows it (before →
// after); why the reason no test can tell it from the original, for the
// next reader. A value goes on over the lines below it that start with a
// space or a tab; lines starting with # are notes.
//
// A mark names the mutants of file's package (the files of its directory)
// in func that start inside an occurrence of code (spaces and line breaks
// aside: code's words in order, with space between them where it has
// some) and whose change is change: no line number, so it holds while code
// moves within its file or to another file of its package. A mark that
// names no mutant of its package is stale, one that names several is
// ambiguous (give more of the code), and one whose mutant is in another
// file of the package names the wrong file: the tool reports them for the
// packages it runs on, and the package's tests for the whole module.
type Mark struct {
	File, Func, Code, Change, Why string
	Line                          int // where the block starts in the equivalents file
}

// codeRE is the pattern of a mark's code: its words in order, quoted, with
// space (line breaks included) where code has some.
func codeRE(code string) *regexp.Regexp {
	words := strings.Fields(code)
	for i, w := range words {
		words[i] = regexp.QuoteMeta(w)
	}
	return regexp.MustCompile(strings.Join(words, `\s+`))
}

func (k Mark) String() string {
	return fmt.Sprintf("%s %s %q %s", k.File, k.Func, k.Code, k.Change)
}

// squeeze puts s on one line with single spaces, for comparisons that
// ignore layout.
func squeeze(s string) string { return strings.Join(strings.Fields(s), " ") }

// names reports whether k names m, given where code occurs in m's file
// (spans, as FindAllIndex returns them).
func (k Mark) names(m Mutant, spans [][]int) bool {
	if path.Dir(k.File) != path.Dir(m.File) || k.Func != m.Func || squeeze(k.Change) != m.Change() {
		return false
	}
	for _, s := range spans {
		if s[0] <= m.Start && m.Start < s[1] {
			return true
		}
	}
	return false
}

// markSpans returns, for each mark of file's package, where its code
// occurs in src, file's source.
func markSpans(marks []Mark, file string, src []byte) [][][]int {
	spans := make([][][]int, len(marks))
	for i, k := range marks {
		if path.Dir(k.File) == path.Dir(file) {
			spans[i] = codeRE(k.Code).FindAllIndex(src, -1)
		}
	}
	return spans
}

// parseMarks reads an equivalents file; name is its name for messages.
func parseMarks(r io.Reader, name string) ([]Mark, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var (
		marks []Mark
		cur   map[string]string
		last  string // the key a continuation line adds to
		start int
		n     int
	)
	keys := []string{"file", "func", "code", "change", "why"}
	end := func() error {
		if cur == nil {
			return nil
		}
		for _, k := range keys {
			if cur[k] == "" {
				return fmt.Errorf("%s:%d: the mark has no %q", name, start, k)
			}
		}
		k := Mark{File: cur["file"], Func: cur["func"], Code: cur["code"], Change: squeeze(cur["change"]), Why: cur["why"], Line: start}
		for _, o := range marks {
			if o.File == k.File && o.Func == k.Func && squeeze(o.Code) == squeeze(k.Code) && o.Change == k.Change {
				return fmt.Errorf("%s:%d: the mark of line %d again", name, start, o.Line)
			}
		}
		marks = append(marks, k)
		cur = nil
		return nil
	}
	for sc.Scan() {
		n++
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "#"):
		case strings.TrimSpace(line) == "":
			if err := end(); err != nil {
				return nil, err
			}
		case line[0] == ' ' || line[0] == '\t':
			if cur == nil {
				return nil, fmt.Errorf("%s:%d: an indented line outside a mark", name, n)
			}
			cur[last] += " " + strings.TrimSpace(line)
		default:
			k, v, ok := strings.Cut(line, ":")
			if !ok || !slices.Contains(keys, k) {
				return nil, fmt.Errorf("%s:%d: want one of %s, a colon and a value: %q", name, n, strings.Join(keys, ", "), line)
			}
			if cur == nil {
				cur, start = map[string]string{}, n
			}
			if _, dup := cur[k]; dup {
				return nil, fmt.Errorf("%s:%d: %q twice in one mark", name, n, k)
			}
			cur[k], last = strings.TrimSpace(v), k
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if err := end(); err != nil {
		return nil, err
	}
	return marks, nil
}

// loadMarks reads the equivalents file at p. The default file may be
// absent (a module without one has no marks); a file asked for may not.
func loadMarks(p string, asked bool) ([]Mark, error) {
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) && !asked {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseMarks(f, p)
}

// markEquivalents sets Equivalent on the mutants of src, one file's, that a
// mark names.
func markEquivalents(ms []Mutant, src []byte, marks []Mark) {
	if len(ms) == 0 {
		return
	}
	spans := markSpans(marks, ms[0].File, src)
	for i := range ms {
		for j, k := range marks {
			if k.names(ms[i], spans[j]) {
				ms[i].Equivalent = true
				break
			}
		}
	}
}

// generateFile reads the module file rel (relative to root, with slashes)
// and returns its mutants, unmarked, and its source.
func generateFile(root, rel string) ([]Mutant, []byte, error) {
	abs := filepath.Join(root, filepath.FromSlash(rel))
	src, err := os.ReadFile(abs)
	if err != nil {
		return nil, nil, err
	}
	pkg, err := packageName(abs, src)
	if err != nil {
		return nil, nil, err
	}
	vars, err := packageVars(filepath.Dir(abs), pkg, abs)
	if err != nil {
		return nil, nil, err
	}
	ms, err := Generate(rel, src, vars)
	return ms, src, err
}

// checkMarks returns what is wrong with the marks of the packages in dirs
// (directories relative to root, with slashes; nil for every mark's): a
// mark that names no mutant of its package, several, or one in another
// file than the one it names. Each package's non-test Go files are
// generated whole, whatever a run samples of them.
func checkMarks(root string, marks []Mark, dirs map[string]bool) ([]string, error) {
	type located struct {
		m     Mutant
		spans [][][]int // markSpans of its file
	}
	byDir := map[string][]located{}
	var problems []string
	for i, k := range marks {
		dir := path.Dir(k.File)
		if dirs != nil && !dirs[dir] {
			continue
		}
		if _, done := byDir[dir]; !done {
			entries, err := os.ReadDir(filepath.Join(root, filepath.FromSlash(dir)))
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, err
			}
			all := []located{}
			for _, e := range entries {
				name := e.Name()
				if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
					continue
				}
				ms, src, err := generateFile(root, path.Join(dir, name))
				if err != nil {
					continue // not this package's, or broken: a baseline run says so
				}
				spans := markSpans(marks, path.Join(dir, name), src)
				for _, m := range ms {
					all = append(all, located{m, spans})
				}
			}
			byDir[dir] = all
		}
		var hits []Mutant
		for _, l := range byDir[dir] {
			if k.names(l.m, l.spans[i]) {
				hits = append(hits, l.m)
			}
		}
		switch {
		case len(hits) == 0:
			problems = append(problems, fmt.Sprintf("%d: stale: no mutant of %s is %s (the code changed? update the mark or delete it)", k.Line, dir, k))
		case len(hits) > 1:
			var at []string
			for _, m := range hits {
				at = append(at, m.Pos())
			}
			problems = append(problems, fmt.Sprintf("%d: ambiguous: %s names %d mutants (%s): give more of the code", k.Line, k, len(hits), strings.Join(at, ", ")))
		case hits[0].File != k.File:
			problems = append(problems, fmt.Sprintf("%d: %s is in %s, not %s: update the file", k.Line, k, hits[0].File, k.File))
		}
	}
	return problems, nil
}
