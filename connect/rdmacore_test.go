package connect_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/connect"
)

// The rdma-core formats round-trip between two ends of this package: the
// endpoints come through with their LID, QPN, PSN and GID, rdma-core's
// Q_Key and no MTU (the format does not carry it). The SRQ variant carries
// several, in order.
func TestRDMACoreFormatsRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		f        connect.Format
		srv, cli []connect.Endpoint
	}{
		{connect.RDMACore, []connect.Endpoint{{QPN: 0x11, GID: gidA, PSN: 0xdac0b0, MTU: 1024}}, []connect.Endpoint{{QPN: 0xfffffe, GID: gidB, PSN: 0, LID: 0xbeef, QKey: 9}}},
		{connect.RDMACoreSRQ, []connect.Endpoint{{QPN: 1, GID: gidA, PSN: 5}, {QPN: 2, GID: gidA, PSN: 6}, {QPN: 3, GID: gidA, PSN: 7}}, []connect.Endpoint{{QPN: 9, GID: gidB, PSN: 1}}},
		{connect.RDMACoreSRQ, make256(), make256()},
	} {
		t.Run(tc.f.String(), func(t *testing.T) {
			ctx := withTimeout(t, 10*time.Second)
			srv, cli := pair(t, ctx, &connect.Options{Format: tc.f})
			var fromCli, fromSrv connect.Info
			srvErr, cliErr := both(func() (err error) {
				if fromCli, err = srv.Exchange(ctx, connect.Info{Endpoints: tc.srv}); err == nil {
					err = srv.Ready(ctx)
				}
				return err
			}, func() (err error) {
				if fromSrv, err = cli.Exchange(ctx, connect.Info{Endpoints: tc.cli}); err == nil {
					err = cli.Ready(ctx)
				}
				return err
			})
			require.NoError(t, srvErr)
			require.NoError(t, cliErr)
			assert.Equal(t, carried(tc.cli), fromCli.Endpoints)
			assert.Equal(t, carried(tc.srv), fromSrv.Endpoints)
			assert.Nil(t, fromSrv.Data)
		})
	}
}

func make256() []connect.Endpoint {
	eps := make([]connect.Endpoint, connect.RDMACoreSRQMessages)
	for i := range eps {
		eps[i] = connect.Endpoint{QPN: uint32(100 + i), GID: gidB, PSN: uint32(i)}
	}
	return eps
}

// carried is what rdma-core's format carries of eps.
func carried(eps []connect.Endpoint) []connect.Endpoint {
	out := make([]connect.Endpoint, len(eps))
	for i, e := range eps {
		out[i] = connect.Endpoint{LID: e.LID, QPN: e.QPN, PSN: e.PSN, GID: e.GID, QKey: connect.RDMACoreQKey}
	}
	return out
}

// A client that does what ibv_rc_pingpong's client does on the wire:
// connect, write its 52-byte message, read the server's, write "done".
// The server's message goes out only at Ready (its receives are posted by
// then), so the client cannot send before.
func TestRDMACoreServerAnswersAPingpongClientAtReady(t *testing.T) {
	ctx := withTimeout(t, 10*time.Second)
	ln, err := connect.Listen(ctx, "127.0.0.1:0", &connect.Options{Format: connect.RDMACore})
	require.NoError(t, err)
	defer ln.Close()
	var answered atomic.Bool
	got := make(chan []byte, 1)
	go func() { // the C client
		c, err := net.Dial("tcp", ln.Addr().String())
		if !assert.NoError(t, err) {
			close(got)
			return
		}
		defer c.Close()
		_, _ = c.Write(rdmaCoreMsg(0, 0x123, 0xabc, gidAHex))
		msg := make([]byte, 52)
		_, err = io.ReadFull(c, msg)
		answered.Store(true)
		assert.NoError(t, err)
		_, _ = c.Write([]byte("done\x00"))
		got <- msg
	}()
	srv, err := ln.Accept(ctx)
	require.NoError(t, err)
	defer srv.Close()
	peer, err := srv.Exchange(ctx, connect.Info{Endpoints: []connect.Endpoint{{QPN: 0x456, GID: gidB, PSN: 0x789}}})
	require.NoError(t, err)
	assert.Equal(t, []connect.Endpoint{{QPN: 0x123, PSN: 0xabc, GID: gidA, QKey: connect.RDMACoreQKey}}, peer.Endpoints)
	time.Sleep(50 * time.Millisecond) // connecting the QP, posting receives
	assert.False(t, answered.Load(), "the server's address went out before Ready")
	require.NoError(t, srv.Ready(ctx))
	assert.Equal(t, "0000:000456:000789:fe80000000000000505400fffe654321\x00", string(<-got))
}

