package pvsim_test

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/pvsim"
	"github.com/vfrdma/vfrdma/rings"
)

// allLocal is every access right.
const allAccess = firmware.AccessLocalWrite | firmware.AccessRemoteWrite | firmware.AccessRemoteRead | firmware.AccessRemoteAtomic

// rcPair is two connected RC QPs on one raw device, each with its CQ.
type rcPair struct {
	r        *raw
	pd       uint32
	a, b     *rawQP
	acq, bcq *rawCQ
	amr, bmr *rawMR
}

func newRCPair(t testing.TB, cfg pvsim.Config, aa, ba rcAttr) *rcPair {
	r := newRaw(t, cfg)
	p := &rcPair{r: r, pd: r.pd()}
	p.acq, p.bcq = r.cq(64), r.cq(64)
	p.a = r.qp(p.pd, firmware.QPTypeRC, p.acq, p.acq, 16, qpOpts{})
	p.b = r.qp(p.pd, firmware.QPTypeRC, p.bcq, p.bcq, 16, qpOpts{})
	p.a.connect(p.b.qpn, r.gid, aa)
	p.b.connect(p.a.qpn, r.gid, ba)
	p.amr = r.mr(p.pd, 1<<16, allAccess)
	p.bmr = r.mr(p.pd, 1<<16, allAccess)
	return p
}

func sendWR(id uint64, op uint32, flags uint32, sges ...rings.SGE) wr {
	return wr{SendWQE: rings.SendWQE{WRID: id, Opcode: op, Flags: flags, SGEs: sges}}
}

// Handles and numbers per version: small handles from 1; at version 20
// QP numbers apart from handles; CQEs name the QP by handle at version
// 20 and by number (the same value) before; src_qp is always a number.
func TestQPHandlesAndNumbers(t *testing.T) {
	for _, tc := range devices {
		t.Run(tc.name, func(t *testing.T) {
			p := newRCPair(t, tc.cfg, defaultRC(), defaultRC())
			v20 := !tc.cfg.QEMU && (tc.cfg.Version == 0 || tc.cfg.Version == 20)
			switch {
			case tc.cfg.QEMU:
				assert.Equal(t, uint32(0x11), p.a.qpn, "QEMU: the backend's QP numbers")
				assert.Equal(t, p.a.qpn, p.a.handle)
				assert.Zero(t, p.pd, "QEMU handles start at 0")
			case v20:
				assert.Equal(t, uint32(1), p.a.handle)
				assert.Equal(t, uint32(2), p.b.handle)
				assert.GreaterOrEqual(t, p.a.qpn, uint32(0x10000))
				assert.NotEqual(t, p.a.qpn, p.b.qpn)
				assert.NotEqual(t, p.amr.handle, p.amr.lkey, "v20 keys are not the handle")
			default:
				assert.Equal(t, uint32(1), p.a.handle)
				assert.Equal(t, p.a.handle, p.a.qpn)
				assert.Equal(t, uint32(1), p.pd)
			}
			if !tc.cfg.QEMU {
				assert.NotEqual(t, p.amr.lkey, p.amr.rkey)
			} else {
				assert.Equal(t, uint32(0xFFFFFFFF), p.amr.rkey)
			}
			info, ok := p.r.m.QP(p.a.handle)
			require.True(t, ok)
			assert.Equal(t, p.a.qpn, info.QPN)
			assert.Equal(t, firmware.QPStateRTS, info.State)
			_, ok = p.r.m.QPByNumber(p.b.qpn)
			assert.True(t, ok)

			copy(p.amr.buf.Mem, "handle")
			p.b.recv(77, p.bmr.sge(0, 64))
			p.a.send(sendWR(5, rings.WRSend, rings.SendSignaled, p.amr.sge(0, 6)))
			s := p.acq.wait(1)[0]
			rc := p.bcq.wait(1)[0]
			want := func(q *rawQP) uint64 {
				if v20 {
					return uint64(q.handle)
				}
				return uint64(q.qpn)
			}
			assert.Equal(t, want(p.a), s.QP, "send CQE qp")
			assert.Equal(t, want(p.b), rc.QP, "receive CQE qp")
			assert.Equal(t, p.a.qpn, rc.SrcQP)
			assert.Equal(t, uint64(77), rc.WRID)
			assert.Equal(t, uint32(6), rc.ByteLen)
			assert.Equal(t, "handle", string(p.bmr.buf.Mem[:6]))
			if tc.cfg.QEMU {
				assert.Empty(t, p.r.m.Hazards())
			}
		})
	}
}

