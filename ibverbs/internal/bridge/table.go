package bridge

import (
	"sync"
	"sync/atomic"
)

// table maps the ids the C structures hold to bridge objects. Lookups
// (the data path's) take no lock and allocate nothing: they read a
// snapshot that Put and Delete replace. Id 0 is never used, so a zeroed C
// structure names nothing.
type table[T any] struct {
	mu   sync.Mutex
	snap atomic.Pointer[[]*T]
	free []uint32
}

// put stores v and returns its id.
func (t *table[T]) put(v *T) uint32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var cur []*T
	if p := t.snap.Load(); p != nil {
		cur = *p
	}
	next := make([]*T, len(cur), max(len(cur), 1)+1)
	copy(next, cur)
	var id uint32
	if n := len(t.free); n > 0 {
		id, t.free = t.free[n-1], t.free[:n-1]
	} else {
		if len(next) == 0 {
			next = append(next, nil) // id 0
		}
		id = uint32(len(next))
		next = append(next, nil)
	}
	next[id] = v
	t.snap.Store(&next)
	return id
}

// get returns the object of id, or nil.
func (t *table[T]) get(id uint32) *T {
	p := t.snap.Load()
	if p == nil || int(id) >= len(*p) {
		return nil
	}
	return (*p)[id]
}

// del forgets id.
func (t *table[T]) del(id uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.snap.Load()
	if p == nil || id == 0 || int(id) >= len(*p) || (*p)[id] == nil {
		return
	}
	next := make([]*T, len(*p))
	copy(next, *p)
	next[id] = nil
	t.snap.Store(&next)
	t.free = append(t.free, id)
}

// each calls f for every object.
func (t *table[T]) each(f func(id uint32, v *T)) {
	p := t.snap.Load()
	if p == nil {
		return
	}
	for id, v := range *p {
		if v != nil {
			f(uint32(id), v)
		}
	}
}
