package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// Config is one run of the tool: the flags and the files.
type Config struct {
	Dir     string        // where FILE paths are resolved; the module is the one holding it ("" is the current directory)
	Files   []string      // the Go files to mutate
	Pkgs    []string      // test packages for every file, overriding the default
	Run     string        // go test -run
	Timeout time.Duration // go test -timeout
	Tags    string        // go list/test -tags
	Jobs    int           // mutants run at once
	List    bool          // print the mutants, run nothing
	N       int           // run a sample of N mutants per file (0: all)
	Seed    uint64        // the sample's seed
	Only    string        // file:line: run only the mutants on that line
	Faults  string        // a file of hand-written faults to run instead of generated mutants
	Marks   string        // the equivalents file; "" for defaultMarks under the module root, if it is there
}

// Counts tallies the verdicts.
type Counts struct {
	Caught, Survived, NotBuilt, Equivalent int
}

// Ran is how many mutants were run: every one but the documented
// equivalents.
func (c Counts) Ran() int { return c.Caught + c.Survived + c.NotBuilt }

// Score is the share of the judged mutants (caught or survived) that were
// caught, in percent; ok is false when none was judged.
func (c Counts) Score() (score float64, ok bool) {
	judged := c.Caught + c.Survived
	if judged == 0 {
		return 0, false
	}
	return 100 * float64(c.Caught) / float64(judged), true
}

func (c *Counts) add(s Status) {
	switch s {
	case Caught:
		c.Caught++
	case Survived:
		c.Survived++
	case NotBuilt:
		c.NotBuilt++
	case Equivalent:
		c.Equivalent++
	}
}

// FileCounts are the counts of one file.
type FileCounts struct {
	File string
	Counts
}

// Summary is the outcome of a run: per file, in the order given, and in
// total; and what is wrong with the marks of the equivalents file for the
// packages of the files run (see checkMarks).
type Summary struct {
	Files        []FileCounts
	Total        Counts
	MarkProblems []string
}

// target is one file to mutate.
type target struct {
	abs     string // the path the go command knows the file by: the overlay's key
	rel     string // relative to the module root, with slashes: what reports show
	src     []byte
	mutants []Mutant // selected
	tests   []string // the packages whose tests judge its mutants
	counts  FileCounts
}

