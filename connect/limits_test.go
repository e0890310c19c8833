package connect_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/connect"
)

// atLimit is n endpoints, each with its fields at their bounds.
func atLimit(n int) []connect.Endpoint {
	eps := make([]connect.Endpoint, n)
	for i := range eps {
		eps[i] = connect.Endpoint{QPN: 0xffffff - uint32(i), PSN: 0xffffff, GID: gidA, MTU: 4096, QKey: 0xffffffff, LID: 0xffff}
		if i%2 == 1 {
			eps[i].MTU = 256
		}
	}
	return eps
}

// Every bound of the native format holds at the bound: MaxEndpoints
// endpoints with their fields at their bounds (QPN and PSN 0xffffff, path
// MTU 4096 and 256), MaxData bytes of data, a barrier name of
// MaxBarrierName bytes, both ways.
func TestTheNativeBoundsHoldAtTheBound(t *testing.T) {
	ctx := withTimeout(t, 30*time.Second)
	srv, cli := pair(t, ctx, nil)
	data := bytes.Repeat([]byte{0xa5}, connect.MaxData)
	name := strings.Repeat("n", connect.MaxBarrierName)
	in := connect.Info{Endpoints: atLimit(connect.MaxEndpoints), Data: data}
	var fromCli, fromSrv connect.Info
	srvErr, cliErr := both(func() (err error) {
		if fromCli, err = srv.Exchange(ctx, in); err == nil {
			err = srv.Barrier(ctx, name)
		}
		return err
	}, func() (err error) {
		if fromSrv, err = cli.Exchange(ctx, in); err == nil {
			err = cli.Barrier(ctx, name)
		}
		return err
	})
	require.NoError(t, srvErr)
	require.NoError(t, cliErr)
	assert.Equal(t, in, fromCli)
	assert.Equal(t, in, fromSrv)
}

// One past a bound, this end's Info or barrier name is refused before
// anything is sent (vfrdma.ErrInvalid), in every format; the Conn goes on.
func TestOnePastABoundThisEndsInfoIsRefused(t *testing.T) {
	one := func(e connect.Endpoint) connect.Info { return connect.Info{Endpoints: []connect.Endpoint{e}} }
	for _, tc := range []struct {
		name string
		f    connect.Format
		in   connect.Info
		want string
	}{
		{"endpoints", connect.Native, connect.Info{Endpoints: atLimit(connect.MaxEndpoints + 1)}, "4097 endpoints: at most 4096"},
		{"data", connect.Native, connect.Info{Data: make([]byte, connect.MaxData+1)}, "65537 bytes of data: at most 65536"},
		{"QPN", connect.Native, one(connect.Endpoint{QPN: 1 << 24}), "QPN 0x1000000"},
		{"QPN 0", connect.Native, one(connect.Endpoint{}), "QPN 0x0"},
		{"PSN", connect.Native, one(connect.Endpoint{QPN: 1, PSN: 1 << 24}), "PSN 0x1000000"},
		{"MTU above", connect.Native, one(connect.Endpoint{QPN: 1, MTU: 8192}), "path MTU 8192"},
		{"MTU below", connect.Native, one(connect.Endpoint{QPN: 1, MTU: 128}), "path MTU 128"},
		{"rdma-core endpoints", connect.RDMACore, connect.Info{Endpoints: atLimit(2)}, "2 endpoints: rdma-core's rc/ud pingpong exchange carries one"},
		{"srq endpoints", connect.RDMACoreSRQ, connect.Info{Endpoints: atLimit(connect.RDMACoreSRQMessages + 1)}, "257 endpoints: ibv_srq_pingpong's exchange carries 1 to 256"},
		{"srq none", connect.RDMACoreSRQ, connect.Info{}, "0 endpoints"},
		{"rdma-core data", connect.RDMACore, connect.Info{Endpoints: atLimit(1), Data: []byte{1}}, "1 bytes of data"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := withTimeout(t, 10*time.Second)
			_, cli := pair(t, ctx, &connect.Options{Format: tc.f})
			_, err := cli.Exchange(ctx, tc.in)
			require.ErrorIs(t, err, vfrdma.ErrInvalid)
			assert.ErrorContains(t, err, tc.want)
		})
	}
	ctx := withTimeout(t, 10*time.Second)
	srv, cli := pair(t, ctx, nil)
	srvErr, cliErr := both(func() error { return exchange(ctx, srv) }, func() error { return exchange(ctx, cli) })
	require.NoError(t, srvErr)
	require.NoError(t, cliErr)
	err := cli.Barrier(ctx, strings.Repeat("n", connect.MaxBarrierName+1))
	require.ErrorIs(t, err, vfrdma.ErrInvalid)
	assert.ErrorContains(t, err, "a barrier name of 256 bytes: at most 255")
}