// A server that does what ibv_ud_pingpong's server does on the wire:
// accept, read the client's message, write its own, read "done".
func TestRDMACoreClientTalksToAPingpongServer(t *testing.T) {
	ctx := withTimeout(t, 10*time.Second)
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer raw.Close()
	type seen struct{ msg, done []byte }
	got := make(chan seen, 1)
	go func() { // the C server
		c, err := raw.Accept()
		if err != nil {
			close(got)
			return
		}
		defer c.Close()
		var s seen
		s.msg = make([]byte, 52)
		_, _ = io.ReadFull(c, s.msg)
		_, _ = c.Write(rdmaCoreMsg(0, 0x99, 0x42, gidAHex))
		s.done = make([]byte, 5)
		_, _ = io.ReadFull(c, s.done)
		got <- s
	}()
	cli, err := connect.Dial(ctx, raw.Addr().String(), &connect.Options{Format: connect.RDMACore})
	require.NoError(t, err)
	defer cli.Close()
	peer, err := cli.Exchange(ctx, connect.Info{Endpoints: []connect.Endpoint{{QPN: 0x77, GID: gidB, PSN: 0xfedcba}}})
	require.NoError(t, err)
	assert.Equal(t, []connect.Endpoint{{QPN: 0x99, PSN: 0x42, GID: gidA, QKey: connect.RDMACoreQKey}}, peer.Endpoints)
	require.NoError(t, cli.Ready(ctx))
	s := <-got
	assert.Equal(t, "0000:000077:fedcba:fe80000000000000505400fffe654321\x00", string(s.msg))
	assert.Equal(t, "done\x00", string(s.done))
}

// ibv_srq_pingpong's client writes 256 messages whatever its QP count (its
// QPs', then zeros) and reads 256: the server reads them all, returns the
// QPs named, and writes 256 of its own at Ready.
func TestRDMACoreSRQSpeaksSrqPingpongs256Messages(t *testing.T) {
	ctx := withTimeout(t, 10*time.Second)
	ln, err := connect.Listen(ctx, "127.0.0.1:0", &connect.Options{Format: connect.RDMACoreSRQ})
	require.NoError(t, err)
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() { // the C client, with two QPs
		c, err := net.Dial("tcp", ln.Addr().String())
		if !assert.NoError(t, err) {
			close(got)
			return
		}
		defer c.Close()
		var out []byte
		out = append(out, rdmaCoreMsg(0, 0x10, 1, gidAHex)...)
		out = append(out, rdmaCoreMsg(0, 0x11, 2, gidAHex)...)
		for range 254 {
			out = append(out, rdmaCoreMsg(0, 0, 0, strings.Repeat("0", 32))...)
		}
		_, _ = c.Write(out)
		in := make([]byte, 256*52)
		_, err = io.ReadFull(c, in)
		assert.NoError(t, err)
		_, _ = c.Write([]byte("done\x00"))
		got <- in
	}()
	srv, err := ln.Accept(ctx)
	require.NoError(t, err)
	defer srv.Close()
	mine := []connect.Endpoint{{QPN: 0x20, GID: gidB, PSN: 3}, {QPN: 0x21, GID: gidB, PSN: 4}}
	peer, err := srv.Exchange(ctx, connect.Info{Endpoints: mine})
	require.NoError(t, err)
	assert.Equal(t, []connect.Endpoint{
		{QPN: 0x10, PSN: 1, GID: gidA, QKey: connect.RDMACoreQKey},
		{QPN: 0x11, PSN: 2, GID: gidA, QKey: connect.RDMACoreQKey},
	}, peer.Endpoints)
	require.NoError(t, srv.Ready(ctx))
	in := <-got
	require.Len(t, in, 256*52)
	assert.Equal(t, "0000:000020:000003:fe80000000000000505400fffe654321\x00", string(in[:52]))
	assert.Equal(t, "0000:000021:000004:fe80000000000000505400fffe654321\x00", string(in[52:104]))
	zero := "0000:000000:000000:" + strings.Repeat("0", 32) + "\x00"
	assert.Equal(t, strings.Repeat(zero, 254), string(in[104:]), "zeros after its QPs, as srq_pingpong's")
}

// Upper-case hex, which rdma-core's reader takes, is taken too.
func TestRDMACoreReadsUpperCaseHex(t *testing.T) {
	_, err := fromRawPeer(t, connect.RDMACore, bytes.ToUpper(rdmaCoreMsg(0, 0xab, 0xcd, gidAHex)), func(ctx context.Context, c *connect.Conn) error {
		peer, err := c.Exchange(ctx, connect.Info{Endpoints: []connect.Endpoint{{QPN: 5, GID: gidB}}})
		if err == nil {
			assert.Equal(t, []connect.Endpoint{{QPN: 0xab, PSN: 0xcd, GID: gidA, QKey: connect.RDMACoreQKey}}, peer.Endpoints)
		}
		return err
	})
	require.NoError(t, err)
}
