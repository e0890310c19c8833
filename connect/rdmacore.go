package connect

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"github.com/vfrdma/vfrdma"
)

// rdma-core's exchange (see the package documentation for the order).
// Facts learnt from libibverbs/examples (pingpong.c, rc_pingpong.c,
// ud_pingpong.c, srq_pingpong.c); the code is ours.
//
// A message is "LLLL:QQQQQQ:PPPPPP:" (LID, QPN, PSN in lower-case hex,
// zero-padded to 4, 6 and 6 digits), the GID's 16 bytes in order as 32 hex
// digits, and a NUL: 52 bytes. (The programs write the GID as four 32-bit
// words, each converted to big-endian first: the bytes come out in order.)
// Their reader scans the text loosely; this one takes the exact layout
// their writer makes, either case of hex, and checks each byte as it
// arrives.
const rdmaCoreMsgLen = 4 + 1 + 6 + 1 + 6 + 1 + 32 + 1

// rdmaCoreDone is what the client writes last, NUL included.
var rdmaCoreDone = []byte("done\x00")

// appendRDMACore appends e's message.
func appendRDMACore(b []byte, e Endpoint) []byte {
	b = fmt.Appendf(b, "%04x:%06x:%06x:", e.LID, e.QPN&0xffffff, e.PSN&0xffffff)
	b = hex.AppendEncode(b, e.GID[:])
	return append(b, 0)
}

// parseHex reads a run of hex digits.
func parseHex(b []byte) (uint32, bool) {
	var v uint32
	for _, c := range b {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		v = v<<4 | uint32(c)
	}
	return v, true
}

// rdmaCoreLayout is the message's layout, for errors.
const rdmaCoreLayout = "LID:QPN:PSN:GID, 4, 6, 6 and 32 hex digits, then a NUL"

// checkRDMACore checks bytes from on of a message as they arrive: each
// byte is what the layout has there. Its error names the first that is
// not.
func checkRDMACore(m []byte, from int) error {
	for i := from; i < len(m); i++ {
		v := m[i]
		var ok bool
		var what string
		switch {
		case i == 4 || i == 11 || i == 18:
			ok, what = v == ':', "a colon"
		case i == rdmaCoreMsgLen-1:
			ok, what = v == 0, "the closing NUL"
		case i < 4:
			ok, what = isHex(v), "a hex digit of the LID"
		case i < 11:
			ok, what = isHex(v), "a hex digit of the QPN"
		case i < 18:
			ok, what = isHex(v), "a hex digit of the PSN"
		case i < rdmaCoreMsgLen-1:
			ok, what = isHex(v), "a hex digit of the GID"
		default:
			return fmt.Errorf("byte %d is past the message's %d", i, rdmaCoreMsgLen)
		}
		if !ok {
			return fmt.Errorf("byte %d is %s, not %s", i, quoteByte(v), what)
		}
	}
	return nil
}

// parseRDMACore decodes one message of rdmaCoreMsgLen bytes.
func parseRDMACore(m []byte) (Endpoint, error) {
	if len(m) != rdmaCoreMsgLen {
		return Endpoint{}, fmt.Errorf("%s: %d bytes, not %d (%s)", quote(m), len(m), rdmaCoreMsgLen, rdmaCoreLayout)
	}
	if err := checkRDMACore(m, 0); err != nil {
		return Endpoint{}, fmt.Errorf("%s is not an address (%s): %v%s", quote(m), rdmaCoreLayout, err, lookalike(m, RDMACore))
	}
	lid, _ := parseHex(m[0:4])
	qpn, _ := parseHex(m[5:11])
	psn, _ := parseHex(m[12:18])
	var g vfrdma.GID
	if _, err := hex.Decode(g[:], m[19:51]); err != nil { // checked: cannot fail
		return Endpoint{}, fmt.Errorf("GID %s is not 32 hex digits", quote(m[19:51]))
	}
	return Endpoint{LID: uint16(lid), QPN: qpn, PSN: psn, GID: g}, nil
}

// rdmaCoreMessages is how many messages go each way.
func (c *Conn) rdmaCoreMessages() int {
	if c.o.Format == RDMACoreSRQ {
		return RDMACoreSRQMessages
	}
	return 1
}

