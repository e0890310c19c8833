package pvsim

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// allocHandle gives the lowest free handle from the base, as a scan of
// the handles in use would, through any mix of creates, destroys, and
// handles given and not taken (a create that failed after it).
func TestAllocHandleGivesTheLowestFreeHandle(t *testing.T) {
	for _, base := range []uint32{0, 1} {
		m := map[uint32]bool{}
		var s handleSpace
		lowest := func() uint32 {
			for h := base; ; h++ {
				if !m[h] {
					return h
				}
			}
		}
		rng := rand.New(rand.NewPCG(3, uint64(base)))
		const limit = 300
		for i := 0; i < 20000; i++ {
			switch r := rng.IntN(10); {
			case r < 5:
				h, ok := allocHandle(m, &s, base, limit)
				if len(m) == limit {
					require.False(t, ok, "past the limit")
					continue
				}
				require.True(t, ok)
				require.Equal(t, lowest(), h, "step %d", i)
				if r > 0 { // r == 0: given and not taken
					m[h] = true
				}
			default:
				h := base + uint32(rng.IntN(limit+10)) // sometimes one not in use
				freeHandle(m, &s, h)
			}
		}
	}
}

// Creating n objects, destroying them all and creating them again looks
// at a bounded number of handles per object, whatever n (a scan from the
// base looks at n²/2).
func TestAllocHandleLooksAtFewHandlesPerObject(t *testing.T) {
	for _, n := range []uint32{256, 4096, 16384} {
		m := map[uint32]bool{}
		var s handleSpace
		ops := 0
		for range 2 {
			for range n {
				h, ok := allocHandle(m, &s, 1, n)
				require.True(t, ok)
				m[h] = true
				ops++
			}
			_, ok := allocHandle(m, &s, 1, n)
			require.False(t, ok, "at the limit")
			for h := uint32(1); h <= n; h += 2 { // every other one, then the rest
				freeHandle(m, &s, h)
				ops++
			}
			for h := uint32(2); h <= n; h += 2 {
				freeHandle(m, &s, h)
				ops++
			}
		}
		t.Logf("n=%d: %d operations, %d handles looked at", n, ops, s.probes)
		assert.LessOrEqual(t, s.probes, 4*ops, "n=%d", n)
	}
}
