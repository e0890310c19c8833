package pvsim_test

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/pvsim"
)

// node is one driver on one model.
type node struct {
	m  *pvsim.Device
	d  *vfrdma.Device
	pd *vfrdma.PD
	cq *vfrdma.CQ
	mr *vfrdma.MR
}

func newNode(t testing.TB, cfg pvsim.Config, fab *pvsim.Fabric, mac byte) *node {
	t.Helper()
	cfg.Fabric = fab
	cfg.MAC = [6]byte{0x02, 0, 0, 0, 0, mac}
	m, d := open(t, cfg)
	ctx := ctxT(t)
	n := &node{m: m, d: d}
	var err error
	n.pd, err = d.AllocPD(ctx)
	require.NoError(t, err)
	n.cq, err = d.CreateCQ(ctx, 256)
	require.NoError(t, err)
	n.mr, err = n.pd.AllocMR(ctx, 1<<16, vfrdma.AccessLocalWrite|vfrdma.AccessRemoteWrite|vfrdma.AccessRemoteRead|vfrdma.AccessRemoteAtomic)
	require.NoError(t, err)
	return n
}

func (n *node) qp(t testing.TB, typ vfrdma.QPType, srq *vfrdma.SRQ) *vfrdma.QP {
	t.Helper()
	qp, err := n.pd.CreateQP(ctxT(t), &vfrdma.QPConfig{Type: typ, SendCQ: n.cq, RecvCQ: n.cq, QKey: 0x1234, SRQ: srq, SendSGE: 2, RecvSGE: 2})
	require.NoError(t, err)
	return qp
}

// connect brings two RC QPs up against each other.
func connect(t testing.TB, a *node, qa *vfrdma.QP, b *node, qb *vfrdma.QP) {
	t.Helper()
	ctx := ctxT(t)
	require.NoError(t, qa.Connect(ctx, vfrdma.Remote{QPN: qb.QPN(), GID: b.d.GID(), PSN: 100}, 200))
	require.NoError(t, qb.Connect(ctx, vfrdma.Remote{QPN: qa.QPN(), GID: a.d.GID(), PSN: 200}, 100))
}

// poll collects n completions from cq (waiting on its interrupt), failing
// the test after the timeout.
func poll(t testing.TB, cq *vfrdma.CQ, n int) []vfrdma.WC {
	t.Helper()
	var out []vfrdma.WC
	wcs := make([]vfrdma.WC, 16)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for len(out) < n {
		k, err := cq.Poll(wcs)
		require.NoError(t, err)
		out = append(out, wcs[:k]...)
		if k == 0 {
			require.NoError(t, cq.Wait(ctx), "waiting for completion %d of %d", len(out)+1, n)
		}
	}
	return out
}

// fabricKinds are the ways two models meet: one Fabric of one process
// ("memory"), and two nodes of one directory ("dir", JoinFabric), whose
// packets cross Unix sockets as between processes. The transport tests
// run over both.
var fabricKinds = []string{"memory", "dir"}

// twoFabrics returns the fabrics of two models that meet by kind.
func twoFabrics(t testing.TB, kind string) (*pvsim.Fabric, *pvsim.Fabric) {
	t.Helper()
	if kind == "memory" {
		f := pvsim.NewFabric()
		return f, f
	}
	dir := fabricDir(t)
	fa, err := pvsim.JoinFabric(dir)
	require.NoError(t, err)
	fb, err := pvsim.JoinFabric(dir)
	require.NoError(t, err)
	// Closed after the models (cleanups run last first).
	t.Cleanup(func() {
		assert.NotZero(t, fa.NetStats().FramesOut+fb.NetStats().FramesOut, "the models met over the directory's sockets")
		assert.NoError(t, fa.Close())
		assert.NoError(t, fb.Close())
	})
	return fa, fb
}

