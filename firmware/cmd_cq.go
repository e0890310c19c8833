package firmware

import "fmt"

// CQESize is the size of a completion queue entry.
const CQESize = 64

// CreateCQRequest is CREATE_CQ (6). The CQ ring is a single-table page
// directory: entry 0 the ring-state page, then the CQE pages.
type CreateCQRequest struct {
	PDirDMA   uint64
	CtxHandle uint32 // ignored by QEMU
	CQE       uint32 // ring element count, a power of two
	NChunks   uint32 // pages including the ring-state page
}

// Cmd implements Request.
func (CreateCQRequest) Cmd() Cmd { return CmdCreateCQ }

// Validate checks the limits QEMU 7.2 relies on without checking them all:
// a power-of-two CQE count, 2..128 chunks, and CQE pages enough for the
// ring (QEMU does not check that, and overruns an undersized ring).
func (r CreateCQRequest) Validate() error {
	const where = "CREATE_CQ request"
	if err := checkDMA(where, "pdir_dma", r.PDirDMA); err != nil {
		return err
	}
	if !isPow2(uint64(r.CQE)) {
		return invalid(where, "cqe", uint64(r.CQE), "a power of two")
	}
	if r.NChunks < 2 || r.NChunks > MaxRingChunks {
		return invalid(where, "nchunks", uint64(r.NChunks), fmt.Sprintf("2..%d (including the ring-state page)", MaxRingChunks))
	}
	if uint64(r.CQE)*CQESize > uint64(r.NChunks-1)*PageSize {
		return invalid(where, "cqe", uint64(r.CQE), fmt.Sprintf("<= %d (fits nchunks-1 pages)", uint64(r.NChunks-1)*PageSize/CQESize))
	}
	return nil
}

// Encode implements Request.
func (r CreateCQRequest) Encode(b []byte) error {
	if err := beginRequest(b, CmdCreateCQ); err != nil {
		return err
	}
	le.PutUint64(b[16:], r.PDirDMA)
	le.PutUint32(b[24:], r.CtxHandle)
	le.PutUint32(b[28:], r.CQE)
	le.PutUint32(b[32:], r.NChunks)
	return nil
}

// CreateCQResponse is the response to CREATE_CQ.
type CreateCQResponse struct {
	CQHandle uint32
	CQE      uint32 // QEMU echoes the request
}

// Decode implements Response. The handle must fit a doorbell.
func (r *CreateCQResponse) Decode(b []byte) error {
	if err := checkResp(b, CmdCreateCQ); err != nil {
		return err
	}
	r.CQHandle = le.Uint32(b[16:])
	r.CQE = le.Uint32(b[20:])
	return checkHandle(CmdCreateCQ, "cq_handle", r.CQHandle)
}

// ResizeCQRequest is RESIZE_CQ (7); QEMU 7.2 does not implement it.
type ResizeCQRequest struct {
	CQHandle uint32
	CQE      uint32
}

// Cmd implements Request.
func (ResizeCQRequest) Cmd() Cmd { return CmdResizeCQ }

// Encode implements Request.
func (r ResizeCQRequest) Encode(b []byte) error {
	if err := beginRequest(b, CmdResizeCQ); err != nil {
		return err
	}
	le.PutUint32(b[16:], r.CQHandle)
	le.PutUint32(b[20:], r.CQE)
	return nil
}

// ResizeCQResponse is the response to RESIZE_CQ.
type ResizeCQResponse struct {
	CQE uint32
}

// Decode implements Response.
func (r *ResizeCQResponse) Decode(b []byte) error {
	if err := checkResp(b, CmdResizeCQ); err != nil {
		return err
	}
	r.CQE = le.Uint32(b[16:])
	return nil
}

// DestroyCQRequest is DESTROY_CQ (8). The device writes no response.
type DestroyCQRequest struct {
	CQHandle uint32
}

// Cmd implements Request.
func (DestroyCQRequest) Cmd() Cmd { return CmdDestroyCQ }

// Encode implements Request.
func (r DestroyCQRequest) Encode(b []byte) error {
	if err := beginRequest(b, CmdDestroyCQ); err != nil {
		return err
	}
	le.PutUint32(b[16:], r.CQHandle)
	return nil
}
