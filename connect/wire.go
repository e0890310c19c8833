package connect

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"
)

// wire is a Conn's TCP connection under the exchange's deadlines
// (Options.ExchangeTimeout, "the limit" here):
//
//   - every write is taken by the peer within the limit;
//   - a message of the peer's, once its first byte arrived, arrives whole
//     within the limit of that byte (the parser says where it ends);
//   - the server's first Exchange waits at most the limit for the
//     client's first byte (the client writes first, at once);
//   - otherwise the wait for the peer's next message is the peer's turn
//     (connecting its QPs, posting receives, running a batch until a
//     barrier), bounded by the step's context only.
//
// The step's context bounds all of it too: its deadline, and its end,
// which sets a deadline in the past that no later one undoes.
type wire struct {
	net.Conn
	limit time.Duration
	f     Format // the format spoken, for errors

	mu      sync.Mutex
	ctxDL   time.Time // the running step's context's deadline (zero: none)
	ended   bool      // the running step's context is done
	firstDL time.Time // the client's first message is due to begin by then (zero: no such bound)
	msgDL   time.Time // the peer's message under way is due whole by then (zero: none under way)
	head    []byte    // that message's first bytes, up to quoteMax+1, for errors
	got     int       // its bytes so far
}

// start puts w under ctx for a step; the func it returns takes ctx off.
func (w *wire) start(ctx context.Context) (stop func()) {
	w.mu.Lock()
	w.ctxDL, _ = ctx.Deadline()
	w.ended = false
	w.applyRead()
	w.mu.Unlock()
	fired := make(chan struct{})
	stopAfter := context.AfterFunc(ctx, func() {
		defer close(fired)
		w.mu.Lock()
		defer w.mu.Unlock()
		w.ended = true
		_ = w.Conn.SetDeadline(time.Unix(1, 0))
	})
	return func() {
		if !stopAfter() {
			<-fired
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		w.ctxDL, w.ended = time.Time{}, false
		_ = w.Conn.SetDeadline(time.Time{})
	}
}

// earliest returns the earliest of the deadlines given that are set.
func earliest(ts ...time.Time) time.Time {
	var e time.Time
	for _, t := range ts {
		if !t.IsZero() && (e.IsZero() || t.Before(e)) {
			e = t
		}
	}
	return e
}

// applyRead gives the connection the read deadline that holds now.
// Called with w.mu held.
func (w *wire) applyRead() {
	if w.ended {
		return
	}
	_ = w.Conn.SetReadDeadline(earliest(w.ctxDL, w.firstDL, w.msgDL))
}

// expectFirst bounds the wait for the client's first message: it is due
// to begin within the limit.
func (w *wire) expectFirst() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.firstDL = time.Now().Add(w.limit)
	w.applyRead()
}

// Read reads from the connection; the first bytes of a message start its
// deadline.
func (w *wire) Read(p []byte) (int, error) {
	n, err := w.Conn.Read(p)
	if n > 0 {
		w.mu.Lock()
		if w.msgDL.IsZero() {
			w.msgDL = time.Now().Add(w.limit)
			w.firstDL = time.Time{}
			w.head, w.got = w.head[:0], 0
			w.applyRead()
		}
		w.got += n
		w.head = append(w.head, p[:min(n, quoteMax+1-len(w.head))]...)
		w.mu.Unlock()
	}
	if err != nil {
		err = w.explain(err, false)
	}
	return n, err
}

// endMessage tells w that the peer's message ended. next is what already
// arrived of the one after it (a peer's bytes beyond its turn), whose
// deadline then runs from now.
func (w *wire) endMessage(next []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgDL, w.head, w.got = time.Time{}, w.head[:0], 0
	if len(next) > 0 {
		w.msgDL = time.Now().Add(w.limit)
		w.head = append(w.head, next[:min(len(next), quoteMax+1)]...)
		w.got = len(next)
	}
	w.applyRead()
}

// Write writes p, which the peer must take within the limit.
func (w *wire) Write(p []byte) (int, error) {
	w.mu.Lock()
	if !w.ended {
		_ = w.Conn.SetWriteDeadline(earliest(w.ctxDL, time.Now().Add(w.limit)))
	}
	w.mu.Unlock()
	n, err := w.Conn.Write(p)
	if err != nil {
		err = w.explain(err, true)
	}
	return n, err
}

// explain turns a deadline of the exchange's own that passed into an
// error wrapping ErrTimeout that says what the peer did; the context's
// deadline or end it leaves to the step (Conn.run).
func (w *wire) explain(err error, write bool) error {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended || !w.ctxDL.IsZero() && !time.Now().Before(w.ctxDL) {
		return err
	}
	switch {
	case write:
		return fmt.Errorf("%w: the peer did not take this end's message within %v (Options.ExchangeTimeout): it is not reading the exchange (%w)", ErrTimeout, w.limit, err)
	case !w.msgDL.IsZero():
		return fmt.Errorf("%w: the peer's message stopped after %d bytes, %s, and no more came within %v of its first byte (Options.ExchangeTimeout)%s (%w)", ErrTimeout, w.got, quote(w.head), w.limit, lookalike(w.head, w.f), err)
	case !w.firstDL.IsZero():
		return fmt.Errorf("%w: the peer sent nothing within %v (Options.ExchangeTimeout); a client of the exchange writes first, as soon as it is connected (%w)", ErrTimeout, w.limit, err)
	}
	return err
}
