package hybrid_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/faultproxy"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// overload: a fleet far above the limit never admits more than Rate per key
// and window, uses at least 95% of every full window, and makes at most one
// Redis round trip per 10 allowed decisions.
func testStrictOverload(t *testing.T, newClient func() redis.UniversalClient) {
	limit := ratelimit.Limit{Rate: 1000, Period: time.Second}
	prefix := uniq(t)
	// A 1s timeout: the guarantee holds while Redis answers in time, and
	// this 2-core machine is starved by the hammering goroutines.
	hs, ls := fleet(t, 4, newClient, limit, hybrid.WithPrefix(prefix), hybrid.WithInstances(4), hybrid.WithTimeout(time.Second))
	keys := []string{"alpha", "beta", "gamma"}
	tl := newTally(limit.Period)
	from := time.Now()
	allowed, denied := hammer(t, ls, keys, 4, 3500*time.Millisecond, tl)
	to := time.Now()
	require.Positive(t, denied, "the fleet must be driven far above the limit")

	for _, k := range keys {
		full, all := tl.windows(k, from, to)
		t.Logf("key %s windows %v", k, all)
		for idx, n := range all {
			require.LessOrEqual(t, n, limit.Rate, "key %s window %d: the fleet admitted more than the limit", k, idx)
		}
		require.GreaterOrEqual(t, len(full), 2, "the run must span full windows")
		for idx, n := range full {
			require.GreaterOrEqual(t, n, limit.Rate*95/100, "key %s window %d: full window used %d of %d", k, idx, n, limit.Rate)
		}
	}
	s := sumStats(hs)
	require.Zero(t, s.Fallback, "Redis answered every call: no decision may come from the failure mode")
	require.EqualValues(t, allowed, s.Allowed)
	require.LessOrEqual(t, s.RoundTrips*10, s.Allowed, "round trips %d for %d allowed", s.RoundTrips, s.Allowed)
	t.Logf("allowed %d denied %d round trips %d (1 per %.0f allowed), sync round trips %d, fallback %d",
		allowed, denied, s.RoundTrips, float64(s.Allowed)/float64(s.RoundTrips), s.SyncRoundTrips, s.Fallback)
}

func TestStrictOverloadStandalone(t *testing.T) {
	srv := redistest.Standalone(t)
	testStrictOverload(t, func() redis.UniversalClient { return srv.Client() })
}

func TestStrictOverloadCluster(t *testing.T) {
	cl := redistest.NewCluster(t)
	testStrictOverload(t, func() redis.UniversalClient { return cl.Client() })
}

// under the limit: a fleet offered 70% of the limit, evenly paced, is
// almost never denied and rarely waits on Redis.
func TestStrictUnderLimit(t *testing.T) {
	srv := redistest.Standalone(t)
	limit := ratelimit.Limit{Rate: 2000, Period: time.Second}
	const instances = 4
	hs, ls := fleet(t, instances, func() redis.UniversalClient { return srv.Client() }, limit,
		hybrid.WithPrefix(uniq(t)), hybrid.WithInstances(instances))
	keys := []string{"k1", "k2"}
	// 70% of the limit per key, spread evenly over the instances.
	perInstance := float64(limit.Rate) * 0.7 / instances
	interval := time.Duration(float64(time.Second) / perInstance)
	const run = 3 * time.Second
	var wg sync.WaitGroup
	var mu sync.Mutex
	var allowed, denied int
	for _, l := range ls {
		for _, k := range keys {
			wg.Add(1)
			go func(l ratelimit.Limiter, k string) {
				defer wg.Done()
				start := time.Now()
				a, d := 0, 0
				for i := 0; ; i++ {
					at := start.Add(time.Duration(i) * interval)
					if at.Sub(start) >= run {
						break
					}
					time.Sleep(time.Until(at))
					dec, err := l.AllowN(context.Background(), k, 1)
					if err != nil {
						t.Errorf("Allow: %v", err)
						return
					}
					if dec.Allowed {
						a++
					} else {
						d++
					}
				}
				mu.Lock()
				allowed += a
				denied += d
				mu.Unlock()
			}(l, k)
		}
	}
	wg.Wait()
	total := allowed + denied
	s := sumStats(hs)
	t.Logf("decisions %d denied %d (%.3f%%) round trips %d (1 per %.0f decisions), sync %d, fallback %d",
		total, denied, 100*float64(denied)/float64(total), s.RoundTrips, float64(total)/float64(s.RoundTrips), s.SyncRoundTrips, s.Fallback)
	require.LessOrEqual(t, float64(denied), 0.005*float64(total), "denied %d of %d", denied, total)
	require.LessOrEqual(t, s.RoundTrips*20, uint64(total), "round trips %d for %d decisions", s.RoundTrips, total)
}

