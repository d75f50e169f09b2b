package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/stretchr/testify/require"
)

// tiny flags: two short phases on the embedded miniredis. The long timeout
// keeps the race detector's slowness from sending decisions to the failure
// mode, where the strict bound is not promised.
var tiny = []string{
	"--instances", "2", "--workers", "2", "--keys", "20", "--limit", "200",
	"--period", "250ms", "--duration", "1200ms", "--sync", "25ms", "--timeout", "2s",
}

func TestSimulateTiny(t *testing.T) {
	cfg, err := parseArgs(tiny, &bytes.Buffer{})
	require.NoError(t, err)
	var out bytes.Buffer
	res, err := simulate(context.Background(), cfg, &out)
	require.NoError(t, err)
	printReport(&out, cfg, res)
	t.Log("\n" + out.String())

	for _, r := range []phaseResult{res.hybrid, res.global} {
		require.Positive(t, r.decisions, r.name)
		require.Positive(t, r.allowed, r.name)
		require.Zero(t, r.errs, "%s: %v", r.name, r.firstErr)
		require.GreaterOrEqual(t, r.fullWindows, 2, r.name)
		require.LessOrEqual(t, r.maxWin, cfg.limit, "%s admitted more than the limit in a key-window", r.name)
		require.Positive(t, r.roundTrips, r.name)
	}
	require.Zero(t, res.hybrid.stats.Fallback)
	require.Positive(t, res.hybrid.denied, "the hybrid phase must drive keys past the limit")
	require.Less(t, res.hybrid.roundTrips, res.hybrid.decisions/5, "the hybrid must answer most decisions from memory")
	// Every global decision is a round trip (the first per client two:
	// EVALSHA, then EVAL on NOSCRIPT).
	require.GreaterOrEqual(t, res.global.roundTrips, res.global.decisions)

	s := out.String()
	for _, want := range []string{"hybrid (strict)", "global (per request)", "decisions/s (fleet)",
		"Redis round trips / 1000 decisions", "latency p999", "max allowed per key-window (limit 200)",
		"round trips per decision: global / hybrid", "strict bound, max allowed per key-window <= limit = 200: held"} {
		require.Contains(t, s, want)
	}
	require.Contains(t, s, "  hybrid   1.0s  decisions", "progress line")
	require.Contains(t, s, "  global   1.0s  decisions", "progress line")
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
