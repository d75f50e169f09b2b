package hybrid_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/faultproxy"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// A wrong address, a missing or wrong password, or a Cluster client on a
// standalone server is reported: Ping returns Redis' own error, Stats keeps
// the last one, and the degraded event carries it. Decisions still get no
// error (the failure mode decides), but never more than the failure mode
// allows.
func TestMisconfiguredRedis(t *testing.T) {
	secured := redistest.Standalone(t)
	admin := secured.Client()
	require.NoError(t, admin.ConfigSet(context.Background(), "requirepass", "s3cret").Err())
	admin.Close()
	plain := redistest.Standalone(t)
	cases := []struct {
		name   string
		client func() redis.UniversalClient
		want   string // in the error
	}{
		{"no password", func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: secured.Addr(), MaxRetries: -1})
		}, "NOAUTH"},
		{"wrong password", func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: secured.Addr(), Password: "nope", MaxRetries: -1})
		}, "WRONGPASS"},
		{"refused", func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
		}, "refused"},
		{"cluster client, standalone server", func() redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{plain.Addr()}, MaxRetries: -1})
		}, "cluster"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.client()
			defer c.Close()
			var mu sync.Mutex
			var events []hybrid.Event
			h, err := hybrid.New(c, ratelimit.PerSecond(100), hybrid.WithTimeout(100*time.Millisecond),
				hybrid.WithBreaker(2, time.Hour), hybrid.WithObserver(func(e hybrid.Event) {
					mu.Lock()
					events = append(events, e)
					mu.Unlock()
				}))
			require.NoError(t, err, "New does not fail on Redis errors; Ping does")
			defer h.Close()
			err = h.Ping(context.Background())
			require.Error(t, err)
			require.Contains(t, strings.ToLower(err.Error()), strings.ToLower(tc.want))
			t.Logf("Ping: %v", err)
			deadline := time.Now().Add(10 * time.Second)
			for !h.Stats().Degraded {
				require.True(t, time.Now().Before(deadline), "the breaker never opened")
				_, err := h.Allow(context.Background(), "k")
				require.NoError(t, err)
			}
			s := h.Stats()
			require.Error(t, s.LastError)
			require.False(t, s.LastErrorAt.IsZero())
			require.Contains(t, strings.ToLower(s.LastError.Error()), strings.ToLower(tc.want))
			// The observer runs just after the breaker opened: wait for it.
			var degraded *hybrid.Event
			for degraded == nil && time.Now().Before(deadline) {
				mu.Lock()
				for i := range events {
					if events[i].Kind == hybrid.EventDegraded {
						degraded = &events[i]
					}
				}
				mu.Unlock()
				if degraded == nil {
					time.Sleep(time.Millisecond)
				}
			}
			require.NotNil(t, degraded, "no degraded event")
			require.Error(t, degraded.Err, "the degraded event says why")
		})
	}
}

// A fleet that never reached Redis does not take itself for a fleet of
// one: each instance assumes 16 (unless WithInstances says), so a fleet of
// 4 on an unreachable Redis admits at most 4 x Rate/16 per window, not
// 4 x Rate.
func TestFleetNeverLearned(t *testing.T) {
	limit := ratelimit.Limit{Rate: 160, Period: time.Hour}
	const instances = 4
	var hs []*hybrid.Limiter
	for i := 0; i < instances; i++ {
		c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
		h, err := hybrid.New(c, limit, hybrid.WithTimeout(50*time.Millisecond), hybrid.WithBreaker(1, time.Hour))
		require.NoError(t, err)
		hs = append(hs, h)
		t.Cleanup(func() { c.Close() })
	}
	defer func() { // in parallel: each gives up its final flush after its budget
		var wg sync.WaitGroup
		for _, h := range hs {
			wg.Add(1)
			go func() { defer wg.Done(); h.Close() }()
		}
		wg.Wait()
	}()
	allowed := 0
	for _, h := range hs {
		for i := 0; i < 200; i++ {
			d, err := h.Allow(context.Background(), "k")
			require.NoError(t, err)
			if d.Allowed {
				allowed++
			}
		}
		require.Equal(t, 16, h.Stats().Instances, "the assumed fleet")
	}
	t.Logf("a fleet of %d admitted %d of %d", instances, allowed, limit.Rate)
	require.LessOrEqual(t, allowed, instances*limit.Rate/16, "never Rate per instance")
	require.Equal(t, instances*limit.Rate/16, allowed, "each instance serves its assumed share")
}

// Against a Redis that accepts connections and never answers, with a
// go-redis client left on its defaults (3s ReadTimeout, retries, no
// ContextTimeoutEnabled), every call the limiter makes keeps its own
// bounds: New waits at most the timeout, a decision at most the timeout,
// Flush and Close at most max(2s, 5 timeouts).
func TestBoundsOnHangingRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	p, err := faultproxy.New(srv.Addr())
	require.NoError(t, err)
	defer p.Close()
	p.Block(true)
	c := redis.NewClient(&redis.Options{Addr: p.Addr()}) // defaults
	defer c.Close()
	const timeout = 100 * time.Millisecond
	const budget = 2 * time.Second // max(2s, 5 x timeout)
	const slack = 300 * time.Millisecond
	start := time.Now()
	h, err := hybrid.New(c, ratelimit.PerSecond(100), hybrid.WithTimeout(timeout))
	require.NoError(t, err)
	took := time.Since(start)
	t.Logf("New: %v", took)
	require.Less(t, took, timeout+slack, "New")
	for i := 0; i < 3; i++ {
		start = time.Now()
		_, err := h.Allow(context.Background(), fmt.Sprintf("k%d", i))
		require.NoError(t, err)
		require.Less(t, time.Since(start), timeout+slack, "Allow")
	}
	start = time.Now()
	err = h.Flush(context.Background())
	took = time.Since(start)
	t.Logf("Flush: %v, %v", took, err)
	require.Error(t, err, "nothing could be given back")
	require.Less(t, took, budget+slack, "Flush")
	start = time.Now()
	err = h.Close()
	took = time.Since(start)
	t.Logf("Close: %v, %v", took, err)
	require.Less(t, took, budget+slack, "Close")
	p.Block(false)
}
