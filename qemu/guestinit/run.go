package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma/qemu/guest"
	"github.com/vfrdma/vfrdma/qemu/proto"
)

const (
	// maxLine bounds the Line of an EventOut record; longer output lines
	// are split.
	maxLine = 4096
	// outputGrace bounds the wait for a program's output to end after the
	// program has exited and its process group was killed.
	outputGrace = 2 * time.Second
	// quitGrace is how long a program past its time limit has to print
	// its stacks after SIGQUIT before it is killed.
	quitGrace = 2 * time.Second
	// reapWait bounds the wait for a killed program to be reaped.
	reapWait = 5 * time.Second
)

// stepArgs returns the arguments the init gives a step's program.
func stepArgs(s guest.Step) []string {
	if s.Kind != guest.KindGoTest {
		return s.Args
	}
	args := []string{"-test.v"}
	// Let the testing package time out first: its panic names the tests
	// that were running, which a kill cannot.
	if !slices.ContainsFunc(s.Args, func(a string) bool {
		return strings.HasPrefix(a, "-test.timeout") || strings.HasPrefix(a, "--test.timeout")
	}) {
		margin := min(s.Timeout/10, 10*time.Second)
		args = append(args, "-test.timeout="+(s.Timeout-margin).String())
	}
	return append(args, s.Args...)
}

// runStep runs one program, reporting its start, its output, its test
// results and its exit. It returns whether the program succeeded (exit 0
// and, for tests, no failed test).
func runStep(rep *reporter, s guest.Step, env []string) bool {
	args := stepArgs(s)
	rep.logf("run %s %s", s.Path, strings.Join(args, " "))
	rep.emit(proto.Record{Event: proto.EventStart, Prog: s.Name})
	t0 := time.Now()
	res := execStep(rep, s, args, env)
	// A step with Retry runs again while it fails, until Retry has passed
	// since its start: a client whose server in another VM is not up yet.
	// One killed at its time limit is not run again: it hung (a lost
	// message, say), and a peer that served the hung attempt would not
	// serve another. Nor is one that got past its exchange with the peer
	// (it printed the peer's address): its server has served it and waits
	// for no other, so a rerun could only wait out its time limit.
	for res.rec.Code != 0 && !res.timedOut && !res.exchanged && s.Retry > 0 && time.Since(t0) < s.Retry {
		time.Sleep(300 * time.Millisecond)
		rep.logf("run %s again (exit %d)", s.Path, res.rec.Code)
		res = execStep(rep, s, args, env)
	}
	if res.rec.Code != 0 && res.exchanged && res.okLine != "" {
		rep.logf("%s exited %d after its exchange, printing %q: taken as done", s.Path, res.rec.Code, res.okLine)
		res.rec.Msg = fmt.Sprintf("ok: exit %d after the exchange, with %q", res.rec.Code, res.okLine)
		res.rec.Code = 0
	}
	if res.rec.Code != 0 && res.exchanged && s.Retry > 0 {
		rep.logf("%s is not run again: it failed after its exchange with the peer (%q), which no rerun repeats", s.Path, res.exchangedLine)
	}
	res.rec.Elapsed = time.Since(t0).Seconds()
	rep.emit(res.rec)
	return res.rec.Code == 0 && !res.testFailed
}

type stepResult struct {
	rec        proto.Record // the EventExit record, without Elapsed
	testFailed bool
	timedOut   bool // killed at the step's time limit
	// exchanged: the program printed its peer's address (rdma-core's and
	// perftest's clients print "remote address" once their TCP exchange
	// with the server is done); exchangedLine is that line.
	exchanged     bool
	exchangedLine string
	// okLine: a line containing the step's OKIfOutput; it counts only
	// with the exchange (printed before or after it: see execStep).
	okLine string
}

// exchangedWith reports a line that says the program has its peer's
// address: rdma-core's pingpongs and perftest print "remote address".
func exchangedWith(line string) bool {
	return strings.Contains(strings.ToLower(line), "remote address")
}

