package am

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/vfrdma/vfrdma"
)

// Amsend sends an active message to task tgt (LAPI_Amsend): the header
// handler at index handler runs there with uhdr on the first packet's
// arrival and says where data goes. It returns once the message is
// queued; data and uhdr must not change until cs.Org counts (or Fence
// returns). Bad arguments get their own error, with nothing sent.
func (c *Context) Amsend(tgt, handler int, uhdr, data []byte, cs Counters) error {
	if c.down.Load() {
		if err := c.usable(); err != nil {
			return err
		}
	}
	switch {
	case tgt < 0 || tgt >= c.cfg.Tasks:
		return fmt.Errorf("%w: task %d of %d", ErrTarget, tgt, c.cfg.Tasks)
	case len(data) > c.cfg.MaxMessage:
		return fmt.Errorf("%w: %d bytes, the maximum is %d", ErrDataLen, len(data), c.cfg.MaxMessage)
	case len(uhdr) > c.cfg.MaxUHdr || len(uhdr)%8 != 0:
		return fmt.Errorf("%w: %d bytes (a multiple of 8, at most %d)", ErrUHdrLen, len(uhdr), c.cfg.MaxUHdr)
	case handler < 0 || handler >= MaxHandlers || c.handlers[handler].Load() == nil:
		return fmt.Errorf("%w: %d (handlers are registered at the same index on every task)", ErrNoHandler, handler)
	case cs.Tgt < 0 || cs.Tgt >= MaxCounters:
		return fmt.Errorf("%w: target counter %d (0 for none, 1 to %d)", ErrCounter, cs.Tgt, MaxCounters-1)
	}
	return c.send(tgt, uint16(handler), uhdr, data, cs)
}

func (c *Context) send(tgt int, handler uint16, uhdr, data []byte, cs Counters) error {
	cn := c.conns[tgt]
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.err(); err != nil {
		return err
	}
	if cn.err != nil {
		return cn.err
	}
	var m *outMsg
	if k := len(c.spare); k > 0 {
		m, c.spare = c.spare[k-1], c.spare[:k-1]
	} else {
		m = new(outMsg)
	}
	*m = outMsg{id: cn.nextID, handler: handler, tgt: uint16(cs.Tgt), uhdr: uhdr, data: data, org: cs.Org, cmpl: cs.Cmpl}
	cn.nextID++
	if len(cn.sendq) == 0 {
		cn.sendq = cn.sendBack[:0] // the queue drained: from the start of its array again
	}
	cn.sendq = append(cn.sendq, m)
	if cap(cn.sendq) > cap(cn.sendBack) {
		cn.sendBack = cn.sendq[:0] // it grew into a new array
	}
	c.pending++
	c.stats.Sent++
	if !c.inRound {
		c.pump(cn)
		c.flush(cn)
	}
	return nil
}

// pump sends what cn's queue holds while dataMayGo says a data packet may
// go, each packet deferred: flush rings once for them all. Under mu.
func (c *Context) pump(cn *conn) {
	defer func() {
		if creditStalled(cn) && !cn.stalled {
			cn.stalled = true // counted once per stall, not per look
			c.stats.CreditStalls++
		}
	}()
	for c.dataMayGo(cn) {
		cn.stalled = false
		m := cn.sendq[0]
		slot := c.takeSlot()
		buf := c.slotBuf(slot)
		h := header{id: m.id, length: uint64(len(m.data)), offset: uint64(m.off)}
		n := headerSize
		if !m.started {
			h.handler, h.uhdrLen, h.tgtCntr = m.handler, uint16(len(m.uhdr)), m.tgt
			if m.tgt != 0 {
				h.flags |= flagTgtCounter
			}
			if m.cmpl != nil {
				h.flags |= flagAckSoon
			}
			c.rideAcks(cn, &h)
			n += copy(buf[n:], m.uhdr)
		}
		k := copy(buf[n:], m.data[m.off:])
		n += k
		switch {
		case m.started:
			h.kind = kindFrag
		case k == len(m.data):
			h.kind = kindEager
		default:
			h.kind = kindFirst
		}
		h.credits, cn.owed = uint32(cn.owed), 0
		h.put(buf)
		if err := c.post(cn, cn.out, slot, n); err != nil {
			c.fail(cn, err) // the credits it carried no longer matter
			return
		}
		cn.unrung |= outQueue
		c.stats.Packets++
		m.started = true
		m.off += k
		if m.off == len(m.data) {
			cn.sendq[0] = nil
			cn.sendq = cn.sendq[1:]
			if len(cn.sendq) == 0 && cap(cn.sendBack) > maxKept {
				cn.sendBack = nil // let a burst's array go
			}
			m.uhdr, m.data = nil, nil
			cn.sent[m.id] = m
			if m.org != nil {
				m.org.add(1)
			}
		}
	}
}

