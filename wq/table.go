package wq

import "sync/atomic"

// Table maps the device's keys (local keys, QP handles) to objects for the
// hot paths. Keys below directKeys (QEMU's lkeys are MR handles from 0)
// index an array; others go to an open-addressed array indexed by a
// multiplicative hash of the key, probed linearly. A lookup is one load of
// the current table and one index or, almost always, one probe, with no
// lock and no allocation.
//
// Writers (the control path) must be serialised by the caller. They update
// the arrays in place, each slot with atomic stores, so Set and Remove are
// amortized O(1): a hashed key keeps the slot it is first given until the
// array is rebuilt, Remove leaves it there mapping to nothing (a
// tombstone, taken again when the same key is set), and the array is
// rebuilt, at the size its live keys need, only when a new key would fill
// it past three eighths, tombstones included; the direct array is rebuilt
// only to grow. A rebuilt array is published whole (the other is shared,
// not copied); a reader still on the old table sees the replaced array's
// mappings as they were when it was replaced. So a lookup racing a writer
// returns the old or the new mapping of its key, never another key's.
type Table[T any] struct {
	t        atomic.Pointer[table[T]]
	n        atomic.Int64 // keys mapped
	rebuilds int          // arrays built (writers only; for tests)
	work     int          // entries those rebuilds visited (writers only; for tests)
}

// directKeys bounds the keys a Table indexes directly. Hashed keys are
// therefore never 0, which marks an empty slot.
const directKeys = 1024

// minSlots is the size of the first hashed array.
const minSlots = 16

type table[T any] struct {
	direct []atomic.Pointer[T] // by key, for keys < len(direct)
	slots  []slot[T]           // nil until the first hashed key
	mask   uint32
	shift  uint32 // 32 - log2(len(slots))
	used   int    // slots with a key, live or removed (writers only)
}

// slot is one hashed entry. Its key is stored after its value and never
// changes while the array is the table's, so a reader that sees the key
// reads a value set for it (or nil: removed).
type slot[T any] struct {
	key atomic.Uint32 // 0: empty
	val atomic.Pointer[T]
}

// home returns a key's first slot: Fibonacci hashing, so that keys that
// differ in their high bits (QPNs) spread as well as small ones (lkeys).
func (t *table[T]) home(k uint32) uint32 { return (k * 0x9E3779B9) >> t.shift }

// Lookup returns what k maps to, or nil.
func (t *Table[T]) Lookup(k uint32) *T { return t.t.Load().lookup(k) }

// lookup returns what k maps to in t (nil: an empty table), or nil.
func (t *table[T]) lookup(k uint32) *T {
	if t == nil {
		return nil
	}
	if k < uint32(len(t.direct)) {
		return t.direct[k].Load()
	}
	if k < directKeys || t.slots == nil {
		return nil
	}
	for i := t.home(k); ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		switch s.key.Load() {
		case k:
			return s.val.Load()
		case 0:
			return nil
		}
	}
}

// find returns the slot of hashed key k, or the empty slot that ends its
// probe sequence (key 0). Writers only: t.slots is not nil.
func (t *table[T]) find(k uint32) *slot[T] {
	for i := t.home(k); ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if key := s.key.Load(); key == k || key == 0 {
			return s
		}
	}
}

// Len returns the number of keys mapped.
func (t *Table[T]) Len() int { return int(t.n.Load()) }

// Set maps k to v; a nil v removes k.
func (t *Table[T]) Set(k uint32, v *T) {
	if v == nil {
		if old := t.Lookup(k); old != nil {
			t.Remove(k, old)
		}
		return
	}
	tb := t.t.Load()
	if k < directKeys {
		if tb == nil || k >= uint32(len(tb.direct)) {
			tb = t.rebuild(tb, int(k)+1, 0)
		}
		if tb.direct[k].Swap(v) == nil {
			t.n.Add(1)
		}
		return
	}
	if tb == nil || tb.slots == nil {
		tb = t.rebuild(tb, 0, 1)
	}
	s := tb.find(k)
	if s.key.Load() == k {
		if s.val.Swap(v) == nil {
			t.n.Add(1)
		}
		return
	}
	if 8*(tb.used+1) > 3*len(tb.slots) {
		tb = t.rebuild(tb, 0, 1)
		s = tb.find(k)
	}
	s.val.Store(v)
	s.key.Store(k) // publishes the slot: after its value
	tb.used++
	t.n.Add(1)
}

// Remove drops k if it still maps to v.
func (t *Table[T]) Remove(k uint32, v *T) {
	tb := t.t.Load()
	if tb == nil || v == nil {
		return
	}
	if k < directKeys {
		if k < uint32(len(tb.direct)) && tb.direct[k].CompareAndSwap(v, nil) {
			t.n.Add(-1)
		}
		return
	}
	if tb.slots == nil {
		return
	}
	if s := tb.find(k); s.key.Load() == k && s.val.CompareAndSwap(v, nil) {
		t.n.Add(-1) // the slot stays k's: a tombstone until the next rebuild
	}
}

// rebuild publishes a new table whose direct array has room for at least
// direct keys and whose hashed array holds the current live hashed keys
// and room for extra more (the key about to be set). The part that need
// not change is shared with the current table, not copied: both are
// updated in place.
func (t *Table[T]) rebuild(cur *table[T], direct, extra int) *table[T] {
	nt := &table[T]{}
	if cur != nil {
		*nt = table[T]{direct: cur.direct, slots: cur.slots, mask: cur.mask, shift: cur.shift, used: cur.used}
	}
	t.rebuilds++
	if direct > len(nt.direct) {
		// Doubling: the direct array grows at most log2(directKeys) times.
		size := min(max(direct, 2*len(nt.direct), minSlots), directKeys)
		d := make([]atomic.Pointer[T], size)
		for k := range nt.direct {
			d[k].Store(nt.direct[k].Load())
		}
		t.work += len(nt.direct)
		nt.direct = d
	}
	if extra > 0 {
		live := extra
		for i := range nt.slots {
			if nt.slots[i].val.Load() != nil {
				live++
			}
		}
		// At most a quarter full once rebuilt: probes stay short, and at
		// least an eighth of the array is set before the next rebuild.
		size, bitsN := uint32(minSlots), uint32(4)
		for int(size) < 4*live {
			size, bitsN = size*2, bitsN+1
		}
		old := nt.slots
		nt.slots, nt.mask, nt.shift, nt.used = make([]slot[T], size), size-1, 32-bitsN, 0
		for i := range old {
			k, v := old[i].key.Load(), old[i].val.Load()
			if k == 0 || v == nil {
				continue
			}
			s := nt.find(k)
			s.val.Store(v)
			s.key.Store(k)
			nt.used++
		}
		t.work += len(old) + int(size)
	}
	t.t.Store(nt)
	return nt
}