// Close gives the unused lease back: an instance that used 100 of a fresh
// window's 1000 leaves exactly 900 for the others.
func TestCloseReturnsLease(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	limit := ratelimit.Limit{Rate: 1000, Period: 20 * time.Second}
	prefix := uniq(t)
	idx := freshWindow(t, c, limit.Period, 10*time.Second)

	h, err := hybrid.New(c, limit, hybrid.WithPrefix(prefix))
	require.NoError(t, err)
	for i := 0; i < 100; i++ {
		d, err := h.Allow(context.Background(), "user")
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	require.Greater(t, redisCount(t, c, prefix, "user", idx), 100, "the instance must hold a lease beyond what it used")
	require.NoError(t, h.Close())
	require.NoError(t, h.Close(), "Close is idempotent")
	_, err = h.Allow(context.Background(), "user")
	require.ErrorIs(t, err, ratelimit.ErrClosed)
	require.Equal(t, 100, redisCount(t, c, prefix, "user", idx))

	other, err := global.New(c, limit, global.WithPrefix(prefix), global.WithAlgorithm(ratelimit.FixedWindow))
	require.NoError(t, err)
	n := 0
	for {
		d, err := other.Allow(context.Background(), "user")
		require.NoError(t, err)
		if !d.Allowed {
			break
		}
		n++
	}
	require.Equal(t, 900, n)
}

// Eviction gives the lease back too: with a tiny key table and many keys,
// after Flush the counts in Redis are exactly what was allowed.
func TestEvictionReturnsLease(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	limit := ratelimit.Limit{Rate: 500, Period: 20 * time.Second}
	prefix := uniq(t)
	idx := freshWindow(t, c, limit.Period, 10*time.Second)
	h, err := hybrid.New(c, limit, hybrid.WithPrefix(prefix), hybrid.WithMaxKeys(4), hybrid.WithSyncInterval(20*time.Millisecond))
	require.NoError(t, err)
	defer h.Close()
	allowed := map[string]int{}
	for round := 0; round < 3; round++ {
		for k := 0; k < 40; k++ {
			key := fmt.Sprintf("key-%d", k)
			for i := 0; i < 1+k%7; i++ {
				d, err := h.Allow(context.Background(), key)
				require.NoError(t, err)
				if d.Allowed {
					allowed[key]++
				}
			}
		}
	}
	require.LessOrEqual(t, h.Stats().KeysTracked, 4)
	require.NoError(t, h.Flush(context.Background()))
	for k := 0; k < 40; k++ {
		key := fmt.Sprintf("key-%d", k)
		require.Equal(t, allowed[key], redisCount(t, c, prefix, key, idx), "key %s", key)
	}
	bad, err := redistest.KeysWithoutTTL(context.Background(), c)
	require.NoError(t, err)
	require.Empty(t, bad)
}

// A fleet mixing hybrid and global limiters on one quota never exceeds it.
func TestMixedFleet(t *testing.T) {
	srv := redistest.Standalone(t)
	limit := ratelimit.Limit{Rate: 800, Period: time.Second}
	prefix := uniq(t)
	_, ls := fleet(t, 2, func() redis.UniversalClient { return srv.Client() }, limit,
		hybrid.WithPrefix(prefix), hybrid.WithInstances(4), hybrid.WithTimeout(time.Second))
	for i := 0; i < 2; i++ {
		c := srv.Client()
		defer c.Close()
		g, err := global.New(c, limit, global.WithPrefix(prefix), global.WithAlgorithm(ratelimit.FixedWindow))
		require.NoError(t, err)
		ls = append(ls, g)
	}
	tl := newTally(limit.Period)
	from := time.Now()
	_, denied := hammer(t, ls, []string{"shared"}, 3, 2500*time.Millisecond, tl)
	require.Positive(t, denied)
	full, all := tl.windows("shared", from, time.Now())
	for idx, n := range all {
		require.LessOrEqual(t, n, limit.Rate, "window %d", idx)
	}
	for idx, n := range full {
		require.GreaterOrEqual(t, n, limit.Rate*9/10, "window %d", idx)
	}
}

// Optimistic mode overshoots by at most instances x share per window, even
// driven far above the limit.
func TestOptimisticBound(t *testing.T) {
	srv := redistest.Standalone(t)
	limit := ratelimit.Limit{Rate: 800, Period: time.Second}
	const instances = 4
	share := limit.Rate / (8 * instances)
	keys := []string{"o1", "o2", "o3", "o4", "o5", "o6"}
	hs, ls := fleet(t, instances, func() redis.UniversalClient { return srv.Client() }, limit,
		hybrid.WithPrefix(uniq(t)), hybrid.WithInstances(instances), hybrid.WithMode(hybrid.Optimistic), hybrid.WithTimeout(time.Second))
	tl := newTally(limit.Period)
	from := time.Now()
	hammer(t, ls, keys, 2, 2500*time.Millisecond, tl)
	to := time.Now()
	require.Zero(t, sumStats(hs).Fallback)
	bound := limit.Rate + instances*share
	over := 0
	for _, k := range keys {
		full, all := tl.windows(k, from, to)
		t.Logf("key %s windows %v", k, all)
		for idx, n := range all {
			require.LessOrEqual(t, n, bound, "key %s window %d over the optimistic bound %d", k, idx, bound)
			over = max(over, n-limit.Rate)
		}
		for idx, n := range full {
			require.GreaterOrEqual(t, n, limit.Rate, "key %s window %d", k, idx)
		}
	}
	t.Logf("largest overshoot %d, bound instances x share = %d", over, instances*share)
}

// paced runs each limiter through keys round-robin at one request per gap
// for d, and returns the fleet's statistics.
func paced(t *testing.T, hs []*hybrid.Limiter, keys []string, gap, d time.Duration) hybrid.Stats {
	var wg sync.WaitGroup
	for i, h := range hs {
		wg.Add(1)
		go func(h *hybrid.Limiter, off int) {
			defer wg.Done()
			start := time.Now()
			for j := 0; ; j++ {
				at := start.Add(time.Duration(j) * gap)
				if at.Sub(start) >= d {
					return
				}
				time.Sleep(time.Until(at))
				if _, err := h.Allow(context.Background(), keys[(j+off)%len(keys)]); err != nil {
					t.Error(err)
					return
				}
			}
		}(h, i*7)
	}
	wg.Wait()
	return sumStats(hs)
}

// Optimistic mode waits on Redis less often than strict on many paced keys,
// where strict mode must lease synchronously at every window start.
func TestOptimisticFewerSyncRoundTrips(t *testing.T) {
	srv := redistest.Standalone(t)
	limit := ratelimit.Limit{Rate: 200, Period: time.Second}
	keys := make([]string, 40)
	for i := range keys {
		keys[i] = fmt.Sprintf("p%d", i)
	}
	perMode := map[hybrid.Mode]hybrid.Stats{}
	for _, mode := range []hybrid.Mode{hybrid.Strict, hybrid.Optimistic} {
		hs, _ := fleet(t, 4, func() redis.UniversalClient { return srv.Client() }, limit,
			hybrid.WithPrefix(uniq(t)), hybrid.WithInstances(4), hybrid.WithMode(mode), hybrid.WithTimeout(time.Second))
		s := paced(t, hs, keys, 2*time.Millisecond, 2500*time.Millisecond)
		perMode[mode] = s
		t.Logf("%v: decisions %d denied %d sync round trips %d (%.1f per 1000 decisions), all round trips %d",
			mode, s.Decisions, s.Denied, s.SyncRoundTrips, 1000*float64(s.SyncRoundTrips)/float64(s.Decisions), s.RoundTrips)
	}
	st, op := perMode[hybrid.Strict], perMode[hybrid.Optimistic]
	require.Less(t, float64(op.SyncRoundTrips)/float64(op.Decisions), float64(st.SyncRoundTrips)/float64(st.Decisions))
}

// Allow never waits on Redis longer than the timeout, whether the address
// refuses connections or hangs, and whatever the client's own timeouts: it
// is denied (strict) until the breaker opens, then FailLocal decides.
func TestTimeoutBound(t *testing.T) {
	srv := redistest.Standalone(t)
	p, err := faultproxy.New(srv.Addr())
	require.NoError(t, err)
	defer p.Close()
	p.Block(true) // accepts, never answers
	const timeout = 50 * time.Millisecond
	for _, tc := range []struct {
		name        string
		addr        string
		ctxTimeouts bool
		retries     int
	}{{"hanging", p.Addr(), false, -1}, {"refused", "127.0.0.1:1", false, -1}, {"hanging-ContextTimeoutEnabled", p.Addr(), true, -1},
		{"hanging-retries", p.Addr(), false, 0}, {"refused-retries", "127.0.0.1:1", false, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			// ReadTimeout left at go-redis' 3s default: the limiter, not the
			// client, must bound the wait. (A lone decision's call runs on
			// its own goroutine, given until its timeout: by the client with
			// ContextTimeoutEnabled, else by a clone of it that times out
			// then.) With go-redis's retries (MaxRetries 0: its default of
			// 3), a read that timed out is not sent again past the bound.
			c := redis.NewClient(&redis.Options{Addr: tc.addr, MaxRetries: tc.retries, ContextTimeoutEnabled: tc.ctxTimeouts})
			defer c.Close()
			h, err := hybrid.New(c, ratelimit.PerSecond(100), hybrid.WithTimeout(timeout), hybrid.WithInstances(1))
			require.NoError(t, err)
			allowed := 0
			deadline := time.Now().Add(10 * time.Second)
			for i := 0; allowed < 10; i++ {
				require.True(t, time.Now().Before(deadline), "FailLocal never decided")
				start := time.Now()
				d, err := h.Allow(context.Background(), fmt.Sprintf("k%d", i))
				took := time.Since(start)
				require.NoError(t, err, "no decision returns an error")
				require.Less(t, took, 20*timeout, "Allow waited %v", took)
				if d.Allowed {
					require.True(t, h.Stats().Degraded, "admitted without Redis while the breaker was closed")
					allowed++
				}
			}
			require.NoError(t, func() error { p.Block(false); return nil }())
			h.Close()
			p.Block(true)
		})
	}
}

