package hybrid_test

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/hybridlimit/ratelimit/internal/rtcount"
)

// hooked returns a new client of srv with a round-trip counter.
func hooked(t testing.TB, srv *redistest.Server) (*redis.Client, *rtcount.Hook) {
	c := srv.Client()
	t.Cleanup(func() { c.Close() })
	h := &rtcount.Hook{}
	c.AddHook(h)
	return c, h
}

func sumRT(hs []*rtcount.Hook) (n int64) {
	for _, h := range hs {
		n += h.RoundTrips()
	}
	return n
}

// closedLoop runs workers goroutines per limiter, each drawing keys
// uniformly at random (so that every key's requests are spread in time, as
// independent clients' are), until stop is closed; it returns the
// decisions, denials and errors.
func closedLoop(ls []ratelimit.Limiter, keys []string, workers int, stop <-chan struct{}) (decisions, denied, errs int64) {
	var d, dn, e atomic.Int64
	var wg sync.WaitGroup
	for li, l := range ls {
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(l ratelimit.Limiter, x uint64) {
				defer wg.Done()
				var nd, ndn, ne int64
				for {
					if nd&63 == 0 {
						select {
						case <-stop:
							d.Add(nd)
							dn.Add(ndn)
							e.Add(ne)
							return
						default:
						}
					}
					x ^= x << 13 // xorshift64
					x ^= x >> 7
					x ^= x << 17
					dec, err := l.AllowN(context.Background(), keys[x%uint64(len(keys))], 1)
					nd++
					switch {
					case err != nil:
						ne++
					case !dec.Allowed:
						ndn++
					}
				}
			}(l, uint64(li*workers+w+1)*0x9E3779B97F4A7C15)
		}
	}
	<-stop
	wg.Wait()
	return d.Load(), dn.Load(), e.Load()
}

// touchAll makes one decision per key on every limiter, from 32 goroutines
// per limiter.
func touchAll(ls []ratelimit.Limiter, keys []string) (denied, errs int64) {
	var dn, e atomic.Int64
	var wg sync.WaitGroup
	for _, l := range ls {
		for w := 0; w < 32; w++ {
			wg.Add(1)
			go func(l ratelimit.Limiter, w int) {
				defer wg.Done()
				for i := w; i < len(keys); i += 32 {
					d, err := l.AllowN(context.Background(), keys[i], 1)
					switch {
					case err != nil:
						e.Add(1)
					case !d.Allowed:
						dn.Add(1)
					}
				}
			}(l, w)
		}
	}
	wg.Wait()
	return dn.Load(), e.Load()
}

// skipUnderRace skips a test that measures speed or Redis memory when the
// race detector is on; scripts/test.sh runs these tests without it.
func skipUnderRace(t *testing.T) {
	t.Helper()
	if raceEnabled {
		t.Skip("measured without the race detector, in a pass of its own (scripts/test.sh): the detector slows the in-memory path, not Redis")
	}
}

func after(d time.Duration) <-chan struct{} {
	ch := make(chan struct{})
	time.AfterFunc(d, func() { close(ch) })
	return ch
}

// Many keys, each far under its limit: a fleet of 4 instances sweeping
// 10,000 keys makes at most one Redis round trip per 100 decisions once
// every key has been seen, and denies nothing. The window rolls three
// times while it is measured: the roll must cost no waiting. It logs its
// speed against per-request Redis (global limiters, one per worker) and
// against a batching global, but asserts none: speed is for benchmarks
// (bench: BenchmarkHybrid10kKeys beside BenchmarkPerRequestRedis). On
// these shared 2-core VMs the ratio ran from 13x to 80x on the same code.
const warmup, maxWarmup = 2500 * time.Millisecond, 12 * time.Second