// run carries out cfg, writing the report to w. A run that ends early
// (interrupted, or go test could not be run) returns an error; failing
// mutants are results, not errors.
func run(ctx context.Context, cfg Config, w io.Writer) (*Summary, error) {
	if cfg.Jobs < 1 {
		return nil, errors.New("-j must be at least 1")
	}
	if cfg.N < 0 {
		return nil, errors.New("-n must not be negative")
	}
	if cfg.Timeout <= 0 {
		return nil, errors.New("-timeout must be positive")
	}
	dir := cfg.Dir
	if dir == "" {
		dir = "."
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}

	// Every file the run writes lives under tmp, and goes with it on
	// return, interrupted or not.
	tmp, err := os.MkdirTemp("", "mutate-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)

	root, err := moduleRoot(ctx, dir)
	if err != nil {
		return nil, interrupted(ctx, err)
	}
	marks, marksName, err := cfgMarks(dir, root, cfg)
	if err != nil {
		return nil, err
	}
	targets, err := loadTargets(dir, root, cfg, marks)
	if err != nil {
		return nil, err
	}
	dirs := map[string]bool{}
	for _, t := range targets {
		dirs[path.Dir(t.rel)] = true
	}
	markProblems, err := checkMarks(root, marks, dirs)
	if err != nil {
		return nil, err
	}
	out := &lockedWriter{w: w}
	for _, p := range markProblems {
		out.printf("%s:%s\n", marksName, p)
	}
	if cfg.List {
		listMutants(out, targets)
		sum := summarize(targets)
		sum.MarkProblems = markProblems
		return sum, nil
	}

	g := &goTool{root: root, tmp: tmp}
	if err := findTests(ctx, g, cfg, targets); err != nil {
		return nil, err
	}
	opts := testOptions{run: cfg.Run, timeout: cfg.Timeout, tags: cfg.Tags}

	// A mutant is judged against green tests: on a red baseline every
	// mutant would look caught.
	var all []string
	for _, t := range targets {
		all = append(all, t.tests...)
	}
	slices.Sort(all)
	all = slices.Compact(all)
	out.printf("baseline: go test %s\n", strings.Join(all, " "))
	start := time.Now()
	base, err := g.test(ctx, opts, "", all)
	if err != nil {
		return nil, interrupted(ctx, err)
	}
	if !base.passed {
		return nil, fmt.Errorf("the tests fail without any mutant, fix them first:\n%s", lastLines(base.output, 40))
	}
	out.printf("baseline passed in %s\n", time.Since(start).Round(time.Second))

	if err := runMutants(ctx, g, opts, cfg.Jobs, targets, out); err != nil {
		return nil, err
	}
	sum := summarize(targets)
	sum.MarkProblems = markProblems
	printSummary(out, sum)
	return sum, nil
}

// cfgMarks reads the equivalents file cfg names (relative to dir), or the
// module's default one if it has one; -faults runs take none. It returns
// the marks and the file's name for messages.
func cfgMarks(dir, root string, cfg Config) ([]Mark, string, error) {
	if cfg.Faults != "" {
		return nil, "", nil
	}
	p, name, asked := filepath.Join(root, filepath.FromSlash(defaultMarks)), defaultMarks, false
	if cfg.Marks != "" {
		p, name, asked = cfg.Marks, cfg.Marks, true
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
	}
	marks, err := loadMarks(p, asked)
	return marks, name, err
}

// loadTargets resolves the files, reads them, generates their mutants,
// marks the equivalent ones and selects those to run.
func loadTargets(dir, root string, cfg Config, marks []Mark) ([]*target, error) {
	if cfg.Faults != "" {
		return loadFaultTargets(dir, root, cfg)
	}
	files := cfg.Files
	var only lineRef
	if cfg.Only != "" {
		var err error
		if only, err = parseLineRef(cfg.Only); err != nil {
			return nil, err
		}
		if len(files) == 0 {
			files = []string{only.file}
		}
	}
	if len(files) == 0 {
		return nil, errors.New("no files to mutate")
	}
	onlyRel := ""
	if cfg.Only != "" {
		_, rel, err := resolveFile(dir, root, only.file)
		if err != nil {
			return nil, err
		}
		onlyRel = rel
	}

	var targets []*target
	seen := make(map[string]bool)
	for _, name := range files {
		abs, rel, err := resolveFile(dir, root, name)
		if err != nil {
			return nil, err
		}
		if seen[rel] {
			continue
		}
		seen[rel] = true
		ms, src, err := generateFile(root, rel)
		if err != nil {
			return nil, err
		}
		markEquivalents(ms, src, marks)
		line := 0
		if onlyRel != "" {
			if rel != onlyRel {
				continue // -only runs nothing of the other files
			}
			line = only.line
		}
		t := &target{abs: abs, rel: rel, src: src, mutants: selectMutants(ms, line, cfg.N, cfg.Seed)}
		t.counts.File = rel
		targets = append(targets, t)
	}
	if onlyRel != "" && len(targets) == 0 {
		return nil, fmt.Errorf("-only %s names none of the files given", cfg.Only)
	}
	return targets, nil
}

// loadFaultTargets reads cfg.Faults and makes a target of each file its
// faults name, in the order of their first fault.
func loadFaultTargets(dir, root string, cfg Config) ([]*target, error) {
	if len(cfg.Files) > 0 || cfg.Only != "" || cfg.N > 0 {
		return nil, errors.New("-faults runs the faults it names: give no files, -only or -n with it")
	}
	path := cfg.Faults
	if !filepath.IsAbs(path) {
		path = filepath.Join(dir, path)
	}
	r, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	faults, err := parseFaults(r, cfg.Faults)
	if err != nil {
		return nil, err
	}
	var targets []*target
	byRel := make(map[string]*target)
	for _, f := range faults {
		abs, rel, err := resolveFile(root, root, f.File)
		if err != nil {
			return nil, fmt.Errorf("fault %q (line %d): %w", f.Name, f.Line, err)
		}
		t := byRel[rel]
		if t == nil {
			src, err := os.ReadFile(abs)
			if err != nil {
				return nil, err
			}
			t = &target{abs: abs, rel: rel, src: src}
			t.counts.File = rel
			byRel[rel] = t
			targets = append(targets, t)
		}
		m, err := f.mutant(rel, t.src)
		if err != nil {
			return nil, err
		}
		t.mutants = append(t.mutants, m)
	}
	return targets, nil
}

// resolveFile checks that name is a non-test Go file of the module rooted
// at root, and returns its absolute path and its path relative to root.
func resolveFile(dir, root, name string) (abs, rel string, err error) {
	abs = name
	if !filepath.IsAbs(abs) {
		abs = filepath.Join(dir, name)
	}
	if !strings.HasSuffix(abs, ".go") || strings.HasSuffix(abs, "_test.go") {
		return "", "", fmt.Errorf("%s: not a non-test Go file", name)
	}
	rel, err = filepath.Rel(root, abs)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", "", fmt.Errorf("%s is outside the module in %s", name, root)
	}
	return abs, filepath.ToSlash(rel), nil
}