// fabricDir returns a new short directory (a Unix socket's path is at
// most 107 bytes; a test's TempDir can be longer).
func fabricDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pvf")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// sendFlags: a VMware device completes only signaled sends.
const signaled = vfrdma.SendSignaled

// RC SEND between two drivers on two models, and back.
func TestRCSendRecv(t *testing.T) {
	for _, fk := range fabricKinds {
		for _, tc := range devices {
			t.Run(fk+"/"+tc.name, func(t *testing.T) {
				fa, fb := twoFabrics(t, fk)
				a, b := newNode(t, tc.cfg, fa, 1), newNode(t, tc.cfg, fb, 2)
				qa, qb := a.qp(t, vfrdma.RC, nil), b.qp(t, vfrdma.RC, nil)
				connect(t, a, qa, b, qb)

				const count = 50
				for i := range count {
					_, err := qb.PostRecv([]vfrdma.RecvWR{{WRID: uint64(1000 + i), SGEs: []vfrdma.SGE{b.mr.SGE(i*256, 256)}}}, 0)
					require.NoError(t, err)
				}
				for i := range count {
					msg := []byte(fmt.Sprintf("message %d from a", i))
					copy(a.mr.Bytes()[i*256:], msg)
					_, err := qa.PostSend([]vfrdma.SendWR{{WRID: uint64(i), Flags: signaled, SGEs: []vfrdma.SGE{a.mr.SGE(i*256, len(msg))}}}, 0)
					require.NoError(t, err)
				}
				sends := poll(t, a.cq, count)
				recvs := poll(t, b.cq, count)
				for i, wc := range sends {
					assert.Equal(t, vfrdma.WCSuccess, wc.Status)
					assert.Equal(t, uint64(i), wc.WRID, "in order")
					assert.Equal(t, vfrdma.WCSend, wc.Opcode)
					assert.Equal(t, qa.QPN(), wc.QPN)
				}
				for i, wc := range recvs {
					msg := fmt.Sprintf("message %d from a", i)
					require.Equal(t, vfrdma.WCSuccess, wc.Status)
					assert.Equal(t, uint64(1000+i), wc.WRID)
					assert.Equal(t, vfrdma.WCRecv, wc.Opcode)
					assert.Equal(t, uint32(len(msg)), wc.ByteLen)
					assert.Equal(t, qa.QPN(), wc.SrcQP)
					assert.Equal(t, qb.QPN(), wc.QPN)
					assert.Equal(t, msg, string(b.mr.Bytes()[i*256:i*256+len(msg)]))
				}

				// And back, with two SGEs gathered into one message.
				copy(b.mr.Bytes()[60000:], "hello, ")
				copy(b.mr.Bytes()[61000:], "world")
				_, err := qa.PostRecv([]vfrdma.RecvWR{{WRID: 7, SGEs: []vfrdma.SGE{a.mr.SGE(40000, 5), a.mr.SGE(41000, 100)}}}, 0)
				require.NoError(t, err)
				_, err = qb.PostSend([]vfrdma.SendWR{{WRID: 8, Flags: signaled, SGEs: []vfrdma.SGE{b.mr.SGE(60000, 7), b.mr.SGE(61000, 5)}}}, 0)
				require.NoError(t, err)
				poll(t, b.cq, 1)
				wc := poll(t, a.cq, 1)[0]
				assert.Equal(t, uint32(12), wc.ByteLen)
				assert.Equal(t, "hello", string(a.mr.Bytes()[40000:40005]))
				assert.Equal(t, ", world", string(a.mr.Bytes()[41000:41007]))
				assert.Empty(t, a.m.Hazards())
			})
		}
	}
}

