package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/hybridlimit/ratelimit/internal/chart"
)

// The figures of --plot DIR, each written as NAME.png, NAME.svg and
// NAME.json.
const (
	figRates   = "surge-rates"   // served, 429 and failed per second, without and with the limiter
	figLatency = "surge-latency" // the latency distributions, without and with
)

// commandLine is how the figures say they were made.
func commandLine(args []string) string {
	if len(args) == 0 {
		return "go run ./cmd/ratelimit-surge"
	}
	return "go run ./cmd/ratelimit-surge " + strings.Join(args, " ")
}

func figures(cfg config, res surgeResult, command string) []chart.Figure {
	ymax := 0.0
	panel := func(r phaseResult, title string) chart.Panel {
		p := chart.Panel{Title: title, X: "second of the phase", Y: "answers per second", ZeroY: true, Legend: "top-left"}
		served := chart.Series{Name: "served (2xx)", Style: chart.LinesPoints}
		denied := chart.Series{Name: "429 (rate limited)", Style: chart.LinesPoints}
		failed := chart.Series{Name: "failed (503, timeouts)", Style: chart.LinesPoints}
		for i, c := range r.perSecond {
			x := float64(i) + 0.5 // the middle of the second
			served.X, served.Y = append(served.X, x), append(served.Y, float64(c.served))
			denied.X, denied.Y = append(denied.X, x), append(denied.Y, float64(c.denied))
			failed.X, failed.Y = append(failed.X, x), append(failed.Y, float64(c.failed))
			ymax = max(ymax, float64(c.served), float64(c.denied), float64(c.failed))
		}
		n := float64(max(len(r.perSecond), 1))
		capacity := chart.Series{Name: fmt.Sprintf("backend capacity (%s/s)", commas(int64(cfg.capacity()))),
			X: []float64{0, n}, Y: []float64{cfg.capacity(), cfg.capacity()}, Style: chart.Steps}
		p.Series = []chart.Series{served, denied, failed, capacity}
		return p
	}
	rates := []chart.Panel{
		panel(res.without, fmt.Sprintf("Without limiter (failures %s)", percent(res.without.failed, res.without.requests))),
		panel(res.with, fmt.Sprintf("With limiter (failures %s)", percent(res.with.failed, res.with.requests))),
	}
	for i := range rates { // one scale for both, with room for the legend
		rates[i].YMax = 1.45 * max(ymax, cfg.capacity())
	}
	lat := chart.Panel{
		Title: fmt.Sprintf("Latency (served p99 %s without, %s with)", latency(res.without.servedLat, 0.99), latency(res.with.servedLat, 0.99)),
		X:     "latency (ms)", Y: "fraction of answers at or below", LogX: true, Legend: "top-left",
		Series: []chart.Series{
			cdf("served, without limiter", res.without.servedLat),
			cdf("served, with limiter", res.with.servedLat),
			cdf("429, with limiter", res.with.deniedLat),
		},
	}
	return []chart.Figure{
		{Name: figRates, Command: command, Panels: rates},
		{Name: figLatency, Command: command, Panels: []chart.Panel{lat}},
	}
}

// cdf is the cumulative distribution of sorted latencies, at most about
// 500 points (evenly spaced in rank), in milliseconds.
func cdf(name string, sorted []time.Duration) chart.Series {
	s := chart.Series{Name: name, Style: chart.Lines}
	n := len(sorted)
	if n == 0 {
		return s
	}
	step := max(n/500, 1)
	for i := step - 1; i < n; i += step {
		s.X = append(s.X, float64(sorted[i])/float64(time.Millisecond))
		s.Y = append(s.Y, float64(i+1)/float64(n))
	}
	if s.Y[len(s.Y)-1] != 1 {
		s.X = append(s.X, float64(sorted[n-1])/float64(time.Millisecond))
		s.Y = append(s.Y, 1)
	}
	return s
}
