// Command benchchart draws the charts of make bench's results as SVG:
// from a results file that scripts/sidebyside.sh or scripts/amside.sh
// wrote (TSV=FILE), the side-by-side's message rate by stack and batch
// and one-way latency by stack, or am beside UCX's round trip and message
// rate by size. Each bar is a configuration's median, its whisker the
// range of its runs; the caption names the date, the commit and the
// command of the measurement. The charts are drawn from the same numbers
// the scripts print as tables.
//
//	go run ./internal/tools/benchchart -o DIR RESULTS.tsv...
//
// writes DIR/<results>-<chart>.svg for each file (sidebyside.tsv gives
// sidebyside-rate.svg and sidebyside-latency.svg; amside.tsv
// amside-roundtrip.svg and amside-rate.svg) and prints their paths.
//
// A results file is tab-separated: "# key: value" lines (bench: the
// script; date, commit, command, note), a header line naming the columns
// figure, unit, size, stack, batch, median, min, max, runs, then a row per
// figure ("-" for a min or max not known).
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "benchchart:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("benchchart", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", ".", "the directory the charts are written to")
	format := fs.String("format", "svg", "svg, or png for a look where no SVG viewer is at hand")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("no results file given (benchchart -o DIR RESULTS.tsv ...)")
	}
	for _, name := range fs.Args() {
		files, err := Draw(name, *out, *format)
		if err != nil {
			return err
		}
		for _, f := range files {
			fmt.Fprintln(stdout, f)
		}
	}
	return nil
}

// Draw reads the results file name and writes its charts into dir in the
// format (svg, png), returning their paths; a file with none of the figures a chart draws
// is an error (its script wrote nothing the charts can show).
func Draw(name, dir, format string) ([]string, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("opening the results: %w", err)
	}
	defer f.Close()
	t, err := ReadTable(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	base := strings.TrimSuffix(filepath.Base(name), filepath.Ext(name))
	var files []string
	for _, s := range Specs {
		c := s.Build(t)
		if c == nil {
			continue
		}
		path := filepath.Join(dir, base+"-"+s.Name+"."+format)
		if err := writeFile(path, func(w io.Writer) error { return c.Write(w, t, format) }); err != nil {
			return nil, err
		}
		files = append(files, path)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: no figure any chart of bench %q draws (a sidebyside file has rate or lat rows, an amside file rt or rate): %w", name, t.Bench, ErrFormat)
	}
	return files, nil
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("creating the chart: %w", err)
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
