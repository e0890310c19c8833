package bridge

import (
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/event"
)

// Channel is a completion channel (struct ibv_comp_channel). Its fd is an
// epoll set over its CQs' own fds (CQ.FD, each registered one-shot: a CQ
// fires once per ReqNotify) and an eventfd that stands for the CQs armed
// while they held completions already (pending). The program may poll(2)
// the fd; GetEvent waits on it.
type Channel struct {
	ID  uint32
	ctx *Context
	FD  int // the epoll fd: ibv_comp_channel.fd

	efd     int // readable while pending holds CQs
	mu      sync.Mutex
	pending []*CQ
	cqs     int
}

// CreateChannel makes a completion channel.
func (c *Context) CreateChannel() (*Channel, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("ibverbs: completion channel: %w", err)
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		_ = unix.Close(ep)
		return nil, fmt.Errorf("ibverbs: completion channel: %w", err)
	}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, efd, &unix.EpollEvent{Events: unix.EPOLLIN}); err != nil {
		_ = unix.Close(ep)
		_ = unix.Close(efd)
		return nil, fmt.Errorf("ibverbs: completion channel: %w", err)
	}
	ch := &Channel{ctx: c, FD: ep, efd: efd}
	ch.ID = chs.put(ch)
	return ch, nil
}

// Destroy closes the channel; one CQs still use is EBUSY.
func (ch *Channel) Destroy() error {
	ch.mu.Lock()
	n := ch.cqs
	ch.mu.Unlock()
	if n > 0 {
		return fmt.Errorf("%w: %d CQs use the channel", vfrdma.ErrBusy, n)
	}
	chs.del(ch.ID)
	return ch.close()
}

func (ch *Channel) close() error {
	return errors.Join(unix.Close(ch.FD), unix.Close(ch.efd))
}

func (ch *Channel) add(cq *CQ) error {
	fd, err := cq.cq.FD()
	if err != nil {
		return err
	}
	// Registered disarmed (no events): ReqNotify arms it.
	ev := unix.EpollEvent{Events: 0, Fd: int32(fd)}
	putID(&ev, cq.ID)
	cq.fd, cq.ch = fd, ch
	if err := unix.EpollCtl(ch.FD, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		_ = unix.Close(fd)
		cq.fd, cq.ch = -1, nil
		return fmt.Errorf("ibverbs: completion channel: %w", err)
	}
	ch.mu.Lock()
	ch.cqs++
	ch.mu.Unlock()
	return nil
}

// putID keeps the CQ's id in the event's data (Fd holds the fd; Pad the id).
func putID(ev *unix.EpollEvent, id uint32) { ev.Pad = int32(id) }

func (ch *Channel) remove(cq *CQ) {
	if cq.fd < 0 {
		return
	}
	_ = unix.EpollCtl(ch.FD, unix.EPOLL_CTL_DEL, cq.fd, nil)
	_ = unix.Close(cq.fd)
	cq.fd = -1
	ch.mu.Lock()
	ch.cqs--
	for i, p := range ch.pending {
		if p == cq {
			ch.pending = append(ch.pending[:i], ch.pending[i+1:]...)
			break
		}
	}
	ch.mu.Unlock()
}

// arm arms the CQ and its entry in the epoll set (one-shot). A CQ that
// holds completions already is made pending: the channel reports it at
// once.
func (ch *Channel) arm(cq *CQ) error {
	err := cq.cq.TryWait()
	if errors.Is(err, event.ErrAgain) {
		ch.mu.Lock()
		queued := false
		for _, p := range ch.pending {
			queued = queued || p == cq
		}
		if !queued {
			ch.pending = append(ch.pending, cq)
		}
		ch.mu.Unlock()
		var one = [8]byte{1}
		_, _ = unix.Write(ch.efd, one[:])
		return nil
	}
	if err != nil {
		return err
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLONESHOT, Fd: int32(cq.fd)}
	putID(&ev, cq.ID)
	if err := unix.EpollCtl(ch.FD, unix.EPOLL_CTL_MOD, cq.fd, &ev); err != nil {
		return fmt.Errorf("ibverbs: arm CQ: %w", err)
	}
	return nil
}

// GetEvent returns the next CQ that fired (ibv_get_cq_event): it waits
// for one unless the channel's fd is non-blocking (O_NONBLOCK), where it
// returns EAGAIN at once.
func (ch *Channel) GetEvent() (*CQ, error) {
	fl, err := unix.FcntlInt(uintptr(ch.FD), unix.F_GETFL, 0)
	if err != nil {
		return nil, err
	}
	timeout := -1
	if fl&unix.O_NONBLOCK != 0 {
		timeout = 0
	}
	for {
		if cq := ch.popPending(); cq != nil {
			cq.events.Add(1)
			return cq, nil
		}
		var evs [1]unix.EpollEvent
		n, err := unix.EpollWait(ch.FD, evs[:], timeout)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, unix.EAGAIN
		}
		if int(evs[0].Fd) == ch.efd {
			continue // popPending takes it
		}
		cq := cqs.get(uint32(evs[0].Pad))
		if cq == nil || cq.ch != ch {
			continue // destroyed meanwhile
		}
		cq.events.Add(1)
		return cq, nil
	}
}

func (ch *Channel) popPending() *CQ {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if len(ch.pending) == 0 {
		var b [8]byte
		_, _ = unix.Read(ch.efd, b[:]) // clear a stale count
		return nil
	}
	cq := ch.pending[0]
	ch.pending = ch.pending[1:]
	if len(ch.pending) == 0 {
		var b [8]byte
		_, _ = unix.Read(ch.efd, b[:])
	}
	return cq
}
