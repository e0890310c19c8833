package scripts

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// earlyExit matches a pipe into a reader that may stop reading before its
// writer is done: grep -q/-m, head with a count, awk or sed that quit.
// Under pipefail the writer then dies of SIGPIPE and the pipeline fails,
// or not, depending on which process the scheduler ran first.
var earlyExit = regexp.MustCompile(`\|\s*(` +
	`grep\s+(-\S*[qm]\S*|--quiet|--silent|--max-count)` + // grep -q, -Eq, -m1
	`|head\s+(-n\s*|-c\s*|-)?[0-9]|head\s*($|[|;)])` + // head -1, head -n 5, head (but not head -n -30, which reads all)
	`|awk\s[^|]*\bexit\b` + // awk '{...; exit}'
	`|sed\s+(-n\s+)?'?[0-9]*q` + // sed 1q
	`)`)

// earlyExitLines lists the lines of text that pipe into such a reader,
// trimmed.
func earlyExitLines(text string) []string {
	var hits []string
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue // a comment line
		}
		if earlyExit.MatchString(line) {
			hits = append(hits, strings.TrimSpace(line))
		}
	}
	return hits
}

// The detector knows the shapes that fail by timing and lets the safe
// ones through, so the scan below can be trusted.
func TestEarlyExitDetectorKnowsTheShapes(t *testing.T) {
	// The bad shapes are written with PIPE for "|", so that this file does
	// not itself hold them for a scan of scripts/ to find.
	for _, bad := range []string{
		`echo "$out" PIPE grep -q 'x' || fail`,
		`echo "$out" PIPE grep -Eq 'x|y'`,
		`cmd PIPE grep --quiet x`,
		`cmd PIPE grep -m1 x`,
		`find . -name x PIPE head -1`,
		`cmd PIPE head -n 5`,
		`cmd PIPE head`,
		`cmd PIPE awk '/x/{print $2; exit}'`,
		`cmd PIPE sed 1q`,
	} {
		bad = strings.ReplaceAll(bad, "PIPE", "|")
		assert.NotEmpty(t, earlyExitLines(bad), bad)
	}
	for _, good := range []string{
		`grep -q 'x' <<<"$out" || fail`,
		`[ "$(echo "$out" | grep -c x)" = 2 ]`,
		`ls -1d dirs | head -n -30 | xargs -r rm -rf`,
		`cmd | awk '/x/ && !n++ {print $2}'`,
		`cmd | sed -n 1,40p`,
		`# echo "$out" PIPE grep -q x (a comment)`,
	} {
		good = strings.ReplaceAll(good, "PIPE", "|")
		assert.Empty(t, earlyExitLines(good), good)
	}
}

// No script the project runs pipes into a reader that can quit early:
// under pipefail (set in most of them) such a check passes or fails by
// timing, and under load CI would reject an honest run.
func TestNoScriptPipesIntoAReaderThatQuitsEarly(t *testing.T) {
	files, err := filepath.Glob("*.sh")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	files = append(files, "../.ci/run", "../Makefile")
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		assert.Empty(t, earlyExitLines(string(b)), "%s pipes into a reader that may quit before its writer is done; use a here-string (grep -q x <<<\"$out\") or a reader that reads everything", f)
	}
}
