package main

import (
	"bytes"
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

// silentPeer is a pingpong server that connects n RC QPs to the client's
// and posts their receives, and then never answers: on a model on fab,
// over connect's native exchange on ln. It runs until done is closed.
func silentPeer(ctx context.Context, fab *pvsim.Fabric, ln *connect.Listener, n int, done <-chan struct{}) error {
	c, err := ln.Accept(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	m, err := pvsim.New(pvsim.Config{Fabric: fab})
	if err != nil {
		return err
	}
	d, err := vfrdma.OpenFunction(m, nil)
	if err != nil {
		m.Close()
		return err
	}
	defer d.Close()
	pd, err := d.AllocPD(ctx)
	if err != nil {
		return err
	}
	cq, err := d.CreateCQ(ctx, 64)
	if err != nil {
		return err
	}
	mr, err := pd.AllocMR(ctx, 1<<16, vfrdma.AccessLocalWrite)
	if err != nil {
		return err
	}
	var qps []*vfrdma.QP
	var mine connect.Info
	for range n {
		qp, err := pd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: cq, RecvCQ: cq, SignalAll: true})
		if err != nil {
			return err
		}
		qps = append(qps, qp)
		mine.Endpoints = append(mine.Endpoints, connect.Endpoint{QPN: qp.QPN(), GID: d.GID()})
	}
	peer, err := c.Exchange(ctx, mine)
	if err != nil {
		return err
	}
	if len(peer.Endpoints) != n {
		return fmt.Errorf("the client offers %d QPs, want %d", len(peer.Endpoints), n)
	}
	for i, qp := range qps {
		if err := qp.Connect(ctx, peer.Endpoints[i].Remote(), 0); err != nil {
			return err
		}
		for k := range 4 {
			if _, err := qp.PostRecv([]vfrdma.RecvWR{{WRID: uint64(k), SGEs: []vfrdma.SGE{mr.SGE((i*4+k)*4096, 4096)}}}, 0); err != nil {
				return err
			}
		}
	}
	if err := c.Ready(ctx); err != nil {
		return err
	}
	<-done
	return nil
}

// A ping-pong whose peer stops answering fails once --stall passed with
// no completion, saying so ("stalled: no completion", which the bench's
// loss test looks for) and how far it got: spinning or asleep, and with
// --srq.
func TestPingpongReportsAStallWhenThePeerGoesSilent(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		qps  int
		want string
	}{
		{"spin", nil, 1, "stalled: no completion for 300ms after 0 round trips (this end completed 1 sends and 0 receives)"},
		{"events", []string{"--events"}, 1, "stalled: no completion for 300ms after 0 round trips (this end completed 1 sends and 0 receives)"},
		{"srq", []string{"--srq", "2"}, 2, "stalled: no completion for 300ms (this end completed 2 sends and 0 receives, posted 0 sends)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			fab := pvsim.NewFabric()
			ln, err := connect.Listen(ctx, "127.0.0.1:0", nil)
			require.NoError(t, err)
			defer ln.Close()
			done := make(chan struct{})
			peerErr := make(chan error, 1)
			go func() { peerErr <- silentPeer(ctx, fab, ln, tc.qps, done) }()
			var out bytes.Buffer
			e := &env{out: &out, model: "v20", fabric: fab}
			args := append([]string{"--connect", ln.Addr().String(), "--stall", "300ms", "--iters", "10", "--size", "64"}, tc.args...)
			err = cmdPingpong(e, args)
			close(done)
			require.NoError(t, <-peerErr)
			require.Error(t, err)
			assert.ErrorContains(t, err, tc.want)
			assert.Empty(t, out.String())
		})
	}
}
