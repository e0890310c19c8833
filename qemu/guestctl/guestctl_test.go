package guestctl

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma/qemu/proto"
)

// fakeHost answers requests read from conn the way the runner's rendezvous
// does: put stores, get returns the value or, if the key has none, an error
// (or nothing at all for keys in silent). It records each request.
type fakeHost struct {
	t      *testing.T
	store  map[string]string
	silent map[string]bool
	reqs   chan proto.Request
}

// hangGuard bounds a wait that only a hang reaches: the host is silent, so
// a Get that ignored its context would never return.
const hangGuard = time.Minute

func startHost(t *testing.T, rw interface {
	Read([]byte) (int, error)
	Write([]byte) (int, error)
}) *fakeHost {
	h := &fakeHost{t: t, store: map[string]string{}, silent: map[string]bool{}, reqs: make(chan proto.Request, 16)}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(rw)
		close(ready)
		for sc.Scan() {
			var req proto.Request
			if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
				t.Errorf("host: bad request line %q: %v", sc.Bytes(), err)
				return
			}
			h.reqs <- req
			var rep proto.Reply
			switch {
			case h.silent[req.Key]:
				continue
			case req.Op == proto.OpPut:
				if _, ok := h.store[req.Key]; ok {
					rep.Error = "key written twice"
				} else {
					h.store[req.Key] = req.Value
				}
			case req.Op == proto.OpGet:
				v, ok := h.store[req.Key]
				if !ok {
					rep.Error = fmt.Sprintf("timeout after %dms", req.TimeoutMS)
				}
				rep.Value = v
			}
			b, _ := json.Marshal(rep)
			if _, err := rw.Write(append(b, '\n')); err != nil {
				return
			}
		}
	}()
	<-ready
	return h
}

func socketPair(t *testing.T) (guest, host net.Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	return conn(fds[0]), conn(fds[1])
}

func TestPutGet(t *testing.T) {
	g, h := socketPair(t)
	host := startHost(t, h)
	c := NewConn(g)
	defer c.Close()

	if err := c.Put("qpn/0", "17"); err != nil {
		t.Fatalf("Put: %v", err)
	}
	if req := <-host.reqs; req != (proto.Request{Op: proto.OpPut, Key: "qpn/0", Value: "17"}) {
		t.Errorf("host got %+v", req)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := c.Get(ctx, "qpn/0")
	if err != nil || v != "17" {
		t.Fatalf("Get = %q, %v; want 17", v, err)
	}
	req := <-host.reqs
	if req.Op != proto.OpGet || req.Key != "qpn/0" || req.TimeoutMS <= 9000 || req.TimeoutMS > 10000 {
		t.Errorf("host got %+v, want a get with timeout_ms in (9000, 10000]", req)
	}

	// A host error leaves the channel usable.
	if err := c.Put("qpn/0", "18"); err == nil || !strings.Contains(err.Error(), "key written twice") {
		t.Errorf("second Put: %v, want the host's error", err)
	}
	<-host.reqs
	if _, err := c.Get(ctx, "missing"); err == nil || !strings.Contains(err.Error(), "host: timeout") {
		t.Errorf("Get(missing): %v, want the host's error", err)
	}
	<-host.reqs
	if v, err := c.Get(context.Background(), "qpn/0"); err != nil || v != "17" {
		t.Errorf("Get without deadline = %q, %v", v, err)
	}
	if req := <-host.reqs; req.TimeoutMS != 0 {
		t.Errorf("Get without deadline sent timeout_ms %d, want 0", req.TimeoutMS)
	}
}

func TestGetNoReply(t *testing.T) {
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 50*time.Millisecond)
		}, context.DeadlineExceeded},
		{"cancel", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(50*time.Millisecond, cancel)
			return ctx, cancel
		}, context.Canceled},
		{"cancel before deadline", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			time.AfterFunc(50*time.Millisecond, cancel)
			return ctx, cancel
		}, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, h := socketPair(t)
			host := startHost(t, h)
			host.silent["k"] = true
			c := NewConn(g)
			c.slack = 100 * time.Millisecond
			ctx, cancel := tc.ctx()
			defer cancel()
			t0 := time.Now()
			_, err := c.Get(ctx, "k")
			if !errors.Is(err, tc.want) {
				t.Fatalf("Get: %v, want %v", err, tc.want)
			}
			if d := time.Since(t0); d > hangGuard {
				t.Errorf("Get took %v: it waited for the host, not for its context", d)
			}
			if err := c.Put("x", "y"); !errors.Is(err, ErrBroken) {
				t.Errorf("Put after a missed reply: %v, want ErrBroken", err)
			}
			c.Close()
			if err := c.Put("x", "y"); !errors.Is(err, ErrClosed) {
				t.Errorf("Put after Close: %v, want ErrClosed", err)
			}
		})
	}
}

