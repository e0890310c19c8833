package firmware

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var bg = context.Background()

func TestStartQEMU(t *testing.T) {
	b := newBench(t, benchOpts{})
	if b.caps.MaxQP != 1024 || b.caps.GIDTypes != GIDTypeRoCEv1 || b.caps.FWVersion() != "0.0.14" || b.caps.NodeGUID != 0x525400fffe123456 {
		t.Errorf("caps %+v", b.caps)
	}
	q := b.ch.Quirks()
	want := Quirks{Version: 17, Emulated: true, NoAsyncEvents: true, CQArmBoth: true, UnquiesceKeepsErr: true}
	if q != want {
		t.Errorf("quirks %+v, want %+v", q, want)
	}
	if b.dev.regs[RegIMR/4] != IMRMaskAll || b.dev.regs[RegErr/4] != 0 {
		t.Errorf("IMR %#x ERR %#x", b.dev.regs[RegIMR/4], b.dev.regs[RegErr/4])
	}
	if len(b.dev.log) != 0 {
		t.Errorf("bring-up sent commands %v", b.dev.log)
	}
	// DSR contents as the device sees them: 32-bit PFN at version 17.
	if le.Uint32(b.dev.dsr[0:]) != DriverVersion || le.Uint32(b.dev.dsr[8:]) != 2|1<<2|1<<6 {
		t.Errorf("driver_version/gos_info %#x %#x", le.Uint32(b.dev.dsr[0:]), le.Uint32(b.dev.dsr[8:]))
	}
}

func TestStartInterrupts(t *testing.T) {
	b := newBench(t, benchOpts{configure: func(b *bench) { b.cfg.Interrupts = true }})
	if b.dev.regs[RegIMR/4] != IMRUnmaskAll {
		t.Errorf("IMR %#x", b.dev.regs[RegIMR/4])
	}
}

// With NoActivate, Start loads the DSR and stops: IMR and CTL untouched,
// commands already accepted; the caller activates later.
func TestStartNoActivate(t *testing.T) {
	b := newBench(t, benchOpts{noStart: true, configure: func(b *bench) {
		b.cfg.NoActivate, b.cfg.Interrupts = true, true
		b.dev.regs[RegIMR/4] = 0x5a // neither mask value
	}})
	version, caps, err := b.ch.Start(bg, &b.cfg)
	require.NoError(t, err)
	assert.Equal(t, uint32(VersionRoCEv1), version)
	assert.Equal(t, uint32(1024), caps.MaxQP, "caps")
	assert.Equal(t, uint32(0x5a), b.dev.regs[RegIMR/4], "IMR written")
	assert.Equal(t, uint32(0), b.dev.regs[RegCtl/4], "CTL written")
	assert.Equal(t, uint32(0xFFFF), b.dev.regs[RegErr/4], "ERR: the device was activated")
	_, err = b.ch.QueryPort(bg, 1)
	require.NoError(t, err, "a command before activation")

	require.NoError(t, b.ch.SetInterruptMask(bg, IMRUnmaskAll))
	require.NoError(t, b.ch.Activate(bg))
	assert.Equal(t, uint32(IMRUnmaskAll), b.dev.regs[RegIMR/4])
	assert.Equal(t, uint32(0), b.dev.regs[RegErr/4])
}

func TestStartUnsupportedVersion(t *testing.T) {
	b := newBench(t, benchOpts{version: 16, noStart: true})
	_, _, err := b.ch.Start(bg, &b.cfg)
	var fe *FieldError
	if !errors.Is(err, ErrNotSupported) || !errors.As(err, &fe) || fe.Field != "VERSION" {
		t.Fatalf("version 16: %v", err)
	}
	if b.dev.dsrDMA != 0 {
		t.Error("DSR address written to an unsupported device")
	}
}

