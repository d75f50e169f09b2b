package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/chart"
)

// sweepLimit is --sweep's limit unless --limit is given: high enough that
// no key is driven past it, so that what the sweep shows is the regime
// (how often an instance sees a key in a window), not saturation.
const sweepLimit = 100_000_000

// multiRegionWorkers is --multi-region's --workers unless given: deciding
// goroutines per instance, enough that an open loop of multiRegionRate
// keeps up when every decision waits 100ms and more (Little's law: 2,000/s
// x 0.15s = 300 in flight; 8 x 64 = 512 workers).
const multiRegionWorkers = 64

// multiRegionRate is --multi-region's offered load unless --rate is given.
// An open loop: requests arrive at the rate users send them, whatever the
// limiter's latency, as in a service. (In a closed loop a far Redis would
// slow the fleet down, each key would be seen less often per window, and
// a warm workload would turn cold.)
//
// 2,000/s is what one 2-core machine running the fleet, the proxy and
// Redis sustains for the per-request limiter with room to spare, other
// work beside: at 10,000/s, and at 4,000/s with a load average of 8 from
// other work, the per-request runs queued in the machine, not on the link.
const multiRegionRate = 2_000

// Figures of --sweep and --multi-region.
const (
	figRegime        = "regime"
	figMultiLatency  = "multi-region-latency"
	figMultiWaits    = "multi-region-waits"
	labelStrict      = "hybrid strict"
	labelOptimistic  = "hybrid optimistic"
	labelGlobal      = "global (per request)"
	regimeFigureNote = "uniform keys, closed loop"
)

// kinds are the three limiters every point of a matrix runs, in order.
var kinds = []string{labelStrict, labelOptimistic, labelGlobal}

// point is what one phase of a matrix measured, reduced to what the tables
// and figures show.
type point struct {
	kind          string // one of kinds
	keys          int
	latency       time.Duration // added round trip
	decisions     uint64
	perSec        float64
	u             float64 // decisions/s x period / (keys x instances)
	rtPerDecision float64
	waited        float64 // fraction of decisions that waited on Redis
	p50, p99      time.Duration
	inFlight      float64 // decisions waiting on the limiter at once, on average (decisions/s x mean latency)
	maxWin        int
	limit         int
	errs          uint64
	fallback      uint64
	noReply       uint64 // hybrid decisions Redis did not answer within the timeout (denied in strict, on credit in optimistic)
	note          string // what went wrong without spoiling the measurement (a Close error)
}

// runKind runs one phase of kind k on be and reduces it to a point.
func runKind(ctx context.Context, cfg config, be *backend, wl *workload, runID, name, k string) (point, error) {
	var (
		r   phaseResult
		err error
	)
	switch k {
	case labelGlobal:
		r, err = globalPhase(ctx, io.Discard, cfg, be, wl, runID, name)
	default:
		cfg.mode = hybrid.Strict
		if k == labelOptimistic {
			cfg.mode = hybrid.Optimistic
		}
		r, err = hybridPhase(ctx, io.Discard, cfg, be, wl, runID, name)
	}
	if err != nil {
		return point{}, err
	}
	if err := ctx.Err(); err != nil {
		return point{}, err
	}
	p := point{
		kind: k, keys: cfg.keys, latency: cfg.redisLatency, decisions: r.decisions,
		perSec: perSec(r.decisions, r), p50: r.lat.quantile(0.5), p99: r.lat.quantile(0.99),
		inFlight: perSec(r.decisions, r) * r.lat.mean().Seconds(),
		maxWin:   r.maxWin, limit: cfg.bound(), errs: r.errs, fallback: r.stats.Fallback, noReply: r.stats.NoReply,
	}
	if r.decisions > 0 {
		p.rtPerDecision = float64(r.roundTrips) / float64(r.decisions)
		p.waited = 1 // every global decision is a call
		if r.hasStats {
			p.waited = float64(r.stats.Decisions-min(r.stats.LocalDecisions, r.stats.Decisions)) / float64(max(r.stats.Decisions, 1))
		}
	}
	p.u = p.perSec * cfg.period.Seconds() / float64(cfg.keys*cfg.instances)
	switch {
	case r.errs > 0:
		// A decision returned an error: the measurement is not one.
		return p, fmt.Errorf("%s: %d decisions failed; first: %w", name, r.errs, r.firstErr)
	case r.firstErr != nil:
		// Closing the limiters failed (their last flush): the decisions
		// were measured; say so beside them.
		p.note = r.firstErr.Error()
	}
	return p, nil
}

func (p point) line() string {
	note := ""
	if p.note != "" {
		note = "\n      note: " + p.note
	}
	return fmt.Sprintf("%-22s %7d keys  +%-6v u %-10.3g %12s/s  %8.3g round trips/decision  waited %5.1f%%  p50 %-8s p99 %-8s max per key-window %d (limit %d)",
		p.kind, p.keys, p.latency, p.u, commas(uint64(p.perSec)), p.rtPerDecision, 100*p.waited, fmtDur(p.p50), fmtDur(p.p99), p.maxWin, p.limit) + note
}

