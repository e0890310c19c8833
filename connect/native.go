package connect

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/vfrdma/vfrdma"
)

// The native format. Every message is a 12-byte header (the magic, the
// version, the kind; little-endian) and a frame (frame.go) holding its
// payload:
//
//	hello    a count (u32), that many 32-byte endpoints, a count (u32),
//	         that many 20-byte regions, then Info.Data
//	barrier  the barrier's name
//	refusal  why the sender refuses what it received (text)
//
// An endpoint is QPN, PSN, Q_Key (u32 each), LID, MTU (u16 each) and the
// GID's 16 bytes; a region is its address, its length (u64 each) and its
// rkey (u32). The client writes its hello, the server answers with its
// own; at a barrier likewise. An end that finds the peer's message wrong
// answers with a refusal before it gives up, so that the peer's error says
// what was wrong.
//
// Version 2 added the regions; an end of version 1 (endpoints, then the
// data) is refused by its version.
const (
	nativeMagic   = "vfrdmaCX"
	nativeVersion = 2
	headerLen     = 12
	endpointLen   = 32
	regionLen     = 20

	kindHello   = 1
	kindBarrier = 2
	kindRefusal = 3

	maxRefusal = 1024
	maxHello   = 4 + endpointLen*MaxEndpoints + 4 + regionLen*MaxRegions + MaxData

	readyName = "ready" // the barrier Ready is
)

// errNotNative marks a peer that does not speak the native format at all:
// no refusal goes to it.
var errNotNative = errors.New("not vfrdma's exchange")

func kindName(k uint16) string {
	switch k {
	case kindHello:
		return "hello"
	case kindBarrier:
		return "barrier"
	case kindRefusal:
		return "refusal"
	}
	return fmt.Sprintf("kind %d", k)
}

// appendMessage appends a message of kind with payload p.
func appendMessage(b []byte, kind uint16, p []byte) []byte {
	b = append(b, nativeMagic...)
	b = binary.LittleEndian.AppendUint16(b, nativeVersion)
	b = binary.LittleEndian.AppendUint16(b, kind)
	w := bytes.NewBuffer(b)
	_ = WriteFrame(w, p) // a bytes.Buffer takes it all
	return w.Bytes()
}

// encodeHello returns a hello's payload.
func encodeHello(in Info) []byte {
	b := make([]byte, 0, 4+endpointLen*len(in.Endpoints)+4+regionLen*len(in.Regions)+len(in.Data))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(in.Endpoints)))
	for _, e := range in.Endpoints {
		b = binary.LittleEndian.AppendUint32(b, e.QPN)
		b = binary.LittleEndian.AppendUint32(b, e.PSN)
		b = binary.LittleEndian.AppendUint32(b, e.QKey)
		b = binary.LittleEndian.AppendUint16(b, e.LID)
		b = binary.LittleEndian.AppendUint16(b, uint16(e.MTU))
		b = append(b, e.GID[:]...)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(in.Regions)))
	for _, r := range in.Regions {
		b = binary.LittleEndian.AppendUint64(b, r.Addr)
		b = binary.LittleEndian.AppendUint64(b, r.Len)
		b = binary.LittleEndian.AppendUint32(b, r.RKey)
	}
	return append(b, in.Data...)
}

