package wq

import "sync/atomic"

// Table maps the device's keys (local keys, QP numbers) to objects for the
// hot paths. Keys below directKeys (QEMU's lkeys are MR handles from 0)
// index an array; others go to an open-addressed array indexed by a
// multiplicative hash of the key. A lookup is one load of the current
// table and one index or, almost always, one probe, with no lock and no
// allocation.
// Writers (the control path, a few times per object) build a new array
// and publish it; they must be serialised by the caller.
type Table[V comparable] struct {
	t atomic.Pointer[table[V]]
}

// directKeys bounds the keys a Table indexes directly.
const directKeys = 1024

type table[V comparable] struct {
	direct []V // by key, for keys < len(direct)
	slots  []entry[V]
	mask   uint32
	shift  uint32 // 32 - log2(len(slots))
	n      int
}

type entry[V comparable] struct {
	key  uint32
	full bool
	val  V
}

// home returns a key's first slot: Fibonacci hashing, so that keys that
// differ in their high bits (QPNs) spread as well as small ones (lkeys).
func (t *table[V]) home(k uint32) uint32 { return (k * 0x9E3779B9) >> t.shift }

// Lookup returns what k maps to, or the zero V.
func (t *Table[V]) Lookup(k uint32) V { return t.t.Load().lookup(k) }

// lookup returns what k maps to in t (nil: an empty table), or the zero V.
func (t *table[V]) lookup(k uint32) V {
	var zero V
	if t == nil {
		return zero
	}
	if k < uint32(len(t.direct)) {
		return t.direct[k]
	}
	for i := t.home(k); ; i = (i + 1) & t.mask {
		e := &t.slots[i]
		if !e.full {
			return zero
		}
		if e.key == k {
			return e.val
		}
	}
}

// Len returns the number of keys mapped.
func (t *Table[V]) Len() int {
	if tb := t.t.Load(); tb != nil {
		return tb.n
	}
	return 0
}

// Set maps k to v.
func (t *Table[V]) Set(k uint32, v V) {
	t.rebuild(func(key uint32, _ V) bool { return key != k }, &entry[V]{key: k, full: true, val: v})
}

// Remove drops k if it still maps to v.
func (t *Table[V]) Remove(k uint32, v V) {
	t.rebuild(func(key uint32, val V) bool { return key != k || val != v }, nil)
}

// rebuild publishes a new array with the current entries that keep
// accepts, plus add.
func (t *Table[V]) rebuild(keep func(uint32, V) bool, add *entry[V]) {
	var kept []entry[V]
	var zero V
	if cur := t.t.Load(); cur != nil {
		for k, v := range cur.direct {
			if v != zero && keep(uint32(k), v) {
				kept = append(kept, entry[V]{key: uint32(k), full: true, val: v})
			}
		}
		for _, e := range cur.slots {
			if e.full && keep(e.key, e.val) {
				kept = append(kept, e)
			}
		}
	}
	if add != nil {
		kept = append(kept, *add)
	}
	// At most a quarter full: probes stay short.
	size, bitsN := uint32(16), uint32(4)
	for int(size) < 4*len(kept) {
		size, bitsN = size*2, bitsN+1
	}
	nt := &table[V]{slots: make([]entry[V], size), mask: size - 1, shift: 32 - bitsN, n: len(kept)}
	for _, e := range kept {
		if e.key < directKeys {
			if int(e.key) >= len(nt.direct) {
				nt.direct = append(nt.direct, make([]V, int(e.key)+1-len(nt.direct))...)
			}
			nt.direct[e.key] = e.val
			continue
		}
		i := nt.home(e.key)
		for nt.slots[i].full {
			i = (i + 1) & nt.mask
		}
		nt.slots[i] = e
	}
	t.t.Store(nt)
}
