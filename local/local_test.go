package local_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/local"
)

// fakeClock is a settable clock, safe for concurrent use.
type fakeClock struct{ us atomic.Int64 }

// t0 is aligned to every Period used in these tests.
const t0 = int64(1_700_000_000_000_000)

func newClock() *fakeClock { c := &fakeClock{}; c.us.Store(t0); return c }

func (c *fakeClock) Now() time.Time          { return time.UnixMicro(c.us.Load()) }
func (c *fakeClock) Set(d time.Duration)     { c.us.Store(t0 + int64(d/time.Microsecond)) }
func (c *fakeClock) Advance(d time.Duration) { c.us.Add(int64(d / time.Microsecond)) }
func (c *fakeClock) SetMicro(offset int64)   { c.us.Store(t0 + offset) }
func ms(n int64) time.Duration               { return time.Duration(n) * time.Millisecond }
func usd(n int64) time.Duration              { return time.Duration(n) * time.Microsecond }
func newLim(t *testing.T, l ratelimit.Limit, a ratelimit.Algorithm, c *fakeClock, opts ...local.Option) *local.Limiter {
	t.Helper()
	lim, err := local.New(l, append([]local.Option{local.WithAlgorithm(a), local.WithClock(c.Now)}, opts...)...)
	require.NoError(t, err)
	return lim
}

// step is one request at offset at from t0 and the decision expected.
type step struct {
	at        time.Duration
	key       string
	n         int
	allowed   bool
	remaining int
	retry     time.Duration
	reset     time.Duration
}

func run(t *testing.T, lim *local.Limiter, c *fakeClock, steps []step) {
	t.Helper()
	for i, s := range steps {
		c.Set(s.at)
		key := s.key
		if key == "" {
			key = "k"
		}
		d, err := lim.AllowN(context.Background(), key, s.n)
		require.NoError(t, err, "step %d", i)
		want := ratelimit.Decision{Allowed: s.allowed, Limit: lim.Limit(), Algorithm: lim.Algorithm(), Remaining: s.remaining, RetryAfter: s.retry, ResetAfter: s.reset}
		require.Equal(t, want, d, "step %d: %+v", i, s)
	}
}

func TestFixedWindow(t *testing.T) {
	c := newClock()
	lim := newLim(t, ratelimit.PerSecond(3), ratelimit.FixedWindow, c)
	run(t, lim, c, []step{
		{at: ms(900), n: 1, allowed: true, remaining: 2, reset: ms(100)},
		{at: ms(900), n: 1, allowed: true, remaining: 1, reset: ms(100)},
		{at: ms(950), n: 2, allowed: false, remaining: 1, retry: ms(50), reset: ms(50)}, // all or nothing
		{at: ms(950), n: 1, allowed: true, remaining: 0, reset: ms(50)},
		{at: ms(999), n: 1, allowed: false, remaining: 0, retry: ms(1), reset: ms(1)},
		// boundary burst: a full window again right after the boundary
		{at: ms(1000), n: 3, allowed: true, remaining: 0, reset: ms(1000)},
		{at: ms(1001), n: 1, allowed: false, remaining: 0, retry: ms(999), reset: ms(999)},
		{at: ms(1000) + usd(999_999), n: 1, allowed: false, remaining: 0, retry: usd(1), reset: usd(1)},
		{at: ms(5000), n: 1, allowed: true, remaining: 2, reset: ms(1000)},
		// other keys are independent
		{at: ms(5000), key: "other", n: 3, allowed: true, remaining: 0, reset: ms(1000)},
	})
}

