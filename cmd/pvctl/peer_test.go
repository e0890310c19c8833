package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/connect"
	"github.com/vfrdma/vfrdma/pvsim"
)

// memRendezvous is the bench's rendezvous in memory: keys written once,
// Get waiting for them.
type memRendezvous struct {
	mu      sync.Mutex
	changed chan struct{} // closed and replaced at each Put
	kv      map[string]string
}

func newMemRendezvous() *memRendezvous {
	return &memRendezvous{changed: make(chan struct{}), kv: map[string]string{}}
}

func (m *memRendezvous) Put(key, value string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.kv[key]; ok {
		return errors.New("key " + key + " written twice")
	}
	m.kv[key] = value
	close(m.changed)
	m.changed = make(chan struct{})
	return nil
}

func (m *memRendezvous) Get(ctx context.Context, key string) (string, error) {
	for {
		m.mu.Lock()
		v, ok := m.kv[key]
		ch := m.changed
		m.mu.Unlock()
		if ok {
			return v, nil
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-ch:
		}
	}
}

func (m *memRendezvous) Close() error { return nil }

// Two VMs swap addresses and meet at barriers through the rendezvous; VM 0
// is the server, and a second exchange under another tag (as am makes)
// writes keys of its own. What goes across is connect's Info, endpoints,
// regions and data, as the native hello in base64.
func TestVMExchange(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r := newMemRendezvous()
	xs := [2]*vmExchange{{c: r, vm: 0, tag: "t"}, {c: r, vm: 1, tag: "t"}}
	assert.True(t, xs[0].server())
	assert.False(t, xs[1].server())
	info := func(i int) connect.Info {
		return connect.Info{Endpoints: []connect.Endpoint{{QPN: uint32(10 + i), GID: gidS, QKey: testQKey}},
			Regions: []connect.Region{{Addr: 0x1000, RKey: uint32(i), Len: 64}}, Data: []byte{byte(i)}}
	}
	for _, tag := range []string{"t", "t/am"} {
		var got [2]connect.Info
		var wg sync.WaitGroup
		for i, x := range xs {
			x := &vmExchange{c: x.c, vm: x.vm, tag: tag}
			wg.Go(func() {
				var err error
				got[i], err = x.swap(ctx, info(i))
				assert.NoError(t, err, "vm%d swap", i)
				assert.NoError(t, x.barrier(ctx, "done"), "vm%d barrier", i)
			})
		}
		wg.Wait()
		assert.Equal(t, info(1), got[0], tag)
		assert.Equal(t, info(0), got[1], tag)
		v, err := r.Get(ctx, tag+"/0")
		require.NoError(t, err)
		b, err := base64.StdEncoding.DecodeString(v)
		require.NoError(t, err, "the rendezvous holds base64")
		want, err := info(0).MarshalBinary()
		require.NoError(t, err)
		assert.Equal(t, want, b, "the rendezvous holds connect's native hello")
	}
}

// What the other VM wrote is checked as connect checks a peer's: not
// base64, or not a hello, is ErrProtocol.
func TestVMExchangeRefusesWhatIsNotAHello(t *testing.T) {
	for _, tc := range []struct{ name, value, want string }{
		{"not base64", "{\"qpn\":17}", "not base64"},
		{"not a hello", base64.StdEncoding.EncodeToString([]byte(`{"qpn":17}`)), "not vfrdma's exchange"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			r := newMemRendezvous()
			require.NoError(t, r.Put("t/0", tc.value))
			_, err := (&vmExchange{c: r, vm: 1, tag: "t"}).swap(ctx, connect.Info{})
			require.ErrorIs(t, err, connect.ErrProtocol)
			assert.ErrorContains(t, err, tc.want)
			assert.ErrorContains(t, err, "the other VM's address")
		})
	}
}

// A barrier the other VM never reaches ends with ctx.
func TestVMExchangeBarrierTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	x := &vmExchange{c: newMemRendezvous(), vm: 1, tag: "t"}
	require.ErrorIs(t, x.barrier(ctx, "alone"), context.DeadlineExceeded)
}

