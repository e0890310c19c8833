package guest

import (
	"reflect"
	"strings"
	"testing"

	"github.com/vfrdma/vfrdma/qemu/proto"
)

// The outputs below are what go1.26 test binaries print with -test.v.
func TestTestParser(t *testing.T) {
	pass, fail, skip := proto.StatusPass, proto.StatusFail, proto.StatusSkip
	for _, tc := range []struct {
		name   string
		out    string
		why    string // passed to Finish
		want   []TestResult
		crash  string // prefix of Crash()
		finish []TestResult
	}{
		{
			name: "pass fail skip and subtests",
			out: `=== RUN   TestPass
    x_test.go:10: hello
--- PASS: TestPass (0.00s)
=== RUN   TestSub
=== RUN   TestSub/a_b
no newline=== RUN   TestSub/fails
    x_test.go:13: bad
=== RUN   TestSub/skips
    x_test.go:14: why
--- FAIL: TestSub (1.25s)
    --- PASS: TestSub/a_b (0.00s)
    --- FAIL: TestSub/fails (0.50s)
    --- SKIP: TestSub/skips (0.00s)
=== RUN   TestSkip
    x_test.go:16: skipped
--- SKIP: TestSkip (0.00s)
FAIL`,
			want: []TestResult{
				{Name: "TestPass", Status: pass},
				{Name: "TestSub", Status: fail, Elapsed: 1.25},
				{Name: "TestSub/a_b", Status: pass},
				{Name: "TestSub/fails", Status: fail, Elapsed: 0.5},
				{Name: "TestSub/skips", Status: skip},
				{Name: "TestSkip", Status: skip},
			},
		},
		{
			name: "result after output without newline",
			out: `=== RUN   TestA
partial--- PASS: TestA (0.01s)
=== RUN   TestB
says --- FAIL: TestNotRunning (0.00s)
--- PASS: TestB (0.00s)`,
			want: []TestResult{{Name: "TestA", Status: pass, Elapsed: 0.01}, {Name: "TestB", Status: pass}},
		},
		{
			name: "parallel tests interleaved",
			out: `=== RUN   TestP1
=== PAUSE TestP1
=== RUN   TestP2
=== PAUSE TestP2
=== CONT  TestP1
=== CONT  TestP2
=== NAME  TestP1
    p_test.go:5: log
--- PASS: TestP2 (0.20s)
--- FAIL: TestP1 (0.30s)`,
			want: []TestResult{{Name: "TestP2", Status: pass, Elapsed: 0.2}, {Name: "TestP1", Status: fail, Elapsed: 0.3}},
		},
		{
			name: "panic in the test goroutine",
			out: `=== RUN   TestPanic
--- FAIL: TestPanic (0.00s)
panic: boom [recovered, repanicked]

goroutine 19 [running]:
testing.tRunner.func1.2({0x551fc0, 0x595660})
	/usr/local/go/src/testing/testing.go:1974 +0x232`,
			why:   "exit status 2",
			want:  []TestResult{{Name: "TestPanic", Status: fail}},
			crash: "panic: boom [recovered, repanicked]\n\ngoroutine 19 [running]:\ntesting.tRunner.func1.2",
		},
		{
			name: "panic in another goroutine: no result line",
			out: `=== RUN   TestOK
--- PASS: TestOK (0.00s)
=== RUN   TestPanic
=== RUN   TestPanic/sub
panic: boom in goroutine

goroutine 8 [running]:
tv.TestPanic.func1()
	/tmp/tv/x_test.go:22 +0x25
created by tv.TestPanic in goroutine 7
	/tmp/tv/x_test.go:22 +0x97

goroutine 1 [chan receive]:
testing.(*T).Run(0xc000003500, {0x57e9f5, 0x9}, 0x5a1c08)`,
			why:   "exit status 2",
			want:  []TestResult{{Name: "TestOK", Status: pass}},
			crash: "panic: boom in goroutine\n\ngoroutine 8 [running]:\ntv.TestPanic.func1()\n\t/tmp/tv/x_test.go:22 +0x25\ncreated by tv.TestPanic in goroutine 7\n\t/tmp/tv/x_test.go:22 +0x97",
			finish: []TestResult{
				{Name: "TestPanic", Status: fail, Msg: "panic: boom in goroutine"},
				{Name: "TestPanic/sub", Status: fail, Msg: "panic: boom in goroutine"},
			},
		},
		{
			name: "test timeout",
			out: `=== RUN   TestSlow
panic: test timed out after 1s
	running tests:
		TestSlow (1s)

goroutine 17 [running]:`,
			why:    "exit status 2",
			crash:  "panic: test timed out after 1s\n\trunning tests:\n\t\tTestSlow (1s)",
			finish: []TestResult{{Name: "TestSlow", Status: fail, Msg: "panic: test timed out after 1s"}},
		},
		{
			name:   "killed without a word",
			out:    "=== RUN   TestHang\n    h_test.go:3: waiting",
			why:    "killed: timeout after 1m0s",
			finish: []TestResult{{Name: "TestHang", Status: fail, Msg: "no result: killed: timeout after 1m0s"}},
		},
		{
			name: "not result lines",
			out: `--- PASS: TestX
--- PASS: TestX (abc)
--- PASS: Test X (0.00s)
--- PASS: (0.00s)
---- PASS: TestY (0.00s)
=== RUN   ` + `
PASS
ok`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p TestParser
			var got []TestResult
			for line := range strings.SplitSeq(tc.out, "\n") {
				if r, ok := p.Line(line); ok {
					got = append(got, r)
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("results\n got %+v\nwant %+v", got, tc.want)
			}
			if c := p.Crash(); !strings.HasPrefix(c, tc.crash) || (tc.crash == "") != (c == "") {
				t.Errorf("Crash() = %q, want prefix %q", c, tc.crash)
			}
			fin := p.Finish(tc.why)
			if len(fin) != len(tc.finish) {
				t.Fatalf("Finish = %+v, want %+v", fin, tc.finish)
			}
			for i, r := range fin {
				w := tc.finish[i]
				if r.Name != w.Name || r.Status != w.Status || !strings.HasPrefix(r.Msg, w.Msg) || !strings.Contains(r.Msg, tc.why) {
					t.Errorf("Finish[%d] = %+v, want %+v (message mentioning %q)", i, r, w, tc.why)
				}
			}
			if again := p.Finish(tc.why); len(again) != 0 {
				t.Errorf("second Finish = %+v", again)
			}
		})
	}
}

func TestTestParserCrashBounded(t *testing.T) {
	var p TestParser
	p.Line("panic: " + strings.Repeat("x", 100))
	for range 100 {
		p.Line(strings.Repeat("y", 500))
	}
	if c := p.Crash(); len(c) > crashMaxBytes+200 || strings.Count(c, "\n") >= crashMaxLines {
		t.Errorf("crash text kept %d bytes, %d lines", len(c), strings.Count(c, "\n")+1)
	}
}