func TestManyKeysUnderLimit(t *testing.T) {
	skipUnderRace(t)
	srv := redistest.Standalone(t)
	limit := ratelimit.PerSecond(2000)
	// 16 requests in flight per instance. (With very few, a fleet that
	// starts cold stays cold: each key is then used less than once per
	// window per instance, and in strict mode such a key's every decision
	// is a round trip, by design; see docs/tuning.md.)
	const instances, workers = 4, 16
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "user-" + strconv.Itoa(i)
	}
	prefix := uniq(t)
	var hooks []*rtcount.Hook
	var ls []ratelimit.Limiter
	var hs []*hybrid.Limiter
	for i := 0; i < instances; i++ {
		c, hk := hooked(t, srv)
		h, err := hybrid.New(c, limit, hybrid.WithPrefix(prefix))
		require.NoError(t, err)
		t.Cleanup(func() { h.Close() })
		hooks, hs, ls = append(hooks, hk), append(hs, h), append(ls, h)
	}
	// Warm up: every instance sees every key once (each a round trip in
	// strict mode, by design: a key's first decision leases), then the
	// closed loop runs across window rolls until it is steady: a second in
	// which it made at most one round trip per 100 decisions (at least
	// warmup, at most maxWarmup). A closed loop that starts cold runs slow
	// at first (each worker waits on its keys' first leases, so each key
	// is asked less often, so fewer keys are worth leasing ahead); on a
	// busy 2-core host it has taken from 1 to 10 seconds to settle.
	wDenied, wErrs := touchAll(ls, keys)
	warmStart := time.Now()
	for {
		rt0 := sumRT(hooks)
		n, d2, e2 := closedLoop(ls, keys, workers, after(time.Second))
		wDenied, wErrs = wDenied+d2, wErrs+e2
		steady := (sumRT(hooks)-rt0)*100 <= n
		if since := time.Since(warmStart); since >= maxWarmup || steady && since >= warmup {
			t.Logf("warmed up in %v, steady: %v", since.Round(time.Millisecond), steady)
			break
		}
	}
	warmRT := sumRT(hooks)

	// The same fleet shape deciding by per-request Redis: a global
	// limiter per worker, so that no two decisions share a round trip (a
	// global limiter's concurrent FixedWindow decisions share them); and,
	// for the record, one global limiter per instance, its workers'
	// decisions sharing round trips.
	var gs, gShared []ratelimit.Limiter
	for i := 0; i < instances; i++ {
		c := srv.Client()
		t.Cleanup(func() { c.Close() })
		for w := 0; w <= workers; w++ {
			g, err := global.New(c, limit, global.WithPrefix(prefix+"g"), global.WithAlgorithm(ratelimit.FixedWindow))
			require.NoError(t, err)
			if w == workers {
				gShared = append(gShared, g)
			} else {
				gs = append(gs, g)
			}
		}
	}
	rate := func(ls []ratelimit.Limiter, workers int, d time.Duration) (n, dn, e int64, perSec float64) {
		start := time.Now()
		n, dn, e = closedLoop(ls, keys, workers, after(d))
		return n, dn, e, float64(n) / time.Since(start).Seconds()
	}
	rt0, s0 := sumRT(hooks), sumStats(hs)
	decisions, denied, errs, hybridRate := rate(ls, workers, 3*time.Second)
	rt, s1 := sumRT(hooks)-rt0, sumStats(hs)
	waited := (s1.Decisions - s1.LocalDecisions) - (s0.Decisions - s0.LocalDecisions)
	gDecisions, gDenied, gErrs, globalRate := rate(gs, 1, 1500*time.Millisecond)
	sDecisions, sDenied, sErrs, sharedRate := rate(gShared, workers, 1500*time.Millisecond)

	s := sumStats(hs)
	t.Logf("warm-up: denied %d errors %d, %d round trips; no reply in time %d, fallback %d", wDenied, wErrs, warmRT, s.NoReply, s.Fallback)
	t.Logf("hybrid: %d decisions (%.0f/s), denied %d, errors %d, %d round trips (%.2f per 1,000 decisions), %d decisions waited on Redis (%.2f per 1,000); sync round trips since New %d",
		decisions, hybridRate, denied, errs, rt, 1000*float64(rt)/float64(decisions), waited, 1000*float64(waited)/float64(decisions), s.SyncRoundTrips)
	t.Logf("global, per request: %d decisions (%.0f/s), denied %d, errors %d; hybrid / global = %.1fx",
		gDecisions, globalRate, gDenied, gErrs, hybridRate/globalRate)
	t.Logf("global, one limiter per instance (shared round trips): %d decisions (%.0f/s); hybrid / that = %.1fx",
		sDecisions, sharedRate, hybridRate/sharedRate)
	require.Zero(t, errs+wErrs+gErrs+sErrs)
	require.Zero(t, denied+wDenied, "every key is far under its limit")
	require.Zero(t, gDenied+sDenied)
	require.LessOrEqual(t, rt*100, decisions, "at most one round trip per 100 decisions")
}

// The window roll costs no waiting: a key used steadily in one window makes
// its first decisions of the next with quota already in hand.
func TestWindowRollNoWait(t *testing.T) {
	srv := redistest.Standalone(t)
	for _, alg := range []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingWindow} {
		t.Run(alg.String(), func(t *testing.T) {
			c, hk := hooked(t, srv)
			limit := ratelimit.Limit{Rate: 1000, Period: time.Second}
			h, err := hybrid.New(c, limit, hybrid.WithPrefix(uniq(t)), hybrid.WithAlgorithm(alg), hybrid.WithTimeout(time.Second))
			require.NoError(t, err)
			defer h.Close()
			ctx := context.Background()
			// Use the key steadily (about 200/s, far under the limit) for a
			// whole window and into the next; find the first decision of
			// each window by its ResetAfter jumping up.
			idx, left := serverWindow(t, c, limit.Period)
			time.Sleep(left + 20*time.Millisecond) // the start of window idx+1
			var rolls, checked int
			prevReset := time.Duration(-1)
			deadline := time.Now().Add(3500 * time.Millisecond)
			for time.Now().Before(deadline) && rolls < 2 {
				before := hk.Single()
				d, err := h.Allow(ctx, "steady")
				require.NoError(t, err)
				require.True(t, d.Allowed)
				if prevReset >= 0 && d.ResetAfter > prevReset+limit.Period/2 {
					// The first decision of a new window, after a whole
					// window of steady use.
					rolls++
					require.Equal(t, before, hk.Single(), "the first decision of window %d waited on a synchronous round trip", rolls)
					// and the next few of that window too
					for i := 0; i < 10; i++ {
						b := hk.Single()
						d, err := h.Allow(ctx, "steady")
						require.NoError(t, err)
						require.True(t, d.Allowed)
						require.Equal(t, b, hk.Single(), "decision %d of the new window waited on Redis", i+1)
						checked++
					}
				}
				prevReset = d.ResetAfter
				time.Sleep(5 * time.Millisecond)
			}
			require.Equal(t, 2, rolls, "the run must cross two window boundaries (from window %d)", idx)
			t.Logf("%v: %d rolls, %d decisions after them checked; stats %+v", alg, rolls, checked, h.Stats())
		})
	}
}

