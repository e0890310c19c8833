package pvsim

import (
	"reflect"
	"sort"
	"sync/atomic"

	fw "github.com/vfrdma/vfrdma/firmware"
)

// Inspection, for tests and tools to read: the device's counts (Stats,
// Fabric.Stats), its memory (DMA), and views of its objects, logs and
// state, which wait for the device goroutine (empty after Close).

// counters are the device's statistics, kept with atomic adds.
type counters struct {
	commands, cmdErrors                                         atomic.Uint64
	doorbells, sqDoorbells, rqDoorbells, srqDoorbells           atomic.Uint64
	cqArms, cqPolls, badDoorbells                               atomic.Uint64
	sendWQEs, recvWQEs, unsignaled                              atomic.Uint64
	cqes, cqesDropped, cqOverflows, cqNotifications, cqnDropped atomic.Uint64
	interrupts                                                  [numVectors]atomic.Uint64
	masked                                                      atomic.Uint64
	events, eventsDropped                                       atomic.Uint64
	packets, packetsDropped, retransmits, rnrNaks, udNoRecv     atomic.Uint64
	qkeyViolations, timeouts, timeoutsHeld                      atomic.Uint64
	dmaFaults, ringFaults, hazards                              atomic.Uint64
}

// Stats counts what the device did.
type Stats struct {
	Commands      uint64 // REQUEST writes
	CommandErrors uint64 // commands refused or answered with an error
	Doorbells     uint64 // doorbell writes, all kinds
	SQDoorbells   uint64 // QP send doorbells handled
	RQDoorbells   uint64 // QP receive doorbells handled
	SRQDoorbells  uint64
	CQArms        uint64 // CQ doorbells with ARM or ARM_SOL
	CQPolls       uint64 // CQ doorbells with POLL
	BadDoorbells  uint64 // doorbells naming no object, or at an unknown offset
	SendWQEs      uint64 // send WQEs fetched
	RecvWQEs      uint64 // receive WQEs taken (QEMU: handed to its backend)
	Unsignaled    uint64 // sends completed without a CQE
	CQEs          uint64 // completions written
	CQEsDropped   uint64 // completions lost: CQ full, overflowed or gone
	CQOverflows   uint64
	CQNotifies    uint64 // CQ-notification entries written
	CQNDropped    uint64 // notifications lost to a full ring
	Interrupts    [numVectors]uint64
	Masked        uint64 // interrupts IMR dropped
	Events        uint64 // async events written
	EventsDropped uint64 // async events lost (ring full, DSR not loaded)
	Packets       uint64 // packets sent, retransmissions and answers included
	Dropped       uint64 // packets dropped (no destination, not ready, port down, ...)
	// Retransmits counts RC requests sent again: after a local ACK timeout
	// (Timeouts) or an RNR NAK. On a fabric that loses nothing, to
	// responders that are ready and receives that are posted, it stays 0
	// however slow the model runs.
	Retransmits uint64
	// Timeouts counts local ACK timeouts that declared a loss: the requests
	// in flight were sent again, or the first failed with RETRY_EXC_ERR.
	Timeouts uint64
	// TimeoutsHeld counts local ACK timeouts that came due while a request
	// of the QP's or its answer was still inside the model (queued or being
	// handled): no loss, the timer waits one more timeout. They measure how
	// far the model ran behind the timeout.
	TimeoutsHeld  uint64
	RNRNaks       uint64 // RNR NAKs sent
	UDNoRecv      uint64 // datagrams dropped for want of a receive
	QKeyViolation uint64 // datagrams dropped for a wrong qkey
	DMAFaults     uint64 // device accesses to addresses not mapped
	RingFaults    uint64 // rings the device could not read (bad index or memory)
	Hazards       uint64 // see Hazards
}

// Stats returns the device's counts.
func (d *Device) Stats() Stats {
	c := &d.ctr
	s := Stats{
		Commands: c.commands.Load(), CommandErrors: c.cmdErrors.Load(),
		Doorbells: c.doorbells.Load(), SQDoorbells: c.sqDoorbells.Load(), RQDoorbells: c.rqDoorbells.Load(),
		SRQDoorbells: c.srqDoorbells.Load(), CQArms: c.cqArms.Load(), CQPolls: c.cqPolls.Load(),
		BadDoorbells: c.badDoorbells.Load(), SendWQEs: c.sendWQEs.Load(), RecvWQEs: c.recvWQEs.Load(),
		Unsignaled: c.unsignaled.Load(), CQEs: c.cqes.Load(), CQEsDropped: c.cqesDropped.Load(),
		CQOverflows: c.cqOverflows.Load(), CQNotifies: c.cqNotifications.Load(), CQNDropped: c.cqnDropped.Load(),
		Masked: c.masked.Load(), Events: c.events.Load(), EventsDropped: c.eventsDropped.Load(),
		Packets: c.packets.Load(), Dropped: c.packetsDropped.Load(), Retransmits: c.retransmits.Load(),
		Timeouts: c.timeouts.Load(), TimeoutsHeld: c.timeoutsHeld.Load(),
		RNRNaks: c.rnrNaks.Load(), UDNoRecv: c.udNoRecv.Load(), QKeyViolation: c.qkeyViolations.Load(),
		DMAFaults: c.dmaFaults.Load(), RingFaults: c.ringFaults.Load(), Hazards: c.hazards.Load(),
	}
	for i := range s.Interrupts {
		s.Interrupts[i] = c.interrupts[i].Load()
	}
	return s
}

