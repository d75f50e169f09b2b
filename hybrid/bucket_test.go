package hybrid_test

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// bucketRun hammers key from workers goroutines per limiter for d and
// returns when each unit was admitted, as time since start, sorted.
func bucketRun(t *testing.T, ls []ratelimit.Limiter, workers int, d time.Duration) (start time.Time, at []time.Duration) {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	var errs atomic.Int64
	start = time.Now()
	stop := start.Add(d)
	for _, l := range ls {
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(l ratelimit.Limiter) {
				defer wg.Done()
				var mine []time.Duration
				for time.Now().Before(stop) {
					dec, err := l.AllowN(context.Background(), "bucket", 1)
					if err != nil {
						errs.Add(1)
						return
					}
					if dec.Allowed {
						mine = append(mine, time.Since(start))
					}
				}
				mu.Lock()
				at = append(at, mine...)
				mu.Unlock()
			}(l)
		}
	}
	wg.Wait()
	require.Zero(t, errs.Load())
	sort.Slice(at, func(i, j int) bool { return at[i] < at[j] })
	return start, at
}

// checkBucket: at every admission, the units admitted so far are at most
// Burst + Rate x elapsed (the bucket was full when the run began); and all
// in all at least 95% of that allowance was used.
func checkBucket(t *testing.T, lim ratelimit.Limit, d time.Duration, at []time.Duration, slack float64) {
	t.Helper()
	allow := func(e time.Duration) float64 {
		return float64(lim.Burst) + float64(lim.Rate)*e.Seconds()/lim.Period.Seconds()
	}
	for i, e := range at {
		require.LessOrEqual(t, float64(i+1), allow(e)*slack, "admission %d at %v: over Burst + Rate x elapsed (%.0f)", i+1, e, allow(e))
	}
	total := allow(d)
	t.Logf("admitted %d of an allowance of %.0f over %v (%.1f%%)", len(at), total, d, 100*float64(len(at))/total)
	require.GreaterOrEqual(t, float64(len(at)), 0.95*total, "at least 95%% of the allowance used")
}

// A fleet of 8 hybrid instances driving one key's bucket far past its rate,
// strict: the fleet never admits more than the bucket allows, Burst + Rate
// x elapsed, and uses at least 95% of it.
func TestBucketFleetStrict(t *testing.T) {
	srv := redistest.Standalone(t)
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		t.Run(alg.String(), func(t *testing.T) {
			lim := ratelimit.Limit{Rate: 400, Period: time.Second, Burst: 200}
			_, ls := fleet(t, 8, func() redis.UniversalClient { return srv.Client() }, lim,
				hybrid.WithPrefix(uniq(t)), hybrid.WithAlgorithm(alg), hybrid.WithInstances(8), hybrid.WithTimeout(time.Second))
			const d = 3 * time.Second
			_, at := bucketRun(t, ls, 4, d)
			checkBucket(t, lim, d, at, 1)
		})
	}
}

// A fleet mixing hybrid and global limiters of one bucket shares it: the
// hybrids' leases and the globals' admissions come out of the same tokens.
func TestBucketMixedFleet(t *testing.T) {
	srv := redistest.Standalone(t)
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		t.Run(alg.String(), func(t *testing.T) {
			lim := ratelimit.Limit{Rate: 300, Period: time.Second, Burst: 100}
			prefix := uniq(t)
			_, ls := fleet(t, 3, func() redis.UniversalClient { return srv.Client() }, lim,
				hybrid.WithPrefix(prefix), hybrid.WithAlgorithm(alg), hybrid.WithInstances(5), hybrid.WithTimeout(time.Second))
			for i := 0; i < 2; i++ {
				c := srv.Client()
				t.Cleanup(func() { c.Close() })
				g, err := global.New(c, lim, global.WithPrefix(prefix), global.WithAlgorithm(alg))
				require.NoError(t, err)
				ls = append(ls, g)
			}
			const d = 2 * time.Second
			_, at := bucketRun(t, ls, 3, d)
			checkBucket(t, lim, d, at, 1)
		})
	}
}

// Unused tokens go back to the bucket when the key goes quiet, and Close
// gives back the rest: a global limiter then finds the bucket as full as
// what was admitted allows.
func TestBucketTokensGoBack(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		t.Run(alg.String(), func(t *testing.T) {
			// 1 token an hour: nothing refills during the test
			lim := ratelimit.Limit{Rate: 1, Period: time.Hour, Burst: 100}
			prefix := uniq(t)
			h, err := hybrid.New(c, lim, hybrid.WithPrefix(prefix), hybrid.WithAlgorithm(alg), hybrid.WithInstances(1))
			require.NoError(t, err)
			for i := 0; i < 10; i++ {
				d, err := h.Allow(ctx, "k")
				require.NoError(t, err)
				require.True(t, d.Allowed)
				require.Equal(t, alg, d.Algorithm)
			}
			require.NoError(t, h.Close())
			g, err := global.New(c, lim, global.WithPrefix(prefix), global.WithAlgorithm(alg))
			require.NoError(t, err)
			n := 0
			for {
				d, err := g.Allow(ctx, "k")
				require.NoError(t, err)
				if !d.Allowed {
					break
				}
				n++
				require.Less(t, n, 200)
			}
			require.Equal(t, 90, n, "100 in the bucket, 10 admitted by the hybrid, its unused lease given back")
		})
	}
}

// Optimistic mode on a bucket: at most Rate / (8 x instances) per period per
// instance on credit beyond the leased tokens.
func TestBucketOptimisticBound(t *testing.T) {
	srv := redistest.Standalone(t)
	lim := ratelimit.Limit{Rate: 400, Period: time.Second, Burst: 200}
	const instances = 4
	_, ls := fleet(t, instances, func() redis.UniversalClient { return srv.Client() }, lim,
		hybrid.WithPrefix(uniq(t)), hybrid.WithAlgorithm(ratelimit.TokenBucket), hybrid.WithInstances(instances),
		hybrid.WithMode(hybrid.Optimistic), hybrid.WithTimeout(time.Second))
	const d = 2 * time.Second
	_, at := bucketRun(t, ls, 3, d)
	// the allowance plus each instance's share per period begun: 1 + 1/8
	checkBucket(t, lim, d, at, 1.125+float64(instances*((lim.Rate/(8*instances))*3))/float64(lim.Burst))
}
