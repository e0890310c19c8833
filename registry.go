package vfrdma

import (
	"fmt"
	"sync/atomic"

	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/vfio"
	"github.com/vfrdma/vfrdma/wq"
)

func (d *Device) addMR(mr *MR) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	mr.region = wq.Region{PD: mr.pd.handle, Addr: mr.addr, Len: uint64(len(mr.mem)), Access: uint32(mr.access)}
	d.lkeys.Set(mr.lkey, &mr.region)
	d.mrs[mr] = struct{}{}
	return nil
}

func (d *Device) removeMR(mr *MR) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lkeys.Remove(mr.lkey, &mr.region)
	delete(d.mrs, mr)
}

// The QP table (d.qpns) is keyed by QP handle, the number the device
// writes in a CQE's qp field (and in a QP event's info): below interface
// version 20 the handle is the QPN; from 20 on it is a handle of its own,
// distinct from the QPN that peers and WC.QPN see (realdevice.md §1.3).

// qpHandleMask returns the bits of a QP handle the table keys by: at
// version 20 and later the low 16, the bits Linux and rdma-core read from
// the CQE (the upper ones are defined by no source); before, all of them
// (the handle is the QPN, of up to 24 bits on QEMU's backends).
func (d *Device) qpHandleMask() uint32 {
	if d.version >= firmware.VersionQPHandle {
		return 0xFFFF
	}
	return ^uint32(0)
}

// qpByHandle returns the QP whose handle the device named (a CQE's qp
// field, a QP event's info), or nil. A destroyed QP leaves its handle
// (retireQPN) as soon as its CQEs are rekeyed; until then it may still be
// the answer: check its state under qp.mu.
func (d *Device) qpByHandle(h uint32) *QP { return d.qpns.Lookup(h & d.qpHandleMask()) }

func (d *Device) addQP(qp *QP) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	qp.key = qp.handle & d.qpHandleMask()
	if other := d.qpns.Lookup(qp.key); other != nil {
		return fmt.Errorf("%w: the device gave QP %d handle %#x, which QP %d (handle %#x) has", ErrDeviceFault, qp.qpn, qp.handle, other.qpn, other.handle)
	}
	d.qpns.Set(qp.key, qp)
	d.qps[qp] = struct{}{}
	return nil
}

// removeQP forgets an open QP (its Close).
func (d *Device) removeQP(qp *QP) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.qps, qp)
}

// forgetQPN drops a destroyed QP from the QP table once nothing of it is
// left to complete.
func (d *Device) forgetQPN(qp *QP) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.qpns.Remove(qp.key, qp)
	if qp.alias != 0 {
		d.qpns.Remove(qp.alias, qp)
	}
}

// firstAlias is the first key retireQPN gives: QP handles have 24 bits.
const firstAlias = 1 << 24

// aliasTag marks, in the upper half of a CQE's qp field, a CQE the driver
// rekeyed to an alias (rekey): the lower half is then the alias, looked
// up whole, where the device's handle is masked (qpHandleMask).
const aliasTag = 0x76667264 // "vfrd"

// retireQPN moves a QP the device has destroyed off its handle, which the
// device may give the next QP it creates: the CQEs of the QP still in its
// CQs are rekeyed to an alias only the driver uses, the table maps that
// alias to the QP, and the handle is freed. A CQE the device wrote for the
// handle after that is not the destroyed QP's: the device writes none for
// a QP once its DESTROY_QP has completed. Called once per QP, with qp.mu
// held.
func (d *Device) retireQPN(qp *QP) {
	d.mu.Lock()
	d.aliasSeq++
	qp.alias = firstAlias + d.aliasSeq%(1<<32-firstAlias)
	d.qpns.Set(qp.alias, qp)
	d.mu.Unlock()
	qp.sendCQ.rekey(qp.key, qp.alias)
	if qp.recvCQ != qp.sendCQ {
		qp.recvCQ.rekey(qp.key, qp.alias)
	}
	d.mu.Lock()
	d.qpns.Remove(qp.key, qp)
	d.mu.Unlock()
}

// freeRing releases a ring object's memory (buf is nil in the host tests,
// whose onFree poisons mem instead). The object's gate is shut: no call
// touches mem any more.
func (d *Device) freeRing(buf *vfio.DMABuffer, mem ...[]byte) error {
	if d.onFree != nil {
		for _, m := range mem {
			d.onFree(m)
		}
	}
	if buf == nil {
		return nil
	}
	return buf.Close()
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
