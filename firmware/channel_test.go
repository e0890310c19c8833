package firmware_test

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/pvsim"
)

func TestStartQEMU(t *testing.T) {
	mac := [6]byte{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}
	b := newBench(t, benchOpts{dev: pvsim.Config{QEMU: true, MAC: mac}})
	assert.Equal(t, uint32(1024), b.caps.MaxQP, "caps %+v", b.caps)
	assert.Equal(t, uint8(firmware.GIDTypeRoCEv1), b.caps.GIDTypes)
	assert.Equal(t, "0.0.14", b.caps.FWVersion())
	assert.Equal(t, uint64(0x505400fffe123456), b.caps.NodeGUID, "the MAC's EUI-64")
	want := firmware.Quirks{Version: 17, Emulated: true, NoAsyncEvents: true, CQArmBoth: true, UnquiesceKeepsErr: true}
	assert.Equal(t, want, b.ch.Quirks())
	assert.Equal(t, firmware.IMRMaskAll, b.reg(firmware.RegIMR), "IMR")
	assert.Zero(t, b.reg(firmware.RegErr), "ERR")
	assert.Empty(t, b.tap.sent(), "bring-up sent commands")
	assert.Zero(t, b.dev.Stats().Commands, "bring-up sent commands")
	// DSR contents as the device sees them: 32-bit PFN at version 17.
	dsr := b.cfg.DSRMem
	assert.Equal(t, uint32(firmware.DriverVersion), le.Uint32(dsr[0:]), "driver_version")
	assert.Equal(t, uint32(2|1<<2|1<<6), le.Uint32(dsr[8:]), "gos_info")
	st := b.dev.State()
	assert.True(t, st.DSRLoaded)
	assert.True(t, st.Activated)
}

func TestStartInterrupts(t *testing.T) {
	for _, dev := range []pvsim.Config{qemu, vmware(20)} {
		b := newBench(t, benchOpts{dev: dev, configure: func(b *bench) { b.cfg.Interrupts = true }})
		assert.Equal(t, firmware.IMRUnmaskAll, b.reg(firmware.RegIMR), "IMR")
		assert.Equal(t, firmware.IMRUnmaskAll, b.dev.State().IMR, "IMR")
	}
}

// With NoActivate, Start loads the DSR and stops: IMR and CTL untouched,
// commands already accepted; the caller activates later.
func TestStartNoActivate(t *testing.T) {
	b := newBench(t, benchOpts{dev: qemu, noStart: true, configure: func(b *bench) {
		b.cfg.NoActivate, b.cfg.Interrupts = true, true
		require.NoError(t, b.regs.Store32(firmware.RegIMR, 0x5a)) // neither mask value
	}})
	version, caps, err := b.ch.Start(bg, &b.cfg)
	require.NoError(t, err)
	assert.Equal(t, uint32(firmware.VersionRoCEv1), version)
	assert.Equal(t, uint32(1024), caps.MaxQP, "caps")
	assert.Equal(t, uint32(0x5a), b.reg(firmware.RegIMR), "IMR written")
	assert.Equal(t, uint32(0), b.reg(firmware.RegCtl), "CTL written")
	assert.Equal(t, uint32(0xFFFF), b.reg(firmware.RegErr), "ERR: the device was activated")
	assert.False(t, b.dev.State().Activated, "the device was activated")
	_, err = b.ch.QueryPort(bg, 1)
	require.NoError(t, err, "a command before activation")

	require.NoError(t, b.ch.SetInterruptMask(bg, firmware.IMRUnmaskAll))
	require.NoError(t, b.ch.Activate(bg))
	assert.Equal(t, firmware.IMRUnmaskAll, b.reg(firmware.RegIMR))
	assert.Equal(t, uint32(0), b.reg(firmware.RegErr))
	assert.True(t, b.dev.State().Activated)
}

func TestStartUnsupportedVersion(t *testing.T) {
	b := newBench(t, benchOpts{dev: vmware(16), noStart: true})
	_, _, err := b.ch.Start(bg, &b.cfg)
	var fe *firmware.FieldError
	require.ErrorIs(t, err, firmware.ErrNotSupported, "version 16")
	require.ErrorAs(t, err, &fe)
	require.Equal(t, "VERSION", fe.Field)
	assert.Zero(t, b.reg(firmware.RegDSRLow), "DSR address written to an unsupported device")
	assert.Zero(t, b.reg(firmware.RegDSRHigh), "DSR address written to an unsupported device")
	assert.False(t, b.dev.State().DSRLoaded)
}

