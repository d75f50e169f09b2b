package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit/internal/chart"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// tiny flags: two short phases on the embedded miniredis. The long timeout
// keeps the race detector's slowness from sending decisions to the failure
// mode, where the strict bound is not promised.
var tiny = []string{
	"--instances", "2", "--workers", "2", "--keys", "20", "--limit", "200",
	"--period", "250ms", "--duration", "1200ms", "--sync", "25ms", "--timeout", "2s",
}

func TestSimulateTiny(t *testing.T) {
	dir := t.TempDir()
	cfg, err := parseArgs(append(append([]string{}, tiny...), "--plot", dir), &bytes.Buffer{})
	require.NoError(t, err)
	var out bytes.Buffer
	res, err := simulate(context.Background(), cfg, &out)
	require.NoError(t, err)
	printReport(&out, cfg, res)
	t.Log("\n" + out.String())
	checkRunFigures(t, cfg, res, runFigures(cfg, res, "test"), dir)

	for _, r := range []phaseResult{res.hybrid, res.global} {
		require.Positive(t, r.decisions, r.name)
		require.Positive(t, r.allowed, r.name)
		require.Zero(t, r.errs, "%s: %v", r.name, r.firstErr)
		require.GreaterOrEqual(t, r.fullWindows, 2, r.name)
		require.LessOrEqual(t, r.maxWin, cfg.limit, "%s admitted more than the limit in a key-window", r.name)
		require.Positive(t, r.roundTrips, r.name)
		if runtime.GOOS != "windows" && runtime.GOOS != "plan9" {
			require.Positive(t, r.ownCPU, "%s: the process's CPU over the phase (getrusage)", r.name)
		}
	}
	require.Zero(t, res.hybrid.stats.Fallback)
	require.Positive(t, res.hybrid.denied, "the hybrid phase must drive keys past the limit")
	require.Less(t, res.hybrid.roundTrips, res.hybrid.decisions/5, "the hybrid must answer most decisions from memory")
	// Every global decision is a round trip (the first per client two:
	// EVALSHA, then EVAL on NOSCRIPT).
	require.GreaterOrEqual(t, res.global.roundTrips, res.global.decisions)

	s := out.String()
	for _, want := range []string{"hybrid (strict)", "global (per request)", "decisions/s (fleet)",
		"Redis round trips / 1000 decisions", "the sim's own CPU per decision (getrusage)", "latency p999", "max allowed per key-window (limit 200)",
		"round trips per decision: global / hybrid", "strict bound, max allowed per key-window <= limit = 200: held"} {
		require.Contains(t, s, want)
	}
	// A progress line a second into each phase (later on a busy host).
	require.Regexp(t, `(?m)^  hybrid +[0-9]+\.[0-9]s  decisions`, s, "progress line")
	require.Regexp(t, `(?m)^  global +[0-9]+\.[0-9]s  decisions`, s, "progress line")
	// On the embedded Redis the ratio is said to be against a slow
	// baseline, with the command for a real one.
	require.Contains(t, s, "both on the embedded miniredis: see the note below")
	require.Contains(t, s, "note: this run used the embedded miniredis")
	require.Contains(t, s, "go run ./cmd/ratelimit-sim --redis 127.0.0.1:6399")
}

// checkRunFigures writes figs to dir and checks what each holds against
// the run's own results: the series of both phases, one point per sample
// interval, per full window, per latency bucket used.
func checkRunFigures(t *testing.T, cfg config, res *results, figs []chart.Figure, dir string) {
	t.Helper()
	files, err := writeFigures(dir, figs)
	require.NoError(t, err)
	require.Len(t, files, 4)
	hl, gl := phaseLabels(cfg)
	read := func(name string) chart.Panel {
		f, err := chart.Read(dir, name)
		require.NoError(t, err, name)
		require.Equal(t, "test", f.Command)
		require.Len(t, f.Panels, 1, name)
		return f.Panels[0]
	}
	get := func(p chart.Panel, name string) chart.Series {
		s, ok := p.Get(name)
		require.True(t, ok, "series %q in %v", name, p.Names())
		return s
	}
	for _, name := range []string{figRate, figRoundTrips} {
		p := read(name)
		require.Equal(t, []string{hl, gl}, p.Names(), name)
		require.Len(t, get(p, hl).X, len(res.hybrid.samples)-1, name)
		require.Len(t, get(p, gl).X, len(res.global.samples)-1, name)
		require.GreaterOrEqual(t, len(res.hybrid.samples), 10, "about 50 samples a phase")
	}
	// The rate series add up to the decisions (each interval's rate x its length).
	rate := get(read(figRate), gl)
	var sum, prev float64
	for i, x := range rate.X {
		sum += rate.Y[i] * (x - prev)
		prev = x
	}
	require.InEpsilon(t, float64(res.global.decisions), sum, 0.01)

	lat := read(figLatency)
	require.Equal(t, []string{hl, gl}, lat.Names())
	for _, name := range []string{hl, gl} {
		s := get(lat, name)
		require.NotEmpty(t, s.X)
		require.Equal(t, 1.0, s.Y[len(s.Y)-1], "a distribution ends at 1")
	}
	win := read(figWindows)
	require.Equal(t, []string{hl + ": most for one key", gl + ": most for one key", hl + ": hottest key", gl + ": hottest key", "limit"}, win.Names())
	require.Len(t, get(win, hl+": most for one key").Y, res.hybrid.fullWindows)
	require.Len(t, get(win, gl+": hottest key").Y, res.global.fullWindows)
	for _, y := range get(win, hl+": most for one key").Y {
		require.LessOrEqual(t, y, float64(cfg.limit))
	}
	require.Equal(t, []float64{float64(cfg.limit), float64(cfg.limit)}, get(win, "limit").Y)
}

