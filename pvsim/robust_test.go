package pvsim_test

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/doorbell"
	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/pvsim"
	"github.com/vfrdma/vfrdma/rings"
)

// Whatever a driver writes, the model answers or refuses: it never
// panics (a panic on its goroutine ends the test binary), never touches
// memory that is not mapped, and keeps running.

// scribbler writes plausible garbage: small numbers, addresses of mapped
// pages (and a little off them), and noise.
type scribbler struct {
	rng   *rand.Rand
	addrs []uint64
}

func (s *scribbler) u32() uint32 {
	switch s.rng.IntN(4) {
	case 0:
		return uint32(s.rng.IntN(5))
	case 1:
		return uint32(1) << s.rng.IntN(32)
	case 2:
		return s.rng.Uint32()
	}
	return uint32(s.rng.IntN(70000))
}

func (s *scribbler) u64() uint64 {
	if len(s.addrs) > 0 && s.rng.IntN(3) > 0 {
		a := s.addrs[s.rng.IntN(len(s.addrs))]
		if s.rng.IntN(4) == 0 {
			a += uint64(s.rng.IntN(8192)) - 4096
		}
		return a
	}
	return uint64(s.u32()) | uint64(s.u32())<<32*uint64(s.rng.IntN(2))
}

func (s *scribbler) fill(b []byte) {
	for i := 0; i+8 <= len(b); i += 8 {
		if s.rng.IntN(2) == 0 {
			binary.LittleEndian.PutUint64(b[i:], s.u64())
		} else {
			binary.LittleEndian.PutUint32(b[i:], s.u32())
			binary.LittleEndian.PutUint32(b[i+4:], s.u32())
		}
	}
}

// A setup with objects of every kind for the garbage to name.
func scribbleSetup(t *testing.T, cfg pvsim.Config) (*raw, *scribbler, *rcPair) {
	p := newRCPair(t, cfg, defaultRC(), defaultRC())
	r := p.r
	s := &scribbler{rng: rand.New(rand.NewPCG(1, 2))}
	for i := range rpPages {
		s.addrs = append(s.addrs, page(r.ctl, i).DMA)
	}
	for _, b := range []uint64{p.amr.buf.IOVA, p.bmr.buf.IOVA} {
		s.addrs = append(s.addrs, b, b+4096)
	}
	return r, s, p
}

// Random commands, including all 21 codes and a few past them.
func TestRandomCommands(t *testing.T) {
	for _, tc := range devices {
		t.Run(tc.name, func(t *testing.T) {
			r, s, p := scribbleSetup(t, tc.cfg)
			_ = p
			cmd := page(r.ctl, rpCmd).Mem
			for range 3000 {
				clear(cmd[:firmware.CmdSlotSize])
				s.fill(cmd[16:firmware.CmdSlotSize])
				binary.LittleEndian.PutUint64(cmd[0:], s.rng.Uint64())
				binary.LittleEndian.PutUint32(cmd[8:], uint32(s.rng.IntN(24)))
				require.NoError(t, r.regs.Store32(firmware.RegRequest, 0))
				_, err := r.regs.Load32(firmware.RegErr)
				require.NoError(t, err)
				if s.rng.IntN(50) == 0 {
					require.NoError(t, r.uar.Store32(doorbell.OffsetQP, doorbell.QPSend|p.a.handle))
					require.NoError(t, r.uar.Store32(doorbell.OffsetCQ, s.u32()))
					require.NoError(t, r.uar.Store32(doorbell.OffsetSRQ, s.u32()))
					require.NoError(t, r.uar.Store32(doorbell.OffsetQP, s.u32()))
				}
			}
			r.m.QPs() // still running
			assert.NotZero(t, r.m.Stats().Commands)
		})
	}
}