func TestDSRNotLoaded(t *testing.T) {
	b := newBench(t, benchOpts{dev: qemu, noStart: true, configure: func(b *bench) {
		b.cfg.DSR.RespSlotDMA = 0x7000 // not DMA memory: the device cannot map it
	}})
	_, _, err := b.ch.Start(bg, &b.cfg)
	var oe *firmware.OpError
	require.ErrorIs(t, err, firmware.ErrDSRNotLoaded, "Start")
	require.ErrorAs(t, err, &oe)
	require.Equal(t, "load DSR", oe.Op)
	assert.False(t, b.dev.State().DSRLoaded)
	_, err = b.ch.CreatePD(bg, 0)
	assert.ErrorIs(t, err, firmware.ErrDSRNotLoaded, "command after a failed load")
	assert.Empty(t, b.tap.sent(), "REQUEST written without a loaded DSR")
	assert.Zero(t, b.dev.Stats().Commands, "REQUEST written without a loaded DSR")
}

func TestExecBeforeLoad(t *testing.T) {
	b := newBench(t, benchOpts{dev: qemu, noStart: true})
	err := b.ch.Exec(bg, firmware.QueryPortRequest{Port: 1}, &firmware.QueryPortResponse{})
	require.ErrorIs(t, err, firmware.ErrDSRNotLoaded)
	assert.Zero(t, b.dev.Stats().Commands, "REQUEST written before LoadDSR")
}

func TestLoadDSRBadAddress(t *testing.T) {
	b := newBench(t, benchOpts{dev: qemu, noStart: true})
	for _, a := range []uint64{0, 0x1000 + firmware.PageSize - 8} {
		_, err := b.ch.LoadDSR(bg, a, b.cfg.DSRMem, 17)
		assert.ErrorIs(t, err, firmware.ErrInvalid, "%#x", a)
	}
	_, err := b.ch.LoadDSR(bg, 0x1000, make([]byte, 10), 17)
	assert.ErrorIs(t, err, firmware.ErrInvalid, "short DSR")
	assert.Zero(t, b.reg(firmware.RegDSRHigh), "DSRHIGH written")
}

