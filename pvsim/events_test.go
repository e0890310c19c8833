package pvsim_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/pvsim"
	"github.com/vfrdma/vfrdma/rings"
)

func fired(r *raw, vec int) uint64 { return r.vecs[vec].(*pvsim.Vector).Fired() }

// Every event type can be raised on demand: it lands in the async ring
// and raises vector 1. QEMU raises none.
func TestRaiseEvents(t *testing.T) {
	r := newRaw(t, pvsim.Config{})
	for typ := firmware.EventCQErr; typ <= firmware.EventGIDChange; typ++ {
		require.NoError(t, r.m.Raise(typ, uint32(typ)+100))
	}
	evs := r.events()
	require.Len(t, evs, 19)
	for i, e := range evs {
		assert.Equal(t, firmware.AsyncEvent{Type: firmware.EventType(i), Info: uint32(i) + 100}, e)
	}
	assert.Equal(t, uint64(19), fired(r, firmware.VectorAsync))
	assert.Len(t, r.m.Events(), 19)

	q := newRaw(t, pvsim.Config{QEMU: true})
	assert.ErrorIs(t, q.m.Raise(firmware.EventPortErr, 1), pvsim.ErrNotSupported)
	assert.ErrorIs(t, q.m.Fatal(), pvsim.ErrNotSupported)
}

// A full async ring drops events (counted), and the driver's consumer
// index frees it again.
func TestAsyncRingFull(t *testing.T) {
	r := newRaw(t, pvsim.Config{})
	slots := r.async.Slots()
	for range slots + 3 {
		require.NoError(t, r.m.Raise(firmware.EventSMChange, 1))
	}
	assert.Equal(t, uint64(3), r.m.Stats().EventsDropped)
	assert.Len(t, r.events(), slots)
	require.NoError(t, r.m.Raise(firmware.EventSMChange, 1))
	assert.Len(t, r.events(), 1)
}

// Port down and up: QUERY_PORT follows, no packet passes while it is
// down, and a VMware device raises PORT_ERR and PORT_ACTIVE.
func TestPortEvents(t *testing.T) {
	for _, tc := range devices[:2] {
		t.Run(tc.name, func(t *testing.T) {
			ra := defaultRC()
			ra.timeout, ra.retry = 10, 1
			p := newRCPair(t, tc.cfg, ra, defaultRC())
			require.NoError(t, p.r.m.SetPort(false))
			port, err := p.r.ch.QueryPort(p.r.ctx(), 1)
			require.NoError(t, err)
			assert.Equal(t, uint32(firmware.PortDown), port.State)
			if !tc.cfg.QEMU {
				assert.Equal(t, firmware.AsyncEvent{Type: firmware.EventPortErr, Info: 1}, p.r.waitEvent(firmware.EventPortErr))
				p.b.recv(1, p.bmr.sge(0, 64))
				p.a.send(sendWR(1, rings.WRSend, sig, p.amr.sge(0, 8)))
				assert.Equal(t, uint32(rings.WCRetryExcErr), p.acq.wait(1)[0].Status, "nothing leaves a port that is down")
			}
			require.NoError(t, p.r.m.SetPort(true))
			port, err = p.r.ch.QueryPort(p.r.ctx(), 1)
			require.NoError(t, err)
			assert.Equal(t, uint32(firmware.PortActive), port.State)
			if !tc.cfg.QEMU {
				assert.Equal(t, uint32(1), p.r.waitEvent(firmware.EventPortActive).Info)
			} else {
				assert.Empty(t, p.r.events())
			}
		})
	}
}

