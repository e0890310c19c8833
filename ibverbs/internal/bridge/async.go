package bridge

import (
	"golang.org/x/sys/unix"
	"unsafe"

	"github.com/vfrdma/vfrdma"
)

// The verbs' async event types (enum ibv_event_type; the device's are the
// same numbers).
const (
	EventCQErr           = 0
	EventQPFatal         = 1
	EventQPReqErr        = 2
	EventQPAccessErr     = 3
	EventDeviceFatal     = 8
	EventPortActive      = 9
	EventPortErr         = 10
	EventSRQErr          = 14
	EventSRQLimitReached = 15
	EventQPLastWQE       = 16
)

// AsyncEvent is struct ibv_async_event: the type and the C structure of
// the object it names (User), or the port.
type AsyncEvent struct {
	Type int
	User unsafe.Pointer
	Port int
}

// forwardAsync moves the device's events into the queue until the device
// closes its channel.
func (c *Context) forwardAsync() {
	defer close(c.fwdDone)
	for ev := range c.Dev.AsyncEvents() {
		e := AsyncEvent{Type: int(ev.Type), Port: ev.Port}
		switch {
		case ev.Type == EventSRQLimitReached:
			continue // the SRQ's low watermark raises it (SRQ.limitReached)
		case ev.QP != nil:
			e.User = c.userOfQP(ev.QP)
		case ev.CQ != nil:
			e.User = c.userOfCQ(ev.CQ)
		case ev.SRQ != nil:
			e.User = c.userOfSRQ(ev.SRQ)
		}
		if (ev.QP != nil || ev.CQ != nil || ev.SRQ != nil) && e.User == nil {
			continue // an object the program destroyed
		}
		c.pushAsync(e)
	}
}

func (c *Context) userOfQP(q *vfrdma.QP) unsafe.Pointer {
	c.objMu.Lock()
	defer c.objMu.Unlock()
	if b := c.qpOf[q]; b != nil {
		return b.User
	}
	return nil
}

func (c *Context) userOfCQ(q *vfrdma.CQ) unsafe.Pointer {
	c.objMu.Lock()
	defer c.objMu.Unlock()
	if b := c.cqOf[q]; b != nil {
		return b.User
	}
	return nil
}

func (c *Context) userOfSRQ(q *vfrdma.SRQ) unsafe.Pointer {
	c.objMu.Lock()
	defer c.objMu.Unlock()
	if b := c.srqOf[q]; b != nil {
		return b.User
	}
	return nil
}

// pushAsync queues an event and counts it in the eventfd.
func (c *Context) pushAsync(e AsyncEvent) {
	c.amu.Lock()
	c.aq = append(c.aq, e)
	c.amu.Unlock()
	one := [8]byte{1}
	_, _ = unix.Write(c.asyncFD, one[:])
}

// purgeAsync drops the queued events that name the object at user (about
// to be freed).
func (c *Context) purgeAsync(user unsafe.Pointer) {
	if user == nil {
		return
	}
	c.amu.Lock()
	defer c.amu.Unlock()
	kept := c.aq[:0]
	for _, e := range c.aq {
		if e.User == user {
			// one count per event, taken without blocking: a count
			// whose event is gone only wakes a reader once more
			pfd := []unix.PollFd{{Fd: int32(c.asyncFD), Events: unix.POLLIN}}
			if n, _ := unix.Poll(pfd, 0); n == 1 {
				var b [8]byte
				_, _ = unix.Read(c.asyncFD, b[:])
			}
			continue
		}
		kept = append(kept, e)
	}
	c.aq = kept
}

// NextAsyncEvent waits for the next event (ibv_get_async_event): it reads
// the eventfd, so it blocks unless the program made async_fd
// non-blocking, where it returns EAGAIN.
func (c *Context) NextAsyncEvent() (AsyncEvent, error) {
	for {
		var b [8]byte
		_, err := unix.Read(c.asyncFD, b[:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return AsyncEvent{}, err
		}
		c.amu.Lock()
		if len(c.aq) == 0 {
			c.amu.Unlock()
			continue
		}
		e := c.aq[0]
		c.aq = c.aq[1:]
		c.amu.Unlock()
		return e, nil
	}
}