// A busy host on default options: 8 instances of 4 goroutines in one
// process (2 cores here), 16 keys far over the limit for at least 5
// windows. No key-window may go over the limit, every full window must be
// at least 95% used, and the fleet makes at most one round trip per 50
// admitted. About 4 million decisions in 6.5s: it runs without the race
// detector, in scripts/test.sh's pass of its own (under it, the in-memory
// path ten times slower against the same Redis, a stall near a window's
// end left 1,879-1,934 of 2,000 used in some runs, at b9ee0aa as since;
// without it 1,977-2,000).
func TestBusyHostDefaults(t *testing.T) {
	skipUnderRace(t)
	srv := redistest.Standalone(t)
	limit := ratelimit.PerSecond(2000)
	const instances, workers = 8, 4
	prefix := uniq(t)
	var hooks []*rtcount.Hook
	var ls []ratelimit.Limiter
	var hs []*hybrid.Limiter
	for i := 0; i < instances; i++ {
		c, hk := hooked(t, srv)
		h, err := hybrid.New(c, limit, hybrid.WithPrefix(prefix)) // defaults but the prefix
		require.NoError(t, err)
		t.Cleanup(func() { h.Close() })
		hooks, hs, ls = append(hooks, hk), append(hs, h), append(ls, h)
	}
	keys := make([]string, 16)
	for i := range keys {
		keys[i] = "hot-" + strconv.Itoa(i)
	}
	tl := newTally(limit.Period)
	from := time.Now()
	allowed, denied := hammer(t, ls, keys, workers, 6500*time.Millisecond, tl)
	to := time.Now()
	rt := sumRT(hooks)
	s := sumStats(hs)
	var over []string
	minFull := limit.Rate
	for _, k := range keys {
		full, all := tl.windows(k, from, to)
		for idx, n := range all {
			if n > limit.Rate {
				over = append(over, fmt.Sprintf("%s/%d: %d", k, idx, n))
			}
		}
		require.GreaterOrEqual(t, len(full), 5, "the run must span 5 full windows")
		for _, n := range full {
			minFull = min(minFull, n)
		}
	}
	t.Logf("allowed %d denied %d; round trips %d (1 per %.0f admitted); least used full window %d of %d; fallback %d, sync round trips %d",
		allowed, denied, rt, float64(allowed)/float64(rt), minFull, limit.Rate, s.Fallback, s.SyncRoundTrips)
	require.Empty(t, over, "key-windows over the limit")
	require.GreaterOrEqual(t, minFull, limit.Rate*95/100, "every full window at least 95%% used")
	require.LessOrEqual(t, rt*50, allowed, "at most one round trip per 50 admitted")
}

// keyMemory returns the memory Redis uses for keys: used_memory less what
// client connections' buffers and the Lua engine hold, which depend on how
// many clients are connected and which scripts ran, not on the keys.
func keyMemory(t *testing.T, c redis.UniversalClient) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "memory").Result()
	require.NoError(t, err)
	f := map[string]int64{}
	for _, line := range strings.Split(info, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				f[k] = n
			}
		}
	}
	require.Contains(t, f, "used_memory")
	return f["used_memory"] - f["mem_clients_normal"] - f["used_memory_vm_eval"] - f["used_memory_scripts_eval"]
}

