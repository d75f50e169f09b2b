package httplimit_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/textproto"
	"strconv"
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

// A day-long fixed window: a run of a few requests crosses a window boundary
// only at midnight UTC, and testLimitThenDeny retries with a fresh key if it
// did. The window algorithms ignore its Burst: the headers advertise Rate.
var dayLimit = ratelimit.Limit{Rate: 5, Period: 24 * time.Hour, Burst: 2}

func TestLimitThenDenyLocal(t *testing.T) {
	// A fixed clock: the decisions are exact and no window rolls.
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	lim, err := local.New(ratelimit.PerMinute(5), local.WithAlgorithm(ratelimit.FixedWindow),
		local.WithClock(func() time.Time { return now }))
	require.NoError(t, err)
	testLimitThenDeny(t, lim, ratelimit.PerMinute(5), true)
}

func TestLimitThenDenyGlobal(t *testing.T) {
	srv := redistest.Standalone(t)
	client := srv.Client()
	t.Cleanup(func() { client.Close() })
	lim, err := global.New(client, dayLimit, global.WithAlgorithm(ratelimit.FixedWindow), global.WithPrefix(uniq(t)))
	require.NoError(t, err)
	testLimitThenDeny(t, lim, dayLimit, true)
}

func TestLimitThenDenyHybrid(t *testing.T) {
	srv := redistest.Standalone(t)
	client := srv.Client()
	t.Cleanup(func() { client.Close() })
	// A long timeout: the race detector on a loaded machine must not send
	// decisions to the failure mode, whose answers are not exact.
	lim, err := hybrid.New(client, dayLimit, hybrid.WithPrefix(uniq(t)), hybrid.WithTimeout(2*time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, lim.Close()) })
	// The hybrid's Remaining is its view (lease plus what Redis last said
	// was free): the headers must match it, its exact value is the
	// hybrid's business.
	testLimitThenDeny(t, lim, dayLimit, false)
	require.Zero(t, lim.Stats().Fallback, "every decision must come from Redis-granted quota")
}

// noAlgorithm is a Limiter from elsewhere that does not fill
// Decision.Algorithm: its decisions read as FixedWindow's.
type noAlgorithm struct{ ratelimit.Limiter }

func (l noAlgorithm) AllowN(ctx context.Context, key string, n int) (ratelimit.Decision, error) {
	d, err := l.Limiter.AllowN(ctx, key, n)
	d.Algorithm = 0
	return d, err
}

// A token bucket of 3 that refills 1 per second, behind a limiter that does
// not say it is a bucket: WithQuota advertises its burst.
func TestLimitThenDenyBucketQuota(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	limit := ratelimit.Limit{Rate: 1, Period: time.Second, Burst: 3}
	lim, err := local.New(limit, local.WithAlgorithm(ratelimit.TokenBucket), local.WithClock(func() time.Time { return now }))
	require.NoError(t, err)
	srv, _ := serve(t, noAlgorithm{lim}, httplimit.WithKey(httplimit.Header("X-User")))
	require.Equal(t, "1", get(t, srv, "X-User", "other").header.Get("X-RateLimit-Limit"), "without WithQuota: Rate")
	srv, rec := serve(t, noAlgorithm{lim}, httplimit.WithKey(httplimit.Header("X-User")), httplimit.WithQuota(3))
	for i := 0; i < 4; i++ {
		r := get(t, srv, "X-User", "u")
		d := rec.last(t).Decision
		checkHeaders(t, r, d, 3, "default")
		require.Equal(t, i < 3, d.Allowed, "request %d", i)
		require.Equal(t, max(2-i, 0), d.Remaining, "request %d", i)
	}
}

// testLimitThenDeny sends limit.Rate+1 requests of one key through a real
// server and client: the first Rate are served, the next gets 429, and every
// header matches the decision the middleware reported.
func testLimitThenDeny(t *testing.T, lim ratelimit.Limiter, limit ratelimit.Limit, exactRemaining bool) {
	t.Helper()
	srv, rec := serve(t, lim, httplimit.WithKey(httplimit.Header("X-User")), httplimit.WithPolicyName("per-user"))
	for attempt := 0; ; attempt++ {
		require.Less(t, attempt, 3, "the window rolled during every attempt")
		key := "user-" + strconv.Itoa(attempt)
		from := len(rec.all())
		var rs []response
		for i := 0; i <= limit.Rate; i++ {
			rs = append(rs, get(t, srv, "X-User", key))
		}
		evs := rec.all()[from:]
		require.Len(t, evs, limit.Rate+1)
		if rolled(rs, evs) {
			t.Logf("attempt %d: the window rolled during the run; again with a new key", attempt)
			continue
		}
		for i, r := range rs {
			ev := evs[i]
			require.Equal(t, key, ev.Key)
			require.Equal(t, 1, ev.Cost)
			require.Equal(t, limit, ev.Decision.Limit)
			checkHeaders(t, r, ev.Decision, limit.Rate, "per-user")
			if i < limit.Rate {
				require.Equal(t, httplimit.OutcomeAllowed, ev.Outcome, "request %d", i)
				require.Equal(t, http.StatusOK, r.status, "request %d", i)
				require.Equal(t, "served", r.body)
				if exactRemaining {
					require.Equal(t, limit.Rate-1-i, ev.Decision.Remaining, "request %d", i)
				}
			} else {
				require.Equal(t, httplimit.OutcomeDenied, ev.Outcome, "the request past the limit")
				require.Equal(t, http.StatusTooManyRequests, r.status)
				require.Zero(t, ev.Decision.Remaining)
			}
		}
		require.EqualValues(t, limit.Rate, rec.served.Load()-int64(attempt*limit.Rate), "served requests of this attempt")
		return
	}
}

