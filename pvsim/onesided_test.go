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

// vmware is the table of VMware devices (one-sided operations, unsignaled
// sends and events do not exist on QEMU 7.2).
var vmware = devices[1:]

const sig = rings.SendSignaled

func rdma(id uint64, op uint32, local rings.SGE, raddr uint64, rkey uint32) wr {
	w := sendWR(id, op, sig, local)
	w.raddr, w.rkey = raddr, rkey
	return w
}

func atomicWR(id uint64, op uint32, local rings.SGE, raddr uint64, rkey uint32, cmpAdd, swap uint64) wr {
	w := sendWR(id, op, sig, local)
	w.raddr, w.rkey, w.cmpAdd, w.swap, w.atomic = raddr, rkey, cmpAdd, swap, true
	return w
}

// RDMA WRITE, WRITE with immediate, READ and SEND with immediate, with
// their completion opcodes, lengths and immediate data.
func TestRDMAWriteRead(t *testing.T) {
	for _, tc := range vmware {
		t.Run(tc.name, func(t *testing.T) {
			p := newRCPair(t, tc.cfg, defaultRC(), defaultRC())
			copy(p.amr.buf.Mem, "one-sided write")
			p.a.send(rdma(1, rings.WRRDMAWrite, p.amr.sge(0, 15), p.bmr.addr(1000), p.bmr.rkey))
			c := p.acq.wait(1)[0]
			require.Equal(t, uint32(rings.WCSuccess), c.Status, "%+v", c)
			assert.Equal(t, uint32(rings.WCRDMAWrite), c.Opcode)
			assert.Equal(t, uint32(15), c.ByteLen)
			assert.Equal(t, "one-sided write", string(p.bmr.buf.Mem[1000:1015]))
			assert.Empty(t, p.bcq.quiet(5*time.Millisecond), "a WRITE completes nothing at the responder")

			p.b.recv(50, p.bmr.sge(8192, 16))
			w := rdma(2, rings.WRRDMAWriteWithImm, p.amr.sge(0, 3), p.bmr.addr(2000), p.bmr.rkey)
			w.Imm = 0xdeadbeef
			p.a.send(w)
			assert.Equal(t, uint32(rings.WCRDMAWrite), p.acq.wait(1)[0].Opcode)
			rc := p.bcq.wait(1)[0]
			assert.Equal(t, uint32(rings.WCRecvRDMAWithImm), rc.Opcode)
			assert.Equal(t, uint32(0xdeadbeef), rc.Imm)
			assert.NotZero(t, rc.WCFlags&rings.WCFlagWithImm)
			assert.Equal(t, uint32(3), rc.ByteLen)
			assert.Equal(t, uint64(50), rc.WRID)
			assert.Equal(t, "one", string(p.bmr.buf.Mem[2000:2003]))

			copy(p.bmr.buf.Mem[30000:], "read me back")
			p.a.send(rdma(3, rings.WRRDMARead, p.amr.sge(5000, 12), p.bmr.addr(30000), p.bmr.rkey))
			c = p.acq.wait(1)[0]
			assert.Equal(t, uint32(rings.WCRDMARead), c.Opcode)
			assert.Equal(t, uint32(12), c.ByteLen)
			assert.Equal(t, "read me back", string(p.amr.buf.Mem[5000:5012]))

			p.b.recv(51, p.bmr.sge(8192, 16))
			w = sendWR(4, rings.WRSendWithImm, sig, p.amr.sge(0, 3))
			w.Imm = 7
			p.a.send(w)
			assert.Equal(t, uint32(rings.WCSend), p.acq.wait(1)[0].Opcode)
			rc = p.bcq.wait(1)[0]
			assert.Equal(t, uint32(rings.WCRecv), rc.Opcode)
			assert.Equal(t, uint32(7), rc.Imm)
			assert.NotZero(t, rc.WCFlags&rings.WCFlagWithImm)
		})
	}
}

