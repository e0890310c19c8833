package am

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/event"
)

// progress is the context's goroutine: it polls the CQ, takes what
// arrived (running header handlers), frees send slots, sends what credits
// now allow and the acknowledgements that gathered, and waits as its idle
// policy (c.onIdle) says when there is nothing to do.
func (c *Context) progress(ctx context.Context) {
	defer close(c.done)
	wcs := make([]vfrdma.WC, 64)
	// The buffers taken and not yet back in the SRQ, since heldAt: they go
	// back when repostDue says, with one doorbell, and their credits with
	// them.
	reposts := make([]vfrdma.RecvWR, 0, c.bufs)
	sges := make([]vfrdma.SGE, c.bufs)
	// What is held back goes within the spin (the hold is at most half
	// of it, and every spinning round looks), so nothing is held when the
	// goroutine sleeps; a napping one lets it go at its first round after
	// the hold (a nap is at most napMax).
	var heldAt time.Time
	spell := idleSpell{pause: napMin}
	if c.onIdle == idleSpinNap {
		spell.nap = time.NewTimer(time.Hour)
		spell.nap.Stop()
		defer spell.nap.Stop()
	}
	for {
		n, err := c.cq.Poll(wcs)
		if err != nil {
			c.die(fmt.Errorf("am: progress: %w", err))
			return
		}
		if n > 0 {
			// Amsend from the round's header and completion handlers
			// waits for the round's end: its packets then carry the
			// acknowledgements the round gathered, and ring once.
			c.mu.Lock()
			c.inRound = true
			c.mu.Unlock()
		}
		for i := range wcs[:n] {
			wc := &wcs[i]
			if wc.WRID&sendTag != 0 {
				c.sendDone(wc)
				continue
			}
			repost, err := c.recv(wc)
			if err != nil {
				c.die(err)
				return
			}
			if !repost {
				continue
			}
			if len(reposts) == 0 && c.ackHold > 0 {
				heldAt = time.Now()
			}
			slot := int(wc.WRID)
			sges[len(reposts)] = c.recvM.SGE(slot*c.cfg.PacketSize, c.cfg.PacketSize)
			reposts = append(reposts, vfrdma.RecvWR{WRID: wc.WRID, SGEs: sges[len(reposts) : len(reposts)+1]})
		}
		idle := n < len(wcs)
		look := c.tick.Swap(false)
		var now time.Time // for what is held back
		if idle && c.ackHold > 0 {
			now = time.Now()
		}
		// The buffers go back in a batch, or once the goroutine has been
		// idle for the hold (at once when idle, without one): off a
		// ping-pong's critical path, one doorbell for many in a stream.
		rang := c.repostDue(len(reposts), idle, now, heldAt)
		if rang {
			if _, err := c.srq.PostRecv(reposts, 0); err != nil {
				c.die(fmt.Errorf("am: reposting receive buffers: %w", err))
				return
			}
			reposts = reposts[:0]
		}
		c.mu.Lock()
		c.inRound = false
		if rang {
			c.stats.Doorbells++
			c.stats.RecvDoorbells++
			for _, cn := range c.conns { // their buffers are back: credits to return
				cn.owed += cn.unposted
				cn.unposted = 0
			}
		}
		for _, cn := range c.conns {
			c.pump(cn)
			c.ctrl(cn, idle, now)
			if look {
				c.probe(cn)
			}
			c.flush(cn)
		}
		c.mu.Unlock()
		if n > 0 {
			spell.end()
			if idle {
				// The CQ is drained: let the goroutines the round's
				// handlers woke (a ping-pong's caller waiting for its
				// answer) run before the next poll, which finds nothing
				// and, with the POLL doorbell, costs an exit.
				runtime.Gosched()
			}
			continue
		}
		if ctx.Err() != nil {
			return
		}
		if !c.waitIdle(ctx, &spell) {
			return
		}
	}
}

// idleSpell is what the progress goroutine keeps of a spell of polls
// that find nothing: when it began, for the spin, and the next nap's
// pause (idleSpinNap), which doubles from napMin to napMax while nothing
// arrives; one timer serves every nap.
type idleSpell struct {
	since time.Time // zero: no spin under way
	pause time.Duration
	nap   *time.Timer // idleSpinNap only
}

// end ends the spell: something arrived.
func (s *idleSpell) end() {
	s.since = time.Time{}
	s.pause = napMin
}

