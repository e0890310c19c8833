package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strings"
)

// OpFault marks a hand-written fault: a change a person wrote, read from a
// -faults file, rather than one the generator made.
const OpFault Op = "fault"

// A Fault is one hand-written fault: in File, the text Old (which must
// occur exactly once) replaced by New.
type Fault struct {
	Name string // short, unique in its file: what the fault breaks
	File string // relative to the module root
	Old  string
	New  string
	Line int // where the fault starts in the faults file, for messages
}

// The faults file holds one block per fault:
//
//	## NAME
//	file: path/relative/to/root.go
//	<<<<
//	text as it is in the file (exactly once there)
//	====
//	the text that replaces it
//	>>>>
//
// Lines outside blocks (notes, blank lines) are ignored, so a sample can
// say why each fault was chosen. The markers stand alone on their lines;
// the text between them is taken whole, newlines included, except the
// newline before the closing marker.
const (
	faultHead  = "## "
	faultFile  = "file: "
	faultOld   = "<<<<"
	faultSplit = "===="
	faultEnd   = ">>>>"
)

// parseFaults reads a faults file.
func parseFaults(r io.Reader, name string) ([]Fault, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var (
		faults []Fault
		cur    *Fault
		part   *[]string // the text being collected: old or new
		old    []string
		nw     []string
		n      int
	)
	seen := make(map[string]bool)
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%s:%d: %s", name, n, fmt.Sprintf(format, args...))
	}
	for sc.Scan() {
		n++
		line := sc.Text()
		switch {
		case part != nil && line == faultSplit && part == &old:
			part = &nw
		case part != nil && line == faultEnd:
			if part != &nw {
				return nil, fail("%q before %q", faultEnd, faultSplit)
			}
			cur.Old, cur.New = strings.Join(old, "\n"), strings.Join(nw, "\n")
			if cur.Old == "" {
				return nil, fail("fault %q replaces nothing", cur.Name)
			}
			if cur.Old == cur.New {
				return nil, fail("fault %q changes nothing", cur.Name)
			}
			faults = append(faults, *cur)
			cur, part, old, nw = nil, nil, nil, nil
		case part != nil:
			*part = append(*part, line)
		case strings.HasPrefix(line, faultHead):
			if cur != nil {
				return nil, fail("fault %q has no %q block", cur.Name, faultOld)
			}
			cur = &Fault{Name: strings.TrimSpace(strings.TrimPrefix(line, faultHead)), Line: n}
			if cur.Name == "" {
				return nil, fail("a fault without a name")
			}
		case strings.HasPrefix(line, faultFile) && cur != nil:
			cur.File = strings.TrimSpace(strings.TrimPrefix(line, faultFile))
		case line == faultOld:
			if cur == nil || cur.File == "" {
				return nil, fail("%q outside a fault with a %q line", faultOld, strings.TrimSpace(faultFile))
			}
			key := cur.File + "\x00" + cur.Name
			if seen[key] {
				return nil, fail("fault %q named twice for %s", cur.Name, cur.File)
			}
			seen[key] = true
			part = &old
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if cur != nil {
		return nil, fail("fault %q is not closed with %q", cur.Name, faultEnd)
	}
	if len(faults) == 0 {
		return nil, fmt.Errorf("%s: no faults", name)
	}
	return faults, nil
}

// mutant turns a fault into the Mutant that plants it in src, the file's
// source; the fault's text must occur there exactly once.
func (f Fault) mutant(rel string, src []byte) (Mutant, error) {
	i := bytes.Index(src, []byte(f.Old))
	if i < 0 {
		return Mutant{}, fmt.Errorf("fault %q (line %d): its text is not in %s", f.Name, f.Line, rel)
	}
	if bytes.Contains(src[i+1:], []byte(f.Old)) {
		return Mutant{}, fmt.Errorf("fault %q (line %d): its text is in %s more than once; give more of it", f.Name, f.Line, rel)
	}
	line := 1 + bytes.Count(src[:i], []byte("\n"))
	col := i - bytes.LastIndexByte(src[:i], '\n')
	return Mutant{File: rel, Line: line, Col: col, Start: i, End: i + len(f.Old), Op: OpFault, Before: f.Old, After: f.New, Name: f.Name}, nil
}
