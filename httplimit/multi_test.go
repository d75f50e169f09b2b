package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/httplimit"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/hybridlimit/ratelimit/local"
)

// fakeClock is a clock a test moves by hand.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock(t time.Time) *fakeClock {
	c := &fakeClock{}
	c.ns.Store(t.UnixNano())
	return c
}

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// checkMultiHeaders checks the headers of a response to a decision of
// several limits: X-RateLimit-* and Retry-After describe d, the tightest
// limit, with quota its capacity; RateLimit-Policy lists one member per
// limit, in order, with its name, quota and window; RateLimit one member per
// limit with the remaining and reset of states[i].
func checkMultiHeaders(t *testing.T, r response, d ratelimit.Decision, states []ratelimit.LimitState, names []string) {
	t.Helper()
	require.Len(t, names, len(states))
	checkLegacyHeaders(t, r, d, d.Limit.Capacity(d.Algorithm))

	pol := r.header.Values("RateLimit-Policy")
	require.Len(t, pol, 1, "one field line")
	items, err := parseSFList(pol[0])
	require.NoError(t, err, "RateLimit-Policy %q", pol[0])
	require.Len(t, items, len(states), "RateLimit-Policy %q", pol[0])
	for i, s := range states {
		require.Equal(t, names[i], items[i].value, "RateLimit-Policy %q member %d", pol[0], i)
		want := []sfParam{{"q", int64(s.Limit.Capacity(s.Algorithm))}}
		if p := s.Limit.Period; p%time.Second == 0 {
			want = append(want, sfParam{"w", int64(p / time.Second)})
		}
		require.Equal(t, want, items[i].params, "RateLimit-Policy %q member %d", pol[0], i)
	}

	rl := r.header.Values("RateLimit")
	require.Len(t, rl, 1, "one field line")
	items, err = parseSFList(rl[0])
	require.NoError(t, err, "RateLimit %q", rl[0])
	require.Len(t, items, len(states), "RateLimit %q", rl[0])
	for i, s := range states {
		require.Equal(t, names[i], items[i].value, "RateLimit %q member %d", rl[0], i)
		require.Equal(t, []sfParam{{"r", int64(max(s.Remaining, 0))}, {"t", ceilSec(s.ResetAfter)}}, items[i].params,
			"RateLimit %q member %d", rl[0], i)
	}
}

// rateLimitMembers returns the r and t of each member of r's RateLimit field.
func rateLimitMembers(t *testing.T, r response) [][2]int64 {
	t.Helper()
	items, err := parseSFList(r.header.Get("RateLimit"))
	require.NoError(t, err)
	out := make([][2]int64, len(items))
	for i, it := range items {
		require.Len(t, it.params, 2)
		out[i] = [2]int64{it.params[0].value.(int64), it.params[1].value.(int64)}
	}
	return out
}