func execStep(rep *reporter, s guest.Step, args, env []string) stepResult {
	exit := func(code int, msg string) stepResult {
		return stepResult{rec: proto.Record{Event: proto.EventExit, Prog: s.Name, Code: code, Msg: msg}}
	}
	// A plain program's stdout and stderr go through pipes of their own,
	// so the host can keep them apart (pvvm prints a guest's stderr on its
	// own stderr). A test binary's go through one: the test parser reads
	// them as one stream, in the order written (a panic's stack on stderr
	// after the test's lines on stdout).
	streams := []string{proto.StreamStdout}
	if s.Kind != guest.KindGoTest {
		streams = append(streams, proto.StreamStderr)
	}
	readers := make([]*os.File, 0, len(streams))
	writers := make([]*os.File, 0, len(streams))
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	for range streams {
		pr, pw, err := os.Pipe()
		if err != nil {
			closeAll(readers)
			closeAll(writers)
			return exit(-1, fmt.Sprintf("not run: %v", err))
		}
		readers, writers = append(readers, pr), append(writers, pw)
	}
	defer closeAll(readers)
	cmd := exec.Command(s.Path, args...)
	cmd.Env = append(slices.Clip(env), s.Env...)
	cmd.Dir = "/tmp"
	cmd.Stdout = writers[0]
	cmd.Stderr = writers[len(writers)-1]
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if _, err := os.Stat(cmd.Dir); err != nil {
		cmd.Dir = ""
	}
	err := cmd.Start()
	closeAll(writers)
	if err != nil {
		return exit(-1, fmt.Sprintf("not run: %v", err))
	}
	pgid := cmd.Process.Pid

	// The readers share the parser and what the lines showed, under mu,
	// until outDone is closed.
	var mu sync.Mutex
	var parser guest.TestParser
	var testFailed bool
	var exchangedLine, okLine string
	onLine := func(stream, line string) {
		mu.Lock()
		defer mu.Unlock()
		rep.emit(proto.Record{Event: proto.EventOut, Prog: s.Name, Line: line, Stream: stream})
		if exchangedLine == "" && exchangedWith(line) {
			exchangedLine = strings.TrimSpace(line)
		}
		// In either order: a program's stdout is block-buffered in
		// the pipe and its stderr is not, so perftest's "Can't
		// produce a report" (stderr, at the end) can come before its
		// "remote address" (stdout, flushed at exit).
		if okLine == "" && s.OKIfOutput != "" && strings.Contains(line, s.OKIfOutput) {
			okLine = strings.TrimSpace(line)
		}
		if s.Kind != guest.KindGoTest {
			return
		}
		if r, ok := parser.Line(line); ok {
			testFailed = testFailed || r.Status == proto.StatusFail
			rep.emit(testRecord(s.Name, r))
		}
	}
	var reading sync.WaitGroup
	for i, pr := range readers {
		stream := streams[i]
		reading.Add(1)
		go func() {
			defer reading.Done()
			defer func() {
				if v := recover(); v != nil {
					rep.errorf(s.Name, "init: output reader panicked: %v", v)
				}
			}()
			sp := lineSplitter{max: maxLine, emit: func(line string) { onLine(stream, line) }}
			io.Copy(&sp, pr)
			sp.flush()
		}()
	}
	outDone := make(chan struct{})
	go func() {
		reading.Wait()
		close(outDone)
	}()

	waitDone := make(chan error, 1)
	go func() { waitDone <- cmd.Wait() }()
	timer := time.NewTimer(s.Timeout)
	defer timer.Stop()
	var waitErr error
	killed := false
	select {
	case waitErr = <-waitDone:
	case <-timer.C:
		killed = true
		// SIGQUIT first: a Go program (pvctl, a test binary) prints every
		// goroutine's stack on it, which says where it hung; others end.
		unix.Kill(-pgid, unix.SIGQUIT)
		select {
		case waitErr = <-waitDone:
		case <-time.After(quitGrace):
			unix.Kill(-pgid, unix.SIGKILL)
			select {
			case waitErr = <-waitDone:
			case <-time.After(reapWait):
				waitErr = errors.New("not reaped after SIGKILL")
			}
		}
	}
	// What the program left running would hold the pipe open and the device
	// busy: end its process group.
	unix.Kill(-pgid, unix.SIGKILL)
	select {
	case <-outDone:
	case <-time.After(outputGrace):
		closeAll(readers) // the pipes are in the poller: this ends the reads
		select {
		case <-outDone:
		case <-time.After(outputGrace):
			rep.errorf(s.Name, "init: output reader did not stop")
		}
	}

	var res stepResult
	switch {
	case killed:
		res = exit(-1, fmt.Sprintf("killed: timeout after %v", s.Timeout))
		res.timedOut = true
	case waitErr == nil:
		res = exit(0, "")
	default:
		var ee *exec.ExitError
		if errors.As(waitErr, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				res = exit(-1, "killed by signal: "+ws.Signal().String())
			} else {
				res = exit(ee.ExitCode(), "")
			}
		} else {
			res = exit(-1, waitErr.Error())
		}
	}
	select {
	case <-outDone: // the parser is ours again
	default:
		return res
	}
	res.exchanged, res.exchangedLine, res.okLine = exchangedLine != "", exchangedLine, okLine
	if s.Kind == guest.KindGoTest {
		why := "exit status " + fmt.Sprint(res.rec.Code)
		if res.rec.Msg != "" {
			why = res.rec.Msg
		}
		for _, r := range parser.Finish(why) {
			res.testFailed = true
			rep.emit(testRecord(s.Name, r))
		}
		res.testFailed = res.testFailed || testFailed
	}
	if c := parser.Crash(); c != "" && res.rec.Msg == "" {
		res.rec.Msg, _, _ = strings.Cut(c, "\n")
	}
	return res
}

func testRecord(prog string, r guest.TestResult) proto.Record {
	return proto.Record{Event: proto.EventTest, Prog: prog, Test: r.Name, Status: r.Status, Elapsed: r.Elapsed, Msg: r.Msg}
}

// lineSplitter is an io.Writer that hands emit one line at a time, without
// its newline (or trailing CR). Lines longer than max bytes are handed over
// in pieces of at most max bytes, cut at a UTF-8 boundary when one is near.
type lineSplitter struct {
	max  int
	emit func(string)
	buf  []byte
}

func (s *lineSplitter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			s.buf = append(s.buf, p...)
			s.spill()
			break
		}
		s.buf = append(s.buf, p[:i]...)
		p = p[i+1:]
		s.spill()
		s.line()
	}
	return n, nil
}

// spill hands over full pieces of an overlong line.
func (s *lineSplitter) spill() {
	for len(s.buf) > s.max {
		cut := s.max
		for c := s.max; c > s.max-utf8.UTFMax && c > 0; c-- {
			if utf8.RuneStart(s.buf[c]) {
				cut = c
				break
			}
		}
		s.emit(string(s.buf[:cut]))
		s.buf = append(s.buf[:0], s.buf[cut:]...)
	}
}

func (s *lineSplitter) line() {
	s.emit(strings.TrimSuffix(string(s.buf), "\r"))
	s.buf = s.buf[:0]
}

// flush hands over a last line that had no newline.
func (s *lineSplitter) flush() {
	if len(s.buf) > 0 {
		s.line()
	}
}