// Redis memory per user key: 8 hybrid instances using every one of 5,000
// keys cost at most 1.5x what a global FixedWindow limiter costs on the
// same keys.
func TestRedisMemoryPerKey(t *testing.T) {
	skipUnderRace(t)
	const nkeys, instances = 5000, 8
	// An hour's window: the measurement never meets a window's end.
	limit := ratelimit.PerHour(1_000_000)
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("user-%05d", i)
	}
	ctx := context.Background()
	// Each measurement fills a fresh server through clients of its own,
	// closes them (their connections' buffers are not the keys'), and
	// counts two ways: MEMORY USAGE summed over every key (what the keys
	// hold), and used_memory's growth (which adds the server's tables).
	measure := func(name string, fill func(c *redis.Client) (done func())) (usage, grown float64) {
		srv := redistest.Standalone(t)
		c := srv.Client()
		defer c.Close()
		freshWindow(t, c, limit.Period, 30*time.Second)
		before := keyMemory(t, c)
		fc := srv.Client()
		done := fill(fc)
		require.NoError(t, fc.Close())
		time.Sleep(50 * time.Millisecond) // the server frees the closed connections
		grown = float64(keyMemory(t, c)-before) / nkeys
		var total, n int64
		iter := c.Scan(ctx, 0, "*", 1000).Iterator()
		for iter.Next(ctx) {
			u, err := c.MemoryUsage(ctx, iter.Val(), 0).Result()
			require.NoError(t, err)
			total += u
			n++
		}
		require.NoError(t, iter.Err())
		done()
		per := float64(total) / nkeys
		t.Logf("%s: MEMORY USAGE %.0f B per user key, used_memory %.0f B per user key (%d Redis keys for %d user keys)", name, per, grown, n, nkeys)
		return per, grown
	}
	gu, gg := measure("global FixedWindow", func(c *redis.Client) func() {
		l, err := global.New(c, limit, global.WithAlgorithm(ratelimit.FixedWindow))
		require.NoError(t, err)
		denied, errs := touchAll([]ratelimit.Limiter{l}, keys)
		require.Zero(t, denied+errs)
		return func() {}
	})
	hu, hg := measure(fmt.Sprintf("hybrid, %d instances", instances), func(c *redis.Client) func() {
		var hs []*hybrid.Limiter
		var ls []ratelimit.Limiter
		for i := 0; i < instances; i++ {
			h, err := hybrid.New(c, limit, hybrid.WithAlgorithm(ratelimit.FixedWindow))
			require.NoError(t, err)
			hs, ls = append(hs, h), append(ls, h)
		}
		denied, errs := touchAll(ls, keys)
		require.Zero(t, denied+errs)
		time.Sleep(3 * hybrid.DefaultSyncInterval) // background calls of the last decisions land
		return func() {
			for _, h := range hs {
				h.Close()
			}
		}
	})
	t.Logf("hybrid / global: MEMORY USAGE %.2fx, used_memory %.2fx", hu/gu, hg/gg)
	require.LessOrEqual(t, hu, 1.5*gu, "hybrid memory per user key at most 1.5x global's (MEMORY USAGE)")
	require.LessOrEqual(t, hg, 1.5*gg, "hybrid memory per user key at most 1.5x global's (used_memory)")
}

// Small limits use their quota: 3,000 keys at 1 and at 2 per second,
// driven far past them by 4 instances on default options. No key-window
// goes over its limit, and at least 97% of the full key-windows reach it:
// quota one instance holds is not lost to the others (a share too small
// to lease is counted exactly, decision by decision).
func TestSmallLimitsReachQuota(t *testing.T) {
	srv := redistest.Standalone(t)
	smallLimits(t, srv, ratelimit.FixedWindow)
}

func smallLimits(t *testing.T, srv *redistest.Server, alg ratelimit.Algorithm) {
	for _, rate := range []int{1, 2} {
		t.Run(strconv.Itoa(rate), func(t *testing.T) {
			limit := ratelimit.PerSecond(rate)
			prefix := uniq(t)
			var ls []ratelimit.Limiter
			var hs []*hybrid.Limiter
			for i := 0; i < 4; i++ {
				h, err := hybrid.New(srv.Client(), limit, hybrid.WithPrefix(prefix), hybrid.WithAlgorithm(alg))
				require.NoError(t, err)
				t.Cleanup(func() { h.Close() })
				hs, ls = append(hs, h), append(ls, h)
			}
			keys := make([]string, 3000)
			for i := range keys {
				keys[i] = "small-" + strconv.Itoa(i)
			}
			tl, tries, driven := newTally(limit.Period), newTally(limit.Period), rate+1
			if alg == ratelimit.SlidingWindow {
				// Driven past the limit: asked rate times late enough in
				// the window to reach it whatever the previous window
				// holds (see newLateTally).
				tries, driven = newLateTally(limit.Period, limit.Period/time.Duration(rate)), rate
			}
			from := time.Now()
			allowed, denied := hammerRandom(t, ls, keys, 8, 4500*time.Millisecond, tl, tries)
			to := time.Now()
			over, full, past, reached := quotaDriven(tl, tries, keys, rate, driven, from, to)
			s := sumStats(hs)
			t.Logf("limit %d/s: allowed %d denied %d; of %d full key-windows, %d driven past the limit, %d of them at the limit (%.1f%%); exact decisions %d, leases %d",
				rate, allowed, denied, full, past, reached, 100*float64(reached)/float64(max(1, past)), s.ExactDecisions, s.Leases)
			require.Empty(t, over, "key-windows over the limit")
			require.GreaterOrEqual(t, full, 3*len(keys), "the run must span 3 full windows")
			require.Positive(t, past)
			require.GreaterOrEqual(t, float64(reached), 0.97*float64(past), "key-windows driven past the limit reach it")
		})
	}
}

