package global_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/hybridlimit/ratelimit/internal/script"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestNewRejectsBadInput(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ok := ratelimit.PerSecond(10)
	cases := []struct {
		name   string
		client redis.UniversalClient
		limit  ratelimit.Limit
		opts   []global.Option
		err    error
	}{
		{"zero limit", c, ratelimit.Limit{}, nil, ratelimit.ErrInvalidLimit},
		{"negative rate", c, ratelimit.Limit{Rate: -1, Period: time.Second}, nil, ratelimit.ErrInvalidLimit},
		{"negative burst", c, ratelimit.Limit{Rate: 1, Period: time.Second, Burst: -1}, nil, ratelimit.ErrInvalidLimit},
		{"short period", c, ratelimit.Limit{Rate: 1, Period: time.Microsecond}, nil, ratelimit.ErrInvalidLimit},
		{"too large", c, ratelimit.Limit{Rate: 1 << 40, Period: time.Hour}, []global.Option{global.WithAlgorithm(ratelimit.SlidingWindow)}, ratelimit.ErrInvalidLimit},
		{"fixed window rate above 2^53", c, ratelimit.Limit{Rate: 1<<53 + 1, Period: time.Second}, nil, ratelimit.ErrInvalidLimit},
		{"burst too large", c, ratelimit.Limit{Rate: 1, Period: time.Hour, Burst: 1 << 40}, []global.Option{global.WithAlgorithm(ratelimit.TokenBucket)}, ratelimit.ErrInvalidLimit},
		{"GCRA rate above period us", c, ratelimit.Limit{Rate: 1001, Period: time.Millisecond}, []global.Option{global.WithAlgorithm(ratelimit.GCRA)}, ratelimit.ErrInvalidLimit},
		{"nil client", nil, ok, nil, ratelimit.ErrInvalidOption},
		{"typed nil client", (*redis.Client)(nil), ok, nil, ratelimit.ErrInvalidOption},
		{"typed nil cluster client", (*redis.ClusterClient)(nil), ok, nil, ratelimit.ErrInvalidOption},
		{"invalid algorithm", c, ok, []global.Option{global.WithAlgorithm(ratelimit.Algorithm(99))}, ratelimit.ErrInvalidAlgorithm},
		{"negative algorithm", c, ok, []global.Option{global.WithAlgorithm(ratelimit.Algorithm(-1))}, ratelimit.ErrInvalidAlgorithm},
		{"empty prefix", c, ok, []global.Option{global.WithPrefix("")}, ratelimit.ErrInvalidOption},
		{"prefix with brace", c, ok, []global.Option{global.WithPrefix("a{b}")}, ratelimit.ErrInvalidOption},
		{"bad option after a nil one", c, ok, []global.Option{nil, global.WithPrefix("")}, ratelimit.ErrInvalidOption},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.NotPanics(t, func() {
				l, err := global.New(tc.client, tc.limit, tc.opts...)
				require.ErrorIs(t, err, tc.err)
				require.Nil(t, l)
			})
		})
	}
	// A nil Option is ignored, as in packages local, hybrid and sync.
	l, err := global.New(c, ok, nil, global.WithPrefix(uniquePrefix(t)), nil)
	require.NoError(t, err)
	require.NotNil(t, l)
	// GCRA at exactly one microsecond per event is fine.
	_, err = global.New(c, ratelimit.Limit{Rate: 1000, Period: time.Millisecond}, global.WithAlgorithm(ratelimit.GCRA))
	require.NoError(t, err)
}