func TestSlidingWindow(t *testing.T) {
	c := newClock()
	lim := newLim(t, ratelimit.PerSecond(10), ratelimit.SlidingWindow, c)
	run(t, lim, c, []step{
		{at: ms(500), n: 8, allowed: true, remaining: 2, reset: ms(500)},
		// e = 250ms: est = floor(8*750000/1e6) + 0 = 6
		{at: ms(1250), n: 4, allowed: true, remaining: 0, reset: ms(750)},
		// room = 10-4-1 = 5: first(8, 5) = 1e6 - ceil(6e6/8) + 1 = 250001; minus e
		{at: ms(1250), n: 1, allowed: false, remaining: 0, retry: usd(1), reset: ms(750)},
		// room = 10-4-7 < 0: (P-e) + first(4, 3) = 750000 + (1e6 - 1e6 + 1)
		{at: ms(1250), n: 7, allowed: false, remaining: 0, retry: usd(750_001), reset: ms(750)},
		// one µs later the weighted previous window is floor(8*749999/1e6) = 5
		{at: ms(1250) + usd(1), n: 1, allowed: true, remaining: 0, reset: ms(750) - usd(1)},
		// e = 600ms: floor(8*400000/1e6) = 3, + curr 5 = 8
		{at: ms(1600), n: 1, allowed: true, remaining: 1, reset: ms(400)},
		// next window: prev = 6, e = 100ms: floor(6*0.9) = 5
		{at: ms(2100), n: 5, allowed: true, remaining: 0, reset: ms(900)},
		// room = 10-5-1 = 4: first(6, 4) = 1e6 - ceil(5e6/6) + 1 = 166667; minus 100000
		{at: ms(2100), n: 1, allowed: false, remaining: 0, retry: usd(66_667), reset: ms(900)},
		// two windows later nothing counts
		{at: ms(4000), n: 10, allowed: true, remaining: 0, reset: ms(1000)},
	})
}

func TestSlidingLog(t *testing.T) {
	c := newClock()
	lim := newLim(t, ratelimit.PerSecond(3), ratelimit.SlidingLog, c)
	run(t, lim, c, []step{
		{at: ms(100), n: 1, allowed: true, remaining: 2, reset: ms(1000)},
		{at: ms(200), n: 1, allowed: true, remaining: 1, reset: ms(1000)},
		{at: ms(300), n: 1, allowed: true, remaining: 0, reset: ms(1000)},
		// the oldest entry (100ms) leaves at 1100ms
		{at: ms(400), n: 1, allowed: false, remaining: 0, retry: ms(700), reset: ms(900)},
		// two must leave: the second oldest (200ms) leaves at 1200ms
		{at: ms(400), n: 2, allowed: false, remaining: 0, retry: ms(800), reset: ms(900)},
		// exact: the entry at 100ms is in the window while t > now - P
		{at: ms(1100) - usd(1), n: 1, allowed: false, remaining: 0, retry: usd(1), reset: ms(200) + usd(1)},
		{at: ms(1100), n: 1, allowed: true, remaining: 0, reset: ms(1000)},
		{at: ms(2150), n: 1, allowed: true, remaining: 2, reset: ms(1000)}, // 1100 left at 2100
		{at: ms(5000), n: 3, allowed: true, remaining: 0, reset: ms(1000)},
		{at: ms(6000), n: 2, allowed: true, remaining: 1, reset: ms(1000)},
	})
}

func TestTokenBucket(t *testing.T) {
	c := newClock()
	lim := newLim(t, ratelimit.Limit{Rate: 10, Period: time.Second, Burst: 5}, ratelimit.TokenBucket, c)
	run(t, lim, c, []step{
		{at: 0, n: 5, allowed: true, remaining: 0, reset: ms(500)},
		{at: 0, n: 1, allowed: false, remaining: 0, retry: ms(100), reset: ms(500)},
		// refill 150ms * 10/s = 1.5 tokens
		{at: ms(150), n: 2, allowed: false, remaining: 1, retry: ms(50), reset: ms(350)},
		{at: ms(150), n: 1, allowed: true, remaining: 0, reset: ms(450)},
		{at: ms(150), n: 1, allowed: false, remaining: 0, retry: ms(50), reset: ms(450)},
		{at: ms(200), n: 1, allowed: true, remaining: 0, reset: ms(500)},
		// 1µs of refill is 10 units of 1e6 per token: the retry rounds up
		{at: ms(200) + usd(1), n: 1, allowed: false, remaining: 0, retry: ms(100) - usd(1), reset: ms(500) - usd(1)},
		// long idle: full, never more than Burst
		{at: ms(10_000), n: 1, allowed: true, remaining: 4, reset: ms(100)},
		{at: ms(10_000), n: 4, allowed: true, remaining: 0, reset: ms(500)},
	})
}