// A CQ that overflows: a VMware device raises CQ_ERR and takes no more
// CQEs on it; QEMU drops the CQEs that do not fit, silently.
func TestCQOverflow(t *testing.T) {
	for _, tc := range devices[:2] {
		t.Run(tc.name, func(t *testing.T) {
			r := newRaw(t, tc.cfg)
			pd := r.pd()
			cq := r.cq(4)
			big := r.cq(64)
			a := r.qp(pd, firmware.QPTypeRC, cq, big, 16, qpOpts{})
			b := r.qp(pd, firmware.QPTypeRC, big, big, 16, qpOpts{})
			a.connect(b.qpn, r.gid, defaultRC())
			b.connect(a.qpn, r.gid, defaultRC())
			mr := r.mr(pd, 4096, allAccess)
			for i := range 6 {
				b.recv(uint64(i), mr.sge(0, 64))
			}
			for i := range 6 {
				a.send(sendWR(uint64(i), rings.WRSend, sig, mr.sge(0, 8)))
			}
			big.wait(6)
			// The receives complete before the sends' ACKs come back: the
			// six send completions are all handled once the last two are
			// dropped (a hang guard, not a timing).
			require.Eventually(t, func() bool { return r.m.Stats().CQEsDropped >= 2 }, 30*time.Second, 100*time.Microsecond,
				"the two send completions that do not fit are dropped")
			got := cq.poll()
			assert.Len(t, got, 4)
			assert.Equal(t, uint64(2), r.m.Stats().CQEsDropped)
			if tc.cfg.QEMU {
				assert.Empty(t, r.events())
				return
			}
			ev := r.waitEvent(firmware.EventCQErr)
			assert.Equal(t, cq.handle, ev.Info)
			a.send(sendWR(9, rings.WRSend, sig, mr.sge(0, 8)))
			assert.Empty(t, cq.quiet(5*time.Millisecond), "a CQ in error takes nothing more")
		})
	}
	// On demand.
	r := newRaw(t, pvsim.Config{Version: 18})
	cq := r.cq(16)
	require.NoError(t, r.m.OverflowCQ(cq.handle))
	assert.Equal(t, cq.handle, r.waitEvent(firmware.EventCQErr).Info)
	assert.Error(t, r.m.OverflowCQ(999))
}

// The SRQ limit: armed by MODIFY_SRQ, one SRQ_LIMIT_REACHED when the
// receives left fall below it, then disarmed until armed again. QEMU
// raises nothing.
func TestSRQLimit(t *testing.T) {
	for _, tc := range devices[:2] {
		t.Run(tc.name, func(t *testing.T) {
			r := newRaw(t, tc.cfg)
			pd := r.pd()
			cq := r.cq(64)
			s := r.srq(pd, 16)
			a := r.qp(pd, firmware.QPTypeRC, cq, cq, 16, qpOpts{})
			b := r.qp(pd, firmware.QPTypeRC, cq, cq, 16, qpOpts{hasSRQ: true, srq: s.handle})
			a.connect(b.qpn, r.gid, defaultRC())
			b.connect(a.qpn, r.gid, defaultRC())
			mr := r.mr(pd, 4096, allAccess)
			for i := range 6 {
				s.recv(uint64(i), mr.sge(i*64, 64))
			}
			require.NoError(t, r.ch.ModifySRQ(r.ctx(), firmware.ModifySRQRequest{SRQHandle: s.handle, AttrMask: firmware.SRQAttrLimit, Attr: firmware.SRQAttr{SRQLimit: 4}}))
			a.send(sendWR(1, rings.WRSend, sig, mr.sge(0, 8)), sendWR(2, rings.WRSend, sig, mr.sge(0, 8)))
			cq.wait(4)
			if tc.cfg.QEMU {
				assert.Empty(t, r.events())
				return
			}
			assert.Empty(t, r.events(), "4 left: not below the limit")
			a.send(sendWR(3, rings.WRSend, sig, mr.sge(0, 8)))
			cq.wait(2)
			assert.Equal(t, firmware.AsyncEvent{Type: firmware.EventSRQLimitReached, Info: s.handle}, r.waitEvent(firmware.EventSRQLimitReached))
			attr, err := r.ch.QuerySRQ(r.ctx(), s.handle)
			require.NoError(t, err)
			assert.Zero(t, attr.SRQLimit, "disarmed")
			a.send(sendWR(4, rings.WRSend, sig, mr.sge(0, 8)))
			cq.wait(2)
			assert.Empty(t, r.events(), "one event per arming")
			require.NoError(t, r.ch.ModifySRQ(r.ctx(), firmware.ModifySRQRequest{SRQHandle: s.handle, AttrMask: firmware.SRQAttrLimit, Attr: firmware.SRQAttr{SRQLimit: 3}}))
			a.send(sendWR(5, rings.WRSend, sig, mr.sge(0, 8)))
			cq.wait(2)
			r.waitEvent(firmware.EventSRQLimitReached)
		})
	}
}

