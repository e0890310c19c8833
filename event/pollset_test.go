package event

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func pollOnce[C any](t testing.TB, ps *PollSet[C], room int) []C {
	t.Helper()
	out := make([]C, room)
	n, err := ps.Poll(out)
	require.NoError(t, err)
	return out[:n]
}

func TestPollSetAddAndRemoveRules(t *testing.T) {
	sy := &fakeSyncer{}
	fs := newFakeSources(sy, 3)
	ps := NewPollSet[int]()
	require.NoError(t, ps.Add(fs[0], 0))
	require.NoError(t, ps.Add(fs[1], 1))
	assert.ErrorIs(t, ps.Add(fs[0], 9), ErrBusy, "the same source twice")
	assert.ErrorIs(t, ps.Add(nil, 9), errInvalid, "a nil source")
	assert.ErrorIs(t, ps.Add(sliceSource{fs[2], nil}, 9), errInvalid, "a source that cannot be compared")
	assert.Equal(t, 2, ps.Len())
	assert.Equal(t, 1, fs[0].watchers.Len(), "a refused Add watched the source again")
	assert.ErrorIs(t, ps.Remove(fs[2]), errInvalid, "Remove of a non-member")

	fs[0].produce(1)
	fs[1].produce(1)
	require.NoError(t, ps.Remove(fs[0]))
	assert.Zero(t, fs[0].watchers.Len(), "Remove left the source watched")
	assert.Equal(t, []int{1}, pollOnce(t, ps, 4), "a removed member was returned")
	require.NoError(t, ps.Add(fs[2], 2)) // takes the free slot
	fs[2].produce(1)
	got := pollOnce(t, ps, 4)
	slices.Sort(got)
	assert.Equal(t, []int{1, 2}, got)
	require.NoError(t, ps.Add(fs[0], 10), "re-adding a removed source")
	got = pollOnce(t, ps, 4)
	slices.Sort(got)
	assert.Equal(t, []int{1, 2, 10}, got, "a re-added source returns with its new context")
	assert.Equal(t, 3, ps.Len())
	n, err := ps.Poll(nil)
	require.NoError(t, err)
	assert.Zero(t, n, "no room")
}

// Poll returns the context of every source that holds events and of every
// counter that counted since the last Poll, and of nothing else once the
// new members' first look is past.
func TestPollReturnsNonEmptySourcesAndCountersThatCounted(t *testing.T) {
	sy := &fakeSyncer{}
	fs := newFakeSources(sy, 6)
	cs := []*Counter{NewCounter(), NewCounter(), NewCounter()}
	ps := NewPollSet[string]()
	for i, f := range fs {
		require.NoError(t, ps.Add(f, fmt.Sprint("s", i)))
	}
	for i, c := range cs {
		require.NoError(t, ps.Add(c, fmt.Sprint("c", i)))
	}
	pollOnce(t, ps, 16) // a new counter may be reported once
	assert.Empty(t, pollOnce(t, ps, 16), "returned with nothing happening")

	fs[1].produce(1)
	fs[4].produce(3)
	cs[0].Count(1)
	cs[2].CountErr(1)
	got := pollOnce(t, ps, 16)
	slices.Sort(got)
	assert.Equal(t, []string{"c0", "c2", "s1", "s4"}, got)

	got = pollOnce(t, ps, 16)
	slices.Sort(got)
	assert.Equal(t, []string{"s1", "s4"}, got, "sources that still hold events come back; counters that did not count again do not")
	fs[1].drain()
	cs[2].Count(2)
	got = pollOnce(t, ps, 16)
	slices.Sort(got)
	assert.Equal(t, []string{"c2", "s4"}, got)
	fs[4].drain()
	assert.Empty(t, pollOnce(t, ps, 16))
	for _, c := range cs {
		require.NoError(t, ps.Remove(c))
		require.NoError(t, c.Close())
	}
}