func TestBadInput(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	_, err := hybrid.New(nil, ratelimit.PerSecond(1))
	require.Error(t, err)
	_, err = hybrid.New(c, ratelimit.Limit{})
	require.ErrorIs(t, err, ratelimit.ErrInvalidLimit)
	_, err = hybrid.New(c, ratelimit.PerSecond(10), hybrid.WithAlgorithm(ratelimit.SlidingLog))
	require.ErrorIs(t, err, ratelimit.ErrInvalidAlgorithm)
	for _, o := range []hybrid.Option{hybrid.WithSyncInterval(0), hybrid.WithMaxKeys(-1), hybrid.WithPrefix(""), hybrid.WithPrefix("a{b}"),
		hybrid.WithTimeout(-1), hybrid.WithMode(7), hybrid.WithFailureMode(ratelimit.FailureMode(9)), hybrid.WithInstances(-1), hybrid.WithBreaker(0, time.Second)} {
		_, err = hybrid.New(c, ratelimit.PerSecond(10), o)
		require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
	}
	h, err := hybrid.New(c, ratelimit.PerSecond(10), hybrid.WithPrefix(uniq(t)))
	require.NoError(t, err)
	defer h.Close()
	ctx := context.Background()
	_, err = h.AllowN(ctx, "", 1)
	require.ErrorIs(t, err, ratelimit.ErrInvalidKey)
	for _, n := range []int{0, -1, 11} {
		_, err = h.AllowN(ctx, "k", n)
		require.ErrorIs(t, err, ratelimit.ErrInvalidN, "n=%d", n)
	}
	long := string(make([]byte, 10<<10))
	for _, k := range []string{long, "{{}}{", "}"} {
		d, err := h.Allow(ctx, k)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	require.NoError(t, h.Flush(ctx))
	keys, err := c.Keys(ctx, "*").Result()
	require.NoError(t, err)
	for _, k := range keys {
		require.Less(t, len(k), 300, "a long key reached Redis verbatim")
		require.NotContains(t, k, "{{", "braces reached Redis verbatim")
	}
}

// No goroutine outlives Close.
func TestNoGoroutineLeak(t *testing.T) {
	srv := redistest.Standalone(t)
	opts := []goleak.Option{goleak.IgnoreCurrent()}
	c := srv.Client()
	h, err := hybrid.New(c, ratelimit.PerSecond(100), hybrid.WithPrefix(uniq(t)), hybrid.WithSyncInterval(10*time.Millisecond))
	require.NoError(t, err)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for j := 0; j < 200; j++ {
				if _, err := h.Allow(context.Background(), fmt.Sprintf("k%d", (i+j)%5)); err != nil && !errors.Is(err, ratelimit.ErrClosed) {
					t.Error(err)
				}
			}
		}(i)
	}
	wg.Wait()
	require.NoError(t, h.Close())
	require.NoError(t, c.Close())
	goleak.VerifyNone(t, opts...)
}