// Cold keys counted by plain increments (HINCRBY of the window's counter)
// share one quota with global limiters on the same keys: a global.Limiter
// counts in the same hash field; a counter a global.Multi created is a
// string, the increment meets WRONGTYPE and take.lua counts instead, in
// the same exchange. 2,000 keys at 2 per second, two hybrid instances, a
// global Limiter and a global Multi driving them far past it: no
// key-window over, at least 97% of them at the limit, and both the plain
// increment and its fallback used.
func TestColdKeysMixedFleet(t *testing.T) {
	srv := redistest.Standalone(t)
	limit := ratelimit.PerSecond(2)
	ls, hs := mixedFleet(t, srv, limit, true)
	keys := numberedKeys("mixed-", 2000)
	rc := srv.Client()
	defer rc.Close()
	require.NoError(t, rc.ConfigResetStat(context.Background()).Err())
	tl, tries := newTally(limit.Period), newTally(limit.Period)
	from := time.Now()
	allowed, denied := hammerRandom(t, ls, keys, 6, 3500*time.Millisecond, tl, tries)
	to := time.Now()
	over, full, past, reached := quota(tl, tries, keys, 2, from, to)
	stats := commandStats(t, rc)
	s := sumStats(hs)
	t.Logf("allowed %d denied %d; of %d full key-windows, %d driven past the limit, %d of them at the limit (%.1f%%); hybrid exact decisions %d; HINCRBY %d (%d met a string), PEXPIREAT %d",
		allowed, denied, full, past, reached, 100*float64(reached)/float64(max(1, past)), s.ExactDecisions, stats["hincrby"][0], stats["hincrby"][1], stats["pexpireat"][0])
	require.Empty(t, over, "key-windows over the limit")
	require.GreaterOrEqual(t, full, 2*len(keys), "the run must span 2 full windows")
	require.Positive(t, past)
	require.GreaterOrEqual(t, float64(reached), 0.97*float64(past), "key-windows driven past the limit reach it")
	require.Positive(t, stats["pexpireat"][0], "plain increments were sent")
	require.Positive(t, stats["hincrby"][1], "plain increments met counters the global Multi wrote (WRONGTYPE), counted by take.lua")
}

// mixedFleet returns two hybrid instances with defaults but a prefix of
// the test's own and, with globals, beside them a global FixedWindow
// Limiter and a global Multi on the same prefix (the Multi's counters are
// strings, which a hybrid's plain increment meets as WRONGTYPE): ls holds
// every limiter, hs the hybrid ones. Cleanup closes the hybrid instances.
func mixedFleet(t *testing.T, srv *redistest.Server, limit ratelimit.Limit, globals bool) (ls []ratelimit.Limiter, hs []*hybrid.Limiter) {
	t.Helper()
	return mixedFleetOf(t, srv, ratelimit.FixedWindow, limit, globals)
}

// mixedFleetOf is mixedFleet for algorithm alg.
func mixedFleetOf(t *testing.T, srv *redistest.Server, alg ratelimit.Algorithm, limit ratelimit.Limit, globals bool) (ls []ratelimit.Limiter, hs []*hybrid.Limiter) {
	t.Helper()
	prefix := uniq(t)
	for i := 0; i < 2; i++ {
		h, err := hybrid.New(srv.Client(), limit, hybrid.WithPrefix(prefix), hybrid.WithAlgorithm(alg))
		require.NoError(t, err)
		t.Cleanup(func() { h.Close() })
		hs, ls = append(hs, h), append(ls, h)
		if !globals {
			continue
		}
		var g ratelimit.Limiter
		if i == 0 {
			g, err = global.New(srv.Client(), limit, global.WithPrefix(prefix), global.WithAlgorithm(alg))
		} else {
			g, err = global.NewMulti(srv.Client(), []ratelimit.Limit{limit}, global.WithPrefix(prefix), global.WithAlgorithm(alg))
		}
		require.NoError(t, err)
		ls = append(ls, g)
	}
	return ls, hs
}

// numberedKeys returns n keys: prefix followed by 0 to n-1.
func numberedKeys(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = prefix + strconv.Itoa(i)
	}
	return keys
}

// commandStats returns INFO commandstats: calls and failed calls by
// command.
func commandStats(t *testing.T, c *redis.Client) map[string][2]int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	return parseCommandStats(info)
}

// parseCommandStats reads INFO commandstats: calls and failed calls by
// command.
func parseCommandStats(info string) map[string][2]int64 {
	out := map[string][2]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var v [2]int64
		for _, f := range strings.Split(rest, ",") {
			k, val, _ := strings.Cut(f, "=")
			n, _ := strconv.ParseInt(val, 10, 64)
			switch k {
			case "calls":
				v[0] = n
			case "failed_calls":
				v[1] = n
			}
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = v
	}
	return out
}

