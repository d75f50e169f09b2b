package local_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/hybridlimit/ratelimit/local"
)

// TestDifferentialGlobal gives the same random requests, at the same
// instants, to a local.Limiter and to a global.Limiter on a real
// redis-server, both on one fake clock, and requires identical decisions:
// both implement docs/algorithms.md to the microsecond.
func TestDifferentialGlobal(t *testing.T) {
	srv := redistest.Standalone(t)
	client := srv.Client()
	t.Cleanup(func() { client.Close() })

	const requests = 2500
	limits := []ratelimit.Limit{
		{Rate: 10, Period: time.Second, Burst: 5},
		// Odd numbers: P/R and the weighted counts do not divide evenly.
		{Rate: 7, Period: 1300 * time.Millisecond, Burst: 3},
		// Long period, huge burst: GCRA's tat and the window ends pass 2^53
		// µs, where doubles round (docs/algorithms.md, "Instants past 2^53").
		// Buckets admit everything here; the decisions must still agree.
		{Rate: 1, Period: 24 * time.Hour, Burst: 100_000},
	}
	keys := []string{"alice", "bob", "carol", "dave"}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)

	for li, limit := range limits {
		for _, a := range ratelimit.Algorithms() {
			for _, seed := range []uint64{1, 2, 3} {
				t.Run(fmt.Sprintf("%v/limit=%v/seed=%d", a, limit, seed), func(t *testing.T) {
					var clock atomic.Int64
					// Start at an odd instant, not aligned to the Period.
					clock.Store(1_700_000_000_123_457 + int64(seed)*1_000_003)
					now := func() time.Time { return time.UnixMicro(clock.Load()) }

					loc, err := local.New(limit, local.WithAlgorithm(a), local.WithClock(now))
					require.NoError(t, err)
					glo, err := global.New(client, limit, global.WithAlgorithm(a), global.WithClock(now),
						global.WithPrefix(fmt.Sprintf("difftest-%s-%d-%v-%d", run, li, a, seed)))
					require.NoError(t, err)

					rng := rand.New(rand.NewPCG(seed, uint64(a)<<8|uint64(li)))
					maxN := min(limit.Capacity(a), 5)
					ctx := context.Background()
					var allowed, denied int
					for i := 0; i < requests; i++ {
						// Mostly small steps, sometimes none (same instant), sometimes
						// an odd number of µs so windows are hit off their edges.
						switch rng.IntN(10) {
						case 0:
						case 1:
							clock.Add(rng.Int64N(1000))
						default:
							clock.Add(rng.Int64N(300_001))
						}
						key := keys[rng.IntN(len(keys))]
						n := 1 + rng.IntN(maxN)

						dl, errL := loc.AllowN(ctx, key, n)
						dg, errG := glo.AllowN(ctx, key, n)
						require.NoError(t, errL)
						require.NoError(t, errG)
						where := fmt.Sprintf("request %d: t=%d key=%s n=%d\nlocal:  %+v\nglobal: %+v", i, clock.Load(), key, n, dl, dg)
						require.Equal(t, dl.Allowed, dg.Allowed, where)
						require.Equal(t, dl.Remaining, dg.Remaining, where)
						require.Equal(t, dl.Limit, dg.Limit, where)
						require.InDelta(t, dl.RetryAfter, dg.RetryAfter, float64(time.Millisecond), where)
						require.InDelta(t, dl.ResetAfter, dg.ResetAfter, float64(time.Millisecond), where)
						if dl.RetryAfter != dg.RetryAfter || dl.ResetAfter != dg.ResetAfter {
							t.Errorf("durations differ within 1ms: %s", where)
						}
						if dl.Allowed {
							allowed++
						} else {
							denied++
						}
					}
					t.Logf("%d allowed, %d denied", allowed, denied)
					if li < 2 || a.IsWindow() {
						require.Positive(t, denied, "the sequence must exercise denials")
					}
					require.Positive(t, allowed)
				})
			}
		}
	}
}
