package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// smallSideBySide is a side-by-side results file of two stacks: rates at
// two sizes and two batches (the reference has no batch 32 at 4 KiB),
// latencies at two sizes, one of them without a range, and a doorbell
// figure no chart draws. Every median is distinct, so a label names its
// point.
const smallSideBySide = `# bench: sidebyside
# date: 2026-11-28
# commit: abc1234
# command: scripts/sidebyside.sh 2000 100 1
figure	unit	size	stack	batch	median	min	max	runs
rate	msg/s	64	reference	1	101	90	110	3
rate	msg/s	64	reference	32	102	-	-	1
rate	msg/s	4096	reference	1	103	95	120	3
rate	msg/s	64	vfrdma, no flags	1	201	150	250	3
rate	msg/s	64	vfrdma, no flags	32	202	180	230	3
rate	msg/s	4096	vfrdma, no flags	1	203	190	210	3
rate	msg/s	4096	vfrdma, no flags	32	204	200	205	3
lat	µs	64	reference		11.5	10.1	12.9	3
lat	µs	4096	reference		12.5	-	-	3
lat	µs	64	vfrdma, no flags		21.5	20.1	22.9	3
db	doorbells/msg	64	reference	1	2.5	-	-	1
`

// svgTexts parses an SVG document with encoding/xml, failing the test if
// it is not well-formed XML with an <svg> root, and returns the contents
// of its <text> elements.
func svgTexts(t *testing.T, doc []byte) []string {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(doc))
	var texts []string
	root := ""
	inText := false
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "the chart is not well-formed XML")
		switch el := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = el.Name.Local
			}
			if el.Name.Local == "text" {
				inText = true
				texts = append(texts, "")
			}
		case xml.EndElement:
			if el.Name.Local == "text" {
				inText = false
			}
		case xml.CharData:
			if inText {
				texts[len(texts)-1] += string(el)
			}
		}
	}
	require.Equal(t, "svg", root, "the document's root element")
	return texts
}

// count is how many of texts are s.
func count(texts []string, s string) int {
	n := 0
	for _, x := range texts {
		if strings.TrimSpace(x) == s {
			n++
		}
	}
	return n
}

// drawSmall writes the charts of a results file into a fresh directory
// and returns them by file name.
func drawSmall(t *testing.T, name, results string) map[string][]byte {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(src, []byte(results), 0o644))
	files, err := Draw(src, dir, "svg")
	require.NoError(t, err)
	out := map[string][]byte{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		out[filepath.Base(f)] = b
	}
	return out
}

// A side-by-side results file gives two charts, the rate by stack and
// batch and the latency by stack; each is valid SVG that holds its
// table's series by name, one labelled point per row of its figure, and
// the stacks along its axis, the date, commit and command in its caption.
func TestAChartFromASmallTableIsValidSVGHoldingTheTablesSeriesAndPoints(t *testing.T) {
	charts := drawSmall(t, "small.tsv", smallSideBySide)
	require.Len(t, charts, 2, "the rate and the latency chart")

	rate := svgTexts(t, charts["small-rate.svg"])
	for _, ser := range []string{"64 B, batch 1", "64 B, batch 32", "4 KiB, batch 1", "4 KiB, batch 32"} {
		assert.Equal(t, 1, count(rate, ser), "series %q in the legend", ser)
	}
	for _, stack := range []string{"reference", "vfrdma, no flags"} {
		assert.Equal(t, 1, count(rate, stack), "stack %q along the axis", stack)
	}
	points := 0
	for _, v := range []string{"101", "102", "103", "201", "202", "203", "204"} {
		assert.Equal(t, 1, count(rate, v), "the point of median %s", v)
		points += count(rate, v)
	}
	assert.Equal(t, 7, points, "one point per rate row")
	assert.Zero(t, count(rate, "11.5"), "no latency in the rate chart")
	assert.Zero(t, count(rate, "2.5"), "no doorbell figure in any chart")

	lat := svgTexts(t, charts["small-latency.svg"])
	assert.Equal(t, 1, count(lat, "64 B"), "series 64 B")
	assert.Equal(t, 1, count(lat, "4 KiB"), "series 4 KiB")
	for _, v := range []string{"11.5", "12.5", "21.5"} {
		assert.Equal(t, 1, count(lat, v), "the point of median %s", v)
	}

	for name, texts := range map[string][]string{"msg/s": rate, "µs, log scale": lat} {
		all := strings.Join(texts, "\n")
		assert.Equal(t, 1, count(texts, "measured 2026-11-28, commit abc1234"), "the %s chart's caption: date and commit", name)
		assert.Equal(t, 1, count(texts, "scripts/sidebyside.sh 2000 100 1"), "the %s chart's caption: the command", name)
		assert.Equal(t, 1, count(texts, name), "the y axis's unit")
		assert.Contains(t, all, "stack (point: the median of the runs; whisker: their range, min to max)", "the x axis")
	}
}

