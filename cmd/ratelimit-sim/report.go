package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/hybridlimit/ratelimit/hybrid"
)

func printHeader(out io.Writer, cfg config, backend string, wl *workload) {
	fmt.Fprintf(out, "ratelimit-sim: %d instances x %d workers, %d keys", cfg.instances, cfg.workers, cfg.keys)
	if cfg.zipf > 0 {
		fmt.Fprintf(out, " (Zipf s=%g: hottest key %.1f%% of decisions, coldest %.3f%%)",
			cfg.zipf, 100*wl.share[0], 100*wl.share[len(wl.share)-1])
	} else {
		fmt.Fprint(out, " (uniform)")
	}
	if cfg.algorithm.IsWindow() {
		fmt.Fprintf(out, ", %v, limit %d per %v per key\n", cfg.algorithm, cfg.limit, cfg.period)
	} else {
		fmt.Fprintf(out, ", %v, %d per %v per key, burst %d\n", cfg.algorithm, cfg.limit, cfg.period, cfg.rateLimit().Capacity(cfg.algorithm))
	}
	if cfg.rate > 0 {
		fmt.Fprintf(out, "  open loop: %s decisions/s offered to the fleet", commas(uint64(cfg.rate)))
	} else {
		fmt.Fprint(out, "  closed loop: every worker decides as fast as it can")
	}
	fmt.Fprintf(out, ", %v per phase\n", cfg.duration)
	known := "learned by heartbeat"
	if cfg.fixInstances {
		known = fmt.Sprintf("fixed at %d", cfg.instances)
	}
	fmt.Fprintf(out, "  hybrid: mode %v, sync %v, timeout %v, instances %s; global: %v, a limiter per worker, a round trip per decision\n",
		cfg.mode, cfg.sync, cfg.timeout, known, cfg.algorithm)
	fmt.Fprintf(out, "  %s\n", backend)
}

// optimisticBound is the most the fleet may admit per key and window in
// optimistic mode: Rate + instances x share, share = Rate / (8 x instances)
// (hybrid.Optimistic's documented credit share). A bucket's credit is
// budgeted per period of each instance's own clock, and a period of the
// tally may overlap two of them: burst + rate x period + 2 x instances x
// share.
func optimisticBound(cfg config) int {
	share := max(1, cfg.limit/(8*cfg.instances))
	if !cfg.algorithm.IsWindow() {
		return cfg.bound() + 2*cfg.instances*share
	}
	return cfg.limit + cfg.instances*share
}

// boundLabel names the strict bound of one key in one window of the tally:
// "limit N" for the window algorithms, "bound N" for the buckets (burst +
// rate x window: see bucketBound).
func boundLabel(cfg config) string {
	if cfg.algorithm.IsWindow() {
		return fmt.Sprintf("limit %d", cfg.limit)
	}
	return fmt.Sprintf("bound %d", cfg.bound())
}

// bucketBound spells out a bucket's bound: "bound N = burst B + R per P".
func bucketBound(cfg config) string {
	return fmt.Sprintf("bound %d = burst %d + %d per %v", cfg.bound(), cfg.rateLimit().Capacity(cfg.algorithm), cfg.limit, cfg.period)
}

func per1000(n, d uint64) string {
	if d == 0 {
		return "-"
	}
	v := 1000 * float64(n) / float64(d)
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// times formats a ratio: two decimals below 10 (1.55x is not 2x, and the
// cold rows' targets are 2x and 3x), whole above.
func times(r float64) string {
	if r < 10 {
		return fmt.Sprintf("%.2fx", r)
	}
	return fmt.Sprintf("%.0fx", r)
}

func perSec(n uint64, r phaseResult) float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(n) / r.elapsed.Seconds()
}