// A counter's Add, AddErr, Set and SetErr are not events: Poll does not
// report them.
func TestPollDoesNotReportCounterAddOrSet(t *testing.T) {
	c := NewCounter()
	ps := NewPollSet[int]()
	require.NoError(t, ps.Add(c, 7))
	pollOnce(t, ps, 4) // a new member may be reported once
	c.Add(5)
	c.AddErr(1)
	c.Set(9)
	c.SetErr(0)
	assert.Empty(t, pollOnce(t, ps, 4), "Add or Set reported")
	c.Count(1)
	assert.Equal(t, []int{7}, pollOnce(t, ps, 4))
	c.CountErr(1)
	assert.Equal(t, []int{7}, pollOnce(t, ps, 4))
	assert.Empty(t, pollOnce(t, ps, 4))
	require.NoError(t, ps.Remove(c))
}

// With less room than ready members, the next calls start where the last
// stopped: members that stay ready are returned in turn, each as often as
// the others.
func TestPollWithSmallRoomReturnsTheRestInTheNextCalls(t *testing.T) {
	const members, room = 10, 3
	fs := newFakeSources(&fakeSyncer{}, members)
	ps := NewPollSet[int]()
	ps.SetIdleAfter(1)
	for i, f := range fs {
		require.NoError(t, ps.Add(f, i))
		f.produce(1) // never drained
	}
	seen := map[int]int{}
	for range 4 { // ceil(10/3) calls
		got := pollOnce(t, ps, room)
		assert.Len(t, got, room)
		for _, i := range got {
			seen[i]++
		}
	}
	assert.Len(t, seen, members, "not every ready member came back within ceil(members/room) calls: %v", seen)
	for range 6 { // 10 calls in all: 30 returns, 3 each
		for _, i := range pollOnce(t, ps, room) {
			seen[i]++
		}
	}
	for i := range members {
		assert.Equal(t, room, seen[i], "member %d: unfair turns %v", i, seen)
	}
}

// The next call starts where the last one stopped even when members leave
// the hot list in between: members that idle during a Poll, or a member
// removed before the cursor, must not make Poll skip the members that
// were next in turn.
func TestPollNextCallStartsWhereTheLastStoppedWhenHotMembersLeave(t *testing.T) {
	const members, room = 10, 3
	t.Run("idled", func(t *testing.T) {
		fs := newFakeSources(&fakeSyncer{}, members)
		ps := NewPollSet[int]()
		ps.SetIdleAfter(1)
		for i, f := range fs {
			require.NoError(t, ps.Add(f, i))
			f.produce(1)
		}
		for range 10 { // a whole number of turns: the next starts at member 0
			pollOnce(t, ps, room)
		}
		for i := 0; i < members; i += 2 {
			fs[i].drain() // they go idle in the next calls
		}
		// 5 ready members, room 3: the first call returns 1, 3, 5 and idles
		// 0, 2, 4; the second starts at the member next in turn, so 7 and
		// 9 come before 1 comes again.
		assert.Equal(t, []int{1, 3, 5}, pollOnce(t, ps, room))
		assert.Equal(t, []int{7, 9, 1}, pollOnce(t, ps, room), "the members next in turn were skipped")
	})
	t.Run("removed", func(t *testing.T) {
		fs := newFakeSources(&fakeSyncer{}, members)
		ps := NewPollSet[int]()
		ps.SetIdleAfter(1 << 30)
		for i, f := range fs {
			require.NoError(t, ps.Add(f, i))
			f.produce(1)
		}
		assert.Equal(t, []int{0, 1, 2}, pollOnce(t, ps, room))
		require.NoError(t, ps.Remove(fs[0]))
		assert.Equal(t, []int{3, 4, 5}, pollOnce(t, ps, room), "the member next in turn was skipped")
	})
}