// AllowN(n) with n above the lease in hand leases the difference: the
// instance's own unused lease counts toward n, so a request the window can
// hold is never denied for want of a bigger grant.
func TestAllowNAboveLease(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	limit := ratelimit.PerMinute(100)
	freshWindow(t, c, limit.Period, 10*time.Second)
	h, err := hybrid.New(c, limit, hybrid.WithPrefix(uniq(t)), hybrid.WithInstances(1), hybrid.WithTimeout(time.Second))
	require.NoError(t, err)
	defer h.Close()
	ctx := context.Background()
	for i := 0; i < 11; i++ {
		d, err := h.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	d, err := h.AllowN(ctx, "k", 89)
	require.NoError(t, err)
	require.True(t, d.Allowed, "11 + 89 = 100 fit the window: %+v", d)
	require.Zero(t, d.Remaining)
	d, err = h.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, d.Allowed)
}

// Decisions racing Close either decide or get ErrClosed; Close waits for
// those it let in (run under the race detector).
func TestAllowDuringClose(t *testing.T) {
	srv := redistest.Standalone(t)
	for round := 0; round < 5; round++ {
		c := srv.Client()
		h, err := hybrid.New(c, ratelimit.PerSecond(50), hybrid.WithPrefix(uniq(t)), hybrid.WithInstances(1))
		require.NoError(t, err)
		var wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				for i := 0; i < 200; i++ {
					_, err := h.Allow(context.Background(), fmt.Sprintf("k%d", (g+i)%20))
					if err != nil && !errors.Is(err, ratelimit.ErrClosed) {
						t.Error(err)
						return
					}
				}
			}(g)
		}
		time.Sleep(time.Duration(round) * time.Millisecond)
		require.NoError(t, h.Close())
		wg.Wait()
		require.NoError(t, c.Close())
	}
}