// An amside results file gives the round trip and the rate by size, each
// size along the axis once and each stack a series.
func TestAnAmsideTableGivesRoundTripAndRateBySize(t *testing.T) {
	charts := drawSmall(t, "am.tsv", `# bench: amside
figure	unit	size	stack	batch	median	min	max	runs
rt	µs	8	UCX ucp_am		500	400	600	3
rt	µs	4096	UCX ucp_am		600	-	-	1
rt	µs	8	vfrdma am		450	440	460	3
rate	msg/s	8	UCX ucp_am		30000	20000	31000	3
rate	msg/s	65536	vfrdma am		4000	3000	5000	3
mbs	MB/s	1048576	vfrdma am		250	200	300	3
`)
	require.Len(t, charts, 2)
	rt := svgTexts(t, charts["am-roundtrip.svg"])
	for _, s := range []string{"8 B", "4 KiB", "UCX ucp_am", "vfrdma am", "500", "600", "450"} {
		assert.Equal(t, 1, count(rt, s), "%q in the round trip chart", s)
	}
	rate := svgTexts(t, charts["am-rate.svg"])
	for _, s := range []string{"8 B", "64 KiB", "UCX ucp_am", "vfrdma am", "30 000", "4 000"} {
		assert.Equal(t, 1, count(rate, s), "%q in the rate chart", s)
	}
}

// A file that is not a results file is refused, saying what it lacks;
// one with none of the figures the charts draw is refused too.
func TestAResultsFileThatIsNotOneIsRefused(t *testing.T) {
	for name, doc := range map[string]string{
		"no header":      "# bench: amside\nrt\tµs\t8\tUCX\t\t1\t1\t1\t1\n",
		"wrong header":   "# bench: amside\nfigure\tunit\n",
		"no bench":       strings.Join(Columns, "\t") + "\n",
		"short row":      "# bench: amside\n" + strings.Join(Columns, "\t") + "\nrt\tµs\t8\n",
		"bad median":     "# bench: amside\n" + strings.Join(Columns, "\t") + "\nrt\tµs\t8\tUCX\t\tfast\t1\t1\t1\n",
		"missing median": "# bench: amside\n" + strings.Join(Columns, "\t") + "\nrt\tµs\t8\tUCX\t\t-\t1\t1\t1\n",
		"bad size":       "# bench: amside\n" + strings.Join(Columns, "\t") + "\nrt\tµs\t-8\tUCX\t\t1\t1\t1\t1\n",
		"infinite":       "# bench: amside\n" + strings.Join(Columns, "\t") + "\nrt\tµs\t8\tUCX\t\tInf\t1\t1\t1\n",
		"nothing drawn":  "# bench: amside\n" + strings.Join(Columns, "\t") + "\nmbs\tMB/s\t1048576\tUCX\t\t1\t1\t1\t1\n",
		"unknown bench":  "# bench: other\n" + strings.Join(Columns, "\t") + "\nrate\tmsg/s\t8\tUCX\t1\t1\t1\t1\t1\n",
	} {
		dir := t.TempDir()
		src := filepath.Join(dir, "r.tsv")
		require.NoError(t, os.WriteFile(src, []byte(doc), 0o644))
		_, err := Draw(src, dir, "svg")
		assert.ErrorIs(t, err, ErrFormat, name)
	}
}

func TestSizesAndValuesAreWrittenAsTheTablesWriteThem(t *testing.T) {
	for b, want := range map[int]string{8: "8 B", 64: "64 B", 1000: "1000 B", 4096: "4 KiB", 65536: "64 KiB", 1048576: "1 MiB", 1536: "1536 B"} {
		assert.Equal(t, want, SizeName(b))
	}
	for v, want := range map[float64]string{107390: "107 390", 1239.8: "1 239.8", 102.3: "102.3", 0.13: "0.13", 999: "999", 1000: "1 000", -2500: "-2 500"} {
		assert.Equal(t, want, FormatValue(v))
	}
}