// Compare-and-swap and fetch-and-add return the original value into the
// local buffer and change the remote one.
func TestAtomics(t *testing.T) {
	for _, tc := range vmware {
		t.Run(tc.name, func(t *testing.T) {
			p := newRCPair(t, tc.cfg, defaultRC(), defaultRC())
			le := binary.LittleEndian
			le.PutUint64(p.bmr.buf.Mem[64:], 10)
			p.a.send(atomicWR(1, rings.WRAtomicFetchAndAdd, p.amr.sge(0, 8), p.bmr.addr(64), p.bmr.rkey, 5, 0))
			c := p.acq.wait(1)[0]
			require.Equal(t, uint32(rings.WCSuccess), c.Status, "%+v", c)
			assert.Equal(t, uint32(rings.WCFetchAdd), c.Opcode)
			assert.Equal(t, uint64(10), le.Uint64(p.amr.buf.Mem[0:]))
			assert.Equal(t, uint64(15), le.Uint64(p.bmr.buf.Mem[64:]))

			p.a.send(atomicWR(2, rings.WRAtomicCmpAndSwp, p.amr.sge(8, 8), p.bmr.addr(64), p.bmr.rkey, 15, 99))
			c = p.acq.wait(1)[0]
			assert.Equal(t, uint32(rings.WCCompSwap), c.Opcode)
			assert.Equal(t, uint64(15), le.Uint64(p.amr.buf.Mem[8:]))
			assert.Equal(t, uint64(99), le.Uint64(p.bmr.buf.Mem[64:]))

			p.a.send(atomicWR(3, rings.WRAtomicCmpAndSwp, p.amr.sge(16, 8), p.bmr.addr(64), p.bmr.rkey, 15, 1))
			p.acq.wait(1)
			assert.Equal(t, uint64(99), le.Uint64(p.amr.buf.Mem[16:]), "no swap: the original")
			assert.Equal(t, uint64(99), le.Uint64(p.bmr.buf.Mem[64:]))
		})
	}
}