// lifecycle creates and destroys one of everything through the typed
// helpers, checking what the device saw. It adapts to the device only
// where QEMU 7.2 and a VMware device differ.
func lifecycle(t *testing.T, b *bench) {
	t.Helper()
	ctx := bg
	m := b.dev
	attr, err := b.ch.QueryPort(ctx, 1)
	require.NoError(t, err, "QueryPort")
	assert.Equal(t, uint32(firmware.PortActive), attr.State)
	wantMsg := uint32(1 << 31)
	if m.QEMU() {
		wantMsg = 1024 // hard-coded by QEMU 7.2
	}
	assert.Equal(t, wantMsg, attr.MaxMsgSz)
	assert.Equal(t, uint8(5), attr.PhysState, "LinkUp")
	pk, err := b.ch.QueryPKey(ctx, 1, 0)
	require.NoError(t, err, "QueryPKey")
	assert.Equal(t, uint16(0xFFFF), pk)
	uc, err := b.ch.CreateUC(ctx, 0x12345)
	require.NoError(t, err, "CreateUC")
	pd, err := b.ch.CreatePD(ctx, 0)
	require.NoError(t, err, "CreatePD")
	// A 3-page MR through a multi-table-capable directory.
	dir, tbl := b.page(), b.page()
	data, _ := b.pages(3)
	require.NoError(t, firmware.WritePageDir(dir, []firmware.Page{tbl}, data))
	mr, err := b.ch.CreateMR(ctx, firmware.CreateMRRequest{Start: 0x7f0000000000, Length: 3 * firmware.PageSize, PDirDMA: dir.DMA,
		PDHandle: pd, AccessFlags: firmware.AccessLocalWrite, NChunks: 3})
	require.NoError(t, err, "CreateMR")
	mrs := m.MRs()
	require.Len(t, mrs, 1)
	assert.Equal(t, pvsim.MRInfo{Handle: mr.MRHandle, PD: pd, LKey: mr.LKey, RKey: mr.RKey, Start: 0x7f0000000000,
		Length: 3 * firmware.PageSize, Access: firmware.AccessLocalWrite}, mrs[0], "the MR as the device holds it")
	if m.QEMU() {
		assert.Equal(t, uint32(0xFFFFFFFF), mr.RKey, "QEMU emulates no remote access")
	}
	cqDir, _ := b.ringObject(1)
	cq, err := b.ch.CreateCQ(ctx, firmware.CreateCQRequest{PDirDMA: cqDir, CQE: 64, NChunks: 2})
	require.NoError(t, err, "CreateCQ")
	assert.Equal(t, uint32(64), cq.CQE)
	srqDir, _ := b.ringObject(1)
	srq, err := b.ch.CreateSRQ(ctx, firmware.CreateSRQRequest{PDirDMA: srqDir, PDHandle: pd, NChunks: 2,
		Attr: firmware.SRQAttr{MaxWR: 32, MaxSGE: 4, SRQLimit: 4}})
	require.NoError(t, err, "CreateSRQ")
	qpDir, _ := b.ringObject(3)
	qp, err := b.ch.CreateQP(ctx, firmware.CreateQPRequest{PDirDMA: qpDir, PDHandle: pd, SendCQHandle: cq.CQHandle, RecvCQHandle: cq.CQHandle,
		MaxSendWR: 32, MaxRecvWR: 32, MaxSendSGE: 4, MaxRecvSGE: 4, TotalChunks: 4, SendChunks: 2, QPType: firmware.QPTypeRC})
	require.NoError(t, err, "CreateQP")
	assert.Equal(t, uint32(32), qp.MaxSendWR)
	assert.Equal(t, uint32(4), qp.MaxRecvSGE)
	info, ok := m.QP(qp.QPHandle)
	require.True(t, ok, "no QP with handle %#x on the device", qp.QPHandle)
	assert.Equal(t, qp.QPN, info.QPN)
	g := gid(0x20)
	require.NoError(t, b.ch.CreateBind(ctx, firmware.CreateBindRequest{MTU: 1024, VLAN: 0xFFF, Index: 1, GID: g, GIDType: firmware.GIDTypeRoCEv1}), "CreateBind")
	// The masks the verbs require for RC (a VMware device checks them;
	// QEMU reads the values it needs whatever the mask says).
	steps := []firmware.ModifyQPRequest{
		{AttrMask: firmware.QPAttrState | firmware.QPAttrPKeyIndex | firmware.QPAttrPort | firmware.QPAttrAccessFlags,
			Attr: firmware.QPAttr{QPState: firmware.QPStateInit, PortNum: 1, QPAccessFlags: firmware.AccessLocalWrite}},
		{AttrMask: firmware.QPAttrState | firmware.QPAttrAV | firmware.QPAttrPathMTU | firmware.QPAttrDestQPN | firmware.QPAttrRQPSN |
			firmware.QPAttrMaxDestRDAtomic | firmware.QPAttrMinRNRTimer,
			Attr: firmware.QPAttr{QPState: firmware.QPStateRTR, PathMTU: firmware.MTU1024, DestQPNum: qp.QPN, RQPSN: 7,
				AH: firmware.AHAttr{GRH: firmware.GlobalRoute{DGID: g, SGIDIndex: 1, HopLimit: 1}, AHFlags: firmware.AHFlagGRH, PortNum: 1}}},
		{AttrMask: firmware.QPAttrState | firmware.QPAttrSQPSN | firmware.QPAttrTimeout | firmware.QPAttrRetryCnt | firmware.QPAttrRNRRetry |
			firmware.QPAttrMaxQPRDAtomic,
			Attr: firmware.QPAttr{QPState: firmware.QPStateRTS, SQPSN: 7, Timeout: 14, RetryCnt: 7, RNRRetry: 7}},
	}
	for _, s := range steps {
		s.QPHandle = qp.QPHandle
		require.NoError(t, b.ch.ModifyQP(ctx, s), "ModifyQP to %v", s.Attr.QPState)
	}
	qa, err := b.ch.QueryQP(ctx, qp.QPHandle, firmware.QPAttrState)
	require.NoError(t, err, "QueryQP")
	assert.Equal(t, firmware.QPStateRTS, qa.QPState)
	assert.Equal(t, qp.QPN, qa.DestQPNum)
	sa, err := b.ch.QuerySRQ(ctx, srq)
	require.NoError(t, err, "QuerySRQ")
	// A VMware device ignores the limit at creation, as the verbs do;
	// QEMU 7.2 keeps it.
	wantLimit := uint32(0)
	if m.QEMU() {
		wantLimit = 4
	}
	assert.Equal(t, firmware.SRQAttr{MaxWR: 32, MaxSGE: 4, SRQLimit: wantLimit}, sa)
	require.NoError(t, b.ch.ModifySRQ(ctx, firmware.ModifySRQRequest{SRQHandle: srq, AttrMask: firmware.SRQAttrLimit, Attr: firmware.SRQAttr{SRQLimit: 9}}), "ModifySRQ")
	sa, err = b.ch.QuerySRQ(ctx, srq)
	require.NoError(t, err, "QuerySRQ after modify")
	assert.Equal(t, uint32(9), sa.SRQLimit)
	b.sync()
	assert.Equal(t, pvsim.Objects{PDs: 1, MRs: 1, CQs: 1, QPs: 1, SRQs: 1, UCs: 1, GIDs: 1}, m.Objects())
	assert.Equal(t, g, m.GIDs()[1].GID, "the bound GID")
	for _, step := range []struct {
		name string
		err  error
	}{
		{"DestroyQP", b.ch.DestroyQP(ctx, qp.QPHandle)},
		{"DestroySRQ", b.ch.DestroySRQ(ctx, srq)},
		{"DestroyCQ", b.ch.DestroyCQ(ctx, cq.CQHandle)},
		{"DestroyMR", b.ch.DestroyMR(ctx, mr.MRHandle)},
		{"DestroyPD", b.ch.DestroyPD(ctx, pd)},
		{"DestroyBind", b.ch.DestroyBind(ctx, firmware.DestroyBindRequest{Index: 1, GID: g})},
		{"DestroyUC", b.ch.DestroyUC(ctx, uc)},
	} {
		assert.NoError(t, step.err, step.name)
	}
	b.sync()
	assert.Equal(t, pvsim.Objects{}, m.Objects(), "objects left on the device")
}

