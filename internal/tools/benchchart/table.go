package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// Columns are a results file's columns, in order: its header line names
// them so.
var Columns = []string{"figure", "unit", "size", "stack", "batch", "median", "min", "max", "runs"}

// Row is one figure of a results file: the median of Runs runs of one
// configuration, with their range (Min and Max are NaN where the file has
// "-": a single run, or a figure recorded without its range).
type Row struct {
	Figure string // rate, lat, mean, db (sidebyside); rt, rate, mbs (amside)
	Unit   string // msg/s, µs, doorbells/msg, MB/s
	Size   int    // message size, bytes
	Stack  string // the stack and its mode, as the table's row or column names it
	Batch  int    // messages per doorbell; 0 where the figure has none
	Median float64
	Min    float64
	Max    float64
	Runs   int
}

// Table is a results file: what a bench script measured, and where.
type Table struct {
	Bench   string // the script: sidebyside, amside
	Date    string // when it was measured (UTC)
	Commit  string // the tree it was measured on
	Command string // the command that measured it
	Note    string // what else a reader must know (the load, the source)
	Rows    []Row
}

// ErrFormat is what a results file that is not one wraps.
var ErrFormat = errors.New("not a bench results file")

// ReadTable parses a results file: "# key: value" lines (bench, date,
// commit, command, note), the header line of Columns, then one Row a
// line, tab-separated.
func ReadTable(r io.Reader) (*Table, error) {
	t := &Table{}
	sc := bufio.NewScanner(r)
	header := false
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			continue
		}
		if rest, ok := strings.CutPrefix(line, "#"); ok {
			key, val, _ := strings.Cut(rest, ":")
			val = strings.TrimSpace(val)
			switch strings.TrimSpace(key) {
			case "bench":
				t.Bench = val
			case "date":
				t.Date = val
			case "commit":
				t.Commit = val
			case "command":
				t.Command = val
			case "note":
				t.Note = val
			}
			continue
		}
		f := strings.Split(line, "\t")
		if !header {
			if strings.Join(f, "\t") != strings.Join(Columns, "\t") {
				return nil, fmt.Errorf("line %d: the header is %q, want the columns %q: %w", n, line, strings.Join(Columns, " "), ErrFormat)
			}
			header = true
			continue
		}
		row, err := parseRow(f)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		t.Rows = append(t.Rows, row)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the results: %w", err)
	}
	if !header {
		return nil, fmt.Errorf("no header line (%s): %w", strings.Join(Columns, " "), ErrFormat)
	}
	if t.Bench == "" {
		return nil, fmt.Errorf(`no "# bench:" line naming the script: %w`, ErrFormat)
	}
	return t, nil
}

func parseRow(f []string) (Row, error) {
	if len(f) != len(Columns) {
		return Row{}, fmt.Errorf("%d fields, want %d (%s): %w", len(f), len(Columns), strings.Join(Columns, " "), ErrFormat)
	}
	r := Row{Figure: f[0], Unit: f[1], Stack: f[3]}
	var err error
	num := func(col int, s string) float64 {
		if err != nil {
			return 0
		}
		if s == "-" {
			return math.NaN()
		}
		v, e := strconv.ParseFloat(s, 64)
		if e != nil || math.IsInf(v, 0) || math.IsNaN(v) {
			err = fmt.Errorf("%s %q is not a number: %w", Columns[col], s, ErrFormat)
		}
		return v
	}
	integer := func(col int, s string) int {
		if err != nil {
			return 0
		}
		if s == "" || s == "-" {
			return 0
		}
		v, e := strconv.Atoi(s)
		if e != nil || v < 0 {
			err = fmt.Errorf("%s %q is not a count: %w", Columns[col], s, ErrFormat)
		}
		return v
	}
	r.Size = integer(2, f[2])
	r.Batch = integer(4, f[4])
	r.Median = num(5, f[5])
	r.Min = num(6, f[6])
	r.Max = num(7, f[7])
	r.Runs = integer(8, f[8])
	if err == nil && math.IsNaN(r.Median) {
		err = fmt.Errorf("a row with no median: %w", ErrFormat)
	}
	if err == nil && (r.Figure == "" || r.Stack == "") {
		err = fmt.Errorf("a row with no figure or stack: %w", ErrFormat)
	}
	return r, err
}

// SizeName is a message size as the tables write it: 64 B, 4 KiB, 1 MiB.
func SizeName(b int) string {
	switch {
	case b >= 1<<20 && b%(1<<20) == 0:
		return strconv.Itoa(b>>20) + " MiB"
	case b >= 1<<10 && b%(1<<10) == 0:
		return strconv.Itoa(b>>10) + " KiB"
	}
	return strconv.Itoa(b) + " B"
}
