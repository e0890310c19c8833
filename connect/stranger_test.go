package connect_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/connect"
)

// What perftest (linux-rdma/perftest, src/perftest_communication.c) writes
// on its TCP connection, byte for byte. Its client writes first, its
// server reads first; each message is a fixed-size buffer.
//
// The first is its version, in a 16-byte field (MAX_VERSION), NUL-padded
// (exchange_versions, unless --dont_xchg_versions).
var perftestVersion = append([]byte("6.29"), make([]byte, 12)...)

// perftestKeysGID is its address message with a GID (KEY_PRINT_FMT_GID,
// KEY_MSG_SIZE_GID bytes): LID, outstanding reads, QPN, PSN, rkey,
// address, the GID's 16 bytes, the SRQ number, colon-separated hex, then
// a NUL.
func perftestKeysGID() []byte {
	b := fmt.Appendf(nil, "%04x:%04x:%06x:%06x:%08x:%016x:", 0, 1, 0x11, 0xabcdef, 0x1234, 0x7f0000001000)
	for _, v := range gidA {
		b = fmt.Appendf(b, "%02x:", v)
	}
	b = fmt.Appendf(b, "%08x:", 0)
	return append(b, 0)
}

// perftestKeys is the same without a GID (KEY_PRINT_FMT, KEY_MSG_SIZE
// bytes).
func perftestKeys() []byte {
	return append(fmt.Appendf(nil, "%04x:%04x:%06x:%06x:%08x:%016x:%08x", 1, 1, 0x11, 0xabcdef, 0x1234, 0x7f0000001000, 0), 0)
}

// The first bytes of a TLS 1.2/1.3 ClientHello record and of the requests
// a port scanner or a stray client sends.
var (
	tlsClientHello = []byte{0x16, 0x03, 0x01, 0x00, 0xf4, 0x01, 0x00, 0x00, 0xf0, 0x03, 0x03, 0x5a, 0x5a, 0x5a, 0x5a}
	httpRequest    = []byte("GET / HTTP/1.1\r\nHost: 10.0.0.2:18515\r\nUser-Agent: Mozilla/5.0\r\nAccept: */*\r\n\r\n")
	sshBanner      = []byte("SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13.5\r\n")
)

var allFormats = []connect.Format{connect.Native, connect.RDMACore, connect.RDMACoreSRQ}

// acceptRaw listens in format f (with opts' other fields) and returns the
// server's Conn and a raw TCP client connected to it, which the test
// drives; both are closed at the test's end.
func acceptRaw(t *testing.T, ctx context.Context, f connect.Format, opts connect.Options) (*connect.Conn, net.Conn) {
	t.Helper()
	opts.Format = f
	ln, err := connect.Listen(ctx, "127.0.0.1:0", &opts)
	require.NoError(t, err)
	defer ln.Close()
	raw, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	srv, err := ln.Accept(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close(); raw.Close() })
	return srv, raw
}

// dialRaw dials, in format f, a raw TCP server that runs serve on the
// connection (until the test ends), and returns the client's Conn.
func dialRaw(t *testing.T, ctx context.Context, f connect.Format, opts connect.Options, serve func(net.Conn)) *connect.Conn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		serve(c)
	}()
	opts.Format = f
	cli, err := connect.Dial(ctx, ln.Addr().String(), &opts)
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close(); ln.Close(); <-done })
	return cli
}

// holdOpen keeps a raw end's connection open, reading and dropping what
// comes, until the peer closes it or the test ends.
func holdOpen(c net.Conn) { _, _ = io.Copy(io.Discard, c) }

// closedByPeer waits until the raw end's peer closed the connection, as a
// refused peer sees it: its read ends (EOF, or a reset).
func closedByPeer(t *testing.T, c net.Conn) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err := io.Copy(io.Discard, c)
	if err != nil {
		assert.NotErrorIs(t, err, context.DeadlineExceeded, "the connection stayed open")
		var ne net.Error
		assert.False(t, errors.As(err, &ne) && ne.Timeout(), "the connection stayed open: %v", err)
	}
}