// A per-second token bucket (4, refilling 10/s), a per-minute window of 6
// and a per-hour window of 100 on one key, through local.NewMulti on a fake
// clock: every response lists the three policies with their own quota,
// window, remaining and reset; the legacy headers and Retry-After follow the
// tightest limit; a denial names the denying limit's reset, and counts in
// no limit.
func TestMultiPolicies(t *testing.T) {
	clock := newFakeClock(time.Date(2026, 3, 1, 12, 0, 30, 0, time.UTC))
	limits := []ratelimit.Limit{{Rate: 10, Period: time.Second, Burst: 4}, ratelimit.PerMinute(6), ratelimit.PerHour(100)}
	lim, err := local.NewMulti(limits,
		local.WithAlgorithms(ratelimit.TokenBucket, ratelimit.FixedWindow, ratelimit.FixedWindow),
		local.WithClock(clock.now))
	require.NoError(t, err)
	srv, rec := serve(t, lim, httplimit.WithKey(httplimit.Header("X-User")), httplimit.WithPolicyName("api"))
	names := []string{"api-1s", "api-60s", "api-3600s"}
	require.Equal(t, `"api-1s";q=4;w=1, "api-60s";q=6;w=60, "api-3600s";q=100;w=3600`,
		get(t, srv, "X-User", "probe").header.Get("RateLimit-Policy"))

	step := func(wantStatus int, want [][2]int64) (response, ratelimit.Decision) {
		t.Helper()
		r := get(t, srv, "X-User", "u")
		d, states := rec.last(t).Decision, rec.lastStates(t)
		require.Equal(t, wantStatus, r.status)
		require.Len(t, states, 3)
		checkMultiHeaders(t, r, d, states, names)
		require.Equal(t, want, rateLimitMembers(t, r), "RateLimit %q", r.header.Get("RateLimit"))
		return r, d
	}
	// The bucket is the tightest: 4 tokens; its t is until it is full again
	// (one token per 100ms), the windows' until they end.
	step(200, [][2]int64{{3, 1}, {5, 30}, {99, 3570}})
	step(200, [][2]int64{{2, 1}, {4, 30}, {98, 3570}})
	step(200, [][2]int64{{1, 1}, {3, 30}, {97, 3570}})
	r, d := step(200, [][2]int64{{0, 1}, {2, 30}, {96, 3570}})
	require.Equal(t, "4", r.header.Get("X-RateLimit-Limit"), "the bucket is the tightest")
	require.Equal(t, limits[0], d.Limit)

	// Denied by the bucket: the next token in 100ms, so Retry-After 1; the
	// windows did not count it.
	r, d = step(429, [][2]int64{{0, 1}, {2, 30}, {96, 3570}})
	require.Equal(t, limits[0], d.Limit)
	require.Equal(t, 100*time.Millisecond, d.RetryAfter)
	require.Equal(t, "1", r.header.Get("Retry-After"))
	require.Equal(t, "4", r.header.Get("X-RateLimit-Limit"))

	// A second later the bucket is full; the minute window has 2 left.
	clock.advance(time.Second)
	step(200, [][2]int64{{3, 1}, {1, 29}, {95, 3569}})
	r, d = step(200, [][2]int64{{2, 1}, {0, 29}, {94, 3569}})
	require.Equal(t, "6", r.header.Get("X-RateLimit-Limit"), "now the minute window is the tightest")
	require.Equal(t, limits[1], d.Limit)

	// Denied by the minute window: Retry-After and X-RateLimit-Reset are its
	// end, 29s away, not the bucket's 100ms; the bucket and the hour did not
	// count it.
	r, d = step(429, [][2]int64{{2, 1}, {0, 29}, {94, 3569}})
	require.Equal(t, limits[1], d.Limit)
	require.Equal(t, 29*time.Second, d.RetryAfter)
	require.Equal(t, "29", r.header.Get("Retry-After"))
	require.Equal(t, "6", r.header.Get("X-RateLimit-Limit"))
	require.Equal(t, 29*time.Second, d.ResetAfter, "X-RateLimit-Reset is now + 29s (checked by checkLegacyHeaders)")
	require.EqualValues(t, 6, rec.served.Load()-1, "six served besides the probe")
}

// A MultiLimiter of one limit writes exactly what a Limiter of that limit
// writes: one policy, under the policy name itself.
func TestMultiOneLimitSameBytes(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 30, 0, time.UTC)
	clock := func() time.Time { return now }
	one, err := local.New(ratelimit.PerMinute(2), local.WithAlgorithm(ratelimit.SlidingWindow), local.WithClock(clock))
	require.NoError(t, err)
	multi, err := local.NewMulti([]ratelimit.Limit{ratelimit.PerMinute(2)}, local.WithAlgorithm(ratelimit.SlidingWindow), local.WithClock(clock))
	require.NoError(t, err)
	a, _ := serve(t, one, httplimit.WithPolicyName("p"))
	b, rec := serve(t, multi, httplimit.WithPolicyName("p"))
	for i := range 3 {
		ra, rb := get(t, a), get(t, b)
		require.Equal(t, ra.status, rb.status, "request %d", i)
		// X-RateLimit-Reset is wall-clock time: checkHeaders checks it.
		for _, h := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "Retry-After", "RateLimit-Policy", "RateLimit"} {
			require.Equal(t, ra.header.Values(h), rb.header.Values(h), "request %d: %s", i, h)
		}
		require.Len(t, rec.lastStates(t), 1)
		checkHeaders(t, rb, rec.last(t).Decision, 2, "p")
	}
	require.Equal(t, `"p";q=2;w=60`, get(t, b).header.Get("RateLimit-Policy"))
}

