// Package chart draws the project's commands' measurements as pictures
// (gonum.org/v1/plot) and keeps the numbers beside them: a Figure is
// written as NAME.png, NAME.svg and NAME.json, the JSON holding every
// series drawn, so that a test can check a picture's content (series and
// their lengths) without looking at pixels (Read).
//
// A Figure is one or more panels side by side; a panel has axes, linear
// or logarithmic, and series of (x, y) points drawn as lines, points or
// both. On a logarithmic axis, points with a value <= 0 cannot be drawn:
// they are left out of the picture and kept in the JSON. Nothing here
// panics on odd data (empty series, NaN, a single point): Write draws
// what can be drawn.
package chart

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"image/color"
	"image/png"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Style is how a series is drawn.
type Style int

const (
	Lines       Style = iota // a line through the points, in x order as given
	Points                   // a mark at each point
	LinesPoints              // both
	Steps                    // a horizontal line (a bound, such as the limit): as Lines, dashed, grey
	Dashed                   // a dashed line in the colour of the series before it: another measure of the same thing
)

// Series is one named set of points. X and Y have the same length.
type Series struct {
	Name  string    `json:"name"`
	X     []float64 `json:"x"`
	Y     []float64 `json:"y"`
	Style Style     `json:"-"`
}

// Panel is one plot: a title, two axes and the series drawn on them.
type Panel struct {
	Title  string   `json:"title"`
	X      string   `json:"x"` // the x axis's label
	Y      string   `json:"y"` // the y axis's label
	LogX   bool     `json:"log_x,omitempty"`
	LogY   bool     `json:"log_y,omitempty"`
	ZeroY  bool     `json:"-"` // a linear y axis starts at 0
	YMax   float64  `json:"-"` // > 0: the y axis goes up to at least this (room for the legend)
	Series []Series `json:"series"`
	// Legend is where the legend goes: "" (top right), "top-left",
	// "bottom-right" or "bottom-left".
	Legend string `json:"-"`
}

// Figure is what one file shows: panels side by side, and a command that
// makes it (recorded in the JSON, for the documents).
type Figure struct {
	Name    string  `json:"name"` // the files' base name: [a-z0-9-]+
	Command string  `json:"command,omitempty"`
	Panels  []Panel `json:"panels"`
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)

// panelWidth and height are the size of one panel.
const (
	panelWidth = 16 * vg.Centimeter
	height     = 11 * vg.Centimeter
)

// Files returns the paths Write writes for a figure named name in dir.
func Files(dir, name string) (png, svg, js string) {
	b := filepath.Join(dir, name)
	return b + ".png", b + ".svg", b + ".json"
}

// Write writes f as dir/NAME.png, dir/NAME.svg and dir/NAME.json, making
// dir if it does not exist.
func (f Figure) Write(dir string) error {
	if err := f.validate(); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	pngPath, svgPath, jsPath := Files(dir, f.Name)
	for _, out := range []struct{ path, format string }{{pngPath, "png"}, {svgPath, "svg"}} {
		if err := f.render(out.path, out.format); err != nil {
			return fmt.Errorf("chart %s: %w", f.Name, err)
		}
	}
	js, err := json.MarshalIndent(f.finite(), "", " ")
	if err != nil {
		return fmt.Errorf("chart %s: %w", f.Name, err)
	}
	return os.WriteFile(jsPath, append(js, '\n'), 0o644)
}

func (f Figure) validate() error {
	if !nameRE.MatchString(f.Name) {
		return fmt.Errorf("chart: name %q: want lower-case letters, digits and dashes", f.Name)
	}
	if len(f.Panels) == 0 {
		return fmt.Errorf("chart %s: no panel", f.Name)
	}
	for _, p := range f.Panels {
		for _, s := range p.Series {
			if len(s.X) != len(s.Y) {
				return fmt.Errorf("chart %s: series %q has %d x and %d y", f.Name, s.Name, len(s.X), len(s.Y))
			}
		}
	}
	return nil
}

// finite returns f with NaN and infinities, which JSON cannot hold,
// replaced by 0 in copies of the series.
func (f Figure) finite() Figure {
	g := f
	g.Panels = make([]Panel, len(f.Panels))
	for i, p := range f.Panels {
		q := p
		q.Series = make([]Series, len(p.Series))
		for j, s := range p.Series {
			t := s
			t.X, t.Y = finite(s.X), finite(s.Y)
			q.Series[j] = t
		}
		g.Panels[i] = q
	}
	return g
}

func finite(v []float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		if !math.IsNaN(x) && !math.IsInf(x, 0) {
			out[i] = x
		}
	}
	return out
}