// srqCodes returns the MODIFY_SRQ and QUERY_SRQ codes sent, in order.
func srqCodes(b *bench) []firmware.Cmd {
	var out []firmware.Cmd
	for _, c := range b.tap.sent() {
		if c == firmware.CmdModifySRQ || c == firmware.CmdQuerySRQ {
			out = append(out, c)
		}
	}
	return out
}

func TestLifecycleQEMU(t *testing.T) {
	b := newBench(t, benchOpts{dev: qemu})
	lifecycle(t, b)
	// The SRQ commands as sent: the first query is the probe (code 18, a
	// query on QEMU), the modify goes as 19, the second query as 18.
	assert.Equal(t, []firmware.Cmd{18, 19, 18}, srqCodes(b), "SRQ codes sent")
	assert.Equal(t, firmware.SRQSwapYes, b.ch.Quirks().SRQSwap)
}

func TestLifecycleVMware(t *testing.T) {
	for _, v := range []uint32{17, 18, 19} {
		b := newBench(t, benchOpts{dev: vmware(v)})
		lifecycle(t, b)
		// The probe (18, a no-op modify), then the query as 19, the modify
		// as 18, the query as 19.
		assert.Equal(t, []firmware.Cmd{18, 19, 18, 19}, srqCodes(b), "version %d: SRQ codes sent", v)
		q := b.ch.Quirks()
		assert.False(t, q.Emulated, "version %d taken for QEMU", v)
		assert.Equal(t, firmware.SRQSwapNo, q.SRQSwap)
		assert.False(t, q.CQArmBoth)
	}
}

func TestLifecycleV20(t *testing.T) {
	b := newBench(t, benchOpts{dev: vmware(20), configure: func(b *bench) { b.cfg.DSR.UARPFN = 1 << 40 }})
	assert.Equal(t, uint64(1<<40), le.Uint64(b.cfg.DSRMem[64:]), "64-bit uar_pfn")
	assert.Equal(t, uint64(1<<40), b.dev.State().UARPFN, "the uar_pfn the device read")
	lifecycle(t, b)
	// Version 20 QP handles are not QP numbers; the lifecycle used them.
	assert.True(t, b.ch.Quirks().CreateQPV2(), "v20 quirks")
}

func TestCreateQPV1V2(t *testing.T) {
	for _, tc := range []struct {
		name string
		dev  pvsim.Config
	}{{"qemu", qemu}, {"v17", vmware(17)}, {"v20", vmware(20)}} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBench(t, benchOpts{dev: tc.dev})
			pd, err := b.ch.CreatePD(bg, 0)
			require.NoError(t, err)
			cqDir, _ := b.ringObject(1)
			cq, err := b.ch.CreateCQ(bg, firmware.CreateCQRequest{PDirDMA: cqDir, CQE: 32, NChunks: 2})
			require.NoError(t, err)
			qpDir, _ := b.ringObject(2)
			qp, err := b.ch.CreateQP(bg, firmware.CreateQPRequest{PDirDMA: qpDir, PDHandle: pd, SendCQHandle: cq.CQHandle, RecvCQHandle: cq.CQHandle,
				MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1, TotalChunks: 3, SendChunks: 1, QPType: firmware.QPTypeUD})
			require.NoError(t, err)
			assert.Equal(t, uint32(16), qp.MaxSendWR)
			info, ok := b.dev.QP(qp.QPHandle)
			require.True(t, ok, "no QP with handle %#x on the device", qp.QPHandle)
			assert.Equal(t, qp.QPN, info.QPN, "QP number")
			if b.dev.Version() >= firmware.VersionQPHandle {
				assert.NotEqual(t, qp.QPN, qp.QPHandle, "a version 20 handle is not the QP number")
			} else {
				assert.Equal(t, qp.QPN, qp.QPHandle, "before version 20 the handle is the QP number")
			}
		})
	}
}

