package wq_test

import (
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/wq"
)

// Set maps small (direct) and large (hashed) keys and replaces; Remove
// drops a key only while it still maps to the value given; Lookup of
// anything else is nil.
func TestTableSetRemoveLookup(t *testing.T) {
	var tb wq.Table[int]
	a, b, c := new(int), new(int), new(int)
	assert.Nil(t, tb.Lookup(5), "an empty table")
	assert.Nil(t, tb.Lookup(0), "an empty table")
	assert.Nil(t, tb.Lookup(math.MaxUint32), "an empty table")
	assert.Zero(t, tb.Len())
	tb.Remove(5, a) // nothing to remove
	assert.Zero(t, tb.Len())
	tb.Set(0, c) // key 0 is a key like any other
	tb.Set(5, a)
	tb.Set(wq.DirectKeys-1, a) // the last direct key
	tb.Set(wq.DirectKeys, b)   // the first hashed one
	tb.Set(0xabcdef, b)
	tb.Set(math.MaxUint32, c)
	for k := uint32(2000); k < 2100; k++ { // many probes
		tb.Set(k, c)
	}
	assert.Equal(t, c, tb.Lookup(0))
	assert.Equal(t, a, tb.Lookup(5))
	assert.Equal(t, a, tb.Lookup(wq.DirectKeys-1))
	assert.Equal(t, b, tb.Lookup(wq.DirectKeys))
	assert.Equal(t, b, tb.Lookup(0xabcdef))
	assert.Equal(t, c, tb.Lookup(math.MaxUint32))
	for k := uint32(2000); k < 2100; k++ {
		require.Equal(t, c, tb.Lookup(k), "key %d", k)
	}
	assert.Nil(t, tb.Lookup(6))
	assert.Nil(t, tb.Lookup(wq.DirectKeys-2), "a direct key never set")
	assert.Nil(t, tb.Lookup(wq.DirectKeys+1), "a hashed key never set")
	assert.Nil(t, tb.Lookup(2100))
	assert.Nil(t, tb.Lookup(math.MaxUint32-1))
	assert.Equal(t, 106, tb.Len())

	tb.Remove(5, b) // 5 maps to a, not b
	assert.Equal(t, a, tb.Lookup(5))
	tb.Remove(0xabcdef, a)
	assert.Equal(t, b, tb.Lookup(0xabcdef))
	tb.Remove(0xabcdee, b) // a key never set
	assert.Equal(t, 106, tb.Len(), "a refused Remove changes nothing")
	tb.Remove(5, a)
	assert.Nil(t, tb.Lookup(5))
	tb.Remove(0, c)
	assert.Nil(t, tb.Lookup(0))
	tb.Remove(2050, c)
	assert.Nil(t, tb.Lookup(2050))
	assert.Equal(t, c, tb.Lookup(2051), "its neighbours stay")
	tb.Remove(2050, c)  // twice: nothing more
	tb.Set(0xabcdef, a) // replace
	assert.Equal(t, a, tb.Lookup(0xabcdef))
	tb.Set(wq.DirectKeys-1, c)
	assert.Equal(t, c, tb.Lookup(wq.DirectKeys-1))
	assert.Equal(t, 103, tb.Len(), "replacing adds no key")
	tb.Set(2051, nil) // a nil value removes
	tb.Set(6, nil)    // never set: nothing happens
	assert.Nil(t, tb.Lookup(2051))
	assert.Equal(t, 102, tb.Len())
}

// Lookups allocate nothing: direct, hashed, and missing keys.
func TestTableLookupAllocatesNothing(t *testing.T) {
	var tb wq.Table[int]
	assert.Zero(t, testing.AllocsPerRun(100, func() { tb.Lookup(7); tb.Lookup(1 << 30) }), "an empty table")
	v := new(int)
	for k := uint32(1); k < 5000; k += 7 {
		tb.Set(k, v)
	}
	tb.Remove(2003, v) // a tombstone on the way
	assert.Zero(t, testing.AllocsPerRun(100, func() {
		tb.Lookup(8)
		tb.Lookup(7)
		tb.Lookup(2003)
		tb.Lookup(2010)
		tb.Lookup(4999)
		tb.Lookup(math.MaxUint32)
	}))
}