func printReport(out io.Writer, cfg config, res *results) {
	h, g := res.hybrid, res.global
	fmt.Fprintln(out)
	row := func(label, a, b string) { fmt.Fprintf(out, "%-46s %20s  %20s\n", label, a, b) }
	row("", "hybrid ("+cfg.mode.String()+")", "global (per request)")
	row("decisions", commas(h.decisions), commas(g.decisions))
	row("allowed", commas(h.allowed), commas(g.allowed))
	row("denied", commas(h.denied), commas(g.denied))
	row("decisions/s (fleet)", commas(uint64(perSec(h.decisions, h))), commas(uint64(perSec(g.decisions, g))))
	row("allowed/s", commas(uint64(perSec(h.allowed, h))), commas(uint64(perSec(g.allowed, g))))
	row("Redis round trips / 1000 decisions", per1000(h.roundTrips, h.decisions), per1000(g.roundTrips, g.decisions))
	row("  waited on by a decision / 1000", per1000(h.stats.SyncRoundTrips, h.decisions), per1000(g.roundTrips, g.decisions))
	row("  commands they carried / 1000 (pipelined)", per1000(h.commands, h.decisions), per1000(g.commands, g.decisions))
	row("  as the hybrid's Stats() count them / 1000", per1000(h.stats.RoundTrips, h.decisions), "-")
	row("decisions taken in memory / 1000", per1000(h.stats.LocalDecisions, h.stats.Decisions), "0")
	row("  counted exactly, a call each / 1000", per1000(h.stats.ExactDecisions, h.stats.Decisions), "1000")
	row("Redis CPU per decision (INFO cpu)", cpuPer(h.redisCPU, h), cpuPer(g.redisCPU, g))
	row("  the sim's own CPU per decision (getrusage)", cpuPer(h.ownCPU, h), cpuPer(g.ownCPU, g))
	for _, q := range []struct {
		label string
		q     float64
	}{{"latency p50", 0.5}, {"latency p99", 0.99}, {"latency p999", 0.999}} {
		row(q.label, fmtDur(h.lat.quantile(q.q)), fmtDur(g.lat.quantile(q.q)))
	}
	row(fmt.Sprintf("max allowed per key-window (%s)", boundLabel(cfg)), fmt.Sprint(h.maxWin), fmt.Sprint(g.maxWin))
	row("  over full windows only", fmt.Sprint(h.maxFull), fmt.Sprint(g.maxFull))
	minW := func(r phaseResult) string {
		if r.minWinSat < 0 {
			return "- (none denied)"
		}
		return fmt.Sprintf("%d (of %d)", r.minWinSat, r.satWins)
	}
	row("min allowed, full key-windows with denials", minW(h), minW(g))
	hot := func(r phaseResult) string {
		if len(r.hot) == 0 {
			return "-"
		}
		lo, hi := r.hot[0], r.hot[0]
		for _, n := range r.hot {
			lo, hi = min(lo, n), max(hi, n)
		}
		return fmt.Sprintf("%d..%d", lo, hi)
	}
	row("hottest key: allowed per full window", hot(h), hot(g))
	over := "key-windows over the limit"
	if !cfg.algorithm.IsWindow() {
		over = "key-windows over the bound"
	}
	row(over, fmt.Sprint(h.overLimit), fmt.Sprint(g.overLimit))
	row("full windows per key", fmt.Sprint(h.fullWindows), fmt.Sprint(g.fullWindows))
	row("hybrid leases granted / sync flush errors", commas(h.stats.Leases)+" / "+commas(h.stats.FlushErrors), "-")
	row("  of them leased ahead of their window", commas(h.stats.LeasedAhead), "-")
	row("  leased units that expired unused", commas(h.stats.Expired), "-")
	row("fleet size as the hybrid instances see it", fmt.Sprintf("%d..%d", h.instLo, h.instHi), "-")
	row("decisions Redis did not answer in time", commas(h.stats.NoReply), "-")
	row("fallback decisions (breaker open)", commas(h.stats.Fallback), "-")
	row("errors", commas(h.errs), commas(g.errs))
	fmt.Fprintln(out)

	hRT := float64(h.roundTrips) / float64(max(h.decisions, 1))
	gRT := float64(g.roundTrips) / float64(max(g.decisions, 1))
	if hRT > 0 {
		fmt.Fprintf(out, "round trips per decision: global / hybrid = %s (the default run's target: >= 50x)\n", times(gRT/hRT))
	} else {
		fmt.Fprintln(out, "round trips per decision: the hybrid made none during the run")
	}
	if gs := perSec(g.decisions, g); gs > 0 {
		on := ""
		if res.embedded {
			on = ", both on the embedded miniredis: see the note below"
		}
		fmt.Fprintf(out, "decisions/s: hybrid / global = %s (the default run's target: >= 50x%s)\n", times(perSec(h.decisions, h)/gs), on)
	}
	if res.embedded {
		printEmbeddedNote(out, g)
	}
	bound, what := cfg.limit, "strict bound, max allowed per key-window <= limit"
	if !cfg.algorithm.IsWindow() {
		bound, what = cfg.bound(), "strict bound, max allowed per key-window <= burst + rate x window"
	}
	if cfg.mode == hybrid.Optimistic {
		bound, what = optimisticBound(cfg), "optimistic bound, max allowed per key-window <= limit + instances x share"
		if !cfg.algorithm.IsWindow() {
			what = "optimistic bound, max allowed per key-window <= burst + rate x window + 2 x instances x share"
		}
	}
	verdict := "held"
	if h.maxWin > bound {
		verdict = "VIOLATED"
	}
	fmt.Fprintf(out, "%s = %d: %s (max %d; over full windows %d)\n", what, bound, verdict, h.maxWin, h.maxFull)
	var notes []string
	if h.maxWin > bound && h.stats.Fallback > 0 {
		notes = append(notes, fmt.Sprintf("%s hybrid decisions came from the failure mode (Redis did not answer within --timeout %v): the bound holds while Redis answers", commas(h.stats.Fallback), cfg.timeout))
	}
	if h.maxWin > bound && cfg.mode == hybrid.Optimistic && !cfg.fixInstances {
		notes = append(notes, "instances learn the fleet size by heartbeat: right after a simultaneous start instance i believes there are i, and its optimistic share is Rate / (8 x i); --fix-instances passes WithInstances")
	}
	for _, r := range []phaseResult{h, g} {
		for _, w := range r.worst {
			if w.allowed <= bound && r.name == "hybrid" {
				continue // within the mode's bound
			}
			start := time.UnixMicro(w.idx * cfg.period.Microseconds()).UTC()
			notes = append(notes, fmt.Sprintf("%s: key %s admitted %d in the window starting %s (Redis time)", r.name, w.key, w.allowed, start.Format("15:04:05.000")))
		}
	}
	if h.lost+g.lost > 0 {
		notes = append(notes, fmt.Sprintf("%d allowed decisions fell outside the tallied windows", h.lost+g.lost))
	}
	for _, r := range []phaseResult{h, g} {
		if r.firstErr != nil {
			notes = append(notes, fmt.Sprintf("%s: first error: %v", r.name, r.firstErr))
		}
	}
	if len(notes) > 0 {
		fmt.Fprintln(out, "notes:\n  "+strings.Join(notes, "\n  "))
	}
}

