package global_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/stretchr/testify/require"
)

// step is one AllowN at a logical time (microseconds after t0) and the
// decision docs/algorithms.md prescribes for it, worked out by hand.
type step struct {
	at   int64
	n    int
	want want
}

const (
	sec = int64(1_000_000)
	ms  = int64(1_000)
)

// TestExact runs hand-computed sequences against real Redis with WithClock
// and compares every field of every decision to the microsecond.
func TestExact(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()

	cases := []struct {
		name  string
		alg   ratelimit.Algorithm
		limit ratelimit.Limit
		steps []step
	}{
		{
			name: "FixedWindow/boundary burst", alg: ratelimit.FixedWindow,
			limit: ratelimit.Limit{Rate: 3, Period: 10 * time.Second},
			steps: []step{
				{2 * sec, 1, want{true, 2, 0, 8 * sec}},
				{2 * sec, 1, want{true, 1, 0, 8 * sec}},
				{9 * sec, 1, want{true, 0, 0, 1 * sec}},
				{9 * sec, 1, want{false, 0, 1 * sec, 1 * sec}},
				{10*sec - 1, 1, want{false, 0, 1, 1}},
				// the next window: Rate more right away, 2 x Rate across the boundary
				{10 * sec, 3, want{true, 0, 0, 10 * sec}},
				{10*sec + 1, 1, want{false, 0, 10*sec - 1, 10*sec - 1}},
			},
		},
		{
			name: "FixedWindow/AllowN all or nothing", alg: ratelimit.FixedWindow,
			limit: ratelimit.Limit{Rate: 5, Period: time.Second},
			steps: []step{
				{100 * ms, 3, want{true, 2, 0, 900 * ms}},
				{200 * ms, 3, want{false, 2, 800 * ms, 800 * ms}}, // consumed nothing
				{300 * ms, 2, want{true, 0, 0, 700 * ms}},
			},
		},
		{
			name: "SlidingWindow/weighting", alg: ratelimit.SlidingWindow,
			limit: ratelimit.Limit{Rate: 10, Period: 10 * time.Second},
			steps: []step{
				{1 * sec, 8, want{true, 2, 0, 9 * sec}},
				{1 * sec, 3, want{false, 2, 9*sec + 1, 9 * sec}}, // room = -1: (P-e) + first(8, 7) = 9s + (P - ceil(8P/8) + 1) = 9s + 1
				// next window, e = 2.5s: est = floor(8 * 7.5/10) + 0 = 6
				{12500 * ms, 4, want{true, 0, 0, 7500 * ms}},
				// est = 10; room = 10-4-1 = 5: first(8, 5) = P - ceil(6P/8) + 1 = 2.5s + 1 -> retry 1us
				{12500 * ms, 1, want{false, 0, 1, 7500 * ms}},
				// e = 2.5s + 1: floor(8 * 7499999 / 10^7) = 5, est = 9
				{12500*ms + 1, 1, want{true, 0, 0, 7500*ms - 1}},
				// curr = 5; n = 6: room = -1: (P - e) + first(5, 4) = 7499999 + 1
				{12500*ms + 1, 6, want{false, 0, 7500 * ms, 7500*ms - 1}},
				// the window after, e = 0: floor(5 * P/P) = 5, 5 + 6 > 10
				{20 * sec, 6, want{false, 5, 1, 10 * sec}},
				// e = 1: floor(5 * (P-1)/P) = 4, 4 + 6 = 10
				{20*sec + 1, 6, want{true, 0, 0, 10*sec - 1}},
				// e = 7s: floor(5 * 3/10) = 1, est = 1 + 6 = 7
				{27 * sec, 3, want{true, 0, 0, 3 * sec}},
			},
		},
		{
			name: "SlidingWindow/odd weights", alg: ratelimit.SlidingWindow,
			limit: ratelimit.Limit{Rate: 7, Period: 3 * time.Second},
			steps: []step{
				{0, 7, want{true, 0, 0, 3 * sec}},
				// room = 7-7-1 = -1: (P-0) + first(7, 6) = 3s + (3s - ceil(7*3s/7) + 1) = 3s + 1
				{0, 1, want{false, 0, 3*sec + 1, 3 * sec}},
				// next window, e = 1s: floor(7 * 2/3) = 4, est = 4, n = 3 -> 7
				{4 * sec, 3, want{true, 0, 0, 2 * sec}},
				// est 7 (e=1s); n=1: room = 7-3-1 = 3: first(7, 3) = 3s - ceil(4*3s/7) + 1
				// = 3000000 - 1714286 + 1 = 1285715 -> retry = 1285715 - 1000000
				{4 * sec, 1, want{false, 0, 285715, 2 * sec}},
				{4*sec + 285714, 1, want{false, 0, 1, 2*sec - 285714}},
				// e = 1285715: floor(7 * 1714285 / 3000000) = floor(3.99999) = 3; est 6 -> 7
				{4*sec + 285715, 1, want{true, 0, 0, 2*sec - 285715}},
			},
		},
		{
			name: "SlidingLog/exact", alg: ratelimit.SlidingLog,
			limit: ratelimit.Limit{Rate: 3, Period: 10 * time.Second},
			steps: []step{
				{0, 1, want{true, 2, 0, 10 * sec}},
				{1 * sec, 1, want{true, 1, 0, 10 * sec}},
				{2 * sec, 1, want{true, 0, 0, 10 * sec}},
				// k = 3+1-3 = 1: t_1 = 0 -> 0 + 10s - 3s; reset = newest 2s + 10s - 3s
				{3 * sec, 1, want{false, 0, 7 * sec, 9 * sec}},
				// k = 2: t_2 = 1s
				{3 * sec, 2, want{false, 0, 8 * sec, 9 * sec}},
				{10*sec - 1, 1, want{false, 0, 1, 2*sec + 1}},
				// t = 0 leaves the log at exactly now - P
				{10 * sec, 1, want{true, 0, 0, 10 * sec}},
				// live: 1s, 2s, 10s; n = 3 at 11s: 1s leaves -> count 2, k = 2: t_2 = 10s
				{11 * sec, 3, want{false, 1, 9 * sec, 9 * sec}},
				{25 * sec, 3, want{true, 0, 0, 10 * sec}},
			},
		},
		{
			name: "TokenBucket/refill", alg: ratelimit.TokenBucket,
			limit: ratelimit.Limit{Rate: 10, Period: time.Second, Burst: 5},
			steps: []step{
				{0, 5, want{true, 0, 0, 500 * ms}},
				{0, 1, want{false, 0, 100 * ms, 500 * ms}},
				// u = 99999 * 10 = 999990 units < 1 token (10^6 units)
				{100*ms - 1, 1, want{false, 0, 1, 400*ms + 1}},
				{100 * ms, 1, want{true, 0, 0, 500 * ms}},
				// 250ms later: 2.5 tokens; n = 3 denied, needs 0.5 token = 50ms
				{350 * ms, 3, want{false, 2, 50 * ms, 250 * ms}},
				{350 * ms, 2, want{true, 0, 0, 450 * ms}},
				// long idle: full, capped at Burst
				{100 * sec, 1, want{true, 4, 0, 100 * ms}},
			},
		},
		{
			name: "GCRA/emission interval", alg: ratelimit.GCRA,
			limit: ratelimit.Limit{Rate: 10, Period: time.Second, Burst: 5},
			steps: []step{
				// T = 100ms, tau = 500ms
				{0, 1, want{true, 4, 0, 100 * ms}},
				{0, 4, want{true, 0, 0, 500 * ms}},
				{0, 1, want{false, 0, 100 * ms, 500 * ms}},
				{100*ms - 1, 1, want{false, 0, 1, 400*ms + 1}},
				{100 * ms, 1, want{true, 0, 0, 500 * ms}},
				// tat = 600ms; at 350ms: tat - now = 250ms: floor(250/100) = 2
				{350 * ms, 3, want{false, 2, 50 * ms, 250 * ms}},
				{350 * ms, 2, want{true, 0, 0, 450 * ms}},
				{100 * sec, 1, want{true, 4, 0, 100 * ms}},
			},
		},
		{
			name: "GCRA/truncated interval", alg: ratelimit.GCRA,
			limit: ratelimit.Limit{Rate: 3, Period: time.Second},
			steps: []step{
				// T = 333333, tau = 999999
				{0, 3, want{true, 0, 0, 999999}},
				{0, 1, want{false, 0, 333333, 999999}},
				{333333, 1, want{true, 0, 0, 999999}},
				{333334, 1, want{false, 0, 333332, 999998}},
			},
		},
		{
			// newest + P exceeds 2^53: computed as P - (now - newest).
			name: "SlidingLog/250-year period", alg: ratelimit.SlidingLog,
			limit: ratelimit.Limit{Rate: 1, Period: 8_000_000_000_000_000 * time.Microsecond},
			steps: []step{
				{0, 1, want{true, 0, 0, 8_000_000_000_000_000}},
				{1, 1, want{false, 0, 7_999_999_999_999_999, 7_999_999_999_999_999}},
			},
		},
		{
			// tat = now + tau exceeds 2^53 (see TestGCRALongTolerance).
			name: "GCRA/tolerance past 2^53", alg: ratelimit.GCRA,
			limit: ratelimit.Limit{Rate: 1, Period: 24 * time.Hour, Burst: 100_000},
			steps: []step{
				// T = 86_400_000_000, tau = 8_640_000_000_000_000
				{0, 100_000, want{true, 0, 0, 8_640_000_000_000_000}},
				{0, 1, want{false, 0, 86_400_000_000, 8_640_000_000_000_000}},
				{86_400_000_000 - 1, 1, want{false, 0, 1, 8_640_000_000_000_000 - 86_400_000_000 + 1}},
				{86_400_000_000, 1, want{true, 0, 0, 8_640_000_000_000_000}},
				{86_400_000_000 + 7, 2, want{false, 0, 2*86_400_000_000 - 7, 8_640_000_000_000_000 - 7}},
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clk := &fakeClock{}
			lim := newLimiter(t, c, tc.limit, global.WithAlgorithm(tc.alg), global.WithClock(clk.Now))
			for i, s := range tc.steps {
				clk.Set(t0 + s.at)
				d, err := lim.AllowN(ctx, "k", s.n)
				require.NoError(t, err)
				requireDecision(t, s.want, d, fmt.Sprintf("step %d: AllowN(%d) at +%dus", i, s.n, s.at))
				require.Equal(t, tc.limit, d.Limit)
			}
		})
	}
	requireAllTTL(t, c)
}