func TestGCRA(t *testing.T) {
	c := newClock()
	lim := newLim(t, ratelimit.Limit{Rate: 10, Period: time.Second, Burst: 5}, ratelimit.GCRA, c)
	// T = 100ms, tau = 500ms
	run(t, lim, c, []step{
		{at: 0, n: 5, allowed: true, remaining: 0, reset: ms(500)},
		{at: 0, n: 1, allowed: false, remaining: 0, retry: ms(100), reset: ms(500)},
		{at: ms(100), n: 1, allowed: true, remaining: 0, reset: ms(500)},
		{at: ms(250), n: 1, allowed: true, remaining: 0, reset: ms(450)},
		{at: ms(250), n: 1, allowed: false, remaining: 0, retry: ms(50), reset: ms(450)},
		{at: ms(250), n: 3, allowed: false, remaining: 0, retry: ms(250), reset: ms(450)},
		{at: ms(500), n: 2, allowed: true, remaining: 1, reset: ms(400)},
		{at: ms(5000), n: 1, allowed: true, remaining: 4, reset: ms(100)},
	})

	// Emission interval truncated to whole µs: 3 per second, T = 333333µs.
	c2 := newClock()
	lim3 := newLim(t, ratelimit.Limit{Rate: 3, Period: time.Second, Burst: 1}, ratelimit.GCRA, c2)
	run(t, lim3, c2, []step{
		{at: 0, n: 1, allowed: true, remaining: 0, reset: usd(333_333)},
		{at: usd(333_332), n: 1, allowed: false, remaining: 0, retry: usd(1), reset: usd(1)},
		{at: usd(333_333), n: 1, allowed: true, remaining: 0, reset: usd(333_333)},
	})
}

// Every algorithm admits n events all-or-nothing: a denied AllowN consumes
// nothing, so a smaller request right after it still fits.
func TestAllowNAllOrNothing(t *testing.T) {
	for _, a := range ratelimit.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			c := newClock()
			lim := newLim(t, ratelimit.PerHour(5), a, c)
			ctx := context.Background()
			d, err := lim.AllowN(ctx, "k", 4)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			require.Equal(t, 1, d.Remaining)
			for i := 0; i < 3; i++ {
				d, err = lim.AllowN(ctx, "k", 2)
				require.NoError(t, err)
				require.False(t, d.Allowed)
				require.Equal(t, 1, d.Remaining)
				require.Positive(t, d.RetryAfter)
			}
			d, err = lim.AllowN(ctx, "k", 1)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			require.Equal(t, 0, d.Remaining)
			require.Zero(t, d.RetryAfter)
		})
	}
}

// 100 goroutines hammering one key are admitted exactly the limit.
func TestConcurrentOneKey(t *testing.T) {
	for _, a := range ratelimit.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			c := newClock() // time stands still: no refill, no window roll
			lim := newLim(t, ratelimit.Limit{Rate: 500, Period: time.Hour}, a, c)
			var allowed atomic.Int64
			var wg sync.WaitGroup
			for g := 0; g < 100; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 20; i++ {
						d, err := lim.Allow(context.Background(), "hot")
						if err != nil {
							t.Error(err)
							return
						}
						if d.Allowed {
							allowed.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			require.EqualValues(t, 500, allowed.Load())
		})
	}
}

func TestNewErrors(t *testing.T) {
	cases := []struct {
		name  string
		limit ratelimit.Limit
		opts  []local.Option
		want  error
	}{
		{"zero limit", ratelimit.Limit{}, nil, ratelimit.ErrInvalidLimit},
		{"negative rate", ratelimit.Limit{Rate: -1, Period: time.Second}, nil, ratelimit.ErrInvalidLimit},
		{"short period", ratelimit.Limit{Rate: 1, Period: time.Microsecond}, nil, ratelimit.ErrInvalidLimit},
		{"negative burst", ratelimit.Limit{Rate: 1, Period: time.Second, Burst: -1}, nil, ratelimit.ErrInvalidLimit},
		{"too large", ratelimit.Limit{Rate: 1 << 40, Period: time.Hour},
			[]local.Option{local.WithAlgorithm(ratelimit.SlidingWindow)}, ratelimit.ErrInvalidLimit},
		{"fixed window rate above 2^53", ratelimit.Limit{Rate: 1<<53 + 1, Period: time.Second}, nil, ratelimit.ErrInvalidLimit},
		{"gcra period below rate", ratelimit.Limit{Rate: 2000, Period: time.Millisecond},
			[]local.Option{local.WithAlgorithm(ratelimit.GCRA)}, ratelimit.ErrInvalidLimit},
		{"unknown algorithm", ratelimit.PerSecond(1), []local.Option{local.WithAlgorithm(ratelimit.Algorithm(42))}, ratelimit.ErrInvalidAlgorithm},
		{"negative algorithm", ratelimit.PerSecond(1), []local.Option{local.WithAlgorithm(-1)}, ratelimit.ErrInvalidAlgorithm},
		{"negative max keys", ratelimit.PerSecond(1), []local.Option{local.WithMaxKeys(-3)}, ratelimit.ErrInvalidOption},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lim, err := local.New(tc.limit, tc.opts...)
			require.ErrorIs(t, err, tc.want)
			require.Nil(t, lim)
		})
	}
	// The same GCRA limit is fine for the window algorithms and at P == R µs.
	_, err := local.New(ratelimit.Limit{Rate: 2000, Period: time.Millisecond})
	require.NoError(t, err)
	_, err = local.New(ratelimit.Limit{Rate: 1000, Period: time.Millisecond}, local.WithAlgorithm(ratelimit.GCRA))
	require.NoError(t, err)
}

