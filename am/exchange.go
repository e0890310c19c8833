package am

import (
	"bufio"
	"context"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/vfrdma/vfrdma/connect"
)

// Exchanger publishes this task's address and returns every task's: an
// all-gather. New calls it once. The bench's control channel is one in
// the tests; TCPExchanger serves a set of processes on a network, and
// LauncherExchanger makes one from what a launcher (srun, mpirun) set.
type Exchanger interface {
	// AllGather returns every task's blob, indexed by task, this task's
	// (mine) included.
	AllGather(ctx context.Context, mine []byte) ([][]byte, error)
}

// TCPExchanger is an Exchanger over TCP: task 0 listens on Addr, the
// others connect to it (retrying until ctx ends) and each presents the
// job's Token, its task index and its blob; task 0 answers every one with
// the token and all the blobs. Each AllGather is one round.
//
// Task 0 takes connections concurrently, each with a deadline of its own
// (Timeout): a connection that stays silent, or does not present the
// job's token, is closed unanswered and does not hold up the others.
type TCPExchanger struct {
	Addr  string // host:port of task 0
	Tasks int
	Self  int
	// Token names the job; every task must have the same, non-empty one.
	// It keeps strays and other jobs' tasks out; it is not a secret
	// against someone who can read the network.
	Token string
	// Timeout bounds each connection's greeting at task 0, and each
	// answer it writes (default 10 s).
	Timeout time.Duration
}

// maxBlob bounds a blob read from the network; maxToken a token.
const (
	maxBlob  = 1 << 20
	maxToken = 1 << 10
)

// exchangeMagic opens every greeting and answer.
var exchangeMagic = [8]byte{'v', 'f', 'r', 'd', 'm', 'a', 'A', 'M'}

// errRefused is a connection task 0 does not take: the wrong magic or
// token, a task index out of range or taken.
var errRefused = errors.New("not a task of this job")

func (x *TCPExchanger) timeout() time.Duration {
	if x.Timeout > 0 {
		return x.Timeout
	}
	return 10 * time.Second
}

// AllGather implements Exchanger.
func (x *TCPExchanger) AllGather(ctx context.Context, mine []byte) ([][]byte, error) {
	if x.Tasks < 1 || x.Self < 0 || x.Self >= x.Tasks {
		return nil, fmt.Errorf("%w: task %d of %d", ErrTarget, x.Self, x.Tasks)
	}
	if x.Token == "" || len(x.Token) > maxToken {
		return nil, fmt.Errorf("%w: TCPExchanger needs the job's Token (1 to %d bytes, the same on every task)", errInvalid, maxToken)
	}
	if x.Tasks == 1 {
		return [][]byte{mine}, nil
	}
	if x.Self == 0 {
		return x.serve(ctx, mine)
	}
	return x.join(ctx, mine)
}

// greeting is a task's connection, read and checked.
type greeting struct {
	task int
	blob []byte
	c    net.Conn
}

func (x *TCPExchanger) serve(ctx context.Context, mine []byte) ([][]byte, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", x.Addr)
	if err != nil {
		return nil, fmt.Errorf("address exchange: %w", err)
	}
	gctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	defer ln.Close()
	stop := context.AfterFunc(gctx, func() { ln.Close() })
	defer stop()

	greeted := make(chan greeting)
	acceptErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				acceptErr <- err
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				x.greet(gctx, c, greeted)
			}()
		}
	}()

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
		select {
		case g := <-greeted:
			if conns[g.task] != nil {
				g.c.Close() // a repeat: the first one holds the index
				continue
			}
			conns[g.task], all[g.task] = g.c, g.blob
			got++
		case err := <-acceptErr:
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return nil, fmt.Errorf("address exchange: %d of %d tasks joined: %w", got, x.Tasks, err)
		case <-ctx.Done():
			return nil, fmt.Errorf("address exchange: %d of %d tasks joined: %w", got, x.Tasks, ctx.Err())
		}
	}
	for t, c := range conns[1:] {
		_ = c.SetWriteDeadline(x.deadline(ctx))
		w := bufio.NewWriter(c)
		x.writeHead(w)
		for _, b := range all {
			writeBlob(w, b)
		}
		if err := w.Flush(); err != nil {
			return nil, fmt.Errorf("address exchange: answering task %d: %w", t+1, err)
		}
	}
	return all, nil
}