// ibv_srq_pingpong's exchange carries 1 to RDMACoreSRQMessages endpoints:
// both bounds go across.
func TestTheSRQBoundsHoldAtTheBound(t *testing.T) {
	for _, n := range []int{1, connect.RDMACoreSRQMessages} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			ctx := withTimeout(t, 10*time.Second)
			srv, cli := pair(t, ctx, &connect.Options{Format: connect.RDMACoreSRQ})
			in := connect.Info{Endpoints: atLimit(n)}
			var fromCli, fromSrv connect.Info
			srvErr, cliErr := both(func() (err error) {
				if fromCli, err = srv.Exchange(ctx, in); err == nil {
					err = srv.Ready(ctx)
				}
				return err
			}, func() (err error) {
				if fromSrv, err = cli.Exchange(ctx, in); err == nil {
					err = cli.Ready(ctx)
				}
				return err
			})
			require.NoError(t, srvErr)
			require.NoError(t, cliErr)
			assert.Equal(t, carried(in.Endpoints), fromCli.Endpoints)
			assert.Equal(t, carried(in.Endpoints), fromSrv.Endpoints)
		})
	}
}

// One past a bound, what the peer sends is refused (ErrProtocol), with the
// bound named; at the bound it is taken.
func TestOnePastABoundThePeersMessageIsRefused(t *testing.T) {
	good := connect.Endpoint{QPN: 1, GID: gidA}
	for _, tc := range []struct {
		name string
		sent []byte
		want string // "" for taken
	}{
		{"endpoints at the bound", nativeMsg(version, 1, helloPayload(connect.MaxEndpoints, atLimit(connect.MaxEndpoints), nil)), ""},
		{"endpoints one past", nativeMsg(version, 1, helloPayload(connect.MaxEndpoints+1, atLimit(connect.MaxEndpoints+1), nil)), "the peer offers 4097 endpoints, at most 4096"},
		{"data at the bound", nativeMsg(version, 1, helloPayload(0, nil, make([]byte, connect.MaxData))), ""},
		{"data one past", nativeMsg(version, 1, helloPayload(0, nil, make([]byte, connect.MaxData+1))), "65537 bytes of data, at most 65536"},
		{"QPN at the bound", nativeMsg(version, 1, helloPayload(1, []connect.Endpoint{{QPN: 0xffffff}}, nil)), ""},
		{"QPN one past", nativeMsg(version, 1, helloPayload(1, []connect.Endpoint{{QPN: 1 << 24}}, nil)), "QPN 0x1000000"},
		{"PSN at the bound", nativeMsg(version, 1, helloPayload(1, []connect.Endpoint{{QPN: 1, PSN: 0xffffff}}, nil)), ""},
		{"PSN one past", nativeMsg(version, 1, helloPayload(1, []connect.Endpoint{{QPN: 1, PSN: 1 << 24}}, nil)), "PSN 0x1000000"},
		{"MTU at the bound", nativeMsg(version, 1, helloPayload(1, []connect.Endpoint{{QPN: 1, MTU: 4096}}, nil)), ""},
		{"MTU one past", nativeMsg(version, 1, helloPayload(1, []connect.Endpoint{{QPN: 1, MTU: 8192}}, nil)), "path MTU 8192"},
		{"barrier name at the bound", append(nativeMsg(version, 1, helloPayload(1, []connect.Endpoint{good}, nil)), nativeMsg(version, 2, bytes.Repeat([]byte("n"), connect.MaxBarrierName))...), ""},
		{"barrier name one past", append(nativeMsg(version, 1, helloPayload(1, []connect.Endpoint{good}, nil)), nativeMsg(version, 2, bytes.Repeat([]byte("n"), connect.MaxBarrierName+1))...), "a frame of 256 bytes, at most 255 here"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			barrier := strings.HasPrefix(tc.name, "barrier")
			_, err := fromRawPeer(t, connect.Native, tc.sent, func(ctx context.Context, c *connect.Conn) error {
				if err := exchange(ctx, c); err != nil || !barrier {
					return err
				}
				return c.Barrier(ctx, strings.Repeat("n", connect.MaxBarrierName))
			})
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, connect.ErrProtocol)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

// ReadFrame takes a frame of its limit's length and refuses one byte more.
func TestReadFrameTakesItsLimitAndRefusesOneMore(t *testing.T) {
	for _, limit := range []int{0, 10, 64 << 10} {
		var buf bytes.Buffer
		require.NoError(t, connect.WriteFrame(&buf, make([]byte, limit)))
		got, err := connect.ReadFrame(&buf, limit)
		require.NoError(t, err, limit)
		assert.Len(t, got, limit)
		buf.Reset()
		require.NoError(t, connect.WriteFrame(&buf, make([]byte, limit+1)))
		_, err = connect.ReadFrame(&buf, limit)
		require.ErrorIs(t, err, connect.ErrProtocol, limit)
		assert.ErrorContains(t, err, fmt.Sprintf("a frame of %d bytes, at most %d here", limit+1, limit))
	}
}

// Ready runs once per Conn: a second Ready is refused (vfrdma.ErrInvalid)
// and leaves the Conn whole, in every format, at either end.
func TestASecondReadyIsRefused(t *testing.T) {
	for _, f := range []connect.Format{connect.Native, connect.RDMACore} {
		t.Run(f.String(), func(t *testing.T) {
			ctx := withTimeout(t, 10*time.Second)
			srv, cli := pair(t, ctx, &connect.Options{Format: f})
			srvErr, cliErr := both(func() error { return exchangeReady(ctx, srv) }, func() error { return exchangeReady(ctx, cli) })
			require.NoError(t, srvErr)
			require.NoError(t, cliErr)
			for _, c := range []*connect.Conn{srv, cli} {
				err := c.Ready(ctx)
				require.ErrorIs(t, err, vfrdma.ErrInvalid)
				assert.ErrorContains(t, err, "Ready runs once per Conn")
			}
			if f == connect.Native {
				srvErr, cliErr = both(func() error { return srv.Barrier(ctx, "after") }, func() error { return cli.Barrier(ctx, "after") })
				assert.NoError(t, srvErr, "the Conn goes on")
				assert.NoError(t, cliErr)
			}
		})
	}
}

// After Close every step returns vfrdma.ErrClosed: on a fresh Conn, after
// an exchange, and on a Conn an error broke; Accept after the Listener's
// Close likewise.
func TestEveryCallAfterCloseIsErrClosed(t *testing.T) {
	ctx := withTimeout(t, 10*time.Second)
	calls := func(c *connect.Conn) map[string]error {
		_, xerr := c.Exchange(ctx, connect.Info{Endpoints: []connect.Endpoint{{QPN: 1, GID: gidA}}})
		return map[string]error{"Exchange": xerr, "Ready": c.Ready(ctx), "Barrier": c.Barrier(ctx, "b")}
	}
	srv, cli := pair(t, ctx, nil)
	require.NoError(t, cli.Close())
	for name, err := range calls(cli) {
		assert.ErrorIs(t, err, vfrdma.ErrClosed, "fresh: %s", name)
	}
	// srv: its peer closed, so its exchange breaks; then Close.
	require.Error(t, exchange(ctx, srv))
	require.NoError(t, srv.Close())
	for name, err := range calls(srv) {
		assert.ErrorIs(t, err, vfrdma.ErrClosed, "broken: %s", name)
	}
	srv, cli = pair(t, ctx, nil)
	srvErr, cliErr := both(func() error { return exchangeReady(ctx, srv) }, func() error { return exchangeReady(ctx, cli) })
	require.NoError(t, srvErr)
	require.NoError(t, cliErr)
	require.NoError(t, srv.Close())
	for name, err := range calls(srv) {
		assert.ErrorIs(t, err, vfrdma.ErrClosed, "after Ready: %s", name)
	}

	ln, err := connect.Listen(ctx, "127.0.0.1:0", nil)
	require.NoError(t, err)
	require.NoError(t, ln.Close())
	_, err = ln.Accept(ctx)
	assert.ErrorIs(t, err, vfrdma.ErrClosed)
}

// Close ends a step under way on another goroutine: the step returns
// vfrdma.ErrClosed (and the network's net.ErrClosed).
func TestCloseEndsAStepUnderWay(t *testing.T) {
	ctx := withTimeout(t, 10*time.Second)
	srv, _ := pair(t, ctx, nil)
	time.AfterFunc(50*time.Millisecond, func() { srv.Close() })
	_, err := srv.Exchange(ctx, connect.Info{})
	require.ErrorIs(t, err, vfrdma.ErrClosed)
	assert.ErrorIs(t, err, net.ErrClosed)
	assert.NoError(t, srv.Close(), "Close is idempotent")

	ln, err := connect.Listen(ctx, "127.0.0.1:0", nil)
	require.NoError(t, err)
	time.AfterFunc(50*time.Millisecond, func() { ln.Close() })
	_, err = ln.Accept(ctx)
	require.ErrorIs(t, err, vfrdma.ErrClosed)
}

// A Conn is single-owner and a Listener's Accept takes one caller at a
// time: a call while another runs is refused with vfrdma.ErrBusy, and the
// one under way goes on.
func TestACallWhileAnotherRunsIsErrBusy(t *testing.T) {
	ctx := withTimeout(t, 10*time.Second)
	srv, cli := pair(t, ctx, &connect.Options{ExchangeTimeout: time.Minute}) // the client's hello comes once the probe saw ErrBusy
	exchanged := make(chan error, 1)
	go func() { exchanged <- exchange(ctx, srv) }() // waits for the client's hello
	require.Eventually(t, func() bool {
		return errors.Is(srv.Ready(ctx), vfrdma.ErrBusy)
	}, 5*time.Second, time.Millisecond, "Ready while Exchange runs")
	_, err := srv.Exchange(ctx, connect.Info{})
	assert.ErrorIs(t, err, vfrdma.ErrBusy)
	require.NoError(t, exchange(ctx, cli))
	require.NoError(t, <-exchanged, "the step under way went on")

	ln, err := connect.Listen(ctx, "127.0.0.1:0", nil)
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan error, 1)
	go func() {
		for {
			c, err := ln.Accept(ctx)
			if errors.Is(err, vfrdma.ErrBusy) { // the probe below held it
				continue
			}
			if err == nil {
				c.Close()
			}
			accepted <- err
			return
		}
	}()
	done, cancel := context.WithCancel(ctx)
	cancel()
	require.Eventually(t, func() bool {
		_, err := ln.Accept(done)
		return errors.Is(err, vfrdma.ErrBusy)
	}, 5*time.Second, time.Millisecond, "Accept while Accept runs")
	c, err := connect.Dial(ctx, ln.Addr().String(), nil)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, <-accepted, "the Accept under way went on")
}