// maxKept bounds what a context keeps for reuse after a burst: a task's
// send queue array, spare message records.
const maxKept = 1024

// rideAcks moves up to maxRideAcks of cn's acknowledgements into the
// first packet of a message, h. Under mu.
func (c *Context) rideAcks(cn *conn, h *header) {
	k := min(len(cn.acks), maxRideAcks)
	h.setRideAcks(cn.acks[:k])
	c.takeAcks(cn, k)
	c.stats.RideAcks += uint64(k)
}

// takeAcks drops the first k of cn's acknowledgements, sent. Under mu.
func (c *Context) takeAcks(cn *conn, k int) {
	cn.acks = append(cn.acks[:0], cn.acks[k:]...)
	if len(cn.acks) == 0 {
		cn.ackState = acksNone
	}
}

// ctrl sends cn's acknowledgements and owed credits in control packets
// while ctrlDue says one goes. Under mu.
func (c *Context) ctrl(cn *conn, idle bool, now time.Time) {
	for cn.err == nil && c.ctrlDue(cn, idle, now) {
		slot := c.takeSlot()
		buf := c.slotBuf(slot)
		k := min(len(cn.acks), c.maxAcks)
		for i, id := range cn.acks[:k] {
			binary.LittleEndian.PutUint32(buf[headerSize+ackSize*i:], id)
		}
		h := header{kind: kindCtrl, credits: uint32(cn.owed), length: uint64(k)}
		h.put(buf)
		if err := c.post(cn, cn.in, slot, headerSize+ackSize*k); err != nil {
			c.fail(cn, err)
			return
		}
		cn.owed = 0
		c.takeAcks(cn, k)
		cn.unrung |= inQueue
		c.stats.CtrlPackets++
	}
}

// post posts one deferred send of slot's first n bytes on qp. Under mu.
func (c *Context) post(cn *conn, qp *vfrdma.QP, slot int32, n int) error {
	return c.postTagged(cn, qp, slot, n, 0)
}

func (c *Context) postTagged(cn *conn, qp *vfrdma.QP, slot int32, n int, tag uint64) error {
	c.sge[0] = c.sendM.SGE(int(slot)*c.slotSize, n)
	c.wr[0] = vfrdma.SendWR{WRID: sendTag | tag | uint64(slot), Flags: vfrdma.SendSignaled, SGEs: c.sge[:1]}
	if n == 0 {
		c.wr[0].SGEs = nil
	}
	if _, err := qp.PostSend(c.wr[:], vfrdma.FlagDefer); err != nil {
		c.putSlot(slot)
		return err
	}
	cn.credits--
	return nil
}

// flush rings the doorbells of cn's deferred posts: out's, then in's, as
// cn.unrung names them. Under mu.
func (c *Context) flush(cn *conn) {
	unrung := cn.unrung
	cn.unrung = 0
	if unrung&outQueue != 0 {
		c.ring(cn, cn.out)
	}
	if unrung&inQueue != 0 {
		c.ring(cn, cn.in)
	}
}

// ring rings qp's doorbell for its deferred posts to cn; a refusal
// purges cn. Under mu.
func (c *Context) ring(cn *conn, qp *vfrdma.QP) {
	if err := qp.Ring(); err != nil {
		c.fail(cn, err)
	} else {
		c.stats.Doorbells++
	}
}

// takeSlot takes a free send slot (the caller made sure there is one).
// Under mu.
func (c *Context) takeSlot() int32 {
	s := c.free[len(c.free)-1]
	c.free = c.free[:len(c.free)-1]
	c.busy[s] = true
	return s
}

// putSlot frees a slot takeSlot took. Under mu.
func (c *Context) putSlot(s int32) {
	c.busy[s] = false
	c.free = append(c.free, s)
}

func (c *Context) slotBuf(slot int32) []byte {
	return c.sendMem[int(slot)*c.slotSize : int(slot+1)*c.slotSize]
}

// fail purges cn: what is queued or unacknowledged to it fails, and every
// later Amsend to it returns ErrPurged. Under mu.
func (c *Context) fail(cn *conn, cause error) {
	if errors.Is(cause, vfrdma.ErrClosed) {
		// The device or its queues closed under the context: not this
		// task's doing, and the end of every task's.
		c.dead(fmt.Errorf("am: the device closed under the context: %w", cause))
	}
	if cn.err != nil {
		return
	}
	cn.err = fmt.Errorf("%w: task %d: %w", ErrPurged, cn.task, cause)
	n := len(cn.sendq) + len(cn.sent)
	if n > 0 {
		c.pending -= n
		c.stats.Failed += uint64(n)
		c.failed = append(c.failed, fmt.Errorf("%d messages to task %d lost: %w", n, cn.task, cn.err))
	}
	cn.sendq, cn.sent, cn.acks, cn.ackState = nil, map[uint32]*outMsg{}, nil, acksNone
	c.notify()
}

