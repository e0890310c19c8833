package am

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Exchanger publishes this task's address and returns every task's: an
// all-gather. New calls it once. The bench's control channel is one in
// the tests; TCPExchanger serves a set of processes on a network.
type Exchanger interface {
	// AllGather returns every task's blob, indexed by task, this task's
	// (mine) included.
	AllGather(ctx context.Context, mine []byte) ([][]byte, error)
}

// TCPExchanger is an Exchanger over TCP: task 0 listens on Addr, the
// others connect to it (retrying until ctx ends) and each sends its blob;
// task 0 answers every one with all of them. Each AllGather is one round.
type TCPExchanger struct {
	Addr  string // host:port of task 0
	Tasks int
	Self  int
}

// maxBlob bounds a blob read from the network.
const maxBlob = 1 << 20

// AllGather implements Exchanger.
func (x *TCPExchanger) AllGather(ctx context.Context, mine []byte) ([][]byte, error) {
	if x.Tasks < 1 || x.Self < 0 || x.Self >= x.Tasks {
		return nil, fmt.Errorf("%w: task %d of %d", ErrTarget, x.Self, x.Tasks)
	}
	if x.Tasks == 1 {
		return [][]byte{mine}, nil
	}
	if x.Self == 0 {
		return x.serve(ctx, mine)
	}
	return x.join(ctx, mine)
}

func (x *TCPExchanger) serve(ctx context.Context, mine []byte) ([][]byte, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", x.Addr)
	if err != nil {
		return nil, fmt.Errorf("address exchange: %w", err)
	}
	defer ln.Close()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	all := make([][]byte, x.Tasks)
	all[0] = mine
	conns := make([]net.Conn, x.Tasks)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	for got := 1; got < x.Tasks; {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return nil, fmt.Errorf("address exchange: %d of %d tasks joined: %w", got, x.Tasks, err)
		}
		setDeadline(ctx, c)
		var task uint32
		if err := binary.Read(c, binary.LittleEndian, &task); err != nil {
			c.Close()
			continue
		}
		blob, err := readBlob(c)
		if err != nil || task == 0 || int(task) >= x.Tasks || conns[task] != nil {
			c.Close() // a stray or repeated connection: not one of ours
			continue
		}
		conns[task], all[task] = c, blob
		got++
	}
	for _, c := range conns[1:] {
		w := bufio.NewWriter(c)
		for _, b := range all {
			writeBlob(w, b)
		}
		if err := w.Flush(); err != nil {
			return nil, fmt.Errorf("address exchange: %w", err)
		}
	}
	return all, nil
}

func (x *TCPExchanger) join(ctx context.Context, mine []byte) ([][]byte, error) {
	var d net.Dialer
	var c net.Conn
	for {
		var err error
		if c, err = d.DialContext(ctx, "tcp", x.Addr); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("address exchange: task 0 at %s: %w (last: %v)", x.Addr, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	setDeadline(ctx, c)
	w := bufio.NewWriter(c)
	_ = binary.Write(w, binary.LittleEndian, uint32(x.Self))
	writeBlob(w, mine)
	if err := w.Flush(); err != nil {
		return nil, fmt.Errorf("address exchange: %w", err)
	}
	all := make([][]byte, x.Tasks)
	r := bufio.NewReader(c)
	for i := range all {
		b, err := readBlob(r)
		if err != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return nil, fmt.Errorf("address exchange: reading task %d's address: %w", i, err)
		}
		all[i] = b
	}
	return all, nil
}

func setDeadline(ctx context.Context, c net.Conn) {
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
}

func writeBlob(w io.Writer, b []byte) {
	_ = binary.Write(w, binary.LittleEndian, uint32(len(b)))
	_, _ = w.Write(b)
}

func readBlob(r io.Reader) ([]byte, error) {
	var n uint32
	if err := binary.Read(r, binary.LittleEndian, &n); err != nil {
		return nil, err
	}
	if n > maxBlob {
		return nil, errors.New("blob too large")
	}
	b := make([]byte, n)
	_, err := io.ReadFull(r, b)
	return b, err
}

// LocalExchangers returns n Exchangers that gather among themselves, one
// per task of a job whose tasks all run in this process (tests, a
// loopback benchmark): task i's is element i. Each gathers once.
func LocalExchangers(n int) []Exchanger {
	g := &localGather{all: make([][]byte, n), left: n, done: make(chan struct{})}
	xs := make([]Exchanger, n)
	for i := range xs {
		xs[i] = localTask{g: g, self: i}
	}
	return xs
}

type localGather struct {
	mu   sync.Mutex
	all  [][]byte
	left int
	done chan struct{}
}

type localTask struct {
	g    *localGather
	self int
}

func (t localTask) AllGather(ctx context.Context, mine []byte) ([][]byte, error) {
	t.g.mu.Lock()
	if t.g.all[t.self] == nil {
		t.g.all[t.self] = append([]byte{}, mine...)
		if t.g.left--; t.g.left == 0 {
			close(t.g.done)
		}
	}
	t.g.mu.Unlock()
	select {
	case <-t.g.done:
		return t.g.all, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("address exchange: %w", ctx.Err())
	}
}