func TestDSRNotLoaded(t *testing.T) {
	b := newBench(t, benchOpts{noStart: true, configure: func(b *bench) {
		b.cfg.DSR.RespSlotDMA = 0x7000 // not DMA memory: the device cannot map it
	}})
	_, _, err := b.ch.Start(bg, &b.cfg)
	var oe *OpError
	if !errors.Is(err, ErrDSRNotLoaded) || !errors.As(err, &oe) || oe.Op != "load DSR" {
		t.Fatalf("Start: %v", err)
	}
	if _, err := b.ch.CreatePD(bg, 0); !errors.Is(err, ErrDSRNotLoaded) {
		t.Errorf("command after a failed load: %v", err)
	}
	if len(b.dev.log) != 0 || b.dev.irqs != 0 {
		t.Error("REQUEST written without a loaded DSR")
	}
}

func TestExecBeforeLoad(t *testing.T) {
	b := newBench(t, benchOpts{noStart: true})
	err := b.ch.Exec(bg, QueryPortRequest{Port: 1}, &QueryPortResponse{})
	if !errors.Is(err, ErrDSRNotLoaded) {
		t.Fatalf("%v", err)
	}
	if b.dev.irqs != 0 {
		t.Error("REQUEST written before LoadDSR")
	}
}

func TestLoadDSRBadAddress(t *testing.T) {
	b := newBench(t, benchOpts{noStart: true})
	for _, a := range []uint64{0, 0x1000 + PageSize - 8} {
		if _, err := b.ch.LoadDSR(bg, a, b.cfg.DSRMem, 17); !errors.Is(err, ErrInvalid) {
			t.Errorf("%#x: %v", a, err)
		}
	}
	if _, err := b.ch.LoadDSR(bg, 0x1000, make([]byte, 10), 17); !errors.Is(err, ErrInvalid) {
		t.Errorf("short DSR: %v", err)
	}
}

