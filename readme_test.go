//go:build !guest

package vfrdma_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/scanner"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The README's Go blocks are the bodies of the module's Example functions
// (which go test runs on the device model and whose output it checks),
// copied verbatim less the func line; and every one of them compiles on
// its own. These two rules keep the README from drifting from the code.

// readmeBlock is a ```go block of README.md: its code and the line of
// README.md its first line is on.
type readmeBlock struct {
	line int
	code string
}

// readmeGoBlocks returns README.md's ```go blocks in order.
func readmeGoBlocks(t *testing.T) []readmeBlock {
	t.Helper()
	b, err := os.ReadFile("README.md")
	require.NoError(t, err)
	lines := strings.Split(string(b), "\n")
	var blocks []readmeBlock
	for i := 0; i < len(lines); i++ {
		if strings.TrimRight(lines[i], " \t") != "```go" {
			continue
		}
		end := i + 1
		for end < len(lines) && strings.TrimRight(lines[end], " \t") != "```" {
			end++
		}
		require.Less(t, end, len(lines), "README.md:%d: a ```go block with no closing ```", i+1)
		blocks = append(blocks, readmeBlock{line: i + 2, code: strings.Join(lines[i+1:end], "\n")})
		i = end
	}
	require.NotEmpty(t, blocks, "README.md has no ```go blocks: its Go snippets are fenced as ```go so that these rules see them")
	return blocks
}

// example is an Example function of the module.
type example struct {
	name    string            // as pkgdir.ExampleX
	body    string            // between its braces, one tab of indent removed
	imports map[string]string // its file's imports: name → path
}

// moduleExamples parses every *example_test.go file of the module.
func moduleExamples(t *testing.T) []example {
	t.Helper()
	var out []example
	err := filepath.WalkDir(".", func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := e.Name()
		if e.IsDir() {
			if path != "." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "build") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, "example_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
		if err != nil {
			return err
		}
		imports := map[string]string{}
		for _, spec := range f.Imports {
			p, err := strconv.Unquote(spec.Path.Value)
			if err != nil {
				return err
			}
			imports[importName(spec, p)] = p
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv != nil || !strings.HasPrefix(fd.Name.Name, "Example") || fd.Body == nil {
				continue
			}
			body := string(src[fset.Position(fd.Body.Lbrace).Offset+1 : fset.Position(fd.Body.Rbrace).Offset])
			out = append(out, example{
				name:    filepath.ToSlash(filepath.Join(filepath.Dir(path), fd.Name.Name)),
				body:    dedent(body),
				imports: imports,
			})
		}
		return nil
	})
	require.NoError(t, err)
	require.NotEmpty(t, out, "no Example functions found")
	return out
}

// sharedLines counts the lines of a that b has too, each of b's lines
// counting once.
func sharedLines(a, b []string) int {
	left := map[string]int{}
	for _, l := range b {
		left[l]++
	}
	n := 0
	for _, l := range a {
		if left[l] > 0 {
			left[l]--
			n++
		}
	}
	return n
}

var majorVersion = regexp.MustCompile(`^v[0-9]+$`)

// importName is the name an import is used by: its alias, or its path's
// last element (the one before a major-version suffix).
func importName(spec *ast.ImportSpec, path string) string {
	if spec.Name != nil {
		return spec.Name.Name
	}
	parts := strings.Split(path, "/")
	if n := len(parts); n > 1 && majorVersion.MatchString(parts[n-1]) {
		return parts[n-2]
	}
	return parts[len(parts)-1]
}

// dedent turns a function body's text into the block a README shows:
// without the newlines after { and before }, and one tab less on each line.
func dedent(body string) string {
	body = strings.TrimPrefix(body, "\n")
	body = strings.TrimSuffix(body, "\n")
	lines := strings.Split(body, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, "\t")
	}
	return strings.Join(lines, "\n")
}