// Every remote violation completes the request with the status a device
// reports, fails both QPs, raises the responder's event, and flushes what
// follows.
func TestRemoteErrors(t *testing.T) {
	noRemote := defaultRC()
	noRemote.access = firmware.AccessLocalWrite
	for _, tc := range []struct {
		name   string
		b      rcAttr
		wr     func(p *rcPair) wr
		status uint32
		event  firmware.EventType
	}{
		{"bad rkey", defaultRC(), func(p *rcPair) wr {
			return rdma(1, rings.WRRDMAWrite, p.amr.sge(0, 8), p.bmr.addr(0), p.bmr.rkey^0x5a5a)
		}, rings.WCRemAccessErr, firmware.EventQPAccessErr},
		{"lkey as rkey", defaultRC(), func(p *rcPair) wr {
			return rdma(1, rings.WRRDMARead, p.amr.sge(0, 8), p.bmr.addr(0), p.bmr.lkey)
		}, rings.WCRemAccessErr, firmware.EventQPAccessErr},
		{"write past the MR", defaultRC(), func(p *rcPair) wr {
			return rdma(1, rings.WRRDMAWrite, p.amr.sge(0, 64), p.bmr.addr(1<<16-32), p.bmr.rkey)
		}, rings.WCRemAccessErr, firmware.EventQPAccessErr},
		{"read before the MR", defaultRC(), func(p *rcPair) wr {
			return rdma(1, rings.WRRDMARead, p.amr.sge(0, 64), p.bmr.addr(0)-8, p.bmr.rkey)
		}, rings.WCRemAccessErr, firmware.EventQPAccessErr},
		{"write into a read-only MR", defaultRC(), func(p *rcPair) wr {
			ro := p.r.mr(p.pd, 4096, firmware.AccessLocalWrite|firmware.AccessRemoteRead)
			return rdma(1, rings.WRRDMAWrite, p.amr.sge(0, 8), ro.addr(0), ro.rkey)
		}, rings.WCRemAccessErr, firmware.EventQPAccessErr},
		{"atomic on an MR without atomic access", defaultRC(), func(p *rcPair) wr {
			mr := p.r.mr(p.pd, 4096, firmware.AccessLocalWrite|firmware.AccessRemoteWrite)
			return atomicWR(1, rings.WRAtomicFetchAndAdd, p.amr.sge(0, 8), mr.addr(0), mr.rkey, 1, 0)
		}, rings.WCRemAccessErr, firmware.EventQPAccessErr},
		{"write to a QP without remote write", noRemote, func(p *rcPair) wr {
			return rdma(1, rings.WRRDMAWrite, p.amr.sge(0, 8), p.bmr.addr(0), p.bmr.rkey)
		}, rings.WCRemInvReqErr, firmware.EventQPReqErr},
		{"misaligned atomic", defaultRC(), func(p *rcPair) wr {
			return atomicWR(1, rings.WRAtomicCmpAndSwp, p.amr.sge(0, 8), p.bmr.addr(4), p.bmr.rkey, 0, 1)
		}, rings.WCRemInvReqErr, firmware.EventQPReqErr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newRCPair(t, pvsim.Config{}, defaultRC(), tc.b)
			w := tc.wr(p)
			p.b.recv(9, p.bmr.sge(0, 64))
			p.a.send(w, sendWR(2, rings.WRSend, sig, p.amr.sge(0, 8)))
			cs := p.acq.wait(2)
			assert.Equal(t, tc.status, cs[0].Status, "%v", rings.WCStatus(cs[0].Status))
			assert.Equal(t, uint32(rings.WCWRFlushErr), cs[1].Status)
			ev := p.r.waitEvent(tc.event)
			assert.Equal(t, p.b.handle, ev.Info, "the responder's QP handle")
			rc := p.bcq.wait(1)[0]
			assert.Equal(t, uint32(rings.WCWRFlushErr), rc.Status, "the responder's receive is flushed")
			for _, q := range []*rawQP{p.a, p.b} {
				info, _ := p.r.m.QP(q.handle)
				assert.Equal(t, firmware.QPStateErr, info.State)
			}
			// A send posted to a QP in ERR is flushed.
			p.a.send(sendWR(3, rings.WRSend, 0, p.amr.sge(0, 8)))
			assert.Equal(t, uint32(rings.WCWRFlushErr), p.acq.wait(1)[0].Status)
		})
	}
}

// Local errors complete the WQE with LOC_PROT_ERR, LOC_LEN_ERR or
// LOC_QP_OP_ERR, without a packet.
func TestLocalErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		wr     func(p *rcPair) wr
		status uint32
	}{
		{"unknown lkey", func(p *rcPair) wr {
			return sendWR(1, rings.WRSend, sig, rings.SGE{Addr: p.amr.addr(0), Length: 8, LKey: 0x777})
		}, rings.WCLocProtErr},
		{"SGE past the MR", func(p *rcPair) wr { return sendWR(1, rings.WRSend, sig, p.amr.sge(1<<16-4, 8)) }, rings.WCLocProtErr},
		{"READ into an MR without local write", func(p *rcPair) wr {
			ro := p.r.mr(p.pd, 4096, 0)
			return rdma(1, rings.WRRDMARead, ro.sge(0, 8), p.bmr.addr(0), p.bmr.rkey)
		}, rings.WCLocProtErr},
		{"atomic into 4 bytes", func(p *rcPair) wr {
			return atomicWR(1, rings.WRAtomicFetchAndAdd, p.amr.sge(0, 4), p.bmr.addr(0), p.bmr.rkey, 1, 0)
		}, rings.WCLocLenErr},
		{"LOCAL_INV", func(p *rcPair) wr { return sendWR(1, rings.WRLocalInv, sig) }, rings.WCLocQPOpErr},
		{"fast-register", func(p *rcPair) wr { return sendWR(1, rings.WRFastRegMR, sig) }, rings.WCLocQPOpErr},
		{"another PD's MR", func(p *rcPair) wr {
			other := p.r.mr(p.r.pd(), 4096, allAccess)
			return sendWR(1, rings.WRSend, sig, other.sge(0, 8))
		}, rings.WCLocProtErr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newRCPair(t, pvsim.Config{Version: 19}, defaultRC(), defaultRC())
			p.a.send(tc.wr(p))
			c := p.acq.wait(1)[0]
			assert.Equal(t, tc.status, c.Status, "%v", rings.WCStatus(c.Status))
			info, _ := p.r.m.QP(p.a.handle)
			assert.Equal(t, firmware.QPStateErr, info.State)
			info, _ = p.r.m.QP(p.b.handle)
			assert.Equal(t, firmware.QPStateRTS, info.State, "the peer heard nothing")
		})
	}
}