// QEMU 7.2 runs every send WQE as a signaled SEND: an RDMA WRITE with
// immediate data, unsignaled, goes out as a SEND of its SGEs that takes a
// receive, completes anyway, with opcode SEND and no immediate data.
func TestQEMUSendOnly(t *testing.T) {
	p := newRCPair(t, pvsim.Config{QEMU: true}, defaultRC(), defaultRC())
	copy(p.amr.buf.Mem, "write")
	p.b.recv(9, p.bmr.sge(0, 64))
	w := sendWR(1, rings.WRRDMAWriteWithImm, 0, p.amr.sge(0, 5))
	w.Imm, w.raddr, w.rkey = 0xabcd, p.bmr.addr(4096), p.bmr.rkey
	p.a.send(w)
	s := p.acq.wait(1)[0]
	assert.Equal(t, uint32(rings.WCSend), s.Opcode)
	assert.Equal(t, uint32(rings.WCSuccess), s.Status)
	rc := p.bcq.wait(1)[0]
	assert.Equal(t, uint32(rings.WCRecv), rc.Opcode)
	assert.Zero(t, rc.Imm)
	assert.Zero(t, rc.WCFlags)
	assert.Equal(t, "write", string(p.bmr.buf.Mem[:5]), "landed in the receive buffer")
	assert.Zero(t, p.bmr.buf.Mem[4096], "not at the remote address")
}

// The SRQ commands: QEMU swaps MODIFY_SRQ and QUERY_SRQ, a VMware device
// does not; the driver's probe tells them apart, and query and modify
// work on both.
func TestSRQCommands(t *testing.T) {
	for _, tc := range devices {
		t.Run(tc.name, func(t *testing.T) {
			r := newRaw(t, tc.cfg)
			pd := r.pd()
			cq := r.cq(16)
			s := r.srq(pd, 16)
			r.qp(pd, firmware.QPTypeRC, cq, cq, 16, qpOpts{hasSRQ: true, srq: s.handle})
			swap, err := r.ch.ProbeSRQSwap(r.ctx(), s.handle)
			require.NoError(t, err)
			if tc.cfg.QEMU {
				assert.Equal(t, firmware.SRQSwapYes, swap)
			} else {
				assert.Equal(t, firmware.SRQSwapNo, swap)
			}
			require.NoError(t, r.ch.ModifySRQ(r.ctx(), firmware.ModifySRQRequest{SRQHandle: s.handle, AttrMask: firmware.SRQAttrLimit, Attr: firmware.SRQAttr{SRQLimit: 5}}))
			attr, err := r.ch.QuerySRQ(r.ctx(), s.handle)
			require.NoError(t, err)
			assert.Equal(t, firmware.SRQAttr{MaxWR: 16, MaxSGE: 1, SRQLimit: 5}, attr)
			info, ok := r.m.SRQ(s.handle)
			require.True(t, ok)
			assert.Equal(t, uint32(5), info.Limit)
			assert.Equal(t, 1, info.QPs)
		})
	}
}

// Sent raw, code 18 with a query layout: QEMU answers it as a query
// (0x80000013) and modifies nothing; a VMware device modifies (mask 0:
// nothing) and acknowledges 0x80000012. Code 19 with a query layout
// fails on QEMU (its modify handler wants the LIMIT bit).
func TestSRQSwapRaw(t *testing.T) {
	for _, qemu := range []bool{true, false} {
		r := newRaw(t, pvsim.Config{QEMU: qemu})
		pd := r.pd()
		s := r.srq(pd, 16)
		err := r.ch.Exec(r.ctx(), firmware.QuerySRQRequest{SRQHandle: s.handle}, &firmware.QuerySRQResponse{})
		if qemu {
			assert.Error(t, err, "code 19 runs QEMU's modify handler")
		} else {
			assert.NoError(t, err)
		}
	}
}

