package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/chart"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// small is the surge at a size CI runs in seconds: 200 clients offer about
// 200 req/s to a backend of 160 req/s (4 workers x 25ms) that refuses after
// 300ms in its queue; the limit, 1 per client per 2s, admits at most 100
// req/s. The long Redis timeout keeps the race detector's slowness from
// sending decisions to the failure mode, where the strict bound is not
// promised.
var small = []string{
	"--clients", "200", "--think", "1s", "--instances", "3",
	"--workers", "4", "--service", "25ms", "--queue-timeout", "300ms",
	"--limit", "1", "--period", "2s", "--timeout", "5s",
	"--duration", "4s", "--progress", "1s",
}

// The CI run of the surge, against a real redis-server: the embedded
// miniredis interprets Lua in Go, and under the race detector on a loaded
// machine it falls seconds behind (TestSurgeEmbedded runs it, smaller).
func TestSurgeSmall(t *testing.T) {
	srv := redistest.Standalone(t)
	cfg, err := parseArgs(append(append([]string{}, small...), "--redis", srv.Addr()), io.Discard)
	require.NoError(t, err)
	var out bytes.Buffer
	res, err := surge(context.Background(), cfg, &out)
	require.NoError(t, err)
	printReport(&out, cfg, res)
	t.Log("\n" + out.String())

	wo, wi := res.without, res.with
	for _, r := range []phaseResult{wo, wi} {
		require.Positive(t, r.requests, r.name)
		require.Positive(t, r.served, r.name)
		require.Zero(t, r.outsideWindows, r.name)
		require.Equal(t, r.requests, r.served+r.denied+r.failed, r.name)
	}

	// Without the limiter: the backend is overloaded, and clients get more
	// than the limit.
	require.Zero(t, wo.denied)
	require.Positive(t, wo.failed, "the backend must be driven past its capacity")
	require.Greater(t, wo.windows.max, cfg.limit)
	require.Equal(t, wo.served+wo.failed, wo.windows.total, "without the limiter every request reaching an instance is tallied")

	// With it: no client above its limit in any window, fewer failures.
	require.LessOrEqual(t, wi.windows.max, cfg.limit, "a client got more than its limit in a window")
	require.Zero(t, wi.windows.above)
	require.Positive(t, wi.denied, "the limit must bite")
	require.Less(t, wi.failed, wo.failed, "the limiter must spare the backend")
	require.Less(t, wi.backendServed, wo.backendServed)
	require.Zero(t, wi.stats.Fallback, "Redis answered in time: no decision from the failure mode")
	require.EqualValues(t, wi.requests, wi.stats.Decisions, "every request decided once")
	require.EqualValues(t, wi.stats.Allowed, wi.windows.total, "every allowed request tallied")
	require.Positive(t, wi.commands)

	checkFigures(t, cfg, res)

	s := out.String()
	for _, want := range []string{
		"4 workers x 25ms = 160 req/s capacity",
		"limit     1 per client per 2s, fleet-wide: httplimit over hybrid (FixedWindow, strict), Redis at " + srv.Addr(),
		"without limiter", "with limiter", "served latency p50", "served latency p99",
		"failure rate (non-429)", "429 responses", "429 latency p50 / p99", "backend RPS (capacity 160)",
		"allowed per client-window, max (limit 1)", "client-windows above the limit",
		"the most one client got in one window is 1 (limit 1): held",
		"  without      1s  requests", "  with         1s  requests", // progress
	} {
		require.Contains(t, s, want)
	}
}

// The default, embedded miniredis, at a load it keeps up with even under
// the race detector.
func TestSurgeEmbedded(t *testing.T) {
	var out bytes.Buffer
	args := append(append([]string{}, small...), "--clients", "50", "--workers", "1", "--duration", "2s")
	require.NoError(t, run(context.Background(), args, &out))
	s := out.String()
	t.Log("\n" + s)
	require.Contains(t, s, "embedded miniredis")
	require.Contains(t, s, "(limit 1): held")
	require.Contains(t, s, " 0 failure-mode decisions")
}

func TestSurgeUnreachableRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	addr := srv.Addr()
	srv.Kill()
	err := run(context.Background(), append(append([]string{}, small...), "--redis", addr), io.Discard)
	require.ErrorContains(t, err, "--redis "+addr)
}

