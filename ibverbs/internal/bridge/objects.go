package bridge

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/vfrdma/vfrdma"
)

var (
	pds  table[PD]
	mrs  table[MR]
	ahs  table[AH]
	cqs  table[CQ]
	qps  table[QP]
	srqs table[SRQ]
	chs  table[Channel]
)

// Lookups by the id a C structure holds (nil for none).
func PDByID(id uint32) *PD           { return pds.get(id) }
func MRByID(id uint32) *MR           { return mrs.get(id) }
func AHByID(id uint32) *AH           { return ahs.get(id) }
func CQByID(id uint32) *CQ           { return cqs.get(id) }
func QPByID(id uint32) *QP           { return qps.get(id) }
func SRQByID(id uint32) *SRQ         { return srqs.get(id) }
func ChannelByID(id uint32) *Channel { return chs.get(id) }

// forgetContext drops every object of c from the tables (its device is
// closing: the driver frees them with it).
func forgetContext(c *Context) {
	pds.each(func(id uint32, v *PD) {
		if v.ctx == c {
			pds.del(id)
		}
	})
	mrs.each(func(id uint32, v *MR) {
		if v.pd.ctx == c {
			mrs.del(id)
		}
	})
	ahs.each(func(id uint32, v *AH) {
		if v.pd.ctx == c {
			ahs.del(id)
		}
	})
	qps.each(func(id uint32, v *QP) {
		if v.ctx == c {
			qps.del(id)
		}
	})
	srqs.each(func(id uint32, v *SRQ) {
		if v.ctx == c {
			srqs.del(id)
		}
	})
	cqs.each(func(id uint32, v *CQ) {
		if v.ctx == c {
			v.dropFD()
			cqs.del(id)
		}
	})
	chs.each(func(id uint32, v *Channel) {
		if v.ctx == c {
			_ = v.close()
			chs.del(id)
		}
	})
}

// PD is a protection domain (struct ibv_pd).
type PD struct {
	ID   uint32
	ctx  *Context
	pd   *vfrdma.PD
	refs atomic.Int32 // MRs, QPs, SRQs, AHs in it
}

// AllocPD allocates a protection domain.
func (c *Context) AllocPD() (*PD, error) {
	ctx, cancel := cmdCtx()
	defer cancel()
	p, err := c.Dev.AllocPD(ctx)
	if err != nil {
		return nil, err
	}
	pd := &PD{ctx: c, pd: p}
	pd.ID = pds.put(pd)
	return pd, nil
}

// Handle is the device's handle of the PD (ibv_pd.handle).
func (pd *PD) Handle() uint32 { return pd.pd.Handle() }

// Dealloc frees the PD; one that MRs, QPs, SRQs or AHs use is EBUSY.
func (pd *PD) Dealloc() error {
	if pd.refs.Load() > 0 {
		return fmt.Errorf("%w: the PD has objects", vfrdma.ErrBusy)
	}
	if err := pd.pd.Close(); err != nil {
		return err
	}
	pds.del(pd.ID)
	return nil
}

// Access flags of ibv_access_flags the device takes as they are (the
// driver's Access has the same bits).
const (
	accessDevice = 0x7f // LOCAL_WRITE .. ON_DEMAND
	// accessOptional is IBV_ACCESS_OPTIONAL_RANGE: hints a device may ignore.
	accessOptional = 0x3ff00000
)

// MR is a memory region (struct ibv_mr).
type MR struct {
	ID     uint32
	pd     *PD
	mr     *vfrdma.MR
	Addr   uintptr // the program's address
	Length int
	IOVA   uint64 // the address SGEs and peers name
}

// LKey and RKey are the MR's keys.
func (m *MR) LKey() uint32 { return m.mr.LKey() }
func (m *MR) RKey() uint32 { return m.mr.RKey() }

// Handle is the device's handle of the MR.
func (m *MR) Handle() uint32 { return m.mr.Handle() }

// RegMR registers length bytes of the program's memory at mem (any
// alignment), named by iova in SGEs and by peers: ibv_reg_mr passes the
// memory's own address, ibv_reg_mr_iova its iova. Unknown access bits
// are EINVAL; the optional-range hints are ignored. The memory is
// registered at iova (PD.RegisterMRAt): SGEs and peers name it by the
// program's addresses, and iova must lie at mem's offset in its page, as
// the kernel's ibv_reg_mr requires.
func (pd *PD) RegMR(mem unsafe.Pointer, length int, iova uint64, access int) (*MR, error) {
	if mem == nil || length <= 0 {
		return nil, fmt.Errorf("%w: reg_mr of %d bytes at %p", errInvalid, length, mem)
	}
	access &^= accessOptional
	if access&^accessDevice != 0 {
		return nil, fmt.Errorf("%w: access flags %#x", errInvalid, access)
	}
	ctx, cancel := cmdCtx()
	defer cancel()
	mr, err := pd.pd.RegisterMRAt(ctx, unsafe.Slice((*byte)(mem), length), iova, vfrdma.Access(access))
	if err != nil {
		return nil, err
	}
	m := &MR{pd: pd, mr: mr, Addr: uintptr(mem), Length: length, IOVA: iova}
	pd.refs.Add(1)
	m.ID = mrs.put(m)
	return m, nil
}

// Dereg deregisters the MR.
func (m *MR) Dereg() error {
	if err := m.mr.Close(); err != nil {
		return err
	}
	m.pd.refs.Add(-1)
	mrs.del(m.ID)
	return nil
}

// AH is an address handle (struct ibv_ah).
type AH struct {
	ID uint32
	pd *PD
	ah *vfrdma.AH
}

// AHAttr is the part of struct ibv_ah_attr the device uses.
type AHAttr struct {
	IsGlobal     bool
	DGID         vfrdma.GID
	SGIDIndex    int
	HopLimit     uint8
	TrafficClass uint8
	FlowLabel    uint32
	PortNum      int
}

// CreateAH makes an address handle. The device routes by GID only: an
// attribute without a GRH is EINVAL, as on every RoCE device.
func (pd *PD) CreateAH(a AHAttr) (*AH, error) {
	if !a.IsGlobal {
		return nil, fmt.Errorf("%w: a RoCE address handle needs a GRH (is_global)", errInvalid)
	}
	if a.PortNum != 1 {
		return nil, fmt.Errorf("%w: port %d (the device has port 1)", errInvalid, a.PortNum)
	}
	h, err := pd.pd.CreateAH(vfrdma.AHAttr{DGID: a.DGID, SGIDIndex: a.SGIDIndex, HopLimit: a.HopLimit,
		TrafficClass: a.TrafficClass, FlowLabel: a.FlowLabel})
	if err != nil {
		return nil, err
	}
	ah := &AH{pd: pd, ah: h}
	pd.refs.Add(1)
	ah.ID = ahs.put(ah)
	return ah, nil
}

// Destroy forgets the address handle.
func (ah *AH) Destroy() error {
	ah.pd.refs.Add(-1)
	ahs.del(ah.ID)
	return nil
}