// A VMware device validates MODIFY_QP transitions and their attribute
// masks as the verbs do; QEMU records any state and forwards only INIT,
// RTR and RTS to its backend.
func TestModifyQPStateMachine(t *testing.T) {
	r := newRaw(t, pvsim.Config{})
	pd := r.pd()
	cq := r.cq(16)
	q := r.qp(pd, firmware.QPTypeRC, cq, cq, 16, qpOpts{})
	a := firmware.QPAttr{PortNum: 1, QPAccessFlags: firmware.AccessLocalWrite}
	assert.Error(t, q.modify(firmware.QPStateRTR, 0, a), "RESET to RTR")
	assert.Error(t, q.modify(firmware.QPStateInit, firmware.QPAttrPort, a), "INIT without P_Key index and access")
	assert.Error(t, q.modify(firmware.QPStateInit, firmware.QPAttrPKeyIndex|firmware.QPAttrPort|firmware.QPAttrAccessFlags|firmware.QPAttrSQPSN, a), "INIT with an attribute it does not take")
	require.NoError(t, q.modify(firmware.QPStateInit, firmware.QPAttrPKeyIndex|firmware.QPAttrPort|firmware.QPAttrAccessFlags, a))
	a.PortNum = 2
	assert.Error(t, q.modify(firmware.QPStateInit, firmware.QPAttrPort, a), "port 2")
	st, err := r.ch.QueryQP(r.ctx(), q.handle, firmware.QPAttrState)
	require.NoError(t, err)
	assert.Equal(t, firmware.QPStateInit, st.QPState)
	require.NoError(t, q.modify(firmware.QPStateErr, 0, a))
	assert.Error(t, q.modify(firmware.QPStateRTS, 0, a), "ERR to RTS")
	require.NoError(t, q.modify(firmware.QPStateReset, 0, a))

	qm := newRaw(t, pvsim.Config{QEMU: true})
	pd = qm.pd()
	cq = qm.cq(16)
	q = qm.qp(pd, firmware.QPTypeRC, cq, cq, 16, qpOpts{})
	q.connect(q.qpn, qm.gid, defaultRC())
	require.NoError(t, q.modify(firmware.QPStateErr, 0, firmware.QPAttr{}))
	st, err = qm.ch.QueryQP(qm.ctx(), q.handle, firmware.QPAttrState)
	require.NoError(t, err)
	assert.Equal(t, firmware.QPStateRTS, st.QPState, "QEMU's backend QP stays in RTS")
	info, _ := qm.m.QP(q.handle)
	assert.Equal(t, firmware.QPStateErr, info.Recorded)
	require.NoError(t, q.modify(firmware.QPStateReset, 0, firmware.QPAttr{}))
	assert.Error(t, q.modify(firmware.QPStateInit, firmware.QPAttrPKeyIndex|firmware.QPAttrPort, firmware.QPAttr{PortNum: 1}),
		"QEMU: RESET does not reset the backend QP, so INIT fails (EIO)")
}

// Version 19 and later take 64-bit UAR page numbers (DSR and CREATE_UC).
func TestUARPFN(t *testing.T) {
	for _, v := range []uint32{17, 19, 20} {
		r := newRaw(t, pvsim.Config{Version: v})
		want := uint64(0x2345)
		if v >= 19 {
			want = 0x1_2345_6789
		}
		assert.Equal(t, want, r.m.State().UARPFN, "v%d", v)
		_, err := r.ch.CreateUC(r.ctx(), want)
		require.NoError(t, err)
		assert.Equal(t, want, r.m.State().UCPFN, "v%d", v)
	}
}