func TestAllowNRejectsBadInput(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	for _, alg := range ratelimit.Algorithms() {
		t.Run(alg.String(), func(t *testing.T) {
			limit := ratelimit.Limit{Rate: 5, Period: time.Second, Burst: 8}
			capacity := 5
			if !alg.IsWindow() {
				capacity = 8
			}
			prefix := uniquePrefix(t)
			l, err := global.New(c, limit, global.WithAlgorithm(alg), global.WithPrefix(prefix))
			require.NoError(t, err)
			require.Equal(t, limit, l.Limit())
			require.Equal(t, alg, l.Algorithm())
			for _, tc := range []struct {
				key string
				n   int
				err error
			}{
				{"", 1, ratelimit.ErrInvalidKey},
				{"k", 0, ratelimit.ErrInvalidN},
				{"k", -1, ratelimit.ErrInvalidN},
				{"k", capacity + 1, ratelimit.ErrInvalidN},
			} {
				require.NotPanics(t, func() {
					d, err := l.AllowN(ctx, tc.key, tc.n)
					require.ErrorIs(t, err, tc.err, "key %q n %d", tc.key, tc.n)
					require.Equal(t, ratelimit.Decision{}, d)
				})
			}
			_, err = l.Allow(ctx, "")
			require.ErrorIs(t, err, ratelimit.ErrInvalidKey)
			n, err := c.Keys(ctx, prefix+":*").Result()
			require.NoError(t, err)
			require.Empty(t, n, "bad input reached Redis")
			d, err := l.AllowN(ctx, "k", capacity)
			require.NoError(t, err)
			require.True(t, d.Allowed)
		})
	}
}

// TestHostileKeys checks that a 10 KB key and a key full of braces never
// reach Redis verbatim: their state lives under the hashed tag.
func TestHostileKeys(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	cl := redistest.NewCluster(t)
	cc := cl.Client()
	defer cc.Close()
	ctx := context.Background()
	keys := []string{strings.Repeat("x", 10<<10), "{{}}{a}{", "#not-a-hash", "}"}
	for _, client := range []redis.UniversalClient{c, cc} {
		for _, alg := range ratelimit.Algorithms() {
			prefix := uniquePrefix(t)
			l, err := global.New(client, ratelimit.PerMinute(10), global.WithAlgorithm(alg), global.WithPrefix(prefix))
			require.NoError(t, err)
			for _, k := range keys {
				d, err := l.Allow(ctx, k)
				require.NoError(t, err)
				require.True(t, d.Allowed)
			}
			var found []string
			scan := func(ctx context.Context, m *redis.Client) error {
				it := m.Scan(ctx, 0, prefix+":*", 100).Iterator()
				for it.Next(ctx) {
					found = append(found, it.Val())
				}
				return it.Err()
			}
			if cc, ok := client.(*redis.ClusterClient); ok {
				var mu sync.Mutex
				require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
					mu.Lock()
					defer mu.Unlock()
					return scan(ctx, m)
				}))
			} else {
				require.NoError(t, scan(ctx, client.(*redis.Client)))
			}
			require.NotEmpty(t, found)
			for _, rk := range found {
				require.Less(t, len(rk), 200, "a raw key reached Redis: %.80q", rk)
				hashed := false
				for _, k := range keys {
					require.NotContains(t, rk, "{"+k+"}")
					tag := script.HashTag(k)
					require.NotEqual(t, k, tag)
					if strings.HasPrefix(rk, prefix+":{"+tag+"}:") {
						hashed = true
					}
				}
				require.True(t, hashed, "key %q is not under a hashed tag", rk)
				require.Equal(t, 2, strings.Count(rk, "{")+strings.Count(rk, "}"), rk)
			}
		}
	}
	requireAllTTL(t, c)
	requireAllTTL(t, cc)
}

// TestScriptFlush checks that a SCRIPT FLUSH between two calls is harmless:
// EVALSHA fails with NOSCRIPT and the call falls back to EVAL.
func TestScriptFlush(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	cl := redistest.NewCluster(t)
	cc := cl.Client()
	defer cc.Close()
	ctx := context.Background()
	flush := map[string]func() error{
		"standalone": func() error { return c.ScriptFlush(ctx).Err() },
		"cluster": func() error {
			return cc.ForEachShard(ctx, func(ctx context.Context, m *redis.Client) error { return m.ScriptFlush(ctx).Err() })
		},
	}
	for name, client := range map[string]redis.UniversalClient{"standalone": c, "cluster": cc} {
		for _, alg := range ratelimit.Algorithms() {
			l, err := global.New(client, ratelimit.PerMinute(3), global.WithAlgorithm(alg), global.WithPrefix(uniquePrefix(t)))
			require.NoError(t, err)
			for i := 0; i < 4; i++ {
				d, err := l.Allow(ctx, "k")
				require.NoError(t, err, "%s %v call %d", name, alg, i)
				require.Equal(t, i < 3, d.Allowed, "%s %v call %d", name, alg, i)
				require.NoError(t, flush[name]())
			}
		}
	}
	requireAllTTL(t, c)
	requireAllTTL(t, cc)
}

