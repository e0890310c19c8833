package am

import (
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"time"

	"github.com/vfrdma/vfrdma"
)

// progress is the context's goroutine: it polls the CQ, takes what
// arrived (running header handlers), frees send slots, sends what credits
// now allow and the acknowledgements that gathered, and sleeps on the CQ's
// interrupt (a wait set) when there is nothing to do.
func (c *Context) progress(ctx context.Context) {
	defer close(c.done)
	wcs := make([]vfrdma.WC, 64)
	reposts := make([]vfrdma.RecvWR, 0, len(wcs))
	sges := make([]vfrdma.SGE, len(wcs))
	for {
		n, err := c.cq.Poll(wcs)
		if err != nil {
			c.die(fmt.Errorf("am: progress: %w", err))
			return
		}
		reposts = reposts[:0]
		for i := range wcs[:n] {
			wc := &wcs[i]
			if wc.WRID&sendTag != 0 {
				c.sendDone(wc)
				continue
			}
			if err := c.recv(wc); err != nil {
				c.die(err)
				return
			}
			slot := int(wc.WRID)
			sges[len(reposts)] = c.recvM.SGE(slot*c.cfg.PacketSize, c.cfg.PacketSize)
			reposts = append(reposts, vfrdma.RecvWR{WRID: wc.WRID, SGEs: sges[len(reposts) : len(reposts)+1]})
		}
		if len(reposts) > 0 {
			// One doorbell for the round's buffers.
			if _, err := c.srq.PostRecv(reposts, 0); err != nil {
				c.die(fmt.Errorf("am: reposting receive buffers: %w", err))
				return
			}
		}
		idle := n < len(wcs)
		look := c.tick.Swap(false)
		c.mu.Lock()
		for _, cn := range c.conns {
			c.pump(cn)
			c.ctrl(cn, idle)
			if look {
				c.probe(cn)
			}
			c.flush(cn)
		}
		c.mu.Unlock()
		if n > 0 {
			continue
		}
		if ctx.Err() != nil {
			return
		}
		if c.cfg.Polling {
			runtime.Gosched()
			continue
		}
		if err := c.ws.Wait(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			c.die(fmt.Errorf("am: progress: %w", err))
			return
		}
	}
}

// die records why the progress goroutine stopped and wakes the waiters.
func (c *Context) die(err error) {
	c.mu.Lock()
	if c.perr == nil && !c.closed {
		c.perr = err
	}
	c.notify()
	c.mu.Unlock()
}

// sendDone frees a send's slot; a failed send purges its task (an RC send
// fails when the peer is gone: retries exhausted).
func (c *Context) sendDone(wc *vfrdma.WC) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.free = append(c.free, int32(wc.WRID&^(sendTag|probeTag)))
	cn := c.byQPN[wc.QPN]
	if cn == nil {
		return
	}
	cn.inflight--
	if wc.WRID&probeTag != 0 {
		cn.probing = false
	}
	if wc.Status != vfrdma.WCSuccess {
		c.fail(cn, fmt.Errorf("send completed with %v (vendor error %#x)", wc.Status, wc.VendorErr))
	}
}