func TestRunOptimistic(t *testing.T) {
	var out bytes.Buffer
	args := append(append([]string{}, tiny...), "--mode", "optimistic", "--rate", "4000", "--zipf", "0", "--fix-instances")
	require.NoError(t, run(context.Background(), args, &out))
	s := out.String()
	require.Contains(t, s, "hybrid (optimistic)")
	require.Contains(t, s, "open loop: 4,000 decisions/s")
	require.Contains(t, s, "instances fixed at 2")
	require.Contains(t, s, "optimistic bound, max allowed per key-window <= limit + instances x share = 224: held")
}

// Every algorithm the hybrid serves runs in both phases, each phase
// bounded as its algorithm is: a window's limit, or a bucket's burst plus
// its refill over the window. The limit is small enough that the hottest
// key is driven past it however slow the host (under -race the global
// phase on the embedded Redis runs about 1,600 decisions/s: some 100 a
// window for the hottest key).
func TestRunAlgorithms(t *testing.T) {
	for _, c := range []struct {
		args  []string
		label string
		bound int
	}{
		{[]string{"--algorithm", "sliding"}, "strict bound, max allowed per key-window <= limit = 20: held", 20},
		{[]string{"--algorithm", "token_bucket", "--burst", "5"}, "strict bound, max allowed per key-window <= burst + rate x window = 25: held", 25},
		{[]string{"--algorithm", "gcra"}, "strict bound, max allowed per key-window <= burst + rate x window = 40: held", 40},
	} {
		t.Run(c.args[1], func(t *testing.T) {
			cfg, err := parseArgs(append(append(append([]string{}, tiny...), "--limit", "20"), c.args...), &bytes.Buffer{})
			require.NoError(t, err)
			require.Equal(t, c.bound, cfg.bound())
			var out bytes.Buffer
			res, err := simulate(context.Background(), cfg, &out)
			require.NoError(t, err)
			printReport(&out, cfg, res)
			s := out.String()
			t.Log("\n" + s)
			for _, r := range []phaseResult{res.hybrid, res.global} {
				require.Zero(t, r.errs, "%s: %v", r.name, r.firstErr)
				require.Positive(t, r.allowed, r.name)
				require.Positive(t, r.denied, "%s: the tiny run drives keys past the limit", r.name)
				require.LessOrEqual(t, r.maxWin, c.bound, "%s admitted more than the bound in a key-window", r.name)
				require.Zero(t, r.overLimit, r.name)
			}
			require.Contains(t, s, c.label)
			require.Contains(t, s, "global: "+cfg.algorithm.String()+", a limiter per worker")
		})
	}
}