// Policy names: WithPolicyNames names each limit; limits of one period are
// told apart by their algorithm; a period of no whole seconds is named in
// milliseconds and has no w parameter.
func TestMultiPolicyNames(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := local.WithClock(func() time.Time { return now })
	limits := []ratelimit.Limit{{Rate: 5, Period: time.Second, Burst: 10}, ratelimit.PerSecond(8), {Rate: 50, Period: 1500 * time.Millisecond}}
	lim, err := local.NewMulti(limits, local.WithAlgorithms(ratelimit.TokenBucket, ratelimit.FixedWindow, ratelimit.SlidingWindow), clock)
	require.NoError(t, err)

	srv, rec := serve(t, lim)
	r := get(t, srv)
	require.Equal(t, `"default-1s-token_bucket";q=10;w=1, "default-1s-fixed_window";q=8;w=1, "default-1500ms";q=50`, r.header.Get("RateLimit-Policy"))
	checkMultiHeaders(t, r, rec.last(t).Decision, rec.lastStates(t), []string{"default-1s-token_bucket", "default-1s-fixed_window", "default-1500ms"})

	names := []string{"burst", `per "second"`, "slow"}
	srv, rec = serve(t, lim, httplimit.WithPolicyNames(names...))
	r = get(t, srv)
	require.Equal(t, `"burst";q=10;w=1, "per \"second\"";q=8;w=1, "slow";q=50`, r.header.Get("RateLimit-Policy"))
	checkMultiHeaders(t, r, rec.last(t).Decision, rec.lastStates(t), names)
	require.Equal(t, httplimit.DefaultPolicyName, rec.last(t).Policy, "events carry the policy name")

	for name, opts := range map[string][]httplimit.Option{
		"too few names":       {httplimit.WithPolicyNames("a", "b")},
		"too many names":      {httplimit.WithPolicyNames("a", "b", "c", "d")},
		"no names":            {httplimit.WithPolicyNames()},
		"a name twice":        {httplimit.WithPolicyNames("a", "b", "a")},
		"an empty name":       {httplimit.WithPolicyNames("a", "", "c")},
		"a non-ASCII name":    {httplimit.WithPolicyNames("a", "b", "é")},
		"WithQuota":           {httplimit.WithQuota(3)},
		"more than MaxLimits": {httplimit.WithPolicyNames("1", "2", "3", "4", "5", "6", "7", "8", "9")},
	} {
		t.Run(name, func(t *testing.T) {
			require.ErrorIs(t, httplimit.Validate(lim, opts...), ratelimit.ErrInvalidOption)
			srv, rec := serve(t, lim, opts...)
			requireError(t, get(t, srv), rec, http.StatusInternalServerError, "rate_limit_misconfigured", ratelimit.ErrInvalidOption)
		})
	}
	var nilMulti *local.Multi
	require.ErrorIs(t, httplimit.Validate(nilMulti), ratelimit.ErrInvalidOption, "a nil *Multi is no limiter")
}

// A Limiter that is not a MultiLimiter but whose decisions list several
// limits (here a wrapper around a Multi): every policy is listed too.
func TestMultiDecisionOfPlainLimiter(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	multi, err := local.NewMulti([]ratelimit.Limit{ratelimit.PerSecond(2), ratelimit.PerMinute(3)}, local.WithClock(func() time.Time { return now }))
	require.NoError(t, err)
	lim := &counting{Limiter: multi}
	srv, rec := serve(t, lim, httplimit.WithPolicyNames("s", "m"))
	for i := range 3 {
		r := get(t, srv)
		require.Equal(t, i < 2, r.status == http.StatusOK, "request %d", i)
		checkMultiHeaders(t, r, rec.last(t).Decision, rec.lastStates(t), []string{"s", "m"})
	}
	// Names for another number of limits: the derived ones.
	srv, rec = serve(t, lim, httplimit.WithPolicyNames("a", "b", "c"))
	r := get(t, srv)
	checkMultiHeaders(t, r, rec.last(t).Decision, rec.lastStates(t), []string{"default-1s", "default-60s"})
}

