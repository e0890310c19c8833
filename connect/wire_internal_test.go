package connect

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A peer that does not read is refused once Options.ExchangeTimeout
// passed on this end's write, at either end: the error wraps ErrTimeout,
// not the context's end. (A pipe takes nothing it is not read.)
func TestAPeerThatDoesNotReadIsRefusedAfterTheExchangeTimeout(t *testing.T) {
	for _, f := range []Format{Native, RDMACore} {
		for _, server := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/server %v", f, server), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				mine, theirs := net.Pipe()
				defer theirs.Close()
				o := (&Options{Format: f, ExchangeTimeout: 50 * time.Millisecond}).withDefaults()
				in := Info{Endpoints: []Endpoint{{QPN: 1, GID: gid}}}
				var conn net.Conn = mine
				if server { // the client's message is there, and then the peer reads nothing
					msg := appendMessage(nil, kindHello, encodeHello(in))
					if f == RDMACore {
						msg = appendRDMACore(nil, in.Endpoints[0])
					}
					conn = &preloaded{Conn: mine, pre: bytes.NewReader(msg)}
				}
				c := newConn(conn, o, server)
				defer c.Close()
				_, err := c.Exchange(ctx, in)
				if err == nil && f == RDMACore && server {
					err = c.Ready(ctx) // the server's message goes out here
				}
				require.ErrorIs(t, err, ErrTimeout)
				assert.NotErrorIs(t, err, context.DeadlineExceeded)
				assert.ErrorContains(t, err, "the peer did not take this end's message within 50ms (Options.ExchangeTimeout)")
			})
		}
	}
}

// preloaded is a connection whose first bytes are pre's.
type preloaded struct {
	net.Conn
	pre *bytes.Reader
}

func (p *preloaded) Read(b []byte) (int, error) {
	if p.pre.Len() > 0 {
		return p.pre.Read(b)
	}
	return p.Conn.Read(b)
}

// quote shows at most quoteMax bytes, escaped, and says when it cut.
func TestQuoteIsBoundedAndEscaped(t *testing.T) {
	assert.Equal(t, `"`+strings.Repeat("a", quoteMax)+`"`, quote(bytes.Repeat([]byte("a"), quoteMax)))
	assert.Equal(t, `"`+strings.Repeat("a", quoteMax)+`"...`, quote(bytes.Repeat([]byte("a"), quoteMax+1)))
	assert.Equal(t, `"\x00\xff\r\n\"\u00e9"`, quote([]byte("\x00\xff\r\n\"é")))
	assert.Equal(t, `""`, quote(nil))
}

// A refusal's reason is read up to maxRefusal bytes; one more is a
// protocol violation.
func TestARefusalIsReadUpToItsBound(t *testing.T) {
	_, err := readMessage(bytes.NewReader(appendMessage(nil, kindRefusal, bytes.Repeat([]byte("r"), maxRefusal))), kindHello)
	require.ErrorIs(t, err, ErrRefused)
	assert.ErrorContains(t, err, strings.Repeat("r", maxRefusal))
	_, err = readMessage(bytes.NewReader(appendMessage(nil, kindRefusal, bytes.Repeat([]byte("r"), maxRefusal+1))), kindHello)
	require.ErrorIs(t, err, ErrProtocol)
	assert.NotErrorIs(t, err, ErrRefused)
	assert.ErrorContains(t, err, "a frame of 1025 bytes, at most 1024 here")
}

// The refusal this end sends is cut at maxRefusal bytes.
func TestTheRefusalSentIsCutAtItsBound(t *testing.T) {
	mine, theirs := net.Pipe()
	defer theirs.Close()
	c := newConn(mine, (&Options{}).withDefaults(), true)
	defer c.Close()
	got := make(chan []byte, 1)
	go func() {
		var h [headerLen]byte
		if _, err := io.ReadFull(theirs, h[:]); err != nil {
			close(got)
			return
		}
		p, _ := ReadFrame(theirs, 1<<20)
		got <- p
	}()
	stop := c.c.start(context.Background())
	c.refuse(fmt.Errorf("%w: %s", ErrProtocol, strings.Repeat("x", 2*maxRefusal)))
	stop()
	select {
	case p := <-got:
		assert.Len(t, p, maxRefusal)
		assert.True(t, strings.HasPrefix(string(p), "protocol violation: xxx"), "%.40q", p)
	case <-time.After(10 * time.Second):
		t.Fatal("no refusal came")
	}
}

