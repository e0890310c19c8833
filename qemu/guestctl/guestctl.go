// Package guestctl is the guest side of the test bench's control channel: a
// line-oriented JSON request/reply protocol (proto.Request, proto.Reply) on
// the guest's second serial port, through which in-guest tests exchange
// values with tests in other VMs of the same run via the host runner's
// key/value rendezvous.
//
// A Conn is safe for use by one goroutine at a time. Requests are answered
// in order, so a request whose reply did not arrive in time leaves the
// channel out of step: the Conn is then broken and every later call fails.
package guestctl

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma/qemu/proto"
)

// ErrBroken is returned by every call after a reply was missed.
var ErrBroken = errors.New("guestctl: connection out of step after a missed reply")

// ErrClosed is returned by calls after Close.
var ErrClosed = errors.New("guestctl: connection closed")

const (
	// putTimeout bounds the wait for the host's reply to a Put.
	putTimeout = 30 * time.Second
	// killWait bounds how long Kill waits to be killed.
	killWait = 30 * time.Second
	// replySlack is added to a Get's deadline when waiting for the reply, so
	// that the host's own timeout answer arrives before the guest gives up.
	replySlack = 2 * time.Second
	// maxReply bounds a reply line.
	maxReply = 64 << 10
)

// Conn is a connection to the host runner.
type Conn struct {
	rw     io.ReadWriter
	closer io.Closer // nil for NewConn
	r      *bufio.Reader
	slack  time.Duration // replySlack; tests shorten it
	broken bool
	closed bool
}

// Open opens the control channel, proto.ControlDevice, in raw mode.
func Open() (*Conn, error) {
	return openDevice(proto.ControlDevice)
}

// openDevice opens a tty and makes it raw: no echo (which would send the
// host's replies back to it), no line editing, no CR/NL translation, 8 bits.
func openDevice(path string) (*Conn, error) {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("guestctl: %w", err)
	}
	if err := makeRaw(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("guestctl: %s: %w", path, err)
	}
	c := NewConn(f)
	c.closer = f
	return c, nil
}

// makeRaw does what cfmakeraw(3) does, plus CLOCAL so the port needs no
// modem lines. The ioctls go through SyscallConn: Fd would take the file
// out of the poller.
func makeRaw(f *os.File) error {
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	err = sc.Control(func(fd uintptr) {
		t, err := unix.IoctlGetTermios(int(fd), unix.TCGETS)
		if err != nil {
			ioErr = fmt.Errorf("TCGETS: %w", err)
			return
		}
		t.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON | unix.IXOFF
		t.Oflag &^= unix.OPOST
		t.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
		t.Cflag &^= unix.CSIZE | unix.PARENB | unix.CSTOPB | unix.CRTSCTS
		t.Cflag |= unix.CS8 | unix.CREAD | unix.CLOCAL
		t.Cc[unix.VMIN] = 1
		t.Cc[unix.VTIME] = 0
		if err := unix.IoctlSetTermios(int(fd), unix.TCSETS, t); err != nil {
			ioErr = fmt.Errorf("TCSETS: %w", err)
			return
		}
		// Drop whatever arrived before the port was raw.
		if err := unix.IoctlSetInt(int(fd), unix.TCFLSH, unix.TCIFLUSH); err != nil {
			ioErr = fmt.Errorf("TCFLSH: %w", err)
		}
	})
	if err != nil {
		return err
	}
	return ioErr
}

// NewConn returns a Conn over any byte stream (a socket in tests). If rw
// has a SetReadDeadline method (an *os.File in the poller, a net.Conn),
// waits for replies are bounded; otherwise they can only end with the
// stream. Close does not close rw.
func NewConn(rw io.ReadWriter) *Conn {
	return &Conn{rw: rw, r: bufio.NewReaderSize(rw, 4096), slack: replySlack}
}

// Put stores value under key for the whole run. A key is written once per
// run; writing it again is an error from the host.
func (c *Conn) Put(key, value string) error {
	ctx, cancel := context.WithTimeout(context.Background(), putTimeout)
	defer cancel()
	_, err := c.do(ctx, proto.Request{Op: proto.OpPut, Key: key, Value: value}, 0)
	return err
}

