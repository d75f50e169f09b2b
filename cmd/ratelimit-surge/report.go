package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

func printSetup(out io.Writer, cfg config, redisDesc string) {
	fmt.Fprintf(out, "ratelimit-surge: the seed's concert surge, scaled to this machine\n")
	fmt.Fprintf(out, "  clients   %s, each sending a request every %v on average (exponential), without waiting for the answer: %s req/s offered\n",
		commas(int64(cfg.clients)), cfg.think, commas(int64(cfg.offered())))
	fmt.Fprintf(out, "  API       %d instances behind a round-robin reverse proxy\n", cfg.instances)
	fmt.Fprintf(out, "  backend   %d workers x %v = %s req/s capacity; 503 after %v waiting for a worker\n",
		cfg.workers, cfg.service, commas(int64(cfg.capacity())), cfg.queueTimeout)
	if cfg.algorithm.IsWindow() {
		fmt.Fprintf(out, "  limit     %d per client per %v, fleet-wide: httplimit over hybrid (%v, strict), %s\n",
			cfg.limit, cfg.period, cfg.algorithm, redisDesc)
		return
	}
	fmt.Fprintf(out, "  limit     a bucket of %d per client, refilled %d per %v, fleet-wide: httplimit over hybrid (%v, strict), %s\n",
		cfg.rateLimit().Capacity(cfg.algorithm), cfg.limit, cfg.period, cfg.algorithm, redisDesc)
}

// boundText says what a client-window is compared with: "limit 1", or for
// a bucket "bound 30 = burst 20 + 10 per 1s".
func boundText(cfg config) string {
	if cfg.algorithm.IsWindow() {
		return fmt.Sprintf("limit %d", cfg.limit)
	}
	return fmt.Sprintf("bound %d = burst %d + %d per %v", cfg.bound(), cfg.rateLimit().Capacity(cfg.algorithm), cfg.limit, cfg.period)
}

// printReport prints the seed's before/after table and the checks.
func printReport(out io.Writer, cfg config, res surgeResult) {
	wo, wi := res.without, res.with
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 3, ' ', tabwriter.AlignRight)
	row := func(label, a, b string) { fmt.Fprintf(tw, "%s\t%s\t%s\t\n", label, a, b) }
	row("", "without limiter", "with limiter")
	row("requests", commas(wo.requests), commas(wi.requests))
	row("served (2xx)", commas(wo.served), commas(wi.served))
	for _, q := range []float64{0.50, 0.95, 0.99} {
		label := fmt.Sprintf("served latency p%.0f", q*100)
		row(label, latency(wo.servedLat, q), latency(wi.servedLat, q))
	}
	row("failure rate (non-429)", percent(wo.failed, wo.requests), percent(wi.failed, wi.requests))
	row("failures (non-429)", commas(wo.failed), commas(wi.failed))
	row("429 responses", commas(wo.denied), commas(wi.denied))
	row("429 latency p50 / p99", latency(wo.deniedLat, 0.5)+" / "+latency(wo.deniedLat, 0.99),
		latency(wi.deniedLat, 0.5)+" / "+latency(wi.deniedLat, 0.99))
	row(fmt.Sprintf("backend RPS (capacity %s)", commas(int64(cfg.capacity()))),
		rps(wo.backendServed, wo.elapsed), rps(wi.backendServed, wi.elapsed))
	row(fmt.Sprintf("allowed per client-window, max (%s)", boundText(cfg)),
		strconv.Itoa(wo.windows.max), strconv.Itoa(wi.windows.max))
	above := "client-windows above the limit"
	if !cfg.algorithm.IsWindow() {
		above = "client-windows above the bound"
	}
	row(above, percent(int64(wo.windows.above), int64(wo.windows.active)),
		percent(int64(wi.windows.above), int64(wi.windows.active)))
	tw.Flush()

	fmt.Fprintln(out)
	fmt.Fprintf(out, "served p99 %s -> %s (%s); failures (non-429) %s -> %s; backend %s -> %s req/s\n",
		latency(wo.servedLat, 0.99), latency(wi.servedLat, 0.99),
		change(quantile(wo.servedLat, 0.99).Seconds(), quantile(wi.servedLat, 0.99).Seconds()),
		percent(wo.failed, wo.requests), percent(wi.failed, wi.requests),
		rps(wo.backendServed, wo.elapsed), rps(wi.backendServed, wi.elapsed))
	verdict := "held"
	if wi.windows.max > cfg.bound() {
		verdict = fmt.Sprintf("VIOLATED in %d client-windows", wi.windows.above)
	}
	fmt.Fprintf(out, "with the limiter, the most one client got in one window is %d (%s): %s\n",
		wi.windows.max, boundText(cfg), verdict)
	s := wi.stats
	fmt.Fprintf(out, "hybrid: %s decisions (%s allowed, %s denied), %s Redis round trips (%s waited on) carrying %s commands, %s failure-mode decisions, %s flush errors\n",
		commas(int64(s.Decisions)), commas(int64(s.Allowed)), commas(int64(s.Denied)), commas(int64(s.RoundTrips)),
		commas(int64(s.SyncRoundTrips)), commas(wi.commands), commas(int64(s.Fallback)), commas(int64(s.FlushErrors)))
	if s.SpentSent+s.SpentHeard > 0 {
		fmt.Fprintf(out, "hybrid: %s windows filled and told to the fleet, %s such words heard, %s decisions denied in memory on one\n",
			commas(int64(s.SpentSent)), commas(int64(s.SpentHeard)), commas(int64(s.SpentDenied)))
	}
	for _, r := range []phaseResult{wo, wi} {
		if r.firstErr != "" {
			fmt.Fprintf(out, "%s: first client error: %s\n", r.name, r.firstErr)
		}
		if r.limiterErrs > 0 {
			fmt.Fprintf(out, "%s: %d requests answered without a decision; first: %s\n", r.name, r.limiterErrs, r.firstLimiter)
		}
		if r.outsideWindows > 0 {
			fmt.Fprintf(out, "%s: %d allowed requests fell outside the phase's windows (clock?)\n", r.name, r.outsideWindows)
		}
	}
}

// quantile returns the q-quantile of sorted (nearest rank), 0 when empty.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func latency(sorted []time.Duration, q float64) string {
	if len(sorted) == 0 {
		return "-"
	}
	d := quantile(sorted, q)
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%.0fms", float64(d)/1e6)
	case d >= time.Millisecond:
		return fmt.Sprintf("%.1fms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.0fµs", float64(d)/1e3)
}

func percent(n, of int64) string {
	if of == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(of))
}

func rps(n int64, over time.Duration) string {
	if over <= 0 {
		return "-"
	}
	return commas(int64(float64(n)/over.Seconds() + 0.5))
}

func change(before, after float64) string {
	if before == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%+.1f%%", 100*(after-before)/before)
}

// commas formats n with thousands separators: 12,345.
func commas(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