// A receive too small for the message: LOC_LEN_ERR at the receiver,
// REM_INV_REQ_ERR at the sender.
func TestReceiveTooSmall(t *testing.T) {
	p := newRCPair(t, pvsim.Config{}, defaultRC(), defaultRC())
	p.b.recv(1, p.bmr.sge(0, 10))
	p.a.send(sendWR(2, rings.WRSend, sig, p.amr.sge(0, 100)))
	assert.Equal(t, uint32(rings.WCRemInvReqErr), p.acq.wait(1)[0].Status)
	assert.Equal(t, uint32(rings.WCLocLenErr), p.bcq.wait(1)[0].Status)
}

// With no receive posted and rnr_retry below 7 the sender gives up with
// RNR_RETRY_EXC_ERR; with a peer that never answers, RETRY_EXC_ERR.
func TestRetryExhausted(t *testing.T) {
	for _, tc := range devices {
		if tc.cfg.QEMU {
			continue // QEMU's backend QP retries for ever (rnr_retry 7)
		}
		t.Run(tc.name+"/rnr", func(t *testing.T) {
			a := defaultRC()
			a.rnrRetry = 2
			b := defaultRC()
			b.minRNR = 1 // 10 µs
			p := newRCPair(t, tc.cfg, a, b)
			p.a.send(sendWR(1, rings.WRSend, sig, p.amr.sge(0, 8)), sendWR(2, rings.WRSend, sig, p.amr.sge(0, 8)))
			cs := p.acq.wait(2)
			assert.Equal(t, uint32(rings.WCRNRRetryExcErr), cs[0].Status)
			assert.Equal(t, uint32(rings.WCWRFlushErr), cs[1].Status)
			assert.Equal(t, uint64(3), p.r.m.Stats().RNRNaks, "the first try and two retries")
		})
		t.Run(tc.name+"/timeout", func(t *testing.T) {
			r := newRaw(t, tc.cfg)
			pd := r.pd()
			cq := r.cq(16)
			q := r.qp(pd, firmware.QPTypeRC, cq, cq, 16, qpOpts{})
			ra := defaultRC()
			ra.timeout, ra.retry = 8, 2 // 1 ms, twice
			q.connect(0xabcdef, r.gid, ra)
			mr := r.mr(pd, 4096, allAccess)
			start := time.Now()
			q.send(sendWR(1, rings.WRSend, sig, mr.sge(0, 8)))
			assert.Equal(t, uint32(rings.WCRetryExcErr), cq.wait(1)[0].Status)
			assert.GreaterOrEqual(t, time.Since(start), 3*time.Millisecond)
			assert.Equal(t, uint64(2), r.m.Stats().Retransmits)
		})
	}
}

