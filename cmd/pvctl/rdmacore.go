package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// rdma-core's pingpong programs (ibv_rc_pingpong, ibv_ud_pingpong) swap QP
// addresses over TCP in a fixed text message: "LLLL:QQQQQQ:PPPPPP:G…G", the
// LID, QP number and PSN in hex, then the GID's 16 bytes as 32 hex digits,
// sent with its terminating NUL (52 bytes). The client writes first; the
// server reads it, connects its QP, writes its own; the client reads that
// and writes "done" with its NUL, which the server waits for.
const (
	rdmaCorePort    = "18515"
	rdmaCoreMsgLen  = len("0000:000000:000000:00000000000000000000000000000000") + 1
	rdmaCoreDoneLen = len("done") + 1
	// rdmaCoreQKey is the qkey ibv_ud_pingpong gives its QP and sends to.
	rdmaCoreQKey = 0x11111111
	// rdmaCoreFill is the byte rdma-core's pingpongs fill their buffers
	// with; it is what a vfrdma end checks every received byte against.
	rdmaCoreFill = 0x7b
)

// rdmaCoreExchange is an exchanger that speaks that format. The server
// writes its message only at the barrier, after its QP is connected and
// its receives posted, as rdma-core's server does; the client writes
// "done" there.
type rdmaCoreExchange struct {
	conn net.Conn
	srv  bool
	psn  uint32   // ours
	mine peerInfo // the server's own address, written at the barrier
}

func encodeRdmaCore(p peerInfo, psn uint32) []byte {
	msg := fmt.Sprintf("%04x:%06x:%06x:%s", 0, p.QPN&0xffffff, psn&0xffffff, hex.EncodeToString(p.GID[:]))
	return append([]byte(msg), 0)
}

func decodeRdmaCore(b []byte) (peerInfo, error) {
	s := strings.TrimRight(string(b), "\x00")
	f := strings.Split(s, ":")
	if len(f) != 4 || len(f[3]) != 32 {
		return peerInfo{}, fmt.Errorf("rdma-core exchange: %q is not LID:QPN:PSN:GID", s)
	}
	qpn, err1 := strconv.ParseUint(f[1], 16, 24)
	psn, err2 := strconv.ParseUint(f[2], 16, 24)
	gid, err3 := hex.DecodeString(f[3])
	if err1 != nil || err2 != nil || err3 != nil {
		return peerInfo{}, fmt.Errorf("rdma-core exchange: %q: bad QPN, PSN or GID", s)
	}
	p := peerInfo{QPN: uint32(qpn), PSN: uint32(psn), QKey: rdmaCoreQKey}
	copy(p.GID[:], gid)
	return p, nil
}

func (r *rdmaCoreExchange) readFull(ctx context.Context, n int) ([]byte, error) {
	if dl, ok := ctx.Deadline(); ok {
		_ = r.conn.SetReadDeadline(dl)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r.conn, b); err != nil {
		return nil, fmt.Errorf("rdma-core exchange: %w", err)
	}
	return b, nil
}

func (r *rdmaCoreExchange) write(b []byte) error {
	_ = r.conn.SetWriteDeadline(time.Now().Add(30 * time.Second))
	if _, err := r.conn.Write(b); err != nil {
		return fmt.Errorf("rdma-core exchange: %w", err)
	}
	return nil
}

func (r *rdmaCoreExchange) swap(ctx context.Context, mine peerInfo) (peerInfo, error) {
	if r.srv {
		r.mine = mine // written at the barrier, once connected
		b, err := r.readFull(ctx, rdmaCoreMsgLen)
		if err != nil {
			return peerInfo{}, err
		}
		return decodeRdmaCore(b)
	}
	if err := r.write(encodeRdmaCore(mine, r.psn)); err != nil {
		return peerInfo{}, err
	}
	b, err := r.readFull(ctx, rdmaCoreMsgLen)
	if err != nil {
		return peerInfo{}, err
	}
	return decodeRdmaCore(b)
}

func (r *rdmaCoreExchange) barrier(ctx context.Context, name string) error {
	if !r.srv {
		return r.write([]byte("done\x00"))
	}
	if err := r.write(encodeRdmaCore(r.mine, r.psn)); err != nil {
		return err
	}
	b, err := r.readFull(ctx, rdmaCoreDoneLen)
	if err != nil {
		return err
	}
	if string(b) != "done\x00" {
		return fmt.Errorf("rdma-core exchange: %q where the client's \"done\" was due", b)
	}
	return nil
}

func (r *rdmaCoreExchange) server() bool { return r.srv }
func (r *rdmaCoreExchange) close()       { r.conn.Close() }

// rdmaCoreAddr adds rdma-core's port to a host given without one.
func rdmaCoreAddr(a string) string {
	if _, _, err := net.SplitHostPort(a); err == nil {
		return a
	}
	return net.JoinHostPort(a, rdmaCorePort)
}

// fillRdmaCore fills a message as rdma-core's pingpongs do.
func fillRdmaCore(b []byte, _ int) {
	for i := range b {
		b[i] = rdmaCoreFill
	}
}

// checkRdmaCore checks a message from an rdma-core pingpong, every byte.
func checkRdmaCore(b []byte, seq int) error {
	for i, v := range b {
		if v != rdmaCoreFill {
			return fmt.Errorf("iteration %d: byte %d is %#x, want %#x (rdma-core's fill)", seq, i, v, rdmaCoreFill)
		}
	}
	return nil
}
