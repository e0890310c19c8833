package vfrdma

import (
	"context"

	"github.com/vfrdma/vfrdma/firmware"
)

// commands is the device's command channel as a Device uses it once open:
// a *firmware.Channel. The host tests stand a scripted one in its place to
// drive the control path (Close above all) without a device.
type commands interface {
	Close() error
	Quirks() firmware.Quirks
	SetInterruptMask(ctx context.Context, mask uint32) error
	Activate(ctx context.Context) error
	Reset(ctx context.Context) error
	QueryPort(ctx context.Context, port uint8) (firmware.PortAttr, error)
	CreatePD(ctx context.Context, ctxHandle uint32) (uint32, error)
	DestroyPD(ctx context.Context, pd uint32) error
	CreateMR(ctx context.Context, req firmware.CreateMRRequest) (firmware.CreateMRResponse, error)
	DestroyMR(ctx context.Context, mr uint32) error
	CreateCQ(ctx context.Context, req firmware.CreateCQRequest) (firmware.CreateCQResponse, error)
	DestroyCQ(ctx context.Context, cq uint32) error
	CreateQP(ctx context.Context, req firmware.CreateQPRequest) (firmware.CreateQPResponse, error)
	ModifyQP(ctx context.Context, req firmware.ModifyQPRequest) error
	QueryQP(ctx context.Context, qp, attrMask uint32) (firmware.QueryQPResponse, error)
	DestroyQP(ctx context.Context, qp uint32) error
	CreateBind(ctx context.Context, req firmware.CreateBindRequest) error
	DestroyBind(ctx context.Context, req firmware.DestroyBindRequest) error
	CreateSRQ(ctx context.Context, req firmware.CreateSRQRequest) (uint32, error)
	DestroySRQ(ctx context.Context, srq uint32) error
}

var _ commands = (*firmware.Channel)(nil)
