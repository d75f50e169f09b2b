package global_test

import (
	"context"
	"testing"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/hybridlimit/ratelimit/internal/script"
	"github.com/stretchr/testify/require"
)

// TestSlidingLogMemory fills a SlidingLog key (one admission per call, as
// real traffic does) and logs MEMORY USAGE (SAMPLES 0: exact) of the log and its sequence key.
// Reproduce: go test -run TestSlidingLogMemory -v ./global/
func TestSlidingLogMemory(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	for _, rate := range []int{100, 1000} {
		prefix := uniquePrefix(t)
		clk := &fakeClock{}
		clk.Set(t0)
		l, err := global.New(c, ratelimit.Limit{Rate: rate, Period: time.Hour}, global.WithAlgorithm(ratelimit.SlidingLog),
			global.WithPrefix(prefix), global.WithClock(clk.Now))
		require.NoError(t, err)
		for i := 0; i < rate; i++ {
			clk.Add(time.Millisecond)
			d, err := l.Allow(ctx, "user-12345")
			require.NoError(t, err)
			require.True(t, d.Allowed)
		}
		d, err := l.Allow(ctx, "user-12345")
		require.NoError(t, err)
		require.False(t, d.Allowed, "the log is full")
		base := prefix + ":{user-12345}:" + script.Kind(ratelimit.SlidingLog, ratelimit.Limit{Rate: rate, Period: time.Hour})
		n, err := c.ZCard(ctx, base).Result()
		require.NoError(t, err)
		require.EqualValues(t, rate, n)
		sl, err := c.MemoryUsage(ctx, base, 0).Result()
		require.NoError(t, err)
		seq, err := c.MemoryUsage(ctx, base+":seq", 0).Result()
		require.NoError(t, err)
		enc, err := c.ObjectEncoding(ctx, base).Result()
		require.NoError(t, err)
		t.Logf("SlidingLog Rate %d: MEMORY USAGE %s = %d bytes (%s, %.1f B/entry), %s:seq = %d bytes",
			rate, base, sl, enc, float64(sl)/float64(rate), base, seq)
	}
}