// decodeHello checks and decodes a hello's payload.
func decodeHello(p []byte) (Info, error) {
	if len(p) < 4 {
		return Info{}, fmt.Errorf("%w: a hello of %d bytes has no endpoint count", ErrProtocol, len(p))
	}
	n := binary.LittleEndian.Uint32(p)
	if n > MaxEndpoints {
		return Info{}, fmt.Errorf("%w: the peer offers %d endpoints, at most %d", ErrProtocol, n, MaxEndpoints)
	}
	need := 4 + endpointLen*int(n)
	if len(p) < need+4 {
		return Info{}, fmt.Errorf("%w: %d endpoints and the region count take %d bytes, the hello has %d", ErrProtocol, n, need+4, len(p))
	}
	var in Info
	if n > 0 {
		in.Endpoints = make([]Endpoint, n)
	}
	for i := range in.Endpoints {
		b := p[4+endpointLen*i : 4+endpointLen*(i+1)]
		e := Endpoint{
			QPN:  binary.LittleEndian.Uint32(b[0:]),
			PSN:  binary.LittleEndian.Uint32(b[4:]),
			QKey: binary.LittleEndian.Uint32(b[8:]),
			LID:  binary.LittleEndian.Uint16(b[12:]),
			MTU:  int(binary.LittleEndian.Uint16(b[14:])),
		}
		copy(e.GID[:], b[16:32])
		if err := e.check(); err != nil {
			return Info{}, fmt.Errorf("%w: endpoint %d: %v", ErrProtocol, i, err)
		}
		in.Endpoints[i] = e
	}
	p = p[need:]
	m := binary.LittleEndian.Uint32(p)
	if m > MaxRegions {
		return Info{}, fmt.Errorf("%w: the peer offers %d regions, at most %d", ErrProtocol, m, MaxRegions)
	}
	need = 4 + regionLen*int(m)
	if len(p) < need {
		return Info{}, fmt.Errorf("%w: %d regions take %d bytes, the hello has %d after its endpoints", ErrProtocol, m, need, len(p))
	}
	if len(p)-need > MaxData {
		return Info{}, fmt.Errorf("%w: %d bytes of data, at most %d", ErrProtocol, len(p)-need, MaxData)
	}
	if m > 0 {
		in.Regions = make([]Region, m)
	}
	for i := range in.Regions {
		b := p[4+regionLen*i : 4+regionLen*(i+1)]
		r := Region{
			Addr: binary.LittleEndian.Uint64(b[0:]),
			Len:  binary.LittleEndian.Uint64(b[8:]),
			RKey: binary.LittleEndian.Uint32(b[16:]),
		}
		if err := r.check(); err != nil {
			return Info{}, fmt.Errorf("%w: region %d: %v", ErrProtocol, i, err)
		}
		in.Regions[i] = r
	}
	if len(p) > need {
		in.Data = p[need:]
	}
	return in, nil
}

// MarshalBinary returns in as the native format's hello message (header
// and frame, as Exchange sends it), for a channel other than a Conn's: a
// key/value store that two ends share, say. What the native format cannot
// carry (a count past its bound, a field out of range) is an error
// wrapping vfrdma.ErrInvalid.
func (in Info) MarshalBinary() ([]byte, error) {
	if err := Native.checkMine(in); err != nil {
		return nil, fmt.Errorf("%w: %v", vfrdma.ErrInvalid, err)
	}
	return appendMessage(nil, kindHello, encodeHello(in)), nil
}

// UnmarshalBinary decodes a hello message that MarshalBinary made, with
// the checks Exchange makes of the peer's: what is not one whole hello of
// this version, in range, and nothing after it, is an error wrapping
// ErrProtocol that quotes what arrived. in's slices do not alias b.
func (in *Info) UnmarshalBinary(b []byte) error {
	r := bytes.NewReader(b)
	p, err := readMessage(r, kindHello)
	switch {
	case err == nil:
	case errors.Is(err, ErrProtocol):
		return err
	case errors.Is(err, ErrRefused):
		return fmt.Errorf("%w: a refusal where a hello was due (%v)", ErrProtocol, err)
	default: // b ended before the message did
		return fmt.Errorf("%w: %s is not a whole hello (%v)", ErrProtocol, quote(b), err)
	}
	if r.Len() > 0 {
		return fmt.Errorf("%w: %d bytes after the hello: %s", ErrProtocol, r.Len(), quote(b[len(b)-r.Len():]))
	}
	got, err := decodeHello(p)
	if err != nil {
		return err
	}
	*in = got
	return nil
}