// sweep runs the regime sweep: for each key count, uniform keys in a
// closed loop through hybrid strict, hybrid optimistic and global, and
// prints and draws round trips per decision and decisions/s against u.
func sweep(ctx context.Context, cfg config, out io.Writer, command string) error {
	be, err := openBackend(ctx, cfg.redisAddrs, cfg.redisLatency)
	if err != nil {
		return err
	}
	defer be.close()
	runID := fmt.Sprintf("%x", uint32(time.Now().UnixNano()))
	fmt.Fprintf(out, "ratelimit-sim --sweep: %d instances x %d workers, uniform keys, limit %s per %v per key, closed loop, %v per phase\n  %s\n",
		cfg.instances, cfg.workers, commas(uint64(cfg.limit)), cfg.period, cfg.duration, be.desc)
	var pts []point
	for _, k := range cfg.sweepKeys {
		c := cfg
		c.keys, c.zipf = k, 0
		wl := newWorkload(k, 0)
		for i, kind := range kinds {
			p, err := runKind(ctx, c, be, wl, runID, fmt.Sprintf("k%d-%d", k, i), kind)
			if err != nil {
				return err
			}
			fmt.Fprintln(out, "  "+p.line())
			pts = append(pts, p)
		}
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out, "| keys | limiter | u | decisions/s | round trips / decision | waited on Redis | p50 | p99 | max per key-window |")
	fmt.Fprintln(out, "|---|---|---|---|---|---|---|---|---|")
	for _, p := range pts {
		fmt.Fprintf(out, "| %s | %s | %.3g | %s | %.3g | %.1f%% | %s | %s | %s |\n", commas(uint64(p.keys)), p.kind, p.u,
			commas(uint64(p.perSec)), p.rtPerDecision, 100*p.waited, fmtDur(p.p50), fmtDur(p.p99), commas(uint64(p.maxWin)))
	}
	if cfg.plotDir == "" {
		return nil
	}
	f := regimeFigure(cfg, pts, command)
	files, err := writeFigures(cfg.plotDir, []chart.Figure{f})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "figure (with .svg and .json beside it): %s\n", strings.Join(files, " "))
	return nil
}

// regimeFigureName is "regime", or "regime-50ms" with a latency.
func regimeFigureName(cfg config) string {
	if cfg.redisLatency == 0 {
		return figRegime
	}
	return figRegime + "-" + strings.ReplaceAll(cfg.redisLatency.String(), ".", "_")
}

func regimeFigure(cfg config, pts []point, command string) chart.Figure {
	rt := chart.Panel{Title: "Redis round trips per decision", X: "u: uses per key, instance and window", Y: "round trips per decision", LogX: true, LogY: true, Legend: "bottom-left"}
	rate := chart.Panel{Title: "Decisions/s, fleet-wide (" + regimeFigureNote + ")", X: "u: uses per key, instance and window", Y: "decisions/s", LogX: true, LogY: true, Legend: "top-left"}
	if cfg.redisLatency > 0 {
		rate.Title += fmt.Sprintf(", Redis %v away", cfg.redisLatency)
	}
	for _, k := range kinds {
		a := chart.Series{Name: k, Style: chart.LinesPoints}
		b := chart.Series{Name: k, Style: chart.LinesPoints}
		for _, p := range pts {
			if p.kind != k {
				continue
			}
			a.X, a.Y = append(a.X, p.u), append(a.Y, p.rtPerDecision)
			b.X, b.Y = append(b.X, p.u), append(b.Y, p.perSec)
		}
		rt.Series, rate.Series = append(rt.Series, a), append(rate.Series, b)
	}
	return chart.Figure{Name: regimeFigureName(cfg), Command: command, Panels: []chart.Panel{rt, rate}}
}

// regime is one workload of --multi-region.
type regime struct {
	name  string
	keys  int
	limit int // per key per second
}

// regimes are the workloads of --multi-region, uniform keys, 1s windows;
// at 2,000 decisions/s over 8 instances: hot (1 key, u = 250, driven past
// its limit: 2,000/s asked of 1,000), warm (20 keys, u = 12.5, under it)
// and cold (2,000 keys, u = 0.125: an instance sees a key about once in
// eight windows).
var regimes = []regime{
	{"hot", 1, 1000},
	{"warm", 20, 500},
	{"cold", 2000, 100},
}

