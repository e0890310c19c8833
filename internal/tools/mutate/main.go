// Command mutate is this module's mutation tester. It plants single-point
// faults (mutants) in Go source files, one at a time, runs the tests that
// ought to notice each one, and reports the mutants that no test caught: a
// survivor points at behaviour the tests do not pin down.
//
// Run it from anywhere in the repository through the wrapper, which runs it
// from the repository root (file names are relative to the root):
//
//	scripts/mutate.sh am/send.go               # every mutant of one file
//	scripts/mutate.sh -j 2 am/send.go am/recv.go
//	scripts/mutate.sh -n 20 -seed 7 am/send.go # a reproducible sample of 20
//	scripts/mutate.sh -list am/send.go         # show the mutants, run nothing
//	scripts/mutate.sh -only am/send.go:88      # re-check one line after a fix
//
// Flags:
//
//	-j N          run N mutants at once (default 1)
//	-n N          run a random sample of N mutants per file (default 0: all)
//	-seed S       the sample's seed (default 1); the same seed, the same sample
//	-only F:L     run only the mutants on line L of file F
//	-list         print the mutants (file:line:col, operator, before → after)
//	-pkgs ./a,./b the packages whose tests run, instead of the default
//	-run REGEXP   passed to go test -run
//	-timeout D    passed to go test -timeout (default 10m: am's tests, the soak and the
//	              64-task loss-free job among them, take minutes)
//	-tags T       passed to go list and go test -tags (default none: the host tests)
//	-min P        exit 1 if the score is below P percent
//	-faults FILE  run the hand-written faults in FILE instead (see below)
//	-equivalents FILE
//	              the equivalent mutants (default internal/tools/mutate/equivalent.txt)
//
// # Mutants
//
// Each mutant replaces one token or statement, found by walking the file's
// syntax tree, and leaves every other byte of the file as it was:
//
//   - comparison: < ↔ <=, > ↔ >=, == ↔ !=;
//   - logical: && ↔ ||, and if c → if !(c) (not for == and !=, whose
//     comparison mutant is already that negation);
//   - arithmetic: binary + ↔ -, += ↔ -=, ++ ↔ --; a + with a string literal
//     operand is left alone, and a string concatenation that is not
//     recognisable without type information fails to build;
//   - remove: a call statement, or a store to a field, an element, a pointee
//     or a package-level variable (x.f = v becomes _ = v, so the right side
//     is still evaluated and its variables still used; x.n++ is deleted);
//   - err-return: the condition of if err != nil { ... return ..., err }
//     becomes false, as if the check had been forgotten;
//   - bool: true ↔ false; int: an integer literal n → n+1, only in a
//     comparison or as an index or slice bound, where off-by-one faults live.
//
// The methods String, Error, GoString and Format only format values for
// people, and are not mutated.
//
// # How a mutant is judged
//
// The working tree is never written. Each mutant's source goes to a
// temporary directory, with an overlay file that makes go test -overlay
// compile it in place of the original; the go command's own work files go
// there too (GOTMPDIR), and all of it is removed at the end, ^C included.
// So mutants can run in parallel, and beside other work in the tree.
//
// The tests that run are those of the file's package and of every package
// of the module that imports it directly (from its code or its tests), as
// go list ./... reports them, with go test -count=1 -vet=off -failfast. They
// are run once without any mutant first; if they fail, the run stops, since
// against red tests every mutant would look caught. For a mutant, the file's
// own package's tests run first and the importers' only if those pass: one
// failing test is enough.
//
// A mutant is caught when go test fails: a test fails, panics or times out,
// or a test binary dies. It survived when every test passed. It is not
// built when it does not compile (a removed call was the only use of a
// variable, say): it proves nothing and is not counted. The score is
// caught / (caught + survived).
//
// # Equivalent mutants
//
// Some mutants cannot change behaviour: i < n and i <= n are the same loop
// when i only ever equals n after the last step, say. Such a mutant is
// named in the tool's own file, internal/tools/mutate/equivalent.txt, not
// in the code it mutates: one block per mutant, with why no test can tell
// it apart,
//
//	file:   am/wire.go
//	func:   (*header).decode
//	code:   if len(b) >= hdrLen {
//	change: >= → >
//	why:    b is never shorter than hdrLen here
//
// and the mutants named are listed as "equivalent" without being run, and
// left out of the score. A block names one mutant by its package, the
// declaration around it, a piece of the code around it and its change,
// not by line number, so it holds while code moves; Mark says the form. Before it runs,
// the tool reports the blocks of the packages it mutates that name no
// mutant any more (stale), several, or one in another file, and the
// package's tests check every block against the module.
//
// # Hand-written faults
//
// Generated mutants change one token; the faults people make are often
// larger (a branch taken in the wrong order, a limit checked against the
// wrong field). -faults FILE runs such faults, written apart from the
// tests, and judges each like a mutant. FILE holds one block per fault:
//
//	## flush-before-device
//	file: cq.go
//	<<<<
//	the exact text in cq.go (it must occur there once)
//	====
//	the text that replaces it
//	>>>>
//
// Lines outside blocks are notes and are ignored.
//
// # Output and exit status
//
// One line per mutant as it finishes (caught, SURVIVED, not built,
// equivalent), naming the first failing test, then a table per file and in
// total. The exit status is 0 unless the tool itself failed (2) or -min was
// given and the score is below it (1).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	cfg, min, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mutate:", err)
		os.Exit(2)
	}
	// On ^C or SIGTERM the context ends: the running go commands are
	// killed and run removes its temporary files before returning. So it
	// does when the reader of the report goes away (mutate ... | head):
	// left alone, SIGPIPE would kill the tool on its next line, temporary
	// files and all.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGPIPE)
	sum, err := run(ctx, cfg, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "mutate:", err)
		os.Exit(2)
	}
	if min > 0 {
		if score, ok := sum.Total.Score(); ok && score < min {
			fmt.Fprintf(os.Stderr, "mutate: score %.1f%% is below -min %g%%\n", score, min)
			os.Exit(1)
		}
	}
}

