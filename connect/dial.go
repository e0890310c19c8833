package connect

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
)

// Progress is a dial attempt that failed for a reason a peer not up yet
// explains; the dial tries again after Options.Retry.
type Progress struct {
	Addr    string        // the address dialled
	Attempt int           // 1 for the first attempt
	Err     error         // why it failed
	Elapsed time.Duration // since the first attempt began
}

// Defaults of Options.
const (
	DefaultRetry           = 100 * time.Millisecond
	DefaultAttemptTimeout  = 5 * time.Second
	DefaultExchangeTimeout = 3 * time.Second
)

// DialTCP connects to addr over TCP as Dial does, retrying until ctx ends
// while the failures are those of a peer that is not up yet: nobody
// listening (ECONNREFUSED), the host or network unreachable for the moment
// (EHOSTUNREACH, ENETUNREACH: no ARP answer yet), an attempt that timed
// out, a name not resolved for now (a temporary DNS failure). Any other
// failure ends it at once. Each retried failure is reported to
// opts.Progress, if set. It is for protocols of the caller's own over the
// same dialling (am's address all-gather); Dial is DialTCP and the
// exchange.
func DialTCP(ctx context.Context, addr string, opts *Options) (net.Conn, error) {
	o := opts.withDefaults()
	d := net.Dialer{Timeout: o.AttemptTimeout}
	start := time.Now()
	var last error // the last attempt that failed on its own, not cut short by ctx
	for attempt := 1; ; attempt++ {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return c, nil
		}
		if ended(ctx) {
			// An attempt the context cut short says only that; the one
			// before it says why the peer was not reached.
			if last == nil {
				last = err
			}
			cause := context.Cause(ctx)
			if cause == nil { // the deadline passed, the context not yet done
				cause = context.DeadlineExceeded
			}
			return nil, &Error{Op: "dial", Addr: addr, Err: fmt.Errorf("%w after %d attempts; the last: %w", cause, attempt, last)}
		}
		last = err
		if !notUpYet(err) {
			return nil, &Error{Op: "dial", Addr: addr, Err: err}
		}
		if o.Progress != nil {
			o.Progress(Progress{Addr: addr, Attempt: attempt, Err: err, Elapsed: time.Since(start)})
		}
		t := time.NewTimer(o.Retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, &Error{Op: "dial", Addr: addr, Err: fmt.Errorf("%w after %d attempts; the last: %w", ctx.Err(), attempt, err)}
		case <-t.C:
		}
	}
}

// notUpYet reports a failed dial that a peer still starting explains.
func notUpYet(err error) bool {
	for _, e := range []error{syscall.ECONNREFUSED, syscall.EHOSTUNREACH, syscall.ENETUNREACH, syscall.ETIMEDOUT} {
		if errors.Is(err, e) {
			return true
		}
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return dns.IsTemporary || dns.IsTimeout
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// ended reports a context that is done or whose deadline has passed: a
// dial cut short by the deadline can return its timeout a moment before
// the context itself reads as done.
func ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}
