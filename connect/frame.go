package connect

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
)

// A frame is a 4-byte little-endian length and then that many bytes. The
// native format sends every message's payload as one; other protocols on
// a TCP stream (am's address all-gather) use the same two functions.

// frameChunk is how much ReadFrame allocates ahead of the bytes that
// arrived: a length claimed by the peer is not trusted with more.
const frameChunk = 64 << 10

// WriteFrame writes b as one frame.
func WriteFrame(w io.Writer, b []byte) error {
	if uint64(len(b)) > 1<<32-1 {
		return fmt.Errorf("a frame of %d bytes: at most 2^32-1", len(b))
	}
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(len(b)))
	if _, err := w.Write(n[:]); err != nil {
		return err
	}
	_, err := w.Write(b)
	return err
}

// ReadFrame reads one frame of at most limit bytes. A length over limit is
// an error wrapping ErrProtocol, read no further. A stream that ends before
// the length is io.EOF; one that ends inside the frame is
// io.ErrUnexpectedEOF. Memory grows with the bytes that arrive, a chunk at
// a time, not with the length the peer claims.
func ReadFrame(r io.Reader, limit int) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint32(hdr[:])
	if uint64(n) > uint64(max(limit, 0)) {
		return nil, fmt.Errorf("%w: a frame of %d bytes, at most %d here", ErrProtocol, n, max(limit, 0))
	}
	b := make([]byte, 0, min(int(n), frameChunk))
	for len(b) < int(n) {
		k := min(int(n)-len(b), frameChunk)
		b = slices.Grow(b, k)
		got, err := io.ReadFull(r, b[len(b):len(b)+k])
		b = b[:len(b)+got]
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("a frame of %d bytes cut at %d: %w", n, len(b), err)
		}
	}
	return b, nil
}