// TestContextCanceled checks that a canceled context is an error, not a
// decision.
func TestContextCanceled(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	l, err := global.New(c, ratelimit.PerSecond(1))
	require.NoError(t, err)
	require.Equal(t, global.DefaultAlgorithm, l.Algorithm())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	d, err := l.Allow(ctx, "k")
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, ratelimit.Decision{}, d)
}

// Limiters of different limits on one prefix never share a counter: the
// limit is part of every state key (internal/script.Kind), so a paid tier
// of 1000 a minute and a free one of 5 count apart, while limiters of the
// same limit, global or hybrid, share one.
func TestLimitsNeverShareByMistake(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	for _, alg := range ratelimit.Algorithms() {
		t.Run(alg.String(), func(t *testing.T) {
			prefix := uniquePrefix(t)
			paid, err := global.New(c, ratelimit.PerMinute(1000), global.WithPrefix(prefix), global.WithAlgorithm(alg))
			require.NoError(t, err)
			free, err := global.New(c, ratelimit.PerMinute(5), global.WithPrefix(prefix), global.WithAlgorithm(alg))
			require.NoError(t, err)
			for i := 0; i < 50; i++ {
				d, err := paid.Allow(ctx, "user")
				require.NoError(t, err)
				require.True(t, d.Allowed)
			}
			for i := 0; i < 5; i++ {
				d, err := free.Allow(ctx, "user")
				require.NoError(t, err)
				require.True(t, d.Allowed, "the free tier's %dth request: the paid tier's use must not count", i+1)
			}
			d, err := free.Allow(ctx, "user")
			require.NoError(t, err)
			require.False(t, d.Allowed)
			same, err := global.New(c, ratelimit.PerMinute(5), global.WithPrefix(prefix), global.WithAlgorithm(alg))
			require.NoError(t, err)
			d, err = same.Allow(ctx, "user")
			require.NoError(t, err)
			require.False(t, d.Allowed, "a limiter of the same limit shares the free tier's state")
		})
	}
}

// TestFixedWindowBeyondMicrosecondProducts: a FixedWindow counts whole
// events against Rate and never weighs them in microseconds, so Rate x
// Period may pass 2^53 (1,000,000 a day; 4,294,967,295 a year, the most a
// uint32 limit holds) and is still counted exactly in Redis.
func TestFixedWindowBeyondMicrosecondProducts(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	for i, limit := range []ratelimit.Limit{{Rate: 1_000_000, Period: 24 * time.Hour}, {Rate: 1<<32 - 1, Period: 365 * 24 * time.Hour}} {
		require.ErrorIs(t, limit.Validate(), ratelimit.ErrInvalidLimit, "beyond what the other algorithms take")
		_, err := global.New(c, limit, global.WithAlgorithm(ratelimit.SlidingWindow))
		require.ErrorIs(t, err, ratelimit.ErrInvalidLimit)
		l, err := global.New(c, limit, global.WithPrefix("big"+strconv.Itoa(i)))
		require.NoError(t, err, "%v", limit)
		d, err := l.AllowN(ctx, "k", limit.Rate-1)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		require.Equal(t, 1, d.Remaining)
		d, err = l.AllowN(ctx, "k", 2)
		require.NoError(t, err)
		require.False(t, d.Allowed, "two more than the one left")
		require.Equal(t, 1, d.Remaining)
		require.Positive(t, d.RetryAfter)
		require.LessOrEqual(t, d.RetryAfter, limit.Period)
		d, err = l.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, d.Allowed)
		require.Zero(t, d.Remaining)
		r, err := l.Reserve(ctx, "k", 1)
		require.NoError(t, err)
		require.False(t, r.OK(), "the window is full")
	}
}