// add adds o's counts to s, field by field (every field is a count or an
// array of counts).
func (s *Stats) add(o Stats) {
	a, b := reflect.ValueOf(s).Elem(), reflect.ValueOf(o)
	for i := range a.NumField() {
		f, g := a.Field(i), b.Field(i)
		if f.Kind() == reflect.Array {
			for j := range f.Len() {
				f.Index(j).SetUint(f.Index(j).Uint() + g.Index(j).Uint())
			}
			continue
		}
		f.SetUint(f.Uint() + g.Uint())
	}
}

// QPInfo is the device's view of a QP.
type QPInfo struct {
	Handle uint32
	QPN    uint32
	Type   fw.QPType
	// State is the QP's state; on QEMU, its backend QP's (QEMU forwards
	// only INIT, RTR and RTS to it, and its errors move it to ERR).
	State fw.QPState
	// Recorded is the state MODIFY_QP last set (QEMU records states it does
	// not forward); on a VMware device it is State.
	Recorded   fw.QPState
	SendCQ     uint32
	RecvCQ     uint32
	SRQ        uint32
	HasSRQ     bool
	DestQPN    uint32
	DestGID    [16]byte
	QKey       uint32
	Access     uint32
	RNRRetry   uint8
	RetryCnt   uint8
	Timeout    uint8
	SQSigAll   bool
	InFlight   int  // RC requests sent and not answered
	Stuck      bool // QEMU: spinning on a bad WQE
	MaxSendWR  uint32
	MaxRecvWR  uint32
	MaxSendSGE uint32
	MaxRecvSGE uint32
}

func (d *Device) qpInfo(q *qp) QPInfo {
	i := QPInfo{Handle: q.handle, QPN: q.qpn, Type: q.typ, State: fw.QPState(q.state), Recorded: fw.QPState(q.recorded),
		SendCQ: q.scq, RecvCQ: q.rcq, DestQPN: q.attr.destQPN, DestGID: q.attr.dgid(), QKey: q.attr.qkey,
		Access: q.attr.access, RNRRetry: q.attr.rnrRetry, RetryCnt: q.attr.retryCnt, Timeout: q.attr.timeout,
		SQSigAll: q.sqSigAll, InFlight: len(q.inflight), Stuck: q.stuck,
		MaxSendWR: q.maxSendWR, MaxRecvWR: q.maxRecvWR, MaxSendSGE: q.maxSendSGE, MaxRecvSGE: q.maxRecvSGE}
	if q.srq != nil {
		i.SRQ, i.HasSRQ = q.srq.handle, true
	}
	return i
}

// QP returns the QP with handle h.
func (d *Device) QP(h uint32) (QPInfo, bool) {
	var i QPInfo
	var found bool
	_ = d.call(func() {
		if q := d.w.qps[h]; q != nil {
			i, found = d.qpInfo(q), true
		}
	})
	return i, found
}

// QPByNumber returns the QP with QP number qpn.
func (d *Device) QPByNumber(qpn uint32) (QPInfo, bool) {
	var i QPInfo
	var found bool
	_ = d.call(func() {
		if q := d.w.qpns[qpn]; q != nil {
			i, found = d.qpInfo(q), true
		}
	})
	return i, found
}

// QPs returns every QP, by handle.
func (d *Device) QPs() []QPInfo {
	var out []QPInfo
	_ = d.call(func() {
		for _, q := range d.w.qps {
			out = append(out, d.qpInfo(q))
		}
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Handle < out[j].Handle })
	return out
}

// SRQInfo is the device's view of an SRQ.
type SRQInfo struct {
	Handle uint32
	MaxWR  uint32
	MaxSGE uint32
	// Limit is the armed limit (0: disarmed; a VMware device disarms it
	// when it raises SRQ_LIMIT_REACHED).
	Limit uint32
	QPs   int
}

// SRQ returns the SRQ with handle h.
func (d *Device) SRQ(h uint32) (SRQInfo, bool) {
	var i SRQInfo
	var found bool
	_ = d.call(func() {
		if s := d.w.srqs[h]; s != nil {
			i, found = SRQInfo{Handle: s.handle, MaxWR: s.maxWR, MaxSGE: s.maxSGE, Limit: s.limit, QPs: s.users}, true
		}
	})
	return i, found
}