// multiRegion runs each regime with Redis near (no added latency: Redis in
// the instances' region) and at each of cfg.latencies, through the three
// limiters, and prints and draws the results.
func multiRegion(ctx context.Context, cfg config, out io.Writer, command string) error {
	lats := append([]time.Duration{0}, cfg.latencies...)
	runID := fmt.Sprintf("%x", uint32(time.Now().UnixNano()))
	desc := "embedded miniredis"
	if len(cfg.redisAddrs) > 0 {
		desc = "redis " + cfg.redisAddrs[0]
	}
	rate := cfg.rate
	if rate == 0 {
		rate = multiRegionRate
	}
	fmt.Fprintf(out, "ratelimit-sim --multi-region: %d instances (WithInstances) x %d workers, open loop: %s decisions/s offered, uniform keys, 1s windows, %v per phase, %s; round trips added: %v\n",
		cfg.instances, cfg.workers, commas(uint64(rate)), cfg.duration, desc, lats)
	byRegime := map[string][]point{}
	for _, lat := range lats {
		be, err := openBackend(ctx, cfg.redisAddrs, lat)
		if err != nil {
			return err
		}
		for _, rg := range regimes {
			c := cfg
			c.keys, c.zipf, c.limit, c.period, c.redisLatency = rg.keys, 0, rg.limit, time.Second, lat
			c.rate, c.fixInstances = rate, true
			wl := newWorkload(c.keys, c.zipf)
			for i, kind := range kinds {
				p, err := runKind(ctx, c, be, wl, runID, fmt.Sprintf("%s-%d-%d", rg.name, lat.Milliseconds(), i), kind)
				if err != nil {
					be.close()
					return err
				}
				fmt.Fprintf(out, "  %-5s %s\n", rg.name, p.line())
				byRegime[rg.name] = append(byRegime[rg.name], p)
			}
		}
		be.close()
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out, "| regime | round trip added | limiter | decisions/s | p50 | p99 | waited on Redis | in flight | no reply in time | max per key-window / limit |")
	fmt.Fprintln(out, "|---|---|---|---|---|---|---|---|---|---|")
	for _, rg := range regimes {
		for _, p := range byRegime[rg.name] {
			over := ""
			if p.maxWin > p.limit {
				over = fmt.Sprintf(" (+%.1f%%)", 100*float64(p.maxWin-p.limit)/float64(p.limit))
			}
			noReply := "-"
			if p.kind != labelGlobal {
				noReply = fmt.Sprintf("%.2f%%", 100*float64(p.noReply)/float64(max(p.decisions, 1)))
				if p.fallback > 0 {
					noReply += fmt.Sprintf(" (%s from the failure mode)", commas(p.fallback))
				}
			}
			fmt.Fprintf(out, "| %s | %v | %s | %s | %s | %s | %.2f%% | %.3g | %s | %s / %s%s |\n", rg.name, p.latency, p.kind,
				commas(uint64(p.perSec)), fmtDur(p.p50), fmtDur(p.p99), 100*p.waited, p.inFlight, noReply,
				commas(uint64(p.maxWin)), commas(uint64(p.limit)), over)
		}
	}
	if cfg.plotDir == "" {
		return nil
	}
	files, err := writeFigures(cfg.plotDir, multiRegionFigures(byRegime, command))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "figures (with .svg and .json beside each): %s\n", strings.Join(files, " "))
	return nil
}

// multiRegionFigures draws, per regime, the p50 and p99 latency and the
// share of decisions that waited against the round trip added.
func multiRegionFigures(byRegime map[string][]point, command string) []chart.Figure {
	var lat, waits []chart.Panel
	x := "round trip added to Redis (ms)"
	for _, rg := range regimes {
		// Room above the data for the legend: a log axis up to 20s, a
		// linear one to 150%.
		pl := chart.Panel{Title: rg.name + " keys: decision latency, p50 (dashed: p99)", X: x, Y: "latency (ms)", LogY: true, YMax: 20_000}
		pw := chart.Panel{Title: rg.name + " keys: decisions that waited on Redis", X: x, Y: "% of decisions", ZeroY: true, YMax: 150}
		for _, k := range kinds {
			p50 := chart.Series{Name: k, Style: chart.LinesPoints}
			p99 := chart.Series{Name: k + " p99", Style: chart.Dashed}
			w := chart.Series{Name: k, Style: chart.LinesPoints}
			for _, p := range byRegime[rg.name] {
				if p.kind != k {
					continue
				}
				ms := float64(p.latency) / float64(time.Millisecond)
				p50.X, p50.Y = append(p50.X, ms), append(p50.Y, float64(p.p50)/float64(time.Millisecond))
				p99.X, p99.Y = append(p99.X, ms), append(p99.Y, float64(p.p99)/float64(time.Millisecond))
				w.X, w.Y = append(w.X, ms), append(w.Y, 100*p.waited)
			}
			pl.Series, pw.Series = append(pl.Series, p50, p99), append(pw.Series, w)
		}
		lat, waits = append(lat, pl), append(waits, pw)
	}
	return []chart.Figure{
		{Name: figMultiLatency, Command: command, Panels: lat},
		{Name: figMultiWaits, Command: command, Panels: waits},
	}
}