// A QP of an SRQ that goes to ERR raises QP_LAST_WQE_REACHED; ErrorQP
// fails a QP on demand with QP_FATAL.
func TestQPEvents(t *testing.T) {
	r := newRaw(t, pvsim.Config{})
	pd := r.pd()
	cq := r.cq(16)
	s := r.srq(pd, 16)
	q := r.qp(pd, firmware.QPTypeRC, cq, cq, 16, qpOpts{hasSRQ: true, srq: s.handle})
	q.connect(1234, r.gid, defaultRC())
	require.NoError(t, r.m.ErrorQP(q.handle))
	assert.Equal(t, q.handle, r.waitEvent(firmware.EventQPFatal).Info)
	assert.Equal(t, q.handle, r.waitEvent(firmware.EventQPLastWQEReached).Info)
	info, _ := r.m.QP(q.handle)
	assert.Equal(t, firmware.QPStateErr, info.State)
	assert.Error(t, r.m.ErrorQP(4321))
	var resp firmware.DestroyQPResponse
	require.NoError(t, r.ch.Exec(r.ctx(), firmware.DestroyQPRequest{QPHandle: q.handle}, &resp))
	assert.Equal(t, uint32(2), resp.EventsReported)
}

// Command faults: a command that never answers times out in the driver's
// channel and the next command works; one answered with an error returns
// the errno; one refused returns ERR's status.
func TestCommandFaults(t *testing.T) {
	for _, tc := range devices[:2] {
		t.Run(tc.name, func(t *testing.T) {
			r := newRaw(t, tc.cfg)
			require.NoError(t, r.m.InjectFault(pvsim.CommandFault{Cmd: firmware.CmdCreatePD, Hang: true}))
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			_, err := r.ch.CreatePD(ctx, 0)
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			_, err = r.ch.CreatePD(r.ctx(), 0)
			assert.NoError(t, err, "the next command is answered")

			require.NoError(t, r.m.InjectFault(pvsim.CommandFault{Cmd: firmware.CmdCreateCQ, Errno: syscall.ENOMEM}))
			_, err = r.ch.CreateCQ(r.ctx(), firmware.CreateCQRequest{PDirDMA: 0x1000, CQE: 16, NChunks: 2})
			assert.ErrorIs(t, err, syscall.ENOMEM)

			require.NoError(t, r.m.InjectFault(pvsim.CommandFault{Cmd: pvsim.AnyCommand, Status: 0x1234, Count: 2}))
			for range 2 {
				_, err = r.ch.QueryPort(r.ctx(), 1)
				var oe *firmware.OpError
				require.ErrorAs(t, err, &oe)
				assert.Equal(t, firmware.Status(0x1234), oe.Status)
			}
			_, err = r.ch.QueryPort(r.ctx(), 1)
			assert.NoError(t, err)

			require.NoError(t, r.m.InjectFault(pvsim.CommandFault{Cmd: pvsim.AnyCommand, Errno: syscall.EIO, Count: -1}))
			_, err = r.ch.QueryPort(r.ctx(), 1)
			assert.ErrorIs(t, err, syscall.EIO)
			r.m.ClearFaults()
			_, err = r.ch.QueryPort(r.ctx(), 1)
			assert.NoError(t, err)
			assert.Error(t, r.m.InjectFault(pvsim.CommandFault{Hang: true, Errno: 1}))
		})
	}
}

// The driver over a device that stops answering: its command times out.
func TestDriverCommandHangs(t *testing.T) {
	m, err := pvsim.New(pvsim.Config{})
	require.NoError(t, err)
	d, err := vfrdma.OpenFunction(m, &vfrdma.Options{CommandTimeout: 50 * time.Millisecond})
	require.NoError(t, err)
	defer d.Close()
	require.NoError(t, m.InjectFault(pvsim.CommandFault{Cmd: firmware.CmdCreatePD, Hang: true}))
	_, err = d.AllocPD(context.Background())
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, m.InjectFault(pvsim.CommandFault{Cmd: firmware.CmdCreateCQ, Errno: syscall.EINVAL}))
	_, err = d.CreateCQ(context.Background(), 16)
	assert.ErrorIs(t, err, syscall.EINVAL)
}

