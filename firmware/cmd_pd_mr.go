package firmware

import "fmt"

// Memory access flags (CREATE_MR access_flags, QP qp_access_flags).
const (
	AccessLocalWrite   = 1 << 0
	AccessRemoteWrite  = 1 << 1
	AccessRemoteRead   = 1 << 2
	AccessRemoteAtomic = 1 << 3
	AccessMWBind       = 1 << 4
	AccessZeroBased    = 1 << 5
	AccessOnDemand     = 1 << 6
)

// MR flags (CREATE_MR flags).
const (
	MRFlagDMA  = 1 << 0 // DMA MR: no pages (unusable on QEMU: lkey 0)
	MRFlagFRMR = 1 << 1 // fast-register MR (rejected by QEMU)
)

// CreatePDRequest is CREATE_PD (2).
type CreatePDRequest struct {
	// CtxHandle is the user context from CREATE_UC, 0 for none.
	CtxHandle uint32
}

// Cmd implements Request.
func (CreatePDRequest) Cmd() Cmd { return CmdCreatePD }

// Encode implements Request.
func (r CreatePDRequest) Encode(b []byte) error {
	if err := beginRequest(b, CmdCreatePD); err != nil {
		return err
	}
	le.PutUint32(b[16:], r.CtxHandle)
	return nil
}

// CreatePDResponse is the response to CREATE_PD.
type CreatePDResponse struct {
	PDHandle uint32
}

// Decode implements Response.
func (r *CreatePDResponse) Decode(b []byte) error {
	if err := checkResp(b, CmdCreatePD); err != nil {
		return err
	}
	r.PDHandle = le.Uint32(b[16:])
	return nil
}

// DestroyPDRequest is DESTROY_PD (3). The device writes no response.
type DestroyPDRequest struct {
	PDHandle uint32
}

// Cmd implements Request.
func (DestroyPDRequest) Cmd() Cmd { return CmdDestroyPD }

// Encode implements Request.
func (r DestroyPDRequest) Encode(b []byte) error {
	if err := beginRequest(b, CmdDestroyPD); err != nil {
		return err
	}
	le.PutUint32(b[16:], r.PDHandle)
	return nil
}

// CreateMRRequest is CREATE_MR (4): register NChunks pages, listed in the
// (multi-table) page directory at PDirDMA, as Length bytes addressed from
// Start.
type CreateMRRequest struct {
	Start       uint64 // the MR's address space base (QEMU: the backend MR's iova)
	Length      uint64
	PDirDMA     uint64
	PDHandle    uint32
	AccessFlags uint32 // Access* flags
	Flags       uint32 // MRFlag* flags
	NChunks     uint32
}

// Cmd implements Request.
func (CreateMRRequest) Cmd() Cmd { return CmdCreateMR }

// Validate checks, for a page-backed MR, a page-aligned directory and
// NChunks == the pages the MR spans: from the page holding Start to the one
// holding its last byte, ceil((Start mod 4096 + Length) / 4096). That is
// what Linux's vmw_pvrdma sends for a user MR (the pages of the user's
// memory from the one holding its first byte, with start its address), and
// it keeps QEMU 7.2 inside the pages it maps (it registers Length bytes
// from Start's in-page offset). QEMU also takes exactly ceil(Length/4096)
// pages, which an unaligned MR spanning one page more breaks: the driver
// registers such an MR to the end of its last page there (vfrdma's
// PD.register).
// A fast-register MR is not supported.
func (r CreateMRRequest) Validate() error {
	const where = "CREATE_MR request"
	if r.Flags&MRFlagDMA != 0 {
		return nil
	}
	if r.Flags&MRFlagFRMR != 0 {
		return &FieldError{Where: where, Field: "flags", Value: uint64(r.Flags), Want: "no FRMR flag", Err: ErrNotSupported}
	}
	if err := checkDMA(where, "pdir_dma", r.PDirDMA); err != nil {
		return err
	}
	if r.Length == 0 || r.Length > MaxPageDirPages*PageSize {
		return invalid(where, "length", r.Length, fmt.Sprintf("1..%d", MaxPageDirPages*PageSize))
	}
	pages := (r.Start%PageSize + r.Length + PageSize - 1) / PageSize
	if pages > MaxPageDirPages {
		return invalid(where, "length", r.Length, fmt.Sprintf("at most %d pages from start's page", MaxPageDirPages))
	}
	if uint64(r.NChunks) != pages {
		return invalid(where, "nchunks", uint64(r.NChunks), fmt.Sprintf("%d (the pages from start's to its last byte's)", pages))
	}
	return nil
}

// Encode implements Request.
func (r CreateMRRequest) Encode(b []byte) error {
	if err := beginRequest(b, CmdCreateMR); err != nil {
		return err
	}
	le.PutUint64(b[16:], r.Start)
	le.PutUint64(b[24:], r.Length)
	le.PutUint64(b[32:], r.PDirDMA)
	le.PutUint32(b[40:], r.PDHandle)
	le.PutUint32(b[44:], r.AccessFlags)
	le.PutUint32(b[48:], r.Flags)
	le.PutUint32(b[52:], r.NChunks)
	return nil
}

// CreateMRResponse is the response to CREATE_MR. On QEMU 7.2 RKey is always
// 0xFFFFFFFF, and LKey is the backend's lkey (or, in a "legacy reg_mr"
// build, the MR handle).
type CreateMRResponse struct {
	MRHandle uint32
	LKey     uint32
	RKey     uint32
}

// Decode implements Response.
func (r *CreateMRResponse) Decode(b []byte) error {
	if err := checkResp(b, CmdCreateMR); err != nil {
		return err
	}
	r.MRHandle = le.Uint32(b[16:])
	r.LKey = le.Uint32(b[20:])
	r.RKey = le.Uint32(b[24:])
	return nil
}

// DestroyMRRequest is DESTROY_MR (5). The device writes no response.
type DestroyMRRequest struct {
	MRHandle uint32
}

// Cmd implements Request.
func (DestroyMRRequest) Cmd() Cmd { return CmdDestroyMR }

// Encode implements Request.
func (r DestroyMRRequest) Encode(b []byte) error {
	if err := beginRequest(b, CmdDestroyMR); err != nil {
		return err
	}
	le.PutUint32(b[16:], r.MRHandle)
	return nil
}