// The pingpong's pattern is byte(seq + 13i) at every size, written and
// checked a block at a time; a wrong byte anywhere is named by its index.
func TestPatternIsTheFormulaAndCheckNamesTheWrongByte(t *testing.T) {
	for _, size := range []int{0, 1, 255, 256, 257, 4096, 5000} {
		for _, seq := range []int{0, 1, 7, 255, 1000} {
			b := make([]byte, size)
			pattern(b, seq)
			for i := range b {
				require.Equal(t, byte(seq+i*13), b[i], "size %d seq %d byte %d", size, seq, i)
			}
			require.NoError(t, checkPattern(b, seq))
			if size == 0 {
				continue
			}
			for _, at := range []int{0, size / 2, size - 1} {
				b[at] ^= 0x40
				assert.ErrorContains(t, checkPattern(b, seq), fmt.Sprintf("byte %d is", at), "size %d seq %d", size, seq)
				b[at] ^= 0x40
			}
			assert.Error(t, checkPattern(b, seq+1), "the next message's pattern")
		}
	}
}

// lockedBuffer is a bytes.Buffer safe for the notes goroutine's writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A client whose server is not up retries for --wait-peer, saying on
// stderr what it waits for once after the first delay and then at every
// interval, and then fails naming the address and --wait-peer.
func TestClientSaysWhatItWaitsFor(t *testing.T) {
	addr := freeAddr(t)
	var notes lockedBuffer
	p := peerFlags{connect: addr, waitPeer: 500 * time.Millisecond, notes: &notes, noteFirst: 150 * time.Millisecond, noteEvery: 100 * time.Millisecond}
	start := time.Now()
	_, err := p.open(context.Background())
	require.Error(t, err)
	assert.GreaterOrEqual(t, time.Since(start), 500*time.Millisecond, "it retried until --wait-peer")
	assert.Contains(t, err.Error(), "no server at "+addr+" after --wait-peer 500ms (connection refused)")
	lines := strings.Split(strings.TrimSpace(notes.String()), "\n")
	assert.GreaterOrEqual(t, len(lines), 2, "%q", notes.String())
	assert.LessOrEqual(t, len(lines), 5, "one note, then one per interval: %q", notes.String())
	for _, l := range lines {
		assert.True(t, strings.HasPrefix(l, "pvctl: waiting for the server at "+addr+": connection refused; retrying ("), "%q", l)
		assert.Contains(t, l, "of --wait-peer 500ms)")
	}
	time.Sleep(250 * time.Millisecond)
	assert.Len(t, strings.Split(strings.TrimSpace(notes.String()), "\n"), len(lines), "no note once open returned")
}

