package connect_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/connect"
)

func withTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// freeAddr returns a loopback address nobody listens on (yet).
func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

var (
	gidA = vfrdma.GID{0xfe, 0x80, 8: 0x50, 9: 0x54, 10: 0x00, 11: 0xff, 12: 0xfe, 13: 0x12, 14: 0x34, 15: 0x56}
	gidB = vfrdma.GID{0xfe, 0x80, 8: 0x50, 9: 0x54, 10: 0x00, 11: 0xff, 12: 0xfe, 13: 0x65, 14: 0x43, 15: 0x21}
)

// pair listens on loopback and returns the server's and the client's
// Conn, connected.
func pair(t *testing.T, ctx context.Context, opts *connect.Options) (srv, cli *connect.Conn) {
	t.Helper()
	ln, err := connect.Listen(ctx, "127.0.0.1:0", opts)
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan *connect.Conn, 1)
	go func() {
		c, err := ln.Accept(ctx)
		assert.NoError(t, err)
		accepted <- c
	}()
	cli, err = connect.Dial(ctx, ln.Addr().String(), opts)
	require.NoError(t, err)
	srv = <-accepted
	require.NotNil(t, srv)
	t.Cleanup(func() { srv.Close(); cli.Close() })
	return srv, cli
}

// both runs f for the server's end on a goroutine and g for the client's
// here, and returns their errors.
func both(srvf, clif func() error) (srvErr, cliErr error) {
	done := make(chan error, 1)
	go func() { done <- srvf() }()
	cliErr = clif()
	return <-done, cliErr
}

// The two ends swap their endpoints and data, both ways, in order, then
// meet at Ready and at named barriers.
func TestExchangeSwapsEndpointsAndDataBothWays(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx := withTimeout(t, 10*time.Second)
	srv, cli := pair(t, ctx, nil)
	assert.True(t, srv.Server())
	assert.False(t, cli.Server())
	assert.Equal(t, connect.Native, cli.Format())

	srvInfo := connect.Info{
		Endpoints: []connect.Endpoint{{QPN: 0x11, GID: gidA, PSN: 0xabcdef, MTU: 1024, QKey: 7}, {QPN: 0xffffff, GID: gidA, PSN: 0, MTU: 4096}},
		Data:      []byte("rkey=0x1234"),
	}
	cliInfo := connect.Info{Endpoints: []connect.Endpoint{{QPN: 0x22, GID: gidB, PSN: 1, LID: 3}}}
	var fromCli, fromSrv connect.Info
	srvErr, cliErr := both(func() (err error) {
		if fromCli, err = srv.Exchange(ctx, srvInfo); err != nil {
			return err
		}
		if err = srv.Ready(ctx); err != nil {
			return err
		}
		return srv.Barrier(ctx, "bench-1")
	}, func() (err error) {
		if fromSrv, err = cli.Exchange(ctx, cliInfo); err != nil {
			return err
		}
		if err = cli.Ready(ctx); err != nil {
			return err
		}
		return cli.Barrier(ctx, "bench-1")
	})
	require.NoError(t, srvErr)
	require.NoError(t, cliErr)
	assert.Equal(t, cliInfo, fromCli)
	assert.Equal(t, srvInfo, fromSrv)
	r := fromSrv.Endpoints[0].Remote()
	assert.Equal(t, vfrdma.Remote{QPN: 0x11, GID: gidA, PSN: 0xabcdef}, r)
}