// hammerRandom is hammer with each worker choosing keys uniformly at
// random, so that every key is offered about as often in every window.
// tries, when not nil, tallies every decision, denied ones too (a denial's
// ResetAfter is its window's end as well).
func hammerRandom(t *testing.T, lims []ratelimit.Limiter, keys []string, workers int, d time.Duration, tl, tries *tally) (allowed, denied int64) {
	t.Helper()
	var a, dn atomic.Int64
	randomDecisions(t, lims, keys, workers, d, func(key string, dec ratelimit.Decision, start time.Time) {
		if tries != nil {
			tries.add(key, dec, 1, start)
		}
		if dec.Allowed {
			a.Add(1)
			tl.add(key, dec, 1, start)
		} else {
			dn.Add(1)
		}
	})
	return a.Load(), dn.Load()
}

// randomDecisions runs workers goroutines per limiter, each deciding one
// unit of a key chosen uniformly at random (xorshift, a seed per worker)
// until d has passed, and calls each with every decision and when its call
// began. An error fails the test and ends its worker.
func randomDecisions(t *testing.T, lims []ratelimit.Limiter, keys []string, workers int, d time.Duration, each func(key string, dec ratelimit.Decision, start time.Time)) {
	t.Helper()
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for li, l := range lims {
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(l ratelimit.Limiter, x uint64) {
				defer wg.Done()
				for time.Now().Before(stop) {
					x ^= x << 13 // xorshift64
					x ^= x >> 7
					x ^= x << 17
					key := keys[x%uint64(len(keys))]
					start := time.Now()
					dec, err := l.AllowN(context.Background(), key, 1)
					if err != nil {
						t.Errorf("AllowN: %v", err)
						return
					}
					each(key, dec, start)
				}
			}(l, uint64(li*workers+w+1)*0x9E3779B97F4A7C15)
		}
	}
	wg.Wait()
}

// On a Cluster, cold keys' exact calls go to each key's master in a
// pipeline of that node's own: 300 keys at 5 per second, driven past the
// limit by 4 instances, never go over it in any window and reach it in at
// least 97% of them, every decision of a key's first uses counted
// exactly.
func TestColdKeysCluster(t *testing.T) {
	cl := redistest.NewCluster(t)
	limit := ratelimit.PerSecond(5)
	prefix := uniq(t)
	var ls []ratelimit.Limiter
	var hs []*hybrid.Limiter
	for i := 0; i < 4; i++ {
		h, err := hybrid.New(cl.Client(), limit, hybrid.WithPrefix(prefix))
		require.NoError(t, err)
		t.Cleanup(func() { h.Close() })
		hs, ls = append(hs, h), append(ls, h)
	}
	keys := make([]string, 300)
	for i := range keys {
		keys[i] = "cold-" + strconv.Itoa(i)
	}
	tl, tries := newTally(limit.Period), newTally(limit.Period)
	from := time.Now()
	allowed, denied := hammerRandom(t, ls, keys, 8, 3500*time.Millisecond, tl, tries)
	to := time.Now()
	over, full, past, reached := quota(tl, tries, keys, limit.Rate, from, to)
	s := sumStats(hs)
	t.Logf("allowed %d denied %d; of %d full key-windows, %d driven past the limit, %d of them at the limit; exact decisions %d, leases %d; node queues %d",
		allowed, denied, full, past, reached, s.ExactDecisions, s.Leases, hybrid.NodeQueues(hs[0]))
	require.Empty(t, over, "key-windows over the limit")
	require.Positive(t, past)
	require.GreaterOrEqual(t, float64(reached), 0.97*float64(past), "key-windows driven past the limit reach it")
	require.Positive(t, s.ExactDecisions)
	require.Equal(t, 3, hybrid.NodeQueues(hs[0]), "one queue per master")
}