// Device fatal: the event, then every command fails (EIO), and doorbells
// do nothing; a reset brings the device back, empty.
func TestDeviceFatal(t *testing.T) {
	p := newRCPair(t, pvsim.Config{}, defaultRC(), defaultRC())
	require.NoError(t, p.r.m.Fatal())
	p.r.waitEvent(firmware.EventDeviceFatal)
	_, err := p.r.ch.CreatePD(p.r.ctx(), 0)
	assert.ErrorIs(t, err, syscall.EIO)
	p.b.recv(1, p.bmr.sge(0, 64))
	p.a.send(sendWR(1, rings.WRSend, sig, p.amr.sge(0, 8)))
	assert.Empty(t, p.acq.quiet(5*time.Millisecond))
	assert.True(t, p.r.m.State().Fatal)
	require.NoError(t, p.r.ch.Reset(p.r.ctx()))
	assert.False(t, p.r.m.State().Fatal)
	assert.Equal(t, pvsim.Objects{}, p.r.m.Objects())
}

// IMR: on QEMU any non-zero value masks every vector; on a VMware device
// bit n masks vector n. Masked interrupts are dropped.
func TestInterruptMask(t *testing.T) {
	for _, tc := range devices[:2] {
		t.Run(tc.name, func(t *testing.T) {
			r := newRaw(t, tc.cfg)
			before := fired(r, 0)
			require.NoError(t, r.ch.SetInterruptMask(r.ctx(), 1<<firmware.VectorCQ))
			_, err := r.ch.QueryPort(r.ctx(), 1)
			require.NoError(t, err)
			if tc.cfg.QEMU {
				assert.Equal(t, before, fired(r, 0), "QEMU: masked")
			} else {
				assert.Equal(t, before+1, fired(r, 0), "only the CQ vector is masked")
			}
			assert.NotZero(t, r.m.Stats().Masked+fired(r, 0)-before)
			require.NoError(t, r.ch.SetInterruptMask(r.ctx(), 0))
			_, err = r.ch.QueryPort(r.ctx(), 1)
			require.NoError(t, err)
			assert.Greater(t, fired(r, 0), before)
		})
	}
}

// CQ arming: QEMU arms only with ARM|ARM_SOL (ARM alone disarms) and
// notifies every CQE in the ring; a VMware device arms with ARM for the
// next completion and ARM_SOL for the next solicited one.
func TestCQArm(t *testing.T) {
	for _, tc := range devices[:2] {
		t.Run(tc.name, func(t *testing.T) {
			p := newRCPair(t, tc.cfg, defaultRC(), defaultRC())
			arm := func(bits uint32) {
				require.NoError(t, p.r.uar.Store32(doorbell.OffsetCQ, bits|p.bcq.handle))
			}
			exchange := func(flags uint32) {
				p.b.recv(1, p.bmr.sge(0, 64))
				p.a.send(sendWR(1, rings.WRSend, sig|flags, p.amr.sge(0, 8)))
				p.acq.wait(1)
				p.bcq.wait(1)
				time.Sleep(time.Millisecond)
			}
			notes := func() []uint32 {
				h := make([]uint32, 64)
				n, err := p.r.cqn.Poll(h)
				require.NoError(t, err)
				var out []uint32
				for _, x := range h[:n] {
					if x == p.bcq.handle {
						out = append(out, x)
					}
				}
				return out
			}
			notes()
			v := fired(p.r, firmware.VectorCQ)
			firedTo := func(want uint64, msg string) {
				t.Helper()
				assert.Eventually(t, func() bool { return fired(p.r, firmware.VectorCQ) == want }, 5*time.Second, 100*time.Microsecond, msg)
			}
			arm(doorbell.CQArm)
			exchange(0)
			if tc.cfg.QEMU {
				assert.Equal(t, v, fired(p.r, firmware.VectorCQ), "QEMU: ARM alone disarms")
				assert.Len(t, notes(), 1, "QEMU notifies every CQE")
				arm(doorbell.CQArm | doorbell.CQArmSol)
				exchange(0)
				firedTo(v+1, "armed")
				exchange(0)
				assert.Equal(t, v+1, fired(p.r, firmware.VectorCQ), "spent")
				return
			}
			firedTo(v+1, "armed")
			assert.Len(t, notes(), 1)
			exchange(0)
			assert.Equal(t, v+1, fired(p.r, firmware.VectorCQ), "spent")
			assert.Empty(t, notes(), "no entry for an unarmed CQ")
			arm(doorbell.CQArmSol)
			exchange(0)
			assert.Equal(t, v+1, fired(p.r, firmware.VectorCQ), "not solicited")
			exchange(rings.SendSolicited)
			firedTo(v+2, "solicited")
		})
	}
}