func (f Figure) render(path, format string) error {
	n := len(f.Panels)
	c, err := draw.NewFormattedCanvas(vg.Length(n)*panelWidth, height, format)
	if err != nil {
		return err
	}
	plots := make([][]*plot.Plot, 1)
	for _, p := range f.Panels {
		pl, err := p.plot()
		if err != nil {
			return err
		}
		plots[0] = append(plots[0], pl)
	}
	dc := draw.New(c)
	tiles := draw.Tiles{Rows: 1, Cols: n, PadX: vg.Centimeter, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4}
	for j, pl := range plots[0] {
		pl.Draw(tiles.At(dc, j, 0))
	}
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(out); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// palette holds the series' colours: distinct, and dark enough on white.
var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, // blue
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, // red
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, // green
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}, // orange
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}, // purple
	color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff}, // brown
	color.RGBA{R: 0xe3, G: 0x77, B: 0xc2, A: 0xff}, // pink
	color.RGBA{R: 0x17, G: 0xbe, B: 0xcf, A: 0xff}, // cyan
	color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff}, // grey
	color.RGBA{R: 0xbc, G: 0xbd, B: 0x22, A: 0xff}, // olive
}

// lone says whether a line of s would leave a drawable point out: one
// with no drawable neighbour draws no line, so it gets a mark.
func (p Panel) lone(s Series) bool {
	if s.Style == Points || s.Style == LinesPoints {
		return false
	}
	for _, r := range p.runs(s) {
		if len(r) == 1 {
			return true
		}
	}
	return false
}

// shortTicks labels the ticks of another ticker briefly: 2.5k, 1M, 0.01.
type shortTicks struct{ plot.Ticker }

func (t shortTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := t.Ticker.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = short(ts[i].Value)
		}
	}
	return ts
}

