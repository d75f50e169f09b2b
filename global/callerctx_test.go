package global_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// countingFallback admits everything and counts the calls that reach it.
type countingFallback struct{ calls atomic.Int64 }

func (f *countingFallback) AllowN(context.Context, string, int) (ratelimit.Decision, error) {
	f.calls.Add(1)
	return ratelimit.Decision{Allowed: true}, nil
}

// newBreakerLimiter is a FailLocal limiter whose breaker opens after three
// failures and stays open for an hour: one failure counted against Redis
// too many would show.
func newBreakerLimiter(t *testing.T, c redis.UniversalClient, timeout time.Duration) (*global.Limiter, *countingFallback) {
	t.Helper()
	fb := &countingFallback{}
	lim := newLimiter(t, c, ratelimit.PerMinute(100), global.WithFailureMode(ratelimit.FailLocal), global.WithFallback(fb),
		global.WithTimeout(timeout), global.WithBreaker(3, time.Hour))
	return lim, fb
}

// requireServedByRedis asks for a decision with a live context and requires
// that Redis took it: allowed, counted there, the breaker closed, nothing
// from the fallback.
func requireServedByRedis(t *testing.T, lim *global.Limiter, fb *countingFallback, key string) ratelimit.Decision {
	t.Helper()
	d, err := lim.Allow(context.Background(), key)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.False(t, lim.Degraded(), "the breaker opened")
	require.Zero(t, lim.FallbackDecisions(), "decisions taken without Redis")
	require.Zero(t, fb.calls.Load(), "the fallback decided")
	return d
}

// A caller whose context has already ended gets its context's error, and
// three such calls in a row do not open the breaker: Redis is fine, and the
// next caller is served by it.
func TestExpiredCallerContextIsNotARedisFailure(t *testing.T) {
	srv := redistest.Standalone(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	for name, ended := range map[string]func() context.Context{
		"deadline": func() context.Context {
			ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
			t.Cleanup(cancel)
			return ctx
		},
		"canceled": func() context.Context {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx
		},
	} {
		t.Run(name, func(t *testing.T) {
			lim, fb := newBreakerLimiter(t, c, time.Second)
			for i := 0; i < 3; i++ {
				ctx := ended()
				d, err := lim.Allow(ctx, "k")
				require.Error(t, err, "call %d", i)
				require.True(t, errors.Is(err, ctx.Err()), "call %d: %v is not the context's error", i, err)
				require.Equal(t, ratelimit.Decision{}, d)
			}
			d := requireServedByRedis(t, lim, fb, "k")
			require.Equal(t, 99, d.Remaining, "the ended calls counted nothing in Redis")
		})
	}
}

// A caller's context that ends while its call waits on Redis (frozen here,
// so the call is in flight when it ends) is the caller giving up, not a
// Redis failure either: after three, with Redis thawed, the next caller is
// served by Redis.
//
// go-redis watches a context's deadline, not its cancellation: a call whose
// caller cancels (rather than times out) returns when the limiter's own
// timeout ends it, and even then the caller's cancellation, not Redis, is
// to blame.
func TestCallerContextEndedDuringCall(t *testing.T) {
	srv := redistest.Standalone(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	// The limiter's own timeout is far longer than the callers' deadlines.
	const timeout = time.Second
	lim, fb := newBreakerLimiter(t, c, timeout)
	requireServedByRedis(t, lim, fb, "warm") // the script is loaded, a connection is open

	require.NoError(t, srv.Freeze())
	thawed := false
	defer func() {
		if !thawed {
			srv.Thaw()
		}
	}()
	for i := 0; i < 3; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		want := context.DeadlineExceeded
		if i == 1 { // a cancellation rather than a deadline
			cancel()
			ctx, cancel = context.WithCancel(context.Background())
			time.AfterFunc(50*time.Millisecond, cancel)
			want = context.Canceled
		}
		start := time.Now()
		d, err := lim.Allow(ctx, "k")
		took := time.Since(start)
		cancel()
		require.Error(t, err, "call %d", i)
		require.True(t, errors.Is(err, want), "call %d: %v is not the context's error", i, err)
		require.Equal(t, ratelimit.Decision{}, d)
		require.Less(t, took, timeout+2*time.Second, "call %d outlived the limiter's timeout", i)
		require.False(t, lim.Degraded(), "call %d opened the breaker", i)
	}
	require.NoError(t, srv.Thaw())
	thawed = true
	requireServedByRedis(t, lim, fb, "k2")
}