// perftest's ib_send_lat (and every perftest program) as the client of a
// listener here: it writes its 16-byte version and waits to read the
// server's. The server refuses it at once, at the first byte that cannot
// be the exchange, whatever the format, without waiting for a whole
// message or the connection's end, and says what arrived; closing the
// Conn ends the connection, which perftest sees. With
// --dont_xchg_versions perftest writes its address message first: it is
// refused the same way.
func TestAPerftestClientIsRefusedAtItsFirstBytes(t *testing.T) {
	keysGID, keys := perftestKeysGID(), perftestKeys()
	require.Len(t, keysGID, 108, "perftest's KEY_MSG_SIZE_GID")
	require.Len(t, keys, 59, "perftest's KEY_MSG_SIZE")
	for _, tc := range []struct {
		name string
		sent []byte
		want string // the quote of what arrived
	}{
		{"version", perftestVersion, `"6.29\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"`},
		{"address with GID", keysGID, `"0000:0001:000011:abcdef:00001234:00007f0000001000:fe:80:00:00:00"...`},
		{"address", keys, `"0001:0001:000011:abcdef:00001234:00007f0000001000:00000000\x00"`},
	} {
		for _, f := range allFormats {
			t.Run(tc.name+"/"+f.String(), func(t *testing.T) {
				ctx := withTimeout(t, 20*time.Second)
				srv, raw := acceptRaw(t, ctx, f, connect.Options{})
				_, err := raw.Write(tc.sent) // and waits, the connection open
				require.NoError(t, err)
				err = exchange(ctx, srv)
				require.ErrorIs(t, err, connect.ErrProtocol)
				assert.NotErrorIs(t, err, connect.ErrTimeout, "refused on what arrived, not for want of the rest")
				assert.ErrorContains(t, err, "it sent "+tc.want)
				assert.ErrorContains(t, err, "by the look of it, perftest's", "the error names what the peer looks like")
				assert.ErrorContains(t, err, "connect: exchange with "+raw.LocalAddr().String())
				require.NoError(t, srv.Close())
				closedByPeer(t, raw)
			})
		}
	}
}

// perftest as the server that a client here dials: it reads 16 bytes
// (the version field) of what the client wrote, writes its own version
// and waits. The client refuses it at once, in every format.
func TestAPerftestServerIsRefusedAtItsFirstBytes(t *testing.T) {
	for _, f := range allFormats {
		t.Run(f.String(), func(t *testing.T) {
			ctx := withTimeout(t, 20*time.Second)
			cli := dialRaw(t, ctx, f, connect.Options{}, func(c net.Conn) {
				if _, err := io.ReadFull(c, make([]byte, 16)); err != nil {
					return
				}
				if _, err := c.Write(perftestVersion); err != nil {
					return
				}
				holdOpen(c)
			})
			err := exchange(ctx, cli)
			require.ErrorIs(t, err, connect.ErrProtocol)
			assert.NotErrorIs(t, err, connect.ErrTimeout)
			assert.ErrorContains(t, err, `it sent "6.29\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"`)
			assert.ErrorContains(t, err, "by the look of it, perftest's exchange, which begins with its version")
		})
	}
}

// What a port scanner or a stray client sends first (a TLS ClientHello,
// an HTTP request, an SSH banner, or a single byte of one) is refused at
// its first byte, the connection left open by the peer: the error quotes
// what arrived (escaped, bounded) and names the protocol it looks like.
func TestAStrangersFirstByteIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		sent []byte
		want []string
	}{
		{"TLS", tlsClientHello, []string{`"\x16\x03\x01\x00\xf4\x01\x00\x00\xf0\x03\x03ZZZZ"`, "a TLS handshake"}},
		{"HTTP", httpRequest, []string{`"GET / HTTP/1.1\r\nHost: 10.0.0.2:18515\r\nUser-Agent: Mozilla/5.0\r\nA"...`, "(by the look of it, HTTP)"}},
		{"SSH", sshBanner, []string{`"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13.5\r\n"`, "SSH"}},
		{"one byte", []byte("G"), []string{`it sent "G"`, "byte 0 is 'G'"}},
		{"one NUL", []byte{0}, []string{`it sent "\x00"`, `byte 0 is '\x00'`}},
	} {
		for _, f := range allFormats {
			t.Run(tc.name+"/"+f.String(), func(t *testing.T) {
				ctx := withTimeout(t, 20*time.Second)
				srv, raw := acceptRaw(t, ctx, f, connect.Options{})
				_, err := raw.Write(tc.sent)
				require.NoError(t, err)
				err = exchange(ctx, srv)
				require.ErrorIs(t, err, connect.ErrProtocol)
				assert.NotErrorIs(t, err, connect.ErrTimeout)
				for _, w := range tc.want {
					assert.ErrorContains(t, err, w)
				}
			})
		}
	}
}