// short formats v with at most 4 significant digits and a k, M or G suffix.
func short(v float64) string {
	a := math.Abs(v)
	for _, u := range []struct {
		f float64
		s string
	}{{1e9, "G"}, {1e6, "M"}, {1e3, "k"}} {
		if a >= u.f {
			return strconv.FormatFloat(v/u.f, 'g', 4, 64) + u.s
		}
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

// runs returns the drawable points of s in runs of consecutive ones.
func (p Panel) runs(s Series) []plotter.XYs {
	var out []plotter.XYs
	var cur plotter.XYs
	for i := range s.X {
		if pt, ok := p.point(s.X[i], s.Y[i]); ok {
			cur = append(cur, pt)
			continue
		}
		if len(cur) > 0 {
			out, cur = append(out, cur), nil
		}
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// point says whether (x, y) can be drawn on the panel's axes.
func (p Panel) point(x, y float64) (plotter.XY, bool) {
	if math.IsNaN(x) || math.IsNaN(y) || math.IsInf(x, 0) || math.IsInf(y, 0) {
		return plotter.XY{}, false
	}
	if (p.LogX && x <= 0) || (p.LogY && y <= 0) {
		return plotter.XY{}, false
	}
	return plotter.XY{X: x, Y: y}, true
}

// drawable returns the points of s that the panel's axes can show.
func (p Panel) drawable(s Series) plotter.XYs {
	var xys plotter.XYs
	for i := range s.X {
		if pt, ok := p.point(s.X[i], s.Y[i]); ok {
			xys = append(xys, pt)
		}
	}
	return xys
}

func (p Panel) plot() (*plot.Plot, error) {
	pl := plot.New()
	pl.Title.Text = p.Title
	pl.X.Label.Text = p.X
	pl.Y.Label.Text = p.Y
	pl.Legend.Top = !strings.HasPrefix(p.Legend, "bottom")
	pl.Legend.Left = strings.HasSuffix(p.Legend, "left")
	pl.Legend.Padding = vg.Millimeter
	pl.Add(plotter.NewGrid())
	var xs, ys []float64
	ci := -1 // the colour of the series
	for _, s := range p.Series {
		if s.Style != Dashed || ci < 0 {
			ci++
		}
		xys := p.drawable(s)
		if len(xys) == 0 {
			continue
		}
		for _, pt := range xys {
			xs, ys = append(xs, pt.X), append(ys, pt.Y)
		}
		col := palette[ci%len(palette)]
		var thumbs []plot.Thumbnailer
		if s.Style != Points {
			// A line through the drawable points, broken where points
			// were left out.
			for _, run := range p.runs(s) {
				l, err := plotter.NewLine(run)
				if err != nil {
					return nil, err
				}
				l.Color = col
				l.Width = vg.Points(1.5)
				switch s.Style {
				case Steps:
					l.Color = color.Gray{Y: 0x30}
					l.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
				case Dashed:
					l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
				}
				pl.Add(l)
				if thumbs == nil {
					thumbs = append(thumbs, l)
				}
			}
		}
		if s.Style == Points || s.Style == LinesPoints || p.lone(s) {
			sc, err := plotter.NewScatter(xys)
			if err != nil {
				return nil, err
			}
			sc.Color = col
			sc.Shape = plotutil.Shape(ci)
			sc.Radius = vg.Points(2.5)
			pl.Add(sc)
			thumbs = append(thumbs, sc)
		}
		if s.Style != Dashed { // its colour's entry names it; the title says what dashes are
			pl.Legend.Add(s.Name, thumbs...)
		}
	}
	if p.LogX {
		setLog(&pl.X, xs)
	}
	pl.X.Tick.Marker = shortTicks{pl.X.Tick.Marker}
	if p.LogY {
		setLog(&pl.Y, ys)
	}
	pl.Y.Tick.Marker = shortTicks{pl.Y.Tick.Marker}
	if !p.LogY && p.ZeroY {
		pl.Y.Min = math.Min(pl.Y.Min, 0)
	}
	if p.YMax > 0 && (!p.LogY || len(ys) > 0) {
		pl.Y.Max = math.Max(pl.Y.Max, p.YMax)
	}
	return pl, nil
}

// setLog makes a a logarithmic axis over the positive values vs, padded
// a little; with no values it stays linear (a log axis needs a range > 0).
func setLog(a *plot.Axis, vs []float64) {
	if len(vs) == 0 {
		return
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, v := range vs {
		lo, hi = math.Min(lo, v), math.Max(hi, v)
	}
	if hi/lo < 10 {
		// LogTicks labels powers of ten: show at least one decade.
		mid := math.Sqrt(lo * hi)
		lo, hi = math.Min(lo, mid/math.Sqrt(10)), math.Max(hi, mid*math.Sqrt(10))
	}
	a.Scale = plot.LogScale{}
	a.Tick.Marker = plot.LogTicks{Prec: -1}
	a.Min, a.Max = lo/1.2, hi*1.2
}

// Read checks the three files of the figure name in dir: the PNG decodes,
// the SVG is well-formed XML whose root is an svg element, and the JSON
// holds a figure of that name whose series each have as many x as y. It
// returns the figure, for the caller to check its series.
func Read(dir, name string) (Figure, error) {
	var f Figure
	pngPath, svgPath, jsPath := Files(dir, name)
	pf, err := os.Open(pngPath)
	if err != nil {
		return f, err
	}
	img, err := png.Decode(pf)
	pf.Close()
	if err != nil {
		return f, fmt.Errorf("%s: %w", pngPath, err)
	}
	if b := img.Bounds(); b.Dx() < 100 || b.Dy() < 100 {
		return f, fmt.Errorf("%s: %dx%d pixels, too small for a plot", pngPath, b.Dx(), b.Dy())
	}
	if err := checkSVG(svgPath); err != nil {
		return f, err
	}
	js, err := os.ReadFile(jsPath)
	if err != nil {
		return f, err
	}
	if err := json.Unmarshal(js, &f); err != nil {
		return f, fmt.Errorf("%s: %w", jsPath, err)
	}
	if f.Name != name {
		return f, fmt.Errorf("%s: figure named %q", jsPath, f.Name)
	}
	if err := f.validate(); err != nil {
		return f, fmt.Errorf("%s: %w", jsPath, err)
	}
	return f, nil
}

// checkSVG parses the whole file as XML and wants an svg root element
// with drawing in it.
func checkSVG(path string) error {
	sf, err := os.Open(path)
	if err != nil {
		return err
	}
	defer sf.Close()
	d := xml.NewDecoder(sf)
	var root string
	elements := 0
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			if root == "" {
				root = se.Name.Local
			}
			elements++
		}
	}
	if root != "svg" {
		return fmt.Errorf("%s: root element %q, want svg", path, root)
	}
	if elements < 10 {
		return fmt.Errorf("%s: %d elements, too few for a plot", path, elements)
	}
	return nil
}

// Panel returns the panel whose title starts with prefix, or false.
func (f Figure) Panel(prefix string) (Panel, bool) {
	for _, p := range f.Panels {
		if strings.HasPrefix(p.Title, prefix) {
			return p, true
		}
	}
	return Panel{}, false
}

// Get returns the series named name, or false.
func (p Panel) Get(name string) (Series, bool) {
	for _, s := range p.Series {
		if s.Name == name {
			return s, true
		}
	}
	return Series{}, false
}

// Names returns the names of the panel's series, in order.
func (p Panel) Names() []string {
	out := make([]string, len(p.Series))
	for i, s := range p.Series {
		out[i] = s.Name
	}
	return out
}