// findTests sets the test packages of every target: -pkgs if given, the
// file's package and its importers otherwise.
func findTests(ctx context.Context, g *goTool, cfg Config, targets []*target) error {
	if len(cfg.Pkgs) > 0 {
		for _, t := range targets {
			t.tests = cfg.Pkgs
		}
		return nil
	}
	pkgs, err := g.listPackages(ctx, cfg.Tags)
	if err != nil {
		return interrupted(ctx, err)
	}
	for _, t := range targets {
		goPath, tests, err := testsFor(pkgs, t.abs, cfg.Tags)
		if err != nil {
			return err
		}
		t.abs, t.tests = goPath, tests
	}
	return nil
}

// runMutants runs the mutants of every target, jobs at a time, reporting
// each as it finishes. It stops at the first error (the go command could
// not run, or ctx ended).
func runMutants(ctx context.Context, g *goTool, opts testOptions, jobs int, targets []*target, out *lockedWriter) error {
	type job struct {
		t *target
		m Mutant
	}
	var todo []job
	for _, t := range targets {
		for _, m := range t.mutants {
			if m.Equivalent {
				t.counts.add(Equivalent)
				out.printf("%s\n", reportLine(Equivalent, m, ""))
				continue
			}
			todo = append(todo, job{t, m})
		}
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var mu sync.Mutex // guards the counts
	queue := make(chan job)
	var wg sync.WaitGroup
	for range jobs {
		wg.Go(func() {
			for j := range queue {
				status, detail, err := tryMutant(ctx, g, opts, j.t, j.m)
				if err != nil {
					cancel(err)
					return
				}
				mu.Lock()
				j.t.counts.add(status)
				mu.Unlock()
				out.printf("%s\n", reportLine(status, j.m, detail))
			}
		})
	}
feed:
	for _, j := range todo {
		select {
		case queue <- j:
		case <-ctx.Done():
			break feed
		}
	}
	close(queue)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return interrupted(ctx, err)
	}
	return nil
}

