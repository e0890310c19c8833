package firmware

import (
	"fmt"
)

// Ring-state layout (pvrdma_ring.h): two 32-bit counters, prod_tail then
// cons_head; a state page holds two such states, at 0 and at 8. The device
// rings of the DSR use the one at 8.
const (
	ringStateOffset = 8
	prodTailOffset  = 0
	consHeadOffset  = 4
)

// Element sizes of the DSR's device rings.
const (
	AsyncEventSize = 8 // type u32, info u32
	CQNotifySize   = 4 // CQ handle u32
)

// deviceRing is the consumer side of a ring the device produces into. The
// counters run over 0..2N-1 (N slots, a power of two); the bit worth N is
// the wrap bit: empty when prod_tail == cons_head, full when they differ by
// exactly N.
type deviceRing struct {
	name  string
	state Regs
	pages [][]byte
	elem  uint32
	n     uint32 // slots
	head  uint32 // cons_head; only this side writes it
}

func newDeviceRing(name string, state Regs, data [][]byte, elem uint32) (deviceRing, error) {
	where := name
	if state == nil {
		return deviceRing{}, invalid(where, "state", 0, "a ring-state page")
	}
	if !isPow2(uint64(len(data))) || len(data) > MaxDeviceRingPages-1 {
		return deviceRing{}, invalid(where, "data pages", uint64(len(data)), fmt.Sprintf("a power of two, 1..%d", MaxDeviceRingPages-1))
	}
	for i, p := range data {
		if len(p) < PageSize {
			return deviceRing{}, invalid(where, fmt.Sprintf("len(data[%d])", i), uint64(len(p)), fmt.Sprintf(">= %d", PageSize))
		}
	}
	r := deviceRing{name: name, state: state, pages: data, elem: elem, n: uint32(len(data)) * PageSize / elem}
	// The device never initialises the counters: start both at zero.
	if err := state.Store32(ringStateOffset+prodTailOffset, 0); err != nil {
		return deviceRing{}, fmt.Errorf("%s: zeroing prod_tail: %w", name, err)
	}
	if err := state.Store32(ringStateOffset+consHeadOffset, 0); err != nil {
		return deviceRing{}, fmt.Errorf("%s: zeroing cons_head: %w", name, err)
	}
	return r, nil
}

// ready returns how many elements the device has published past cons_head,
// after validating prod_tail.
func (r *deviceRing) ready() (uint32, error) {
	tail, err := r.state.Load32(ringStateOffset + prodTailOffset)
	if err != nil {
		return 0, fmt.Errorf("%s: reading prod_tail: %w", r.name, err)
	}
	mask := 2*r.n - 1
	if tail&^mask != 0 {
		return 0, fault(r.name, "prod_tail", uint64(tail), fmt.Sprintf("< %d (2 x %d slots)", 2*r.n, r.n))
	}
	used := (tail - r.head) & mask
	if used > r.n {
		return 0, fault(r.name, "prod_tail", uint64(tail), fmt.Sprintf("at most %d ahead of cons_head %d", r.n, r.head))
	}
	return used, nil
}

// elemAt returns the bytes of the element i places past cons_head.
func (r *deviceRing) elemAt(i uint32) []byte {
	off := ((r.head + i) & (r.n - 1)) * r.elem
	p := r.pages[off/PageSize]
	o := off % PageSize
	return p[o : o+r.elem]
}

// consume advances cons_head by k and publishes it to the device.
func (r *deviceRing) consume(k uint32) error {
	if k == 0 {
		return nil
	}
	r.head = (r.head + k) & (2*r.n - 1)
	if err := r.state.Store32(ringStateOffset+consHeadOffset, r.head); err != nil {
		return fmt.Errorf("%s: writing cons_head: %w", r.name, err)
	}
	return nil
}

// EventType is an async event code (pvrdma_eqe_type; 1:1 with the verbs
// event types).
type EventType uint32

// Async event types. The info field carries the handle or port named.
const (
	EventCQErr            EventType = 0  // CQ handle
	EventQPFatal          EventType = 1  // QP handle
	EventQPReqErr         EventType = 2  // QP handle
	EventQPAccessErr      EventType = 3  // QP handle
	EventCommEst          EventType = 4  // QP handle
	EventSQDrained        EventType = 5  // QP handle
	EventPathMig          EventType = 6  // QP handle
	EventPathMigErr       EventType = 7  // QP handle
	EventDeviceFatal      EventType = 8  // -
	EventPortActive       EventType = 9  // port number
	EventPortErr          EventType = 10 // port number
	EventLIDChange        EventType = 11 // port number
	EventPKeyChange       EventType = 12 // port number
	EventSMChange         EventType = 13 // port number
	EventSRQErr           EventType = 14 // SRQ handle
	EventSRQLimitReached  EventType = 15 // SRQ handle
	EventQPLastWQEReached EventType = 16 // QP handle
	EventClientReregister EventType = 17 // port number
	EventGIDChange        EventType = 18 // port number
)

