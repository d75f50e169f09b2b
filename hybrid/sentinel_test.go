package hybrid_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// A fleet on a Sentinel deployment, through go-redis's failover client,
// under load while the master is killed and the sentinels promote its
// replica: no decision errs or waits on Redis longer than the timeout, the
// instances come back to Redis by themselves, and the counts in Redis are
// exact again in a fresh window.
func TestSentinelFailover(t *testing.T) {
	st := redistest.NewSentinel(t)
	const instances = 2
	// Windows roll every 2s: the fleet leases again during the outage.
	limit := ratelimit.Limit{Rate: 200, Period: 2 * time.Second}
	prefix := uniq(t)
	hs, _ := fleet(t, instances, func() redis.UniversalClient { return st.Client() }, limit,
		hybrid.WithPrefix(prefix), hybrid.WithTimeout(faultTimeout), hybrid.WithSyncInterval(50*time.Millisecond),
		hybrid.WithInstances(instances), hybrid.WithBreaker(2, 200*time.Millisecond))
	ctx := context.Background()
	for _, h := range hs {
		for i := 0; i < 5; i++ {
			d, err := h.Allow(ctx, "k")
			require.NoError(t, err)
			require.True(t, d.Allowed)
		}
	}

	stop := make(chan struct{})
	keys := []string{"k", "k1", "k2"}
	outs := make([]outcome, instances*len(keys))
	done := make(chan int)
	for i, h := range hs {
		for j, k := range keys {
			go func() { outs[i*len(keys)+j] = load(h, k, 2, stop); done <- i }()
		}
	}
	time.Sleep(300 * time.Millisecond) // load before the fault
	start := time.Now()
	master, err := st.Failover(30 * time.Second)
	if err != nil {
		close(stop)
		for range outs {
			<-done
		}
		require.NoError(t, err)
	}
	took := time.Since(start)
	time.Sleep(time.Second) // load after the promotion
	close(stop)
	for range outs {
		<-done
	}
	during := sumStats(hs)
	var all outcome
	for _, o := range outs {
		all.allowed += o.allowed
		all.denied += o.denied
		all.errs += o.errs
		all.lat = append(all.lat, o.lat...)
	}
	t.Logf("failover in %v to %s: allowed %d denied %d errors %d; latency p99 %v max %v; stats %+v",
		took, master.Addr(), all.allowed, all.denied, all.errs, all.quantile(0.99), all.quantile(1), during)
	require.Positive(t, during.FlushErrors+during.Fallback+during.NoReply, "the fleet never noticed the master die")
	require.Zero(t, all.errs, "no error reaches the caller")
	require.Less(t, all.quantile(1), 3*faultTimeout, "a decision waited on Redis")
	for _, h := range hs {
		waitRecovered(t, h)
	}

	// A fresh key in a fresh window on the promoted master: what the fleet
	// admits is what Redis counts once the leases are given back.
	direct := redis.NewClient(&redis.Options{Addr: master.Addr()})
	defer direct.Close()
	idx := freshWindow(t, direct, limit.Period, 3*time.Second)
	fallback := sumStats(hs).Fallback
	allowed := 0
	for i := 0; i < 30; i++ {
		d, err := hs[i%instances].Allow(ctx, "exact")
		require.NoError(t, err)
		if d.Allowed {
			allowed++
		}
	}
	for _, h := range hs {
		require.NoError(t, h.Flush(ctx))
	}
	got := redisCount(t, direct, prefix, "exact", idx)
	now, _ := serverWindow(t, direct, limit.Period)
	require.Equal(t, idx, now, "the window rolled before the count was read")
	require.Equal(t, fallback, sumStats(hs).Fallback, "a decision after the failover came from the failure mode")
	require.Equal(t, 30, allowed, "30 of 200 in a fresh window are all allowed")
	require.Equal(t, allowed, got, "Redis counts exactly what the fleet admitted")
	bad, err := redistest.KeysWithoutTTL(ctx, direct)
	require.NoError(t, err)
	require.Empty(t, bad, "keys without TTL on the promoted master")
}
