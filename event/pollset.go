package event

import (
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
)

// DefaultIdleAfter is how many consecutive empty polls make a member idle.
const DefaultIdleAfter = 64

// PollSet progresses many sources in one call and returns the caller's
// context of each that has events (fi_poll). A member is hot or idle. Poll
// checks every hot member; a hot member whose source has a Syncer (a CQ)
// and that stays empty for IdleAfter polls is armed and goes idle, and
// from then on costs Poll nothing until its source wakes it. Members
// without a Syncer (counters) stay hot. A PollSet is safe for concurrent
// use; Poll holds its lock.
//
// Lifecycle: Close is refused with ErrBusy while the set has members
// (remove them first, as for a WaitSet); after Close, Add, Remove and Poll
// return an error wrapping ErrClosed, and a second Close returns nil. A
// Poll racing Close completes first or returns ErrClosed. The zero PollSet
// is ready to use, like NewPollSet's.
type PollSet[C any] struct {
	mu        sync.Mutex
	members   []*pmember[C] // by slot; nil where free
	free      []int32
	hot       []int32
	cursor    int
	words     []*atomic.Uint64 // one bit per slot: woken while idle
	syncers   []Syncer
	syncRefs  map[Syncer]int
	idleAfter int // 0: DefaultIdleAfter
	stats     PollStats
	closed    bool
}

// PollStats count what a poll set did.
type PollStats struct {
	Polls   uint64 // Poll calls
	Checked uint64 // member checks (Ready calls)
	Idled   uint64 // members that went idle (one arm each)
	Woken   uint64 // idle members woken back
}

type pmember[C any] struct {
	word    *atomic.Uint64
	bit     uint64
	slot    int32
	src     Source
	ctx     C
	mark    uint64
	sync    Syncer // nil: never idle
	idle    bool
	empties int
}

// Wake marks the member woken: the next Poll checks it.
func (m *pmember[C]) Wake() { m.word.Or(m.bit) }

// NewPollSet returns an empty poll set.
func NewPollSet[C any]() *PollSet[C] {
	return &PollSet[C]{syncRefs: map[Syncer]int{}, idleAfter: DefaultIdleAfter}
}

// SetIdleAfter sets how many consecutive empty polls make a member idle
// (at least 1; a huge value keeps every member hot).
func (ps *PollSet[C]) SetIdleAfter(n int) {
	ps.mu.Lock()
	ps.idleAfter = max(n, 1)
	ps.mu.Unlock()
}