// A key costs a bounded number of bytes in memory, whatever its length: a
// 10 KB key is kept as a 129-byte digest, and a short key as a copy, so
// the caller's buffer it was cut from is not retained; either is kept once,
// its index, table and counter sharing it.
func TestKeyMemoryBounded(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	h, err := hybrid.New(c, ratelimit.PerHour(1_000_000), hybrid.WithPrefix(uniq(t)), hybrid.WithInstances(1), hybrid.WithTimeout(time.Second))
	require.NoError(t, err)
	defer h.Close()
	ctx := context.Background()
	const n = 200
	heap := func() int64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return int64(m.HeapAlloc)
	}
	before := heap()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%05d", i) + strings.Repeat("x", 10<<10)
	}
	// The first decision learns Redis' time when the heartbeat's sample was
	// not close enough to tell the window by (then it keeps a counter).
	_, err = h.Allow(ctx, "first")
	require.NoError(t, err)
	base := h.Stats().KeysTracked
	require.LessOrEqual(t, base, 1)
	for _, k := range keys {
		d, err := h.Allow(ctx, k)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	require.Equal(t, base, h.Stats().KeysTracked, "a key's first decision in two windows makes no counter")
	for _, k := range keys { // asked again: each key gets its counter
		d, err := h.Allow(ctx, k)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	// A short key cut from the 10 KB buffer, used twice: the second use
	// puts it in the index too.
	short := keys[3][:5]
	for range 2 {
		d, err := h.Allow(ctx, short)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	_, err = h.Allow(ctx, keys[3]) // the same for the long key
	require.NoError(t, err)
	require.Equal(t, 1, hybrid.KeyCopies(h, short), "a short key is kept once")
	require.Equal(t, 1, hybrid.KeyCopies(h, keys[3]), "a long key's digest is kept once")
	keys = nil // only the limiter may keep them now (short is not used again)
	per := float64(heap()-before) / n
	t.Logf("heap per 10 KB key: %.0f B", per)
	require.Less(t, per, 4096.0, "a 10 KB key must not be kept whole")
	require.Equal(t, base+n+1, h.Stats().KeysTracked)
	// the digests still tell the keys apart
	d, err := h.Allow(ctx, fmt.Sprintf("%05d", 7)+strings.Repeat("x", 10<<10))
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.Equal(t, base+n+1, h.Stats().KeysTracked)
}

// A request Redis cannot serve does not deny a smaller one it can: after
// AllowN(2) is denied with 1 left in the window, AllowN(1) is admitted, as
// global admits it.
func TestSmallerAfterLargerDenied(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	freshWindow(t, c, time.Hour, 10*time.Second)
	for _, alg := range []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingWindow, ratelimit.TokenBucket} {
		h, err := hybrid.New(c, ratelimit.Limit{Rate: 5, Period: time.Hour, Burst: 5}, hybrid.WithPrefix(uniq(t)), hybrid.WithAlgorithm(alg))
		require.NoError(t, err)
		var got []bool
		for _, n := range []int{1, 2, 1, 2, 1, 1} {
			d, err := h.AllowN(context.Background(), "k", n)
			require.NoError(t, err)
			got = append(got, d.Allowed)
		}
		require.Equal(t, []bool{true, true, true, false, true, false}, got, "%v", alg)
		require.NoError(t, h.Close())
	}
}