// parseFlags parses the command line into a Config and the -min score.
func parseFlags(args []string, stderr io.Writer) (Config, float64, error) {
	fs := flag.NewFlagSet("mutate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: mutate [flags] FILE...\n\nPlants mutants in each Go FILE, runs the tests that should catch them, reports the survivors.\nFlags:")
		fs.PrintDefaults()
	}
	var cfg Config
	var pkgs string
	var min float64
	fs.IntVar(&cfg.Jobs, "j", 1, "run `N` mutants at once")
	fs.IntVar(&cfg.N, "n", 0, "run a random sample of `N` mutants per file (0: all)")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the -n sample")
	fs.StringVar(&cfg.Only, "only", "", "run only the mutants on `file:line`")
	fs.BoolVar(&cfg.List, "list", false, "print the mutants without running them")
	fs.StringVar(&pkgs, "pkgs", "", "comma-separated `packages` whose tests run (default: the file's package and its importers)")
	fs.StringVar(&cfg.Run, "run", "", "passed to go test -run")
	fs.DurationVar(&cfg.Timeout, "timeout", 10*time.Minute, "passed to go test -timeout")
	fs.StringVar(&cfg.Tags, "tags", "", "build tags passed to go list and go test")
	fs.StringVar(&cfg.Faults, "faults", "", "run the hand-written faults in `FILE` instead of generated mutants")
	fs.StringVar(&cfg.Marks, "equivalents", "", "the equivalent mutants' `FILE` (default "+defaultMarks+" under the module root)")
	fs.Float64Var(&min, "min", 0, "exit 1 if the score is below `P` percent")
	if err := fs.Parse(args); err != nil {
		return Config{}, 0, err
	}
	cfg.Files = fs.Args()
	for p := range strings.SplitSeq(pkgs, ",") {
		if p = strings.TrimSpace(p); p != "" {
			cfg.Pkgs = append(cfg.Pkgs, p)
		}
	}
	if len(cfg.Files) == 0 && cfg.Only == "" && cfg.Faults == "" {
		fs.Usage()
		return Config{}, 0, errors.New("no files given")
	}
	return cfg, min, nil
}