func TestCommandErrors(t *testing.T) {
	b := newBench(t, benchOpts{dev: qemu, opts: firmware.Options{Device: "0000:00:10.1"}})
	err := b.ch.DestroyCQ(bg, 77)
	var oe *firmware.OpError
	require.ErrorIs(t, err, syscall.EINVAL, "DestroyCQ(77)")
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, "DESTROY_CQ", oe.Op)
	assert.Equal(t, firmware.Status(0xFFFFFFEA), oe.Status)
	assert.Equal(t, "0000:00:10.1", oe.Device)
	assert.ErrorContains(t, err, "0000:00:10.1")
	assert.ErrorContains(t, err, "DESTROY_CQ")
	_, err = b.ch.ResizeCQ(bg, 0, 64)
	assert.ErrorIs(t, err, firmware.ErrNotSupported, "ResizeCQ")
	if assert.ErrorAs(t, err, &oe) {
		assert.Equal(t, firmware.Status(firmware.StatusUnsupported), oe.Status)
	}
	_, err = b.ch.QueryPort(bg, 2)
	assert.ErrorIs(t, err, syscall.EINVAL, "QueryPort(2)")
	assert.ErrorIs(t, b.ch.Exec(bg, rawRequest{code: 21}, &firmware.HeaderOnly{}), firmware.ErrNotSupported, "code 21")
	// RTR without a bound source GID fails in the device (EIO); the
	// driver's own validation catches a bad state before sending.
	pd, err := b.ch.CreatePD(bg, 0)
	require.NoError(t, err)
	cqDir, _ := b.ringObject(1)
	cq, err := b.ch.CreateCQ(bg, firmware.CreateCQRequest{PDirDMA: cqDir, CQE: 32, NChunks: 2})
	require.NoError(t, err)
	qpDir, _ := b.ringObject(2)
	qp, err := b.ch.CreateQP(bg, firmware.CreateQPRequest{PDirDMA: qpDir, PDHandle: pd, SendCQHandle: cq.CQHandle, RecvCQHandle: cq.CQHandle,
		MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1, TotalChunks: 3, SendChunks: 1, QPType: firmware.QPTypeRC})
	require.NoError(t, err)
	err = b.ch.ModifyQP(bg, firmware.ModifyQPRequest{QPHandle: qp.QPHandle, AttrMask: firmware.QPAttrState, Attr: firmware.QPAttr{QPState: firmware.QPStateRTR}})
	assert.ErrorIs(t, err, syscall.EIO, "RTR without GID")
	n := len(b.tap.sent())
	_, err = b.ch.CreateCQ(bg, firmware.CreateCQRequest{PDirDMA: cqDir, CQE: 128, NChunks: 2})
	assert.ErrorIs(t, err, firmware.ErrInvalid, "undersized CQ")
	assert.Len(t, b.tap.sent(), n, "an invalid request reached the device")
	_, err = b.ch.CreateQP(bg, firmware.CreateQPRequest{PDirDMA: qpDir, PDHandle: pd, SendCQHandle: cq.CQHandle, RecvCQHandle: cq.CQHandle,
		MaxSendWR: 16, MaxRecvWR: 16, TotalChunks: 3, SendChunks: 1, QPType: firmware.QPTypeUC})
	assert.ErrorIs(t, err, syscall.EIO, "UC QP")
}

// rawRequest sends any code with an empty body.
type rawRequest struct{ code firmware.Cmd }

func (r rawRequest) Cmd() firmware.Cmd { return r.code }
func (r rawRequest) Encode(b []byte) error {
	clear(b[:firmware.CmdSlotSize])
	le.PutUint32(b[8:], uint32(r.code))
	return nil
}