// A peer that began a message and stops sending (its connection open) is
// refused once Options.ExchangeTimeout passed from the message's first
// byte, at either end, in every step: the error wraps ErrTimeout (not the
// context's end) and says how much arrived and what.
func TestAPeerThatStopsMidMessageIsRefusedAfterTheExchangeTimeout(t *testing.T) {
	opts := connect.Options{ExchangeTimeout: 100 * time.Millisecond}
	good := rdmaCoreMsg(0, 0x11, 7, gidAHex)
	hello := nativeMsg(version, 1, helloPayload(1, []connect.Endpoint{{QPN: 1, GID: gidA}}, nil))
	ready := nativeMsg(version, 2, []byte("ready"))
	srq := func(n int) []byte { // n bytes of ibv_srq_pingpong's 256 messages
		var b []byte
		for len(b) < n {
			b = append(b, good...)
		}
		return b[:n]
	}
	for _, tc := range []struct {
		name   string
		f      connect.Format
		sent   []byte // what the raw client sends; it then stops
		step   func(context.Context, *connect.Conn) error
		got    int
		quoted string
	}{
		{"native hello, header", connect.Native, hello[:7], exchange, 7, `"vfrdmaC"`},
		{"native hello, frame", connect.Native, hello[:30], exchange, 30, `"vfrdmaCX\x02\x00\x01\x00(\x00\x00\x00\x01\x00\x00\x00\x01\x00`},
		{"rdma-core address", connect.RDMACore, good[:26], exchange, 26, `"0000:000011:000007:fe80000"`},
		{"srq addresses", connect.RDMACoreSRQ, srq(100*52 + 3), exchange, 100*52 + 3, `"0000:000011:000007:fe80000000000000505400fffe123456\x000000:000011:"...`},
		{"native ready", connect.Native, append(hello, ready[:14]...), exchangeReady, 14, `"vfrdmaCX\x02\x00\x02\x00\x05\x00"`},
		{"rdma-core done", connect.RDMACore, append(good, "do"...), exchangeReady, 2, `"do"`},
	} {
		t.Run("server/"+tc.name, func(t *testing.T) {
			ctx := withTimeout(t, 20*time.Second)
			srv, raw := acceptRaw(t, ctx, tc.f, opts)
			go holdOpen(raw)
			_, err := raw.Write(tc.sent)
			require.NoError(t, err)
			err = tc.step(ctx, srv)
			require.ErrorIs(t, err, connect.ErrTimeout)
			assert.NotErrorIs(t, err, context.DeadlineExceeded, "the exchange's deadline, not the context's")
			assert.ErrorContains(t, err, fmt.Sprintf("stopped after %d bytes, %s", tc.got, tc.quoted))
			assert.ErrorContains(t, err, "within 100ms of its first byte (Options.ExchangeTimeout)")
		})
	}
	// The client's end: the server's answer stops half-way.
	for _, tc := range []struct {
		name   string
		f      connect.Format
		answer []byte
		quoted string
	}{
		{"native hello", connect.Native, hello[:20], `"vfrdmaCX\x02\x00\x01\x00(\x00\x00\x00\x01\x00\x00\x00"`},
		{"rdma-core address", connect.RDMACore, good[:40], `"0000:000011:000007:fe8000000000000050540"`},
		{"srq addresses", connect.RDMACoreSRQ, srq(255*52 + 51), `"0000:000011:000007:fe80000000000000505400fffe123456\x000000:000011:"...`},
	} {
		t.Run("client/"+tc.name, func(t *testing.T) {
			ctx := withTimeout(t, 20*time.Second)
			cli := dialRaw(t, ctx, tc.f, opts, func(c net.Conn) {
				_, _ = c.Write(tc.answer)
				holdOpen(c)
			})
			err := exchange(ctx, cli)
			require.ErrorIs(t, err, connect.ErrTimeout)
			assert.NotErrorIs(t, err, context.DeadlineExceeded)
			assert.ErrorContains(t, err, fmt.Sprintf("stopped after %d bytes, %s", len(tc.answer), tc.quoted))
		})
	}
}