// Through Redis: global.NewMulti (exact) and hybrid.NewMulti (strict) on a
// real redis-server, a bucket of 3 refilling 1 per hour and a day window of
// 5. The fourth request is denied by the bucket: Retry-After is the
// bucket's next token, about an hour away, and the day window counted three.
func TestMultiRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	client := srv.Client()
	t.Cleanup(func() { client.Close() })
	limits := []ratelimit.Limit{{Rate: 1, Period: time.Hour, Burst: 3}, ratelimit.Limit{Rate: 5, Period: 24 * time.Hour}}
	algs := []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.FixedWindow}

	glob, err := global.NewMulti(client, limits, global.WithAlgorithms(algs...), global.WithPrefix(uniq(t)))
	require.NoError(t, err)
	hyb, err := hybrid.NewMulti(client, limits, hybrid.WithAlgorithms(algs...), hybrid.WithPrefix(uniq(t)), hybrid.WithTimeout(2*time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, hyb.Close()) })

	for _, c := range []struct {
		name  string
		lim   ratelimit.MultiLimiter
		exact bool
	}{{"global", glob, true}, {"hybrid", hyb, false}} {
		t.Run(c.name, func(t *testing.T) {
			srv, rec := serve(t, c.lim, httplimit.WithKey(httplimit.Header("X-User")), httplimit.WithPolicyName("rider"))
			names := []string{"rider-3600s", "rider-86400s"}
			for attempt := 0; ; attempt++ {
				require.Less(t, attempt, 3, "the day window rolled during every attempt")
				key := "u" + strconv.Itoa(attempt)
				var rs []response
				var ds []ratelimit.Decision
				var sts [][]ratelimit.LimitState
				for range 4 {
					rs = append(rs, get(t, srv, "X-User", key))
					ds, sts = append(ds, rec.last(t).Decision), append(sts, rec.lastStates(t))
				}
				if sts[3][1].ResetAfter > sts[0][1].ResetAfter {
					continue // the day window rolled
				}
				for i, r := range rs {
					require.Equal(t, i < 3, r.status == http.StatusOK, "request %d", i)
					require.Len(t, sts[i], 2)
					checkMultiHeaders(t, r, ds[i], sts[i], names)
					require.Equal(t, `"rider-3600s";q=3;w=3600, "rider-86400s";q=5;w=86400`, r.header.Get("RateLimit-Policy"))
				}
				denied := ds[3]
				require.Equal(t, limits[0], denied.Limit, "the bucket denies")
				require.Greater(t, denied.RetryAfter, 50*time.Minute, "its next token is about an hour away")
				require.LessOrEqual(t, denied.RetryAfter, time.Hour)
				require.Equal(t, strconv.FormatInt(ceilSec(denied.RetryAfter), 10), rs[3].header.Get("Retry-After"))
				require.Equal(t, "3", rs[3].header.Get("X-RateLimit-Limit"))
				require.True(t, sts[3][1].Allowed, "the day window alone would admit it")
				if c.exact {
					for i := range 3 {
						require.Equal(t, []int{2 - i, 4 - i}, []int{sts[i][0].Remaining, sts[i][1].Remaining}, "request %d", i)
					}
					require.Equal(t, 2, sts[3][1].Remaining, "the denied request was not counted by the day window")
				}
				return
			}
		})
	}
}

// Concurrent requests of distinct clients through one middleware over a
// Multi: each response's RateLimit members are its own decision's, whatever
// the others do with the pooled buffers meanwhile (run with -race).
func TestMultiConcurrent(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	lim, err := local.NewMulti([]ratelimit.Limit{ratelimit.PerMinute(40), ratelimit.PerHour(60)}, local.WithClock(func() time.Time { return now }))
	require.NoError(t, err)
	var observed atomic.Int64
	srv, _ := serve(t, lim, httplimit.WithKey(httplimit.Header("X-User")),
		httplimit.WithObserver(func(_ *http.Request, e httplimit.Event) {
			if len(e.Decision.Limits()) == 2 {
				observed.Add(1)
			}
		}))
	const clients, each = 8, 45
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for c := range clients {
		wg.Go(func() {
			user := fmt.Sprintf("user-%d", c)
			for i := range each {
				r := get(t, srv, "X-User", user)
				want := fmt.Sprintf(`"default-60s";r=%d;t=60, "default-3600s";r=%d;t=3600`, 40-1-i, 60-1-i)
				if i >= 40 { // denied: nothing counted
					want = `"default-60s";r=0;t=60, "default-3600s";r=20;t=3600`
				}
				if got := r.header.Get("RateLimit"); got != want || (r.status == http.StatusOK) != (i < 40) {
					errs <- fmt.Errorf("%s request %d: status %d RateLimit %q, want %q", user, i, r.status, got, want)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	require.EqualValues(t, clients*each, observed.Load())
}

// The middleware allocates as much for three policies as for one: the two
// header values. The states of the limits go into a pooled buffer.
func TestMultiAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items: allocation counts are not the program's")
	}
	one, err := local.New(benchLimits[1])
	require.NoError(t, err)
	multi, err := local.NewMulti(benchLimits, local.WithAlgorithms(benchAlgs...))
	require.NoError(t, err)
	allocs := func(lim ratelimit.Limiter) float64 {
		h := httplimit.New(lim)(ok)
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = "192.0.2.1:40000"
		w := &recorder{h: make(http.Header)}
		return testing.AllocsPerRun(1000, func() {
			clear(w.h)
			h.ServeHTTP(w, r)
		})
	}
	require.Equal(t, 2.0, allocs(one), "one policy")
	require.Equal(t, 2.0, allocs(multi), "three policies")
}