// readMessage reads the peer's next message, which must be of kind want,
// and returns its payload. A refusal is returned as an error wrapping
// ErrRefused with the peer's reason. The magic is checked byte by byte as
// it arrives: a peer of another protocol is refused at its first byte
// that differs.
func readMessage(r io.Reader, want uint16) ([]byte, error) {
	var h [headerLen]byte
	if n, err := readChecked(r, h[:], checkMagic); err != nil {
		switch {
		case errors.Is(err, errNotNative):
			return nil, fmt.Errorf("%w: %w: it sent %s%s", ErrProtocol, err, quote(arrived(r, h[:n])), lookalike(arrived(r, h[:n]), Native))
		case n == 0 && errors.Is(err, io.EOF):
			return nil, fmt.Errorf("the peer closed the connection (%w)", err)
		case errors.Is(err, io.ErrUnexpectedEOF):
			return nil, fmt.Errorf("%w: a header cut at %d of %d bytes (%w)", ErrProtocol, n, headerLen, err)
		}
		return nil, err
	}
	if v := binary.LittleEndian.Uint16(h[8:]); v != nativeVersion {
		return nil, fmt.Errorf("%w: the peer speaks version %d of the exchange, this end %d", ErrProtocol, v, nativeVersion)
	}
	kind := binary.LittleEndian.Uint16(h[10:])
	var limit int
	switch kind {
	case kindHello:
		limit = maxHello
	case kindBarrier:
		limit = MaxBarrierName
	case kindRefusal:
		limit = maxRefusal
	default:
		return nil, fmt.Errorf("%w: a message of unknown kind %d", ErrProtocol, kind)
	}
	p, err := ReadFrame(r, limit)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("%w: the peer's %s is cut short: %w", ErrProtocol, kindName(kind), io.ErrUnexpectedEOF)
		}
		return nil, fmt.Errorf("the peer's %s: %w", kindName(kind), err)
	}
	if kind == kindRefusal {
		return nil, fmt.Errorf("%w, saying: %s", ErrRefused, printableLong(p))
	}
	if kind != want {
		return nil, fmt.Errorf("%w: a %s where a %s was due", ErrProtocol, kindName(kind), kindName(want))
	}
	return p, nil
}

// checkMagic checks the bytes of a header that arrived from from on
// against the magic.
func checkMagic(h []byte, from int) error {
	for i := from; i < min(len(h), len(nativeMagic)); i++ {
		if h[i] != nativeMagic[i] {
			return fmt.Errorf("%w: byte %d is %s where the magic %q has %s", errNotNative, i, quoteByte(h[i]), nativeMagic, quoteByte(nativeMagic[i]))
		}
	}
	return nil
}

// printableLong returns a refusal's reason (at most maxRefusal bytes) for
// an error: anything but printable ASCII as '?'.
func printableLong(b []byte) string {
	out := make([]byte, len(b))
	for i, v := range b {
		if v < 0x20 || v > 0x7e {
			v = '?'
		}
		out[i] = v
	}
	return string(out)
}

// send writes one message.
func (c *Conn) send(kind uint16, p []byte) error {
	_, err := c.c.Write(appendMessage(nil, kind, p))
	return err
}

// refuse tells a native peer why what it sent is refused, if the error is
// the peer's doing; best effort, for the Conn is broken after it.
func (c *Conn) refuse(err error) {
	if !errors.Is(err, ErrProtocol) || errors.Is(err, errNotNative) {
		return
	}
	reason := []byte(err.Error())
	if len(reason) > maxRefusal {
		reason = reason[:maxRefusal]
	}
	_ = c.send(kindRefusal, reason) // under the exchange's write deadline
}

func (c *Conn) nativeExchange(mine Info) (Info, error) {
	hello := encodeHello(mine)
	if !c.server {
		if err := c.send(kindHello, hello); err != nil {
			return Info{}, fmt.Errorf("sending this end's endpoints: %w", err)
		}
	}
	p, err := readMessage(c.r, kindHello)
	c.endMessage()
	var peer Info
	if err == nil {
		peer, err = decodeHello(p)
	}
	if err != nil {
		c.refuse(err)
		return Info{}, fmt.Errorf("reading the peer's endpoints: %w", err)
	}
	if c.server {
		if err := c.send(kindHello, hello); err != nil {
			return Info{}, fmt.Errorf("sending this end's endpoints: %w", err)
		}
	}
	return peer, nil
}

func (c *Conn) nativeBarrier(name string) error {
	if !c.server {
		if err := c.send(kindBarrier, []byte(name)); err != nil {
			return fmt.Errorf("telling the peer this end is at barrier %q: %w", name, err)
		}
	}
	p, err := readMessage(c.r, kindBarrier)
	c.endMessage()
	if err == nil && string(p) != name {
		err = fmt.Errorf("%w: the peer is at barrier %s, this end at %q", ErrProtocol, quote(p), name)
	}
	if err != nil {
		c.refuse(err)
		return fmt.Errorf("waiting for the peer at barrier %q: %w", name, err)
	}
	if c.server {
		if err := c.send(kindBarrier, []byte(name)); err != nil {
			return fmt.Errorf("telling the peer this end is at barrier %q: %w", name, err)
		}
	}
	return nil
}
