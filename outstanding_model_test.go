package vfrdma_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/pvsim"
)

// Outstanding has one meaning for QPs and SRQs (doc.go): a work request is
// outstanding from its post until a Poll hands it back. These tests wait
// until the device has consumed a request and written what it writes for
// it, and check that the request still counts until the Poll: a count of
// requests the device has not consumed yet would fail them.

// outstandingPair is two connected RC QPs, a sending to b, each queue with
// a CQ of its own: a's sends complete on sendCQ, b's receives on recvCQ.
type outstandingPair struct {
	a, b           *vfrdma.QP
	sendCQ, recvCQ *vfrdma.CQ
	mr             *vfrdma.MR
	srq            *vfrdma.SRQ // b's receives come from it, when asked for
}

func newOutstandingPair(t *testing.T, d *vfrdma.Device, signalAll, withSRQ bool) *outstandingPair {
	t.Helper()
	ctx := ctxT(t)
	p := &outstandingPair{}
	pd, err := d.AllocPD(ctx)
	require.NoError(t, err)
	p.mr, err = pd.AllocMR(ctx, 1<<16, vfrdma.AccessLocalWrite)
	require.NoError(t, err)
	cqs := make([]*vfrdma.CQ, 4)
	for i := range cqs {
		cqs[i], err = d.CreateCQ(ctx, 16)
		require.NoError(t, err)
	}
	p.sendCQ, p.recvCQ = cqs[0], cqs[3]
	cfgB := &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: cqs[2], RecvCQ: p.recvCQ, SignalAll: true}
	if withSRQ {
		p.srq, err = pd.CreateSRQ(ctx, &vfrdma.SRQConfig{Depth: 8, CQ: p.recvCQ})
		require.NoError(t, err)
		cfgB.SRQ = p.srq
	}
	p.a, err = pd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: p.sendCQ, RecvCQ: cqs[1], SignalAll: signalAll})
	require.NoError(t, err)
	p.b, err = pd.CreateQP(ctx, cfgB)
	require.NoError(t, err)
	require.NoError(t, p.a.Connect(ctx, vfrdma.Remote{QPN: p.b.QPN(), GID: d.GID()}, 0))
	require.NoError(t, p.b.Connect(ctx, vfrdma.Remote{QPN: p.a.QPN(), GID: d.GID()}, 0))
	return p
}

func (p *outstandingPair) send(t *testing.T, id uint64, flags vfrdma.SendFlags) {
	t.Helper()
	_, err := p.a.PostSend([]vfrdma.SendWR{{WRID: id, Flags: flags, SGEs: []vfrdma.SGE{p.mr.SGE(0, 64)}}}, 0)
	require.NoError(t, err)
}

func (p *outstandingPair) recvWR(id uint64) []vfrdma.RecvWR {
	return []vfrdma.RecvWR{{WRID: id, SGEs: []vfrdma.SGE{p.mr.SGE(4096+256*int(id), 256)}}}
}

// A signaled send and its receive stay outstanding on their QPs once the
// device has written their completions, until the Polls that return them.
func TestQPOutstandingCountsARequestUntilThePollThatReturnsItsCompletion(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  pvsim.Config
	}{{"qemu", pvsim.Config{QEMU: true}}, {"v20", vmware(20)}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t)
			d, _ := openModel(t, tc.cfg, nil)
			p := newOutstandingPair(t, d, true, false)
			_, err := p.b.PostRecv(p.recvWR(1), 0)
			require.NoError(t, err)
			p.send(t, 1, vfrdma.SendSignaled)

			// Wait returns once Poll has something, and consumes nothing.
			require.NoError(t, p.recvCQ.Wait(ctx))
			require.NoError(t, p.sendCQ.Wait(ctx))
			send, _ := p.a.Outstanding()
			assert.Equal(t, 1, send, "a send the device completed, its completion not polled")
			_, recv := p.b.Outstanding()
			assert.Equal(t, 1, recv, "a receive the device consumed, its completion not polled")

			assert.Len(t, waitWCs(t, ctx, p.sendCQ, 1), 1)
			send, _ = p.a.Outstanding()
			assert.Zero(t, send, "after the Poll that returned the send's completion")
			assert.Len(t, waitWCs(t, ctx, p.recvCQ, 1), 1)
			_, recv = p.b.Outstanding()
			assert.Zero(t, recv, "after the Poll that returned the receive's completion")
		})
	}
}

// An unsignaled send on a device that honours signaling makes no
// completion: once the device has consumed it (its message was received),
// it stays outstanding until a Poll of its send CQ finds it consumed and
// hands it back; that Poll returns nothing.
func TestQPOutstandingCountsAnUnsignaledSendUntilAPollOfItsSendCQFindsItConsumed(t *testing.T) {
	ctx := ctxT(t)
	d, _ := openModel(t, vmware(20), nil)
	p := newOutstandingPair(t, d, false, false)
	_, err := p.b.PostRecv(p.recvWR(1), 0)
	require.NoError(t, err)
	p.send(t, 1, 0)
	wcs := waitWCs(t, ctx, p.recvCQ, 1)
	require.Equal(t, vfrdma.WCSuccess, wcs[0].Status, "the message arrived: the device consumed the send")
	send, _ := p.a.Outstanding()
	assert.Equal(t, 1, send, "an unsignaled send the device consumed, no Poll of its send CQ since")

	n, err := p.sendCQ.Poll(make([]vfrdma.WC, 4))
	require.NoError(t, err)
	assert.Zero(t, n, "an unsignaled send makes no completion")
	send, _ = p.a.Outstanding()
	assert.Zero(t, send, "after a Poll of the send CQ that found it consumed")
}

// A receive of an SRQ that a QP consumed stays outstanding on the SRQ
// until the Poll that returns its completion; PostRecv's room is the
// depth less the outstanding receives.
func TestSRQOutstandingCountsAConsumedReceiveUntilThePollThatReturnsItsCompletion(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  pvsim.Config
	}{{"qemu", pvsim.Config{QEMU: true}}, {"v20", vmware(20)}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t)
			d, _ := openModel(t, tc.cfg, nil)
			p := newOutstandingPair(t, d, true, true)
			for i := range uint64(8) {
				_, err := p.srq.PostRecv(p.recvWR(i), 0)
				require.NoError(t, err)
			}
			assert.Equal(t, 8, p.srq.Outstanding(), "the depth, posted")
			p.send(t, 100, vfrdma.SendSignaled)
			require.NoError(t, p.recvCQ.Wait(ctx))
			assert.Equal(t, 8, p.srq.Outstanding(), "a receive the device consumed, its completion not polled")
			_, err := p.srq.PostRecv(p.recvWR(8), 0)
			assert.ErrorIs(t, err, vfrdma.ErrQueueFull, "no room until the Poll")

			assert.Len(t, waitWCs(t, ctx, p.recvCQ, 1), 1)
			assert.Equal(t, 7, p.srq.Outstanding(), "after the Poll that returned its completion")
			_, err = p.srq.PostRecv(p.recvWR(8), 0)
			assert.NoError(t, err, "the Poll gave the receive's room back")
		})
	}
}