func TestRunCancelled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	args := append(append([]string{}, tiny...), "--duration", "10s")
	start := time.Now()
	err := run(ctx, args, &bytes.Buffer{})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 5*time.Second)
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--instances", "0"}, {"--workers", "0"}, {"--keys", "0"}, {"--rate", "-1"},
		{"--limit", "0"}, {"--period", "0"}, {"--period", "1500ns"}, {"--duration", "0"},
		{"--sync", "0"}, {"--timeout", "0"}, {"--mode", "fast"}, {"--zipf", "-1"},
		{"--prefix", ""}, {"--prefix", "a{b}"}, {"--redis", "a:1,,b:2"},
		{"--bogus"}, {"--instances", "x"}, {"extra"},
		{"--keys", "10000000", "--period", "1ms", "--duration", "1s"},
		{"--redis-latency", "-1ms"}, {"--redis-latency", "1m"}, {"--redis", "a:1,b:2", "--redis-latency", "20ms"},
		{"--redis", "a:1,b:2", "--multi-region"}, {"--sweep", "--multi-region"},
		{"--sweep-keys", "1,x"}, {"--sweep-keys", "0"}, {"--latencies", "20ms,0"}, {"--latencies", "fast"},
		{"--sweep", "--sweep-keys", "10000000", "--period", "1ms", "--duration", "1s"},
		{"--algorithm", "sliding_log"}, {"--algorithm", "leaky"}, {"--burst", "-1", "--algorithm", "gcra"},
		{"--burst", "5"}, {"--algorithm", "gcra", "--limit", "2000", "--period", "1ms"},
		{"--align", "1s"}, {"--align", "-1ms"}, {"--align", "soon"}, {"--align", "300ms", "--period", "200ms"},
	} {
		var out bytes.Buffer
		err := run(context.Background(), args, &out)
		require.Error(t, err, "%q", args)
		require.False(t, errors.Is(err, flag.ErrHelp), "%q", args)
		require.NotContains(t, out.String(), "decisions", "%q must fail before running", args)
	}
	var out bytes.Buffer
	require.ErrorIs(t, run(context.Background(), []string{"-h"}, &out), flag.ErrHelp)
	require.Contains(t, out.String(), "-instances")
}

// --align starts each phase at the same point of a period of Redis time.
func TestAlign(t *testing.T) {
	ms := int64(time.Millisecond / time.Microsecond)
	for _, c := range []struct{ now, off, want int64 }{
		{1000 * ms, 300 * ms, 300 * ms}, // at a period's start
		{1300 * ms, 300 * ms, 0},        // at the moment
		{1301 * ms, 300 * ms, 999 * ms}, // just past it: the next period's
		{1900 * ms, 0, 100 * ms},
	} {
		require.Equal(t, time.Duration(c.want)*time.Microsecond, alignWait(c.now, 1000*ms, c.off), "now %d, offset %d", c.now, c.off)
	}

	args := append(append([]string{}, tiny...), "--period", "1s", "--limit", "800", "--align", "300ms")
	cfg, err := parseArgs(args, &bytes.Buffer{})
	require.NoError(t, err)
	res, err := simulate(context.Background(), cfg, &bytes.Buffer{})
	require.NoError(t, err)
	for _, r := range []phaseResult{res.hybrid, res.global} {
		require.Positive(t, r.decisions, r.name)
		// at 300ms into a second, or later by however late the host woke
		// the phase (bounded here by half a period)
		off := time.Duration(r.startUS%(1000*ms)) * time.Microsecond
		require.GreaterOrEqual(t, off, 300*time.Millisecond, r.name)
		require.Less(t, off, 800*time.Millisecond, r.name)
	}
}

func TestUnreachableRedis(t *testing.T) {
	mr := miniredis.RunT(t)
	addr := mr.Addr()
	mr.Close()
	err := run(context.Background(), []string{"--redis", addr, "--duration", "100ms"}, &bytes.Buffer{})
	require.Error(t, err)
}

func TestHistQuantiles(t *testing.T) {
	var h hist
	for i := 1; i <= 1000; i++ {
		h.record(time.Duration(i) * time.Microsecond)
	}
	for _, q := range []float64{0.5, 0.99, 0.999} {
		got := float64(h.quantile(q))
		want := q * 1000 * float64(time.Microsecond)
		require.InEpsilon(t, want, got, 0.07, "q%v", q)
	}
	for v := uint64(0); v < 1<<20; v = v*2 + 1 {
		b := bucketOf(v)
		require.Less(t, b, histBuckets)
		require.InEpsilon(t, float64(v)+1, bucketMid(b)+1, 0.07, "v=%d", v)
	}
	require.Less(t, bucketOf(math.MaxUint64), histBuckets)
}

func TestWorkloadZipf(t *testing.T) {
	w := newWorkload(100, 1)
	var sum float64
	for _, s := range w.share {
		sum += s
	}
	require.InDelta(t, 1, sum, 1e-9)
	p := w.picker(1, 1)
	counts := make([]int, 100)
	const n = 200_000
	for i := 0; i < n; i++ {
		counts[p.next()]++
	}
	require.InEpsilon(t, w.share[0], float64(counts[0])/n, 0.05)
	require.InEpsilon(t, w.share[9], float64(counts[9])/n, 0.1)
	require.Positive(t, counts[99])
	require.True(t, strings.HasPrefix(w.keys[0], "user:"))
}

