package connect_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/connect"
	"github.com/vfrdma/vfrdma/pvsim"
)

// end is one process's side on a device model: a QP, its CQ, a buffer.
type end struct {
	m   *pvsim.Device
	d   *vfrdma.Device
	pd  *vfrdma.PD
	cq  *vfrdma.CQ
	qp  *vfrdma.QP
	mr  *vfrdma.MR
	psn uint32
}

const recvAt = 4096 // where the receive buffer starts in the MR

func newEnd(t *testing.T, ctx context.Context, fab *pvsim.Fabric, typ vfrdma.QPType) *end {
	t.Helper()
	m, err := pvsim.New(pvsim.Config{Fabric: fab})
	require.NoError(t, err)
	d, err := vfrdma.OpenFunction(m, nil)
	if err != nil {
		m.Close()
		require.NoError(t, err, "OpenFunction")
	}
	t.Cleanup(func() { d.Close(); m.Close() })
	e := &end{m: m, d: d, psn: connect.RandomPSN()}
	e.pd, err = d.AllocPD(ctx)
	require.NoError(t, err)
	e.cq, err = d.CreateCQ(ctx, 16)
	require.NoError(t, err)
	e.qp, err = e.pd.CreateQP(ctx, &vfrdma.QPConfig{Type: typ, SendCQ: e.cq, RecvCQ: e.cq, QKey: connect.RDMACoreQKey, SignalAll: true})
	require.NoError(t, err)
	e.mr, err = e.pd.AllocMR(ctx, 2*recvAt, vfrdma.AccessLocalWrite)
	require.NoError(t, err)
	return e
}

// talk runs one end through the exchange: its endpoint out, the peer's
// in, the QP connected, then, after delay, its receive posted, then Ready,
// and then at once a message to the peer. It returns the peer's message.
func (e *end) talk(ctx context.Context, c *connect.Conn, msg string, delay time.Duration) (string, error) {
	mine := connect.Endpoint{QPN: e.qp.QPN(), GID: e.d.GID(), PSN: e.psn, MTU: e.d.UDMaxPayload(), QKey: connect.RDMACoreQKey}
	info, err := c.Exchange(ctx, connect.Info{Endpoints: []connect.Endpoint{mine}})
	if err != nil {
		return "", err
	}
	peer := info.Endpoints[0]
	wr := vfrdma.SendWR{WRID: 1, SGEs: []vfrdma.SGE{e.mr.SGE(0, len(msg))}}
	room := 0
	if e.qp.Type() == vfrdma.UD {
		if err := e.qp.Connect(ctx, vfrdma.Remote{}, e.psn); err != nil {
			return "", err
		}
		ah, err := e.pd.CreateAH(vfrdma.AHAttr{DGID: peer.GID})
		if err != nil {
			return "", err
		}
		wr.AH, wr.RemoteQPN, wr.RemoteQKey = ah, peer.QPN, peer.QKey
		room = vfrdma.UDHeaderRoom
	} else if err := e.qp.Connect(ctx, peer.Remote(), e.psn); err != nil {
		return "", err
	}
	// A slow end: a peer that sent before this end's receive is posted
	// would meet none (RNR on RC, a lost datagram on UD).
	time.Sleep(delay)
	if _, err := e.qp.PostRecv([]vfrdma.RecvWR{{WRID: 2, SGEs: []vfrdma.SGE{e.mr.SGE(recvAt, recvAt)}}}, 0); err != nil {
		return "", err
	}
	if err := c.Ready(ctx); err != nil {
		return "", err
	}
	copy(e.mr.Bytes(), msg)
	if _, err := e.qp.PostSend([]vfrdma.SendWR{wr}, 0); err != nil {
		return "", err
	}
	var got string
	wcs := make([]vfrdma.WC, 4)
	for done := 0; done < 2; {
		if err := e.cq.Wait(ctx); err != nil {
			return "", err
		}
		n, err := e.cq.Poll(wcs)
		if err != nil {
			return "", err
		}
		for _, wc := range wcs[:n] {
			if wc.Status != vfrdma.WCSuccess {
				return "", fmt.Errorf("completion %+v", wc)
			}
			if wc.Opcode == vfrdma.WCRecv {
				got = string(e.mr.Bytes()[recvAt+room : recvAt+int(wc.ByteLen)])
			}
		}
		done += n
	}
	return got, nil
}

// Two QPs on two device models, each driven as its own process would,
// connect through the package and pass a message each way, RC and UD, in
// both formats. One end (the server, or the client) posts its receive
// late, before Ready; each sends at once after Ready: no RNR NAK and no
// datagram lost for want of a receive.
func TestConnectTwoModelQPsReceivesPostedBeforeTheBarrier(t *testing.T) {
	const late = 50 * time.Millisecond
	for _, typ := range []vfrdma.QPType{vfrdma.RC, vfrdma.UD} {
		for _, f := range []connect.Format{connect.Native, connect.RDMACore} {
			for _, slow := range []string{"server", "client"} {
				t.Run(fmt.Sprintf("%v/%v/slow %s", typ, f, slow), func(t *testing.T) {
					srvDelay, cliDelay := late, time.Duration(0)
					if slow == "client" {
						srvDelay, cliDelay = cliDelay, srvDelay
					}
					ctx := withTimeout(t, 10*time.Second)
					fab := pvsim.NewFabric()
					srvEnd, cliEnd := newEnd(t, ctx, fab, typ), newEnd(t, ctx, fab, typ)
					opts := &connect.Options{Format: f}
					ln, err := connect.Listen(ctx, "127.0.0.1:0", opts)
					require.NoError(t, err)
					defer ln.Close()

					var srvGot, cliGot string
					srvErr, cliErr := both(func() error {
						c, err := ln.Accept(ctx)
						if err != nil {
							return err
						}
						defer c.Close()
						srvGot, err = srvEnd.talk(ctx, c, "from the server", srvDelay)
						return err
					}, func() error {
						c, err := connect.Dial(ctx, ln.Addr().String(), opts)
						if err != nil {
							return err
						}
						defer c.Close()
						cliGot, err = cliEnd.talk(ctx, c, "from the client", cliDelay)
						return err
					})
					require.NoError(t, srvErr, "server")
					require.NoError(t, cliErr, "client")
					assert.Equal(t, "from the client", srvGot)
					assert.Equal(t, "from the server", cliGot)
					for name, e := range map[string]*end{"server": srvEnd, "client": cliEnd} {
						s := e.m.Stats()
						assert.Zero(t, s.RNRNaks, "%s: RNR NAKs", name)
						assert.Zero(t, s.UDNoRecv, "%s: datagrams without a receive", name)
						assert.Zero(t, s.Dropped, "%s: packets dropped (a QP not ready yet)", name)
						assert.Zero(t, s.Retransmits, "%s: retransmissions", name)
					}
				})
			}
		}
	}
}
