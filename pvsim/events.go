package pvsim

import (
	"fmt"

	fw "github.com/vfrdma/vfrdma/firmware"
)

// raise writes an async event (type, info) into the async-event ring and
// raises vector 1 (facts sheet §10). QEMU raises none. An event that
// finds the ring full, or no DSR loaded, is dropped and counted (what the
// real device does then is not known).
func (d *Device) raise(t fw.EventType, info uint32) {
	if d.s.qemu {
		return
	}
	w := &d.w
	if len(w.events) >= maxLog {
		w.events = append(w.events[:0], w.events[len(w.events)-maxLog/2:]...)
	}
	w.events = append(w.events, fw.AsyncEvent{Type: t, Info: info})
	if !w.dsrLoaded {
		d.ctr.eventsDropped.Add(1)
		return
	}
	err := d.put(&w.async, func(b []byte) {
		le.PutUint32(b[0:], uint32(t))
		le.PutUint32(b[4:], info)
	})
	if err != nil {
		d.ctr.eventsDropped.Add(1)
		return
	}
	d.ctr.events.Add(1)
	d.interrupt(vecAsync)
}

// maxLog bounds the event and hazard logs (the oldest go first).
const maxLog = 4096

// Raise writes an async event into the ring and raises vector 1, as the
// device does: for QP events info is the QP handle, for CQ and SRQ events
// their handle, for port events the port number (1). QEMU 7.2 raises no
// events: in QEMU mode Raise returns ErrNotSupported.
func (d *Device) Raise(t fw.EventType, info uint32) error {
	if d.s.qemu {
		return fmt.Errorf("%s: async event %v: QEMU 7.2 raises none: %w", d.s.Name, t, ErrNotSupported)
	}
	return d.call(func() { d.raise(t, info) })
}

// SetPort takes the port down or up. Down, QUERY_PORT reports DOWN and no
// packet leaves or enters the device (RC requests time out); a VMware
// device raises PORT_ERR. Up, it raises PORT_ACTIVE. (Linux also makes
// these events itself from the paired vmxnet3's link.)
func (d *Device) SetPort(up bool) error {
	return d.call(func() {
		if d.w.portUp == up {
			return
		}
		d.w.portUp = up
		if up {
			d.raise(fw.EventPortActive, 1)
		} else {
			d.raise(fw.EventPortErr, 1)
		}
	})
}

// Fatal makes the device fail for good, as a VMware device does when it
// raises DEVICE_FATAL (info 0): it raises the event, then executes no
// command (REQUEST reads back ERR = -EIO), takes no doorbell and moves no
// data, until a CTL RESET [what a real device does after DEVICE_FATAL is
// not known; Linux only passes the event on]. QEMU has no such event:
// Fatal returns ErrNotSupported in QEMU mode.
func (d *Device) Fatal() error {
	if d.s.qemu {
		return fmt.Errorf("%s: device fatal: QEMU 7.2 has none: %w", d.s.Name, ErrNotSupported)
	}
	return d.call(func() {
		d.raise(fw.EventDeviceFatal, 0)
		d.fatal.Store(true)
	})
}

// OverflowCQ makes CQ h overflow now: a VMware device raises CQ_ERR and
// its CQ takes no more CQEs (as when its ring fills); on QEMU the CQ
// drops every later CQE silently ("CQ is full").
func (d *Device) OverflowCQ(h uint32) error {
	var err error
	if cerr := d.call(func() {
		c := d.w.cqs[h]
		if c == nil {
			err = fmt.Errorf("%s: no CQ %d", d.s.Name, h)
			return
		}
		c.overflowed = true
		d.ctr.cqOverflows.Add(1)
		d.raise(fw.EventCQErr, h)
	}); cerr != nil {
		return cerr
	}
	return err
}

// ErrorQP moves QP h to ERR as the device does when the QP fails on its
// own (a fatal error in its transport): its work requests are flushed and,
// on a VMware device, QP_FATAL is raised (QEMU: the backend QP fails, no
// event).
func (d *Device) ErrorQP(h uint32) error {
	var err error
	if cerr := d.call(func() {
		q := d.w.qps[h]
		if q == nil {
			err = fmt.Errorf("%s: no QP with handle %d", d.s.Name, h)
			return
		}
		d.qpEvent(q, fw.EventQPFatal)
		d.qpError(q)
	}); cerr != nil {
		return cerr
	}
	return err
}