// A device that answers wrongly: every fault is reported as the command's
// error, and the channel works again afterwards. The model produces all
// but a wrong cookie or acknowledgement, which tap writes over its answer.
func TestResponseFaults(t *testing.T) {
	for _, dev := range []struct {
		name string
		cfg  pvsim.Config
	}{{"qemu", qemu}, {"vmware", vmware(17)}} {
		t.Run(dev.name, func(t *testing.T) {
			b := newBench(t, benchOpts{dev: dev.cfg})
			for _, tc := range []struct {
				name   string
				fault  pvsim.CommandFault
				tamper func(cmd, resp []byte)
				is     error
			}{
				{name: "no response written", fault: pvsim.CommandFault{Hang: true}, is: firmware.ErrDeviceFault},
				{name: "wrong cookie", tamper: func(cmd, resp []byte) { le.PutUint64(resp, le.Uint64(cmd)+1) }, is: firmware.ErrDeviceFault},
				{name: "wrong ack", tamper: func(cmd, resp []byte) { le.PutUint32(resp[8:], firmware.CmdCreateCQ.Ack()) }, is: firmware.ErrDeviceFault},
				// VMware: the error byte with ERR 0; QEMU: ERR as well.
				{name: "error answer", fault: pvsim.CommandFault{Errno: syscall.ENOMEM}, is: syscall.ENOMEM},
				{name: "positive errno in ERR", fault: pvsim.CommandFault{Status: uint32(syscall.ENOMEM)}, is: syscall.ENOMEM},
				{name: "status that is no errno", fault: pvsim.CommandFault{Status: 0x80000000}, is: firmware.ErrDeviceFault},
			} {
				if tc.tamper != nil {
					b.tap.tamper(tc.tamper, nil)
				} else {
					tc.fault.Cmd = firmware.CmdCreatePD
					require.NoError(t, b.dev.InjectFault(tc.fault))
				}
				_, err := b.ch.CreatePD(bg, 0)
				b.tap.tamper(nil, nil)
				var oe *firmware.OpError
				assert.ErrorIs(t, err, tc.is, tc.name)
				if assert.ErrorAs(t, err, &oe, tc.name) {
					assert.Equal(t, "CREATE_PD", oe.Op, tc.name)
				}
			}
			_, err := b.ch.CreatePD(bg, 0)
			assert.NoError(t, err, "after the faults")
		})
	}
}

func TestClosed(t *testing.T) {
	b := newBench(t, benchOpts{dev: qemu})
	require.NoError(t, b.ch.Close())
	require.NoError(t, b.ch.Close())
	_, err := b.ch.CreatePD(bg, 0)
	assert.ErrorIs(t, err, firmware.ErrClosed)
	assert.ErrorIs(t, b.ch.Reset(bg), firmware.ErrClosed, "Reset")
}

func TestContextDone(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	b := newBench(t, benchOpts{dev: vmware(17), wait: func(b *bench, ctx context.Context) error {
		close(entered)
		<-release
		return errors.New("released")
	}})
	ctx, cancel := context.WithCancel(bg)
	cancel()
	n := b.dev.Stats().Commands
	_, err := b.ch.CreatePD(ctx, 0)
	assert.ErrorIs(t, err, context.Canceled)
	assert.ErrorContains(t, err, "command channel")
	assert.Equal(t, n, b.dev.Stats().Commands, "a command was sent")

	// A busy channel: a command the device never answers holds it, and
	// the wait for it is bounded too.
	require.NoError(t, b.dev.InjectFault(pvsim.CommandFault{Cmd: firmware.CmdCreatePD, Hang: true}))
	hung := make(chan error, 1)
	go func() {
		_, err := b.ch.CreatePD(bg, 0)
		hung <- err
	}()
	<-entered
	n = b.dev.Stats().Commands
	_, err = b.ch.CreatePD(withTimeout(t, 10*time.Millisecond), 0)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "busy channel")
	assert.Equal(t, n, b.dev.Stats().Commands, "a command was sent")
	close(release)
	assert.ErrorContains(t, <-hung, "released", "the command the device never answered")
}

// A device that answers late: the channel waits for vector 0 and for its
// own cookie, through wake-ups that bring nothing, and not for ever.
func TestDeferredCompletion(t *testing.T) {
	b := newBench(t, benchOpts{dev: pvsim.Config{Version: 18, CommandDelay: time.Millisecond}})
	lifecycle(t, b)

	// Spurious wake-ups: the channel waits for its own cookie. The
	// response comes 200 ms after the request, long after the two
	// spurious wake-ups return.
	var wakes atomic.Int32
	s := newBench(t, benchOpts{dev: pvsim.Config{Version: 18, CommandDelay: 200 * time.Millisecond},
		wait: func(b *bench, ctx context.Context) error {
			if wakes.Add(1) < 3 {
				return nil
			}
			_, err := b.vec0.Wait(ctx)
			return err
		}})
	_, err := s.ch.CreatePD(bg, 0)
	assert.NoError(t, err, "CreatePD")
	assert.Equal(t, int32(3), wakes.Load(), "wake-ups")

	// A response that never comes: bounded, and the error says what for.
	l := newBench(t, benchOpts{dev: pvsim.Config{Version: 18, CommandDelay: time.Millisecond},
		opts: firmware.Options{Timeout: 20 * time.Millisecond}})
	require.NoError(t, l.dev.InjectFault(pvsim.CommandFault{Cmd: firmware.CmdCreatePD, Hang: true}))
	_, err = l.ch.CreatePD(bg, 0)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "lost response")
	assert.ErrorContains(t, err, "vector 0")
	assert.ErrorContains(t, err, "cookie")
	_, err = l.ch.CreatePD(bg, 0)
	assert.NoError(t, err, "the command after")
}