// lifecycle creates and destroys one of everything through the typed
// helpers, checking what the device saw.
func lifecycle(t *testing.T, b *bench) {
	t.Helper()
	ctx := bg
	attr, err := b.ch.QueryPort(ctx, 1)
	if err != nil || attr.State != PortActive || attr.MaxMsgSz != 1024 || attr.PhysState != 5 {
		t.Fatalf("QueryPort: %+v, %v", attr, err)
	}
	if pk, err := b.ch.QueryPKey(ctx, 1, 0); err != nil || pk != 0xFFFF {
		t.Fatalf("QueryPKey: %#x, %v", pk, err)
	}
	uc, err := b.ch.CreateUC(ctx, 0x12345)
	if err != nil {
		t.Fatalf("CreateUC: %v", err)
	}
	pd, err := b.ch.CreatePD(ctx, 0)
	if err != nil {
		t.Fatalf("CreatePD: %v", err)
	}
	// A 3-page MR through a multi-table-capable directory.
	dir := b.mem.alloc()
	tbl := b.mem.alloc()
	data, _ := pages(b.mem, 3)
	if err := WritePageDir(dir, []Page{tbl}, data); err != nil {
		t.Fatal(err)
	}
	mr, err := b.ch.CreateMR(ctx, CreateMRRequest{Start: 0x7f0000000000, Length: 3 * PageSize, PDirDMA: dir.DMA,
		PDHandle: pd, AccessFlags: AccessLocalWrite, NChunks: 3})
	if err != nil || mr.RKey != 0xFFFFFFFF {
		t.Fatalf("CreateMR: %+v, %v", mr, err)
	}
	cqDir, _ := b.ringObject(1)
	cq, err := b.ch.CreateCQ(ctx, CreateCQRequest{PDirDMA: cqDir, CQE: 64, NChunks: 2})
	if err != nil || cq.CQE != 64 {
		t.Fatalf("CreateCQ: %+v, %v", cq, err)
	}
	srqDir, _ := b.ringObject(1)
	srq, err := b.ch.CreateSRQ(ctx, CreateSRQRequest{PDirDMA: srqDir, PDHandle: pd, NChunks: 2, Attr: SRQAttr{MaxWR: 32, MaxSGE: 4, SRQLimit: 4}})
	if err != nil {
		t.Fatalf("CreateSRQ: %v", err)
	}
	qpDir, _ := b.ringObject(3)
	qp, err := b.ch.CreateQP(ctx, CreateQPRequest{PDirDMA: qpDir, PDHandle: pd, SendCQHandle: cq.CQHandle, RecvCQHandle: cq.CQHandle,
		MaxSendWR: 32, MaxRecvWR: 32, MaxSendSGE: 4, MaxRecvSGE: 4, TotalChunks: 4, SendChunks: 2, QPType: QPTypeRC})
	if err != nil || qp.MaxSendWR != 32 || qp.MaxRecvSGE != 4 {
		t.Fatalf("CreateQP: %+v, %v", qp, err)
	}
	g := gid(0x20)
	if err := b.ch.CreateBind(ctx, CreateBindRequest{MTU: 1024, VLAN: 0xFFF, Index: 1, GID: g, GIDType: GIDTypeRoCEv1}); err != nil {
		t.Fatalf("CreateBind: %v", err)
	}
	steps := []QPAttr{
		{QPState: QPStateInit, PortNum: 1, QPAccessFlags: AccessLocalWrite},
		{QPState: QPStateRTR, PathMTU: MTU1024, DestQPNum: qp.QPN, RQPSN: 7, AH: AHAttr{GRH: GlobalRoute{DGID: g, SGIDIndex: 1, HopLimit: 1}, AHFlags: AHFlagGRH, PortNum: 1}},
		{QPState: QPStateRTS, SQPSN: 7, Timeout: 14, RetryCnt: 7, RNRRetry: 7},
	}
	for _, a := range steps {
		if err := b.ch.ModifyQP(ctx, ModifyQPRequest{QPHandle: qp.QPHandle, AttrMask: QPAttrState, Attr: a}); err != nil {
			t.Fatalf("ModifyQP to %v: %v", a.QPState, err)
		}
	}
	qa, err := b.ch.QueryQP(ctx, qp.QPHandle, QPAttrState)
	if err != nil || qa.QPState != QPStateRTS || qa.DestQPNum != qp.QPN {
		t.Fatalf("QueryQP: %+v, %v", qa, err)
	}
	sa, err := b.ch.QuerySRQ(ctx, srq)
	if err != nil || sa != (SRQAttr{MaxWR: 32, MaxSGE: 4, SRQLimit: 4}) {
		t.Fatalf("QuerySRQ: %+v, %v", sa, err)
	}
	if err := b.ch.ModifySRQ(ctx, ModifySRQRequest{SRQHandle: srq, AttrMask: SRQAttrLimit, Attr: SRQAttr{SRQLimit: 9}}); err != nil {
		t.Fatalf("ModifySRQ: %v", err)
	}
	if sa, err := b.ch.QuerySRQ(ctx, srq); err != nil || sa.SRQLimit != 9 {
		t.Fatalf("QuerySRQ after modify: %+v, %v", sa, err)
	}
	for name, err := range map[string]error{
		"DestroyQP": b.ch.DestroyQP(ctx, qp.QPHandle), "DestroySRQ": b.ch.DestroySRQ(ctx, srq),
		"DestroyCQ": b.ch.DestroyCQ(ctx, cq.CQHandle), "DestroyMR": b.ch.DestroyMR(ctx, mr.MRHandle),
		"DestroyPD": b.ch.DestroyPD(ctx, pd), "DestroyBind": b.ch.DestroyBind(ctx, DestroyBindRequest{Index: 1, GID: g}),
		"DestroyUC": b.ch.DestroyUC(ctx, uc),
	} {
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if len(b.dev.qps)+len(b.dev.cqs)+len(b.dev.srqs)+len(b.dev.mrs)+len(b.dev.pds)+len(b.dev.ucs) != 0 {
		t.Error("objects left on the device")
	}
}

func TestLifecycleQEMU(t *testing.T) {
	b := newBench(t, benchOpts{})
	lifecycle(t, b)
	// The SRQ commands as sent: the first query is the probe (code 18, a
	// query on QEMU), the modify goes as 19, the second query as 18.
	var srqCodes []Cmd
	for _, c := range b.dev.log {
		if c == CmdModifySRQ || c == CmdQuerySRQ {
			srqCodes = append(srqCodes, c)
		}
	}
	if want := []Cmd{18, 19, 18}; !equalCmds(srqCodes, want) {
		t.Errorf("SRQ codes sent %v, want %v", srqCodes, want)
	}
	if q := b.ch.Quirks(); q.SRQSwap != SRQSwapYes {
		t.Errorf("swap %v", q.SRQSwap)
	}
}

func TestLifecycleSpecDevice(t *testing.T) {
	b := newBench(t, benchOpts{spec: true, version: 18})
	lifecycle(t, b)
	var srqCodes []Cmd
	for _, c := range b.dev.log {
		if c == CmdModifySRQ || c == CmdQuerySRQ {
			srqCodes = append(srqCodes, c)
		}
	}
	// The probe (18, a no-op modify), then the query as 19, the modify as
	// 18, the query as 19.
	if want := []Cmd{18, 19, 18, 19}; !equalCmds(srqCodes, want) {
		t.Errorf("SRQ codes sent %v, want %v", srqCodes, want)
	}
	if q := b.ch.Quirks(); q.Emulated || q.SRQSwap != SRQSwapNo || q.CQArmBoth {
		t.Errorf("quirks %+v", q)
	}
}

func TestLifecycleV20(t *testing.T) {
	b := newBench(t, benchOpts{version: 20, configure: func(b *bench) { b.cfg.DSR.UARPFN = 1 << 40 }})
	if got := le.Uint64(b.dev.dsr[64:]); got != 1<<40 {
		t.Errorf("64-bit uar_pfn %#x", got)
	}
	lifecycle(t, b)
	// The fake gives v2 QP handles = QPN + 0x1000; the lifecycle used them.
	if !b.ch.Quirks().CreateQPV2() {
		t.Error("v20 quirks")
	}
}

func TestCreateQPV1V2(t *testing.T) {
	for _, v := range []uint32{17, 20} {
		b := newBench(t, benchOpts{version: v})
		pd, _ := b.ch.CreatePD(bg, 0)
		cqDir, _ := b.ringObject(1)
		cq, _ := b.ch.CreateCQ(bg, CreateCQRequest{PDirDMA: cqDir, CQE: 32, NChunks: 2})
		qpDir, _ := b.ringObject(2)
		qp, err := b.ch.CreateQP(bg, CreateQPRequest{PDirDMA: qpDir, PDHandle: pd, SendCQHandle: cq.CQHandle, RecvCQHandle: cq.CQHandle,
			MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1, TotalChunks: 3, SendChunks: 1, QPType: QPTypeUD})
		if err != nil {
			t.Fatal(err)
		}
		if want := qp.QPN + map[uint32]uint32{17: 0, 20: 0x1000}[v]; qp.QPHandle != want || qp.MaxSendWR != 16 {
			t.Errorf("version %d: %+v", v, qp)
		}
	}
}

func TestCommandErrors(t *testing.T) {
	b := newBench(t, benchOpts{opts: Options{Device: "0000:00:10.1"}})
	err := b.ch.DestroyCQ(bg, 77)
	var oe *OpError
	if !errors.Is(err, syscall.EINVAL) || !errors.As(err, &oe) || oe.Op != "DESTROY_CQ" || oe.Status != 0xFFFFFFEA || oe.Device != "0000:00:10.1" {
		t.Fatalf("DestroyCQ(77): %v (%+v)", err, oe)
	}
	if !strings.Contains(err.Error(), "0000:00:10.1") || !strings.Contains(err.Error(), "DESTROY_CQ") {
		t.Errorf("message %q", err)
	}
	if _, err := b.ch.ResizeCQ(bg, 0, 64); !errors.Is(err, ErrNotSupported) || !errors.As(err, &oe) || oe.Status != StatusUnsupported {
		t.Errorf("ResizeCQ: %v", err)
	}
	if _, err := b.ch.QueryPort(bg, 2); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("QueryPort(2): %v", err)
	}
	if err := b.ch.Exec(bg, rawRequest{code: 21}, &HeaderOnly{}); !errors.Is(err, ErrNotSupported) {
		t.Errorf("code 21: %v", err)
	}
	// RTR without a bound source GID fails in the device (EIO); the
	// driver's own validation catches a bad state before sending.
	pd, _ := b.ch.CreatePD(bg, 0)
	cqDir, _ := b.ringObject(1)
	cq, _ := b.ch.CreateCQ(bg, CreateCQRequest{PDirDMA: cqDir, CQE: 32, NChunks: 2})
	qpDir, _ := b.ringObject(2)
	qp, err := b.ch.CreateQP(bg, CreateQPRequest{PDirDMA: qpDir, PDHandle: pd, SendCQHandle: cq.CQHandle, RecvCQHandle: cq.CQHandle,
		MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1, TotalChunks: 3, SendChunks: 1, QPType: QPTypeRC})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.ch.ModifyQP(bg, ModifyQPRequest{QPHandle: qp.QPHandle, AttrMask: QPAttrState, Attr: QPAttr{QPState: QPStateRTR}}); !errors.Is(err, syscall.EIO) {
		t.Errorf("RTR without GID: %v", err)
	}
	n := len(b.dev.log)
	if _, err := b.ch.CreateCQ(bg, CreateCQRequest{PDirDMA: cqDir, CQE: 128, NChunks: 2}); !errors.Is(err, ErrInvalid) {
		t.Errorf("undersized CQ: %v", err)
	}
	if len(b.dev.log) != n {
		t.Error("an invalid request reached the device")
	}
	if _, err := b.ch.CreateQP(bg, CreateQPRequest{PDirDMA: qpDir, PDHandle: pd, SendCQHandle: cq.CQHandle, RecvCQHandle: cq.CQHandle,
		MaxSendWR: 16, MaxRecvWR: 16, TotalChunks: 3, SendChunks: 1, QPType: QPTypeUC}); !errors.Is(err, syscall.EIO) {
		t.Errorf("UC QP: %v", err)
	}
}