// waitIdle waits as c.onIdle says after a round that found nothing: it
// polls on, spins, naps or sleeps until the next round. False when the
// goroutine must stop (ctx ended, or it died).
func (c *Context) waitIdle(ctx context.Context, s *idleSpell) bool {
	switch c.onIdle {
	case idlePoll:
		runtime.Gosched()
		return true
	case idleSpinSleep, idleSpinNap:
		if c.spinning(s) {
			runtime.Gosched()
			return true
		}
	}
	if c.onIdle == idleSpinNap {
		if !c.napFor(ctx, s.nap, s.pause) {
			return false
		}
		s.pause = min(2*s.pause, napMax)
		return true
	}
	// Sleep on the set's channel: TryWait arms the CQ and reports what
	// is pending, the receive takes the signal, and nothing is put back,
	// so that Close's cancel always ends the sleep.
	switch err := c.ws.TryWait(); {
	case errors.Is(err, event.ErrAgain):
		return true
	case err != nil:
		c.die(fmt.Errorf("am: progress: %w", err))
		return false
	}
	select {
	case <-c.ws.C():
		return true
	case <-ctx.Done():
		return false
	}
}

// spinning reports whether the spell is still within the spin (c.spin
// from its first idle round): the goroutine keeps polling, and traffic
// that goes on within it costs no arming and no interrupt. Past the spin
// a sleeper's spell starts over (each wake-up that finds nothing spins
// again); a napper's goes on between naps, until something arrives.
func (c *Context) spinning(s *idleSpell) bool {
	if c.spin <= 0 {
		return false
	}
	now := time.Now()
	if s.since.IsZero() {
		s.since = now
	}
	if now.Sub(s.since) < c.spin {
		return true
	}
	if c.onIdle != idleSpinNap {
		s.since = time.Time{}
	}
	return false
}

// A napping progress goroutine's pauses: from napMin, doubling while
// nothing arrives, to napMax. An idle context then wakes at most 1 000
// times a second, each wake one poll (and at most one POLL doorbell).
const (
	napMin = 20 * time.Microsecond
	napMax = time.Millisecond
)

// ackHold is how long an idle progress goroutine keeps back an
// acknowledgement whose origin does not wait for it (no Cmpl counter), so
// that it rides on the next message to that task (a ping-pong's answer,
// the next request) instead of going alone in a control packet that costs
// a send, a receive and a buffer at each end. A Fence waits for it at
// most this much longer. A goroutine that does not spin holds nothing.
const ackHold = 200 * time.Microsecond

// repostBatch is the most buffers a busy progress goroutine holds back
// from the SRQ (at most half a task's credits, whose return waits for
// them): one doorbell returns them all.
const repostBatch = 16

// napFor pauses a napping progress goroutine for d, or until Wake (work
// to send) or ctx ends; false when the goroutine must stop. TryWait clears the set's
// signal first (the set holds no CQ, so it arms nothing), so that a Wake
// during the nap is not lost.
func (c *Context) napFor(ctx context.Context, t *time.Timer, d time.Duration) bool {
	switch err := c.ws.TryWait(); {
	case errors.Is(err, event.ErrAgain):
		return true // Wake came: look again at once
	case err != nil:
		c.die(fmt.Errorf("am: progress: %w", err))
		return false
	}
	t.Reset(d)
	select {
	case <-c.ws.C():
		t.Stop()
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
		return false
	}
	return true
}

// die records why the progress goroutine stopped, fails what is
// outstanding and wakes the waiters; later calls return err. Its ticker
// stops with it.
func (c *Context) die(err error) {
	err = c.closing(err)
	c.mu.Lock()
	c.dead(err)
	c.mu.Unlock()
	if c.stop != nil {
		c.stop()
	}
}

// failedCompletion is the cause a failed completion purges cn with: err,
// or the device's close when it is closing (Device.Close destroys the QPs,
// and their requests complete flushed). The device is asked only for the
// first failure of a task still in the job.
func (c *Context) failedCompletion(cn *conn, err error) error {
	if cn == nil {
		return err
	}
	c.mu.Lock()
	first := cn.err == nil && c.perr == nil && !c.closed
	c.mu.Unlock()
	if !first {
		return err
	}
	return c.closing(err)
}