// The other algorithms' cold paths on a Cluster: SlidingWindow's plain
// sliding calls (four commands on the key's windows, one hash slot) and
// the buckets' exact calls each go to the key's master in a pipeline of
// that node's own. 300 keys, 4 instances on defaults driving them far
// past the limit:
//   - SlidingWindow at 2 per second: no fixed window over the limit (a
//     sliding window's current count alone is bounded by it), at least
//     97% of the key-windows asked twice in their second half (see
//     newLateTally) reach it, and plain sliding calls were made (HMGET on
//     the masters);
//   - TokenBucket and GCRA at 5 per second, burst 5 (a share too small to
//     lease: every decision an exact call): at each admission a key has
//     admitted at most Burst + Rate x elapsed since the run began, with
//     the bucket full, and in all at least 90% of that (without the race
//     detector: see below).
func TestColdKeysClusterAlgorithms(t *testing.T) {
	cl := redistest.NewCluster(t)
	keys := numberedKeys("cold-", 300)
	const d = 3500 * time.Millisecond
	for _, alg := range []ratelimit.Algorithm{ratelimit.SlidingWindow, ratelimit.TokenBucket, ratelimit.GCRA} {
		t.Run(alg.String(), func(t *testing.T) {
			limit := ratelimit.Limit{Rate: 5, Period: time.Second, Burst: 5}
			if alg == ratelimit.SlidingWindow {
				limit = ratelimit.PerSecond(2)
			}
			prefix := uniq(t)
			var ls []ratelimit.Limiter
			var hs []*hybrid.Limiter
			for i := 0; i < 4; i++ {
				h, err := hybrid.New(cl.Client(), limit, hybrid.WithPrefix(prefix), hybrid.WithAlgorithm(alg))
				require.NoError(t, err)
				t.Cleanup(func() { h.Close() })
				hs, ls = append(hs, h), append(ls, h)
			}
			if alg == ratelimit.SlidingWindow {
				tl, tries := newTally(limit.Period), newLateTally(limit.Period, limit.Period/2)
				from := time.Now()
				allowed, denied := hammerRandom(t, ls, keys, 8, d, tl, tries)
				over, full, past, reached := quotaDriven(tl, tries, keys, limit.Rate, limit.Rate, from, time.Now())
				s := sumStats(hs)
				t.Logf("allowed %d denied %d; of %d full key-windows, %d driven past the limit, %d of them at the limit; exact decisions %d, leases %d",
					allowed, denied, full, past, reached, s.ExactDecisions, s.Leases)
				require.Empty(t, over, "key-windows over the limit")
				require.Positive(t, past)
				require.GreaterOrEqual(t, float64(reached), 0.97*float64(past), "key-windows driven past the limit reach it")
				var hmget atomic.Int64
				require.NoError(t, cl.Client().ForEachMaster(context.Background(), func(ctx context.Context, c *redis.Client) error {
					info, err := c.Info(ctx, "commandstats").Result()
					hmget.Add(parseCommandStats(info)["hmget"][0])
					return err
				}))
				require.Positive(t, hmget.Load(), "plain sliding calls were sent")
			} else {
				at := hammerTimes(t, ls, keys, 8, d)
				allow := func(e time.Duration) float64 {
					return float64(limit.Burst) + float64(limit.Rate)*e.Seconds()/limit.Period.Seconds()
				}
				admitted := 0
				for k, ts := range at {
					for i, e := range ts {
						require.LessOrEqual(t, float64(i+1), allow(e), "key %s, admission %d at %v: over Burst + Rate x elapsed", k, i+1, e)
					}
					admitted += len(ts)
				}
				total := allow(d) * float64(len(keys)) // (no call starts after d)
				s := sumStats(hs)
				t.Logf("admitted %d of an allowance of %.0f (%.1f%%); exact decisions %d, leases %d",
					admitted, total, 100*float64(admitted)/total, s.ExactDecisions, s.Leases)
				// How much of the allowance is used depends on how fast
				// the keys are asked: the race detector slows the driver
				// threefold (10-23k decisions in the run against 31-34k),
				// and used 89-96% of it against 97.7-97.8% without. The
				// bound is asserted without the detector, in
				// scripts/test.sh's pass of its own; the admissions'
				// bound above, always.
				if !raceEnabled {
					require.GreaterOrEqual(t, float64(admitted), 0.9*total, "at least 90%% of the allowance used")
				}
			}
			require.Positive(t, sumStats(hs).ExactDecisions)
			require.Equal(t, 3, hybrid.NodeQueues(hs[0]), "one queue per master")
		})
	}
}

// hammerTimes runs workers goroutines per limiter, each calling AllowN on
// keys at random until d has passed, and returns when each key's units
// were admitted (as time since the run began, at the call's return: never
// before Redis counted it), sorted.
func hammerTimes(t *testing.T, lims []ratelimit.Limiter, keys []string, workers int, d time.Duration) (at map[string][]time.Duration) {
	t.Helper()
	var mu sync.Mutex
	at = map[string][]time.Duration{}
	begun := time.Now()
	randomDecisions(t, lims, keys, workers, d, func(key string, dec ratelimit.Decision, _ time.Time) {
		if dec.Allowed {
			e := time.Since(begun)
			mu.Lock()
			at[key] = append(at[key], e)
			mu.Unlock()
		}
	})
	for _, ts := range at {
		sort.Slice(ts, func(i, j int) bool { return ts[i] < ts[j] })
	}
	return at
}

// quota reads what the fleet admitted of keys (tl) against what it was
// asked (tries) per window: the key-windows over the limit, how many full
// key-windows there were in [from, to], how many of them were driven past
// the limit (asked more than it), and how many of those reached it.
func quota(tl, tries *tally, keys []string, rate int, from, to time.Time) (over []string, full, past, reached int) {
	return quotaDriven(tl, tries, keys, rate, rate+1, from, to)
}