func TestConcurrentExec(t *testing.T) {
	for _, dev := range []struct {
		name string
		cfg  pvsim.Config
	}{{"qemu", qemu}, {"vmware async", pvsim.Config{Version: 20, CommandDelay: 10 * time.Microsecond}}} {
		t.Run(dev.name, func(t *testing.T) {
			b := newBench(t, benchOpts{dev: dev.cfg})
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					for range 50 {
						pd, err := b.ch.CreatePD(bg, 0)
						if err == nil {
							err = b.ch.DestroyPD(bg, pd)
						}
						if !assert.NoError(t, err) {
							return
						}
					}
				})
			}
			wg.Wait()
			b.sync()
			assert.Zero(t, b.dev.Objects().PDs, "PDs left")
		})
	}
}

func TestCtl(t *testing.T) {
	b := newBench(t, benchOpts{dev: qemu})
	_ = b.ch.DestroyCQ(bg, 99) // leaves ERR = -EINVAL
	require.Equal(t, uint32(0xFFFFFFEA), b.reg(firmware.RegErr))
	assert.NoError(t, b.ch.Unquiesce(bg), "QEMU Unquiesce after a failed command")
	assert.NoError(t, b.ch.Reset(bg), "Reset")
	assert.Equal(t, uint32(firmware.CtlReset), b.reg(firmware.RegCtl))
	assert.False(t, b.dev.State().Activated)
	assert.NoError(t, b.ch.Activate(bg), "Activate")
	_, err := b.ch.CreatePD(bg, 0)
	assert.NoError(t, err, "the DSR stays loaded across a reset")

	// A device that follows the interface reports the status of CTL in
	// ERR. The model's never refuses UNQUIESCE: tap makes ERR read
	// -EINVAL after it, as a device that did would.
	s := newBench(t, benchOpts{dev: vmware(18)})
	require.NoError(t, s.ch.Unquiesce(bg), "Unquiesce")
	s.tap.tamper(nil, func(uint32) uint32 { return 0xFFFFFFEA })
	var oe *firmware.OpError
	err = s.ch.Unquiesce(bg)
	assert.ErrorIs(t, err, firmware.ErrDeviceFault, "spec Unquiesce with ERR set")
	if assert.ErrorAs(t, err, &oe) {
		assert.Equal(t, firmware.Status(0xFFFFFFEA), oe.Status)
	}
	s.tap.tamper(nil, nil)
	assert.NoError(t, s.ch.SetInterruptMask(bg, firmware.IMRUnmaskAll), "IMR")
	assert.Equal(t, firmware.IMRUnmaskAll, s.dev.State().IMR)
}

// The device finds its two rings through the DSR: CQ notifications and
// async events arrive where the driver polls them.
func TestDeviceRingsThroughDSR(t *testing.T) {
	b := newBench(t, benchOpts{dev: pvsim.Config{Version: 20, CQNotifyAll: true}, ringPages: 2})
	assert.Equal(t, 2048, b.cqn.Slots())
	assert.Equal(t, 1024, b.async.Slots())

	// Five send WQEs flushed by the QP going to ERR: five CQEs, five
	// notifications (CQNotifyAll: one per CQE).
	pd, err := b.ch.CreatePD(bg, 0)
	require.NoError(t, err)
	cqDir, _ := b.ringObject(1)
	cq, err := b.ch.CreateCQ(bg, firmware.CreateCQRequest{PDirDMA: cqDir, CQE: 64, NChunks: 2})
	require.NoError(t, err)
	qpDir, qpState := b.ringObject(2)
	qp, err := b.ch.CreateQP(bg, firmware.CreateQPRequest{PDirDMA: qpDir, PDHandle: pd, SendCQHandle: cq.CQHandle, RecvCQHandle: cq.CQHandle,
		MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1, TotalChunks: 3, SendChunks: 1, QPType: firmware.QPTypeRC})
	require.NoError(t, err)
	le.PutUint32(qpState.Mem[0:], 5) // the send queue's prod_tail: five WQEs posted
	require.NoError(t, b.ch.ModifyQP(bg, firmware.ModifyQPRequest{QPHandle: qp.QPHandle, AttrMask: firmware.QPAttrState,
		Attr: firmware.QPAttr{QPState: firmware.QPStateErr}}))
	buf := make([]uint32, 8)
	n, err := b.cqn.Poll(buf)
	require.NoError(t, err, "CQ notifications")
	assert.Equal(t, slices.Repeat([]uint32{cq.CQHandle}, 5), buf[:n], "CQ notifications")

	require.NoError(t, b.dev.Raise(firmware.EventPortActive, 1))
	evs := make([]firmware.AsyncEvent, 2)
	ne, err := b.async.Poll(evs)
	require.NoError(t, err, "events")
	assert.Equal(t, []firmware.AsyncEvent{{Type: firmware.EventPortActive, Info: 1}}, evs[:ne])
}