// The charts docs/benchmarks.md shows are drawn from the results files
// beside them (real measurements, recorded there): drawn again, each is
// the same, byte for byte.
func TestTheDocsChartsAreDrawnFromTheResultsBesideThem(t *testing.T) {
	srcs, err := filepath.Glob("../../../docs/charts/*.tsv")
	require.NoError(t, err)
	require.NotEmpty(t, srcs, "docs/charts holds the results files the docs' charts are drawn from")
	dir := t.TempDir()
	drawn := 0
	for _, src := range srcs {
		files, err := Draw(src, dir, "svg")
		require.NoError(t, err, src)
		for _, f := range files {
			want, err := os.ReadFile(f)
			require.NoError(t, err)
			got, err := os.ReadFile(filepath.Join("../../../docs/charts", filepath.Base(f)))
			if assert.NoError(t, err, "docs/charts lacks %s: go run ./internal/tools/benchchart -o docs/charts docs/charts/*.tsv", filepath.Base(f)) {
				assert.True(t, bytes.Equal(want, got), "docs/charts/%s is not what its results draw: go run ./internal/tools/benchchart -o docs/charts docs/charts/*.tsv", filepath.Base(f))
			}
			drawn++
		}
	}
	svgs, err := filepath.Glob("../../../docs/charts/*.svg")
	require.NoError(t, err)
	assert.Len(t, svgs, drawn, "every chart in docs/charts is drawn from a results file there")
}

// The command line: no results file is an error naming the usage, and
// the paths written are printed one a line.
func TestTheCommandNeedsAResultsFileAndPrintsWhatItWrote(t *testing.T) {
	var out, errs bytes.Buffer
	err := run(nil, &out, &errs)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "benchchart -o DIR RESULTS.tsv")

	dir := t.TempDir()
	src := filepath.Join(dir, "sbs.tsv")
	require.NoError(t, os.WriteFile(src, []byte(smallSideBySide), 0o644))
	require.NoError(t, run([]string{"-o", dir, src}, &out, &errs))
	assert.Equal(t, filepath.Join(dir, "sbs-rate.svg")+"\n"+filepath.Join(dir, "sbs-latency.svg")+"\n", out.String())
	assert.Error(t, run([]string{"-bogus"}, &out, &errs), "an unknown flag")
}

// docs/benchmarks.md opens with one screen, before "## The record": the
// latest comparisons' tables and every chart in docs/charts; each figure a
// chart there draws is in those tables too (the charts and the tables
// show the same numbers).
func TestTheDocsFirstScreenShowsEveryChartAndItsNumbers(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/benchmarks.md")
	require.NoError(t, err)
	first, _, ok := strings.Cut(string(doc), "\n## The record\n")
	require.True(t, ok, `docs/benchmarks.md has a "## The record" heading after its first screen`)
	srcs, err := filepath.Glob("../../../docs/charts/*.tsv")
	require.NoError(t, err)
	require.NotEmpty(t, srcs)
	for _, src := range srcs {
		f, err := os.Open(src)
		require.NoError(t, err)
		tb, err := ReadTable(f)
		f.Close()
		require.NoError(t, err, src)
		base := strings.TrimSuffix(filepath.Base(src), ".tsv")
		assert.True(t, strings.Contains(first, tb.Date), "%s: the date it was measured, %s, is not on the first screen", base, tb.Date)
		assert.True(t, strings.Contains(first, tb.Commit), "%s: the commit it was measured on, %s, is not on the first screen", base, tb.Commit)
		for _, s := range Specs {
			c := s.Build(tb)
			if c == nil {
				continue
			}
			chart := `src="charts/` + base + "-" + s.Name + `.svg"`
			assert.True(t, strings.Contains(first, chart), "the first screen does not show %s", chart)
			for _, ser := range c.Series {
				for _, r := range c.Points[ser] {
					if r != nil {
						assert.True(t, strings.Contains(first, "| "+FormatValue(r.Median)), "%s: %s %s at %d B, %s, is in no table of the first screen", base, r.Figure, r.Stack, r.Size, FormatValue(r.Median))
					}
				}
			}
		}
	}
}