// rawRequest sends any code with an empty body.
type rawRequest struct{ code Cmd }

func (r rawRequest) Cmd() Cmd { return r.code }
func (r rawRequest) Encode(b []byte) error {
	if err := beginRequest(b, CmdQueryPort); err != nil {
		return err
	}
	le.PutUint32(b[8:], uint32(r.code))
	return nil
}

func TestResponseFaults(t *testing.T) {
	b := newBench(t, benchOpts{})
	for _, tc := range []struct {
		name string
		hook func(cmd, resp []byte) uint32
		is   error
	}{
		{"no response written", func(cmd, resp []byte) uint32 { return 0 }, ErrDeviceFault},
		{"wrong cookie", func(cmd, resp []byte) uint32 {
			p64(resp, 0, le.Uint64(cmd)+1)
			p32(resp, 8, CmdCreatePD.Ack())
			return 0
		}, ErrDeviceFault},
		{"wrong ack", func(cmd, resp []byte) uint32 {
			p64(resp, 0, le.Uint64(cmd))
			p32(resp, 8, CmdCreateCQ.Ack())
			return 0
		}, ErrDeviceFault},
		{"error byte with ERR 0", func(cmd, resp []byte) uint32 {
			p64(resp, 0, le.Uint64(cmd))
			p32(resp, 8, CmdCreatePD.Ack())
			resp[12] = byte(syscall.ENOMEM)
			return 0
		}, syscall.ENOMEM},
		{"positive errno in ERR", func(cmd, resp []byte) uint32 { return uint32(syscall.ENOMEM) }, syscall.ENOMEM},
		{"status that is no errno", func(cmd, resp []byte) uint32 { return 0x80000000 }, ErrDeviceFault},
	} {
		b.dev.hook = tc.hook
		_, err := b.ch.CreatePD(bg, 0)
		var oe *OpError
		if !errors.Is(err, tc.is) || !errors.As(err, &oe) || oe.Op != "CREATE_PD" {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.is)
		}
	}
	b.dev.hook = nil
	if _, err := b.ch.CreatePD(bg, 0); err != nil {
		t.Errorf("after the faults: %v", err)
	}
}

