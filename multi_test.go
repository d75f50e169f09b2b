package ratelimit_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
)

func TestCombineAllowedTightest(t *testing.T) {
	sec, minute, day := ratelimit.PerSecond(10), ratelimit.PerMinute(100), ratelimit.Limit{Rate: 1000, Period: 24 * time.Hour}
	states := []ratelimit.LimitState{
		{Limit: sec, Algorithm: ratelimit.TokenBucket, Allowed: true, Remaining: 9, ResetAfter: 100 * time.Millisecond},
		{Limit: minute, Algorithm: ratelimit.FixedWindow, Allowed: true, Remaining: 3, ResetAfter: 20 * time.Second},
		{Limit: day, Algorithm: ratelimit.FixedWindow, Allowed: true, Remaining: 3, ResetAfter: time.Hour},
	}
	d := ratelimit.Combine(&states)
	require.True(t, d.Allowed)
	// Least Remaining; of the two with 3, the one that resets later.
	require.Equal(t, day, d.Limit)
	require.Equal(t, ratelimit.FixedWindow, d.Algorithm, "the tightest limit's algorithm")
	require.Equal(t, 3, d.Remaining)
	require.Equal(t, time.Hour, d.ResetAfter)
	require.Zero(t, d.RetryAfter)
	require.Len(t, d.Limits(), 3)
	require.Same(t, &states[0], &d.Limits()[0], "Limits is states itself")
	require.Nil(t, ratelimit.Decision{}.Limits(), "a single limit's decision lists none")
}

func TestCombineDeniedLatestRetry(t *testing.T) {
	a, b, c := ratelimit.PerSecond(10), ratelimit.PerMinute(100), ratelimit.PerHour(1000)
	d := ratelimit.Combine(&[]ratelimit.LimitState{
		{Limit: a, Allowed: false, Remaining: 0, RetryAfter: 300 * time.Millisecond, ResetAfter: time.Second},
		// Allowed limits never describe a denial, even with less Remaining.
		{Limit: b, Allowed: true, Remaining: 0, ResetAfter: 50 * time.Second},
		{Limit: c, Allowed: false, Remaining: 2, RetryAfter: 40 * time.Minute, ResetAfter: 40 * time.Minute},
	})
	require.False(t, d.Allowed)
	require.Equal(t, c, d.Limit)
	require.Equal(t, 40*time.Minute, d.RetryAfter)
	require.Equal(t, 2, d.Remaining)

	// Equal RetryAfter: less Remaining wins, then the later reset, then the first.
	d = ratelimit.Combine(&[]ratelimit.LimitState{
		{Limit: a, RetryAfter: time.Second, Remaining: 1, ResetAfter: time.Second},
		{Limit: b, RetryAfter: time.Second, Remaining: 0, ResetAfter: time.Second},
		{Limit: c, RetryAfter: time.Second, Remaining: 0, ResetAfter: time.Minute},
	})
	require.Equal(t, c, d.Limit)
	d = ratelimit.Combine(&[]ratelimit.LimitState{
		{Limit: a, RetryAfter: time.Second},
		{Limit: b, RetryAfter: time.Second},
	})
	require.Equal(t, a, d.Limit)

	require.Equal(t, ratelimit.Decision{}, ratelimit.Combine(nil))
	require.Equal(t, ratelimit.Decision{}, ratelimit.Combine(&[]ratelimit.LimitState{}))
}

// sink keeps the benchmark's decisions alive.
var sink ratelimit.Decision

//go:noinline
func decision(i int) ratelimit.Decision {
	return ratelimit.Decision{Allowed: i > 0, Limit: ratelimit.PerSecond(i), Algorithm: ratelimit.GCRA,
		Remaining: i, RetryAfter: time.Duration(i), ResetAfter: time.Duration(i)}
}

// BenchmarkDecisionReturn measures returning a Decision from a call, which
// every decision of every limiter does, often through several calls: a
// Decision of nine words stays in registers.
func BenchmarkDecisionReturn(b *testing.B) {
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		sink = decision(i)
	}
}