// An empty member with a Syncer goes idle after IdleAfter empty polls,
// costs no check while idle, and is returned by the first Poll after an
// event on it: that Poll's own Sync delivers the notification.
func TestPollSetIdleMemberCostsNothingAndWakesOnItsNextEvent(t *testing.T) {
	sy := &fakeSyncer{}
	fs := newFakeSources(sy, 4)
	c := NewCounter()
	ps := NewPollSet[int]()
	ps.SetIdleAfter(2)
	for i, f := range fs {
		require.NoError(t, ps.Add(f, i))
	}
	require.NoError(t, ps.Add(c, 99))
	pollOnce(t, ps, 8) // a new counter may be reported once
	assert.Zero(t, ps.Stats().Idled, "idle after one empty poll")
	assert.Empty(t, pollOnce(t, ps, 8))
	st := ps.Stats()
	assert.EqualValues(t, 4, st.Idled, "empty members with a syncer idle after 2 polls; counters never")
	assert.EqualValues(t, 2, st.Polls)
	for i, f := range fs {
		assert.True(t, f.armed.Load(), "member %d went idle unarmed", i)
	}

	readies := make([]int64, len(fs))
	for i, f := range fs {
		readies[i] = f.readies.Load()
	}
	for range 10 {
		assert.Empty(t, pollOnce(t, ps, 8))
	}
	st2 := ps.Stats()
	assert.EqualValues(t, st.Checked+10, st2.Checked, "idle members were checked (only the counter should be)")
	for i, f := range fs {
		assert.Equal(t, readies[i], f.readies.Load(), "idle member %d was checked", i)
	}

	syncs := sy.syncs.Load()
	fs[2].produce(1) // notification queued, not delivered
	assert.Equal(t, []int{2}, pollOnce(t, ps, 8), "the first Poll after the event")
	assert.Greater(t, sy.syncs.Load(), syncs, "Poll did not sync")
	assert.EqualValues(t, 1, ps.Stats().Woken)
	assert.Equal(t, []int{2}, pollOnce(t, ps, 8), "a woken member with events stays hot")

	// Drained, it idles again, re-armed, and wakes again.
	for round := range 5 {
		fs[2].drain()
		idled := ps.Stats().Idled
		pollOnce(t, ps, 8)
		pollOnce(t, ps, 8)
		assert.Equal(t, idled+1, ps.Stats().Idled, "round %d: did not idle again", round)
		assert.True(t, fs[2].armed.Load())
		fs[2].produce(2)
		assert.Equal(t, []int{2}, pollOnce(t, ps, 8), "round %d", round)
	}
	fs[2].drain()

	// The counter stays hot: it is reported when it counts.
	c.Count(1)
	fs[0].produce(1)
	got := pollOnce(t, ps, 8)
	slices.Sort(got)
	assert.Equal(t, []int{0, 99}, got)

	// An idle member removed and re-added is hot again.
	fs[0].drain()
	pollOnce(t, ps, 8)
	pollOnce(t, ps, 8)
	require.NoError(t, ps.Remove(fs[1]))
	fs[1].armed.Store(false) // no notification will come
	fs[1].produce(1)
	require.NoError(t, ps.Add(fs[1], 11))
	assert.Equal(t, []int{11}, pollOnce(t, ps, 8), "a re-added member with events")
	require.NoError(t, ps.Remove(c))
	require.NoError(t, c.Close())
}

// An event that lands after Poll found a member empty, just before it arms
// it to go idle, is not lost: the look after the arming sees it.
func TestPollIdlingMemberKeepsAnEventThatLandsBeforeItIsArmed(t *testing.T) {
	sy := &fakeSyncer{}
	f := &fakeSource{syncer: sy}
	ps := NewPollSet[int]()
	ps.SetIdleAfter(2)
	require.NoError(t, ps.Add(f, 5))
	assert.Empty(t, pollOnce(t, ps, 4))
	fired := false
	f.inReady = func(f *fakeSource, arm bool) {
		if !arm && !fired { // it looked empty; not armed yet: no notification
			fired = true
			f.produce(1)
		}
	}
	got := pollOnce(t, ps, 4) // the second empty look: it arms to go idle
	require.True(t, fired)
	got = append(got, pollOnce(t, ps, 4)...)
	assert.Contains(t, got, 5, "the event that landed before the arming was lost (stats %+v)", ps.Stats())
}