// A message posted before the receiver has a receive waits (RC with
// rnr_retry 7) until one is posted.
func TestRCSendWaitsForReceive(t *testing.T) {
	for _, fk := range fabricKinds {
		for _, tc := range devices {
			t.Run(fk+"/"+tc.name, func(t *testing.T) {
				fa, fb := twoFabrics(t, fk)
				a, b := newNode(t, tc.cfg, fa, 1), newNode(t, tc.cfg, fb, 2)
				qa, qb := a.qp(t, vfrdma.RC, nil), b.qp(t, vfrdma.RC, nil)
				connect(t, a, qa, b, qb)
				copy(a.mr.Bytes(), "late")
				_, err := qa.PostSend([]vfrdma.SendWR{{WRID: 1, Flags: signaled, SGEs: []vfrdma.SGE{a.mr.SGE(0, 4)}}}, 0)
				require.NoError(t, err)
				require.Eventually(t, func() bool { return b.m.Stats().RNRNaks > 0 }, 5*time.Second, 100*time.Microsecond)
				time.Sleep(5 * time.Millisecond)
				n, err := a.cq.Poll(make([]vfrdma.WC, 4))
				require.NoError(t, err)
				assert.Zero(t, n, "completed without a receive")
				_, err = qb.PostRecv([]vfrdma.RecvWR{{WRID: 2, SGEs: []vfrdma.SGE{b.mr.SGE(0, 64)}}}, 0)
				require.NoError(t, err)
				assert.Equal(t, vfrdma.WCSuccess, poll(t, a.cq, 1)[0].Status)
				assert.Equal(t, vfrdma.WCSuccess, poll(t, b.cq, 1)[0].Status)
				assert.Equal(t, "late", string(b.mr.Bytes()[:4]))
			})
		}
	}
}

// Two QPs of one device talk through the device itself.
func TestLoopback(t *testing.T) {
	for _, tc := range devices {
		t.Run(tc.name, func(t *testing.T) {
			a := newNode(t, tc.cfg, nil, 1)
			q1, q2 := a.qp(t, vfrdma.RC, nil), a.qp(t, vfrdma.RC, nil)
			connect(t, a, q1, a, q2)
			_, err := q2.PostRecv([]vfrdma.RecvWR{{WRID: 2, SGEs: []vfrdma.SGE{a.mr.SGE(4096, 64)}}}, 0)
			require.NoError(t, err)
			copy(a.mr.Bytes(), "loop")
			_, err = q1.PostSend([]vfrdma.SendWR{{WRID: 1, Flags: signaled, SGEs: []vfrdma.SGE{a.mr.SGE(0, 4)}}}, 0)
			require.NoError(t, err)
			wcs := poll(t, a.cq, 2)
			assert.ElementsMatch(t, []uint64{1, 2}, []uint64{wcs[0].WRID, wcs[1].WRID})
			assert.Equal(t, "loop", string(a.mr.Bytes()[4096:4100]))
		})
	}
}

