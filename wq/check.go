package wq

import (
	"fmt"

	"github.com/vfrdma/vfrdma/rings"
)

// SGE is a scatter/gather element: Length bytes at Addr of the MR whose
// local key is LKey.
type SGE = rings.SGE

// RecvWR is a receive work request. The SGEs slice is read during the post
// only; the caller owns it. No SGEs is a zero-size receive.
type RecvWR struct {
	WRID uint64
	SGEs []SGE
}

// AccessLocalWrite is the MR right a receive needs (the verbs value).
const AccessLocalWrite = 1

// Region is what the post path knows of a registered MR.
type Region struct {
	PD     uint32 // the handle of its protection domain
	Addr   uint64 // its base address in the MR's address space (the IOVA)
	Len    uint64
	Access uint32 // verbs access flags
}

// Contains reports whether [addr, addr+n) lies inside the region.
func (r *Region) Contains(addr uint64, n uint32) bool {
	return addr >= r.Addr && addr-r.Addr <= r.Len && uint64(n) <= r.Len-(addr-r.Addr)
}

// Keys maps local keys to the regions they name.
type Keys = Table[Region]

// CheckSGEs checks a request's SGEs for a queue of protection domain pd
// that takes at most maxSGE: the count (ErrInvalid), that each local key
// names a region (ErrPrivileges), of pd (ErrProtection), with local write
// where the device writes (ErrPrivileges), and that each SGE lies inside
// it (ErrInvalid). It returns the total length. A post call checks many
// requests with one SGEChecker instead.
func CheckSGEs(keys *Keys, pd uint32, sges []SGE, maxSGE int, write bool) (int, error) {
	c := NewSGEChecker(keys, pd, maxSGE, write)
	return c.Check(sges)
}

// SGEChecker checks the SGEs of the requests of one post call, with the
// rules of CheckSGEs. It loads the key table once, when it is made; a key
// it resolves names the MR it named at some moment of the call (one
// registered or deregistered meanwhile may or may not be seen, as with any
// call racing the control path). And it remembers the last
// key it resolved: a run of SGEs naming one MR looks its key up and checks
// its PD and access once, and only the bounds of each SGE after that. An
// SGEChecker lives on its post call's stack; it does not allocate.
type SGEChecker struct {
	tb     *table[Region]
	pd     uint32
	maxSGE int
	write  bool
	key    uint32  // the key last resolved
	r      *Region // its region, of pd and with the access asked; nil before the first
}

// NewSGEChecker returns an SGEChecker over keys for the requests of one
// post call to a queue of protection domain pd that takes at most maxSGE
// SGEs per request; write is whether the device writes the segments
// (receives).
func NewSGEChecker(keys *Keys, pd uint32, maxSGE int, write bool) SGEChecker {
	return SGEChecker{tb: keys.t.Load(), pd: pd, maxSGE: maxSGE, write: write}
}

// Check checks one request's SGEs and returns their total length.
func (c *SGEChecker) Check(sges []SGE) (int, error) {
	// The usual request, one SGE in the MR of the last, takes the short
	// way: the key compared, the bounds checked, inlined into the post loop.
	// It needs no count check: c.r is set only by check, which refuses more
	// than maxSGE SGEs before it resolves any, so a queue that takes none
	// never has one.
	if len(sges) == 1 && c.r != nil && sges[0].LKey == c.key && c.r.Contains(sges[0].Addr, sges[0].Length) {
		return int(sges[0].Length), nil
	}
	return c.check(sges)
}

// CheckWrite is Check for a request whose segments the device writes
// though the queue's requests are read (an RDMA READ or an atomic on a
// send queue): each MR must also grant local write.
func (c *SGEChecker) CheckWrite(sges []SGE) (int, error) {
	if c.write {
		return c.Check(sges)
	}
	if c.r != nil && c.r.Access&AccessLocalWrite == 0 {
		c.r = nil // resolved for reading only
	}
	c.write = true
	n, err := c.check(sges)
	c.write = false
	return n, err
}

func (c *SGEChecker) check(sges []SGE) (int, error) {
	if len(sges) > c.maxSGE {
		return 0, Invalidf("%d SGEs: the queue takes at most %d", len(sges), c.maxSGE)
	}
	total := 0
	for j := range sges {
		s := &sges[j]
		r := c.r
		if r == nil || s.LKey != c.key {
			var err error
			if r, err = c.resolve(j, s); err != nil {
				return 0, err
			}
		}
		if !r.Contains(s.Addr, s.Length) {
			return 0, Invalidf("SGE %d: %d bytes at %#x fall outside the MR [%#x, %#x)", j, s.Length, s.Addr, r.Addr, r.Addr+r.Len)
		}
		total += int(s.Length)
	}
	return total, nil
}

// resolve looks SGE j's key up and checks its region's PD and access; a
// region that passes is remembered.
func (c *SGEChecker) resolve(j int, s *SGE) (*Region, error) {
	r := c.tb.lookup(s.LKey)
	switch {
	case r == nil:
		return nil, sgeErr(ErrPrivileges, j, s, "names no registered MR")
	case r.PD != c.pd:
		return nil, sgeErr(ErrProtection, j, s, "belongs to another PD")
	case c.write && r.Access&AccessLocalWrite == 0:
		return nil, sgeErr(ErrPrivileges, j, s, "names an MR without local write")
	}
	c.key, c.r = s.LKey, r
	return r, nil
}

func sgeErr(kind error, j int, s *SGE, what string) error {
	return fmt.Errorf("%w: SGE %d: lkey %#x %s", kind, j, s.LKey, what)
}
