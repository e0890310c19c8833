package main

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strconv"
	"strings"
)

// A lineRef is the file:line of the -only flag.
type lineRef struct {
	file string // as given; resolved like a FILE argument
	line int
}

// parseLineRef parses "file:line".
func parseLineRef(s string) (lineRef, error) {
	i := strings.LastIndexByte(s, ':')
	if i <= 0 {
		return lineRef{}, fmt.Errorf("-only %q: want file:line", s)
	}
	line, err := strconv.Atoi(s[i+1:])
	if err != nil || line < 1 {
		return lineRef{}, fmt.Errorf("-only %q: want file:line with a line number from 1", s)
	}
	return lineRef{file: s[:i], line: line}, nil
}

// selectMutants returns the mutants of one file to run or list, in source
// order. With line > 0 only the mutants on that line are kept. With n > 0
// a random sample of n of the runnable mutants is kept; the sample depends
// only on seed and the file's name, so a run can be repeated exactly.
// Documented equivalents are always kept: they cost nothing and the
// summary counts them.
func selectMutants(ms []Mutant, line, n int, seed uint64) []Mutant {
	if line > 0 {
		var on []Mutant
		for _, m := range ms {
			if m.Line == line {
				on = append(on, m)
			}
		}
		ms = on
	}
	var runnable []int
	for i, m := range ms {
		if !m.Equivalent {
			runnable = append(runnable, i)
		}
	}
	if n <= 0 || len(runnable) <= n {
		return ms
	}
	rng := rand.New(rand.NewPCG(seed, fileHash(ms[0].File)))
	rng.Shuffle(len(runnable), func(i, j int) { runnable[i], runnable[j] = runnable[j], runnable[i] })
	keep := make(map[int]bool, n)
	for _, i := range runnable[:n] {
		keep[i] = true
	}
	var out []Mutant
	for i, m := range ms {
		if m.Equivalent || keep[i] {
			out = append(out, m)
		}
	}
	return out
}

// fileHash gives each file its own random stream, so that the sample of
// one file does not change when other files are added to the command line.
func fileHash(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64()
}