// Ready is a barrier: neither end's Ready returns before the other end
// called it, whichever end comes first.
func TestReadyReturnsOnlyOnceBothEndsCalledIt(t *testing.T) {
	for _, late := range []string{"server", "client"} {
		t.Run(late+" late", func(t *testing.T) {
			ctx := withTimeout(t, 10*time.Second)
			srv, cli := pair(t, ctx, nil)
			var srvIn, cliIn atomic.Bool
			run := func(c *connect.Conn, in, other *atomic.Bool, qpn uint32, delay bool) func() error {
				return func() error {
					if _, err := c.Exchange(ctx, connect.Info{Endpoints: []connect.Endpoint{{QPN: qpn, GID: gidA}}}); err != nil {
						return err
					}
					if delay {
						time.Sleep(50 * time.Millisecond) // posting receives, slowly
					}
					in.Store(true)
					if err := c.Ready(ctx); err != nil {
						return err
					}
					if !other.Load() {
						return errors.New("Ready returned before the peer called it")
					}
					return nil
				}
			}
			srvErr, cliErr := both(run(srv, &srvIn, &cliIn, 1, late == "server"), run(cli, &cliIn, &srvIn, 2, late == "client"))
			require.NoError(t, srvErr)
			require.NoError(t, cliErr)
		})
	}
}

// Dial retries while nobody listens, telling Progress of each failed
// attempt, and connects once the server is up.
func TestDialRetriesUntilThePeerIsUp(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx := withTimeout(t, 10*time.Second)
	addr := freeAddr(t)
	var mu sync.Mutex
	var seen []connect.Progress
	twice := make(chan struct{})
	opts := &connect.Options{Retry: 10 * time.Millisecond, Progress: func(p connect.Progress) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, p)
		if len(seen) == 2 {
			close(twice)
		}
	}}
	dialed := make(chan error, 1)
	var cli *connect.Conn
	go func() {
		var err error
		cli, err = connect.Dial(ctx, addr, opts)
		dialed <- err
	}()
	select {
	case <-twice:
	case <-ctx.Done():
		t.Fatal("Progress was not called twice")
	}
	ln, err := connect.Listen(ctx, addr, nil)
	require.NoError(t, err)
	defer ln.Close()
	srv, err := ln.Accept(ctx)
	require.NoError(t, err)
	defer srv.Close()
	require.NoError(t, <-dialed)
	defer cli.Close()
	assert.Equal(t, srv.LocalAddr().String(), cli.RemoteAddr().String())

	mu.Lock()
	defer mu.Unlock()
	for i, p := range seen {
		assert.Equal(t, addr, p.Addr)
		assert.Equal(t, i+1, p.Attempt)
		assert.ErrorIs(t, p.Err, syscall.ECONNREFUSED)
	}
}

// A dial that never finds the peer ends with its context, and the error
// names the address, the context's end and the last failure.
func TestDialEndsWithItsContext(t *testing.T) {
	ctx := withTimeout(t, 200*time.Millisecond)
	addr := freeAddr(t)
	_, err := connect.Dial(ctx, addr, &connect.Options{Retry: 10 * time.Millisecond})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorIs(t, err, syscall.ECONNREFUSED, "the last attempt's failure is kept")
	var ce *connect.Error
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "dial", ce.Op)
	assert.Equal(t, addr, ce.Addr)
	assert.Contains(t, err.Error(), addr)
}

// A failure that is not a peer still starting ends the dial at once.
func TestDialGivesUpOnWhatRetriesCannotFix(t *testing.T) {
	ctx := withTimeout(t, 5*time.Second)
	calls := 0
	_, err := connect.Dial(ctx, "127.0.0.1:notaport", &connect.Options{Progress: func(connect.Progress) { calls++ }})
	require.Error(t, err)
	assert.NotErrorIs(t, err, context.DeadlineExceeded)
	assert.Zero(t, calls)
}

// Accept ends when its context is cancelled.
func TestAcceptEndsWithItsContext(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ln, err := connect.Listen(context.Background(), "127.0.0.1:0", nil)
	require.NoError(t, err)
	defer ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err = ln.Accept(ctx)
	require.ErrorIs(t, err, context.Canceled)
	assert.Contains(t, err.Error(), ln.Addr().String())

	// The listener still works for a later Accept.
	ctx2 := withTimeout(t, 5*time.Second)
	go func() {
		if c, err := connect.Dial(ctx2, ln.Addr().String(), nil); err == nil {
			c.Close()
		}
	}()
	c, err := ln.Accept(ctx2)
	require.NoError(t, err)
	c.Close()
	assert.NoError(t, ln.Close())
	assert.NoError(t, ln.Close(), "Close is idempotent")
}