// UD datagrams: the receive gets the 40-byte GRH, then the payload; a
// datagram with no receive posted, or the wrong qkey, is dropped and the
// send still completes.
func TestUDSendRecv(t *testing.T) {
	for _, fk := range fabricKinds {
		for _, tc := range devices {
			t.Run(fk+"/"+tc.name, func(t *testing.T) {
				fa, fb := twoFabrics(t, fk)
				a, b := newNode(t, tc.cfg, fa, 1), newNode(t, tc.cfg, fb, 2)
				qa, qb := a.qp(t, vfrdma.UD, nil), b.qp(t, vfrdma.UD, nil)
				ctx := ctxT(t)
				require.NoError(t, qa.Connect(ctx, vfrdma.Remote{}, 0))
				require.NoError(t, qb.Connect(ctx, vfrdma.Remote{}, 0))
				ah, err := a.pd.CreateAH(vfrdma.AHAttr{DGID: b.d.GID()})
				require.NoError(t, err)

				send := func(id uint64, text string, qkey uint32) {
					copy(a.mr.Bytes()[int(id)*512:], text)
					_, err := qa.PostSend([]vfrdma.SendWR{{WRID: id, Flags: signaled, SGEs: []vfrdma.SGE{a.mr.SGE(int(id)*512, len(text))},
						AH: ah, RemoteQPN: qb.QPN(), RemoteQKey: qkey}}, 0)
					require.NoError(t, err)
				}
				send(1, "nobody listens", 0x1234)
				require.Equal(t, vfrdma.WCSuccess, poll(t, a.cq, 1)[0].Status)
				// The send completes when it leaves; wait for the receiver to drop it.
				require.Eventually(t, func() bool { return b.m.Stats().UDNoRecv == 1 }, 5*time.Second, time.Millisecond)

				_, err = qb.PostRecv([]vfrdma.RecvWR{{WRID: 10, SGEs: []vfrdma.SGE{b.mr.SGE(0, 1024)}}}, 0)
				require.NoError(t, err)
				send(2, "wrong qkey", 0x9999)
				require.Equal(t, vfrdma.WCSuccess, poll(t, a.cq, 1)[0].Status)
				send(3, "datagram", 0x1234)
				require.Equal(t, vfrdma.WCSuccess, poll(t, a.cq, 1)[0].Status)
				wc := poll(t, b.cq, 1)[0]
				require.Equal(t, vfrdma.WCSuccess, wc.Status)
				assert.Equal(t, uint64(10), wc.WRID)
				assert.Equal(t, uint32(vfrdma.UDHeaderRoom+len("datagram")), wc.ByteLen)
				assert.Equal(t, qa.QPN(), wc.SrcQP)
				assert.NotZero(t, wc.Flags&1, "GRH flag")
				got := b.mr.Bytes()
				assert.Equal(t, "datagram", string(got[40:48]))
				assert.Equal(t, byte(6), got[0]>>4, "GRH version")
				assert.Equal(t, a.d.GID(), vfrdma.GID(got[8:24]), "GRH source GID")
				assert.Equal(t, b.d.GID(), vfrdma.GID(got[24:40]), "GRH destination GID")
				st := b.m.Stats()
				assert.Equal(t, uint64(1), st.UDNoRecv)
				assert.Equal(t, uint64(1), st.QKeyViolation)
			})
		}
	}
}

// An SRQ feeds two QPs, each receiving from its own peer.
func TestSRQ(t *testing.T) {
	for _, fk := range fabricKinds {
		for _, tc := range devices {
			t.Run(fk+"/"+tc.name, func(t *testing.T) {
				fa, fb := twoFabrics(t, fk)
				a, b := newNode(t, tc.cfg, fa, 1), newNode(t, tc.cfg, fb, 2)
				ctx := ctxT(t)
				s, err := b.pd.CreateSRQ(ctx, &vfrdma.SRQConfig{Depth: 32, SGE: 1, CQ: b.cq})
				require.NoError(t, err)
				qa1, qa2 := a.qp(t, vfrdma.RC, nil), a.qp(t, vfrdma.RC, nil)
				qb1, qb2 := b.qp(t, vfrdma.RC, s), b.qp(t, vfrdma.RC, s)
				connect(t, a, qa1, b, qb1)
				connect(t, a, qa2, b, qb2)
				for i := range 8 {
					_, err := s.PostRecv([]vfrdma.RecvWR{{WRID: uint64(100 + i), SGEs: []vfrdma.SGE{b.mr.SGE(i*128, 128)}}}, 0)
					require.NoError(t, err)
				}
				for i := range 4 {
					for j, q := range []*vfrdma.QP{qa1, qa2} {
						off := (i*2 + j) * 64
						copy(a.mr.Bytes()[off:], fmt.Sprintf("q%d m%d", j+1, i))
						_, err := q.PostSend([]vfrdma.SendWR{{WRID: uint64(off), Flags: signaled, SGEs: []vfrdma.SGE{a.mr.SGE(off, 5)}}}, 0)
						require.NoError(t, err)
					}
				}
				poll(t, a.cq, 8)
				recvs := poll(t, b.cq, 8)
				by := map[uint32]int{}
				for _, wc := range recvs {
					require.Equal(t, vfrdma.WCSuccess, wc.Status)
					by[wc.QPN]++
					slot := int(wc.WRID - 100)
					got := string(b.mr.Bytes()[slot*128 : slot*128+5])
					if wc.QPN == qb1.QPN() {
						assert.Equal(t, "q1 m", got[:4])
						assert.Equal(t, qa1.QPN(), wc.SrcQP)
					} else {
						assert.Equal(t, "q2 m", got[:4])
						assert.Equal(t, qa2.QPN(), wc.SrcQP)
					}
				}
				assert.Equal(t, map[uint32]int{qb1.QPN(): 4, qb2.QPN(): 4}, by)
				assert.Empty(t, b.m.Hazards())
			})
		}
	}
}

