package global_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// fixedFallback is a fallback limiter for the test: it admits the first
// share requests, then denies.
type fixedFallback struct{ left int }

func (f *fixedFallback) AllowN(_ context.Context, _ string, n int) (ratelimit.Decision, error) {
	if f.left >= n {
		f.left -= n
		return ratelimit.Decision{Allowed: true, Remaining: f.left}, nil
	}
	return ratelimit.Decision{RetryAfter: time.Second, ResetAfter: time.Second}, nil
}

// With a failure mode, a frozen Redis does not hold decisions past the
// timeout nor turn them into errors; the breaker then skips Redis.
func TestFailureModes(t *testing.T) {
	srv := redistest.Standalone(t)
	// ContextTimeoutEnabled: the limiter's timeout is a context deadline.
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer c.Close()
	ctx := context.Background()
	limit := ratelimit.PerMinute(10)

	_, err := global.New(c, limit, global.WithFailureMode(ratelimit.FailLocal))
	require.ErrorIs(t, err, ratelimit.ErrInvalidOption, "FailLocal needs a fallback")
	_, err = global.New(c, limit, global.WithTimeout(time.Second))
	require.ErrorIs(t, err, ratelimit.ErrInvalidOption, "a timeout without a failure mode")

	fb := &fixedFallback{left: 3}
	mk := func(m ratelimit.FailureMode) *global.Limiter {
		l, err := global.New(c, limit, global.WithPrefix("fm"), global.WithFailureMode(m), global.WithFallback(fb),
			global.WithTimeout(50*time.Millisecond), global.WithBreaker(2, time.Hour))
		require.NoError(t, err)
		return l
	}
	open, closed, local := mk(ratelimit.FailOpen), mk(ratelimit.FailClosed), mk(ratelimit.FailLocal)
	d, err := open.Allow(ctx, "k")
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.False(t, open.Degraded())

	require.NoError(t, srv.Freeze())
	defer srv.Thaw()
	for _, tc := range []struct {
		l     *global.Limiter
		allow int
	}{{open, 5}, {closed, 0}, {local, 3}} {
		allowed := 0
		for i := 0; i < 5; i++ {
			start := time.Now()
			d, err := tc.l.Allow(ctx, "k")
			require.NoError(t, err)
			require.Less(t, time.Since(start), time.Second, "a decision waited on a frozen Redis")
			if d.Allowed {
				allowed++
			} else {
				require.Positive(t, d.RetryAfter)
			}
		}
		require.Equal(t, tc.allow, allowed)
		require.True(t, tc.l.Degraded())
		require.EqualValues(t, 5, tc.l.FallbackDecisions())
	}
}
