package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma/qemu/proto"
)

// reporter writes records and diagnostics to the console, one write per
// line so that lines from different goroutines never mix. Write errors are
// ignored: the console is the only place to report them. It is safe for
// concurrent use.
type reporter struct {
	mu   sync.Mutex
	w    io.Writer
	nerr int
}

func newReporter(w io.Writer) *reporter { return &reporter{w: w} }

func (r *reporter) emit(rec proto.Record) {
	r.write(rec.Encode())
}

func (r *reporter) write(b []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.w.Write(b)
}

// errorf reports an EventError.
func (r *reporter) errorf(prog, format string, args ...any) {
	r.mu.Lock()
	r.nerr++
	r.mu.Unlock()
	r.emit(proto.Record{Event: proto.EventError, Prog: prog, Msg: fmt.Sprintf(format, args...)})
}

func (r *reporter) errors() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nerr
}

// logf writes a diagnostic line that is not a record.
func (r *reporter) logf(format string, args ...any) {
	r.write([]byte("vfrdma-init: " + fmt.Sprintf(format, args...) + "\n"))
}

// console is the serial port records go to. Its fd is blocking and kept out
// of the Go poller, so a write returns when the tty has the bytes.
type console struct{ fd int }

// openConsole opens proto.ConsoleDevice; if that fails, the init's stdout
// (the kernel's /dev/console) is used.
func openConsole() io.Writer {
	fd, err := unix.Open(proto.ConsoleDevice, unix.O_WRONLY|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		fmt.Fprintf(os.Stdout, "vfrdma-init: open %s: %v; using /dev/console\n", proto.ConsoleDevice, err)
		return os.Stdout
	}
	return &console{fd: fd}
}

func (c *console) Write(b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := unix.Write(c.fd, b[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, err
		}
		n += m
	}
	return n, nil
}

// drain waits, at most limit, until the console has sent what was written
// (tcdrain), so that power-off does not cut the last records.
func drain(w io.Writer, limit time.Duration) {
	c, ok := w.(*console)
	if !ok {
		return
	}
	done := make(chan struct{})
	go func() {
		unix.IoctlSetInt(c.fd, unix.TCSBRK, 1) // TCSBRK with a non-zero arg is tcdrain
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(limit):
	}
}
