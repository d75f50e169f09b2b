package check_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/check"
)

func TestN(t *testing.T) {
	l := ratelimit.Limit{Rate: 10, Period: time.Second, Burst: 20}
	require.NoError(t, check.N(l, ratelimit.TokenBucket, 20))
	require.ErrorIs(t, check.N(l, ratelimit.TokenBucket, 21), ratelimit.ErrInvalidN)
	require.NoError(t, check.N(l, ratelimit.FixedWindow, 10))
	err := check.N(l, ratelimit.FixedWindow, 11)
	require.ErrorIs(t, err, ratelimit.ErrInvalidN)
	require.EqualError(t, err, "ratelimit: invalid n: n = 11 exceeds the capacity 10 of 10/1s burst 20; it could never be admitted")
	require.EqualError(t, check.N(l, ratelimit.GCRA, 0), "ratelimit: invalid n: n must be > 0, got 0")
	require.ErrorIs(t, check.N(l, ratelimit.GCRA, -1), ratelimit.ErrInvalidN)
}

func TestKey(t *testing.T) {
	require.NoError(t, check.Key("k"))
	err := check.Key("")
	require.ErrorIs(t, err, ratelimit.ErrInvalidKey)
	require.EqualError(t, err, "ratelimit: invalid key: empty key")
}

func TestCheckLimits(t *testing.T) {
	fw, tb := ratelimit.FixedWindow, ratelimit.TokenBucket
	sec, minute := ratelimit.PerSecond(10), ratelimit.PerMinute(100)
	require.NoError(t, check.Limits([]ratelimit.Limit{sec, minute}, []ratelimit.Algorithm{tb, fw}))
	// The same Period under two algorithms is two states.
	require.NoError(t, check.Limits([]ratelimit.Limit{sec, ratelimit.PerSecond(5)}, []ratelimit.Algorithm{tb, fw}))

	for name, c := range map[string]struct {
		limits []ratelimit.Limit
		algs   []ratelimit.Algorithm
		err    error
	}{
		"none":        {nil, nil, ratelimit.ErrInvalidLimit},
		"too many":    {make([]ratelimit.Limit, ratelimit.MaxLimits+1), make([]ratelimit.Algorithm, ratelimit.MaxLimits+1), ratelimit.ErrInvalidLimit},
		"algs short":  {[]ratelimit.Limit{sec, minute}, []ratelimit.Algorithm{fw}, ratelimit.ErrInvalidOption},
		"invalid":     {[]ratelimit.Limit{sec, {}}, []ratelimit.Algorithm{fw, fw}, ratelimit.ErrInvalidLimit},
		"unknown alg": {[]ratelimit.Limit{sec}, []ratelimit.Algorithm{9}, ratelimit.ErrInvalidAlgorithm},
		"same state":  {[]ratelimit.Limit{sec, ratelimit.PerSecond(5)}, []ratelimit.Algorithm{fw, fw}, ratelimit.ErrInvalidLimit},
		"gcra T = 0":  {[]ratelimit.Limit{{Rate: 2000, Period: time.Millisecond}}, []ratelimit.Algorithm{ratelimit.GCRA}, ratelimit.ErrInvalidLimit},
	} {
		require.ErrorIs(t, check.Limits(c.limits, c.algs), c.err, name)
	}

	limits, algs := []ratelimit.Limit{{Rate: 10, Period: time.Second, Burst: 3}, minute}, []ratelimit.Algorithm{tb, fw}
	require.NoError(t, check.NLimits(limits, algs, 3))
	require.ErrorIs(t, check.NLimits(limits, algs, 4), ratelimit.ErrInvalidN, "above the bucket's burst")
	require.ErrorIs(t, check.NLimits(limits, algs, 0), ratelimit.ErrInvalidN)
	require.ErrorIs(t, check.NLimits(limits, algs[:1], 1), ratelimit.ErrInvalidOption)
}
