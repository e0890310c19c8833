package main

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Spec is one chart of a bench: which figure of its results it draws,
// what stands along the x axis and what makes a series (a bar of each
// group, in the legend).
type Spec struct {
	Name   string // the file's suffix: <results>-<Name>.svg
	Bench  string // the results' bench
	Figure string // the rows it draws
	Title  string
	XLabel string
	Log    bool             // a logarithmic y axis: the figures span decades
	X      func(Row) string // the group a row stands in
	Series func(Row) string // the series a row belongs to
}

// Specs are the charts benchchart draws, by bench: the side-by-side's
// message rate by stack and batch and its one-way latency by stack, and
// am beside UCX, round trip and rate by size.
var Specs = []Spec{
	{Name: "rate", Bench: "sidebyside", Figure: "rate", Title: "RC SEND message rate between two guests, by stack and batch", XLabel: "stack",
		X: func(r Row) string { return r.Stack }, Series: func(r Row) string { return SizeName(r.Size) + ", batch " + strconv.Itoa(r.Batch) }},
	{Name: "latency", Bench: "sidebyside", Figure: "lat", Log: true, Title: "RC SEND one-way latency between two guests (half the median round trip), by stack", XLabel: "stack",
		X: func(r Row) string { return r.Stack }, Series: func(r Row) string { return SizeName(r.Size) }},
	{Name: "roundtrip", Bench: "amside", Figure: "rt", Log: true, Title: "Active messages: round trip between two guests, by message size", XLabel: "message size",
		X: func(r Row) string { return SizeName(r.Size) }, Series: func(r Row) string { return r.Stack }},
	{Name: "rate", Bench: "amside", Figure: "rate", Log: true, Title: "Active messages: message rate between two guests, by message size", XLabel: "message size",
		X: func(r Row) string { return SizeName(r.Size) }, Series: func(r Row) string { return r.Stack }},
}

// Chart is a Spec's numbers: the groups along x and, per series, the
// point it has in each group (nil where it has none).
type Chart struct {
	Spec
	Unit   string
	Groups []string
	Series []string
	Points map[string][]*Row // series → one per group
}

// Build gathers a Spec's rows of t, groups and series in the order the
// table first names them; it is nil if t has none of them.
func (s Spec) Build(t *Table) *Chart {
	if t.Bench != s.Bench {
		return nil
	}
	c := &Chart{Spec: s, Points: map[string][]*Row{}}
	gi := map[string]int{}
	for i := range t.Rows {
		r := &t.Rows[i]
		if r.Figure != s.Figure {
			continue
		}
		if c.Unit == "" {
			c.Unit = r.Unit
		}
		g, ser := s.X(*r), s.Series(*r)
		if _, ok := gi[g]; !ok {
			gi[g] = len(c.Groups)
			c.Groups = append(c.Groups, g)
		}
		if _, ok := c.Points[ser]; !ok {
			c.Series = append(c.Series, ser)
			c.Points[ser] = nil
		}
	}
	if len(c.Groups) == 0 {
		return nil
	}
	for _, ser := range c.Series {
		c.Points[ser] = make([]*Row, len(c.Groups))
	}
	for i := range t.Rows {
		r := &t.Rows[i]
		if r.Figure == s.Figure {
			c.Points[s.Series(*r)][gi[s.X(*r)]] = r
		}
	}
	return c
}