// An event that lands while TryWait checks the members, on a member
// already checked or not, with its notification delivered at once, either
// shows in the checks (ErrAgain) or leaves the wait object set.
func TestTryWaitEventDuringTheChecksShowsOrSignals(t *testing.T) {
	const n = 4
	for _, kind := range []Kind{FD, Chan} {
		for k := range n { // the member being checked
			for j := range n { // the member that gets the event
				t.Run(fmt.Sprintf("%v/checking=%d/event=%d", kind, k, j), func(t *testing.T) {
					sy := &fakeSyncer{}
					fs := newFakeSources(sy, n)
					ws := newSetWith(t, kind, asSources(fs)...)
					require.NoError(t, ws.TryWait())
					fired := false
					fs[k].inReady = func(_ *fakeSource, arm bool) {
						if arm && !fired {
							fired = true
							fs[j].produce(1)
							_ = sy.Sync() // the interrupt, at once
						}
					}
					err := ws.TryWait()
					require.True(t, fired)
					if err == nil {
						assert.True(t, signaled(t, ws), "TryWait said sleep, and the wait object is clear: a lost wake-up")
					} else {
						assert.ErrorIs(t, err, ErrAgain)
					}
				})
			}
		}
	}
}

// A counter driving a source, in a poll set: Poll progresses it, so the
// counter counts and is reported with nobody polling the source.
func TestPollProgressesDrivenCounters(t *testing.T) {
	sy := &fakeSyncer{}
	c := NewCounter()
	d := &fakeSource{syncer: sy, counter: c}
	require.NoError(t, c.Drive(d))
	ps := NewPollSet[int]()
	require.NoError(t, ps.Add(c, 1))
	pollOnce(t, ps, 4)
	assert.Empty(t, pollOnce(t, ps, 4))
	d.produce(3)
	assert.Equal(t, []int{1}, pollOnce(t, ps, 4))
	assert.EqualValues(t, 3, c.Value(), "Poll did not progress the driven source")
	assert.Empty(t, pollOnce(t, ps, 4))
	require.NoError(t, ps.Remove(c))
	require.NoError(t, c.Close())
}

// The model: 64 sources and 8 counters, a random run of events, drains,
// counts, adjustments, removals and additions, deliveries and Poll rounds.
// A round calls Poll (random room) until it returns less than its room,
// taking what it returns. Every member that held events when the round
// began (a source not empty, a counter that counted since it was last
// returned) must have been returned by the end of the round.
func TestPollHasNoFalseNegatives(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) { pollModelRun(t, seed) })
	}
}

