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