// rolled reports whether the decisions of one run fell into two windows:
// their window ends (send time + ResetAfter) differ by more than the run took.
func rolled(rs []response, evs []httplimit.Event) bool {
	first := rs[0].before.Add(evs[0].Decision.ResetAfter)
	last := rs[len(rs)-1].before.Add(evs[len(evs)-1].Decision.ResetAfter)
	return last.Sub(first) > rs[len(rs)-1].after.Sub(rs[0].before)+time.Second
}

// checkHeaders checks every rate-limit header of r against d, the decision
// the middleware took for it, and a 429's Retry-After and body.
func checkHeaders(t *testing.T, r response, d ratelimit.Decision, quota int, policy string) {
	t.Helper()
	checkLegacyHeaders(t, r, d, quota)
	h := r.header
	pol := h.Values("RateLimit-Policy")
	require.Len(t, pol, 1)
	items, err := parseSFList(pol[0])
	require.NoError(t, err, "RateLimit-Policy %q", pol[0])
	require.Len(t, items, 1)
	require.Equal(t, policy, items[0].value)
	want := []sfParam{{"q", int64(quota)}}
	if p := d.Limit.Period; p%time.Second == 0 {
		want = append(want, sfParam{"w", int64(p / time.Second)})
	}
	require.Equal(t, want, items[0].params, "RateLimit-Policy %q", pol[0])

	rl := h.Values("RateLimit")
	require.Len(t, rl, 1)
	items, err = parseSFList(rl[0])
	require.NoError(t, err, "RateLimit %q", rl[0])
	require.Len(t, items, 1)
	require.Equal(t, policy, items[0].value)
	require.Equal(t, []sfParam{{"r", int64(d.Remaining)}, {"t", ceilSec(d.ResetAfter)}}, items[0].params, "RateLimit %q", rl[0])
}

// checkLegacyHeaders checks the X-RateLimit-* headers of r against d, and a
// 429's Retry-After and body.
func checkLegacyHeaders(t *testing.T, r response, d ratelimit.Decision, quota int) {
	t.Helper()
	h := r.header
	require.Equal(t, strconv.Itoa(quota), h.Get("X-RateLimit-Limit"))
	require.Equal(t, strconv.Itoa(d.Remaining), h.Get("X-RateLimit-Remaining"))

	// Reset: Unix seconds of now + ResetAfter, rounded up, "now" being some
	// instant during the request.
	reset, err := strconv.ParseInt(h.Get("X-RateLimit-Reset"), 10, 64)
	require.NoError(t, err, "X-RateLimit-Reset %q", h.Get("X-RateLimit-Reset"))
	require.GreaterOrEqual(t, reset, ceilUnix(r.before.Add(d.ResetAfter)))
	require.LessOrEqual(t, reset, ceilUnix(r.after.Add(d.ResetAfter)))

	if r.status != http.StatusTooManyRequests {
		require.Empty(t, h.Values("Retry-After"), "only a 429 carries Retry-After")
	} else {
		require.False(t, d.Allowed)
		ra, err := strconv.Atoi(h.Get("Retry-After"))
		require.NoError(t, err, "Retry-After %q must be an integer", h.Get("Retry-After"))
		require.Positive(t, ra)
		require.Equal(t, ceilSec(d.RetryAfter), int64(ra))
		require.Equal(t, "application/json", h.Get("Content-Type"))
		var body struct {
			Error      string `json:"error"`
			RetryAfter int    `json:"retry_after"`
		}
		require.NoError(t, json.Unmarshal([]byte(r.body), &body), "body %q", r.body)
		require.Equal(t, "rate_limit_exceeded", body.Error)
		require.Equal(t, ra, body.RetryAfter)
	}
}

