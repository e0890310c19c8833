package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

// goTool runs the go command in the module root.
type goTool struct {
	root string
	// tmp becomes GOTMPDIR: the go command's work directories (compiled
	// packages, test binaries) land in the tool's own temporary directory,
	// so a build killed by an interrupt leaves nothing behind either.
	tmp string
}

// command returns a go command that ctx cancels by killing it along with
// the test binaries it started.
func (g *goTool) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = g.root
	cmd.Env = os.Environ()
	if g.tmp != "" {
		cmd.Env = append(cmd.Env, "GOTMPDIR="+g.tmp)
	}
	killGroupOnCancel(cmd)
	// A test binary that outlives its go command must not keep Wait
	// waiting for the pipes it inherited.
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// output runs a go command and returns its standard output; a failure
// carries what the command said on standard error.
func (g *goTool) output(ctx context.Context, args ...string) ([]byte, error) {
	cmd := g.command(ctx, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// moduleRoot returns the root directory of the module that holds dir.
func moduleRoot(ctx context.Context, dir string) (string, error) {
	g := &goTool{root: dir}
	out, err := g.output(ctx, "env", "GOMOD")
	if err != nil {
		return "", err
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("%s is not inside a Go module", dir)
	}
	return filepath.Dir(gomod), nil
}

// A listedPackage is the part of go list's output the tool uses.
type listedPackage struct {
	Dir, ImportPath                    string
	GoFiles, CgoFiles, IgnoredGoFiles  []string
	TestGoFiles, XTestGoFiles          []string
	Imports, TestImports, XTestImports []string
}

func (p *listedPackage) hasTests() bool { return len(p.TestGoFiles)+len(p.XTestGoFiles) > 0 }

// importsPkg reports whether p or its tests import the package path
// directly.
func (p *listedPackage) importsPkg(path string) bool {
	return slices.Contains(p.Imports, path) || slices.Contains(p.TestImports, path) || slices.Contains(p.XTestImports, path)
}

// listPackages lists the module's packages as built with tags.
func (g *goTool) listPackages(ctx context.Context, tags string) ([]listedPackage, error) {
	args := []string{"list", "-e", "-json=Dir,ImportPath,GoFiles,CgoFiles,IgnoredGoFiles,TestGoFiles,XTestGoFiles,Imports,TestImports,XTestImports"}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	out, err := g.output(ctx, append(args, "./...")...)
	if err != nil {
		return nil, err
	}
	var pkgs []listedPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listedPackage
		if err := dec.Decode(&p); err == io.EOF {
			return pkgs, nil
		} else if err != nil {
			return nil, fmt.Errorf("reading go list output: %w", err)
		}
		pkgs = append(pkgs, p)
	}
}

// testsFor finds the package that compiles the file abs and the packages
// whose tests should catch its mutants: that package and every package of
// the module that imports it directly, from its code or its tests, keeping
// those that have tests. It also returns the file's path as the go command
// names it, which is what an overlay must replace.
func testsFor(pkgs []listedPackage, abs, tags string) (goPath string, tests []string, err error) {
	dir, base := filepath.Dir(abs), filepath.Base(abs)
	var own *listedPackage
	for i := range pkgs {
		if sameDir(pkgs[i].Dir, dir) {
			own = &pkgs[i]
			break
		}
	}
	if own == nil {
		return "", nil, fmt.Errorf("%s: no package of the module is in %s", abs, dir)
	}
	if !slices.Contains(own.GoFiles, base) && !slices.Contains(own.CgoFiles, base) {
		if slices.Contains(own.IgnoredGoFiles, base) {
			return "", nil, fmt.Errorf("%s is left out of package %s by its build constraints (-tags %q): no test could catch its mutants", abs, own.ImportPath, tags)
		}
		return "", nil, fmt.Errorf("%s is not a file of package %s", abs, own.ImportPath)
	}
	// The file's own package goes first: go test prints the packages'
	// output in the order given, and the first failing test reported
	// should be the most direct one.
	if own.hasTests() {
		tests = append(tests, own.ImportPath)
	}
	for _, p := range pkgs {
		if p.hasTests() && p.ImportPath != own.ImportPath && p.importsPkg(own.ImportPath) {
			tests = append(tests, p.ImportPath)
		}
	}
	if len(tests) == 0 {
		return "", nil, fmt.Errorf("%s: neither package %s nor any package importing it has tests", abs, own.ImportPath)
	}
	return filepath.Join(own.Dir, base), tests, nil
}

// sameDir compares directories, looking through symbolic links when the
// names differ (a temporary directory reached through a link, say).
func sameDir(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	ra, errA := filepath.EvalSymlinks(a)
	rb, errB := filepath.EvalSymlinks(b)
	return errA == nil && errB == nil && ra == rb
}

// testOptions are the go test flags that every run shares.
type testOptions struct {
	run     string
	timeout time.Duration
	tags    string
}

// A testRun is the outcome of one go test command.
type testRun struct {
	passed bool
	output string // standard output and error, interleaved
}

// test runs go test on pkgs, with the overlay file if one is given. A
// failure of the tests is a result, not an error; an error means go test
// could not be run, or ctx ended.
func (g *goTool) test(ctx context.Context, opts testOptions, overlay string, pkgs []string) (testRun, error) {
	// -count=1: a cached pass must never stand in for a mutant's run.
	// -vet=off: a mutant is judged by the tests alone, and vet would only
	// slow every run down. -failfast: one failing test is enough.
	args := []string{"test", "-count=1", "-vet=off", "-failfast", "-timeout", opts.timeout.String()}
	if opts.tags != "" {
		args = append(args, "-tags", opts.tags)
	}
	if opts.run != "" {
		args = append(args, "-run", opts.run)
	}
	if overlay != "" {
		args = append(args, "-overlay", overlay)
	}
	cmd := g.command(ctx, append(args, pkgs...)...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	if ctx.Err() != nil {
		return testRun{}, ctx.Err()
	}
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		return testRun{}, fmt.Errorf("go test: %w", err)
	}
	return testRun{passed: err == nil, output: out.String()}, nil
}

// overlayFile is the format of go build -overlay.
type overlayFile struct {
	Replace map[string]string
}

// writeOverlay writes content, the mutated source of the file orig, and an
// overlay that replaces orig with it into dir, and returns the overlay's
// path.
func writeOverlay(dir, orig string, content []byte) (string, error) {
	replacement := filepath.Join(dir, filepath.Base(orig))
	if err := os.WriteFile(replacement, content, 0o644); err != nil {
		return "", err
	}
	data, err := json.Marshal(overlayFile{Replace: map[string]string{orig: replacement}})
	if err != nil {
		return "", err
	}
	overlay := filepath.Join(dir, "overlay.json")
	return overlay, os.WriteFile(overlay, data, 0o644)
}

// A Status is the verdict on one mutant.
type Status int

// The verdicts.
const (
	Caught     Status = iota // a test failed, panicked or timed out
	Survived                 // every test passed
	NotBuilt                 // the mutant did not compile: not counted
	Equivalent               // documented as equivalent: not run, not counted
)

func (s Status) String() string {
	switch s {
	case Caught:
		return "caught"
	case Survived:
		return "SURVIVED"
	case NotBuilt:
		return "not built"
	case Equivalent:
		return "equivalent"
	}
	return fmt.Sprintf("Status(%d)", int(s))
}

var (
	// A failing test or subtest, at any depth.
	failedTest = regexp.MustCompile(`(?m)^\s*--- FAIL: (\S+)`)
	// go test's line for a package that failed: "FAIL\tpath\t0.1s", or
	// "FAIL\tpath [build failed]" when it did not compile.
	failedPkg = regexp.MustCompile(`(?m)^FAIL[ \t]+(\S+)([ \t]+\[(?:build|setup) failed\])?`)
	// The test that was running when the test binary's timer fired.
	timedOut = regexp.MustCompile(`panic: test timed out after \S+(?:\s+running tests:\s+(\S+))?`)
	// A compiler error: "file.go:12:3: message".
	compileError = regexp.MustCompile(`(?m)^\S+\.go:\d+:\d+: .*$`)
)

// classify judges a mutant from go test's outcome, and says why in a few
// words: which package and test caught it, or why it did not build.
func classify(r testRun) (Status, string) {
	if r.passed {
		return Survived, ""
	}
	out := r.output
	if loc := failedTest.FindStringSubmatchIndex(out); loc != nil {
		name := out[loc[2]:loc[3]]
		pkg, end := pkgAfter(out, loc[1])
		verb := "failed"
		if strings.Contains(out[loc[1]:end], "\npanic: ") {
			verb = "panicked"
		}
		return Caught, fmt.Sprintf("%s: %s %s", pkg, name, verb)
	}
	if m := timedOut.FindStringSubmatchIndex(out); m != nil {
		what := "timed out"
		if m[2] >= 0 {
			what = out[m[2]:m[3]] + " timed out"
		}
		pkg, _ := pkgAfter(out, m[1])
		return Caught, fmt.Sprintf("%s: %s", pkg, what)
	}
	// A package whose test binary failed with no failing test: a panic
	// outside a test, a fatal error such as a deadlock, os.Exit in
	// TestMain.
	for _, m := range failedPkg.FindAllStringSubmatch(out, -1) {
		if m[2] == "" {
			return Caught, shortPkg(m[1]) + ": test binary failed"
		}
	}
	// Nothing ran and failed: the mutant broke the build. Say how, with
	// the compiler's first complaint.
	if msg := compileError.FindString(out); msg != "" {
		return NotBuilt, msg
	}
	return NotBuilt, firstLine(out)
}

// pkgAfter names the package of the output that follows offset i, and
// returns where that package's output ends: go test prints each package's
// output as one block that ends with its FAIL line.
func pkgAfter(out string, i int) (string, int) {
	if m := failedPkg.FindStringSubmatchIndex(out[i:]); m != nil {
		return shortPkg(out[i+m[2] : i+m[3]]), i + m[1]
	}
	return "?", len(out)
}

// shortPkg is the last element of an import path: "event" for
// github.com/vfrdma/vfrdma/event.
func shortPkg(importPath string) string { return path.Base(importPath) }

// firstLine returns the first non-blank line of s.
func firstLine(s string) string {
	for line := range strings.Lines(s) {
		if line = strings.TrimSpace(line); line != "" {
			return line
		}
	}
	return "no output"
}
