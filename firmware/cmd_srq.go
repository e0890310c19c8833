package firmware

import "fmt"

// SRQ attribute mask bits (MODIFY_SRQ attr_mask).
const (
	SRQAttrMaxWR = 1 << 0
	SRQAttrLimit = 1 << 1
)

// SRQAttr is the SRQ attribute block (16 bytes).
type SRQAttr struct {
	MaxWR    uint32 // ring element count, a power of two
	MaxSGE   uint32 // sets the ring stride
	SRQLimit uint32
}

func (a *SRQAttr) encode(b []byte) {
	le.PutUint32(b[0:], a.MaxWR)
	le.PutUint32(b[4:], a.MaxSGE)
	le.PutUint32(b[8:], a.SRQLimit)
}

func (a *SRQAttr) decode(b []byte) {
	a.MaxWR = le.Uint32(b[0:])
	a.MaxSGE = le.Uint32(b[4:])
	a.SRQLimit = le.Uint32(b[8:])
}

// CreateSRQRequest is CREATE_SRQ (17). The SRQ's page directory is a single
// table: entry 0 the ring-state page, then the WQE pages.
type CreateSRQRequest struct {
	PDirDMA  uint64
	PDHandle uint32
	NChunks  uint32 // pages including the ring-state page
	Attr     SRQAttr
	SRQType  uint8 // 0 basic (ignored by QEMU)
}

// Cmd implements Request.
func (CreateSRQRequest) Cmd() Cmd { return CmdCreateSRQ }

// Validate checks a power-of-two ring, 2..128 chunks and a ring that fits
// its pages (QEMU 7.2 does not check the last).
func (r CreateSRQRequest) Validate() error {
	const where = "CREATE_SRQ request"
	if err := checkDMA(where, "pdir_dma", r.PDirDMA); err != nil {
		return err
	}
	if !isPow2(uint64(r.Attr.MaxWR)) {
		return invalid(where, "max_wr", uint64(r.Attr.MaxWR), "a power of two")
	}
	if r.NChunks < 2 || r.NChunks > MaxRingChunks {
		return invalid(where, "nchunks", uint64(r.NChunks), fmt.Sprintf("2..%d (including the ring-state page)", MaxRingChunks))
	}
	stride := wqeStride(rqWQEHeader, r.Attr.MaxSGE)
	if room := uint64(r.NChunks-1) * PageSize; uint64(r.Attr.MaxWR)*stride > room {
		return invalid(where, "max_wr", uint64(r.Attr.MaxWR), fmt.Sprintf("<= %d (fits nchunks-1 pages at stride %d)", room/stride, stride))
	}
	return nil
}

// Encode implements Request.
func (r CreateSRQRequest) Encode(b []byte) error {
	if err := beginRequest(b, CmdCreateSRQ); err != nil {
		return err
	}
	le.PutUint64(b[16:], r.PDirDMA)
	le.PutUint32(b[24:], r.PDHandle)
	le.PutUint32(b[28:], r.NChunks)
	r.Attr.encode(b[32:48])
	b[48] = r.SRQType
	return nil
}

// CreateSRQResponse is the response to CREATE_SRQ.
type CreateSRQResponse struct {
	SRQN uint32 // the SRQ handle
}

// Decode implements Response. The handle must fit a doorbell.
func (r *CreateSRQResponse) Decode(b []byte) error {
	if err := checkResp(b, CmdCreateSRQ); err != nil {
		return err
	}
	r.SRQN = le.Uint32(b[16:])
	return checkHandle(CmdCreateSRQ, "srqn", r.SRQN)
}

// ModifySRQRequest is MODIFY_SRQ (18), as the device interface defines it.
// On QEMU 7.2 code 18 runs the query handler instead (see Quirks); use
// Channel.ModifySRQ, which sends what the device in hand needs. The device
// writes no response.
type ModifySRQRequest struct {
	SRQHandle uint32
	AttrMask  uint32 // SRQAttr* bits; QEMU accepts only SRQAttrLimit
	Attr      SRQAttr
}

// Cmd implements Request.
func (ModifySRQRequest) Cmd() Cmd { return CmdModifySRQ }

// Encode implements Request.
func (r ModifySRQRequest) Encode(b []byte) error {
	if err := beginRequest(b, CmdModifySRQ); err != nil {
		return err
	}
	r.encodeBody(b)
	return nil
}

func (r ModifySRQRequest) encodeBody(b []byte) {
	le.PutUint32(b[16:], r.SRQHandle)
	le.PutUint32(b[20:], r.AttrMask)
	r.Attr.encode(b[24:40])
}

// QuerySRQRequest is QUERY_SRQ (19), as the device interface defines it.
// On QEMU 7.2 code 19 runs the modify handler instead; use
// Channel.QuerySRQ.
type QuerySRQRequest struct {
	SRQHandle uint32
}

// Cmd implements Request.
func (QuerySRQRequest) Cmd() Cmd { return CmdQuerySRQ }

// Encode implements Request.
func (r QuerySRQRequest) Encode(b []byte) error { return r.encodeAs(b, CmdQuerySRQ) }

func (r QuerySRQRequest) encodeAs(b []byte, c Cmd) error {
	if err := beginRequest(b, c); err != nil {
		return err
	}
	le.PutUint32(b[16:], r.SRQHandle)
	return nil
}

// QuerySRQResponse is the response to QUERY_SRQ.
type QuerySRQResponse struct {
	Attr SRQAttr
}

// Decode implements Response.
func (r *QuerySRQResponse) Decode(b []byte) error {
	if err := checkResp(b, CmdQuerySRQ); err != nil {
		return err
	}
	r.Attr.decode(b[16:32])
	return nil
}

// DestroySRQRequest is DESTROY_SRQ (20). The device writes no response.
type DestroySRQRequest struct {
	SRQHandle uint32
}

// Cmd implements Request.
func (DestroySRQRequest) Cmd() Cmd { return CmdDestroySRQ }

// Encode implements Request.
func (r DestroySRQRequest) Encode(b []byte) error {
	if err := beginRequest(b, CmdDestroySRQ); err != nil {
		return err
	}
	le.PutUint32(b[16:], r.SRQHandle)
	return nil
}