func TestClosed(t *testing.T) {
	b := newBench(t, benchOpts{})
	b.ch.Close()
	b.ch.Close()
	if _, err := b.ch.CreatePD(bg, 0); !errors.Is(err, ErrClosed) {
		t.Errorf("%v", err)
	}
	if err := b.ch.Reset(bg); !errors.Is(err, ErrClosed) {
		t.Errorf("Reset: %v", err)
	}
}

func TestContextDone(t *testing.T) {
	b := newBench(t, benchOpts{})
	ctx, cancel := context.WithCancel(bg)
	cancel()
	n := b.dev.irqs
	if _, err := b.ch.CreatePD(ctx, 0); !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "command channel") {
		t.Errorf("%v", err)
	}
	// A busy channel: the wait for it is bounded too.
	b.ch.sem <- struct{}{}
	ctx, cancel = context.WithTimeout(bg, 10*time.Millisecond)
	defer cancel()
	if _, err := b.ch.CreatePD(ctx, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("busy channel: %v", err)
	}
	<-b.ch.sem
	if b.dev.irqs != n {
		t.Error("a command was sent")
	}
}

func TestDeferredCompletion(t *testing.T) {
	b := newBench(t, benchOpts{spec: true, deferred: true})
	lifecycle(t, b)

	// Spurious and stale wake-ups: the channel waits for its own cookie.
	wakes := 0
	b.ch.wait = func(ctx context.Context) error {
		wakes++
		if wakes%3 == 0 {
			b.dev.deliver()
		}
		return nil
	}
	if _, err := b.ch.CreatePD(bg, 0); err != nil || wakes != 3 {
		t.Errorf("CreatePD: %v after %d wakes", err, wakes)
	}

	// A response that never comes: bounded, and the error says what for.
	b.ch.timeout = 20 * time.Millisecond
	b.ch.wait = func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	_, err := b.ch.CreatePD(bg, 0)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "vector 0") || !strings.Contains(err.Error(), "cookie") {
		t.Errorf("lost response: %v", err)
	}
	b.dev.pending = nil
}