// QUERY_QP on a VMware device returns the whole attribute block.
func TestQueryQP(t *testing.T) {
	p := newRCPair(t, pvsim.Config{Version: 18}, defaultRC(), defaultRC())
	var resp queryQPFull
	require.NoError(t, p.r.ch.Exec(p.r.ctx(), firmware.QueryQPRequest{QPHandle: p.a.handle, AttrMask: firmware.QPAttrAll}, &resp))
	assert.Equal(t, uint32(firmware.QPStateRTS), binary.LittleEndian.Uint32(resp.b[16:]))
	assert.Equal(t, p.b.qpn, binary.LittleEndian.Uint32(resp.b[16+28:]), "dest_qp_num")
	assert.Equal(t, uint8(7), resp.b[16+48], "rnr_retry")
	assert.Equal(t, uint32(16), binary.LittleEndian.Uint32(resp.b[16+56:]), "cap.max_send_wr")
	assert.Equal(t, p.r.gid[:], resp.b[16+80:16+96], "ah_attr dgid")
}

type queryQPFull struct{ b [176]byte }

func (q *queryQPFull) Decode(b []byte) error { copy(q.b[:], b); return nil }

// Every command a driver sends answers at every version; destroy order is
// enforced on a VMware device (EBUSY), not on QEMU.
func TestDestroyOrder(t *testing.T) {
	for _, qemu := range []bool{false, true} {
		r := newRaw(t, pvsim.Config{QEMU: qemu})
		pd := r.pd()
		cq := r.cq(16)
		q := r.qp(pd, firmware.QPTypeUD, cq, cq, 16, qpOpts{})
		err := r.ch.Exec(r.ctx(), firmware.DestroyCQRequest{CQHandle: cq.handle}, firmware.HeaderOnly{})
		if qemu {
			assert.NoError(t, err)
			assert.NotEmpty(t, r.m.Hazards(), "QEMU leaves the QP dangling")
		} else {
			assert.Error(t, err, "EBUSY")
			require.NoError(t, r.ch.DestroyQP(r.ctx(), q.handle))
			require.NoError(t, r.ch.Exec(r.ctx(), firmware.DestroyCQRequest{CQHandle: cq.handle}, firmware.HeaderOnly{}))
			require.NoError(t, r.ch.Exec(r.ctx(), firmware.DestroyPDRequest{PDHandle: pd}, firmware.HeaderOnly{}))
			assert.Equal(t, pvsim.Objects{GIDs: 1}, r.m.Objects())
		}
	}
}

// Unknown commands: QEMU answers ERR 0xFFFF (and nothing else) for codes
// past 20 and for RESIZE_CQ; a VMware device refuses unknown codes and
// resizes an empty CQ.
func TestUnknownCommands(t *testing.T) {
	for _, qemu := range []bool{true, false} {
		r := newRaw(t, pvsim.Config{QEMU: qemu})
		cq := r.cq(16)
		_, err := r.ch.ResizeCQ(r.ctx(), cq.handle, 32)
		if qemu {
			assert.ErrorIs(t, err, firmware.ErrNotSupported)
		} else {
			assert.NoError(t, err)
		}
		err = r.ch.Exec(r.ctx(), badCmd{}, firmware.HeaderOnly{})
		assert.ErrorIs(t, err, firmware.ErrNotSupported)
	}
}

type badCmd struct{}

func (badCmd) Cmd() firmware.Cmd { return 33 }
func (badCmd) Encode(b []byte) error {
	clear(b[:firmware.CmdSlotSize])
	binary.LittleEndian.PutUint32(b[8:], 33)
	return nil
}

// Another handle on the device opens it again after its first holder
// went away without cleaning up: the objects are still there.
func TestReopen(t *testing.T) {
	m, err := pvsim.New(pvsim.Config{QEMU: true})
	require.NoError(t, err)
	defer m.Close()
	f1 := m.Function()
	r1 := attachRaw(t, m, f1)
	r1.pd()
	r1.ch.Close()
	require.NoError(t, f1.Close())
	_, err = f1.Registers()
	assert.ErrorIs(t, err, pvsim.ErrClosed)
	assert.Equal(t, 1, m.Objects().PDs, "QEMU keeps objects across holders")
	f2 := m.Function()
	defer f2.Close()
	r2 := attachRaw(t, m, f2)
	require.NoError(t, r2.ch.DestroyPD(r2.ctx(), 0))
	time.Sleep(time.Millisecond)
	assert.Zero(t, m.Objects().PDs)
}
