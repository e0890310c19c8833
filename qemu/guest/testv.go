package guest

import (
	"slices"
	"strconv"
	"strings"

	"github.com/vfrdma/vfrdma/qemu/proto"
)

// TestResult is the outcome of one test (or subtest) of a test binary.
type TestResult struct {
	Name    string  // TestFoo or TestFoo/sub
	Status  string  // proto.StatusPass, StatusFail or StatusSkip
	Elapsed float64 // seconds, as the binary printed them
	Msg     string  // for a test that never reported: why it failed
}

// Limits on the crash text a TestParser keeps.
const (
	crashMaxLines = 12
	crashMaxBytes = 2048
)

// TestParser follows the output of a test binary run with -test.v, one line
// at a time (stdout and stderr merged, newlines stripped), and turns its
// result lines into TestResults. A test that started but never printed a
// result (the binary panicked in another goroutine, hit -test.timeout, or was
// killed) is reported failed by Finish, with the crash text if there was one.
//
// The zero value is ready to use. A TestParser is not safe for concurrent use.
type TestParser struct {
	running  []string // tests seen in === RUN without a result yet, in order
	crash    []string // a "panic:" or "fatal error:" line and what follows
	crashLen int
	inCrash  bool
	blanks   int // blank lines seen in the crash text
}

// Line consumes one line of output and returns the result it reports, if any.
func (p *TestParser) Line(line string) (TestResult, bool) {
	line = strings.TrimRight(line, "\r\n")
	if p.inCrash {
		// The panic's message, a blank line, the panicking goroutine's
		// first frames: enough to find the culprit.
		if line == "" {
			p.blanks++
		}
		if p.blanks == 2 || len(p.crash) >= crashMaxLines || p.crashLen+len(line) > crashMaxBytes {
			p.inCrash = false
		} else {
			p.crash = append(p.crash, line)
			p.crashLen += len(line)
		}
	}
	trimmed := strings.TrimLeft(line, " \t")
	// "=== RUN" can follow output printed without a newline.
	if i := strings.Index(line, "=== RUN "); i >= 0 {
		if name := strings.TrimSpace(line[i+len("=== RUN "):]); name != "" && !strings.ContainsAny(name, " \t") && !slices.Contains(p.running, name) {
			p.running = append(p.running, name)
		}
		return TestResult{}, false
	}
	if p.crash == nil && (strings.HasPrefix(line, "panic: ") || strings.HasPrefix(line, "fatal error: ")) {
		p.crash = []string{line}
		p.crashLen = len(line)
		p.inCrash = true
		p.blanks = 0
	}
	// A result line normally starts the line (indented per subtest level).
	// Output a test printed without a final newline can precede it; then
	// the result counts only for a test known to be running, so that a test
	// printing result-like text does not invent tests.
	if r, ok := parseResult(trimmed); ok {
		p.finish(r.Name)
		return r, true
	}
	for _, marker := range []string{"--- PASS: ", "--- FAIL: ", "--- SKIP: "} {
		i := strings.Index(line, marker)
		if i <= 0 {
			continue
		}
		if r, ok := parseResult(line[i:]); ok && slices.Contains(p.running, r.Name) {
			p.finish(r.Name)
			return r, true
		}
	}
	return TestResult{}, false
}

func (p *TestParser) finish(name string) {
	if i := slices.Index(p.running, name); i >= 0 {
		p.running = slices.Delete(p.running, i, i+1)
	}
}

// Crash returns the panic or fatal error text the binary printed, if any:
// the first such line and a few lines after it (the message and the top
// of the panicking goroutine's stack).
func (p *TestParser) Crash() string {
	return strings.TrimRight(strings.Join(p.crash, "\n"), "\n")
}

// Finish reports, as failed, every test that started and never reported a
// result, in the order they started, and forgets them. why says how the
// binary ended (e.g. "exit status 2"); the crash text, if any, comes first.
func (p *TestParser) Finish(why string) []TestResult {
	msg := "no result: " + why
	if c := p.Crash(); c != "" {
		msg = c + "\n(" + msg + ")"
	}
	var out []TestResult
	for _, name := range p.running {
		out = append(out, TestResult{Name: name, Status: proto.StatusFail, Msg: msg})
	}
	p.running = nil
	return out
}

// parseResult parses "--- PASS: TestName (1.23s)" (or FAIL, SKIP).
func parseResult(s string) (TestResult, bool) {
	var status string
	switch {
	case strings.HasPrefix(s, "--- PASS: "):
		status = proto.StatusPass
	case strings.HasPrefix(s, "--- FAIL: "):
		status = proto.StatusFail
	case strings.HasPrefix(s, "--- SKIP: "):
		status = proto.StatusSkip
	default:
		return TestResult{}, false
	}
	rest := strings.TrimRight(s[len("--- PASS: "):], " ")
	i := strings.LastIndex(rest, " (")
	if i <= 0 || !strings.HasSuffix(rest, "s)") {
		return TestResult{}, false
	}
	name := rest[:i]
	secs, err := strconv.ParseFloat(rest[i+2:len(rest)-2], 64)
	if err != nil || secs < 0 || strings.ContainsAny(name, " \t") {
		return TestResult{}, false
	}
	return TestResult{Name: name, Status: status, Elapsed: secs}, true
}