// An exchange whose peer stays silent ends with its context, cancelled or
// past its deadline; the error names the step and the peer, and the Conn
// is broken after it.
func TestExchangeEndsWithItsContext(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx := withTimeout(t, 10*time.Second)
	srv, cli := pair(t, ctx, nil)
	mine := connect.Info{Endpoints: []connect.Endpoint{{QPN: 1, GID: gidA}}}

	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err := srv.Exchange(cctx, mine) // the client never sends
	require.ErrorIs(t, err, context.Canceled)
	var ce *connect.Error
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "exchange", ce.Op)
	assert.Equal(t, cli.LocalAddr().String(), ce.Addr)
	assert.Equal(t, err, srv.Ready(ctx), "the Conn is broken: its error comes back")

	dctx, cancel2 := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel2()
	_, err = cli.Exchange(dctx, mine) // the server never answers
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// Calls out of order and Infos a format cannot send are refused with
// ErrInvalid, before anything is sent; the Conn goes on.
func TestMisuseIsRefusedAndLeavesTheConnWhole(t *testing.T) {
	ctx := withTimeout(t, 10*time.Second)
	srv, cli := pair(t, ctx, nil)
	assert.ErrorIs(t, cli.Ready(ctx), vfrdma.ErrInvalid, "Ready before Exchange")
	assert.ErrorIs(t, cli.Barrier(ctx, "x"), vfrdma.ErrInvalid, "Barrier before Exchange")
	for _, bad := range []connect.Info{
		{Endpoints: []connect.Endpoint{{QPN: 0}}},
		{Endpoints: []connect.Endpoint{{QPN: 1 << 24}}},
		{Endpoints: []connect.Endpoint{{QPN: 1, PSN: 1 << 24}}},
		{Endpoints: []connect.Endpoint{{QPN: 1, MTU: 1500}}},
		{Endpoints: make([]connect.Endpoint, connect.MaxEndpoints+1)},
		{Data: make([]byte, connect.MaxData+1)},
	} {
		_, err := cli.Exchange(ctx, bad)
		assert.ErrorIs(t, err, vfrdma.ErrInvalid)
	}
	srvErr, cliErr := both(func() error {
		_, err := srv.Exchange(ctx, connect.Info{})
		return err
	}, func() error {
		_, err := cli.Exchange(ctx, connect.Info{})
		return err
	})
	require.NoError(t, srvErr)
	require.NoError(t, cliErr)
	assert.ErrorIs(t, cli.Barrier(ctx, string(make([]byte, connect.MaxBarrierName+1))), vfrdma.ErrInvalid)

	for _, f := range []connect.Format{connect.RDMACore, connect.RDMACoreSRQ} {
		rsrv, rcli := pair(t, ctx, &connect.Options{Format: f})
		_, err := rcli.Exchange(ctx, connect.Info{})
		assert.ErrorIs(t, err, vfrdma.ErrInvalid, "%v: no endpoint", f)
		_, err = rcli.Exchange(ctx, connect.Info{Endpoints: []connect.Endpoint{{QPN: 1, GID: gidA}}, Data: []byte{1}})
		assert.ErrorIs(t, err, vfrdma.ErrInvalid, "%v: data", f)
		assert.ErrorIs(t, rcli.Barrier(ctx, "x"), vfrdma.ErrNotSupported, "%v: Barrier", f)
		assert.ErrorIs(t, rsrv.Ready(ctx), vfrdma.ErrInvalid, "%v: Ready before Exchange", f)
	}
	rsrv, rcli := pair(t, ctx, &connect.Options{Format: connect.RDMACore})
	_, err := rcli.Exchange(ctx, connect.Info{Endpoints: []connect.Endpoint{{QPN: 1, GID: gidA}, {QPN: 2, GID: gidA}}})
	assert.ErrorIs(t, err, vfrdma.ErrInvalid, "rc/ud pingpong: one endpoint")
	one := connect.Info{Endpoints: []connect.Endpoint{{QPN: 1, GID: gidA}}}
	srvErr, cliErr = both(func() error {
		if _, err := rsrv.Exchange(ctx, one); err != nil {
			return err
		}
		return rsrv.Ready(ctx) // its address goes out here
	}, func() error {
		if _, err := rcli.Exchange(ctx, one); err != nil {
			return err
		}
		return rcli.Ready(ctx)
	})
	require.NoError(t, srvErr)
	require.NoError(t, cliErr)
	_, err = rcli.Exchange(ctx, one)
	assert.ErrorIs(t, err, vfrdma.ErrInvalid, "rdma-core: Exchange twice")
}