// Random WQEs, receive WQEs and ring counters on live QPs.
func TestRandomWQEs(t *testing.T) {
	for _, tc := range devices {
		t.Run(tc.name, func(t *testing.T) {
			r, s, p := scribbleSetup(t, tc.cfg)
			ud := r.qp(p.pd, firmware.QPTypeUD, p.acq, p.bcq, 16, qpOpts{})
			ud.up(7)
			srq := r.srq(p.pd, 16)
			sq := r.qp(p.pd, firmware.QPTypeRC, p.acq, p.bcq, 16, qpOpts{hasSRQ: true, srq: srq.handle})
			sq.connect(p.a.qpn, r.gid, defaultRC())
			s.addrs = append(s.addrs, p.amr.addr(0), p.bmr.addr(100))
			for i := range 2000 {
				q := []*rawQP{p.a, p.b, ud, sq}[s.rng.IntN(4)]
				switch s.rng.IntN(6) {
				case 0, 1, 2:
					slot := q.sqData[q.sq.Next(0)*q.sqStride:][:q.sqStride]
					s.fill(slot)
					binary.LittleEndian.PutUint32(slot[8:], uint32(s.rng.IntN(6)))   // num_sge
					binary.LittleEndian.PutUint32(slot[16:], uint32(s.rng.IntN(17))) // opcode
					for j := range 4 {
						e := slot[80+16*j:]
						binary.LittleEndian.PutUint32(e[12:], []uint32{p.amr.lkey, p.bmr.lkey, s.u32()}[s.rng.IntN(3)])
						binary.LittleEndian.PutUint32(e[8:], uint32(s.rng.IntN(5000)))
					}
					binary.LittleEndian.PutUint32(slot[40:], []uint32{p.bmr.rkey, s.u32()}[s.rng.IntN(2)])
					if q.sq.Unpublished() < q.depth {
						if free, err := q.sq.Free(); err == nil && free > 0 {
							q.sq.Advance(1)
							q.sq.Publish()
						}
					}
					require.NoError(t, r.uar.Store32(doorbell.OffsetQP, doorbell.QPSend|q.handle))
				case 3:
					if q.rq == nil {
						srq.recv(uint64(i), rings.SGE{Addr: s.u64(), Length: s.u32(), LKey: p.bmr.lkey})
						continue
					}
					slot := q.rqData[q.rq.Next(0)*q.rqStride:][:q.rqStride]
					s.fill(slot)
					binary.LittleEndian.PutUint32(slot[8:], uint32(s.rng.IntN(6)))
					if free, err := q.rq.Free(); err == nil && free > 0 {
						q.rq.Advance(1)
						q.rq.Publish()
					}
					require.NoError(t, r.uar.Store32(doorbell.OffsetQP, doorbell.QPRecv|q.handle))
				case 4:
					// Counters the device must not trust.
					st := []*rings.State{q.sqState, q.rqState, p.acq.state}[s.rng.IntN(3)]
					if s.rng.IntN(2) == 0 {
						st.SetProdTail(s.u32())
					} else {
						st.SetConsHead(s.u32())
					}
					require.NoError(t, r.uar.Store32(doorbell.OffsetQP, doorbell.QPSend|doorbell.QPRecv|q.handle))
				case 5:
					for _, c := range []*rawCQ{p.acq, p.bcq} {
						if n, err := c.cons.Ready(); err != nil {
							c.cons.Reset() // the test scribbled on it
						} else {
							c.cons.Consume(n)
						}
					}
				}
			}
			r.m.QPs() // still running
			assert.NotZero(t, r.m.Stats().SQDoorbells)
		})
	}
}

// Random register writes: DSR addresses, CTL values, IMR, scratch.
func TestRandomRegisters(t *testing.T) {
	for _, tc := range devices[:2] {
		t.Run(tc.name, func(t *testing.T) {
			r, s, _ := scribbleSetup(t, tc.cfg)
			for range 500 {
				off := 4 * s.rng.IntN(64)
				v := s.u32()
				if off == firmware.RegDSRLow || off == firmware.RegDSRHigh {
					a := s.u64()
					require.NoError(t, r.regs.Store32(firmware.RegDSRLow, uint32(a)))
					require.NoError(t, r.regs.Store32(firmware.RegDSRHigh, uint32(a>>32)))
					continue
				}
				require.NoError(t, r.regs.Store32(off, v))
				_, err := r.regs.Load32(off)
				require.NoError(t, err)
			}
			assert.Error(t, r.regs.Store32(256, 0))
			assert.Error(t, r.regs.Store32(3, 0))
			_, err := r.regs.Load32(-4)
			assert.Error(t, err)
			assert.Error(t, r.uar.Store32(4096, 0))
			r.m.Stats()
		})
	}
}

// FuzzCommand runs one command of arbitrary bytes on a device with
// objects of every kind.
func FuzzCommand(f *testing.F) {
	f.Add(uint32(9), []byte{0x00, 0x10, 0, 0, 1, 0, 0, 0})
	f.Add(uint32(4), []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add(uint32(10), make([]byte, 168))
	f.Add(uint32(17), []byte{1, 2, 3})
	f.Add(uint32(15), []byte{0, 4, 0, 0, 0xff, 0x0f, 0, 0, 0xfe, 0, 0, 0})
	f.Fuzz(func(t *testing.T, code uint32, body []byte) {
		for _, cfg := range []pvsim.Config{{QEMU: true}, {}} {
			r := newRaw(t, cfg)
			pd := r.pd()
			cq := r.cq(16)
			r.qp(pd, firmware.QPTypeRC, cq, cq, 16, qpOpts{})
			r.srq(pd, 16)
			cmd := page(r.ctl, rpCmd).Mem
			clear(cmd[:firmware.CmdSlotSize])
			copy(cmd[16:firmware.CmdSlotSize], body)
			binary.LittleEndian.PutUint32(cmd[8:], code)
			require.NoError(t, r.regs.Store32(firmware.RegRequest, 0))
			r.m.QPs()
			r.m.Close()
		}
	})
}
