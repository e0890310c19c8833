package wq_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/wq"
)

// Keys of the CheckSGEs tests: lkey 1, 64 KiB of PD 1 with local write;
// lkey 2, PD 2's; lkey 0x4000_0003 (past the directly indexed keys), PD
// 1's without local write.
const (
	keyRW    = 1
	keyOther = 2
	keyRO    = 0x4000_0003
)

func checkKeys() *wq.Keys {
	keys := &wq.Keys{}
	keys.Set(keyRW, &wq.Region{PD: 1, Addr: 0x1000, Len: 0x10000, Access: wq.AccessLocalWrite})
	keys.Set(keyOther, &wq.Region{PD: 2, Addr: 0x8000, Len: 0x1000, Access: wq.AccessLocalWrite})
	keys.Set(keyRO, &wq.Region{PD: 1, Addr: 0x90000, Len: 0x1000})
	return keys
}

var sentinels = []error{wq.ErrInvalid, wq.ErrProtection, wq.ErrPrivileges, wq.ErrQueueFull, wq.ErrClosed, wq.ErrBusy}

// Each kind of bad SGE has its own sentinel, and only that one; the SGE
// at fault is named.
func TestCheckSGEsRefusesEachKindWithItsOwnError(t *testing.T) {
	keys := checkKeys()
	ok := wq.SGE{Addr: 0x1000, Length: 0x100, LKey: keyRW}
	for _, tc := range []struct {
		name string
		bad  wq.SGE
		want error
	}{
		{"past the end of the MR", wq.SGE{Addr: 0x10ff8, Length: 9, LKey: keyRW}, wq.ErrInvalid},
		{"before the start of the MR", wq.SGE{Addr: 0xfff, Length: 1, LKey: keyRW}, wq.ErrInvalid},
		{"an MR of another PD", wq.SGE{Addr: 0x8000, Length: 1, LKey: keyOther}, wq.ErrProtection},
		{"a key no MR has", wq.SGE{Addr: 0x1000, Length: 1, LKey: 7}, wq.ErrPrivileges},
		{"a hashed key no MR has", wq.SGE{Addr: 0x1000, Length: 1, LKey: 0x4000_0004}, wq.ErrPrivileges},
		{"a receive into an MR without local write", wq.SGE{Addr: 0x90000, Length: 1, LKey: keyRO}, wq.ErrPrivileges},
	} {
		t.Run(tc.name, func(t *testing.T) {
			total, err := wq.CheckSGEs(keys, 1, []wq.SGE{ok, tc.bad}, 2, true)
			assert.Zero(t, total)
			require.ErrorIs(t, err, tc.want)
			for _, other := range sentinels {
				if other != tc.want {
					assert.NotErrorIs(t, err, other)
				}
			}
			assert.Contains(t, err.Error(), "SGE 1")
		})
	}
	t.Run("more SGEs than the queue takes", func(t *testing.T) {
		_, err := wq.CheckSGEs(keys, 1, []wq.SGE{ok, ok, ok}, 2, true)
		require.ErrorIs(t, err, wq.ErrInvalid)
		for _, other := range sentinels[1:] {
			assert.NotErrorIs(t, err, other)
		}
	})
}

// CheckSGEs checks in the order it documents: count, key, PD, access,
// bounds; an SGE wrong in several ways reports the first.
func TestCheckSGEsReportsTheFirstCheckThatFails(t *testing.T) {
	keys := checkKeys()
	// Another PD's MR, and out of its bounds: the PD is checked first.
	_, err := wq.CheckSGEs(keys, 1, []wq.SGE{{Addr: 0x1, Length: 1, LKey: keyOther}}, 1, true)
	assert.ErrorIs(t, err, wq.ErrProtection)
	// No local write, and out of bounds: the access first.
	_, err = wq.CheckSGEs(keys, 1, []wq.SGE{{Addr: 0x1, Length: 1, LKey: keyRO}}, 1, true)
	assert.ErrorIs(t, err, wq.ErrPrivileges)
	// Too many, though the first is bad: the count first.
	bad := wq.SGE{LKey: 99}
	_, err = wq.CheckSGEs(keys, 1, []wq.SGE{bad, bad}, 1, true)
	assert.ErrorIs(t, err, wq.ErrInvalid)
}

// Good SGEs pass and their lengths add up; no SGEs is a zero-size request;
// a send (no write) reads an MR without local write.
func TestCheckSGEsAcceptsAndTotals(t *testing.T) {
	keys := checkKeys()
	whole := wq.SGE{Addr: 0x1000, Length: 0x10000, LKey: keyRW}
	total, err := wq.CheckSGEs(keys, 1, []wq.SGE{whole, {Addr: 0x10fff, Length: 1, LKey: keyRW}}, 2, true)
	require.NoError(t, err)
	assert.Equal(t, 0x10001, total)
	total, err = wq.CheckSGEs(keys, 1, nil, 0, true)
	require.NoError(t, err)
	assert.Zero(t, total)
	_, err = wq.CheckSGEs(keys, 1, []wq.SGE{{Addr: 0x90000, Length: 8, LKey: keyRO}}, 1, false)
	assert.NoError(t, err, "a send from an MR without local write")
	assert.Zero(t, testing.AllocsPerRun(100, func() {
		_, _ = wq.CheckSGEs(keys, 1, []wq.SGE{whole}, 1, true)
	}))
}

