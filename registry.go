package vfrdma

import (
	"maps"
	"sync/atomic"
)

// lkeyTable maps local keys to MRs for the post path: readers load the
// current map without a lock and without allocating; writers (MR register
// and deregister, control path) copy it under the device mutex.
type lkeyTable struct {
	m atomic.Pointer[map[uint32]*MR]
}

func (t *lkeyTable) lookup(lkey uint32) *MR {
	if m := t.m.Load(); m != nil {
		return (*m)[lkey]
	}
	return nil
}

func (d *Device) addMR(mr *MR) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	next := map[uint32]*MR{}
	if cur := d.lkeys.m.Load(); cur != nil {
		next = maps.Clone(*cur)
	}
	next[mr.lkey] = mr
	d.lkeys.m.Store(&next)
	d.mrs[mr] = struct{}{}
	return nil
}

func (d *Device) removeMR(mr *MR) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if cur := d.lkeys.m.Load(); cur != nil && (*cur)[mr.lkey] == mr {
		next := maps.Clone(*cur)
		delete(next, mr.lkey)
		d.lkeys.m.Store(&next)
	}
	delete(d.mrs, mr)
}

// qpTable maps QPNs to QPs for the poll path, like lkeyTable. A destroyed
// QP stays until its flush completions are drained, so that completions the
// device wrote before the destroy still find their QP.
type qpTable struct {
	m atomic.Pointer[map[uint32]*QP]
}

func (t *qpTable) lookup(qpn uint32) *QP {
	if m := t.m.Load(); m != nil {
		return (*m)[qpn]
	}
	return nil
}

func (d *Device) addQP(qp *QP) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	next := map[uint32]*QP{}
	if cur := d.qpns.m.Load(); cur != nil {
		next = maps.Clone(*cur)
	}
	next[qp.qpn] = qp
	d.qpns.m.Store(&next)
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
	if cur := d.qpns.m.Load(); cur != nil && (*cur)[qp.qpn] == qp {
		next := maps.Clone(*cur)
		delete(next, qp.qpn)
		d.qpns.m.Store(&next)
	}
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
