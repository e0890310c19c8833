package vfrdma

import (
	"maps"
	"sync/atomic"
)

// cowTable maps device keys (lkeys, QPNs) to objects for the hot paths:
// readers load the current map without a lock and without allocating;
// writers (control path) copy it, under the device mutex.
type cowTable[V comparable] struct {
	m atomic.Pointer[map[uint32]V]
}

func (t *cowTable[V]) lookup(k uint32) V {
	if m := t.m.Load(); m != nil {
		return (*m)[k]
	}
	var zero V
	return zero
}

// set maps k to v; the caller holds the device mutex.
func (t *cowTable[V]) set(k uint32, v V) {
	next := map[uint32]V{}
	if cur := t.m.Load(); cur != nil {
		next = maps.Clone(*cur)
	}
	next[k] = v
	t.m.Store(&next)
}

// remove drops k if it still maps to v; the caller holds the device mutex.
func (t *cowTable[V]) remove(k uint32, v V) {
	if cur := t.m.Load(); cur != nil && (*cur)[k] == v {
		next := maps.Clone(*cur)
		delete(next, k)
		t.m.Store(&next)
	}
}

func (d *Device) addMR(mr *MR) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	d.lkeys.set(mr.lkey, mr)
	d.mrs[mr] = struct{}{}
	return nil
}

func (d *Device) removeMR(mr *MR) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lkeys.remove(mr.lkey, mr)
	delete(d.mrs, mr)
}

func (d *Device) addQP(qp *QP) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	d.qpns.set(qp.qpn, qp)
	d.qps[qp] = struct{}{}
	return nil
}

// removeQP forgets an open QP (its Close).
func (d *Device) removeQP(qp *QP) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.qps, qp)
}

// forgetQPN drops a destroyed QP from the QPN table once nothing of it is
// left to complete.
func (d *Device) forgetQPN(qp *QP) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.qpns.remove(qp.qpn, qp)
}

// gidBits marks the bound GID indices for the post path.
type gidBits [4]atomic.Uint64

func (g *gidBits) set(i uint32, on bool) {
	if i >= 256 {
		return
	}
	w, b := &g[i/64], uint64(1)<<(i%64)
	for {
		old := w.Load()
		nw := old &^ b
		if on {
			nw = old | b
		}
		if w.CompareAndSwap(old, nw) {
			return
		}
	}
}

func (g *gidBits) has(i int) bool {
	return i >= 0 && i < 256 && g[i/64].Load()&(1<<(i%64)) != 0
}

func (d *Device) gidBound(i int) bool { return d.gidSet.has(i) }