// An rdma-core message is exactly rdmaCoreMsgLen bytes: one fewer or one
// more is refused.
func TestAnRDMACoreMessageIsExactly52Bytes(t *testing.T) {
	m := appendRDMACore(nil, Endpoint{QPN: 1, GID: gid})
	_, err := parseRDMACore(m)
	require.NoError(t, err)
	_, err = parseRDMACore(m[:rdmaCoreMsgLen-1])
	assert.ErrorContains(t, err, "51 bytes, not 52")
	_, err = parseRDMACore(append(m, 0))
	assert.ErrorContains(t, err, "53 bytes, not 52")
}

// readChecked refuses at the first read whose bytes its check refuses,
// without waiting for the rest; a reader that ends inside the buffer is
// io.ErrUnexpectedEOF, before it io.EOF.
func TestReadCheckedRefusesAtTheFirstBadRead(t *testing.T) {
	pr, pw := io.Pipe()
	defer pw.Close()
	go func() { _, _ = pw.Write([]byte("0x")) }() // and nothing more
	n, err := readChecked(pr, make([]byte, 52), checkRDMACore)
	require.True(t, refused(err), "%v", err)
	assert.Equal(t, 2, n)
	assert.ErrorContains(t, err, "byte 1 is 'x', not a hex digit of the LID")

	_, err = readChecked(bytes.NewReader([]byte("0000")), make([]byte, 52), checkRDMACore)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	assert.False(t, refused(err))
	_, err = readChecked(bytes.NewReader(nil), make([]byte, 52), checkRDMACore)
	assert.ErrorIs(t, err, io.EOF)
}

// arrived adds to what was read what a bufio.Reader holds already, up to
// one byte past quoteMax (so that quote knows to cut).
func TestArrivedAddsWhatIsBuffered(t *testing.T) {
	r := bufio.NewReader(strings.NewReader(strings.Repeat("y", 200)))
	got := make([]byte, 10)
	_, err := io.ReadFull(r, got)
	require.NoError(t, err)
	assert.Len(t, arrived(r, got), quoteMax+1)
	assert.Equal(t, []byte("ab"), arrived(bytes.NewReader([]byte("cd")), []byte("ab")), "nothing of a reader that is no bufio.Reader")
}

// lookalike names the protocols a stranger's first bytes belong to, and
// not the format being read.
func TestLookalikeNamesTheStrangersProtocol(t *testing.T) {
	for _, tc := range []struct {
		b    string
		f    Format
		want string
	}{
		{"6.29\x00\x00", RDMACore, "perftest's exchange, which begins with its version"},
		{"5.93", Native, "perftest's exchange"},
		{"0000:0001:000011:abcdef:", RDMACore, "perftest's address message"},
		{"0000:000011:abcdef:fe80", Native, "rdma-core's pingpong exchange"},
		{"0000:000011:abcdef:fe80", RDMACore, ""},
		{"vfrdmaCX\x01\x00", RDMACore, "vfrdma's native exchange"},
		{"vfrd", RDMACoreSRQ, "vfrdma's native exchange"},
		{"vfrdmaCX", Native, ""},
		{"\x16\x03\x01", Native, "a TLS handshake"},
		{"SSH-2.0-x", Native, "SSH"},
		{"POST /x HTTP/1.1", RDMACore, "HTTP"},
		{"HTTP/1.1 400 Bad Request", RDMACore, "HTTP"},
		{"6", RDMACore, ""},
		{"6.", RDMACore, "perftest's exchange"},
		{".29", RDMACore, ""},
		{"", RDMACore, ""},
		{"\xff\xff", RDMACore, ""},
	} {
		got := lookalike([]byte(tc.b), tc.f)
		if tc.want == "" {
			assert.Empty(t, got, "%q", tc.b)
		} else {
			assert.Contains(t, got, "(by the look of it, "+tc.want, "%q", tc.b)
		}
	}
}

// What arrived may end anywhere, right after a run of hex digits
// included: lookalike reads no byte past the end of what it is given
// (a peer that sends "0000" and stops must get a refusal, not a panic),
// and a cut address message looks like nothing yet.
func TestLookalikeReadsNoBytePastWhatArrived(t *testing.T) {
	for _, whole := range []string{"0000:000011:abcdef:fe80", "0000:0001:000011:abcdef:"} {
		for n := range len(whole) + 1 {
			b := []byte(whole[:n])
			for _, f := range []Format{Native, RDMACore, RDMACoreSRQ} {
				require.NotPanics(t, func() { lookalike(b, f) }, "%q as %v", b, f)
			}
		}
	}
	for _, cut := range []string{"0000", "0000:000011", "0000:000011:abcdef"} {
		assert.Empty(t, lookalike([]byte(cut), Native), "%q", cut)
	}
}
