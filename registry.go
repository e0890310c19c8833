package vfrdma

import (
	"context"
	"fmt"

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

// cqByHandle and srqByHandle find a live object by its device handle
// (events are rare: a scan is enough; QPs have their table, qpByHandle).
// A CQ whose DESTROY has completed and which is still being taken out of
// the table may share its handle with a newer one: the newer one is the
// answer.
func (d *Device) cqByHandle(h uint32) *CQ {
	d.mu.Lock()
	defer d.mu.Unlock()
	var shut *CQ
	for cq := range d.cqs {
		if cq.handle == h {
			if !cq.gate.IsShut() {
				return cq
			}
			shut = cq
		}
	}
	return shut
}

func (d *Device) srqByHandle(h uint32) *SRQ {
	d.mu.Lock()
	defer d.mu.Unlock()
	for s := range d.srqs {
		if s.handle == h {
			return s
		}
	}
	return nil
}

// A QP handle passes from a destroyed QP (old) to the next QP the device
// gives it (new) in this order:
//
//  1. old's Close marks it leaving (QP.leaving, under d.mu), then sends
//     DESTROY_QP. The device gives the handle to another QP only once
//     that command has completed, and from then on writes no CQE naming
//     it for old.
//  2. retireQPN maps old's alias, rekeys the CQEs of old its CQs still
//     hold (with each CQ's gate held: a Poll inside it, which looks CQEs
//     up by handle, finishes first and finds old), and only then takes
//     old off the handle and closes leaving.
//  3. new's CreateQP, answered with the handle any time after 1, finds
//     old still on it in addQP and waits for leaving to close: new takes
//     the handle only once no CQE of old names it. new has no CQE before
//     it is in the table (nothing is posted on it yet), so a CQE naming
//     the handle is old's before 3 and new's after: a Poll never finds
//     the wrong QP, and old's completions are polled as old's, by alias,
//     exactly once.
//
// new cannot take the handle before 2 is done, old moving to its alias in
// the table alone: a CQE of old not yet rekeyed (a Poll holding old's CQ,
// in a callback or not yet done with its batch, delays the rekey) would
// find new. The wait lasts the DESTROY_QP and the rekey, which waits out
// the Polls inside old's CQs (their callbacks must not block); the
// CreateQP's ctx bounds it.
//
// A handle whose QP is not leaving is the handle of a live QP: the device
// broke its contract (ErrDeviceFault). So is the handle of a QP whose
// DESTROY_QP the device refuses: leaving is cleared and a waiting addQP
// refuses it then. (Commands run one at a time: a CreateQP answered while
// old is leaving was answered before the DESTROY_QP was sent, a device
// fault, or after it completed. addQP tells the two apart only by the
// DESTROY_QP's outcome: a duplicate handed out just before a DESTROY_QP
// that then succeeds passes.)

// addQP puts a new QP in the QP table under its handle, once a QP
// leaving the handle has left it (see above).
func (d *Device) addQP(ctx context.Context, qp *QP) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	qp.key = qp.handle & d.qpHandleMask()
	for {
		if d.closed {
			return ErrClosed
		}
		other := d.qpns.Lookup(qp.key)
		if other == nil {
			break
		}
		left := other.leaving
		if left == nil {
			return fmt.Errorf("%w: the device gave QP %d handle %#x, which QP %d (handle %#x) has", ErrDeviceFault, qp.qpn, qp.handle, other.qpn, other.handle)
		}
		other.heirs++
		d.mu.Unlock()
		select {
		case <-left:
		case <-ctx.Done():
		}
		d.mu.Lock()
		other.heirs--
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("waiting for QP %d, being destroyed, to leave handle %#x: %w", other.qpn, qp.handle, err)
		}
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

// leaveQPN marks qp leaving its handle: its DESTROY_QP is about to be
// sent. A CreateQP given the handle meanwhile waits (addQP).
func (d *Device) leaveQPN(qp *QP) {
	d.mu.Lock()
	qp.leaving = make(chan struct{})
	d.mu.Unlock()
}

// keepQPN takes back leaveQPN: the device refused the DESTROY_QP, the QP
// is live on its handle.
func (d *Device) keepQPN(qp *QP) {
	d.mu.Lock()
	close(qp.leaving)
	qp.leaving = nil
	d.mu.Unlock()
}

// retireQPN moves a QP the device has destroyed off its handle, which the
// device may give the next QP it creates: the CQEs of the QP still in its
// CQs are rekeyed to an alias only the driver uses, the table maps that
// alias to the QP, and the handle is freed, for a CreateQP waiting for it
// too. A CQE the device wrote for the handle after that is not the
// destroyed QP's: the device writes none for a QP once its DESTROY_QP has
// completed. Called once per QP, with qp.mu held, after leaveQPN.
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
	close(qp.leaving)
	d.mu.Unlock()
}

// freeRing releases a ring object's memory (buf is nil in the host tests,
// whose onFree hook poisons mem instead). The object's gate is shut: no
// call touches mem any more.
func (d *Device) freeRing(buf *vfio.DMABuffer, mem ...[]byte) error {
	if h := d.hooks(); h != nil && h.onFree != nil {
		for _, m := range mem {
			h.onFree(m)
		}
	}
	if buf == nil {
		return nil
	}
	return buf.Close()
}
