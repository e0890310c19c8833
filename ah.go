package vfrdma

// AHAttr addresses a UD destination.
type AHAttr struct {
	DGID         GID
	SGIDIndex    int // source GID index (bound; default 0)
	HopLimit     uint8
	TrafficClass uint8
	FlowLabel    uint32
}

// AH is an address handle: where UD sends go. The pvrdma device keeps no
// address handles of its own (the address travels in each WQE), so an AH
// is the driver's checked copy of the address. It is immutable and safe for
// concurrent use. It has no Close and holds nothing of the device's: under
// the lifecycle rule (doc.go) it lives as long as its PD, and CreateAH on
// a closed PD or Device returns ErrClosed.
type AH struct {
	pd           *PD
	dgid         GID
	sgidIndex    uint8
	hopLimit     uint8
	trafficClass uint8
	flowLabel    uint32
}

// CreateAH makes an address handle for UD sends from QPs of this PD.
func (pd *PD) CreateAH(attr AHAttr) (*AH, error) {
	d := pd.d
	if err := pd.enter(); err != nil {
		return nil, d.opErr("create AH", err)
	}
	defer pd.exit()
	if !d.gidBound(attr.SGIDIndex) {
		return nil, d.opErr("create AH", invalidf("source GID index %d is not bound", attr.SGIDIndex))
	}
	if attr.FlowLabel >= 1<<20 {
		return nil, d.opErr("create AH", invalidf("flow label %#x has more than 20 bits", attr.FlowLabel))
	}
	hop := attr.HopLimit
	if hop == 0 {
		hop = 64
	}
	return &AH{pd: pd, dgid: attr.DGID, sgidIndex: uint8(attr.SGIDIndex), hopLimit: hop,
		trafficClass: attr.TrafficClass, flowLabel: attr.FlowLabel}, nil
}

// DGID returns the destination GID.
func (ah *AH) DGID() GID { return ah.dgid }