// A server that is up before the first note leaves the client silent.
func TestClientSilentWhenTheServerComesSoon(t *testing.T) {
	addr := freeAddr(t)
	go func() {
		time.Sleep(100 * time.Millisecond)
		ln, err := net.Listen("tcp", addr)
		if !assert.NoError(t, err) {
			return
		}
		defer ln.Close()
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	var notes lockedBuffer
	p := peerFlags{connect: addr, waitPeer: 5 * time.Second, notes: &notes, noteFirst: 2 * time.Second}
	x, err := p.open(context.Background())
	require.NoError(t, err)
	x.close()
	assert.Empty(t, notes.String())
}

// A server waits for its client for --wait-peer, saying so.
func TestServerSaysWhatItWaitsFor(t *testing.T) {
	addr := freeAddr(t)
	var notes lockedBuffer
	p := peerFlags{listen: addr, waitPeer: 300 * time.Millisecond, notes: &notes, noteFirst: 100 * time.Millisecond, noteEvery: time.Hour}
	_, err := p.open(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "waiting for the client on "+addr+" (--wait-peer 300ms)")
	assert.Equal(t, 1, strings.Count(notes.String(), "\n"), "%q", notes.String())
	assert.Contains(t, notes.String(), "pvctl: waiting for the client on "+addr+" (")
}

// pvctl's --wait-peer and stderr reach the client's dial: through the
// command, the first note comes after 2 s.
func TestPingpongClientWaitsForItsServerOnStderr(t *testing.T) {
	addr := freeAddr(t)
	var out bytes.Buffer
	var notes lockedBuffer
	e := &env{out: &out, errOut: &notes, model: "v20", fabric: pvsim.NewFabric()}
	err := cmdPingpong(e, []string{"--connect", addr, "--wait-peer", "2500ms"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "after --wait-peer 2.5s")
	assert.Equal(t, 1, strings.Count(notes.String(), "\n"), "%q", notes.String())
	assert.Contains(t, notes.String(), "waiting for the server at "+addr+": connection refused; retrying (2s of --wait-peer 2.5s)")
	assert.Empty(t, out.String())
}

// perftest's ib_send_lat as the client of pvctl pingpong --rdma-core
// --listen (both on port 18515 by default): it writes its 16-byte version
// field and waits to read the server's. pvctl refuses it at once, ends
// with an error that quotes what arrived and names perftest, and closes
// the connection, so that perftest ends too.
func TestPingpongRDMACoreServerRefusesAPerftestClient(t *testing.T) {
	addr := freeAddr(t)
	var notes lockedBuffer
	e := &env{out: io.Discard, errOut: &notes, model: "v20", fabric: pvsim.NewFabric()}
	done := make(chan error, 1)
	go func() { done <- cmdPingpong(e, []string{"--rdma-core", "--listen", addr, "--wait-peer", "30s"}) }()
	var raw net.Conn
	require.Eventually(t, func() bool {
		var err error
		raw, err = net.Dial("tcp", addr)
		return err == nil
	}, 20*time.Second, 10*time.Millisecond, "pvctl listens")
	defer raw.Close()
	_, err := raw.Write(append([]byte("6.29"), make([]byte, 12)...)) // and waits
	require.NoError(t, err)
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("pvctl still waits on perftest's client")
	}
	require.ErrorIs(t, err, connect.ErrProtocol)
	assert.ErrorContains(t, err, `it sent "6.29\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"`)
	assert.ErrorContains(t, err, "by the look of it, perftest's exchange")
	require.NoError(t, raw.SetReadDeadline(time.Now().Add(20*time.Second)))
	_, err = io.Copy(io.Discard, raw)
	var ne net.Error
	assert.False(t, errors.As(err, &ne) && ne.Timeout(), "pvctl closed the connection: %v", err)
}

// tcpPair opens a server and a client end of pvctl's TCP exchange on a
// loopback address, both through peerFlags.open.
func tcpPair(t *testing.T, rdmaCore, srq bool) (srv, cli exchanger) {
	t.Helper()
	addr := freeAddr(t)
	errs := make(chan error, 1)
	go func() {
		var err error
		srv, err = (&peerFlags{listen: addr, rdmaCore: rdmaCore, srq: srq, waitPeer: 5 * time.Second}).open(context.Background())
		errs <- err
	}()
	cli, err := (&peerFlags{connect: addr, rdmaCore: rdmaCore, srq: srq, waitPeer: 5 * time.Second}).open(context.Background())
	require.NoError(t, err)
	require.NoError(t, <-errs)
	t.Cleanup(func() { srv.close(); cli.close() })
	require.True(t, srv.server())
	require.False(t, cli.server())
	return srv, cli
}

// swapBoth runs swap and then each barrier named at both ends at once.
func swapBoth(t *testing.T, srv, cli exchanger, mineSrv, mineCli connect.Info, barriers ...[2]string) (fromCli, fromSrv connect.Info, srvErr, cliErr error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	run := func(x exchanger, mine connect.Info, got *connect.Info, err *error, end int) {
		defer wg.Done()
		if *got, *err = x.swap(ctx, mine); *err != nil {
			return
		}
		for _, b := range barriers {
			if *err = x.barrier(ctx, b[end]); *err != nil {
				return
			}
		}
	}
	wg.Add(2)
	go run(srv, mineSrv, &fromCli, &srvErr, 0)
	go run(cli, mineCli, &fromSrv, &cliErr, 1)
	wg.Wait()
	return fromCli, fromSrv, srvErr, cliErr
}

var gidS, gidC = vfrdma.GID{0xfe, 0x80, 15: 1}, vfrdma.GID{0xfe, 0x80, 15: 2}

// Between two pvctl ends the exchange is package connect's: what comes
// back is what was sent, endpoints, regions and data. The first barrier
// is connect's Ready, the later ones its named barriers; a second swap
// runs over the same connection (am's).
func TestTCPExchangeNative(t *testing.T) {
	srv, cli := tcpPair(t, false, false)
	mineSrv := connect.Info{Endpoints: []connect.Endpoint{{QPN: 0x11, GID: gidS, QKey: testQKey, PSN: 5}},
		Regions: []connect.Region{{Addr: 0x1000, RKey: 7, Len: 4096}}, Data: terms{OneSided: sideWrite, Slot: 64}.encode()}
	mineCli := connect.Info{Endpoints: []connect.Endpoint{{QPN: 0x21, GID: gidC, PSN: 1}, {QPN: 0x22, GID: gidC, PSN: 2}}}
	fromCli, fromSrv, srvErr, cliErr := swapBoth(t, srv, cli, mineSrv, mineCli, [2]string{"ready", "ready"}, [2]string{"b", "b"})
	require.NoError(t, srvErr)
	require.NoError(t, cliErr)
	assert.Equal(t, mineSrv, fromSrv)
	assert.Equal(t, mineCli, fromCli)

	// am's all-gather: no QP, its address as the data; then barriers
	// that differ.
	fromCli, fromSrv, srvErr, cliErr = swapBoth(t, srv, cli, connect.Info{Data: []byte("srv")}, connect.Info{Data: []byte("cli")}, [2]string{"x", "y"})
	assert.Equal(t, connect.Info{Data: []byte("cli")}, fromCli)
	assert.Equal(t, connect.Info{Data: []byte("srv")}, fromSrv)
	assert.ErrorContains(t, srvErr, `barrier "x"`)
	assert.ErrorContains(t, cliErr, `barrier "y"`)
}

// With --rdma-core the exchange is rdma-core's: the QP's number, GID and
// PSN go across, with rdma-core's Q_Key; with --srq too, every QP's (the
// server's messages past its QPs are zeros).
func TestTCPExchangeRDMACore(t *testing.T) {
	for _, srq := range []bool{false, true} {
		t.Run(fmt.Sprintf("srq %v", srq), func(t *testing.T) {
			srv, cli := tcpPair(t, true, srq)
			ep := func(qpn uint32, gid vfrdma.GID, psn uint32) connect.Endpoint {
				return connect.Endpoint{QPN: qpn, GID: gid, PSN: psn}
			}
			mineSrv := connect.Info{Endpoints: []connect.Endpoint{ep(0x11, gidS, 5)}}
			mineCli := connect.Info{Endpoints: []connect.Endpoint{ep(0x21, gidC, 6)}}
			if srq {
				mineSrv.Endpoints = append(mineSrv.Endpoints, ep(0x12, gidS, 0))
				mineCli.Endpoints = append(mineCli.Endpoints, ep(0x22, gidC, 7))
			}
			fromCli, fromSrv, srvErr, cliErr := swapBoth(t, srv, cli, mineSrv, mineCli, [2]string{"ready", "ready"})
			require.NoError(t, srvErr)
			require.NoError(t, cliErr)
			withQKey := func(in connect.Info) connect.Info {
				out := connect.Info{}
				for _, e := range in.Endpoints {
					e.QKey = rdmaCoreQKey
					out.Endpoints = append(out.Endpoints, e)
				}
				return out
			}
			assert.Equal(t, withQKey(mineSrv), fromSrv)
			assert.Equal(t, withQKey(mineCli), fromCli)
		})
	}
}