// tryMutant plants m in a copy of the target's file, runs its tests and
// judges the mutant.
func tryMutant(ctx context.Context, g *goTool, opts testOptions, t *target, m Mutant) (Status, string, error) {
	if err := ctx.Err(); err != nil {
		return 0, "", context.Cause(ctx)
	}
	dir, err := os.MkdirTemp(g.tmp, "m-")
	if err != nil {
		return 0, "", err
	}
	defer os.RemoveAll(dir)
	overlay, err := writeOverlay(dir, t.abs, m.Apply(t.src))
	if err != nil {
		return 0, "", err
	}
	r, err := testInStages(ctx, g, opts, overlay, t.tests)
	if err != nil {
		return 0, "", err
	}
	r.output = renameCopy(r.output, dir, t.abs, t.rel)
	status, detail := classify(r)
	return status, detail, nil
}

// testInStages runs the tests of the first package of pkgs (the file's own,
// when it has tests) and those of the rest only if they all pass: one
// failing test is enough to catch a mutant, and the importers' tests (am's
// take minutes) are most of what a caught mutant would otherwise cost.
func testInStages(ctx context.Context, g *goTool, opts testOptions, overlay string, pkgs []string) (testRun, error) {
	if len(pkgs) > 1 {
		r, err := g.test(ctx, opts, overlay, pkgs[:1])
		if err != nil || !r.passed {
			return r, err
		}
		pkgs = pkgs[1:]
	}
	return g.test(ctx, opts, overlay, pkgs)
}

// renameCopy replaces, in go test's output, the path of the mutated copy
// of a file (in dir) with the file's own name: compiler errors name the
// copy, by a path relative to the package, which means nothing to a reader.
func renameCopy(output, dir, file, rel string) string {
	copyName := filepath.Join(filepath.Base(dir), filepath.Base(file))
	return regexp.MustCompile(`\S*`+regexp.QuoteMeta(copyName)).ReplaceAllLiteralString(output, rel)
}

// interrupted turns the error of a cancelled run into a plain statement.
func interrupted(ctx context.Context, err error) error {
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return errors.New("interrupted")
	}
	return err
}

// reportLine is the line that reports one mutant's verdict.
func reportLine(s Status, m Mutant, detail string) string {
	line := fmt.Sprintf("%-10s %s  %s", s, m.Pos(), m.Change())
	if detail != "" {
		line += "  (" + detail + ")"
	}
	return line
}

// listMutants prints the selected mutants without running them.
func listMutants(out *lockedWriter, targets []*target) {
	n, equiv, width := 0, 0, 0
	for _, t := range targets {
		for _, m := range t.mutants {
			width = max(width, len(m.Pos()))
		}
	}
	for _, t := range targets {
		for _, m := range t.mutants {
			note := ""
			if m.Equivalent {
				note = "  (documented equivalent)"
				equiv++
			}
			n++
			out.printf("%-*s  %-10s  %s%s\n", width, m.Pos(), m.Op, m.Change(), note)
		}
	}
	out.printf("%d mutants, %d of them documented equivalent\n", n, equiv)
}

func summarize(targets []*target) *Summary {
	sum := &Summary{}
	for _, t := range targets {
		sum.Files = append(sum.Files, t.counts)
		c := t.counts.Counts
		sum.Total.Caught += c.Caught
		sum.Total.Survived += c.Survived
		sum.Total.NotBuilt += c.NotBuilt
		sum.Total.Equivalent += c.Equivalent
	}
	return sum
}

// printSummary prints the counts per file and in total, as a table.
func printSummary(out *lockedWriter, sum *Summary) {
	out.mu.Lock()
	defer out.mu.Unlock()
	tw := tabwriter.NewWriter(out.w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(out.w)
	fmt.Fprintln(tw, "file\trun\tcaught\tsurvived\tnot built\tdocumented equivalent\tscore")
	row := func(name string, c Counts) {
		score := "n/a"
		if s, ok := c.Score(); ok {
			score = fmt.Sprintf("%.1f%%", s)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\n", name, c.Ran(), c.Caught, c.Survived, c.NotBuilt, c.Equivalent, score)
	}
	for _, f := range sum.Files {
		row(f.File, f.Counts)
	}
	row("total", sum.Total)
	tw.Flush()
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// lockedWriter serializes the report lines of concurrent mutants.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, format, args...)
}
