package pvsim

import (
	"fmt"

	"github.com/vfrdma/vfrdma/vfio"
)

// The UAR page (BAR2): doorbell writes, queued for the device goroutine
// and decoded there into send and receive work, CQ arms and polls.

// uarView is the first UAR page of BAR2 as a Function maps it.
type uarView struct{ f *Function }

// Store32 writes a doorbell (facts sheet §7: QP at 0x0, CQ at 0x4, SRQ at
// 0x8; the handle in bits 23..0). It queues the work for the device
// goroutine and returns at once; the device reads the rings afterwards.
// Other offsets are ignored, as QEMU does.
func (u uarView) Store32(off int, v uint32) error {
	if err := u.f.check(); err != nil {
		return err
	}
	if off < 0 || off > pageSize-4 || off%4 != 0 {
		return fmt.Errorf("pvsim: doorbell offset %#x (want 0..%#x, 4-byte aligned): %w", off, pageSize-4, vfio.ErrRange)
	}
	d := u.f.d
	d.ctr.doorbells.Add(1)
	if !d.push(event{kind: evDoorbell, off: off, val: v}) {
		return fmt.Errorf("%s: %w", d.s.Name, ErrClosed)
	}
	return nil
}

// Doorbell bits (vmw_pvrdma-abi.h).
const (
	dbHandleMask = 0x00FFFFFF
	dbQPSend     = 1 << 30
	dbQPRecv     = 1 << 31
	dbCQArmSol   = 1 << 29
	dbCQArm      = 1 << 30
	dbCQPoll     = 1 << 31
	dbSRQRecv    = 1 << 30
)

// doorbell acts on a doorbell write, on the device goroutine.
func (d *Device) doorbell(off int, v uint32) {
	if d.fatal.Load() {
		return
	}
	h := v & dbHandleMask
	w := &d.w
	switch off % pageSize {
	case 0x0:
		q := w.qps[h]
		if q == nil {
			d.ctr.badDoorbells.Add(1)
			return
		}
		if v&dbQPSend != 0 {
			d.ctr.sqDoorbells.Add(1)
			d.pumpSQ(q)
		}
		if v&dbQPRecv != 0 {
			d.ctr.rqDoorbells.Add(1)
			d.postedRecv(q)
		}
	case 0x4:
		c := w.cqs[h]
		if c == nil {
			d.ctr.badDoorbells.Add(1)
			return
		}
		if v&dbCQPoll != 0 {
			// QEMU harvests its backend CQ here; the model writes CQEs as
			// they happen, so there is nothing to harvest.
			d.ctr.cqPolls.Add(1)
			if d.s.qemu {
				d.pollBesideArm(h)
			}
		}
		d.armCQ(c, v)
	case 0x8:
		s := w.srqs[h]
		if s == nil {
			d.ctr.badDoorbells.Add(1)
			return
		}
		if v&dbSRQRecv != 0 {
			d.ctr.srqDoorbells.Add(1)
			d.postedSRQ(s)
		}
	default:
		d.ctr.badDoorbells.Add(1)
	}
}

// pollBesideArm records the hazard of a POLL doorbell (on CQ h) while a
// CQ of the device is armed: QEMU 7.2 takes its RDMA backend's lock for
// the POLL inside the MMIO write, under the big lock, while its
// completion thread holds the backend's lock as it raises an armed CQ's
// interrupt, which wants the big lock: the VM can deadlock.
func (d *Device) pollBesideArm(h uint32) {
	for _, c := range d.w.cqs {
		if c.arm != armNone {
			d.hazard("POLL doorbell on CQ %d while CQ %d is armed: QEMU 7.2 can deadlock (its POLL takes the backend's lock under the big lock; its completion thread raises the armed CQ's interrupt holding the backend's lock)", h, c.handle)
			return
		}
	}
}

// armCQ arms a CQ from its doorbell bits. QEMU 7.2: ARM sets the CQ armed
// if ARM_SOL is set too and disarms it otherwise; ARM_SOL alone does
// nothing; there is no solicited-only filtering (facts sheet §7). A
// VMware device arms as the verbs do: ARM for the next completion,
// ARM_SOL for the next solicited (or error) one [inference: the bits'
// names and Linux's use of them].
func (d *Device) armCQ(c *cq, v uint32) {
	if v&(dbCQArm|dbCQArmSol) != 0 {
		d.ctr.cqArms.Add(1)
	}
	if d.s.qemu {
		if v&dbCQArm != 0 {
			if v&dbCQArmSol != 0 {
				c.arm = armNext
			} else {
				c.arm = armNone
			}
		}
	} else {
		switch {
		case v&dbCQArm != 0:
			c.arm = armNext
		case v&dbCQArmSol != 0 && c.arm != armNext:
			c.arm = armSolicited
		}
	}
	// The model takes doorbells after the write returns, so CQEs written
	// between the driver's last look at the ring and the arm taking effect
	// would wake nobody (QEMU arms inside the MMIO write, and the driver's
	// look after arming sees them). An arm that finds CQEs the driver has
	// not consumed fires at once, as hardware that compares the consumer
	// index at arm time does [model choice; the real device's rule is not
	// known]. A driver sees at worst an interrupt with nothing new.
	if c.arm != armNone {
		if prod, cons, err := d.counters(c.ring.state); err == nil && prod != cons {
			c.arm = armNone
			if d.notifyCQ(c.handle) {
				d.interrupt(vecCQ)
			}
		}
	}
}