// Unsignaled sends on a VMware device complete nothing, and the send
// queue's slots come back as the device consumes them: a driver can keep
// posting them.
func TestDriverUnsignaledSends(t *testing.T) {
	cfg := pvsim.Config{Version: 19}
	fab := pvsim.NewFabric()
	a, b := newNode(t, cfg, fab, 1), newNode(t, cfg, fab, 2)
	qa, qb := a.qp(t, vfrdma.RC, nil), b.qp(t, vfrdma.RC, nil)
	connect(t, a, qa, b, qb)
	depth := qa.SendDepth()
	for round := range 4 {
		for i := range depth {
			_, err := qb.PostRecv([]vfrdma.RecvWR{{WRID: uint64(i), SGEs: []vfrdma.SGE{b.mr.SGE(0, 64)}}}, 0)
			require.NoError(t, err)
		}
		for i := range depth {
			flags := vfrdma.SendFlags(0)
			if i == depth-1 {
				flags = signaled
			}
			var err error
			require.Eventually(t, func() bool {
				_, err = qa.PostSend([]vfrdma.SendWR{{WRID: uint64(i), Flags: flags, SGEs: []vfrdma.SGE{a.mr.SGE(0, 8)}}}, 0)
				return err == nil
			}, 5*time.Second, 100*time.Microsecond, "round %d send %d: %v", round, i, err)
		}
		assert.Equal(t, uint64(depth-1), poll(t, a.cq, 1)[0].WRID)
		poll(t, b.cq, depth)
	}
}

// An MR over the caller's own memory (RegisterMR: MapDMA and UnmapDMA).
func TestRegisterMR(t *testing.T) {
	for _, tc := range devices[:2] {
		t.Run(tc.name, func(t *testing.T) {
			a := newNode(t, tc.cfg, nil, 1)
			mem, err := syscall.Mmap(-1, 0, 3*4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
			require.NoError(t, err)
			defer syscall.Munmap(mem)
			mr, err := a.pd.RegisterMR(ctxT(t), mem[:10000], vfrdma.AccessLocalWrite)
			require.NoError(t, err)
			q1, q2 := a.qp(t, vfrdma.RC, nil), a.qp(t, vfrdma.RC, nil)
			connect(t, a, q1, a, q2)
			_, err = q2.PostRecv([]vfrdma.RecvWR{{WRID: 1, SGEs: []vfrdma.SGE{mr.SGE(9000, 100)}}}, 0)
			require.NoError(t, err)
			copy(mem, "caller's memory")
			_, err = q1.PostSend([]vfrdma.SendWR{{WRID: 2, Flags: signaled, SGEs: []vfrdma.SGE{mr.SGE(0, 15)}}}, 0)
			require.NoError(t, err)
			poll(t, a.cq, 2)
			assert.Equal(t, "caller's memory", string(mem[9000:9015]))
			require.NoError(t, q1.Close())
			require.NoError(t, q2.Close())
			require.NoError(t, mr.Close())
		})
	}
}