// Unsignaled sends: no CQE on a VMware device (sq_sig_all aside), yet the
// send queue's slots come back; an unsignaled send that fails completes
// all the same. QEMU completes every send.
func TestUnsignaled(t *testing.T) {
	for _, tc := range devices {
		for _, consumeOnCompletion := range []bool{false, true} {
			if tc.cfg.QEMU && consumeOnCompletion {
				continue
			}
			cfg := tc.cfg
			cfg.SQConsumeOnCompletion = consumeOnCompletion
			t.Run(tc.name, func(t *testing.T) {
				p := newRCPair(t, cfg, defaultRC(), defaultRC())
				for i := range 5 {
					p.b.recv(uint64(i), p.bmr.sge(i*64, 64))
				}
				p.a.send(sendWR(1, rings.WRSend, 0, p.amr.sge(0, 8)), sendWR(2, rings.WRSend, 0, p.amr.sge(0, 8)),
					sendWR(3, rings.WRSend, 0, p.amr.sge(0, 8)), sendWR(4, rings.WRSend, sig, p.amr.sge(0, 8)))
				p.bcq.wait(4)
				var got []uint64
				if tc.cfg.QEMU {
					for _, c := range p.acq.wait(4) {
						got = append(got, c.WRID)
					}
					assert.Equal(t, []uint64{1, 2, 3, 4}, got, "QEMU completes every send")
				} else {
					cs := p.acq.wait(1)
					assert.Equal(t, uint64(4), cs[0].WRID)
					assert.Empty(t, p.acq.quiet(5*time.Millisecond), "no CQE for unsignaled sends")
					assert.Equal(t, uint64(3), p.r.m.Stats().Unsignaled)
				}
				require.Eventually(t, func() bool { free, _ := p.a.sq.Free(); return free == p.a.depth },
					time.Second, 100*time.Microsecond, "cons_head took every slot back")

				if tc.cfg.QEMU {
					return
				}
				// An unsignaled failure completes.
				p.a.send(wr{SendWQE: rings.SendWQE{WRID: 9, Opcode: rings.WRSend, SGEs: []rings.SGE{{Addr: 1, Length: 8, LKey: 0x999}}}})
				assert.Equal(t, uint32(rings.WCLocProtErr), p.acq.wait(1)[0].Status)
			})
		}
	}
}

// A QP created with sq_sig_all completes every send.
func TestSQSigAll(t *testing.T) {
	r := newRaw(t, pvsim.Config{})
	pd := r.pd()
	cq := r.cq(16)
	a := r.qp(pd, firmware.QPTypeRC, cq, cq, 16, qpOpts{sigAll: true})
	b := r.qp(pd, firmware.QPTypeRC, cq, cq, 16, qpOpts{})
	a.connect(b.qpn, r.gid, defaultRC())
	b.connect(a.qpn, r.gid, defaultRC())
	mr := r.mr(pd, 4096, allAccess)
	info, _ := r.m.QP(a.handle)
	assert.True(t, info.SQSigAll)
	a.send(rdma(1, rings.WRRDMAWrite, mr.sge(0, 8), mr.addr(100), mr.rkey))
	a.send(wr{SendWQE: rings.SendWQE{WRID: 2, Opcode: rings.WRRDMAWrite, SGEs: []rings.SGE{mr.sge(0, 8)}}, raddr: mr.addr(200), rkey: mr.rkey})
	cs := cq.wait(2)
	assert.Equal(t, uint64(2), cs[1].WRID)
}

// Moving a QP to ERR flushes its send and receive queues; RESET forgets
// without completions.
func TestFlushOnError(t *testing.T) {
	p := newRCPair(t, pvsim.Config{}, defaultRC(), defaultRC())
	p.b.recv(1, p.bmr.sge(0, 64))
	p.b.recv(2, p.bmr.sge(64, 64))
	require.NoError(t, p.b.modify(firmware.QPStateErr, 0, firmware.QPAttr{}))
	cs := p.bcq.wait(2)
	assert.Equal(t, uint32(rings.WCWRFlushErr), cs[0].Status)
	assert.Equal(t, uint32(rings.WCRecv), cs[0].Opcode)
	assert.Equal(t, uint64(2), cs[1].WRID)
	p.b.recv(3, p.bmr.sge(0, 64))
	assert.Equal(t, uint32(rings.WCWRFlushErr), p.bcq.wait(1)[0].Status, "a receive posted in ERR")
	require.NoError(t, p.b.modify(firmware.QPStateReset, 0, firmware.QPAttr{}))
	assert.Empty(t, p.bcq.quiet(2*time.Millisecond))
}