// MRInfo is the device's view of an MR.
type MRInfo struct {
	Handle uint32
	PD     uint32
	LKey   uint32
	RKey   uint32
	Start  uint64
	Length uint64
	Access uint32
}

// MRs returns every MR, by handle.
func (d *Device) MRs() []MRInfo {
	var out []MRInfo
	_ = d.call(func() {
		for _, m := range d.w.mrs {
			out = append(out, MRInfo{Handle: m.handle, PD: m.pd.handle, LKey: m.lkey, RKey: m.rkey, Start: m.start, Length: m.length, Access: m.access})
		}
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Handle < out[j].Handle })
	return out
}

// Objects counts the device's live objects.
type Objects struct {
	PDs, MRs, CQs, QPs, SRQs, UCs, GIDs int
}

// Objects returns how many objects of each kind the device holds.
func (d *Device) Objects() Objects {
	var o Objects
	_ = d.call(func() {
		w := &d.w
		o = Objects{PDs: len(w.pds), MRs: len(w.mrs), CQs: len(w.cqs), QPs: len(w.qps), SRQs: len(w.srqs), UCs: len(w.ucs)}
		for _, g := range w.gids {
			if g.valid {
				o.GIDs++
			}
		}
	})
	return o
}

// GID is a bound GID table entry.
type GID struct {
	GID  [16]byte
	Type uint8 // firmware.GIDTypeRoCEv1 or GIDTypeRoCEv2 (as bound)
}

// GIDs returns the bound GID table entries by index.
func (d *Device) GIDs() map[int]GID {
	out := map[int]GID{}
	_ = d.call(func() {
		for i, g := range d.w.gids {
			if g.valid {
				out[i] = GID{GID: g.gid, Type: g.typ}
			}
		}
	})
	return out
}

// Events returns the async events the device raised (written to the ring
// or dropped), in order: the last 2048 to 4096 of them.
func (d *Device) Events() []fw.AsyncEvent {
	var out []fw.AsyncEvent
	_ = d.call(func() { out = append(out, d.w.events...) })
	return out
}

// Hazards returns what the driver did that QEMU 7.2.0 would crash, hang
// or corrupt memory on (recorded in QEMU mode; the model itself refuses
// or contains each). A driver run in QEMU mode should leave it empty.
func (d *Device) Hazards() []string {
	var out []string
	_ = d.call(func() { out = append(out, d.w.hazards...) })
	return out
}

// State is the device's state as the driver set it up.
type State struct {
	DSRLoaded bool
	Activated bool
	Fatal     bool
	PortUp    bool
	// UARPFN is the DSR's uar_pfn (the 64-bit field from version 19 on).
	UARPFN uint64
	// UCPFN is the PFN of the last CREATE_UC.
	UCPFN uint64
	// IMR is the interrupt mask register.
	IMR uint32
}

// State returns the device's state.
func (d *Device) State() State {
	var s State
	_ = d.call(func() {
		w := &d.w
		s = State{DSRLoaded: w.dsrLoaded, Activated: w.activated, Fatal: d.fatal.Load(), PortUp: w.portUp,
			UARPFN: w.uarPFN, UCPFN: w.ucPFN, IMR: d.regs[regIMR].Load()}
	})
	return s
}

// Stats returns the sum of the Stats of the devices on the fabric now (a
// closed device has left it): a job's retransmissions, timeouts and drops
// at a glance, however many models it spans.
func (f *Fabric) Stats() Stats {
	f.mu.RLock()
	devs := make([]*Device, 0, len(f.devs))
	for d := range f.devs {
		devs = append(devs, d)
	}
	f.mu.RUnlock()
	var s Stats
	for _, d := range devs {
		s.add(d.Stats())
	}
	return s
}

// DMAUse counts the memory a model has mapped for its device now: the
// buffers AllocDMA allocated and the ranges MapDMA mapped, through any
// handle, and not yet freed or unmapped.
type DMAUse struct {
	Buffers     int // AllocDMA buffers
	BufferBytes int
	Maps        int // MapDMA ranges
	MapBytes    int
}

// DMA returns what the model has mapped for its device now: a driver that
// frees what it allocates comes back to the same counts once its objects
// are gone, and to none once it is closed.
func (d *Device) DMA() DMAUse {
	var u DMAUse
	d.mem.mu.Lock()
	defer d.mem.mu.Unlock()
	for _, mp := range d.mem.maps {
		if mp.mmapped {
			u.Buffers++
			u.BufferBytes += len(mp.mem)
		} else {
			u.Maps++
			u.MapBytes += len(mp.mem)
		}
	}
	return u
}