// --redis-latency puts the fault proxy between every client and Redis:
// every per-request decision pays the round trip, while the hybrid answers
// most decisions from memory. An open loop, so that the test does not
// take the CPU from the tests of other packages running beside it.
func TestRedisLatency(t *testing.T) {
	srv := redistest.Standalone(t)
	const rtt = 20 * time.Millisecond
	cfg, err := parseArgs(append(append([]string{}, tiny...), "--redis", srv.Addr(), "--redis-latency", rtt.String(),
		"--duration", "1s", "--rate", "1000", "--workers", "16"), &bytes.Buffer{})
	require.NoError(t, err)
	var out bytes.Buffer
	res, err := simulate(context.Background(), cfg, &out)
	require.NoError(t, err)
	printReport(&out, cfg, res)
	t.Log("\n" + out.String())
	require.Contains(t, out.String(), "20ms away (every round trip +20ms, through internal/faultproxy)")
	require.NotContains(t, out.String(), "note: this run used the embedded miniredis")
	g, h := res.global, res.hybrid
	require.Positive(t, g.decisions)
	require.Zero(t, g.errs, "%v", g.firstErr)
	// The histogram's buckets are within 6%.
	require.GreaterOrEqual(t, float64(g.lat.quantile(0.01)), 0.94*float64(rtt), "every global decision crosses the link")
	require.Positive(t, h.decisions)
	require.Less(t, h.lat.quantile(0.5), rtt/2, "most hybrid decisions do not wait")
	require.Less(t, h.stats.Decisions-h.stats.LocalDecisions, h.stats.Decisions/2, "most hybrid decisions are taken in memory")
	require.LessOrEqual(t, h.maxWin, cfg.limit)
}

// --sweep runs the three limiters at each key count and draws round trips
// per decision and decisions/s against u.
func TestSweep(t *testing.T) {
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	var out bytes.Buffer
	args := []string{"--redis", srv.Addr(), "--sweep", "--sweep-keys", "1,400", "--instances", "2", "--workers", "2",
		"--duration", "300ms", "--timeout", "2s", "--plot", dir}
	require.NoError(t, run(context.Background(), args, &out))
	s := out.String()
	t.Log("\n" + s)
	require.Contains(t, s, "limit 100,000,000 per 1s per key")
	require.Contains(t, s, "| keys | limiter | u | decisions/s | round trips / decision |")
	f, err := chart.Read(dir, figRegime)
	require.NoError(t, err)
	require.Equal(t, commandLine(args), f.Command)
	require.Len(t, f.Panels, 2)
	for _, p := range f.Panels {
		require.Equal(t, kinds, p.Names())
		for _, sr := range p.Series {
			require.Len(t, sr.X, 2, "%s: one point per key count", sr.Name)
			require.Greater(t, sr.X[0], sr.X[1], "%s: u falls as keys grow", sr.Name)
		}
	}
	rt, _ := f.Panel("Redis round trips per decision")
	g, _ := rt.Get(labelGlobal)
	h, _ := rt.Get(labelStrict)
	require.GreaterOrEqual(t, g.Y[0], 1.0, "per request: a round trip per decision")
	require.Less(t, h.Y[0], 0.1, "one hot key: the hybrid answers from its lease")
}

// --multi-region runs every regime near and far, through the three
// limiters, and draws each against the round trip.
func TestMultiRegion(t *testing.T) {
	if testing.Short() {
		t.Skip("18 short phases")
	}
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	var out bytes.Buffer
	args := []string{"--redis", srv.Addr(), "--multi-region", "--latencies", "20ms", "--instances", "2", "--workers", "16",
		"--rate", "400", "--duration", "500ms", "--timeout", "2s", "--plot", dir}
	require.NoError(t, run(context.Background(), args, &out))
	s := out.String()
	t.Log("\n" + s)
	require.Contains(t, s, "open loop: 400 decisions/s offered")
	require.Contains(t, s, "| regime | round trip added | limiter | decisions/s | p50 | p99 | waited on Redis | in flight | no reply in time |")
	require.Contains(t, s, "| cold | 20ms | global (per request) |")
	require.Contains(t, s, "| hot | 0s | hybrid strict |")
	for _, name := range []string{figMultiLatency, figMultiWaits} {
		f, err := chart.Read(dir, name)
		require.NoError(t, err)
		require.Len(t, f.Panels, len(regimes), name)
		for i, p := range f.Panels {
			require.True(t, strings.HasPrefix(p.Title, regimes[i].name+" keys"), p.Title)
			for _, sr := range p.Series {
				require.Equal(t, []float64{0, 20}, sr.X, "%s %s", name, sr.Name)
			}
		}
	}
	f, err := chart.Read(dir, figMultiWaits)
	require.NoError(t, err)
	for _, p := range f.Panels {
		require.Equal(t, kinds, p.Names())
		g, _ := p.Get(labelGlobal)
		require.Equal(t, []float64{100, 100}, g.Y, "every per-request decision waits")
	}
	f, err = chart.Read(dir, figMultiLatency)
	require.NoError(t, err)
	p, _ := f.Panel("cold")
	require.Equal(t, []string{labelStrict, labelStrict + " p99", labelOptimistic, labelOptimistic + " p99", labelGlobal, labelGlobal + " p99"}, p.Names())
	g, _ := p.Get(labelGlobal)
	require.GreaterOrEqual(t, g.Y[1], 20*0.94, "a far per-request decision takes the round trip")
	o, _ := p.Get(labelOptimistic)
	require.Less(t, o.Y[1], 10.0, "an optimistic decision does not wait for the far Redis")
}