// A fenced WQE waits for the READs before it.
func TestFence(t *testing.T) {
	p := newRCPair(t, pvsim.Config{}, defaultRC(), defaultRC())
	p.b.recv(1, p.bmr.sge(0, 64))
	copy(p.bmr.buf.Mem[100:], "fenced")
	f := sendWR(2, rings.WRSend, sig|rings.SendFence, p.amr.sge(0, 6))
	p.a.send(rdma(1, rings.WRRDMARead, p.amr.sge(0, 6), p.bmr.addr(100), p.bmr.rkey), f)
	cs := p.acq.wait(2)
	assert.Equal(t, []uint64{1, 2}, []uint64{cs[0].WRID, cs[1].WRID})
	p.bcq.wait(1)
	assert.Equal(t, "fenced", string(p.bmr.buf.Mem[:6]), "the SEND carried what the READ brought")
}

// UD on a VMware device: CQE fields and immediate data; an RDMA opcode on
// UD is a local QP operation error; RoCE v2 headers for IPv4-mapped GIDs.
func TestUDRaw(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  pvsim.Config
	}{{"v20", pvsim.Config{}}, {"v18-rocev2", pvsim.Config{Version: 18, RoCEv2: true}}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRaw(t, tc.cfg)
			pd := r.pd()
			cq := r.cq(16)
			a := r.qp(pd, firmware.QPTypeUD, cq, cq, 16, qpOpts{})
			b := r.qp(pd, firmware.QPTypeUD, cq, cq, 16, qpOpts{})
			a.up(1)
			b.up(2)
			mr := r.mr(pd, 8192, allAccess)
			dgid := r.gid
			if tc.cfg.RoCEv2 {
				// An IPv4-mapped GID at index 1: RoCE v2 over IPv4.
				dgid = [16]byte{10: 0xff, 11: 0xff, 12: 10, 13: 0, 14: 0, 15: 7}
				require.NoError(t, r.ch.CreateBind(r.ctx(), firmware.CreateBindRequest{Index: 1, GID: dgid, GIDType: firmware.GIDTypeRoCEv2}))
				a.gidIndex = 1
			}
			b.recv(1, mr.sge(4096, 256))
			copy(mr.buf.Mem, "dgram")
			w := sendWR(5, rings.WRSendWithImm, sig, mr.sge(0, 5))
			w.Imm = 0x01020304
			w.UD = &rings.UDAddr{RemoteQPN: b.qpn, RemoteQKey: 2, DGID: dgid, GIDIndex: a.gidIndex, HopLimit: 9}
			a.send(w)
			cs := cq.wait(2)
			var rc rings.CQE
			for _, c := range cs {
				if c.Opcode == rings.WCRecv {
					rc = c
				}
			}
			require.Equal(t, uint32(rings.WCSuccess), rc.Status, "%+v", cs)
			assert.Equal(t, uint64(b.handle), rc.QP)
			assert.Equal(t, a.qpn, rc.SrcQP)
			assert.Equal(t, uint32(40+5), rc.ByteLen)
			assert.Equal(t, uint32(0x01020304), rc.Imm)
			assert.Equal(t, "dgram", string(mr.buf.Mem[4096+40:4096+45]))
			if tc.cfg.RoCEv2 {
				assert.Equal(t, uint8(1), rc.NetworkHdrType, "IPv4")
				h := mr.buf.Mem[4096+20 : 4096+40]
				assert.Equal(t, byte(0x45), h[0])
				assert.Equal(t, byte(9), h[8], "TTL")
				assert.Equal(t, dgid[12:], h[12:16], "source address")
			} else {
				assert.Zero(t, rc.NetworkHdrType)
				assert.Equal(t, byte(9), mr.buf.Mem[4096+7], "hop limit")
			}
			// RDMA on UD.
			a.send(rdma(6, rings.WRRDMAWrite, mr.sge(0, 5), mr.addr(0), mr.rkey))
			assert.Equal(t, uint32(rings.WCLocQPOpErr), cq.wait(1)[0].Status)
		})
	}
}