// TestFixedWindowBeyondMicrosecondProducts: a FixedWindow never weighs
// events in microseconds, so Rate x Period may pass 2^53 (4,294,967,295 a
// year, 1,000,000 a day) and is still counted exactly.
func TestFixedWindowBeyondMicrosecondProducts(t *testing.T) {
	year := 365 * 24 * time.Hour
	now := time.Unix(1_700_000_000, 0)
	for _, limit := range []ratelimit.Limit{{Rate: 1<<32 - 1, Period: year}, {Rate: 1_000_000, Period: 24 * time.Hour}} {
		require.ErrorIs(t, limit.Validate(), ratelimit.ErrInvalidLimit, "beyond what the other algorithms take")
		lim, err := local.New(limit, local.WithClock(func() time.Time { return now }))
		require.NoError(t, err, "%v", limit)
		ctx := context.Background()
		d, err := lim.AllowN(ctx, "k", limit.Rate-1)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		require.Equal(t, 1, d.Remaining)
		d, err = lim.AllowN(ctx, "k", 2)
		require.NoError(t, err)
		require.False(t, d.Allowed, "two more than the one left")
		require.Equal(t, 1, d.Remaining)
		d, err = lim.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, d.Allowed)
		require.Zero(t, d.Remaining)
		require.Positive(t, d.ResetAfter)
		require.LessOrEqual(t, d.ResetAfter, limit.Period)
	}
}

func TestAllowNErrors(t *testing.T) {
	for _, a := range ratelimit.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			lim, err := local.New(ratelimit.Limit{Rate: 10, Period: time.Second, Burst: 4}, local.WithAlgorithm(a))
			require.NoError(t, err)
			require.Equal(t, a, lim.Algorithm())
			capacity := 4
			if a.IsWindow() {
				capacity = 10
			}
			ctx := context.Background()
			_, err = lim.Allow(ctx, "")
			require.ErrorIs(t, err, ratelimit.ErrInvalidKey)
			for _, n := range []int{0, -1, -1 << 62, capacity + 1, 1 << 62} {
				d, err := lim.AllowN(ctx, "k", n)
				require.ErrorIs(t, err, ratelimit.ErrInvalidN, "n=%d", n)
				require.False(t, d.Allowed)
			}
			require.Zero(t, lim.Len(), "bad requests create no state")
			d, err := lim.AllowN(ctx, "k", capacity)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			require.Equal(t, 1, lim.Len())
		})
	}
}

func TestDefaults(t *testing.T) {
	lim, err := local.New(ratelimit.PerSecond(5))
	require.NoError(t, err)
	require.Equal(t, ratelimit.FixedWindow, lim.Algorithm(), "the default of every package, so defaults share a quota")
	require.Equal(t, local.DefaultAlgorithm, lim.Algorithm())
	require.Equal(t, ratelimit.PerSecond(5), lim.Limit())
	d, err := lim.Allow(context.Background(), "k")
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.Equal(t, 4, d.Remaining)
	require.Equal(t, ratelimit.PerSecond(5), d.Limit)
	// WithClock(nil) means time.Now, WithMaxKeys(0) the default, and a
	// nil Option is ignored, as in every package
	lim, err = local.New(ratelimit.PerSecond(5), local.WithClock(nil), local.WithMaxKeys(0), nil)
	require.NoError(t, err)
	_, err = lim.Allow(context.Background(), "k")
	require.NoError(t, err)
}