// Add makes src a member with the caller's context ctx, which Poll returns
// when src has events. A source already in the set is refused with
// ErrBusy.
func (ps *PollSet[C]) Add(src Source, ctx C) error {
	if err := checkComparable("Source", src); err != nil {
		return fmt.Errorf("add to poll set: %w", err)
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.closed {
		return fmt.Errorf("add to poll set: %w", ErrClosed)
	}
	if ps.find(src) >= 0 {
		return fmt.Errorf("add to poll set: %w: already a member", ErrBusy)
	}
	var slot int32
	if k := len(ps.free); k > 0 {
		slot, ps.free = ps.free[k-1], ps.free[:k-1]
	} else {
		slot = int32(len(ps.members))
		ps.members = append(ps.members, nil)
		if int(slot)/64 >= len(ps.words) {
			ps.words = append(ps.words, new(atomic.Uint64))
		}
	}
	m := &pmember[C]{word: ps.words[slot/64], bit: 1 << (slot % 64), slot: slot, src: src, ctx: ctx, mark: ^uint64(0)}
	if s, ok := src.(Synced); ok {
		m.sync = s.Syncer()
	}
	if err := src.Watch(m); err != nil {
		ps.free = append(ps.free, slot)
		return fmt.Errorf("add to poll set: %w", err)
	}
	m.word.And(^m.bit)
	ps.members[slot] = m
	ps.hot = append(ps.hot, slot)
	if m.sync != nil {
		if ps.syncRefs == nil {
			ps.syncRefs = map[Syncer]int{}
		}
		if ps.syncRefs[m.sync]++; ps.syncRefs[m.sync] == 1 {
			ps.syncers = append(ps.syncers, m.sync)
		}
	}
	return nil
}

func (ps *PollSet[C]) find(src Source) int32 {
	for i, m := range ps.members {
		if m != nil && m.src == src {
			return int32(i)
		}
	}
	return -1
}

// Remove takes src out of the set; a source not in it is refused with
// ErrInvalid.
func (ps *PollSet[C]) Remove(src Source) error {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.closed {
		return fmt.Errorf("remove from poll set: %w", ErrClosed)
	}
	slot := ps.find(src)
	if slot < 0 {
		return fmt.Errorf("remove from poll set: %w: not a member", errInvalid)
	}
	m := ps.members[slot]
	src.Unwatch(m)
	ps.members[slot] = nil
	ps.free = append(ps.free, slot)
	if !m.idle {
		// Keep the cursor on the member next in turn.
		if i := slices.Index(ps.hot, slot); i >= 0 {
			ps.hot = slices.Delete(ps.hot, i, i+1)
			if i < ps.cursor {
				ps.cursor--
			}
		}
	}
	m.word.And(^m.bit)
	if m.sync != nil {
		if ps.syncRefs[m.sync]--; ps.syncRefs[m.sync] == 0 {
			delete(ps.syncRefs, m.sync)
			ps.syncers = slices.DeleteFunc(ps.syncers, func(s Syncer) bool { return s == m.sync })
		}
	}
	return nil
}

// Close ends the set. A set that still has members is refused with
// ErrBusy: remove them first. A second Close returns nil.
func (ps *PollSet[C]) Close() error {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.closed {
		return nil
	}
	if n := len(ps.members) - len(ps.free); n > 0 {
		return fmt.Errorf("close poll set: %w: %d members; remove them first", ErrBusy, n)
	}
	ps.closed = true
	return nil
}

// Len returns the number of members.
func (ps *PollSet[C]) Len() int {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return len(ps.members) - len(ps.free)
}

// Stats returns the set's counts.
func (ps *PollSet[C]) Stats() PollStats {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.stats
}

// Poll progresses the members and puts into out the context of each that
// has events: a source that is not empty, a counter that counted since the
// last Poll. It returns how many it put. Every member with events is
// returned, up to len(out); the rest come in the next calls, which start
// where this one stopped. It may return a member that has nothing (a false
// positive), never leave out one with events from before the call. Poll
// allocates nothing. Its cost is one check per hot member (a CQ: one load
// of its ring index) and one load per 64 idle members.
func (ps *PollSet[C]) Poll(out []C) (int, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.closed {
		return 0, fmt.Errorf("poll set: %w", ErrClosed)
	}
	ps.stats.Polls++
	if len(out) == 0 {
		return 0, nil
	}
	// Deliver the wake-ups that are due, then move woken idle members to
	// the hot list: an event from before the call is now a mark or a hot
	// member.
	for _, s := range ps.syncers {
		if err := s.Sync(); err != nil {
			return 0, fmt.Errorf("poll set: %w", err)
		}
	}
	for wi, w := range ps.words {
		if w.Load() == 0 {
			continue
		}
		for b := w.Swap(0); b != 0; b &= b - 1 {
			slot := wi*64 + bits.TrailingZeros64(b)
			if m := ps.members[slot]; m != nil && m.idle {
				m.idle, m.empties = false, 0
				ps.hot = append(ps.hot, int32(slot))
				ps.stats.Woken++
			}
		}
	}
	idleAfter := ps.idleAfter
	if idleAfter == 0 {
		idleAfter = DefaultIdleAfter
	}
	n, idled := 0, false
	h := len(ps.hot)
	start := ps.cursor
	if start >= h {
		start = 0
	}
	for k := 0; k < h && n < len(out); k++ {
		i := start + k
		if i >= h {
			i -= h
		}
		m := ps.members[ps.hot[i]]
		ps.stats.Checked++
		ok, err := m.src.Ready(false, &m.mark)
		if err != nil {
			ps.cursor = i
			return n, fmt.Errorf("poll set: %w", err)
		}
		if !ok && m.sync != nil {
			if m.empties++; m.empties >= idleAfter {
				// Clear a stale wake-up, arm, and look once more: an event
				// after the arming wakes the member again.
				m.word.And(^m.bit)
				if ok, err = m.src.Ready(true, &m.mark); err != nil {
					ps.cursor = i
					return n, fmt.Errorf("poll set: %w", err)
				}
				if !ok {
					m.idle, idled = true, true
					ps.stats.Idled++
				}
			}
		}
		if ok {
			m.empties = 0
			out[n] = m.ctx
			n++
			ps.cursor = i + 1
		}
	}
	if idled {
		// Drop the idled members, keeping the cursor on the member next in
		// turn so that the next call neither skips nor repeats one.
		k, cursor := 0, ps.cursor
		for i, s := range ps.hot {
			if !ps.members[s].idle {
				ps.hot[k] = s
				k++
			} else if i < ps.cursor {
				cursor--
			}
		}
		ps.hot, ps.cursor = ps.hot[:k], cursor
	}
	return n, nil
}