// In the native format a second Exchange swaps a second set of endpoints,
// after Ready too, with a Barrier as its Ready.
func TestNativeExchangeRunsAgain(t *testing.T) {
	ctx := withTimeout(t, 10*time.Second)
	srv, cli := pair(t, ctx, nil)
	var got [2][2]connect.Info
	side := func(c *connect.Conn, qpn uint32, got *[2]connect.Info) func() error {
		return func() (err error) {
			if got[0], err = c.Exchange(ctx, connect.Info{Endpoints: []connect.Endpoint{{QPN: qpn, GID: gidA}}}); err != nil {
				return err
			}
			if err = c.Ready(ctx); err != nil {
				return err
			}
			if got[1], err = c.Exchange(ctx, connect.Info{Data: []byte{byte(qpn)}}); err != nil {
				return err
			}
			return c.Barrier(ctx, "second set ready")
		}
	}
	srvErr, cliErr := both(side(srv, 1, &got[0]), side(cli, 2, &got[1]))
	require.NoError(t, srvErr)
	require.NoError(t, cliErr)
	assert.EqualValues(t, 2, got[0][0].Endpoints[0].QPN)
	assert.Equal(t, []byte{2}, got[0][1].Data)
	assert.EqualValues(t, 1, got[1][0].Endpoints[0].QPN)
	assert.Equal(t, []byte{1}, got[1][1].Data)
}

// A barrier with another name than the peer's fails at both ends: the end
// that found it says so, the other gets its refusal.
func TestBarrierNamesMustMatch(t *testing.T) {
	ctx := withTimeout(t, 10*time.Second)
	srv, cli := pair(t, ctx, nil)
	srvErr, cliErr := both(func() error {
		if _, err := srv.Exchange(ctx, connect.Info{}); err != nil {
			return err
		}
		return srv.Barrier(ctx, "row1")
	}, func() error {
		if _, err := cli.Exchange(ctx, connect.Info{}); err != nil {
			return err
		}
		return cli.Barrier(ctx, "row2")
	})
	require.ErrorIs(t, srvErr, connect.ErrProtocol)
	assert.ErrorContains(t, srvErr, `"row2"`)
	require.ErrorIs(t, cliErr, connect.ErrRefused)
	assert.ErrorContains(t, cliErr, `"row1"`, "the refusal carries the server's reason")
}

// Dial in the rdma-core formats adds rdma-core's port to a host given
// alone (the native format does not).
func TestRDMACoreAddressesDefaultToPingpongsPort(t *testing.T) {
	ctx := withTimeout(t, 100*time.Millisecond)
	c, err := connect.Dial(ctx, "127.0.0.1", &connect.Options{Format: connect.RDMACore, Retry: 10 * time.Millisecond})
	if err == nil { // someone listens there
		assert.Equal(t, "127.0.0.1:18515", c.RemoteAddr().String())
		c.Close()
		return
	}
	var ce *connect.Error
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "127.0.0.1:18515", ce.Addr)
	_, err = connect.Dial(context.Background(), "127.0.0.1", nil)
	assert.ErrorContains(t, err, "missing port")
}