func pollModelRun(t *testing.T, seed uint64) {
	const nsrc, ncnt, steps = 64, 8, 6000
	rng := rand.New(rand.NewPCG(seed, 99))
	sy := &fakeSyncer{}
	fs := newFakeSources(sy, nsrc)
	cs := make([]*Counter, ncnt)
	for i := range cs {
		cs[i] = NewCounter()
	}
	ps := NewPollSet[int]()
	idleAfter := 1 + rng.IntN(3)
	ps.SetIdleAfter(idleAfter)
	in := make([]bool, nsrc+ncnt)
	counted := make([]bool, ncnt) // counted since last returned
	src := func(id int) Source {
		if id < nsrc {
			return fs[id]
		}
		return cs[id-nsrc]
	}
	for id := range in {
		require.NoError(t, ps.Add(src(id), id))
		in[id] = true
	}
	// Now and then an event lands while Poll is looking at a member: on
	// that member or another, delivered at once or left queued.
	hooked := 0
	for _, f := range fs {
		f.inReady = func(_ *fakeSource, _ bool) {
			if rng.IntN(50) != 0 {
				return
			}
			hooked++
			fs[rng.IntN(nsrc)].produce(1)
			if rng.IntN(2) == 0 {
				_ = sy.Sync()
			}
		}
	}
	holds := func(id int) bool {
		if id < nsrc {
			return fs[id].pending.Load() > 0
		}
		return counted[id-nsrc]
	}
	rounds, returned, falsePos := 0, 0, 0
	for step := range steps {
		switch r := rng.IntN(100); {
		case r < 25: // a burst on a few sources
			for range 1 + rng.IntN(4) {
				fs[rng.IntN(nsrc)].produce(1 + rng.IntN(3))
			}
		case r < 33:
			i := rng.IntN(ncnt)
			if rng.IntN(2) == 0 {
				cs[i].Count(1)
			} else {
				cs[i].CountErr(1)
			}
			counted[i] = true
		case r < 38: // not events
			c := cs[rng.IntN(ncnt)]
			switch rng.IntN(4) {
			case 0:
				c.Add(2)
			case 1:
				c.AddErr(1)
			case 2:
				c.Set(uint64(rng.IntN(100)))
			default:
				c.SetErr(0)
			}
		case r < 46: // another consumer drains a source
			fs[rng.IntN(nsrc)].drain()
		case r < 50: // an early delivery
			require.NoError(t, sy.Sync())
		case r < 54:
			id := rng.IntN(nsrc + ncnt)
			if in[id] {
				require.NoError(t, ps.Remove(src(id)))
				in[id] = false
			} else {
				require.NoError(t, ps.Add(src(id), id))
				in[id] = true
			}
		default: // a Poll round
			rounds++
			var must []int
			for id := range in {
				if in[id] && holds(id) {
					must = append(must, id)
				}
			}
			room := 1 + rng.IntN(16)
			out := make([]int, room)
			got := map[int]bool{}
			for calls := 0; ; calls++ {
				require.Less(t, calls, 1000, "step %d: a Poll round does not end", step)
				n, err := ps.Poll(out)
				require.NoError(t, err)
				require.LessOrEqual(t, n, room)
				var this []int
				for _, id := range out[:n] {
					require.True(t, in[id], "step %d: returned member %d, which is not in the set", step, id)
					require.NotContains(t, this, id, "step %d: member %d twice in one Poll", step, id)
					this = append(this, id)
					got[id] = true
					returned++
					if !holds(id) {
						falsePos++
					}
					if id < nsrc {
						fs[id].drain()
					} else {
						counted[id-nsrc] = false
					}
				}
				if n < room {
					break
				}
			}
			for _, id := range must {
				if !got[id] {
					t.Fatalf("seed %d step %d: member %d held events before the round and was not returned (room %d, idle after %d, stats %+v)",
						seed, step, id, room, idleAfter, ps.Stats())
				}
			}
		}
	}
	st := ps.Stats()
	t.Logf("seed %d: %d rounds, %d returned, %d false positives, %d events inside Ready, stats %+v", seed, rounds, returned, falsePos, hooked, st)
	assert.Greater(t, st.Idled, uint64(100), "members seldom went idle: the run did not exercise idling")
	assert.Greater(t, st.Woken, uint64(100), "members seldom woke: the run did not exercise waking")
	for id := range in {
		if in[id] {
			require.NoError(t, ps.Remove(src(id)))
		}
	}
	for _, c := range cs {
		require.NoError(t, c.Close())
	}
}