// Kill asks the host to kill this VM at once (proto.OpKill), as a crash
// would. It does not return when the host obliges; if it returns, the
// host refused or the channel broke, and the error says which.
func (c *Conn) Kill() error {
	ctx, cancel := context.WithTimeout(context.Background(), killWait)
	defer cancel()
	_, err := c.do(ctx, proto.Request{Op: proto.OpKill}, 0)
	if err == nil {
		err = errors.New("guestctl: kill: the host answered instead of killing the VM")
	}
	return err
}

// SetLink sets this VM's Ethernet link up or down (proto.OpSetLink); it
// returns once QEMU has applied it.
func (c *Conn) SetLink(up bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), putTimeout)
	defer cancel()
	v := "down"
	if up {
		v = "up"
	}
	_, err := c.do(ctx, proto.Request{Op: proto.OpSetLink, Value: v}, 0)
	return err
}

// Get waits until key has a value, then returns it. ctx bounds the wait:
// its deadline goes to the host, which answers with an error when it passes
// (the Conn stays usable); if that answer does not come within a little
// more, or ctx is cancelled first, Get gives up and the Conn is broken.
// Without a deadline the host applies its default timeout.
func (c *Conn) Get(ctx context.Context, key string) (string, error) {
	req := proto.Request{Op: proto.OpGet, Key: key}
	var slack time.Duration
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		if left <= 0 {
			return "", fmt.Errorf("guestctl: get %q: %w", key, context.DeadlineExceeded)
		}
		req.TimeoutMS = max(1, int(left/time.Millisecond))
		slack = c.slack
	}
	return c.do(ctx, req, slack)
}

type readDeadliner interface{ SetReadDeadline(time.Time) error }

// do sends req and reads its reply, giving up slack after ctx's deadline or
// when ctx is cancelled.
func (c *Conn) do(ctx context.Context, req proto.Request, slack time.Duration) (string, error) {
	what := fmt.Sprintf("guestctl: %s %q", req.Op, req.Key)
	switch {
	case c.closed:
		return "", fmt.Errorf("%s: %w", what, ErrClosed)
	case c.broken:
		return "", fmt.Errorf("%s: %w", what, ErrBroken)
	}
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	line, err := json.Marshal(req)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	if _, err := c.rw.Write(append(line, '\n')); err != nil {
		c.broken = true
		return "", fmt.Errorf("%s: write: %w", what, err)
	}

	// Bound the read: the deadline (plus slack) through SetReadDeadline, a
	// cancellation by moving the deadline to now.
	if rd, ok := c.rw.(readDeadliner); ok {
		if dl, ok := ctx.Deadline(); ok {
			rd.SetReadDeadline(dl.Add(slack))
		}
		stop := context.AfterFunc(ctx, func() {
			// Past the deadline the host's timeout reply is on its way;
			// a cancellation ends the wait at once.
			if errors.Is(ctx.Err(), context.Canceled) {
				rd.SetReadDeadline(time.Now())
			}
		})
		defer func() {
			stop()
			rd.SetReadDeadline(time.Time{})
		}()
	}
	b, err := c.readLine()
	if err != nil {
		c.broken = true
		if errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() != nil {
			err = ctx.Err()
		}
		return "", fmt.Errorf("%s: no reply: %w", what, err)
	}
	var rep proto.Reply
	if err := json.Unmarshal(b, &rep); err != nil {
		c.broken = true
		return "", fmt.Errorf("%s: bad reply %q: %w", what, b, err)
	}
	if rep.Error != "" {
		return "", fmt.Errorf("%s: host: %s", what, rep.Error)
	}
	return rep.Value, nil
}

// readLine returns the next non-empty line without its line ending.
func (c *Conn) readLine() ([]byte, error) {
	var line []byte
	for {
		b, err := c.r.ReadSlice('\n')
		line = append(line, b...)
		if len(line) > maxReply {
			return nil, fmt.Errorf("reply longer than %d bytes", maxReply)
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err != nil:
			return nil, err
		}
		for len(line) > 0 && (line[len(line)-1] == '\n' || line[len(line)-1] == '\r') {
			line = line[:len(line)-1]
		}
		if len(line) > 0 {
			return line, nil
		}
	}
}

// Close closes the device. It is idempotent.
func (c *Conn) Close() error {
	if c.closed {
		return nil
	}
	c.closed = true
	if c.closer != nil {
		return c.closer.Close()
	}
	return nil
}