// Every ```go block of README.md is the body of an Example function,
// verbatim: what the README shows is what go test runs and checks.
func TestEveryREADMEGoBlockIsAnExampleBody(t *testing.T) {
	examples := moduleExamples(t)
	for _, b := range readmeGoBlocks(t) {
		if slices.ContainsFunc(examples, func(e example) bool { return e.body == b.code }) {
			continue
		}
		// The nearest example: the one that has the most of the block's
		// lines; shown where the two first differ.
		blines := strings.Split(b.code, "\n")
		var best example
		bestScore := -1
		for _, e := range examples {
			if score := sharedLines(blines, strings.Split(e.body, "\n")); score > bestScore {
				best, bestScore = e, score
			}
		}
		elines := strings.Split(best.body, "\n")
		at := 0
		for at < len(blines) && at < len(elines) && blines[at] == elines[at] {
			at++
		}
		got, want := "(the block ends here)", "(the example ends here)"
		if at < len(blines) {
			got = strconv.Quote(blines[at])
		}
		if at < len(elines) {
			want = strconv.Quote(elines[at])
		}
		assert.Fail(t, "a README Go block is not an Example's body",
			"README.md:%d: the block starting here is not the body of any Example function (copy the body verbatim, less the func line).\nThe nearest is %s, which differs at README.md:%d:\n  README:  %s\n  example: %s",
			b.line, best.name, b.line+at, got, want)
	}
}

// Every ```go block of README.md compiles: each becomes the body of main
// in a package of its own, importing what it uses by the names the
// examples import, in a directory under the module that is removed
// afterwards (./... skips names that start with _, so go vet is given
// each package by name). Errors point at README.md's lines.
func TestEveryREADMEGoBlockCompiles(t *testing.T) {
	goTool, err := exec.LookPath("go")
	require.NoError(t, err, "this test runs the go tool, which go test puts on PATH")
	known := map[string]string{} // import name → path, from the examples' files
	for _, e := range moduleExamples(t) {
		for name, path := range e.imports {
			known[name] = path
		}
	}
	blocks := readmeGoBlocks(t)
	readme, err := filepath.Abs("README.md")
	require.NoError(t, err)
	dir, err := os.MkdirTemp(".", "_readme")
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, os.RemoveAll(dir)) })
	args := []string{"vet"}
	for i, b := range blocks {
		used, err := packagesUsed(b.code, known)
		require.NoError(t, err, "README.md:%d", b.line)
		var src strings.Builder
		src.WriteString("package main\n\nimport (\n")
		for _, name := range used {
			fmt.Fprintf(&src, "\t%s %q\n", name, known[name])
		}
		fmt.Fprintf(&src, ")\n\nfunc main() {\n//line %s:%d\n%s\n}\n", readme, b.line, b.code)
		pkg := filepath.Join(dir, fmt.Sprintf("block%02d", i+1))
		require.NoError(t, os.Mkdir(pkg, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(pkg, "main.go"), []byte(src.String()), 0o644))
		args = append(args, "./"+filepath.ToSlash(pkg))
	}
	cmd := exec.Command(goTool, args...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "README.md's Go blocks must compile, each as the body of a func main:\n%s", out)
}

// packagesUsed returns the names in known that code uses as package
// qualifiers (an identifier followed by a dot, not itself after a dot),
// sorted.
func packagesUsed(code string, known map[string]string) ([]string, error) {
	fset := token.NewFileSet()
	src := []byte(code)
	var s scanner.Scanner
	var errs scanner.ErrorList
	s.Init(fset.AddFile("block", -1, len(src)), src, func(pos token.Position, msg string) { errs.Add(pos, msg) }, 0)
	seen := map[string]bool{}
	prev, prevLit := token.ILLEGAL, ""
	before := token.ILLEGAL // the token before prev
	for {
		_, tok, lit := s.Scan()
		if tok == token.EOF {
			break
		}
		if tok == token.PERIOD && prev == token.IDENT && before != token.PERIOD {
			if _, ok := known[prevLit]; ok {
				seen[prevLit] = true
			}
		}
		before, prev, prevLit = prev, tok, lit
	}
	if err := errs.Err(); err != nil {
		return nil, err
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	slices.Sort(names)
	return names, nil
}