var eventNames = [...]string{
	"CQ_ERR", "QP_FATAL", "QP_REQ_ERR", "QP_ACCESS_ERR", "COMM_EST",
	"SQ_DRAINED", "PATH_MIG", "PATH_MIG_ERR", "DEVICE_FATAL", "PORT_ACTIVE",
	"PORT_ERR", "LID_CHANGE", "PKEY_CHANGE", "SM_CHANGE", "SRQ_ERR",
	"SRQ_LIMIT_REACHED", "QP_LAST_WQE_REACHED", "CLIENT_REREGISTER",
	"GID_CHANGE",
}

func (t EventType) String() string {
	if int(t) < len(eventNames) {
		return eventNames[t]
	}
	return fmt.Sprintf("EVENT_%d", uint32(t))
}

// AsyncEvent is one element of the async-event ring.
type AsyncEvent struct {
	Type EventType
	Info uint32 // a QP, CQ or SRQ handle or a port number, by Type
}

// AsyncRing consumes the DSR's async-event ring (8-byte elements, MSI-X
// vector 1). QEMU 7.2 never writes it (Quirks.NoAsyncEvents). An AsyncRing is
// single-owner: one goroutine polls it.
type AsyncRing struct {
	r deviceRing
}

// NewAsyncRing returns the consumer of an async-event ring whose state page
// is accessed through state (an mmio.Region over the page works) and whose
// data pages are data, in page-directory order; their count must be a power
// of two. It zeroes the ring counters, so call it before the DSR is loaded.
func NewAsyncRing(state Regs, data [][]byte) (*AsyncRing, error) {
	r, err := newDeviceRing("async ring", state, data, AsyncEventSize)
	if err != nil {
		return nil, err
	}
	return &AsyncRing{r: r}, nil
}

// Slots returns the ring's element count.
func (a *AsyncRing) Slots() int { return int(a.r.n) }

// Poll moves up to len(evs) pending events into evs, consumes them, and
// returns how many it moved. Unknown event types are returned as they are.
// A producer index out of range is an error wrapping ErrDeviceFault and
// consumes nothing. Poll does not allocate.
func (a *AsyncRing) Poll(evs []AsyncEvent) (int, error) {
	avail, err := a.r.ready()
	if err != nil {
		return 0, err
	}
	n := min(avail, uint32(min(len(evs), int(a.r.n))))
	for i := range n {
		e := a.r.elemAt(i)
		evs[i] = AsyncEvent{Type: EventType(le.Uint32(e[0:])), Info: le.Uint32(e[4:])}
	}
	return int(n), a.r.consume(n)
}

// Pending returns how many events the device has written past cons_head,
// without consuming them: with the count of events consumed so far, the
// position in the device's sequence of events that the next one will
// take. A producer index out of range is an error wrapping
// ErrDeviceFault. Pending and Poll are for one owner at a time: a caller
// that reads Pending beside the goroutine that polls serializes the two.
func (a *AsyncRing) Pending() (int, error) {
	n, err := a.r.ready()
	return int(n), err
}

// CQNotifyRing consumes the DSR's CQ-notification ring (4-byte elements,
// each a CQ handle, MSI-X vector 2). QEMU 7.2 adds an element for every CQE
// whether or not the CQ is armed, and stops notifying once the ring is full,
// so a polling driver should drain it too. A CQNotifyRing is single-owner.
type CQNotifyRing struct {
	r deviceRing
}

// NewCQNotifyRing is NewAsyncRing for the CQ-notification ring.
func NewCQNotifyRing(state Regs, data [][]byte) (*CQNotifyRing, error) {
	r, err := newDeviceRing("CQ notification ring", state, data, CQNotifySize)
	if err != nil {
		return nil, err
	}
	return &CQNotifyRing{r: r}, nil
}

// Slots returns the ring's element count.
func (c *CQNotifyRing) Slots() int { return int(c.r.n) }

// Pending returns how many handles wait in the ring, without consuming
// them. It is for the goroutine that polls.
func (c *CQNotifyRing) Pending() (int, error) {
	n, err := c.r.ready()
	return int(n), err
}

// Poll moves up to len(cqs) pending CQ handles into cqs, consumes them, and
// returns how many it moved. A producer index out of range consumes nothing;
// a handle above HandleMask is consumed and dropped, and Poll returns the
// handles before it with an error; both errors wrap ErrDeviceFault. Poll
// does not allocate.
func (c *CQNotifyRing) Poll(cqs []uint32) (int, error) {
	avail, err := c.r.ready()
	if err != nil {
		return 0, err
	}
	n := min(avail, uint32(min(len(cqs), int(c.r.n))))
	for i := range n {
		h := le.Uint32(c.r.elemAt(i))
		if h > HandleMask {
			if err := c.r.consume(i + 1); err != nil {
				return int(i), err
			}
			return int(i), fault(c.r.name, "info", uint64(h), "a CQ handle <= 0xffffff")
		}
		cqs[i] = h
	}
	return int(n), c.r.consume(n)
}