// closing returns err, or, when the device is closing, an error wrapping
// ErrClosed that says so: a call racing Device.Close may fail otherwise
// (an SRQ whose QPs were destroyed first, ...), and the cause is the
// close. It asks the device once, on the way out.
func (c *Context) closing(err error) error {
	if c.d == nil || errors.Is(err, vfrdma.ErrClosed) {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, qerr := c.d.QueryPort(ctx); errors.Is(qerr, vfrdma.ErrClosed) {
		return fmt.Errorf("am: the device closed under the context (%w); the progress goroutine stopped on: %v", qerr, err)
	}
	return err
}

// dead marks the context failed with err (the first cause stays): every
// task's messages fail, and every later call returns it. Under mu.
func (c *Context) dead(err error) {
	if c.perr != nil || c.closed {
		return
	}
	c.perr = err
	c.down.Store(true)
	for _, cn := range c.conns {
		c.fail(cn, err)
	}
	c.notify()
}

// sendDone frees a send's slot; a failed send purges its task (an RC send
// fails when the peer is gone: retries exhausted).
func (c *Context) sendDone(wc *vfrdma.WC) {
	cn := c.byQPN[wc.QPN]
	var cause error
	if wc.Status != vfrdma.WCSuccess {
		cause = c.failedCompletion(cn, fmt.Errorf("send completed with %v (vendor error %#x)", wc.Status, wc.VendorErr))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	slot := wc.WRID &^ (sendTag | probeTag)
	if cn == nil || slot >= uint64(len(c.busy)) || !c.busy[slot] {
		// The device's word, not a peer's: a completion of a send this
		// context has not posted, or has had completed already.
		err := fmt.Errorf("%w: am: a send completion for slot %d on QP %d, not one in flight", vfrdma.ErrDeviceFault, slot, wc.QPN)
		if cn == nil {
			c.dead(err)
		} else if cn.err == nil {
			c.stats.Refused++
			c.fail(cn, err)
			c.failed = append(c.failed, cn.err)
		}
		return
	}
	c.putSlot(int32(slot))
	if wc.WRID&probeTag != 0 {
		cn.probing = false // the probe is back: the next look may send another
	}
	if cause != nil {
		c.fail(cn, cause)
	}
}

// recv takes one receive completion and reports whether its buffer goes
// back to the SRQ. It returns an error only for what stops the whole
// context. The completion is the device's word and the packet the peer's:
// both are checked before use, and what does not hold together purges the
// task that sent it.
func (c *Context) recv(wc *vfrdma.WC) (repost bool, err error) {
	cn := c.byQPN[wc.QPN]
	if cn == nil {
		return false, fmt.Errorf("%w: am: a receive completion on QP %d, not one of ours", vfrdma.ErrDeviceFault, wc.QPN)
	}
	if wc.WRID >= uint64(c.bufs) {
		// Not a buffer we posted: nothing to repost, and the device has
		// broken its word on that QP.
		c.refuse(cn, fmt.Errorf("%w: a receive completion for buffer %d, of %d posted", vfrdma.ErrDeviceFault, wc.WRID, c.bufs))
		return false, nil
	}
	if wc.Status == vfrdma.WCLocLenErr {
		// The task sent more than a receive buffer holds: no packet of the
		// protocol is longer than PacketSize, the same on every task.
		c.refuse(cn, fmt.Errorf("%w: a packet longer than the %d-byte receive buffer (the receive completed with %v)", errProtocol, c.cfg.PacketSize, wc.Status))
		return true, nil
	}
	if wc.Status != vfrdma.WCSuccess {
		cause := c.failedCompletion(cn, fmt.Errorf("receive completed with %v", wc.Status))
		c.mu.Lock()
		c.fail(cn, cause)
		c.mu.Unlock()
		return true, nil
	}
	if wc.ByteLen > uint32(c.cfg.PacketSize) {
		c.refuse(cn, fmt.Errorf("%w: a receive of %d bytes into a %d-byte buffer", errProtocol, wc.ByteLen, c.cfg.PacketSize))
		return true, nil
	}
	off := int(wc.WRID) * c.cfg.PacketSize
	c.take(cn, c.recvMem[off:off+int(wc.ByteLen)])
	return true, nil
}

// refuse purges cn for a packet or completion that broke the protocol,
// counts it, and reports it at the next Fence.
func (c *Context) refuse(cn *conn, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cn.err != nil {
		return
	}
	c.stats.Refused++
	c.fail(cn, err)
	c.failed = append(c.failed, cn.err)
}

// take takes one packet b that task cn sent: b has been checked against
// its buffer, not yet on its own.
func (c *Context) take(cn *conn, b []byte) {
	var h header
	err := h.parse(b, c.cfg.MaxMessage, c.cfg.MaxUHdr)
	c.mu.Lock()
	if cn.err != nil {
		c.mu.Unlock()
		return // purged: its packets are dropped, and owed nothing
	}
	if err == nil {
		err = c.check(cn, &h, b[headerSize:])
	}
	if err != nil {
		c.mu.Unlock()
		c.refuse(cn, err)
		return
	}
	cn.credits += int(h.credits)
	cn.unposted++ // a credit owed once the buffer is back in the SRQ
	cn.heard++
	if h.kind == kindCtrl {
		err := c.acked(cn, b[headerSize:])
		c.mu.Unlock()
		if err != nil {
			c.refuse(cn, err)
		}
		return
	}
	if h.kind != kindFrag {
		cn.rxNext++
		if k := h.rideAcks(); k > 0 {
			if err := c.acked(cn, rideAckBytes(b, k)); err != nil {
				c.mu.Unlock()
				c.refuse(cn, err)
				return
			}
		}
	}
	if h.handler == barrierHandler && h.kind == kindEager {
		cn.barrier = binary.LittleEndian.Uint64(b[headerSize:])
	}
	c.mu.Unlock()
	body := b[headerSize:]
	if h.kind == kindFrag {
		// check made sure: the message's id, length and next offset, and
		// a buffer of at least its length unless it is dropped.
		m := cn.rx
		if !m.drop {
			copy(m.ret.Buf[m.got:m.length], body)
		}
		m.got += uint64(len(body))
		if m.got == m.length {
			cn.rx = nil
			c.landed(cn, m)
		}
		return
	}
	uhdr, data := body[:h.uhdrLen], body[h.uhdrLen:]
	// On the stack: only a message in fragments (cn.rx) or with a
	// completion handler of its own goroutine goes to the heap.
	m := inMsg{id: h.id, length: h.length, got: uint64(len(data)), soon: h.flags&flagAckSoon != 0}
	if h.flags&flagTgtCounter != 0 { // parse made sure it is in range
		m.tgt = c.counters[h.tgtCntr].Load()
	}
	if h.handler == barrierHandler {
		c.barrierArrived(uhdr)
	} else if int(h.handler) >= MaxHandlers || c.handlers[h.handler].Load() == nil {
		m.drop = true
	} else {
		hh := c.handlers[h.handler].Load()
		// One Arrival per context, valid only during the call: the
		// handler gets a pointer that would otherwise escape.
		a := &c.arrival
		*a = Arrival{Src: cn.task, UHdr: uhdr, Len: int(h.length)}
		if h.kind == kindEager {
			a.Data = data
		}
		m.ret = (*hh)(a)
		*a = Arrival{}
		switch {
		case m.ret.Buf == nil && h.kind == kindFirst, m.ret.Buf != nil && uint64(len(m.ret.Buf)) < h.length:
			m.drop = true
		case m.ret.Buf != nil:
			copy(m.ret.Buf, data)
		}
	}
	if h.kind == kindFirst {
		rx := new(inMsg)
		*rx = m
		cn.rx = rx
		return
	}
	c.landed(cn, &m)
}

// check holds a parsed packet from cn against what this end knows: a
// fragment continues the message being reassembled (same id, same length,
// at the offset reached), a message begins only between messages and with
// the next id, barrier messages are what Barrier sends, and no packet
// returns more credits than are out. Under mu.
func (c *Context) check(cn *conn, h *header, body []byte) error {
	switch h.kind {
	case kindFrag:
		m := cn.rx
		if m == nil || m.id != h.id || m.length != h.length || m.got != h.offset {
			want := "no message"
			if m != nil {
				want = fmt.Sprintf("message %d of %d bytes at %d", m.id, m.length, m.got)
			}
			return fmt.Errorf("%w: fragment of message %d of %d bytes at %d, expected %s", errProtocol, h.id, h.length, h.offset, want)
		}
	case kindEager, kindFirst:
		if cn.rx != nil {
			return fmt.Errorf("%w: message %d began inside message %d", errProtocol, h.id, cn.rx.id)
		}
		if h.id != cn.rxNext {
			return fmt.Errorf("%w: message %d, expected message %d", errProtocol, h.id, cn.rxNext)
		}
		if h.handler == barrierHandler && (h.kind != kindEager || h.length != 0 || h.uhdrLen != 8) {
			return fmt.Errorf("%w: a barrier message of kind %d with %d bytes of data and a %d-byte user header", errProtocol, h.kind, h.length, h.uhdrLen)
		}
		if h.handler == barrierHandler {
			// A task cannot finish a barrier without this task's message
			// for it, so none is more than one ahead of this one; and each
			// sends one message per barrier, in order.
			e := binary.LittleEndian.Uint64(body)
			if e <= cn.barrier || e > c.epoch+1 {
				return fmt.Errorf("%w: barrier message for barrier %d; its last was %d, this task's is %d", errProtocol, e, cn.barrier, c.epoch)
			}
		}
	}
	if out := int64(c.cfg.Credits) - int64(cn.credits); int64(h.credits) > out {
		return fmt.Errorf("%w: %d credits returned, %d out", errProtocol, h.credits, out)
	}
	return nil
}

// landed finishes a message whose data is all in: its completion handler,
// its target counter, then its acknowledgement, in that order, so the
// origin's Cmpl never counts before the handler returned.
func (c *Context) landed(cn *conn, m *inMsg) {
	switch {
	case m.drop:
		c.ack(cn, m.id|ackFailed, m.soon, false)
	case m.ret.Completion == nil:
		c.finish(cn, m)
	case m.ret.Inline:
		m.ret.Completion()
		c.finish(cn, m)
	default:
		c.completeLater(cn, *m)
	}
}

// completeLater runs m's completion handler on a goroutine of its own,
// then finishes m (m is a copy: only this path puts it on the heap).
func (c *Context) completeLater(cn *conn, m inMsg) {
	go func() {
		m.ret.Completion()
		c.finish(cn, &m)
		c.ws.Wake() // the progress goroutine sends the acknowledgement
	}()
}

// finish counts a message whose completion handler has returned (its
// target counter, Stats.Received) and queues its acknowledgement.
func (c *Context) finish(cn *conn, m *inMsg) {
	if m.tgt != nil {
		m.tgt.add(1)
	}
	c.ack(cn, m.id, m.soon, true)
}

// ack queues an acknowledgement for cn, of a message received (counted
// in Stats.Received) or dropped; soon when its origin waits for it (a
// Cmpl counter: the acknowledgements are then wanted), else it may be
// held for a data packet to ride on (see ackState).
func (c *Context) ack(cn *conn, a uint32, soon, received bool) {
	c.mu.Lock()
	if received {
		c.stats.Received++
	}
	if cn.err == nil {
		if cn.ackState == acksNone && c.ackHold > 0 {
			cn.ackAt = time.Now()
		}
		cn.acks = append(cn.acks, a)
		switch {
		case soon:
			cn.ackState = acksWanted
		case cn.ackState == acksNone:
			cn.ackState = acksHeld
		}
	}
	c.mu.Unlock()
}

func (c *Context) barrierArrived(uhdr []byte) {
	e := binary.LittleEndian.Uint64(uhdr) // check made sure it has 8 bytes
	c.mu.Lock()
	if e >= c.epoch { // older ones are of a Barrier that gave up
		c.arrived[e]++
		c.notify()
	}
	c.mu.Unlock()
}

// ticker wakes the progress goroutine every probeEvery, and sets the tick
// while messages are outstanding. The wake-up when idle is also how the
// progress goroutine learns, within probeEvery, that the device closed
// under it (its next poll says so).
func (c *Context) ticker(ctx context.Context) {
	defer close(c.tock)
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.mu.Lock()
			busy := c.pending > 0 || c.barriers > 0
			c.mu.Unlock()
			if busy {
				c.tick.Store(true)
			}
			c.ws.Wake()
		}
	}
}

// probe sends a packet to a task when probeDue says (it owes this one
// something and has said nothing since the last look), even without a
// credit: to a live task it is one more buffer it returns like any other
// (an RNR at worst, which the QP retries without end), to a task that is
// gone it is a send that fails once the QP's retries run out, which
// purges the task. Without it a task waiting for credits from a dead
// peer, with nothing in flight, or a Barrier waiting for a dead task's
// message, would wait forever. Under mu.
func (c *Context) probe(cn *conn) {
	due := c.probeDue(cn)
	cn.heardSeen = cn.heard // the next look asks for silence since this one
	if !due {
		return
	}
	slot := c.takeSlot()
	h := header{kind: kindCtrl, credits: uint32(cn.owed)}
	h.put(c.slotBuf(slot))
	if err := c.postTagged(cn, cn.out, slot, headerSize, probeTag); err != nil {
		c.fail(cn, err)
		return
	}
	cn.owed = 0
	cn.probing = true
	cn.unrung |= outQueue
	c.stats.CtrlPackets++
}