// acked takes task cn's acknowledgements. Under mu.
// Each message is acknowledged once, after it was sent whole: an ack of
// anything else is refused (the acks before it are taken).
func (c *Context) acked(cn *conn, acks []byte) error {
	defer c.notify()
	for i := 0; i+ackSize <= len(acks); i += ackSize {
		a := binary.LittleEndian.Uint32(acks[i:])
		id := a &^ ackFailed
		m := cn.sent[id]
		if m == nil {
			return fmt.Errorf("%w: an acknowledgement of message %d, not one awaiting it", errProtocol, id)
		}
		delete(cn.sent, id)
		c.pending--
		cmpl := m.cmpl
		if len(c.spare) < maxKept {
			*m = outMsg{}
			c.spare = append(c.spare, m)
		}
		if a&ackFailed != 0 {
			c.stats.Failed++
			c.failed = append(c.failed, fmt.Errorf("%w: message %d to task %d", ErrDropped, id, cn.task))
			continue
		}
		c.stats.Delivered++
		if cmpl != nil {
			cmpl.add(1)
		}
	}
	return nil
}

// Purge cancels what this task has queued or unacknowledged to tgt and
// refuses later messages to it with ErrPurged (LAPI_Purge_totask). The
// QP to tgt goes to the error state.
func (c *Context) Purge(ctx context.Context, tgt int) error {
	if tgt < 0 || tgt >= c.cfg.Tasks {
		return fmt.Errorf("%w: task %d of %d", ErrTarget, tgt, c.cfg.Tasks)
	}
	cn := c.conns[tgt]
	c.mu.Lock()
	if err := c.err(); err != nil {
		c.mu.Unlock()
		return err
	}
	c.calls.Add(1) // Close frees the QPs only once this call is done
	defer c.calls.Done()
	c.fail(cn, errors.New("purged by the caller"))
	c.mu.Unlock()
	err := cn.out.SetError(ctx)
	if cn.in != cn.out {
		err = errors.Join(err, cn.in.SetError(ctx))
	}
	c.ws.Wake()
	return err
}

// Fence waits until every message this task sent has completed at its
// target (LAPI_Fence): acknowledged, or failed. It returns the failures
// since the last Fence (ErrDropped, ErrPurged), joined.
func (c *Context) Fence(ctx context.Context) error {
	if err := c.waitFor(ctx, func() bool { return c.pending == 0 || c.perr != nil }); err != nil {
		return fmt.Errorf("am: fence: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.perr != nil {
		return c.perr
	}
	errs := c.failed
	c.failed = nil
	return errors.Join(errs...)
}

// Barrier waits until every task has called it (LAPI_Gfence): first this
// task's Fence, then a message to every task, itself included, and their
// messages back. A purged or failed task makes it return ErrPurged, as
// does one that dies while it waits (the tasks whose messages are missing
// are probed when silent).
func (c *Context) Barrier(ctx context.Context) error {
	if err := c.Fence(ctx); err != nil {
		return err
	}
	c.mu.Lock()
	c.epoch++
	e := c.epoch
	for old := range c.arrived {
		if old < e {
			delete(c.arrived, old) // of a Barrier that gave up
		}
	}
	c.mu.Unlock()
	var uh [8]byte
	binary.LittleEndian.PutUint64(uh[:], e)
	for t := range c.cfg.Tasks {
		if err := c.send(t, barrierHandler, uh[:], nil, Counters{}); err != nil {
			return fmt.Errorf("am: barrier: %w", err)
		}
	}
	var ferr error
	c.mu.Lock()
	c.barriers++ // the ticker probes the tasks whose messages are missing
	c.mu.Unlock()
	err := c.waitFor(ctx, func() bool {
		for _, cn := range c.conns {
			if cn.err != nil {
				ferr = cn.err
				return true
			}
		}
		if c.perr != nil {
			ferr = c.perr
			return true
		}
		return c.arrived[e] == c.cfg.Tasks
	})
	c.mu.Lock()
	c.barriers--
	delete(c.arrived, e)
	c.mu.Unlock()
	if err == nil {
		err = ferr
	}
	if err != nil {
		return fmt.Errorf("am: barrier: %w", err)
	}
	return nil
}