// A post call's checker resolves a key once and then checks only the
// bounds of each further SGE naming it: a later SGE of the same key out of
// bounds is still refused, and a switch to another key is looked up and
// checked again (PD, access), whichever request of the call it comes in.
func TestSGECheckerRemembersAKeyButChecksEverySGE(t *testing.T) {
	keys := checkKeys()
	in := wq.SGE{Addr: 0x1000, Length: 64, LKey: keyRW}
	c := wq.NewSGEChecker(keys, 1, 2, true)
	total, err := c.Check([]wq.SGE{in, in})
	require.NoError(t, err)
	assert.Equal(t, 128, total)
	_, err = c.Check([]wq.SGE{in, {Addr: 0x10fff, Length: 2, LKey: keyRW}})
	assert.ErrorIs(t, err, wq.ErrInvalid, "out of bounds in a remembered MR")
	_, err = c.Check([]wq.SGE{{Addr: 0x8000, Length: 8, LKey: keyOther}})
	assert.ErrorIs(t, err, wq.ErrProtection, "another PD's key after a good one")
	_, err = c.Check([]wq.SGE{in, {Addr: 0x90000, Length: 8, LKey: keyRO}})
	assert.ErrorIs(t, err, wq.ErrPrivileges, "a receive into an MR without local write")
	_, err = c.Check([]wq.SGE{{Addr: 0x1000, Length: 8, LKey: 77}})
	assert.ErrorIs(t, err, wq.ErrPrivileges, "an unknown key")
	total, err = c.Check([]wq.SGE{in})
	require.NoError(t, err, "a refusal forgets nothing good")
	assert.Equal(t, 64, total)
	_, err = c.Check([]wq.SGE{in, in, in})
	assert.ErrorIs(t, err, wq.ErrInvalid, "more SGEs than the queue takes")
	assert.Zero(t, testing.AllocsPerRun(100, func() { _, _ = c.Check([]wq.SGE{in, in}) }))
}

// The checker resolves a key against the table as it is then (a Remove
// is in place, seen at once) and remembers what it resolved for the rest
// of the call: a key removed after that is a later call's concern (the
// device refuses what it no longer knows).
func TestSGECheckerRefusesAKeyRemovedBeforeItResolvesItAndKeepsOneItResolved(t *testing.T) {
	keys := checkKeys()
	in := wq.SGE{Addr: 0x1000, Length: 64, LKey: keyRW}
	c := wq.NewSGEChecker(keys, 1, 1, false)
	_, err := c.Check([]wq.SGE{in})
	require.NoError(t, err)
	r := keys.Lookup(keyRW)
	keys.Remove(keyRW, r)
	_, err = c.Check([]wq.SGE{in})
	assert.NoError(t, err, "resolved before the Remove")

	late := wq.NewSGEChecker(keys, 1, 1, false)
	keys.Set(keyRW, r)
	keys.Remove(keyRW, r)
	_, err = late.Check([]wq.SGE{in})
	assert.ErrorIs(t, err, wq.ErrPrivileges, "removed before it was resolved")
}

// Contains holds [addr, addr+n) inside the region, with no overflow at the
// top of the address space.
func TestRegionContainsWithoutOverflow(t *testing.T) {
	r := wq.Region{Addr: 0x1000, Len: 0x1000}
	assert.True(t, r.Contains(0x1000, 0x1000))
	assert.True(t, r.Contains(0x2000, 0), "an empty segment at the end")
	assert.False(t, r.Contains(0x2000, 1))
	assert.False(t, r.Contains(0x2001, 0))
	assert.False(t, r.Contains(0xfff, 1))
	assert.False(t, r.Contains(0x1001, 0x1000))
	top := wq.Region{Addr: math.MaxUint64 - 0xfff, Len: 0x1000}
	assert.True(t, top.Contains(math.MaxUint64, 1))
	assert.False(t, top.Contains(math.MaxUint64, 2), "wraps past the top")
	assert.False(t, r.Contains(0x1800, math.MaxUint32))
	assert.False(t, r.Contains(math.MaxUint64-0xfff, 0x2000), "addr+n wraps into the region")
	high := wq.Region{Addr: math.MaxUint64 - 0x1000, Len: 0x1000}
	assert.False(t, high.Contains(math.MaxUint64-0x10, math.MaxUint32), "addr+n wraps past the top")
}