// The hashed array grows with its keys, every key found after each
// growth; removing half leaves the other half.
func TestTableGrowsAndKeepsEveryKey(t *testing.T) {
	var tb wq.Table[uint32]
	rng := rand.New(rand.NewPCG(1, 2))
	keys := map[uint32]*uint32{}
	for len(keys) < 20000 {
		k := rng.Uint32()
		if len(keys)%2 == 0 {
			k = 1<<24 + uint32(len(keys)) // sequential, as QP aliases are
		}
		if _, dup := keys[k]; dup {
			continue
		}
		v := new(uint32)
		*v = k
		keys[k] = v
		tb.Set(k, v)
	}
	assert.Equal(t, len(keys), tb.Len())
	assert.GreaterOrEqual(t, wq.TableSlots(&tb), 4*(len(keys)-wq.DirectKeys)*3/8, "grown")
	i := 0
	for k, v := range keys {
		require.Same(t, v, tb.Lookup(k), "key %#x", k)
		if i%2 == 0 {
			tb.Remove(k, v)
			delete(keys, k)
		}
		i++
	}
	assert.Equal(t, len(keys), tb.Len())
	for k, v := range keys {
		require.Same(t, v, tb.Lookup(k), "key %#x", k)
	}
}

// A hashed array is rebuilt when a new key would fill it past three
// eighths: 6 keys fit in the first 16 slots, the 7th rebuilds it to 32.
// The direct array grows by doubling to the key set, up to directKeys.
func TestTableIsRebuiltPastThreeEighthsFull(t *testing.T) {
	var tb wq.Table[int]
	v := new(int)
	for k := uint32(0); k < 6; k++ {
		tb.Set(1<<20+k, v)
	}
	rebuilds, _ := wq.TableWork(&tb)
	assert.Equal(t, 1, rebuilds, "the first array")
	assert.Equal(t, 16, wq.TableSlots(&tb))
	tb.Set(1<<20+6, v)
	rebuilds, _ = wq.TableWork(&tb)
	assert.Equal(t, 2, rebuilds, "the 7th key")
	assert.Equal(t, 32, wq.TableSlots(&tb))

	var direct wq.Table[int]
	direct.Set(0, v)  // 16 entries
	direct.Set(15, v) // fits
	rebuilds, _ = wq.TableWork(&direct)
	assert.Equal(t, 1, rebuilds)
	direct.Set(16, v) // 32
	direct.Set(wq.DirectKeys-1, v)
	rebuilds, _ = wq.TableWork(&direct)
	assert.Equal(t, 3, rebuilds)
	assert.Zero(t, wq.TableSlots(&direct), "no hashed key, no hashed array")
	for k := uint32(0); k < wq.DirectKeys; k++ {
		direct.Set(k, v)
	}
	rebuilds, _ = wq.TableWork(&direct)
	assert.Equal(t, 3, rebuilds, "the direct array holds every direct key")
}

// A removed hashed key leaves a tombstone in its slot, which the same key
// takes again: setting and removing one key any number of times never
// rebuilds the table.
func TestTableTombstoneIsTakenAgainByItsKey(t *testing.T) {
	var tb wq.Table[int]
	v, w := new(int), new(int)
	for k := uint32(0); k < 5; k++ {
		tb.Set(1<<24+k, v)
	}
	before, _ := wq.TableWork(&tb)
	for range 10000 {
		tb.Set(1<<24+100, w)
		tb.Remove(1<<24+100, w)
		tb.Set(1<<24+2, w)
		tb.Remove(1<<24+2, w)
	}
	after, _ := wq.TableWork(&tb)
	assert.Equal(t, before, after)
	assert.Nil(t, tb.Lookup(1<<24+2))
	assert.Same(t, v, tb.Lookup(1<<24+3))
	assert.Equal(t, 4, tb.Len())
}

// A slot keeps its key until the array is rebuilt, tombstone or not: a
// new key never takes another's slot, so a reader that matched a slot's
// key reads a value set for that key, not one set for a key that took the
// slot between its two loads.
func TestTableSlotKeepsItsKeyUntilTheRebuild(t *testing.T) {
	var tb wq.Table[int]
	v := new(int)
	rng := rand.New(rand.NewPCG(9, 10))
	for round := 0; round < 200; round++ {
		rebuilds, _ := wq.TableWork(&tb)
		before := wq.TableSlotKeys(&tb)
		for range 3 {
			k := wq.DirectKeys + uint32(rng.IntN(1<<20))
			tb.Set(k, v)
			if rng.IntN(3) > 0 {
				tb.Remove(k, v) // a tombstone on later keys' way
			}
		}
		if now, _ := wq.TableWork(&tb); now != rebuilds {
			continue // a new array: its slots are new
		}
		after := wq.TableSlotKeys(&tb)
		for i, k := range before {
			if k != 0 {
				require.Equal(t, k, after[i], "round %d: slot %d changed key", round, i)
			}
		}
	}
}