func TestGetExpired(t *testing.T) {
	g, _ := socketPair(t)
	c := NewConn(g)
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	if _, err := c.Get(ctx, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get with an expired deadline: %v", err)
	}
	if c.broken {
		t.Error("an expired deadline sent nothing but broke the Conn")
	}
}

func TestBadReply(t *testing.T) {
	g, h := socketPair(t)
	c := NewConn(g)
	go func() {
		bufio.NewReader(h).ReadString('\n')
		h.Write([]byte("\r\n{not json\n"))
	}()
	if err := c.Put("k", "v"); err == nil || !strings.Contains(err.Error(), "bad reply") {
		t.Fatalf("Put: %v, want a bad reply error", err)
	}
}

// openPTY returns the master side of a new pseudo-terminal and the path of
// its slave.
func openPTY(t *testing.T) (*os.File, string) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here (%v): the raw-mode test needs /dev/ptmx and /dev/pts", err)
	}
	t.Cleanup(func() { m.Close() })
	sc, err := m.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n uint32
	var ioErr error
	sc.Control(func(fd uintptr) {
		if ioErr = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); ioErr != nil {
			return
		}
		n, ioErr = unix.IoctlGetUint32(int(fd), unix.TIOCGPTN)
	})
	if ioErr != nil {
		t.Fatal(ioErr)
	}
	return m, fmt.Sprintf("/dev/pts/%d", n)
}

// TestPTY runs the protocol over a pseudo-terminal, the closest thing to
// the guest's serial port: without raw mode the slave would echo the host's
// reply back to it and turn the request's \n into \r\n.
func TestPTY(t *testing.T) {
	master, slave := openPTY(t)
	c, err := openDevice(slave)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	f := c.closer.(*os.File)
	sc, _ := f.SyscallConn()
	var tio *unix.Termios
	sc.Control(func(fd uintptr) { tio, err = unix.IoctlGetTermios(int(fd), unix.TCGETS) })
	if err != nil {
		t.Fatal(err)
	}
	if tio.Lflag&(unix.ECHO|unix.ICANON|unix.ISIG) != 0 || tio.Oflag&unix.OPOST != 0 || tio.Iflag&(unix.ICRNL|unix.IXON) != 0 || tio.Cflag&unix.CSIZE != unix.CS8 {
		t.Errorf("not raw: iflag %#x oflag %#x lflag %#x cflag %#x", tio.Iflag, tio.Oflag, tio.Lflag, tio.Cflag)
	}

	// The host side reads raw bytes, so it sees exactly what the guest sent
	// and anything echoed.
	got := make(chan string, 1)
	go func() {
		r := bufio.NewReader(master)
		line, _ := r.ReadString('\n')
		master.Write([]byte(`{"value":"fe80::1"}` + "\n"))
		// Whatever comes next within a moment would be an echo.
		master.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		extra, _ := r.ReadString('\n')
		got <- line + extra
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := c.Get(ctx, "gid/1")
	if err != nil || v != "fe80::1" {
		t.Fatalf("Get = %q, %v", v, err)
	}
	line := <-got
	if !strings.HasPrefix(line, `{"op":"get","key":"gid/1","timeout_ms":`) || !strings.HasSuffix(line, "}\n") || strings.Count(line, "\n") != 1 {
		t.Errorf("host read %q: want one request line ending in a bare \\n and no echo", line)
	}
}
