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
type Keys = Table[*Region]

// CheckSGEs checks a request's SGEs for a queue of protection domain pd
// that takes at most maxSGE: the count (ErrInvalid), that each local key
// names a region (ErrPrivileges), of pd (ErrProtection), with local write
// where the device writes (ErrPrivileges), and that each SGE lies inside
// it (ErrInvalid). It returns the total length.
func CheckSGEs(keys *Keys, pd uint32, sges []SGE, maxSGE int, write bool) (int, error) {
	if len(sges) > maxSGE {
		return 0, Invalidf("%d SGEs: the queue takes at most %d", len(sges), maxSGE)
	}
	total := 0
	for j := range sges {
		s := &sges[j]
		r := keys.Lookup(s.LKey)
		switch {
		case r == nil:
			return 0, sgeErr(ErrPrivileges, j, s, "names no registered MR")
		case r.PD != pd:
			return 0, sgeErr(ErrProtection, j, s, "belongs to another PD")
		case write && r.Access&AccessLocalWrite == 0:
			return 0, sgeErr(ErrPrivileges, j, s, "names an MR without local write")
		case !r.Contains(s.Addr, s.Length):
			return 0, Invalidf("SGE %d: %d bytes at %#x fall outside the MR [%#x, %#x)", j, s.Length, s.Addr, r.Addr, r.Addr+r.Len)
		}
		total += int(s.Length)
	}
	return total, nil
}

func sgeErr(kind error, j int, s *SGE, what string) error {
	return fmt.Errorf("%w: SGE %d: lkey %#x %s", kind, j, s.LKey, what)
}
