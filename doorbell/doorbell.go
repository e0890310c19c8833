package doorbell

import (
	"errors"
	"fmt"
)

// Register is where doorbells are written: the UAR page (BAR2) or a part of
// it. *mmio.Region satisfies it.
type Register interface {
	Store32(off int, v uint32) error
}

// Publisher makes the WQEs written to a ring visible to the device (one
// store of prod_tail). *rings.Producer satisfies it.
type Publisher interface {
	Publish()
}

// UAR doorbell offsets within a 4 KiB UAR page and their bits
// (vmw_pvrdma-abi.h). The low 24 bits of every doorbell value are the
// object's handle. QEMU decodes only the offset within the page, so every
// UAR page is equivalent.
const (
	OffsetQP  = 0x0 // QP doorbell: QPSend and/or QPRecv | QP handle
	OffsetCQ  = 0x4 // CQ doorbell: CQArm, CQArmSol, CQPoll | CQ handle
	OffsetSRQ = 0x8 // SRQ doorbell: SRQRecv | SRQ handle

	QPSend = 1 << 30 // the send queue has new WQEs
	QPRecv = 1 << 31 // the receive queue has new WQEs

	// CQ bits. QEMU 7.2 arms the CQ only when CQArm and CQArmSol are both
	// set; CQArm alone disarms it (facts sheet §7). CQPoll makes QEMU
	// harvest the backend CQ into the ring before the write returns.
	CQArmSol = 1 << 29
	CQArm    = 1 << 30
	CQPoll   = 1 << 31

	SRQRecv = 1 << 30 // the SRQ has new WQEs

	HandleMask = 0x00FFFFFF
)

// PageSize is the size of one UAR page.
const PageSize = 4096

// ErrInvalid reports a bad argument to NewQueue.
var ErrInvalid = errors.New("doorbell: invalid argument")

// Stats counts what a Queue did.
type Stats struct {
	// Posts counts posts that ended normally (Post calls), deferred or not.
	Posts uint64
	// WQEs counts WQEs handed to the device: published and followed by a
	// doorbell that was written.
	WQEs uint64
	// Doorbells counts doorbells written.
	Doorbells uint64
	// DeferredPosts counts the Posts that were deferred.
	DeferredPosts uint64
	// FailedPosts counts posts that failed inline (Fail calls).
	FailedPosts uint64
	// Rings counts Ring calls that wrote a doorbell.
	Rings uint64
}

// Queue is the doorbell of one work queue, with deferred posts: it counts
// the WQEs written but not yet handed to the device and writes one doorbell
// for all of them when a post without Defer ends, when a post fails, or on
// Ring. See the package documentation for the rules.
//
// A Queue is single-owner: it is not safe for concurrent use.
type Queue struct {
	reg     Register
	off     int
	val     uint32
	prod    Publisher
	pending int
	stats   Stats
}

// NewQueue returns the Queue that writes value at offset of reg after
// publishing prod. offset is OffsetQP or OffsetSRQ (plus a multiple of
// PageSize, to use another UAR page); value is the doorbell bits (a non-empty
// subset of QPSend|QPRecv for a QP, SRQRecv for an SRQ) OR'ed with the
// handle, which must fit HandleMask. CQ doorbells carry no WQEs: write them
// with Ring.
func NewQueue(reg Register, offset int, value uint32, prod Publisher) (*Queue, error) {
	if reg == nil || prod == nil {
		return nil, fmt.Errorf("%w: nil register or publisher", ErrInvalid)
	}
	if offset < 0 || offset%4 != 0 {
		return nil, fmt.Errorf("%w: doorbell offset %#x", ErrInvalid, offset)
	}
	bits := value &^ HandleMask
	switch offset % PageSize {
	case OffsetQP:
		if bits == 0 || bits&^(QPSend|QPRecv) != 0 {
			return nil, fmt.Errorf("%w: QP doorbell value %#x: want QPSend and/or QPRecv | a 24-bit handle", ErrInvalid, value)
		}
	case OffsetSRQ:
		if bits != SRQRecv {
			return nil, fmt.Errorf("%w: SRQ doorbell value %#x: want SRQRecv | a 24-bit handle", ErrInvalid, value)
		}
	case OffsetCQ:
		return nil, fmt.Errorf("%w: the CQ doorbell (offset %#x) is not a work queue's: use Ring", ErrInvalid, offset)
	default:
		return nil, fmt.Errorf("%w: doorbell offset %#x is none of QP, SRQ", ErrInvalid, offset)
	}
	return &Queue{reg: reg, off: offset, val: value, prod: prod}, nil
}

// Added records that n WQEs were written to the ring (not yet published).
// A negative n panics.
func (q *Queue) Added(n int) {
	if n < 0 {
		panic("doorbell: Queue.Added with a negative count")
	}
	q.pending += n
}

// Post records the end of a post that succeeded. A deferred post does
// nothing more. A post without Defer hands everything pending to the device:
// Publish, then one doorbell; with nothing pending it writes nothing. The
// error is the doorbell store's; the WQEs then stay pending (published, but
// the device was not told), and the next ring retries.
func (q *Queue) Post(deferred bool) error {
	q.stats.Posts++
	if deferred {
		q.stats.DeferredPosts++
		return nil
	}
	_, err := q.ring()
	return err
}

// Fail records a post that failed inline. Its own WQE was never written (do
// not count it with Added), but everything pending, deferred earlier or
// written by this call before it failed, is handed to the device: Publish,
// then one doorbell. With nothing pending it writes nothing.
func (q *Queue) Fail() error {
	q.stats.FailedPosts++
	_, err := q.ring()
	return err
}

// Ring hands everything pending to the device (Publish, then one
// doorbell), if anything is pending: it ends a chain of deferred posts.
func (q *Queue) Ring() error {
	rang, err := q.ring()
	if rang {
		q.stats.Rings++
	}
	return err
}

// ring publishes and writes the doorbell if anything is pending, and
// reports whether it wrote one.
func (q *Queue) ring() (bool, error) {
	if q.pending == 0 {
		return false, nil
	}
	q.prod.Publish() // bodies are ordered before the index by the Publisher
	if err := q.reg.Store32(q.off, q.val); err != nil {
		return false, err
	}
	q.stats.Doorbells++
	q.stats.WQEs += uint64(q.pending)
	q.pending = 0
	return true, nil
}

// Pending returns how many WQEs were written and not yet handed to the
// device.
func (q *Queue) Pending() int { return q.pending }

// Reset forgets the pending WQEs, for a work queue whose ring was reset
// (QP back to RESET, rings.Producer.Reset). Stats are kept.
func (q *Queue) Reset() { q.pending = 0 }

// Stats returns the counters.
func (q *Queue) Stats() Stats { return q.stats }

// Offset returns the doorbell offset the Queue writes.
func (q *Queue) Offset() int { return q.off }

// Value returns the doorbell value the Queue writes.
func (q *Queue) Value() uint32 { return q.val }

// Ring writes one doorbell value at offset now and returns the store's
// error. CQ arm and poll use it: Ring(uar, OffsetCQ, CQPoll|handle).
func Ring(reg Register, offset int, value uint32) error {
	return reg.Store32(offset, value)
}
