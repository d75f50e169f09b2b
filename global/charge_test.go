package global

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/hybridlimit/ratelimit/internal/script"
)

// What a FailLocal limiter admitted without Redis goes in with its next
// script call, before the decision, only to a window that is still the
// current one, and the reply says which charges were applied: a window's
// counter and a bucket take it, a SlidingLog does not; a window that has
// ended is left alone.
func TestCharges(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	limits := []ratelimit.Limit{ratelimit.PerSecond(10), ratelimit.PerMinute(10),
		{Rate: 10, Period: time.Second, Burst: 10}, ratelimit.PerHour(10)}
	algs := []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingWindow, ratelimit.TokenBucket, ratelimit.SlidingLog}
	s := newLimitSet(limits, algs, true)
	base := "charge:{k}:"
	now := int64(100_500_000) // 100.5s: second 100, minute 1
	d, _, charged, err := s.take(ctx, c, base, now, 1, nil, []int64{100, 3, 1, 4, 0, 2, 0, 5})
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.Equal(t, uint16(0b0111), charged, "the windows' and the bucket's charges applied, not the log's")
	count := func(alg ratelimit.Algorithm, l ratelimit.Limit, idx int64) int {
		n, err := c.Get(ctx, script.WindowKey(base, script.Kind(alg, l), idx)).Int()
		require.NoError(t, err)
		return n
	}
	require.Equal(t, 3+1, count(algs[0], limits[0], 100))
	require.Equal(t, 4+1, count(algs[1], limits[1], 1))
	ls := d.Limits()
	require.Equal(t, 10-2-1, ls[2].Remaining, "the bucket")
	require.Equal(t, 10-1, ls[3].Remaining, "the log")
	ttl, err := c.PTTL(ctx, script.WindowKey(base, script.Kind(algs[1], limits[1]), 1)).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, 60*time.Second, "a SlidingWindow's counter outlives its window")

	// A second later: the second's window has ended, the minute's has not.
	_, _, charged, err = s.take(ctx, c, base, now+time.Second.Microseconds(), 1, nil, []int64{100, 3, 1, 2, 0, 0, 0, 0})
	require.NoError(t, err)
	require.Equal(t, uint16(0b0010), charged, "only the minute's window is still the current one")
	require.Equal(t, 4, count(algs[0], limits[0], 100), "an ended window is not charged")
	require.Equal(t, 1, count(algs[0], limits[0], 101))
	require.Equal(t, 4+1+2+1, count(algs[1], limits[1], 1))

	// A SlidingWindow Limiter's script takes a charge the same way.
	sw := scripts[ratelimit.SlidingWindow]
	kind := script.Kind(ratelimit.SlidingWindow, limits[0])
	res, err := sw.Run(ctx, c, []string{base}, now, 1, 10, int64(time.Second/time.Microsecond), kind, 100, 6).Int64Slice()
	require.NoError(t, err)
	require.Equal(t, []int64{1, 3, 0, 500_000, 1}, res, "charged 6, then admitted 1")
	res, err = sw.Run(ctx, c, []string{base}, now, 1, 10, int64(time.Second/time.Microsecond), kind, 99, 6).Int64Slice()
	require.NoError(t, err)
	require.Equal(t, []int64{1, 2, 0, 500_000, 0}, res, "an ended window is not charged")
	res, err = sw.Run(ctx, c, []string{base}, now, 1, 10, int64(time.Second/time.Microsecond), kind).Int64Slice()
	require.NoError(t, err)
	require.Len(t, res, 4, "without a charge, the reply as before")
}