// Caption is the chart's title lines under its title: when and on what
// the numbers were measured, then the command that measured them, then
// the note, each on a line of its own.
func Caption(t *Table) string {
	var parts, lines []string
	if t.Date != "" {
		parts = append(parts, "measured "+t.Date)
	}
	if t.Commit != "" {
		parts = append(parts, "commit "+t.Commit)
	}
	for _, l := range []string{strings.Join(parts, ", "), t.Command, t.Note} {
		if l != "" {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

// FormatValue is how a point's label writes its median: as the results
// file has it, thousands grouped by a space as in the tables.
func FormatValue(v float64) string {
	s := strconv.FormatFloat(v, 'f', -1, 64)
	sign := ""
	if strings.HasPrefix(s, "-") {
		sign, s = "-", s[1:]
	}
	whole, frac, _ := strings.Cut(s, ".")
	var b strings.Builder
	b.WriteString(sign)
	for i, d := range whole {
		if i > 0 && (len(whole)-i)%3 == 0 {
			b.WriteByte(' ')
		}
		b.WriteRune(d)
	}
	if frac != "" {
		b.WriteString("." + frac)
	}
	return b.String()
}

// slot is the room one series' point takes in its group; a chart is as
// wide as its points need.
const slot = vg.Length(13)

// Size is the chart's drawn size.
func (c *Chart) Size() (w, h vg.Length) {
	w = vg.Length(len(c.Groups)*len(c.Series))*slot*1.6 + 2.2*vg.Inch
	if w < 7*vg.Inch {
		w = 7 * vg.Inch
	}
	return w, 4.8 * vg.Inch
}

// palette is the series' colours (Okabe and Ito's, told apart with a
// colour vision deficiency); each series has its own glyph too.
var palette = []color.Color{
	color.RGBA{0, 114, 178, 255}, color.RGBA{230, 159, 0, 255}, color.RGBA{0, 158, 115, 255},
	color.RGBA{204, 121, 167, 255}, color.RGBA{86, 180, 233, 255}, color.RGBA{213, 94, 0, 255},
	color.RGBA{0, 0, 0, 255}, color.RGBA{240, 228, 66, 255},
}

// Plot lays the chart out: per group one point per series side by side,
// the point its median, a whisker its range (min to max), its median
// written above. A Log chart's y axis is logarithmic.
func (c *Chart) Plot(t *Table) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = c.Title + "\n" + Caption(t)
	p.Title.TextStyle.Font.Size = 10
	p.X.Label.Text = c.XLabel + " (point: the median of the runs; whisker: their range, min to max)"
	p.X.Label.TextStyle.Font.Size = 10
	p.Y.Label.Text = c.Unit
	if c.Log {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		p.Y.Label.Text += ", log scale"
	}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.TextStyle.Font.Size = 8
	p.NominalX(c.Groups...)
	p.X.Tick.Label.Font.Size = 8
	p.X.Padding = 0
	n := len(c.Series)
	for i, ser := range c.Series {
		s := &series{
			rows:   c.Points[ser],
			offset: (vg.Length(i) - vg.Length(n-1)/2) * slot,
			log:    c.Log,
			glyph:  draw.GlyphStyle{Color: palette[i%len(palette)], Radius: vg.Points(3.5), Shape: plotutil.Shape(i)},
			label:  p.Title.TextStyle,
		}
		s.label.Font.Size = 6.5
		s.label.Rotation = math.Pi / 2
		s.label.XAlign = draw.XLeft
		s.label.YAlign = draw.YCenter
		p.Add(s)
		p.Legend.Add(ser, s)
	}
	return p, nil
}

// WriteSVG draws the chart as SVG into w.
func (c *Chart) WriteSVG(w io.Writer, t *Table) error { return c.Write(w, t, "svg") }

// Write draws the chart into w in a format gonum's plot writes (svg, png).
func (c *Chart) Write(w io.Writer, t *Table, format string) error {
	p, err := c.Plot(t)
	if err != nil {
		return err
	}
	width, height := c.Size()
	wt, err := p.WriterTo(width, height, format)
	if err != nil {
		return fmt.Errorf("chart %s: %w", c.Name, err)
	}
	if _, err := wt.WriteTo(w); err != nil {
		return fmt.Errorf("writing chart %s: %w", c.Name, err)
	}
	return nil
}

// series draws one series: in each group its median's glyph, its range's
// whisker and its median's value, at its offset from the group's centre.
type series struct {
	rows   []*Row
	offset vg.Length
	log    bool
	glyph  draw.GlyphStyle
	label  draw.TextStyle
}

var whisker = draw.LineStyle{Color: color.Gray{Y: 80}, Width: vg.Points(0.8)}

// Plot implements plot.Plotter.
func (s *series) Plot(c draw.Canvas, plt *plot.Plot) {
	trX, trY := plt.Transforms(&c)
	for g, r := range s.rows {
		if r == nil {
			continue
		}
		x := trX(float64(g)) + s.offset
		top := trY(r.Median) + s.glyph.Radius
		if lo, hi, ok := r.spread(); ok {
			ylo, yhi := trY(lo), trY(hi)
			c.StrokeLine2(whisker, x, ylo, x, yhi)
			c.StrokeLine2(whisker, x-3, ylo, x+3, ylo)
			c.StrokeLine2(whisker, x-3, yhi, x+3, yhi)
			top = max(top, yhi)
		}
		c.DrawGlyph(s.glyph, vg.Point{X: x, Y: trY(r.Median)})
		c.FillText(s.label, vg.Point{X: x, Y: top + 2}, FormatValue(r.Median))
	}
}

// Thumbnail implements plot.Thumbnailer: the series' glyph in the legend.
func (s *series) Thumbnail(c *draw.Canvas) {
	c.DrawGlyph(s.glyph, c.Center())
}

// DataRange implements plot.DataRanger: the groups, and the points'
// whiskers with room above them for the values (on a log axis from a
// little below the lowest, on a linear one from 0).
func (s *series) DataRange() (xmin, xmax, ymin, ymax float64) {
	xmin, xmax = -0.5, float64(len(s.rows))-0.5
	ymin = math.Inf(1)
	for _, r := range s.rows {
		if r == nil {
			continue
		}
		lo, hi := r.Median, r.Median
		if l, h, ok := r.spread(); ok {
			lo, hi = l, h
		}
		ymin, ymax = math.Min(ymin, lo), math.Max(ymax, hi)
	}
	if s.log {
		return xmin, xmax, ymin / 1.5, ymax * 4
	}
	return xmin, xmax, 0, ymax * 1.25
}

// spread is the row's range, if it has one a chart can draw (on a log
// axis nothing at or below 0 can be).
func (r *Row) spread() (lo, hi float64, ok bool) {
	if math.IsNaN(r.Min) || math.IsNaN(r.Max) || r.Min <= 0 {
		return 0, 0, false
	}
	return r.Min, r.Max, true
}