// writeRDMACore writes this end's messages: its endpoints, then (SRQ)
// zeros up to the count, as ibv_srq_pingpong does.
func (c *Conn) writeRDMACore(eps []Endpoint) error {
	n := c.rdmaCoreMessages()
	b := make([]byte, 0, n*rdmaCoreMsgLen)
	for i := range n {
		var e Endpoint
		if i < len(eps) {
			e = eps[i]
		}
		b = appendRDMACore(b, e)
	}
	if _, err := c.c.Write(b); err != nil {
		return fmt.Errorf("sending this end's address: %w", err)
	}
	return nil
}

// readRDMACore reads and checks the peer's messages (all of them are one
// message to the deadlines: the peer writes them at once).
func (c *Conn) readRDMACore() (Info, error) {
	defer c.endMessage()
	n := c.rdmaCoreMessages()
	var eps []Endpoint
	none := -1 // the first message that names no QP
	var m [rdmaCoreMsgLen]byte
	for i := range n {
		if k, err := readChecked(c.r, m[:], checkRDMACore); err != nil {
			got := arrived(c.r, m[:k])
			switch {
			case i == 0 && k == 0 && errors.Is(err, io.EOF):
				return Info{}, fmt.Errorf("reading the peer's address: the peer closed the connection (%w)", err)
			case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
				return Info{}, fmt.Errorf("%w: the peer's address %d of %d is cut at %d of %d bytes: it sent %s and closed the connection%s: %w", ErrProtocol, i+1, n, k, rdmaCoreMsgLen, quote(got), lookalike(got, RDMACore), io.ErrUnexpectedEOF)
			case refused(err):
				return Info{}, fmt.Errorf("%w: the peer's address %d of %d is not rdma-core's pingpong exchange (%s): %v; it sent %s%s", ErrProtocol, i+1, n, rdmaCoreLayout, err, quote(got), lookalike(got, RDMACore))
			}
			return Info{}, fmt.Errorf("reading the peer's address %d of %d: %w", i+1, n, err)
		}
		e, err := parseRDMACore(m[:])
		if err != nil {
			return Info{}, fmt.Errorf("%w: the peer's address %d of %d: %v", ErrProtocol, i+1, n, err)
		}
		switch {
		case e.QPN == 0:
			if n == 1 {
				return Info{}, fmt.Errorf("%w: the peer's address names no QP (QPN 0)", ErrProtocol)
			}
			if none < 0 {
				none = i
			}
		case none >= 0:
			return Info{}, fmt.Errorf("%w: the peer's address %d names QP %#x after address %d named none", ErrProtocol, i+1, e.QPN, none+1)
		case e.GID == vfrdma.GID{}:
			return Info{}, fmt.Errorf("%w: the peer's address %d has no GID (rdma-core's pingpongs send one only with -g GID_INDEX, which RoCE needs)", ErrProtocol, i+1)
		default:
			e.QKey = RDMACoreQKey
			eps = append(eps, e)
		}
	}
	if len(eps) == 0 {
		return Info{}, fmt.Errorf("%w: none of the peer's %d addresses names a QP", ErrProtocol, n)
	}
	return Info{Endpoints: eps}, nil
}

func (c *Conn) rdmaCoreExchange(mine Info) (Info, error) {
	if c.server {
		c.mine = mine // written at Ready, once this end's QPs are connected
		return c.readRDMACore()
	}
	if err := c.writeRDMACore(mine.Endpoints); err != nil {
		return Info{}, err
	}
	return c.readRDMACore()
}

func (c *Conn) rdmaCoreReady() error {
	if !c.server {
		if _, err := c.c.Write(rdmaCoreDone); err != nil {
			return fmt.Errorf("sending \"done\": %w", err)
		}
		return nil
	}
	if err := c.writeRDMACore(c.mine.Endpoints); err != nil {
		return err
	}
	var b [len("done\x00")]byte
	k, err := readChecked(c.r, b[:], func(b []byte, from int) error {
		if !bytes.HasPrefix(rdmaCoreDone, b) {
			return errors.New(`not "done"`)
		}
		return nil
	})
	switch {
	case err == nil:
		c.endMessage()
		return nil
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("%w: the peer closed the connection after %d bytes, %s, where its \"done\" was due: %w", ErrProtocol, k, quote(b[:k]), io.ErrUnexpectedEOF)
	case refused(err):
		got := arrived(c.r, b[:k])
		return fmt.Errorf("%w: the peer sent %s where its \"done\" was due%s", ErrProtocol, quote(got), lookalike(got, RDMACore))
	}
	return fmt.Errorf("waiting for the peer's \"done\": %w", err)
}