// printEmbeddedNote says what the embedded Redis does to the comparison,
// and how to run against a real one.
func printEmbeddedNote(out io.Writer, g phaseResult) {
	fmt.Fprintf(out, `
note: this run used the embedded miniredis, an in-process Redis written in Go
  that interprets every Lua script in Go, on the same CPUs as the workers.
  Every per-request decision pays for that (here p50 %s, %s decisions/s;
  a real Redis on loopback answers in well under a millisecond), so the
  decisions/s ratio above is against a baseline slower than any real one:
  it is not a measure of the hybrid. The round trips per decision compare
  fairly either way. For the real comparison, start a Redis and point the
  simulator at it:
    redis-server --port 6399 --save '' --appendonly no --daemonize yes
    go run ./cmd/ratelimit-sim --redis 127.0.0.1:6399
`, fmtDur(g.lat.quantile(0.5)), commas(uint64(perSec(g.decisions, g))))
}

// cpuPer is cpu seconds (the Redis server's or the sim's) per decision of
// phase r, or "-" when not known (cpu < 0: for Redis, the embedded one or
// a Cluster).
func cpuPer(cpu float64, r phaseResult) string {
	if cpu < 0 || r.decisions == 0 {
		return "-"
	}
	return fmtDur(time.Duration(cpu * 1e9 / float64(r.decisions)))
}
