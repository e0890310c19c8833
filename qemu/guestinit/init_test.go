package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/qemu/guest"
	"github.com/vfrdma/vfrdma/qemu/proto"
)

func TestLineSplitter(t *testing.T) {
	for _, tc := range []struct {
		name   string
		writes []string
		want   []string
	}{
		{"lines", []string{"a\nb\r\n", "\nc"}, []string{"a", "b", "", "c"}},
		{"split writes", []string{"ab", "c", "d\ne", "f\n"}, []string{"abcd", "ef"}},
		{"long", []string{strings.Repeat("x", 9) + "\n"}, []string{"xxxx", "xxxx", "x"}},
		{"exactly max", []string{"xxxx\nyyyy"}, []string{"xxxx", "yyyy"}},
		{"utf8 kept whole", []string{"aé", "éé\n"}, []string{"aé", "éé"}}, // é is 2 bytes
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			s := lineSplitter{max: 4, emit: func(l string) { got = append(got, l) }}
			for _, w := range tc.writes {
				if n, err := s.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write = %d, %v", n, err)
				}
			}
			s.flush()
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestParseCmdline(t *testing.T) {
	for _, tc := range []struct {
		in, vm, vms string
		bad         bool
	}{
		{"console=ttyS0 vfrdma.vm=1 vfrdma.vms=2 panic=-1\n", "1", "2", false},
		{"console=ttyS0", "0", "1", false},
		{"vfrdma.vm=x vfrdma.vms=2", "0", "2", true},
		{"vfrdma.vm=0 vfrdma.vms=0", "0", "1", true},
		{"vfrdma.vm=01", "0", "1", true},
	} {
		vm, vms, err := parseCmdline(tc.in)
		if vm != tc.vm || vms != tc.vms || (err != nil) != tc.bad {
			t.Errorf("parseCmdline(%q) = %q, %q, %v", tc.in, vm, vms, err)
		}
	}
}

func TestStepArgs(t *testing.T) {
	s := guest.Step{Kind: guest.KindGoTest, Timeout: time.Minute, Args: []string{"-test.run=X"}}
	if got, want := stepArgs(s), []string{"-test.v", "-test.timeout=54s", "-test.run=X"}; !reflect.DeepEqual(got, want) {
		t.Errorf("gotest args %q, want %q", got, want)
	}
	s.Args = []string{"-test.timeout=5s"}
	if got, want := stepArgs(s), []string{"-test.v", "-test.timeout=5s"}; !reflect.DeepEqual(got, want) {
		t.Errorf("gotest args with a timeout %q, want %q", got, want)
	}
	s.Kind = guest.KindCmd
	if got := stepArgs(s); !reflect.DeepEqual(got, s.Args) {
		t.Errorf("cmd args %q", got)
	}
}

// records collects what a reporter writes.
type records struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (r *records) Write(b []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buf.Write(b)
}

func (r *records) all(t *testing.T) []proto.Record {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []proto.Record
	sc := bufio.NewScanner(bytes.NewReader(r.buf.Bytes()))
	for sc.Scan() {
		rec, ok, err := proto.Parse(sc.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			out = append(out, rec)
		}
	}
	return out
}

func runOne(t *testing.T, s guest.Step, env ...string) ([]proto.Record, bool) {
	t.Helper()
	var out records
	ok := runStep(newReporter(&out), s, env)
	recs := out.all(t)
	if len(recs) < 2 || recs[0].Event != proto.EventStart || recs[len(recs)-1].Event != proto.EventExit {
		t.Fatalf("records do not go from start to exit: %+v", recs)
	}
	for _, r := range recs {
		if r.Prog != s.Name {
			t.Errorf("record for %q, want %q: %+v", r.Prog, s.Name, r)
		}
	}
	return recs, ok
}

func script(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "prog.sh")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRunCmd(t *testing.T) {
	for _, tc := range []struct {
		name    string
		body    string
		timeout time.Duration
		code    int
		msg     string
		lines   []string // stdout's
		errs    []string // stderr's
	}{
		{name: "ok", body: `echo "$VFRDMA_GUEST $EXTRA"; echo err >&2; printf tail`, code: 0, lines: []string{"1 x", "tail"}, errs: []string{"err"}},
		{name: "exit code", body: "exit 3", code: 3},
		{name: "signal", body: "kill -SEGV $$", code: -1, msg: "killed by signal: segmentation fault"},
		{name: "timeout", body: "echo started; sleep 100", timeout: 300 * time.Millisecond, code: -1, msg: "killed: timeout after 300ms", lines: []string{"started"}},
		// A child left behind holds the output pipe: the init must not wait for it.
		{name: "background child", body: "sleep 100 & echo bye", code: 0, lines: []string{"bye"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.timeout == 0 {
				tc.timeout = 10 * time.Second
			}
			t0 := time.Now()
			recs, ok := runOne(t, guest.Step{Name: "p", Path: script(t, tc.body), Kind: guest.KindCmd, Timeout: tc.timeout, Env: []string{"EXTRA=x"}}, proto.EnvGuest+"=1", "EXTRA=overridden")
			// The programs sleep 100 s: an init that waited for them (or for
			// the child holding the pipe) would take that long.
			if d := time.Since(t0); d > 60*time.Second {
				t.Errorf("took %v: the init waited for the program or its child", d)
			}
			var lines, errs []string
			for _, r := range recs {
				switch {
				case r.Event == proto.EventOut && r.Stream == proto.StreamStderr:
					errs = append(errs, r.Line)
				case r.Event == proto.EventOut:
					lines = append(lines, r.Line)
				}
			}
			if !reflect.DeepEqual(lines, tc.lines) || !reflect.DeepEqual(errs, tc.errs) {
				t.Errorf("stdout %q, stderr %q; want %q, %q", lines, errs, tc.lines, tc.errs)
			}
			exit := recs[len(recs)-1]
			if exit.Code != tc.code || exit.Msg != tc.msg || ok != (tc.code == 0) {
				t.Errorf("exit %+v (ok %v), want code %d msg %q", exit, ok, tc.code, tc.msg)
			}
		})
	}
}

// A plain program's stderr reaches the host apart from its stdout, each
// stream's lines in the order written: pvvm prints the one on its stdout
// and the other on its stderr.
func TestAProgramsStderrIsReportedApartFromItsStdout(t *testing.T) {
	body := `for i in 1 2 3 4 5 6 7 8; do echo "out $i"; echo "err $i" >&2; done; printf 'out last'; printf 'err last' >&2`
	recs, ok := runOne(t, guest.Step{Name: "p", Path: script(t, body), Kind: guest.KindCmd, Timeout: 10 * time.Second})
	require.True(t, ok)
	var out, errs []string
	for _, r := range recs {
		if r.Event != proto.EventOut {
			continue
		}
		switch r.Stream {
		case proto.StreamStdout:
			out = append(out, r.Line)
		case proto.StreamStderr:
			errs = append(errs, r.Line)
		default:
			t.Errorf("stream %q", r.Stream)
		}
	}
	var wantOut, wantErr []string
	for i := 1; i <= 8; i++ {
		wantOut = append(wantOut, fmt.Sprintf("out %d", i))
		wantErr = append(wantErr, fmt.Sprintf("err %d", i))
	}
	assert.Equal(t, append(wantOut, "out last"), out)
	assert.Equal(t, append(wantErr, "err last"), errs)
}

// The exchange's line and the step's OKIfOutput count on either stream,
// now that the two are read apart (perftest's are in
// TestOKIfOutputAfterTheExchange; here the other way round).
func TestOKIfOutputCountsOnEitherStream(t *testing.T) {
	body := `echo " remote address: LID 0000 QPN 0x0013" >&2; echo "Can't produce a report"; exit 1`
	recs, ok := runOne(t, guest.Step{Name: "p", Path: script(t, body), Kind: guest.KindCmd, Timeout: 5 * time.Second, OKIfOutput: "Can't produce a report"})
	require.True(t, ok, "%+v", recs)
	assert.Equal(t, 0, recs[len(recs)-1].Code)
}

func TestRunMissing(t *testing.T) {
	recs, ok := runOne(t, guest.Step{Name: "p", Path: "/nonexistent/prog", Kind: guest.KindCmd, Timeout: time.Second})
	if exit := recs[len(recs)-1]; ok || exit.Code != -1 || !strings.HasPrefix(exit.Msg, "not run: ") {
		t.Errorf("exit %+v", exit)
	}
}

// TestRunGoTest runs a real test binary (testdata/fake) the way the init
// does in the guest.
func TestRunGoTest(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "fake.test")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := guest.BuildTestBinary(ctx, "testdata/fake", bin); err != nil {
		t.Fatal(err)
	}
	type res struct{ name, status string }
	common := []res{{"TestOK", "pass"}, {"TestOK/sub", "pass"}, {"TestOK/skipped", "skip"}}
	for _, tc := range []struct {
		mode    string
		args    []string
		timeout time.Duration
		tests   []res
		code    int
		msg     string // prefix of the exit message
		testMsg string // prefix of the message of TestMode's result
	}{
		{mode: "ok", tests: append(common, res{"TestMode", "pass"}, res{"TestLast", "pass"})},
		{mode: "fail", tests: append(common, res{"TestMode", "fail"}, res{"TestLast", "pass"}), code: 1},
		{mode: "panic", tests: append(common, res{"TestMode", "fail"}), code: 2, msg: "panic: boom in goroutine", testMsg: "panic: boom in goroutine\n\ngoroutine"},
		// The testing package's own timeout (its panic names the running
		// test) is reported as the test's failure and the exit's message;
		// the kill comes long after it (stepArgs' margin is tested above).
		{mode: "hang", args: []string{"-test.timeout=1s"}, timeout: 60 * time.Second, tests: append(common, res{"TestMode", "fail"}), code: 2, msg: "panic: test timed out after 1s", testMsg: "panic: test timed out after 1s\n\trunning tests:\n\t\tTestMode"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			if tc.timeout == 0 {
				tc.timeout = 20 * time.Second
			}
			recs, ok := runOne(t, guest.Step{Name: "fake.test", Path: bin, Kind: guest.KindGoTest, Args: tc.args, Timeout: tc.timeout, Env: []string{"FAKE_MODE=" + tc.mode}})
			var tests []res
			var long, stderr int
			for _, r := range recs {
				switch r.Event {
				case proto.EventTest:
					tests = append(tests, res{r.Test, r.Status})
					if r.Test == "TestMode" && !strings.HasPrefix(r.Msg, tc.testMsg) {
						t.Errorf("TestMode message %q, want prefix %q", r.Msg, tc.testMsg)
					}
				case proto.EventOut:
					if len(r.Line) > maxLine {
						t.Errorf("line of %d bytes", len(r.Line))
					}
					if strings.HasPrefix(r.Line, "éé") {
						long++
					}
					if r.Line == "to stderr" {
						stderr++
						// One stream for a test binary: the parser reads
						// its stderr in order with its stdout.
						if r.Stream != proto.StreamStdout {
							t.Errorf("a test binary's stderr line reported on stream %q", r.Stream)
						}
					}
				}
			}
			if !reflect.DeepEqual(tests, tc.tests) {
				t.Errorf("tests %v, want %v", tests, tc.tests)
			}
			if long != 2 || stderr != 1 {
				t.Errorf("%d pieces of the long line (want 2), %d stderr lines (want 1)", long, stderr)
			}
			exit := recs[len(recs)-1]
			if exit.Code != tc.code || !strings.HasPrefix(exit.Msg, tc.msg) || (tc.msg == "") != (exit.Msg == "") || ok != (tc.code == 0) {
				t.Errorf("exit %+v (ok %v), want code %d msg %q", exit, ok, tc.code, tc.msg)
			}
		})
	}
}