func TestNewChannelInvalid(t *testing.T) {
	b := newBench(t, benchOpts{dev: qemu, noStart: true})
	big := make([]byte, firmware.PageSize)
	for name, f := range map[string]func() (*firmware.Channel, error){
		"nil regs":   func() (*firmware.Channel, error) { return firmware.NewChannel(nil, big, big, nil) },
		"short cmd":  func() (*firmware.Channel, error) { return firmware.NewChannel(b.regs, big[:183], big, nil) },
		"short resp": func() (*firmware.Channel, error) { return firmware.NewChannel(b.regs, big, big[:175], nil) },
	} {
		_, err := f()
		assert.ErrorIs(t, err, firmware.ErrInvalid, name)
	}
}

// Close waits for the command in progress: once it returns, nothing
// touches the slots or registers (the caller unmaps them next). Before,
// Close returned at once and the command read the response slot after.
func TestCloseWaitsForTheCommandInProgress(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	// waited is set inside the command, before it reads the response slot
	// and lets the channel go: a Close that waits returns after it. (The
	// command's return to its caller comes after the channel is free, so
	// it cannot be the mark.)
	var waited atomic.Bool
	b := newBench(t, benchOpts{dev: pvsim.Config{Version: 18, CommandDelay: time.Millisecond},
		wait: func(b *bench, ctx context.Context) error {
			once.Do(func() { close(entered) })
			<-release
			_, err := b.vec0.Wait(ctx) // the response
			waited.Store(true)
			return err
		}})
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
	for !b.ch.Closing() {
		runtime.Gosched()
	}
	for range 100 { // time for a Close that does not wait to return
		runtime.Gosched()
	}
	close(release)
	assert.True(t, <-doneAtClose, "Close returned while a command was in progress")
	assert.NoError(t, <-cmdErr, "the command in progress completes")
	_, err := b.ch.CreatePD(bg, 0)
	assert.ErrorIs(t, err, firmware.ErrClosed)
	assert.NoError(t, b.ch.Close(), "a second Close")
}

// Once a command is sent, the channel waits for its response for its own
// timeout, whatever the caller's context says: a command the device runs
// is never reported as not run. (Bounded by the caller's context, a
// DESTROY sent with little of it left was reported failed and ran all the
// same; the device gave its handle to the next object, and the caller's
// retry destroyed that one.) A context done before the command is sent
// still sends nothing (TestContextDone).
func TestASentCommandIsWaitedForWhateverTheCallerHasLeft(t *testing.T) {
	var armed atomic.Bool
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	b := newBench(t, benchOpts{dev: pvsim.Config{Version: 18, CommandDelay: 20 * time.Millisecond},
		opts: firmware.Options{Timeout: time.Minute},
		wait: func(b *bench, wctx context.Context) error {
			if armed.CompareAndSwap(true, false) {
				cancel() // the caller gives up once the command is out
			}
			_, err := b.vec0.Wait(wctx)
			return err
		}})
	armed.Store(true)
	h, err := b.ch.CreatePD(ctx, 0)
	require.NoError(t, err, "the device answered within the channel's timeout")
	// The model runs commands in order: once a second one is answered,
	// the first has run, whatever was reported.
	h2, err := b.ch.CreatePD(bg, 0)
	require.NoError(t, err)
	assert.Equal(t, 2, b.dev.Objects().PDs, "what the device holds is what the channel reported")
	require.NoError(t, b.ch.DestroyPD(bg, h))
	require.NoError(t, b.ch.DestroyPD(bg, h2))
}