// Tombstones of keys not set again (QP aliases are never reused) are
// swept by the next rebuild: a table of few live keys stays small however
// many keys pass through it.
func TestTableTombstonesOfOtherKeysAreSweptByRebuilds(t *testing.T) {
	var tb wq.Table[int]
	v := new(int)
	for k := uint32(0); k < 4; k++ {
		tb.Set(1<<20+k, v) // stay
	}
	for k := uint32(1 << 24); k < 1<<24+100000; k++ {
		tb.Set(k, v)
		tb.Remove(k, v)
	}
	assert.LessOrEqual(t, wq.TableSlots(&tb), 32, "tombstones piled up")
	assert.Equal(t, 4, tb.Len())
	for k := uint32(0); k < 4; k++ {
		assert.Same(t, v, tb.Lookup(1<<20+k))
	}
}

// Set and Remove are amortized O(1): over n distinct keys set, then
// removed, then n more set and removed one by one (QPs created, closed,
// and churned, each with a fresh alias), the rebuilds visit a bounded
// number of entries per operation, whatever n. A table rebuilt on every
// change visits about n²/2.
func TestTableSetAndRemoveAreAmortizedConstant(t *testing.T) {
	for _, n := range []uint32{256, 1024, 4096} {
		var tb wq.Table[int]
		v := new(int)
		ops := 0
		for k := range n {
			tb.Set(1<<24+k, v)
			tb.Set(k, v) // direct up to directKeys, then hashed
			ops += 2
		}
		for k := range n {
			tb.Remove(1<<24+k, v)
			tb.Remove(k, v)
			ops += 2
		}
		for k := range n {
			tb.Set(1<<25+k, v)
			tb.Remove(1<<25+k, v)
			ops += 2
		}
		rebuilds, work := wq.TableWork(&tb)
		t.Logf("n=%d: %d operations, %d rebuilds, %d entries visited", n, ops, rebuilds, work)
		assert.LessOrEqual(t, work, 16*ops, "n=%d", n)
	}
}

// Between rebuilds Set and Remove allocate nothing: at 4096 live keys, a
// new key set and removed per run allocates nothing on average (a table
// copied on every change allocates on every call).
func TestTableChurnAllocatesNothingBetweenRebuilds(t *testing.T) {
	var tb wq.Table[int]
	v := new(int)
	for k := range uint32(4096) {
		tb.Set(1<<20+k, v)
	}
	next := uint32(1 << 24)
	assert.Zero(t, testing.AllocsPerRun(1000, func() {
		tb.Set(next, v)
		tb.Remove(next, v)
		tb.Set(7, v)
		tb.Remove(7, v)
		next++
	}))
}

// Readers never lock: lookups while a writer sets, replaces and removes
// other keys, and grows the table and sweeps its tombstones, always find
// the keys that stay mapped, and find a churned key mapped to nothing or
// to one of its own values, never another key's.
func TestTableLookupsDuringWritesSeeOldOrNewMappings(t *testing.T) {
	var tb wq.Table[uint32]
	var mu sync.Mutex // the writers' serialisation, the caller's job
	stable := map[uint32]*uint32{3: new(uint32), 0x5000: new(uint32), 0xdead_beef: new(uint32)}
	for k, v := range stable {
		tb.Set(k, v)
	}
	const churned = 600
	churnKey := func(i uint32) uint32 { // direct and hashed keys alike
		if i%2 == 0 {
			return 700 + i/2
		}
		return 1<<24 + i
	}
	// Two values per churned key, each holding its key.
	vals := make([][2]uint32, churned)
	for i := range vals {
		vals[i][0], vals[i][1] = churnKey(uint32(i)), churnKey(uint32(i))
	}
	var done atomic.Bool
	var wg sync.WaitGroup
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !done.Load() {
				runtime.Gosched() // two CPUs may run three goroutines
				for k, v := range stable {
					if got := tb.Lookup(k); got != v {
						t.Errorf("key %#x: %p, want %p", k, got, v)
						return
					}
				}
				for i := range uint32(churned) {
					k := churnKey(i)
					if got := tb.Lookup(k); got != nil && got != &vals[i][0] && got != &vals[i][1] {
						t.Errorf("key %#x maps to %p (holding %#x), not one of its values", k, got, *got)
						return
					}
				}
			}
		}()
	}
	for round := uint32(0); round < 20; round++ {
		for i := range uint32(churned) {
			k := churnKey(i)
			mu.Lock()
			tb.Set(k, &vals[i][round%2])
			if (i+round)%3 == 0 {
				tb.Remove(k, &vals[i][round%2])
			}
			fresh := 1<<26 + round*churned + i // a key set once, then a tombstone
			tb.Set(fresh, &vals[i][0])
			tb.Remove(fresh, &vals[i][0])
			mu.Unlock()
		}
	}
	done.Store(true)
	wg.Wait()
}