// A key forgotten by the LRU starts afresh, and the bound holds.
func TestLimiterMaxKeys(t *testing.T) {
	c := newClock()
	lim := newLim(t, ratelimit.PerHour(1), ratelimit.FixedWindow, c, local.WithMaxKeys(100))
	ctx := context.Background()
	for i := 0; i < 1000; i++ {
		d, err := lim.Allow(ctx, "k"+strconv.Itoa(i))
		require.NoError(t, err)
		require.True(t, d.Allowed)
		require.LessOrEqual(t, lim.Len(), 100)
	}
	d, err := lim.Allow(ctx, "k0") // long evicted
	require.NoError(t, err)
	require.True(t, d.Allowed)
	d, err = lim.Allow(ctx, "k999") // still tracked
	require.NoError(t, err)
	require.False(t, d.Allowed)
}

func TestDecisionOnExistingKeyDoesNotAllocate(t *testing.T) {
	for _, a := range ratelimit.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			c := newClock()
			lim := newLim(t, ratelimit.Limit{Rate: 100, Period: time.Second, Burst: 10}, a, c)
			ctx := context.Background()
			keys := []string{"a", "b", "c"}
			for _, k := range keys {
				_, err := lim.Allow(ctx, k)
				require.NoError(t, err)
			}
			i := 0
			step := func() {
				c.Advance(time.Millisecond)
				_, _ = lim.Allow(ctx, keys[i%len(keys)])
				i++
			}
			for j := 0; j < 2000; j++ { // SlidingLog: let the rings reach their full size first
				step()
			}
			allocs := testing.AllocsPerRun(1000, func() {
				c.Advance(time.Millisecond)
				_, _ = lim.Allow(ctx, keys[i%len(keys)])
				i++
			})
			require.Zero(t, allocs)
		})
	}
}

func TestErrorsAreWrapped(t *testing.T) {
	_, err := local.New(ratelimit.Limit{Rate: 0, Period: time.Second})
	require.True(t, errors.Is(err, ratelimit.ErrInvalidLimit))
	require.Contains(t, err.Error(), "Rate")
}

// With lazy promotion a key in steady use is still never forgotten, however
// many new keys pass through the table.
func TestLimiterKeepsKeyInUse(t *testing.T) {
	for _, maxKeys := range []int{1, 2, 8, 100, 1000} {
		c := newClock()
		lim := newLim(t, ratelimit.PerHour(1), ratelimit.FixedWindow, c, local.WithMaxKeys(maxKeys))
		ctx := context.Background()
		d, err := lim.Allow(ctx, "hot")
		require.NoError(t, err)
		require.True(t, d.Allowed)
		for i := 0; i < 20*maxKeys+100; i++ {
			if maxKeys > 1 || i%2 == 0 { // a 1-key table holds only the newest key
				d, err = lim.Allow(ctx, "hot")
				require.NoError(t, err)
				require.False(t, d.Allowed, "maxKeys=%d i=%d: the hot key was forgotten", maxKeys, i)
			}
			if maxKeys > 1 {
				_, err = lim.Allow(ctx, "new"+strconv.Itoa(i))
				require.NoError(t, err)
			}
		}
		require.LessOrEqual(t, lim.Len(), maxKeys)
	}
}

// A decision whose clock reading is older than the key's window (it was
// taken before another decision rolled the window, and waited for the
// shard's lock meanwhile) is decided in the key's window: it never rolls
// the window back and forgets its count. Before, 4 goroutines on a
// 1,000/s limit admitted 2,000-3,000 in one second this way.
func TestStaleClockReadingKeepsWindow(t *testing.T) {
	for _, alg := range []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingWindow} {
		t.Run(alg.String(), func(t *testing.T) {
			allow := func(t *testing.T, l *local.Limiter) ratelimit.Decision {
				t.Helper()
				d, err := l.Allow(context.Background(), "k")
				require.NoError(t, err)
				return d
			}
			clk := newClock()
			l, err := local.New(ratelimit.Limit{Rate: 2, Period: time.Second}, local.WithAlgorithm(alg), local.WithClock(clk.Now))
			require.NoError(t, err)
			clk.Set(1500 * time.Millisecond)
			require.True(t, allow(t, l).Allowed)
			require.True(t, allow(t, l).Allowed)
			clk.Set(900 * time.Millisecond) // a reading from before the roll
			d := allow(t, l)
			require.False(t, d.Allowed, "decided in the key's window, which is full")
			require.LessOrEqual(t, d.ResetAfter, time.Second)
			clk.Set(1600 * time.Millisecond)
			require.False(t, allow(t, l).Allowed, "the window's count kept")
		})
	}
}
