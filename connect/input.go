package connect

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strconv"
)

// What the peer sent, as input: read a read at a time and checked as it
// arrives, so that a peer of another protocol is refused at its first
// bytes that cannot be the exchange rather than once it sent a whole
// message's worth, which it may never do; and quoted in errors, bounded.

// quoteMax bounds the bytes of the peer's that an error quotes.
const quoteMax = 64

// quote returns b as a Go string literal for an error: at most quoteMax
// bytes, anything but printable ASCII escaped, "..." after it if b was
// longer.
func quote(b []byte) string {
	if len(b) > quoteMax {
		return strconv.QuoteToASCII(string(b[:quoteMax])) + "..."
	}
	return strconv.QuoteToASCII(string(b))
}

// quoteByte returns v for an error: 'x', or '\x00' and the like.
func quoteByte(v byte) string { return strconv.QuoteRuneToASCII(rune(v)) }

// badInput is readChecked's error for bytes its check refused: what
// arrived is not the exchange.
type badInput struct{ err error }

func (e *badInput) Error() string { return e.err.Error() }
func (e *badInput) Unwrap() error { return e.err }

// refused reports readChecked's error for bytes its check refused (rather
// than a failure of the reader).
func refused(err error) bool {
	var b *badInput
	return errors.As(err, &b)
}

// readChecked fills b from r, a read at a time, and checks what arrived
// after each read: check(b[:n], from) checks b[from:n], the bytes new since
// its last call. It returns the bytes read and the first error of check
// (a *badInput: see refused), or of r: io.EOF if r ended before b's first
// byte, io.ErrUnexpectedEOF if inside b.
func readChecked(r io.Reader, b []byte, check func(b []byte, from int) error) (int, error) {
	n := 0
	for n < len(b) {
		k, err := r.Read(b[n:])
		if k > 0 {
			if cerr := check(b[:n+k], n); cerr != nil {
				return n + k, &badInput{cerr}
			}
			n += k
		}
		if err != nil {
			if n == len(b) {
				break
			}
			if n > 0 && errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return n, err
		}
	}
	return n, nil
}

// arrived returns got and, if r is a *bufio.Reader, what it already holds
// after it (without waiting for more): up to quoteMax+1 bytes of what the
// peer sent, for an error.
func arrived(r io.Reader, got []byte) []byte {
	out := append([]byte(nil), got[:min(len(got), quoteMax+1)]...)
	if br, ok := r.(*bufio.Reader); ok {
		if n := min(br.Buffered(), quoteMax+1-len(out)); n > 0 {
			more, _ := br.Peek(n)
			out = append(out, more...)
		}
	}
	return out
}

// isHex reports a hex digit, either case.
func isHex(v byte) bool {
	return '0' <= v && v <= '9' || 'a' <= v && v <= 'f' || 'A' <= v && v <= 'F'
}

// hexFields reports whether b begins with runs of hex digits of the
// lengths given, each followed by a colon.
func hexFields(b []byte, lens ...int) bool {
	i := 0
	for _, n := range lens {
		if len(b) < i+n+1 {
			return false
		}
		for _, v := range b[i : i+n] {
			if !isHex(v) {
				return false
			}
		}
		if b[i+n] != ':' {
			return false
		}
		i += n + 1
	}
	return true
}

// perftestVersion reports perftest's first message: its version ("6.29")
// in a 16-byte field, NUL-padded.
func perftestVersion(b []byte) bool {
	n := 0
	dot := false
	for n < len(b) && n < 16 && ('0' <= b[n] && b[n] <= '9' || b[n] == '.' && n > 0) {
		dot = dot || b[n] == '.'
		n++
	}
	return n > 0 && dot && ('0' <= b[0] && b[0] <= '9') && (n == len(b) || b[n] == 0)
}

// lookalike names, for an error, the protocol other than format f whose
// bytes b looks like: the other exchange of this package, perftest's,
// and what a port scanner or a stray client sends first. It returns ""
// for none.
func lookalike(b []byte, f Format) string {
	var what string
	switch {
	case len(b) == 0:
		return ""
	case bytes.HasPrefix(b, []byte(nativeMagic)) || len(b) < len(nativeMagic) && bytes.HasPrefix([]byte(nativeMagic), b) && len(b) >= 4:
		if f == Native {
			return ""
		}
		what = "vfrdma's native exchange"
	case hexFields(b, 4, 6, 6):
		if f != Native {
			return ""
		}
		what = "rdma-core's pingpong exchange: ibv_rc_pingpong and kin"
	case perftestVersion(b):
		what = "perftest's exchange, which begins with its version: ib_send_lat, ib_write_bw and kin speak neither vfrdma's exchange nor rdma-core's"
	case hexFields(b, 4, 4, 6, 6):
		what = "perftest's address message (--dont_xchg_versions): ib_send_lat, ib_write_bw and kin speak neither vfrdma's exchange nor rdma-core's"
	case len(b) >= 2 && b[0] == 0x16 && b[1] == 0x03:
		what = "a TLS handshake"
	case bytes.HasPrefix(b, []byte("SSH-")):
		what = "SSH"
	case httpStart(b):
		what = "HTTP"
	default:
		return ""
	}
	return " (by the look of it, " + what + ")"
}

// httpStart reports the start of an HTTP request or response.
func httpStart(b []byte) bool {
	for _, m := range []string{"GET ", "HEAD ", "POST ", "PUT ", "DELETE ", "OPTIONS ", "CONNECT ", "PATCH ", "TRACE ", "PRI * HTTP/", "HTTP/"} {
		if bytes.HasPrefix(b, []byte(m)) {
			return true
		}
	}
	return false
}