func ceilUnix(t time.Time) int64 {
	if t.Nanosecond() != 0 {
		return t.Unix() + 1
	}
	return t.Unix()
}

func ceilSec(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second > 0 {
		s++
	}
	return s
}

// The header names the middleware writes directly into the map must be the
// canonical ones, or Header.Get would not find them.
func TestHeaderNamesCanonical(t *testing.T) {
	lim, err := local.New(ratelimit.PerSecond(1))
	require.NoError(t, err)
	h := httplimit.New(lim)(http.NotFoundHandler())
	w := &recorder{h: http.Header{}}
	r, err := http.NewRequest(http.MethodGet, "/", nil)
	require.NoError(t, err)
	r.RemoteAddr = "192.0.2.1:1"
	h.ServeHTTP(w, r)
	h.ServeHTTP(w, r) // denied: Retry-After too
	require.Len(t, w.h, 8, "six rate-limit headers, Content-Type and X-Content-Type-Options: %v", w.h)
	for name := range w.h {
		require.Equal(t, textproto.CanonicalMIMEHeaderKey(name), name)
	}
}

func TestHeaderSets(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 30, 0, time.UTC)
	for _, c := range []struct {
		set  httplimit.HeaderSet
		want []string
	}{
		{0, nil},
		{httplimit.XRateLimit, []string{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset"}},
		{httplimit.RetryAfter, []string{"Retry-After"}},
		{httplimit.IETF, []string{"Ratelimit-Policy", "Ratelimit"}},
		{httplimit.IETF | httplimit.RetryAfter, []string{"Ratelimit-Policy", "Ratelimit", "Retry-After"}},
	} {
		lim, err := local.New(ratelimit.PerMinute(1), local.WithAlgorithm(ratelimit.FixedWindow),
			local.WithClock(func() time.Time { return now }))
		require.NoError(t, err)
		srv, _ := serve(t, lim, httplimit.WithHeaders(c.set))
		for _, denied := range []bool{false, true} {
			r := get(t, srv)
			require.Equal(t, denied, r.status == http.StatusTooManyRequests)
			var got []string
			for _, name := range []string{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "Retry-After", "Ratelimit-Policy", "Ratelimit"} {
				if r.header.Get(name) != "" {
					got = append(got, name)
				}
			}
			var want []string
			for _, name := range c.want {
				if name != "Retry-After" || denied {
					want = append(want, name)
				}
			}
			require.ElementsMatch(t, want, got, "set %#x denied %v", c.set, denied)
			if c.set&httplimit.IETF != 0 {
				require.Equal(t, `"default";q=1;w=60`, r.header.Get("RateLimit-Policy"))
				require.Equal(t, `"default";r=0;t=30`, r.header.Get("RateLimit"))
			}
		}
	}
}

// A period that is not a whole number of seconds has no w parameter (the
// field cannot say 1.5), and a name with quotes and backslashes is escaped.
func TestPolicyFieldEdges(t *testing.T) {
	limit := ratelimit.Limit{Rate: 10, Period: 1500 * time.Millisecond}
	lim, err := local.New(limit)
	require.NoError(t, err)
	srv, rec := serve(t, lim, httplimit.WithPolicyName(`say "hi" \o/`))
	r := get(t, srv)
	require.Equal(t, `"say \"hi\" \\o/";q=10`, r.header.Get("RateLimit-Policy"))
	checkHeaders(t, r, rec.last(t).Decision, 10, `say "hi" \o/`)
}

// WithCost: a request counts for n events.
func TestCost(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	lim, err := local.New(ratelimit.PerMinute(10), local.WithAlgorithm(ratelimit.FixedWindow), local.WithClock(func() time.Time { return now }))
	require.NoError(t, err)
	srv, rec := serve(t, lim, httplimit.WithCost(func(r *http.Request) int {
		n, _ := strconv.Atoi(r.Header.Get("X-Cost"))
		return n
	}))
	for _, c := range []struct {
		cost, status, remaining int
	}{{4, 200, 6}, {4, 200, 2}, {3, 429, 2}, {2, 200, 0}} {
		r := get(t, srv, "X-Cost", strconv.Itoa(c.cost))
		require.Equal(t, c.status, r.status)
		require.Equal(t, strconv.Itoa(c.remaining), r.header.Get("X-RateLimit-Remaining"))
		require.Equal(t, c.cost, rec.last(t).Cost)
	}
}

func TestOutcomeString(t *testing.T) {
	for o, s := range map[httplimit.Outcome]string{
		httplimit.OutcomeAllowed: "allowed", httplimit.OutcomeDenied: "denied",
		httplimit.OutcomeShadowDenied: "shadow-denied", httplimit.OutcomeError: "error", 0: "Outcome(0)",
	} {
		require.Equal(t, s, o.String())
	}
}
