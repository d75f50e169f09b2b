package main

import (
	"fmt"
	"strings"

	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/chart"
)

// The figures of one run (--plot DIR), each written as NAME.png, NAME.svg
// and NAME.json.
const (
	figRate       = "sim-rate"       // decisions/s through each phase
	figLatency    = "sim-latency"    // the latency distribution of each phase
	figWindows    = "sim-windows"    // allowed per key-window against the limit
	figRoundTrips = "sim-roundtrips" // round trips per 1,000 decisions through each phase
)

// commandLine is how the figures say they were made.
func commandLine(args []string) string {
	if len(args) == 0 {
		return "go run ./cmd/ratelimit-sim"
	}
	return "go run ./cmd/ratelimit-sim " + strings.Join(args, " ")
}

// phaseLabels names the two phases in legends.
func phaseLabels(cfg config) (string, string) {
	return "hybrid (" + cfg.mode.String() + ")", "global (per request)"
}

// runFigures returns the four figures of one run.
func runFigures(cfg config, res *results, command string) []chart.Figure {
	hl, gl := phaseLabels(cfg)
	h, g := res.hybrid, res.global
	rate := chart.Panel{
		Title: "Decisions/s, fleet-wide, through each phase", X: "seconds into the phase", Y: "decisions/s", LogY: true,
		Series: []chart.Series{rateSeries(hl, h.samples), rateSeries(gl, g.samples)},
	}
	lat := chart.Panel{
		Title:  fmt.Sprintf("Decision latency (p50 %s vs %s, p99 %s vs %s)", fmtDur(h.lat.quantile(0.5)), fmtDur(g.lat.quantile(0.5)), fmtDur(h.lat.quantile(0.99)), fmtDur(g.lat.quantile(0.99))),
		X:      "latency (µs)",
		Y:      "fraction of decisions at or below",
		LogX:   true,
		Legend: "bottom-right",
		Series: []chart.Series{cdfSeries(hl, &h.lat), cdfSeries(gl, &g.lat)},
	}
	win := chart.Panel{
		Title: fmt.Sprintf("Allowed per key and window (%s)", windowTitle(cfg)), X: "full window of the phase", Y: "allowed in the window",
		Legend: "bottom-right", ZeroY: true,
		Series: []chart.Series{
			windowSeries(hl+": most for one key", h.winMax),
			windowSeries(gl+": most for one key", g.winMax),
			windowSeries(hl+": hottest key", h.hot),
			windowSeries(gl+": hottest key", g.hot),
		},
	}
	lo, hi := 0.5, float64(max(len(h.winMax), len(g.winMax), 1))+0.5
	bname := "limit"
	if !cfg.algorithm.IsWindow() {
		bname = "burst + rate x window"
	}
	win.Series = append(win.Series, chart.Series{Name: bname, X: []float64{lo, hi}, Y: []float64{float64(cfg.bound()), float64(cfg.bound())}, Style: chart.Steps})
	if cfg.mode == hybrid.Optimistic {
		b := float64(optimisticBound(cfg))
		win.Series = append(win.Series, chart.Series{Name: "optimistic bound", X: []float64{lo, hi}, Y: []float64{b, b}, Style: chart.Steps})
	}
	rt := chart.Panel{
		Title: fmt.Sprintf("Redis round trips per 1,000 decisions (whole phase: %s vs %s)", per1000(h.roundTrips, h.decisions), per1000(g.roundTrips, g.decisions)),
		X:     "seconds into the phase", Y: "round trips / 1,000 decisions", LogY: true, Legend: "bottom-right",
		Series: []chart.Series{rtSeries(hl, h.samples), rtSeries(gl, g.samples)},
	}
	return []chart.Figure{
		{Name: figRate, Command: command, Panels: []chart.Panel{rate}},
		{Name: figLatency, Command: command, Panels: []chart.Panel{lat}},
		{Name: figWindows, Command: command, Panels: []chart.Panel{win}},
		{Name: figRoundTrips, Command: command, Panels: []chart.Panel{rt}},
	}
}

// rateSeries is decisions/s between consecutive samples, at the end of
// each interval.
func rateSeries(name string, ss []sample) chart.Series {
	s := chart.Series{Name: name, Style: chart.Lines}
	for i := 1; i < len(ss); i++ {
		dt := (ss[i].at - ss[i-1].at).Seconds()
		if dt <= 0 {
			continue
		}
		s.X = append(s.X, ss[i].at.Seconds())
		s.Y = append(s.Y, float64(ss[i].decisions-min(ss[i].decisions, ss[i-1].decisions))/dt)
	}
	return s
}

// rtSeries is round trips per 1,000 decisions between consecutive
// samples (0 where no decision was published in the interval).
func rtSeries(name string, ss []sample) chart.Series {
	s := chart.Series{Name: name, Style: chart.Lines}
	for i := 1; i < len(ss); i++ {
		if ss[i].at <= ss[i-1].at {
			continue
		}
		d := ss[i].decisions - min(ss[i].decisions, ss[i-1].decisions)
		rt := ss[i].roundTrips - min(ss[i].roundTrips, ss[i-1].roundTrips)
		v := 0.0
		if d > 0 {
			v = 1000 * float64(rt) / float64(d)
		}
		s.X = append(s.X, ss[i].at.Seconds())
		s.Y = append(s.Y, v)
	}
	return s
}

// cdfSeries is the latency histogram as a cumulative distribution: at each
// non-empty bucket, the fraction of decisions at or below it.
func cdfSeries(name string, h *hist) chart.Series {
	s := chart.Series{Name: name, Style: chart.Lines}
	total := h.count()
	if total == 0 {
		return s
	}
	var c uint64
	for i, v := range h.n {
		if v == 0 {
			continue
		}
		c += v
		s.X = append(s.X, bucketMid(i)/1e3)
		s.Y = append(s.Y, float64(c)/float64(total))
	}
	return s
}

// windowSeries is one value per full window, numbered from 1.
func windowSeries(name string, per []int) chart.Series {
	s := chart.Series{Name: name, Style: chart.LinesPoints}
	for i, n := range per {
		s.X = append(s.X, float64(i+1))
		s.Y = append(s.Y, float64(n))
	}
	return s
}

// writeFigures writes figs to dir and says so.
func writeFigures(dir string, figs []chart.Figure) ([]string, error) {
	var written []string
	for _, f := range figs {
		if err := f.Write(dir); err != nil {
			return written, err
		}
		p, _, _ := chart.Files(dir, f.Name)
		written = append(written, p)
	}
	return written, nil
}

// windowTitle says what bounds a key's admissions in a window of the
// tally: "limit N per P" for the window algorithms (as the title always
// said), the bucket's bound for the buckets.
func windowTitle(cfg config) string {
	if cfg.algorithm.IsWindow() {
		return fmt.Sprintf("limit %d per %v", cfg.limit, cfg.period)
	}
	return bucketBound(cfg)
}