// Send completions come in order: a WQE that fails at fetch behind an RC
// request in flight completes after it.
func TestErrorCompletionOrder(t *testing.T) {
	p := newRCPair(t, pvsim.Config{}, defaultRC(), defaultRC())
	copy(p.bmr.buf.Mem[100:], "first")
	p.a.send(rdma(1, rings.WRRDMARead, p.amr.sge(0, 5), p.bmr.addr(100), p.bmr.rkey),
		sendWR(2, rings.WRSend, sig, rings.SGE{Addr: 0, Length: 4, LKey: 0xbad}),
		sendWR(3, rings.WRSend, sig, p.amr.sge(0, 4)))
	cs := p.acq.wait(3)
	assert.Equal(t, []uint64{1, 2, 3}, []uint64{cs[0].WRID, cs[1].WRID, cs[2].WRID})
	assert.Equal(t, []uint32{rings.WCSuccess, rings.WCLocProtErr, rings.WCWRFlushErr}, []uint32{cs[0].Status, cs[1].Status, cs[2].Status})
	assert.Equal(t, "first", string(p.amr.buf.Mem[:5]))
}

// An answer lost on the way makes the requester time out and send again;
// the responder answers the duplicate without executing it again: a SEND
// is acknowledged, a READ read again, a fetch-and-add's first result sent.
func TestDuplicateAfterLostAnswer(t *testing.T) {
	fab := pvsim.NewFabric()
	ra := newRaw(t, pvsim.Config{Fabric: fab, MAC: [6]byte{2, 0, 0, 0, 0, 1}})
	rb := newRaw(t, pvsim.Config{Fabric: fab, MAC: [6]byte{2, 0, 0, 0, 0, 2}})
	pa, pb := ra.pd(), rb.pd()
	ca, cb := ra.cq(16), rb.cq(16)
	qa := ra.qp(pa, firmware.QPTypeRC, ca, ca, 16, qpOpts{})
	qb := rb.qp(pb, firmware.QPTypeRC, cb, cb, 16, qpOpts{})
	fast := defaultRC()
	fast.timeout = 9 // 2 ms
	qa.connect(qb.qpn, rb.gid, fast)
	qb.connect(qa.qpn, ra.gid, defaultRC())
	ma, mb := ra.mr(pa, 8192, allAccess), rb.mr(pb, 8192, allAccess)
	binary.LittleEndian.PutUint64(mb.buf.Mem[64:], 100)
	copy(mb.buf.Mem[200:], "again")
	qb.recv(1, mb.sge(1000, 64))

	for _, w := range []wr{
		sendWR(1, rings.WRSend, sig, ma.sge(0, 4)),
		rdma(2, rings.WRRDMARead, ma.sge(100, 5), mb.addr(200), mb.rkey),
		atomicWR(3, rings.WRAtomicFetchAndAdd, ma.sge(16, 8), mb.addr(64), mb.rkey, 1, 0),
	} {
		fab.LoseAnswers(1)
		qa.send(w)
		c := ca.wait(1)[0]
		require.Equal(t, uint32(rings.WCSuccess), c.Status, "%+v", c)
	}
	assert.Equal(t, "again", string(ma.buf.Mem[100:105]))
	assert.Equal(t, uint64(100), binary.LittleEndian.Uint64(ma.buf.Mem[16:]))
	assert.Equal(t, uint64(101), binary.LittleEndian.Uint64(mb.buf.Mem[64:]), "added once")
	assert.Len(t, cb.poll(), 1, "one receive")
	assert.Equal(t, uint64(3), ra.m.Stats().Retransmits, "one per lost answer")
	assert.Equal(t, uint64(3), rb.m.Stats().Dropped, "the lost answers")
}