// recv takes one received packet. It returns an error only for what stops
// the whole context; a bad packet purges the task that sent it.
func (c *Context) recv(wc *vfrdma.WC) error {
	cn := c.byQPN[wc.QPN]
	if cn == nil {
		return fmt.Errorf("%w: a receive on QP %d, not one of ours", errProtocol, wc.QPN)
	}
	if wc.Status != vfrdma.WCSuccess {
		c.mu.Lock()
		c.fail(cn, fmt.Errorf("receive completed with %v", wc.Status))
		c.mu.Unlock()
		return nil
	}
	slot := int(wc.WRID)
	b := c.recvM.Bytes()[slot*c.cfg.PacketSize : slot*c.cfg.PacketSize+int(wc.ByteLen)]
	var h header
	err := h.parse(b, c.cfg.MaxMessage)
	c.mu.Lock()
	if cn.err != nil {
		c.mu.Unlock()
		return nil // purged: its packets are dropped, and owed nothing
	}
	if err == nil && h.kind != kindEager && h.kind != kindFirst && h.kind != kindCtrl && (cn.rx == nil || cn.rx.id != h.id || cn.rx.got != h.offset) {
		err = fmt.Errorf("%w: fragment of message %d at %d, not the one expected", errProtocol, h.id, h.offset)
	}
	if err == nil && (h.kind == kindEager || h.kind == kindFirst) && cn.rx != nil {
		err = fmt.Errorf("%w: message %d began inside message %d", errProtocol, h.id, cn.rx.id)
	}
	if err != nil {
		c.fail(cn, err)
		c.mu.Unlock()
		return nil
	}
	cn.credits += int(h.credits)
	cn.owed++ // the buffer goes back to the SRQ this round
	cn.heard++
	if h.kind == kindCtrl {
		c.acked(cn, b[headerSize:])
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	body := b[headerSize:]
	if h.kind == kindFrag {
		m := cn.rx
		if !m.drop {
			copy(m.ret.Buf[m.got:], body)
		}
		m.got += uint64(len(body))
		if m.got == m.length {
			cn.rx = nil
			c.landed(cn, m)
		}
		return nil
	}
	uhdr, data := body[:h.uhdrLen], body[h.uhdrLen:]
	m := &inMsg{id: h.id, length: h.length, got: uint64(len(data))}
	if h.flags&flagTgtCounter != 0 && int(h.tgtCntr) < MaxCounters {
		m.tgt = c.counters[h.tgtCntr].Load()
	}
	if h.handler == barrierHandler {
		c.barrierArrived(uhdr)
	} else if hh := c.handlers[h.handler%MaxHandlers].Load(); hh == nil || int(h.handler) >= MaxHandlers {
		m.drop = true
	} else {
		a := Arrival{Src: cn.task, UHdr: uhdr, Len: int(h.length)}
		if h.kind == kindEager {
			a.Data = data
		}
		m.ret = (*hh)(&a)
		switch {
		case m.ret.Buf == nil && h.kind == kindFirst, m.ret.Buf != nil && uint64(len(m.ret.Buf)) < h.length:
			m.drop = true
		case m.ret.Buf != nil:
			copy(m.ret.Buf, data)
		}
	}
	if h.kind == kindFirst {
		cn.rx = m
		return nil
	}
	c.landed(cn, m)
	return nil
}

// landed finishes a message whose data is all in: its completion handler,
// its target counter, then its acknowledgement, in that order, so the
// origin's Cmpl never counts before the handler returned.
func (c *Context) landed(cn *conn, m *inMsg) {
	if m.drop {
		c.ack(cn, m.id|ackFailed)
		return
	}
	finish := func() {
		if m.tgt != nil {
			m.tgt.add(1)
		}
		c.mu.Lock()
		c.stats.Received++
		c.mu.Unlock()
		c.ack(cn, m.id)
	}
	switch {
	case m.ret.Completion == nil:
		finish()
	case m.ret.Inline:
		m.ret.Completion()
		finish()
	default:
		go func() {
			m.ret.Completion()
			finish()
			c.ws.Wake() // the progress goroutine sends the acknowledgement
		}()
	}
}

// ack queues an acknowledgement for cn.
func (c *Context) ack(cn *conn, a uint32) {
	c.mu.Lock()
	if cn.err == nil {
		cn.acks = append(cn.acks, a)
	}
	c.mu.Unlock()
}

func (c *Context) barrierArrived(uhdr []byte) {
	if len(uhdr) != 8 {
		return
	}
	e := binary.LittleEndian.Uint64(uhdr)
	c.mu.Lock()
	c.arrived[e]++
	c.notify()
	c.mu.Unlock()
}

// ticker sets the tick and wakes the progress goroutine every probeEvery
// while messages are outstanding.
func (c *Context) ticker(ctx context.Context) {
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.mu.Lock()
			busy := c.pending > 0
			c.mu.Unlock()
			if busy {
				c.tick.Store(true)
				c.ws.Wake()
			}
		}
	}
}

// probe sends a packet to a task that has messages of ours outstanding and
// has said nothing since the last look, even without a credit: to a live
// task it is one more buffer it returns like any other (an RNR at worst,
// which the QP retries without end), to a task that is gone it is a send
// that fails once the QP's retries run out, which purges the task. Without
// it a task waiting for credits from a dead peer, with nothing in flight,
// would wait forever. Under mu.
func (c *Context) probe(cn *conn) {
	silent := cn.heard == cn.heardSeen
	cn.heardSeen = cn.heard
	if !silent || cn.probing || cn.err != nil || len(cn.sendq) == 0 && len(cn.sent) == 0 || len(c.free) == 0 {
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
	cn.dirtyOut = true
	c.stats.CtrlPackets++
}