// TestDeniedWritesNothing checks that a denied request leaves every key of
// the user key exactly as it was, TTL included.
func TestDeniedWritesNothing(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	for _, alg := range ratelimit.Algorithms() {
		t.Run(alg.String(), func(t *testing.T) {
			clk := &fakeClock{}
			clk.Set(t0 + 2*sec)
			prefix := uniquePrefix(t)
			lim, err := global.New(c, ratelimit.Limit{Rate: 2, Period: 10 * time.Second}, global.WithPrefix(prefix),
				global.WithAlgorithm(alg), global.WithClock(clk.Now))
			require.NoError(t, err)
			d, err := lim.AllowN(ctx, "k", 2)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			dump := func() map[string]string {
				keys, err := c.Keys(ctx, prefix+":*").Result()
				require.NoError(t, err)
				m := map[string]string{}
				for _, k := range keys {
					v, err := c.Dump(ctx, k).Result()
					require.NoError(t, err)
					at, err := c.PExpireTime(ctx, k).Result()
					require.NoError(t, err)
					m[k] = v + "@" + at.String()
				}
				return m
			}
			before := dump()
			require.NotEmpty(t, before)
			clk.Add(time.Millisecond)
			d, err = lim.Allow(ctx, "k")
			require.NoError(t, err)
			require.False(t, d.Allowed)
			require.Equal(t, before, dump())
		})
	}
}