func TestConcurrentExec(t *testing.T) {
	b := newBench(t, benchOpts{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				pd, err := b.ch.CreatePD(bg, 0)
				if err == nil {
					err = b.ch.DestroyPD(bg, pd)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(b.dev.pds) != 0 {
		t.Errorf("%d PDs left", len(b.dev.pds))
	}
}

func TestCtl(t *testing.T) {
	b := newBench(t, benchOpts{})
	_ = b.ch.DestroyCQ(bg, 99) // leaves ERR = -EINVAL
	if err := b.ch.Unquiesce(bg); err != nil {
		t.Errorf("QEMU Unquiesce after a failed command: %v", err)
	}
	if err := b.ch.Reset(bg); err != nil || b.dev.regs[RegCtl/4] != CtlReset {
		t.Errorf("Reset: %v", err)
	}
	if err := b.ch.Activate(bg); err != nil {
		t.Errorf("Activate: %v", err)
	}
	if _, err := b.ch.CreatePD(bg, 0); err != nil {
		t.Errorf("the DSR stays loaded across a reset: %v", err)
	}

	s := newBench(t, benchOpts{spec: true})
	_ = s.ch.DestroyCQ(bg, 99)
	var oe *OpError
	if err := s.ch.Unquiesce(bg); !errors.Is(err, ErrDeviceFault) || !errors.As(err, &oe) || oe.Status != 0xFFFFFFEA {
		t.Errorf("spec Unquiesce with ERR set: %v", err)
	}
	if err := s.ch.SetInterruptMask(bg, IMRUnmaskAll); err != nil || s.dev.regs[RegIMR/4] != 0 {
		t.Errorf("IMR: %v", err)
	}
}

func TestDeviceRingsThroughDSR(t *testing.T) {
	b := newBench(t, benchOpts{ringPages: 2})
	for h := range uint32(5) {
		if !b.dev.notifyCQ(h) {
			t.Fatal("CQ ring full")
		}
	}
	buf := make([]uint32, 8)
	if n, err := b.cqn.Poll(buf); n != 5 || err != nil || buf[4] != 4 {
		t.Errorf("CQ notifications: %d %v %v", n, buf[:n], err)
	}
	if !b.dev.postEvent(EventPortActive, 1) {
		t.Fatal("async ring full")
	}
	evs := make([]AsyncEvent, 2)
	if n, err := b.async.Poll(evs); n != 1 || err != nil || evs[0] != (AsyncEvent{EventPortActive, 1}) {
		t.Errorf("events: %d %+v %v", n, evs, err)
	}
	if b.cqn.Slots() != 2048 || b.async.Slots() != 1024 {
		t.Errorf("slots %d %d", b.cqn.Slots(), b.async.Slots())
	}
}

func TestNewChannelInvalid(t *testing.T) {
	d := newFakeDev(newFakeMem(), 17)
	big := make([]byte, PageSize)
	for name, f := range map[string]func() (*Channel, error){
		"nil regs":   func() (*Channel, error) { return NewChannel(nil, big, big, nil) },
		"short cmd":  func() (*Channel, error) { return NewChannel(d, big[:183], big, nil) },
		"short resp": func() (*Channel, error) { return NewChannel(d, big, big[:175], nil) },
	} {
		if _, err := f(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestStatus(t *testing.T) {
	for _, tc := range []struct {
		s     Status
		errno syscall.Errno
		is    error
	}{
		{0xFFFFFFEA, syscall.EINVAL, syscall.EINVAL},
		{0xFFFFFFF4, syscall.ENOMEM, syscall.ENOMEM},
		{0xFFFFFFFB, syscall.EIO, syscall.EIO},
		{0xFFFFFFFF, syscall.EPERM, syscall.EPERM},
		{12, syscall.ENOMEM, syscall.ENOMEM},
		{0xFFFF, 0, ErrNotSupported},
		{0x80000000, 0, ErrDeviceFault},
		{4096, 0, ErrDeviceFault},
	} {
		if tc.s.Errno() != tc.errno || !errors.Is(tc.s.err(), tc.is) {
			t.Errorf("%s: errno %v err %v", tc.s, tc.s.Errno(), tc.s.err())
		}
	}
}

func equalCmds(a, b []Cmd) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Close waits for the command in progress: once it returns, nothing
// touches the slots or registers (the caller unmaps them next). Before,
// Close returned at once and the command read the response slot after.
func TestCloseWaitsForTheCommandInProgress(t *testing.T) {
	b := newBench(t, benchOpts{spec: true, deferred: true})
	entered, release := make(chan struct{}), make(chan struct{})
	// waited is set inside the command, before it reads the response slot
	// and lets the channel go: a Close that waits returns after it. (The
	// command's return to its caller comes after the channel is free, so
	// it cannot be the mark.)
	var waited atomic.Bool
	b.ch.wait = func(ctx context.Context) error {
		close(entered)
		<-release
		b.dev.deliver()
		waited.Store(true)
		return nil
	}
	cmdErr := make(chan error, 1)
	go func() {
		_, err := b.ch.CreatePD(bg, 0)
		cmdErr <- err
	}()
	<-entered // the command holds the channel and waits for its response
	doneAtClose := make(chan bool, 1)
	go func() {
		assert.NoError(t, b.ch.Close())
		doneAtClose <- waited.Load()
	}()
	for !b.ch.closed.Load() {
		runtime.Gosched()
	}
	for range 100 { // time for a Close that does not wait to return
		runtime.Gosched()
	}
	close(release)
	assert.True(t, <-doneAtClose, "Close returned while a command was in progress")
	assert.NoError(t, <-cmdErr, "the command in progress completes")
	_, err := b.ch.CreatePD(bg, 0)
	assert.ErrorIs(t, err, ErrClosed)
	assert.NoError(t, b.ch.Close(), "a second Close")
}