// Interrupted: run returns the context's error at once, every goroutine
// stopped.
func TestSurgeCanceled(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := run(ctx, append(append([]string{}, small...), "--duration", "30s"), io.Discard)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 10*time.Second)
}

// The algorithm is one flag. The hybrid serves the buckets too: a token
// bucket run (the seed's limiter: a bucket per rider) against a real
// redis-server works, and holds every client in every window to the
// bucket's bound, burst + rate x window. sliding_log, which the hybrid
// cannot lease, is refused with a clear error.
func TestSurgeAlgorithm(t *testing.T) {
	cfg, err := parseArgs([]string{"--algorithm", "sliding"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, "SlidingWindow", cfg.algorithm.String())
	require.Equal(t, 1, cfg.bound(), "a window's bound is its limit")

	srv := redistest.Standalone(t)
	cfg, err = parseArgs(append(append([]string{}, small...), "--algorithm", "token_bucket", "--burst", "2", "--redis", srv.Addr()), io.Discard)
	require.NoError(t, err)
	require.Equal(t, ratelimit.TokenBucket, cfg.algorithm)
	require.Equal(t, 3, cfg.bound(), "burst 2 + 1 per 2s over a 2s window")
	var out bytes.Buffer
	res, err := surge(context.Background(), cfg, &out)
	require.NoError(t, err)
	printReport(&out, cfg, res)
	t.Log("\n" + out.String())
	wi := res.with
	require.Positive(t, wi.served)
	require.Positive(t, wi.denied, "clients send about 1 per second against a refill of 1 per 2s: the bucket must bite")
	require.Zero(t, wi.outsideWindows)
	require.Equal(t, wi.requests, wi.served+wi.denied+wi.failed)
	require.LessOrEqual(t, wi.windows.max, cfg.bound(), "a client got more than burst + rate x window")
	require.Zero(t, wi.windows.above)
	require.Greater(t, wi.windows.max, cfg.limit, "the burst lets a client past the refill alone in some window")
	require.Zero(t, wi.stats.Fallback, "Redis answered in time: no decision from the failure mode")
	require.EqualValues(t, wi.requests, wi.stats.Decisions, "every request decided once")
	require.EqualValues(t, wi.stats.Allowed, wi.windows.total, "every allowed request tallied")
	s := out.String()
	for _, want := range []string{
		"limit     a bucket of 2 per client, refilled 1 per 2s, fleet-wide: httplimit over hybrid (TokenBucket, strict)",
		"allowed per client-window, max (bound 3 = burst 2 + 1 per 2s)",
		"client-windows above the bound",
		"(bound 3 = burst 2 + 1 per 2s): held",
	} {
		require.Contains(t, s, want)
	}

	err = run(context.Background(), append(append([]string{}, small...), "--algorithm", "sliding_log", "--duration", "100ms"), io.Discard)
	require.ErrorContains(t, err, "invalid algorithm")
}

func TestParseArgs(t *testing.T) {
	cfg, err := parseArgs(nil, io.Discard)
	require.NoError(t, err)
	require.Equal(t, defaults(), cfg)
	require.Equal(t, algorithm, cfg.algorithm)

	cfg, err = parseArgs([]string{"--redis", "a:1, b:2"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, []string{"a:1", "b:2"}, cfg.redisAddrs)

	cfg, err = parseArgs([]string{"--algorithm", "gcra", "--limit", "10", "--period", "1s", "--burst", "20"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, ratelimit.Limit{Rate: 10, Period: time.Second, Burst: 20}, cfg.rateLimit())
	require.Equal(t, 30, cfg.bound(), "the seed's rider: burst 20 + 10 per second over a 1s window")

	var help bytes.Buffer
	_, err = parseArgs([]string{"-h"}, &help)
	require.True(t, errors.Is(err, flag.ErrHelp))
	require.Contains(t, help.String(), "-queue-timeout")

	for _, bad := range [][]string{
		{"--redis", "a:1,,b:2"}, {"--instances", "0"}, {"--instances", "65"}, {"--algorithm", "nope"},
		{"--limit", "0"}, {"--burst", "-1"}, {"--burst", "5"}, {"--algorithm", "sliding", "--burst", "5"}, {"--period", "1ms"}, {"--timeout", "0s"}, {"--prefix", ""}, {"--prefix", "a{b}"},
		{"--workers", "0"}, {"--service", "0s"}, {"--queue-timeout", "0s"}, {"--clients", "0"},
		{"--think", "0s"}, {"--client-timeout", "0s"}, {"--duration", "0s"}, {"--progress", "0s"},
		{"--clients", "100000", "--period", "10ms", "--duration", "1h"}, {"extra"}, {"--nope"},
	} {
		_, err := parseArgs(bad, io.Discard)
		require.Error(t, err, strings.Join(bad, " "))
	}
}

func TestCommas(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", -1234567: "-1,234,567", 100000: "100,000"} {
		require.Equal(t, want, commas(n))
	}
}

// The backend serves workers requests at a time and refuses one that waits
// longer than the queue timeout.
func TestBackendCeiling(t *testing.T) {
	b := newBackend(1, 300*time.Millisecond, 50*time.Millisecond)
	first := make(chan error)
	go func() { first <- b.do(context.Background()) }()
	for len(b.workers) == 0 {
		time.Sleep(time.Millisecond)
	}
	require.ErrorIs(t, b.do(context.Background()), errOverloaded)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, b.do(ctx), context.Canceled)
	require.NoError(t, <-first)
	require.EqualValues(t, 1, b.served.Load())
	require.NoError(t, b.do(context.Background()), "a free worker serves at once")
	require.EqualValues(t, 2, b.served.Load())
}

// checkFigures draws the run and checks what the figures hold against it:
// the answers per second add up to the phase's answers, and the latency
// distributions cover every served and denied request.
func checkFigures(t *testing.T, cfg config, res surgeResult) {
	t.Helper()
	dir := t.TempDir()
	for _, f := range figures(cfg, res, "test") {
		require.NoError(t, f.Write(dir))
	}
	f, err := chart.Read(dir, figRates)
	require.NoError(t, err)
	require.Len(t, f.Panels, 2)
	for i, r := range []phaseResult{res.without, res.with} {
		p := f.Panels[i]
		require.Equal(t, []string{"served (2xx)", "429 (rate limited)", "failed (503, timeouts)", "backend capacity (160/s)"}, p.Names())
		sum := func(name string) int64 {
			s, ok := p.Get(name)
			require.True(t, ok)
			require.Len(t, s.X, len(r.perSecond))
			var n float64
			for _, y := range s.Y {
				n += y
			}
			return int64(n)
		}
		require.Equal(t, r.served, sum("served (2xx)"), r.name)
		require.Equal(t, r.denied, sum("429 (rate limited)"), r.name)
		require.Equal(t, r.failed, sum("failed (503, timeouts)"), r.name)
	}
	f, err = chart.Read(dir, figLatency)
	require.NoError(t, err)
	require.Equal(t, []string{"served, without limiter", "served, with limiter", "429, with limiter"}, f.Panels[0].Names())
	for _, s := range f.Panels[0].Series {
		require.NotEmpty(t, s.Y, s.Name)
		require.Equal(t, 1.0, s.Y[len(s.Y)-1], "%s: a distribution ends at 1", s.Name)
	}
}

// The surge's figures committed under docs/img: a PNG that decodes, an SVG
// that parses and the JSON of the series, shown in a document.
func TestDocImages(t *testing.T) {
	const dir = "../../docs/img"
	page, err := os.ReadFile("../../docs/http.md")
	require.NoError(t, err)
	def := defaults()
	f, err := chart.Read(dir, figRates)
	require.NoError(t, err, "make it with scripts/plots.sh surge")
	require.True(t, strings.HasPrefix(f.Command, "go run ./cmd/ratelimit-surge "), f.Command)
	require.Contains(t, string(page), "img/"+figRates+".png")
	require.Len(t, f.Panels, 2)
	for _, p := range f.Panels {
		require.Equal(t, []string{"served (2xx)", "429 (rate limited)", "failed (503, timeouts)", "backend capacity (400/s)"}, p.Names())
		s, _ := p.Get("served (2xx)")
		require.GreaterOrEqual(t, len(s.X), int(def.duration/time.Second), "a point per second of the phase")
	}
	f, err = chart.Read(dir, figLatency)
	require.NoError(t, err)
	require.Contains(t, string(page), "img/"+figLatency+".png")
	require.Equal(t, []string{"served, without limiter", "served, with limiter", "429, with limiter"}, f.Panels[0].Names())
}
