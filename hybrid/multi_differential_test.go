package hybrid_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/hybridlimit/ratelimit/local"
)

// The same random requests, reservations and settlements go to a
// local.Multi, a global.Multi and a hybrid.Multi (one instance), and all
// three take the same decisions, each limit's Remaining included. The
// hybrid takes no clock, so the limits are long (no window ends and no
// token refills during the test) and the three run on this machine's time.
// (local and global are compared to the microsecond, on a fake clock, by
// local's TestDifferentialMulti.)
func TestMultiDifferential(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	hour, day := ratelimit.PerHour(40), ratelimit.Limit{Rate: 70, Period: 24 * time.Hour}
	bucket := ratelimit.Limit{Rate: 1, Period: 24 * time.Hour, Burst: 30}
	for mi, mix := range []struct {
		limits  []ratelimit.Limit
		algs    []ratelimit.Algorithm
		reserve bool // buckets refund what they did not refill since: not compared here
	}{
		{[]ratelimit.Limit{hour, day}, []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.FixedWindow}, true},
		{[]ratelimit.Limit{day, hour}, []ratelimit.Algorithm{ratelimit.SlidingWindow, ratelimit.FixedWindow}, true},
		{[]ratelimit.Limit{bucket, hour, day}, []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.FixedWindow, ratelimit.SlidingWindow}, false},
		{[]ratelimit.Limit{hour, bucket}, []ratelimit.Algorithm{ratelimit.SlidingWindow, ratelimit.GCRA}, false},
	} {
		t.Run(fmt.Sprint(mix.algs), func(t *testing.T) {
			freshWindow(t, c, time.Hour, 20*time.Second)
			prefix := uniq(t)
			loc, err := local.NewMulti(mix.limits, local.WithAlgorithms(mix.algs...))
			require.NoError(t, err)
			glo, err := global.NewMulti(c, mix.limits, global.WithAlgorithms(mix.algs...), global.WithPrefix(prefix+"g"))
			require.NoError(t, err)
			hyb, err := hybrid.NewMulti(c, mix.limits, hybrid.WithAlgorithms(mix.algs...), hybrid.WithPrefix(prefix+"h"), hybrid.WithInstances(1))
			require.NoError(t, err)
			defer hyb.Close()
			lims := []ratelimit.MultiLimiter{loc, glo, hyb}
			names := []string{"local", "global", "hybrid"}

			rng := rand.New(rand.NewPCG(uint64(mi), 7))
			var open [][]*ratelimit.Reservation
			allowed, denied := 0, 0
			for i := 0; i < 400; i++ {
				key := []string{"alice", "bob", "carol"}[rng.IntN(3)]
				n := 1 + rng.IntN(4)
				var ds []ratelimit.Decision
				if mix.reserve && rng.IntN(3) == 0 {
					var rs []*ratelimit.Reservation
					for _, l := range lims {
						r, err := l.Reserve(ctx, key, n)
						require.NoError(t, err)
						rs, ds = append(rs, r), append(ds, r.Decision())
					}
					if rs[0].OK() {
						open = append(open, rs)
					}
				} else {
					for _, l := range lims {
						d, err := l.AllowN(ctx, key, n)
						require.NoError(t, err)
						ds = append(ds, d)
					}
				}
				for j := 1; j < len(ds); j++ {
					require.Equal(t, ds[0].Allowed, ds[j].Allowed, "step %d %s n=%d: local %+v, %s %+v", i, key, n, ds[0], names[j], ds[j])
					if ds[0].Allowed {
						for k, s := range ds[0].Limits() {
							require.Equal(t, s.Remaining, ds[j].Limits()[k].Remaining, "step %d %s n=%d limit %d: %s", i, key, n, k, names[j])
						}
					}
				}
				if ds[0].Allowed {
					allowed++
				} else {
					denied++
				}
				// settle a reservation now and then: less, as much, or more
				if len(open) > 0 && rng.IntN(2) == 0 {
					k := rng.IntN(len(open))
					actual := rng.IntN(2 * open[k][0].Estimate())
					for j, r := range open[k] {
						require.NoError(t, r.Settle(ctx, actual), names[j])
					}
					open = append(open[:k], open[k+1:]...)
				}
			}
			t.Logf("allowed %d, denied %d", allowed, denied)
			require.Positive(t, allowed)
			require.Positive(t, denied)
		})
	}
}