// sent is how many bytes exchange's Info makes in format f.
func sent(f connect.Format) int {
	switch f {
	case connect.RDMACore:
		return 52
	case connect.RDMACoreSRQ:
		return 256 * 52
	}
	return 12 + 4 + 4 + 32 + 4
}

// exchangeReady runs Exchange and then Ready.
func exchangeReady(ctx context.Context, c *connect.Conn) error {
	if err := exchange(ctx, c); err != nil {
		return err
	}
	return c.Ready(ctx)
}

// A client that connects and sends nothing is refused once
// Options.ExchangeTimeout passed from the server's first Exchange: a
// client of the exchange writes first, at once.
func TestASilentClientIsRefusedAfterTheExchangeTimeout(t *testing.T) {
	for _, f := range allFormats {
		t.Run(f.String(), func(t *testing.T) {
			ctx := withTimeout(t, 20*time.Second)
			srv, raw := acceptRaw(t, ctx, f, connect.Options{ExchangeTimeout: 100 * time.Millisecond})
			go holdOpen(raw)
			err := exchange(ctx, srv)
			require.ErrorIs(t, err, connect.ErrTimeout)
			assert.NotErrorIs(t, err, context.DeadlineExceeded)
			assert.ErrorContains(t, err, "the peer sent nothing within 100ms (Options.ExchangeTimeout)")
		})
	}
}

// Between its messages the peer is at work (connecting QPs, posting
// receives, running a batch until a barrier): that wait is bounded by the
// context alone, however much longer than Options.ExchangeTimeout it is.
// Here the peer lingers several timeouts before each of its steps: a
// server here waits on a raw client that wrote its first message at once,
// a client here on a server here (whose own timeout is long).
func TestThePeersTurnIsNotBoundedByTheExchangeTimeout(t *testing.T) {
	const limit = 30 * time.Millisecond
	linger := func() { time.Sleep(5 * limit) }
	short := connect.Options{ExchangeTimeout: limit}
	hello := nativeMsg(version, 1, helloPayload(1, []connect.Endpoint{{QPN: 1, GID: gidA}}, nil))
	barrier := func(name string) []byte { return nativeMsg(version, 2, []byte(name)) }
	// steps runs this end's steps: Exchange, Ready and, in the native
	// format, a Barrier and a second Exchange; before each, if lingers,
	// it lingers.
	steps := func(ctx context.Context, c *connect.Conn, f connect.Format, lingers bool) error {
		pause := func() {
			if lingers {
				linger()
			}
		}
		if err := exchange(ctx, c); err != nil {
			return err
		}
		pause() // connecting its QP, posting receives
		if err := c.Ready(ctx); err != nil {
			return err
		}
		if f != connect.Native {
			return nil
		}
		pause() // a batch
		if err := c.Barrier(ctx, "batch done"); err != nil {
			return err
		}
		pause() // a second set of QPs
		return exchange(ctx, c)
	}

	for _, f := range []connect.Format{connect.Native, connect.RDMACore} {
		t.Run("server/"+f.String(), func(t *testing.T) {
			ctx := withTimeout(t, 20*time.Second)
			srv, raw := acceptRaw(t, ctx, f, short)
			first := hello
			if f == connect.RDMACore {
				first = rdmaCoreMsg(0, 0x11, 7, gidAHex)
			}
			_, err := raw.Write(first) // at once, as a client does
			require.NoError(t, err)
			served := make(chan error, 1)
			go func() {
				err := steps(ctx, srv, f, false)
				if err != nil {
					srv.Close() // ends the raw client's read
				}
				served <- err
			}()
			read := func(n int) {
				if _, err := io.ReadFull(raw, make([]byte, n)); err != nil {
					t.Fatalf("reading the server's message: %v; the server: %v", err, <-served)
				}
			}
			if f == connect.RDMACore {
				read(52) // the server's address, at its Ready
				linger()
				_, err = raw.Write([]byte("done\x00"))
				require.NoError(t, err)
			} else {
				read(len(hello))
				for _, msg := range [][]byte{barrier("ready"), barrier("batch done"), hello} {
					linger()
					_, err = raw.Write(msg)
					require.NoError(t, err)
					read(len(msg))
				}
			}
			require.NoError(t, <-served)
		})
		t.Run("client/"+f.String(), func(t *testing.T) {
			ctx := withTimeout(t, 20*time.Second)
			ln, err := connect.Listen(ctx, "127.0.0.1:0", &connect.Options{Format: f, ExchangeTimeout: time.Minute})
			require.NoError(t, err)
			defer ln.Close()
			served := make(chan error, 1)
			go func() {
				srv, err := ln.Accept(ctx)
				if err == nil {
					defer srv.Close()
					linger()
					err = steps(ctx, srv, f, true)
				}
				served <- err
			}()
			opts := short
			opts.Format = f
			cli, err := connect.Dial(ctx, ln.Addr().String(), &opts)
			require.NoError(t, err)
			defer cli.Close()
			require.NoError(t, steps(ctx, cli, f, false))
			require.NoError(t, <-served)
		})
	}
}

