package uapi

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrBadCaps reports a capability chain or capability body that does not fit
// its buffer or does not move forward. The kernel builds chains whose offsets
// only grow (each capability is appended at the end of the buffer), so a
// chain that loops or points backwards is corrupt.
var ErrBadCaps = errors.New("vfio: malformed capability chain")

// capHeaderSize is the size of InfoCapHeader.
const capHeaderSize = 8

// Cap is one capability found in an info buffer.
type Cap struct {
	ID      uint16
	Version uint16
	Offset  uint32 // from the start of the info buffer
	// Data is the capability, header included, up to the next capability
	// (or the end of the buffer for the last one). It aliases the buffer.
	Data []byte
}

// maxCaps bounds a chain. Offsets must grow by at least a header per step,
// so a buffer of n bytes cannot hold more than n/8 anyway; this is a second
// guard against absurd input.
const maxCaps = 1024

// ParseCaps walks the capability chain in buf starting at offset first
// (0: no capabilities). Capabilities must start at or after minOffset (the
// size of the fixed info struct they follow), lie inside buf, and each Next
// must point past the current capability's header. It never panics on any
// input.
func ParseCaps(buf []byte, first uint32, minOffset int) ([]Cap, error) {
	var caps []Cap
	off := uint64(first)
	lo := uint64(max(minOffset, 0))
	for off != 0 {
		if len(caps) == maxCaps {
			return nil, fmt.Errorf("%w: more than %d capabilities", ErrBadCaps, maxCaps)
		}
		if off < lo || off+capHeaderSize > uint64(len(buf)) {
			return nil, fmt.Errorf("%w: capability at %d outside [%d, %d)", ErrBadCaps, off, lo, len(buf))
		}
		var h InfoCapHeader
		h.ID = binary.NativeEndian.Uint16(buf[off:])
		h.Version = binary.NativeEndian.Uint16(buf[off+2:])
		h.Next = binary.NativeEndian.Uint32(buf[off+4:])
		end := uint64(len(buf))
		next := uint64(h.Next)
		if next != 0 {
			if next < off+capHeaderSize || next > uint64(len(buf)) {
				return nil, fmt.Errorf("%w: capability %d at %d has next %d", ErrBadCaps, h.ID, off, next)
			}
			end = next
		}
		caps = append(caps, Cap{ID: h.ID, Version: h.Version, Offset: uint32(off), Data: buf[off:end:end]})
		lo = off + capHeaderSize
		off = next
	}
	return caps, nil
}

// Find returns the first capability with the given ID.
func Find(caps []Cap, id uint16) (Cap, bool) {
	for _, c := range caps {
		if c.ID == id {
			return c, true
		}
	}
	return Cap{}, false
}

func short(c Cap, what string, need uint64) error {
	return fmt.Errorf("%w: %s capability (id %d) is %d bytes, needs %d", ErrBadCaps, what, c.ID, len(c.Data), need)
}

// SparseMmapAreas decodes a VFIO_REGION_INFO_CAP_SPARSE_MMAP capability: the
// parts of a region that may be mmap'd.
func SparseMmapAreas(c Cap) ([]RegionSparseMmapArea, error) {
	const hdr = 16 // sizeof(struct vfio_region_info_cap_sparse_mmap)
	if len(c.Data) < hdr {
		return nil, short(c, "sparse mmap", hdr)
	}
	n := uint64(binary.NativeEndian.Uint32(c.Data[8:]))
	if need := hdr + 16*n; uint64(len(c.Data)) < need {
		return nil, short(c, "sparse mmap", need)
	}
	areas := make([]RegionSparseMmapArea, n)
	for i := range areas {
		p := c.Data[hdr+16*i:]
		areas[i] = RegionSparseMmapArea{
			Offset: binary.NativeEndian.Uint64(p),
			Size:   binary.NativeEndian.Uint64(p[8:]),
		}
		if areas[i].Offset+areas[i].Size < areas[i].Offset {
			return nil, fmt.Errorf("%w: sparse mmap area %d wraps around", ErrBadCaps, i)
		}
	}
	return areas, nil
}

// RegionType decodes a VFIO_REGION_INFO_CAP_TYPE capability.
func RegionType(c Cap) (typ, subtype uint32, err error) {
	if len(c.Data) < 16 {
		return 0, 0, short(c, "region type", 16)
	}
	return binary.NativeEndian.Uint32(c.Data[8:]), binary.NativeEndian.Uint32(c.Data[12:]), nil
}

// IOVARanges decodes a VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE capability: the
// IOVA ranges (End inclusive) that may be mapped.
func IOVARanges(c Cap) ([]IOVARange, error) {
	const hdr = 16 // sizeof(struct vfio_iommu_type1_info_cap_iova_range)
	if len(c.Data) < hdr {
		return nil, short(c, "IOVA range", hdr)
	}
	n := uint64(binary.NativeEndian.Uint32(c.Data[8:]))
	if need := hdr + 16*n; uint64(len(c.Data)) < need {
		return nil, short(c, "IOVA range", need)
	}
	rs := make([]IOVARange, n)
	for i := range rs {
		p := c.Data[hdr+16*i:]
		rs[i] = IOVARange{Start: binary.NativeEndian.Uint64(p), End: binary.NativeEndian.Uint64(p[8:])}
		if rs[i].End < rs[i].Start {
			return nil, fmt.Errorf("%w: IOVA range %d ends (%#x) before it starts (%#x)", ErrBadCaps, i, rs[i].End, rs[i].Start)
		}
	}
	return rs, nil
}

// DMAAvail decodes a VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL capability: how many
// more DMA mappings the container accepts.
func DMAAvail(c Cap) (uint32, error) {
	if len(c.Data) < 12 {
		return 0, short(c, "DMA avail", 12)
	}
	return binary.NativeEndian.Uint32(c.Data[8:]), nil
}

// Migration decodes a VFIO_IOMMU_TYPE1_INFO_CAP_MIGRATION capability.
func Migration(c Cap) (IOMMUType1InfoCapMigration, error) {
	var m IOMMUType1InfoCapMigration
	if len(c.Data) < 32 {
		return m, short(c, "migration", 32)
	}
	_, err := binary.Decode(c.Data, binary.NativeEndian, &m)
	return m, err
}