// Concurrent: a producer and an interrupt goroutine against a consumer
// that polls and drains what Poll returns. With members idling and waking
// all the while, every event is taken.
func TestPollSetTakesEveryEventUnderConcurrentProducers(t *testing.T) {
	const total = 50_000
	sy := &fakeSyncer{}
	sy.startInterrupts(t)
	fs := newFakeSources(sy, 32)
	ps := NewPollSet[int]()
	ps.SetIdleAfter(2)
	for i, f := range fs {
		require.NoError(t, ps.Add(f, i))
	}
	var produced, taken atomic.Int64
	quit := make(chan struct{})
	defer close(quit)
	go func() {
		rng := rand.New(rand.NewPCG(5, 6))
		for n := 0; n < total; {
			k := min(1+rng.IntN(4), total-n)
			fs[rng.IntN(len(fs))].produce(k)
			n += k
			produced.Store(int64(n))
			if rng.IntN(64) == 0 { // a lull: members go idle
				for taken.Load() < int64(n) {
					select {
					case <-quit:
						return
					default:
					}
					time.Sleep(10 * time.Microsecond)
				}
			}
		}
	}()
	out := make([]int, 8)
	var got int64
	deadline := time.Now().Add(long)
	for got < total {
		n, err := ps.Poll(out)
		require.NoError(t, err)
		for _, i := range out[:n] {
			got += int64(fs[i].drain())
		}
		taken.Store(got)
		if n > 0 {
			deadline = time.Now().Add(long)
		} else {
			if time.Now().After(deadline) {
				t.Fatalf("%d produced, %d taken, nothing returned for %v: Poll misses a member", produced.Load(), got, long)
			}
			time.Sleep(time.Microsecond)
		}
	}
	assert.EqualValues(t, total, got)
	st := ps.Stats()
	t.Logf("stats %+v", st)
	assert.Positive(t, st.Woken, "no member woke: idling not exercised")
}

// The hot calls allocate nothing: Poll over 64 members (idle, hot, woken,
// counters), TryWait with nothing pending (FD and Chan), Counter.Read
// (plain and driving a source).
func TestHotCallsAllocateNothing(t *testing.T) {
	sy := &fakeSyncer{}
	fs := newFakeSources(sy, 60)
	cs := []*Counter{NewCounter(), NewCounter(), NewCounter(), NewCounter()}
	ps := NewPollSet[int]()
	ps.SetIdleAfter(2)
	for i, f := range fs {
		require.NoError(t, ps.Add(f, i))
	}
	for i, c := range cs {
		require.NoError(t, ps.Add(c, 100+i))
	}
	out := make([]int, 16)
	for range 4 {
		_, _ = ps.Poll(out)
	}
	fs[0].produce(1) // always hot
	idleRoundTrip := func() {
		fs[7].produce(1)
		cs[1].Count(1)
		n, err := ps.Poll(out)
		if err != nil || n != 3 {
			panic(fmt.Sprint("Poll: ", n, err))
		}
		fs[7].drain()
		_, _ = ps.Poll(out)
		_, _ = ps.Poll(out) // idle again
	}
	idleRoundTrip() // grow the syncer's buffers
	assert.Zero(t, testing.AllocsPerRun(200, func() { _, _ = ps.Poll(out) }), "PollSet.Poll, 64 members")
	assert.Zero(t, testing.AllocsPerRun(200, idleRoundTrip), "PollSet.Poll, a member woken and idled again")

	for _, kind := range []Kind{FD, Chan} {
		ws := newSetWith(t, kind, asSources(fs[8:16])...)
		require.NoError(t, ws.TryWait())
		assert.Zero(t, testing.AllocsPerRun(200, func() {
			if err := ws.TryWait(); err != nil {
				panic(err)
			}
		}), "WaitSet.TryWait on %v, nothing pending", kind)
		assert.Zero(t, testing.AllocsPerRun(200, func() {
			ws.Wake()
			if err := ws.TryWait(); err != nil {
				panic(err)
			}
		}), "WaitSet.Wake, then TryWait on %v (raise and drain)", kind)
	}

	assert.Zero(t, testing.AllocsPerRun(200, func() { _, _ = cs[2].Read() }), "Counter.Read")
	c := NewCounter()
	d := &fakeSource{syncer: sy, counter: c}
	require.NoError(t, c.Drive(d))
	assert.Zero(t, testing.AllocsPerRun(200, func() { _, _ = c.Read() }), "Counter.Read, driving a source")
	assert.Zero(t, testing.AllocsPerRun(200, func() { cs[3].Count(1) }), "Counter.Count in a poll set")
}
