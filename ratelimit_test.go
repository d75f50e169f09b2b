package ratelimit_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
)

func TestLimitValidate(t *testing.T) {
	require.NoError(t, ratelimit.PerSecond(10).Validate())
	require.NoError(t, ratelimit.PerHour(2_500_000).Validate())
	for _, l := range []ratelimit.Limit{
		{}, {Rate: -1, Period: time.Second}, {Rate: 1, Period: time.Microsecond * 999},
		{Rate: 1, Period: time.Millisecond + time.Nanosecond}, {Rate: 1, Period: time.Second, Burst: -1},
		{Rate: 1 << 40, Period: time.Hour}, {Rate: 1, Period: time.Hour, Burst: 1 << 40},
	} {
		require.ErrorIs(t, l.Validate(), ratelimit.ErrInvalidLimit, "%+v", l)
	}
	// A FixedWindow needs no Rate x Period product: any Rate up to 2^53.
	year := 365 * 24 * time.Hour
	for _, l := range []ratelimit.Limit{{Rate: 1<<32 - 1, Period: year}, {Rate: 1 << 40, Period: time.Hour}, {Rate: 1 << 53, Period: time.Millisecond, Burst: 1 << 40}} {
		require.ErrorIs(t, l.Validate(), ratelimit.ErrInvalidLimit, "%+v", l)
		require.NoError(t, l.ValidateFor(ratelimit.FixedWindow), "%+v", l)
		for _, a := range ratelimit.Algorithms()[1:] {
			require.ErrorIs(t, l.ValidateFor(a), ratelimit.ErrInvalidLimit, "%+v %v", l, a)
		}
	}
	for _, l := range []ratelimit.Limit{
		{}, {Rate: -1, Period: time.Second}, {Rate: 1, Period: time.Microsecond * 999}, {Rate: 1 << 40, Period: time.Millisecond + time.Nanosecond},
		{Rate: 1, Period: time.Second, Burst: -1}, {Rate: 1<<53 + 1, Period: time.Second},
	} {
		require.ErrorIs(t, l.ValidateFor(ratelimit.FixedWindow), ratelimit.ErrInvalidLimit, "%+v", l)
	}
	require.NoError(t, ratelimit.PerHour(2_500_000).ValidateFor(ratelimit.GCRA))
	require.Equal(t, "100/1m0s burst 20", ratelimit.Limit{Rate: 100, Period: time.Minute, Burst: 20}.String())
	for _, a := range ratelimit.Algorithms() {
		require.Equal(t, 100, ratelimit.PerMinute(100).Capacity(a), "%v", a)
		for _, b := range []int{20, 200} {
			require.Equal(t, wantCapacity(ratelimit.Limit{Rate: 100, Burst: b}, a),
				ratelimit.Limit{Rate: 100, Period: time.Minute, Burst: b}.Capacity(a), "%v burst %d", a, b)
		}
	}
	require.Equal(t, 100, ratelimit.Limit{Rate: 100, Period: time.Minute, Burst: 20}.Capacity(ratelimit.Algorithm(9)), "an invalid algorithm")
	require.Equal(t, 10*time.Millisecond, ratelimit.PerSecond(100).Every())
}

func TestAlgorithm(t *testing.T) {
	for _, a := range ratelimit.Algorithms() {
		p, err := ratelimit.ParseAlgorithm(a.String())
		require.NoError(t, err)
		require.Equal(t, a, p)
	}
	_, err := ratelimit.ParseAlgorithm("leaky")
	require.ErrorIs(t, err, ratelimit.ErrInvalidAlgorithm)
	require.Equal(t, "Algorithm(9)", ratelimit.Algorithm(9).String())
	require.True(t, ratelimit.SlidingLog.IsWindow())
	require.False(t, ratelimit.GCRA.IsWindow())
}

func TestSetHeaders(t *testing.T) {
	h := http.Header{}
	ratelimit.SetHeaders(h, ratelimit.Decision{Limit: ratelimit.PerMinute(100), Remaining: 0,
		RetryAfter: 1500 * time.Millisecond, ResetAfter: 30 * time.Second})
	require.Equal(t, "100", h.Get(ratelimit.HeaderLimit))
	require.Equal(t, "0", h.Get(ratelimit.HeaderRemaining))
	require.Equal(t, "30", h.Get(ratelimit.HeaderReset))
	require.Equal(t, "2", h.Get(ratelimit.HeaderRetryAfter))
	ratelimit.SetHeaders(h, ratelimit.Decision{Allowed: true, Limit: ratelimit.PerMinute(100), Remaining: 99, ResetAfter: 100 * time.Millisecond})
	require.Equal(t, "99", h.Get(ratelimit.HeaderRemaining))
	require.Equal(t, "1", h.Get(ratelimit.HeaderReset))
	require.Empty(t, h.Get(ratelimit.HeaderRetryAfter))
	require.Equal(t, "local", ratelimit.FailLocal.String())
	require.False(t, ratelimit.FailureMode(7).Valid())
}
