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

func TestSentinel(t *testing.T) {
	s := redistest.NewSentinel(t)
	require.Len(t, s.SentinelAddrs(), 3)
	c := s.Client()
	defer c.Close()
	ctx := context.Background()
	old, err := s.Master(ctx)
	require.NoError(t, err)
	require.Same(t, s.Servers[0], old)
	require.NoError(t, c.Set(ctx, "k", "v", time.Minute).Err())
	// WAIT: the write reached the replica before the master dies.
	require.EqualValues(t, 1, c.Wait(ctx, 1, 5000).Val())

	start := time.Now()
	m, err := s.Failover(30 * time.Second)
	require.NoError(t, err)
	t.Logf("failover took %v", time.Since(start))
	require.Same(t, s.Servers[1], m)
	require.Zero(t, old.PID(), "the old master stays down")
	// The failover client finds the new master by itself.
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, err := c.Get(ctx, "k").Result()
		if err == nil {
			require.Equal(t, "v", v)
			break
		}
		require.True(t, time.Now().Before(deadline), "the failover client did not reach the new master: %v", err)
		time.Sleep(50 * time.Millisecond)
	}
	require.NoError(t, c.Set(ctx, "k2", "v2", time.Minute).Err())
	direct := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer direct.Close()
	require.Equal(t, "v2", direct.Get(ctx, "k2").Val(), "the client writes to the promoted replica")
}