// The figures committed under docs/img are the simulator's, whole: each a
// PNG that decodes, an SVG that parses, and the JSON of the series the
// command draws, with the lengths its flags make; and a document shows
// each. (What they show is measured, not checked here: see
// scripts/plots.sh.)
func TestDocImages(t *testing.T) {
	const dir = "../../docs/img"
	docs := readDocs(t)
	read := func(name string, panels int) chart.Figure {
		t.Helper()
		f, err := chart.Read(dir, name)
		require.NoError(t, err, "%s: make it with scripts/plots.sh", name)
		require.Len(t, f.Panels, panels, name)
		require.True(t, strings.HasPrefix(f.Command, "go run ./cmd/ratelimit-sim "), "%s: %q", name, f.Command)
		require.Contains(t, docs, "img/"+name+".png", "%s is shown in docs/", name)
		return f
	}
	def, err := parseArgs(nil, &bytes.Buffer{}) // the defaults, lists parsed
	require.NoError(t, err)
	hl, gl := phaseLabels(def)

	for _, name := range []string{figRate, figRoundTrips} {
		p := read(name, 1).Panels[0]
		require.Equal(t, []string{hl, gl}, p.Names(), name)
		for _, s := range p.Series {
			require.GreaterOrEqual(t, len(s.X), 40, "%s %s: about 50 samples a phase", name, s.Name)
		}
	}
	p := read(figLatency, 1).Panels[0]
	require.Equal(t, []string{hl, gl}, p.Names())
	for _, s := range p.Series {
		require.Equal(t, 1.0, s.Y[len(s.Y)-1])
	}
	p = read(figWindows, 1).Panels[0]
	require.Equal(t, []string{hl + ": most for one key", gl + ": most for one key", hl + ": hottest key", gl + ": hottest key", "limit"}, p.Names())
	for _, s := range p.Series[:4] {
		require.Len(t, s.Y, int(def.duration/def.period)-1, "%s: the full windows of a 5s phase", s.Name)
		for _, y := range s.Y {
			require.LessOrEqual(t, y, float64(def.limit), s.Name)
		}
	}
	lim, _ := p.Get("limit")
	require.Equal(t, []float64{float64(def.limit), float64(def.limit)}, lim.Y)

	f := read(figRegime, 2)
	for _, p := range f.Panels {
		require.Equal(t, kinds, p.Names())
		for _, s := range p.Series {
			require.Len(t, s.X, len(def.sweepKeys), "%s: one point per key count", s.Name)
		}
	}
	for _, name := range []string{figMultiLatency, figMultiWaits} {
		f := read(name, len(regimes))
		for i, p := range f.Panels {
			require.True(t, strings.HasPrefix(p.Title, regimes[i].name+" keys"), p.Title)
			for _, s := range p.Series {
				require.Equal(t, []float64{0, 20, 50, 100}, s.X, "%s %s", name, s.Name)
			}
		}
	}
}

// readDocs returns every page of docs/ and the README, concatenated.
func readDocs(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	pages, err := filepath.Glob("../../docs/*.md")
	require.NoError(t, err)
	for _, p := range append(pages, "../../README.md") {
		data, err := os.ReadFile(p)
		require.NoError(t, err)
		b.Write(data)
	}
	return b.String()
}

// The closing ratios keep two decimals where a rounding would change the
// verdict against the cold rows' targets (1.55 is not 2x).
func TestTimes(t *testing.T) {
	for r, want := range map[float64]string{1.55: "1.55x", 0.5: "0.50x", 9.994: "9.99x", 10: "10x", 111.4: "111x"} {
		require.Equal(t, want, times(r), "%v", r)
	}
}
