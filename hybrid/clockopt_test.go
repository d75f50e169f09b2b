package hybrid_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// fakeClock is a clock a test moves by hand, safe for concurrent use.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// WithClock drives the hybrid's windows, in memory and in Redis alike: a
// minute passes without sleeping, and a global limiter on the same clock
// counts in the same window.
func TestWithClock(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	clk := &fakeClock{}
	clk.ns.Store(time.Date(2030, 1, 1, 0, 0, 30, 0, time.UTC).UnixNano()) // mid-minute
	limit := ratelimit.PerMinute(5)
	prefix := uniq(t)
	h, err := hybrid.New(c, limit, hybrid.WithPrefix(prefix), hybrid.WithClock(clk.now), hybrid.WithInstances(1))
	require.NoError(t, err)
	defer h.Close()
	g, err := global.New(c, limit, global.WithPrefix(prefix), global.WithClock(clk.now))
	require.NoError(t, err)
	ctx := context.Background()

	for i := 0; i < 2; i++ {
		d, err := g.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	for i := 0; i < 3; i++ {
		d, err := h.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, d.Allowed, "decision %d", i)
		require.Equal(t, 30*time.Second, d.ResetAfter, "the window ends on the test's clock")
	}
	d, err := h.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, d.Allowed, "2 by the global limiter and 3 by the hybrid: the minute is spent")
	require.Equal(t, 30*time.Second, d.RetryAfter)

	clk.advance(30 * time.Second) // the next minute, at once
	for i := 0; i < 5; i++ {
		d, err := h.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, d.Allowed, "decision %d of the next minute", i)
	}
	d, err = g.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, d.Allowed, "the hybrid's 5 count in the global limiter's window")
}

// A FixedWindow limit far above 2^53 microseconds of its period, as
// ratelimitd's configurations hold (4,294,967,295 a year), is valid for
// the hybrid and counts as any other.
func TestLargeFixedWindowLimit(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	limit := ratelimit.Limit{Rate: 4_294_967_295, Period: 365 * 24 * time.Hour}
	require.Error(t, limit.Validate(), "too large for the algorithms that weigh microseconds")
	h, err := hybrid.New(c, limit, hybrid.WithPrefix(uniq(t)))
	require.NoError(t, err)
	defer h.Close()
	for i := 0; i < 5; i++ {
		d, err := h.AllowN(context.Background(), "k", 1000)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		require.Equal(t, limit.Rate-1000*(i+1), d.Remaining)
	}
	_, err = hybrid.New(c, limit, hybrid.WithAlgorithm(ratelimit.SlidingWindow))
	require.ErrorIs(t, err, ratelimit.ErrInvalidLimit)
}