// quotaDriven is quota where a key-window counts as driven past the limit
// when tries holds at least driven of its calls (a late tally: see
// newLateTally).
func quotaDriven(tl, tries *tally, keys []string, rate, driven int, from, to time.Time) (over []string, full, past, reached int) {
	for _, k := range keys {
		f, all := tl.windows(k, from, to)
		for idx, n := range all {
			if n > rate {
				over = append(over, fmt.Sprintf("%s/%d: %d", k, idx, n))
			}
		}
		asked, _ := tries.windows(k, from, to)
		for idx := range asked {
			full++
			if asked[idx] >= driven {
				past++
				if f[idx] == rate {
					reached++
				}
			}
		}
	}
	return over, full, past, reached
}

// Leases of FixedWindow keys far from their limit are plain increments of
// the window's counter (see makePlain), not lease.lua calls; near the
// limit lease.lua leases. Two hybrid instances and, beside them, a global
// Limiter and a global Multi (whose counters are strings: a plain
// increment meets WRONGTYPE and lease.lua leases instead, in the same
// exchange), on keys at random:
//   - far from the limit (a million per second, 200 keys): no denial, and
//     most of the hybrid instances' leases made without lease.lua when
//     they are alone; plain calls that met the Multi's strings fell back;
//   - driven past a limit of 100 per second (50 keys): no key-window over,
//     at least 97% of them at the limit.
//
// The near case asks each key many times its limit per window even on a
// slow host (at least 3,500 a window beside two busy loops under -race).
// On 200 keys such a host asked some windows only 101 to 150 times, where
// a lease's last units, a forecast of its holder's next moments, may
// expire unused: that case is measured in docs/tuning.md ("Windows just
// past the limit"), not asserted.
func TestPlainLeasesShareQuota(t *testing.T) {
	srv := redistest.Standalone(t)
	plainLeasesShareQuota(t, srv, ratelimit.FixedWindow)
}

func plainLeasesShareQuota(t *testing.T, srv *redistest.Server, alg ratelimit.Algorithm) {
	for _, c := range []struct {
		name  string
		rate  int
		mixed bool
		keys  int
	}{{"far", 1_000_000, false, 200}, {"far-mixed", 1_000_000, true, 200}, {"near-mixed", 100, true, 50}} {
		t.Run(c.name, func(t *testing.T) {
			limit := ratelimit.PerSecond(c.rate)
			ls, hs := mixedFleetOf(t, srv, alg, limit, c.mixed)
			keys := numberedKeys("plain-", c.keys)
			rc := srv.Client()
			defer rc.Close()
			require.NoError(t, rc.ConfigResetStat(context.Background()).Err())
			tl, tries := newTally(limit.Period), newTally(limit.Period)
			from := time.Now()
			allowed, denied := hammerRandom(t, ls, keys, 6, 3500*time.Millisecond, tl, tries)
			to := time.Now()
			over, full, past, reached := quota(tl, tries, keys, c.rate, from, to)
			stats := commandStats(t, rc)
			s := sumStats(hs)
			t.Logf("allowed %d denied %d; of %d full key-windows, %d driven past the limit, %d of them at the limit; hybrid leases %d, exact decisions %d; EVALSHA %d, HINCRBY %d (%d met a string)",
				allowed, denied, full, past, reached, s.Leases, s.ExactDecisions, stats["evalsha"][0], stats["hincrby"][0], stats["hincrby"][1])
			require.Empty(t, over, "key-windows over the limit")
			require.GreaterOrEqual(t, full, 2*len(keys), "the run must span 2 full windows")
			if c.rate == 100 {
				require.Positive(t, past)
				if alg == ratelimit.SlidingWindow {
					// A SlidingWindow key's count can reach a limit of 100
					// only in its window's last hundredth, where the
					// previous window's weight, floor(100 x (P - e) / P),
					// has decayed to 0: whether an ask lands there is the
					// algorithm's and the host's timing (96 of 100 under
					// -race on a busy host), not the limiter's. Where that
					// stretch is half the window (limits 1 and 2),
					// TestSmallSlidingLimitsReachQuota asserts it.
					return
				}
				require.GreaterOrEqual(t, float64(reached), 0.97*float64(past), "key-windows driven past the limit reach it")
				return
			}
			require.Zero(t, denied)
			require.Greater(t, s.Leases, uint64(2*len(keys)), "the keys lease")
			switch {
			case c.mixed:
				require.Positive(t, stats["hincrby"][1], "plain calls met counters the global Multi wrote (WRONGTYPE)")
			case alg == ratelimit.SlidingWindow:
				// A SlidingWindow lease gives back what it left unused at
				// its window's end, and the key's next lease carries that
				// refund through lease.lua: only leases that carry none
				// are plain (the first of a key, those ahead of a window).
				require.Positive(t, stats["hmget"][0], "plain sliding leases were sent")
				require.Less(t, stats["evalsha"][0], int64(s.Leases), "some leases are plain increments")
			default:
				require.Less(t, stats["evalsha"][0], int64(s.Leases/2), "most leases are plain increments")
			}
		})
	}
}