// An arm that finds CQEs not yet polled fires at once.
func TestCQArmWithPending(t *testing.T) {
	p := newRCPair(t, pvsim.Config{}, defaultRC(), defaultRC())
	p.b.recv(1, p.bmr.sge(0, 64))
	p.a.send(sendWR(1, rings.WRSend, sig, p.amr.sge(0, 8)))
	require.Eventually(t, func() bool { return p.bcq.state.ProdTail() != p.bcq.state.ConsHead() }, time.Second, 100*time.Microsecond)
	v := fired(p.r, firmware.VectorCQ)
	require.NoError(t, p.r.uar.Store32(doorbell.OffsetCQ, doorbell.CQArm|p.bcq.handle))
	require.Eventually(t, func() bool { return fired(p.r, firmware.VectorCQ) == v+1 }, time.Second, 100*time.Microsecond)
}

// What QEMU 7.2 would crash or hang on is recorded, refused or contained.
func TestQEMUHazards(t *testing.T) {
	m, err := pvsim.New(pvsim.Config{QEMU: true})
	require.NoError(t, err)
	defer m.Close()
	regs, err := m.Registers()
	require.NoError(t, err)
	require.NoError(t, regs.Store32(firmware.RegRequest, 0))
	errReg, err := regs.Load32(firmware.RegErr)
	require.NoError(t, err)
	assert.Equal(t, uint32(0xFFFF), errReg)
	require.Len(t, m.Hazards(), 1)
	assert.Contains(t, m.Hazards()[0], "CVE-2022-1050")

	r := attachRaw(t, m, m.Function())
	pd := r.pd()
	cq := r.cq(16)
	q := r.qp(pd, firmware.QPTypeRC, cq, cq, 16, qpOpts{})
	mr := r.mr(pd, 4096, allAccess)
	// Below RTS the backend refuses the post: GENERAL_ERR, vendor 0x201.
	q.send(sendWR(1, rings.WRSend, 0, mr.sge(0, 8)))
	c := cq.wait(1)[0]
	assert.Equal(t, uint32(rings.WCGeneralErr), c.Status)
	assert.Equal(t, uint32(rings.VendorErrPostFailed), c.VendorErr)
	q.connect(q.qpn, r.gid, defaultRC())
	// A GID index that is not bound: QEMU spins on the WQE.
	q.gidIndex = 9
	q.send(sendWR(2, rings.WRSend, 0, mr.sge(0, 8)))
	c = cq.wait(1)[0]
	assert.Equal(t, uint32(rings.VendorErrGIDIndex), c.VendorErr)
	info, _ := m.QP(q.handle)
	assert.True(t, info.Stuck)
	assert.Len(t, m.Hazards(), 2)
	// More SGEs than QEMU's max_sge on another QP.
	q2 := r.qp(pd, firmware.QPTypeRC, cq, cq, 16, qpOpts{})
	q2.connect(q2.qpn, r.gid, defaultRC())
	q2.recv(8, mr.sge(100, 64))
	sg := mr.sge(0, 1)
	q2.send(sendWR(3, rings.WRSend, 0, sg, sg, sg, sg))
	slot := q2.sqData[q2.sq.Next(0)*q2.sqStride:]
	rings.PutSendWQE(slot, &rings.SendWQE{WRID: 4, SGEs: []rings.SGE{sg, sg, sg, sg}})
	slot[8] = 5 // num_sge 5
	q2.sq.Advance(1)
	q2.sq.Publish()
	require.NoError(t, r.uar.Store32(doorbell.OffsetQP, doorbell.QPSend|q2.handle))
	// QEMU completes the bad WQE at once, whether or not the backend has
	// completed the one before it.
	cs := cq.wait(3)
	var bad *rings.CQE
	for i := range cs {
		if cs[i].WRID == 4 {
			bad = &cs[i]
		}
	}
	require.NotNil(t, bad, "%+v", cs)
	assert.Equal(t, uint32(rings.VendorErrBadNumSGE), bad.VendorErr)
	assert.Len(t, m.Hazards(), 3)
}