// TestExpiry checks the PEXPIRE of every key against the table of
// docs/algorithms.md (ms rounded up, plus 1000 ms grace).
func TestExpiry(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	limit := ratelimit.Limit{Rate: 4, Period: 10 * time.Second, Burst: 8}
	cases := []struct {
		alg    ratelimit.Algorithm
		n      int
		suffix []string
		ttlMS  int64
	}{
		{ratelimit.FixedWindow, 1, []string{fmt.Sprintf("fw:4:%d", t0/(10*sec))}, 7501 + 1000},    // ws + P - now = 7500.5ms
		{ratelimit.SlidingWindow, 1, []string{fmt.Sprintf("sw:4:%d", t0/(10*sec))}, 17501 + 1000}, // ws + 2P - now
		{ratelimit.SlidingLog, 1, []string{"sl:4:10000000", "sl:4:10000000:seq"}, 10000 + 1000},   // P
		{ratelimit.TokenBucket, 3, []string{"tb:4:10000000:8"}, 7500 + 1000},                      // 3 tokens at 0.4/s = 7.5s
		{ratelimit.GCRA, 3, []string{"gcra:4:10000000:8"}, 7500 + 1000},                           // tat - now = 3 x 2.5s
	}
	for _, tc := range cases {
		t.Run(tc.alg.String(), func(t *testing.T) {
			clk := &fakeClock{}
			clk.Set(t0 + 2*sec + 499500)
			prefix := uniquePrefix(t)
			lim, err := global.New(c, limit, global.WithPrefix(prefix), global.WithAlgorithm(tc.alg), global.WithClock(clk.Now))
			require.NoError(t, err)
			d, err := lim.AllowN(ctx, "k", tc.n)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			keys, err := c.Keys(ctx, prefix+":*").Result()
			require.NoError(t, err)
			require.Len(t, keys, len(tc.suffix), "%v", keys)
			for _, s := range tc.suffix {
				ttl, err := c.PTTL(ctx, prefix+":{k}:"+s).Result()
				require.NoError(t, err)
				require.LessOrEqual(t, ttl, time.Duration(tc.ttlMS)*time.Millisecond, s)
				require.Greater(t, ttl, time.Duration(tc.ttlMS-500)*time.Millisecond, s)
			}
		})
	}
}

// TestGCRALongTolerance checks that a theoretical arrival time beyond 2^53
// microseconds (not exact as a Lua double) is stored exactly, in decimal.
func TestGCRALongTolerance(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	clk := &fakeClock{}
	clk.Set(t0 + 3)
	prefix := uniquePrefix(t)
	l, err := global.New(c, ratelimit.Limit{Rate: 1, Period: 24 * time.Hour, Burst: 100_000},
		global.WithAlgorithm(ratelimit.GCRA), global.WithPrefix(prefix), global.WithClock(clk.Now))
	require.NoError(t, err)
	d, err := l.AllowN(ctx, "k", 99_999)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	tat := t0 + 3 + 99_999*86_400_000_000
	require.Greater(t, tat, int64(1)<<53)
	got, err := c.Get(ctx, prefix+":{k}:gcra:1:86400000000:100000").Result()
	require.NoError(t, err)
	require.Equal(t, strconv.FormatInt(tat, 10), got)
}