// deadline is now plus the timeout, or ctx's deadline if sooner.
func (x *TCPExchanger) deadline(ctx context.Context) time.Time {
	dl := time.Now().Add(x.timeout())
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	return dl
}

// greet reads and checks one connection's greeting within the timeout and
// hands it to serve; a connection that is not a task of this job is
// closed.
func (x *TCPExchanger) greet(ctx context.Context, c net.Conn, greeted chan<- greeting) {
	stop := context.AfterFunc(ctx, func() { c.Close() })
	_ = c.SetReadDeadline(x.deadline(ctx))
	task, blob, err := x.readGreeting(c)
	if err != nil {
		stop()
		c.Close()
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	if !stop() {
		return // serve is over; c is closed
	}
	select {
	case greeted <- greeting{task: task, blob: blob, c: c}:
	case <-ctx.Done():
		c.Close()
	}
}

func (x *TCPExchanger) readGreeting(r io.Reader) (int, []byte, error) {
	if err := x.readHead(r); err != nil {
		return 0, nil, err
	}
	var task uint32
	if err := binary.Read(r, binary.LittleEndian, &task); err != nil {
		return 0, nil, err
	}
	if task == 0 || int64(task) >= int64(x.Tasks) {
		return 0, nil, fmt.Errorf("%w: task %d of %d", errRefused, task, x.Tasks)
	}
	blob, err := readBlob(r)
	return int(task), blob, err
}

// writeHead writes the magic and the token; readHead reads and checks
// them.
func (x *TCPExchanger) writeHead(w io.Writer) {
	_, _ = w.Write(exchangeMagic[:])
	_ = binary.Write(w, binary.LittleEndian, uint16(len(x.Token)))
	_, _ = io.WriteString(w, x.Token)
}

func (x *TCPExchanger) readHead(r io.Reader) error {
	var magic [8]byte
	var n uint16
	if _, err := io.ReadFull(r, magic[:]); err != nil {
		return err
	}
	if magic != exchangeMagic {
		return fmt.Errorf("%w: not an address exchange", errRefused)
	}
	if err := binary.Read(r, binary.LittleEndian, &n); err != nil {
		return err
	}
	if n > maxToken {
		return fmt.Errorf("%w: a %d-byte token", errRefused, n)
	}
	tok := make([]byte, n)
	if _, err := io.ReadFull(r, tok); err != nil {
		return err
	}
	if subtle.ConstantTimeCompare(tok, []byte(x.Token)) != 1 {
		return fmt.Errorf("%w: another job's token", errRefused)
	}
	return nil
}

func (x *TCPExchanger) join(ctx context.Context, mine []byte) ([][]byte, error) {
	// Task 0 may not listen yet: connect retries while it is not up.
	c, err := connect.DialTCP(ctx, x.Addr, &connect.Options{Retry: 50 * time.Millisecond})
	if err != nil {
		return nil, fmt.Errorf("address exchange: task 0: %w", err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	setDeadline(ctx, c)
	w := bufio.NewWriter(c)
	x.writeHead(w)
	_ = binary.Write(w, binary.LittleEndian, uint32(x.Self))
	writeBlob(w, mine)
	if err := w.Flush(); err != nil {
		return nil, fmt.Errorf("address exchange: %w", err)
	}
	r := bufio.NewReader(c)
	if err := x.readHead(r); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		} else if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
			// Closed unanswered; a reset when the greeting was still
			// unread.
			err = fmt.Errorf("%w: task 0 closed the connection (another job's token, or task %d joined already)", errRefused, x.Self)
		}
		return nil, fmt.Errorf("address exchange: task 0 at %s: %w", x.Addr, err)
	}
	all := make([][]byte, x.Tasks)
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

// A blob goes as a frame of package connect (a 4-byte little-endian
// length, then the bytes); writes go to a bufio.Writer, whose Flush
// reports their failure.
func writeBlob(w io.Writer, b []byte) { _ = connect.WriteFrame(w, b) }

func readBlob(r io.Reader) ([]byte, error) { return connect.ReadFrame(r, maxBlob) }

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
