package hybrid_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/hybridlimit/ratelimit/internal/rtcount"
)

// A key driven far past its bucket's rate keeps the bucket about empty. An
// instance the bucket refused asks it again only once it holds a few
// tokens for every instance (8 each: here 32, 16ms of refill at 2,000 a
// second), not as soon as one token is in it: its decisions are denied in
// memory meanwhile, and the fleet still uses its rate. On default options
// but the fleet size, so that the gap is known.
func TestBucketAtLimitPollsForSeveralTokens(t *testing.T) {
	srv := redistest.Standalone(t)
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		t.Run(alg.String(), func(t *testing.T) {
			lim := ratelimit.Limit{Rate: 2000, Period: time.Second, Burst: 2000}
			const instances = 4
			var hooks []*rtcount.Hook
			hooked := func() redis.UniversalClient {
				c, hk := srv.Client(), &rtcount.Hook{}
				c.AddHook(hk)
				hooks = append(hooks, hk)
				return c
			}
			_, ls := fleet(t, instances, hooked, lim,
				hybrid.WithPrefix(uniq(t)), hybrid.WithAlgorithm(alg), hybrid.WithInstances(instances))
			const d = 2 * time.Second
			_, at := bucketRun(t, ls, 4, d)
			rt := sumRT(hooks)
			checkBucket(t, lim, d, at, 1)
			// once the burst is spent (about a second), each instance asks at
			// most every 16ms, a few calls each time (a refusal, a grant, the
			// lease topped up): some 125 polls of 2 seconds an instance, 500 in
			// all; asked whenever one token is in it, it would be thousands
			const gap = 16 * time.Millisecond
			polls := int64(instances) * int64(d/gap)
			t.Logf("%d round trips for %d admissions (%d polls of %v)", rt, len(at), polls, gap)
			require.LessOrEqual(t, rt, 3*polls, "round trips of a fleet at its bucket's limit")
		})
	}
}
