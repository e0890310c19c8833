package wq

import (
	"maps"
	"sync/atomic"
)

// Table maps the device's small keys (local keys, QP numbers) to objects
// for the hot paths: readers load the current map without a lock and
// without allocating; writers (the control path) copy it, and must be
// serialised by the caller.
type Table[V comparable] struct {
	m atomic.Pointer[map[uint32]V]
}

// Lookup returns what k maps to, or the zero V.
func (t *Table[V]) Lookup(k uint32) V {
	if m := t.m.Load(); m != nil {
		return (*m)[k]
	}
	var zero V
	return zero
}

// Set maps k to v.
func (t *Table[V]) Set(k uint32, v V) {
	next := map[uint32]V{}
	if cur := t.m.Load(); cur != nil {
		next = maps.Clone(*cur)
	}
	next[k] = v
	t.m.Store(&next)
}

// Remove drops k if it still maps to v.
func (t *Table[V]) Remove(k uint32, v V) {
	if cur := t.m.Load(); cur != nil && (*cur)[k] == v {
		next := maps.Clone(*cur)
		delete(next, k)
		t.m.Store(&next)
	}
}
