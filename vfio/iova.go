package vfio

import (
	"fmt"
	"slices"
)

// IOVARange is a range of I/O virtual addresses; End is inclusive, as the
// kernel reports them.
type IOVARange struct {
	Start, End uint64
}

// span is a half-open range [start, end).
type span struct{ start, end uint64 }

// iovaAllocator hands out aligned IOVA ranges first-fit from a window. It
// is not safe for concurrent use (the Container locks around it).
type iovaAllocator struct {
	page   uint64
	window []span      // the whole window, for validating frees
	free   []span      // sorted, disjoint, non-adjacent
	valid  []IOVARange // set by restrict: free space stays inside these
}

// Default IOVA window: see the package documentation.
const (
	defaultIOVABase  = 1 << 20
	defaultIOVALimit = 1 << 32
	msiWindowStart   = 0xfee00000
	msiWindowEnd     = 0xfeefffff
)

// newIOVAAllocator builds the window [base, limit) ∩ valid, page-aligned
// inward. An empty valid list means the kernel reported none: then
// everything but the x86 MSI window is taken as valid.
func newIOVAAllocator(valid []IOVARange, base, limit, page uint64) *iovaAllocator {
	if len(valid) == 0 {
		valid = []IOVARange{{0, msiWindowStart - 1}, {msiWindowEnd + 1, ^uint64(0)}}
	}
	a := &iovaAllocator{page: page}
	if limit == 0 || base >= limit {
		return a
	}
	for _, r := range valid {
		lo := max(r.Start, base)
		hi := min(r.End, limit-1) // inclusive; limit-1 < 2^64-1, so hi+1 cannot overflow
		if r.End < r.Start || lo > hi {
			continue
		}
		s := span{alignUp(lo, page), alignDown(hi+1, page)}
		if s.start < s.end && s.start >= lo {
			a.free = append(a.free, s)
		}
	}
	slices.SortFunc(a.free, func(x, y span) int {
		switch {
		case x.start < y.start:
			return -1
		case x.start > y.start:
			return 1
		}
		return 0
	})
	// Merge overlapping or adjacent ranges (the kernel's are disjoint, but
	// do not rely on it).
	out := a.free[:0]
	for _, s := range a.free {
		if n := len(out); n > 0 && s.start <= out[n-1].end {
			out[n-1].end = max(out[n-1].end, s.end)
			continue
		}
		out = append(out, s)
	}
	a.free = out
	a.window = slices.Clone(out)
	return a
}

func alignUp(v, a uint64) uint64 {
	r := (v + a - 1) &^ (a - 1)
	if r < v {
		return ^uint64(0) &^ (a - 1) // saturate; callers compare against end
	}
	return r
}

func alignDown(v, a uint64) uint64 { return v &^ (a - 1) }

// alloc returns the lowest IOVA aligned to align (a power of two, at least
// the page size) with size bytes free after it.
func (a *iovaAllocator) alloc(size, align uint64) (uint64, bool) {
	if size == 0 || size%a.page != 0 {
		return 0, false
	}
	align = max(align, a.page)
	for i, s := range a.free {
		start := alignUp(s.start, align)
		if start < s.start || start >= s.end || s.end-start < size {
			continue
		}
		end := start + size
		var repl []span
		if start > s.start {
			repl = append(repl, span{s.start, start})
		}
		if end < s.end {
			repl = append(repl, span{end, s.end})
		}
		a.free = slices.Replace(a.free, i, i+1, repl...)
		return start, true
	}
	return 0, false
}

// release returns [start, start+size) to the free list. It fails if the
// range is not inside the window or overlaps free space (a double free).
func (a *iovaAllocator) release(start, size uint64) error {
	end := start + size
	if size == 0 || end < start || start%a.page != 0 || size%a.page != 0 {
		return fmt.Errorf("%w: IOVA range %#x+%#x is not page aligned", ErrAlignment, start, size)
	}
	inWindow := false
	for _, w := range a.window {
		if start >= w.start && end <= w.end {
			inWindow = true
			break
		}
	}
	if !inWindow {
		return fmt.Errorf("%w: IOVA range %#x+%#x was not allocated here", ErrRange, start, size)
	}
	i, _ := slices.BinarySearchFunc(a.free, start, func(s span, v uint64) int {
		switch {
		case s.start < v:
			return -1
		case s.start > v:
			return 1
		}
		return 0
	})
	if (i > 0 && a.free[i-1].end > start) || (i < len(a.free) && a.free[i].start < end) {
		return fmt.Errorf("%w: IOVA range %#x+%#x is already free", ErrRange, start, size)
	}
	defer a.clip()
	mergePrev := i > 0 && a.free[i-1].end == start
	mergeNext := i < len(a.free) && a.free[i].start == end
	switch {
	case mergePrev && mergeNext:
		a.free[i-1].end = a.free[i].end
		a.free = slices.Delete(a.free, i, i+1)
	case mergePrev:
		a.free[i-1].end = end
	case mergeNext:
		a.free[i].start = start
	default:
		a.free = slices.Insert(a.free, i, span{start, end})
	}
	return nil
}

// restrict narrows the free space to valid (inclusive ends, page-aligned
// inward), as the kernel narrows an IOAS's usable ranges when a device is
// attached to it; what is handed out stays handed out, and a later release
// returns only the part inside valid.
func (a *iovaAllocator) restrict(valid []IOVARange) {
	a.valid = slices.Clone(valid)
	a.clip()
}

// clip intersects the free list with a.valid (when set).
func (a *iovaAllocator) clip() {
	if a.valid == nil {
		return
	}
	var out []span
	for _, s := range a.free {
		for _, r := range a.valid {
			if r.End < r.Start {
				continue
			}
			lo := max(s.start, alignUp(r.Start, a.page))
			hi := s.end
			if r.End != ^uint64(0) {
				hi = min(hi, alignDown(r.End+1, a.page))
			}
			if lo < hi {
				out = append(out, span{lo, hi})
			}
		}
	}
	slices.SortFunc(out, func(x, y span) int {
		switch {
		case x.start < y.start:
			return -1
		case x.start > y.start:
			return 1
		}
		return 0
	})
	merged := out[:0]
	for _, s := range out {
		if n := len(merged); n > 0 && s.start <= merged[n-1].end {
			merged[n-1].end = max(merged[n-1].end, s.end)
			continue
		}
		merged = append(merged, s)
	}
	a.free = merged
}

// freeBytes returns the free space left, for tests and diagnostics.
func (a *iovaAllocator) freeBytes() uint64 {
	var n uint64
	for _, s := range a.free {
		n += s.end - s.start
	}
	return n
}
