package redistest_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit/internal/redistest"
)

func TestStandaloneKillRestartFreeze(t *testing.T) {
	s := redistest.Standalone(t)
	c := s.Client()
	defer c.Close()
	ctx := context.Background()
	require.NoError(t, c.Set(ctx, "k", "v", time.Minute).Err())
	pid := s.PID()
	require.NotZero(t, pid)

	s.Kill()
	require.Zero(t, s.PID())
	require.Error(t, c.Ping(ctx).Err())

	require.NoError(t, s.Restart())
	require.NotEqual(t, pid, s.PID())
	require.NoError(t, c.Ping(ctx).Err())
	require.Equal(t, int64(0), c.Exists(ctx, "k").Val(), "no persistence: data is gone after SIGKILL")

	require.NoError(t, s.Freeze())
	tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err := c.Ping(tctx).Err()
	cancel()
	require.Error(t, err, "a frozen server must not answer")
	require.NoError(t, s.Thaw())
	require.NoError(t, c.Ping(ctx).Err())

	bad, err := redistest.KeysWithoutTTL(ctx, c)
	require.NoError(t, err)
	require.Empty(t, bad)
	require.NoError(t, c.Set(ctx, "forever", "1", 0).Err())
	bad, err = redistest.KeysWithoutTTL(ctx, c)
	require.NoError(t, err)
	require.Equal(t, []string{"forever"}, bad)
}

func TestCluster(t *testing.T) {
	cl := redistest.NewCluster(t)
	require.Len(t, cl.Addrs(), 6)
	c := cl.Client()
	defer c.Close()
	ctx := context.Background()
	var masters atomic.Int32
	require.NoError(t, c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		masters.Add(1)
		return m.Ping(ctx).Err()
	}))
	require.EqualValues(t, 3, masters.Load())
	for i := 0; i < 100; i++ {
		require.NoError(t, c.Set(ctx, "key"+string(rune('a'+i%26))+string(rune('0'+i/26)), i, time.Minute).Err())
	}
	bad, err := redistest.KeysWithoutTTL(ctx, c)
	require.NoError(t, err)
	require.Empty(t, bad)
}
