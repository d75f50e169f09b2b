package global_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// fakeClock is a settable clock in whole microseconds.
type fakeClock struct{ us atomic.Int64 }

func (c *fakeClock) Now() time.Time      { return time.UnixMicro(c.us.Load()) }
func (c *fakeClock) Set(us int64)        { c.us.Store(us) }
func (c *fakeClock) Add(d time.Duration) { c.us.Add(int64(d / time.Microsecond)) }

// t0 is a logical start time that is a multiple of every Period used in the
// deterministic tests (10s, 3s, 1s).
const t0 = int64(1_699_999_980_000_000)

var prefixSeq atomic.Int64

// uniquePrefix returns a prefix no other case uses.
func uniquePrefix(t testing.TB) string {
	return "test" + strconv.FormatInt(prefixSeq.Add(1), 10)
}

func newLimiter(t testing.TB, c redis.UniversalClient, l ratelimit.Limit, opts ...global.Option) *global.Limiter {
	t.Helper()
	lim, err := global.New(c, l, append([]global.Option{global.WithPrefix(uniquePrefix(t))}, opts...)...)
	require.NoError(t, err)
	return lim
}

// want is an expected decision, durations in microseconds.
type want struct {
	allowed          bool
	remaining        int
	retryUS, resetUS int64
}

func requireDecision(t *testing.T, w want, d ratelimit.Decision, msg string) {
	t.Helper()
	got := want{d.Allowed, d.Remaining, int64(d.RetryAfter / time.Microsecond), int64(d.ResetAfter / time.Microsecond)}
	require.Equal(t, w, got, msg)
}

// requireAllTTL fails when any key on c has no expiry.
func requireAllTTL(t testing.TB, c redis.UniversalClient) {
	t.Helper()
	bad, err := redistest.KeysWithoutTTL(context.Background(), c)
	require.NoError(t, err)
	require.Empty(t, bad, "keys without TTL")
}

// serverMicros returns the Redis server time of c in microseconds.
func serverMicros(t testing.TB, c redis.UniversalClient) int64 {
	t.Helper()
	tm, err := c.Time(context.Background()).Result()
	require.NoError(t, err)
	return tm.UnixMicro()
}

func sprintf(format string, args ...any) string { return fmt.Sprintf(format, args...) }