// A peer that closes the connection inside a message is an error wrapping
// ErrProtocol that says where it was cut and what arrived, at either end.
func TestAPeerThatClosesMidMessageIsAProtocolError(t *testing.T) {
	good := rdmaCoreMsg(0, 0x11, 7, gidAHex)
	hello := nativeMsg(version, 1, helloPayload(1, []connect.Endpoint{{QPN: 1, GID: gidA}}, nil))
	for _, tc := range []struct {
		name string
		f    connect.Format
		sent []byte
		step func(context.Context, *connect.Conn) error
		want string
	}{
		{"native hello", connect.Native, hello[:40], exchange, "the peer's hello is cut short"},
		{"rdma-core address", connect.RDMACore, good[:20], exchange, `the peer's address 1 of 1 is cut at 20 of 52 bytes: it sent "0000:000011:000007:f" and closed the connection`},
		{"rdma-core done", connect.RDMACore, append(good, "don"...), exchangeReady, `the peer closed the connection after 3 bytes, "don", where its "done" was due`},
	} {
		t.Run("server/"+tc.name, func(t *testing.T) {
			_, err := fromRawPeer(t, tc.f, tc.sent, tc.step)
			require.ErrorIs(t, err, connect.ErrProtocol)
			assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
			assert.ErrorContains(t, err, tc.want)
		})
	}
	for _, tc := range []struct {
		name   string
		f      connect.Format
		answer []byte
		want   string
	}{
		{"native hello", connect.Native, hello[:40], "the peer's hello is cut short"},
		{"rdma-core address", connect.RDMACore, good[:33], "the peer's address 1 of 1 is cut at 33 of 52 bytes"},
		{"srq addresses", connect.RDMACoreSRQ, append(good, good[:10]...), "the peer's address 2 of 256 is cut at 10 of 52 bytes"},
	} {
		t.Run("client/"+tc.name, func(t *testing.T) {
			ctx := withTimeout(t, 20*time.Second)
			cli := dialRaw(t, ctx, tc.f, connect.Options{}, func(c net.Conn) {
				// The client's message first: a close with it unread
				// would be a reset.
				if _, err := io.ReadFull(c, make([]byte, sent(tc.f))); err == nil {
					_, _ = c.Write(tc.answer)
				}
			})
			err := exchange(ctx, cli)
			require.ErrorIs(t, err, connect.ErrProtocol)
			assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

// The error's quote of what arrived is bounded: 64 bytes, then "...".
func TestTheQuoteOfWhatArrivedIsBounded(t *testing.T) {
	for _, n := range []int{64, 65} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			ctx := withTimeout(t, 20*time.Second)
			srv, raw := acceptRaw(t, ctx, connect.RDMACore, connect.Options{})
			go holdOpen(raw)
			_, err := raw.Write([]byte(strings.Repeat("x", n)))
			require.NoError(t, err)
			err = exchange(ctx, srv)
			require.ErrorIs(t, err, connect.ErrProtocol)
			if n == 64 {
				assert.ErrorContains(t, err, `it sent "`+strings.Repeat("x", 64)+`"`)
				assert.NotContains(t, err.Error(), `"...`)
			} else {
				assert.ErrorContains(t, err, `it sent "`+strings.Repeat("x", 64)+`"...`)
			}
		})
	}
}
