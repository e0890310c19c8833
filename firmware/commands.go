package firmware

import "context"

// Typed helpers over Exec, one per command. Those that depend on the device
// consult its Quirks: CreateQP (response layout), CreateUC (PFN width),
// ModifySRQ and QuerySRQ (in quirks.go).

func call[R any, PR interface {
	*R
	Response
}](ctx context.Context, c *Channel, req Request) (R, error) {
	var r R
	err := c.Exec(ctx, req, PR(&r))
	return r, err
}

// QueryPort runs QUERY_PORT.
func (c *Channel) QueryPort(ctx context.Context, port uint8) (PortAttr, error) {
	r, err := call[QueryPortResponse](ctx, c, QueryPortRequest{Port: port})
	return r.Attr, err
}

// QueryPKey runs QUERY_PKEY.
func (c *Channel) QueryPKey(ctx context.Context, port, index uint8) (uint16, error) {
	r, err := call[QueryPKeyResponse](ctx, c, QueryPKeyRequest{Port: port, Index: index})
	return r.PKey, err
}

// CreatePD runs CREATE_PD and returns the PD handle.
func (c *Channel) CreatePD(ctx context.Context, ctxHandle uint32) (uint32, error) {
	r, err := call[CreatePDResponse](ctx, c, CreatePDRequest{CtxHandle: ctxHandle})
	return r.PDHandle, err
}

// DestroyPD runs DESTROY_PD.
func (c *Channel) DestroyPD(ctx context.Context, pd uint32) error {
	return c.Exec(ctx, DestroyPDRequest{PDHandle: pd}, HeaderOnly{})
}

// CreateMR runs CREATE_MR.
func (c *Channel) CreateMR(ctx context.Context, req CreateMRRequest) (CreateMRResponse, error) {
	return call[CreateMRResponse](ctx, c, req)
}

// DestroyMR runs DESTROY_MR.
func (c *Channel) DestroyMR(ctx context.Context, mr uint32) error {
	return c.Exec(ctx, DestroyMRRequest{MRHandle: mr}, HeaderOnly{})
}

// CreateCQ runs CREATE_CQ.
func (c *Channel) CreateCQ(ctx context.Context, req CreateCQRequest) (CreateCQResponse, error) {
	return call[CreateCQResponse](ctx, c, req)
}

// ResizeCQ runs RESIZE_CQ (not implemented by QEMU 7.2: ErrNotSupported).
func (c *Channel) ResizeCQ(ctx context.Context, cq, cqe uint32) (uint32, error) {
	r, err := call[ResizeCQResponse](ctx, c, ResizeCQRequest{CQHandle: cq, CQE: cqe})
	return r.CQE, err
}

// DestroyCQ runs DESTROY_CQ.
func (c *Channel) DestroyCQ(ctx context.Context, cq uint32) error {
	return c.Exec(ctx, DestroyCQRequest{CQHandle: cq}, HeaderOnly{})
}

// CreateQP runs CREATE_QP and decodes the response in the layout the
// device's version implies (Quirks.CreateQPV2).
func (c *Channel) CreateQP(ctx context.Context, req CreateQPRequest) (CreateQPResponse, error) {
	r := CreateQPResponse{V2: c.Quirks().CreateQPV2()}
	err := c.Exec(ctx, req, &r)
	return r, err
}

// ModifyQP runs MODIFY_QP; the response header is checked, its error byte
// included.
func (c *Channel) ModifyQP(ctx context.Context, req ModifyQPRequest) error {
	return c.Exec(ctx, req, HeaderOnly{})
}

// QueryQP runs QUERY_QP; see QueryQPResponse for what is decoded.
func (c *Channel) QueryQP(ctx context.Context, qp, attrMask uint32) (QueryQPResponse, error) {
	return call[QueryQPResponse](ctx, c, QueryQPRequest{QPHandle: qp, AttrMask: attrMask})
}

// DestroyQP runs DESTROY_QP.
func (c *Channel) DestroyQP(ctx context.Context, qp uint32) error {
	return c.Exec(ctx, DestroyQPRequest{QPHandle: qp}, HeaderOnly{})
}

// CreateUC runs CREATE_UC with the PFN width the device's version implies
// (Quirks.PFN64) and returns the context handle.
func (c *Channel) CreateUC(ctx context.Context, pfn uint64) (uint32, error) {
	r, err := call[CreateUCResponse](ctx, c, CreateUCRequest{PFN: pfn, PFN64: c.Quirks().PFN64()})
	return r.CtxHandle, err
}

// DestroyUC runs DESTROY_UC.
func (c *Channel) DestroyUC(ctx context.Context, ctxHandle uint32) error {
	return c.Exec(ctx, DestroyUCRequest{CtxHandle: ctxHandle}, HeaderOnly{})
}

// CreateBind runs CREATE_BIND.
func (c *Channel) CreateBind(ctx context.Context, req CreateBindRequest) error {
	return c.Exec(ctx, req, HeaderOnly{})
}

// DestroyBind runs DESTROY_BIND.
func (c *Channel) DestroyBind(ctx context.Context, req DestroyBindRequest) error {
	return c.Exec(ctx, req, HeaderOnly{})
}

// CreateSRQ runs CREATE_SRQ and returns the SRQ handle.
func (c *Channel) CreateSRQ(ctx context.Context, req CreateSRQRequest) (uint32, error) {
	r, err := call[CreateSRQResponse](ctx, c, req)
	return r.SRQN, err
}

// DestroySRQ runs DESTROY_SRQ.
func (c *Channel) DestroySRQ(ctx context.Context, srq uint32) error {
	return c.Exec(ctx, DestroySRQRequest{SRQHandle: srq}, HeaderOnly{})
}
