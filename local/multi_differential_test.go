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

// TestDifferentialMulti gives the same random requests, reservations and
// settlements (refunds and overdrafts), at the same instants on one fake
// clock, to a local.Multi and to a global.Multi on a real redis-server, for
// mixes of algorithms, and requires identical decisions, each limit's state
// included: both implement docs/algorithms.md to the microsecond.
func TestDifferentialMulti(t *testing.T) {
	srv := redistest.Standalone(t)
	client := srv.Client()
	t.Cleanup(func() { client.Close() })
	run := strconv.FormatInt(time.Now().UnixNano(), 36)

	limits := []ratelimit.Limit{
		{Rate: 3, Period: 700 * time.Millisecond, Burst: 6},
		{Rate: 7, Period: 1300 * time.Millisecond, Burst: 4},
		{Rate: 20, Period: 9 * time.Second, Burst: 9},
	}
	mixes := [][]ratelimit.Algorithm{
		{ratelimit.TokenBucket, ratelimit.FixedWindow, ratelimit.FixedWindow},
		{ratelimit.GCRA, ratelimit.SlidingWindow, ratelimit.FixedWindow},
		{ratelimit.SlidingWindow, ratelimit.TokenBucket, ratelimit.GCRA},
		{ratelimit.FixedWindow, ratelimit.SlidingWindow, ratelimit.SlidingWindow},
		{ratelimit.SlidingLog, ratelimit.GCRA, ratelimit.FixedWindow}, // no reservations
	}
	for mi, algs := range mixes {
		for _, seed := range []uint64{1, 2} {
			t.Run(fmt.Sprintf("%v/seed=%d", algs, seed), func(t *testing.T) {
				var clock atomic.Int64
				clock.Store(1_700_000_000_123_457 + int64(seed)*1_000_003)
				now := func() time.Time { return time.UnixMicro(clock.Load()) }
				loc, err := local.NewMulti(limits, local.WithAlgorithms(algs...), local.WithClock(now))
				require.NoError(t, err)
				glo, err := global.NewMulti(client, limits, global.WithAlgorithms(algs...), global.WithClock(now),
					global.WithPrefix(fmt.Sprintf("diffmulti-%s-%d-%d", run, mi, seed)))
				require.NoError(t, err)

				rng := rand.New(rand.NewPCG(seed, uint64(mi)))
				ctx := context.Background()
				type pair struct{ l, g *ratelimit.Reservation }
				var open []pair
				var allowed, denied, settled int
				canReserve := algs[0] != ratelimit.SlidingLog
				for i := 0; i < 3000; i++ {
					switch rng.IntN(10) {
					case 0:
					case 1:
						clock.Add(rng.Int64N(1000))
					default:
						clock.Add(rng.Int64N(250_001))
					}
					key := []string{"alice", "bob"}[rng.IntN(2)]
					n := 1 + rng.IntN(3)
					var dl, dg ratelimit.Decision
					switch op := rng.IntN(4); {
					case op == 0 && canReserve:
						rl, errL := loc.Reserve(ctx, key, n)
						rg, errG := glo.Reserve(ctx, key, n)
						require.NoError(t, errL)
						require.NoError(t, errG)
						dl, dg = rl.Decision(), rg.Decision()
						if rl.OK() {
							open = append(open, pair{rl, rg})
						}
					case op == 1 && len(open) > 0:
						j := rng.IntN(len(open))
						p := open[j]
						open = append(open[:j], open[j+1:]...)
						actual := rng.IntN(3 * p.l.Estimate()) // refunds and overdrafts
						require.NoError(t, p.l.Settle(ctx, actual))
						require.NoError(t, p.g.Settle(ctx, actual))
						settled++
						continue
					default:
						dl, err = loc.AllowN(ctx, key, n)
						require.NoError(t, err)
						dg, err = glo.AllowN(ctx, key, n)
						require.NoError(t, err)
					}
					require.Equal(t, dl, dg, "request %d: t=%d key=%s n=%d", i, clock.Load(), key, n)
					if dl.Allowed {
						allowed++
					} else {
						denied++
					}
				}
				t.Logf("%d allowed, %d denied, %d settled", allowed, denied, settled)
				require.Positive(t, denied)
				require.Positive(t, allowed)
				if canReserve {
					require.Positive(t, settled)
				}
			})
		}
	}
}

// TestDifferentialOverdraftExtremes settles reservations with actuals up to
// 2^53 on limits of long and short periods, then walks the clock
// through the debt: local and global saturate alike and agree on every
// decision (SlidingWindow's weighted count past 2^53 included).
func TestDifferentialOverdraftExtremes(t *testing.T) {
	srv := redistest.Standalone(t)
	client := srv.Client()
	t.Cleanup(func() { client.Close() })
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	limits := []ratelimit.Limit{
		{Rate: 100_000, Period: 24 * time.Hour, Burst: 100_000},
		{Rate: 5, Period: time.Second, Burst: 7},
	}
	for li, limit := range limits {
		for _, a := range []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingWindow, ratelimit.TokenBucket, ratelimit.GCRA} {
			for _, actual := range []int{1 << 53, (1 << 53) / 3, 1 << 40, 250_000} {
				t.Run(fmt.Sprintf("%v/%v/actual=%d", limit, a, actual), func(t *testing.T) {
					var clock atomic.Int64
					clock.Store(1_700_000_000_123_457)
					now := func() time.Time { return time.UnixMicro(clock.Load()) }
					loc, err := local.NewMulti([]ratelimit.Limit{limit}, local.WithAlgorithm(a), local.WithClock(now))
					require.NoError(t, err)
					glo, err := global.NewMulti(client, []ratelimit.Limit{limit}, global.WithAlgorithm(a), global.WithClock(now),
						global.WithPrefix(fmt.Sprintf("diffextreme-%s-%d-%v-%d", run, li, a, actual)))
					require.NoError(t, err)
					ctx := context.Background()
					// Two reservations, then two debts, the second on top of the first.
					var rs [][2]*ratelimit.Reservation
					for i := 0; i < 2; i++ {
						rl, err := loc.Reserve(ctx, "k", 1)
						require.NoError(t, err)
						rg, err := glo.Reserve(ctx, "k", 1)
						require.NoError(t, err)
						require.Equal(t, rl.Decision(), rg.Decision())
						require.True(t, rl.OK())
						rs = append(rs, [2]*ratelimit.Reservation{rl, rg})
					}
					for _, r := range rs {
						require.NoError(t, r[0].Settle(ctx, actual))
						require.NoError(t, r[1].Settle(ctx, actual))
					}
					p := int64(limit.Period / time.Microsecond)
					for _, step := range []int64{0, 1, p / 3, p / 2, p - 1, p, p + p/2, 3 * p, 1 << 40, 1 << 50} {
						clock.Add(step)
						dl, err := loc.Allow(ctx, "k")
						require.NoError(t, err)
						dg, err := glo.Allow(ctx, "k")
						require.NoError(t, err)
						require.Equal(t, dl, dg, "after +%dus", step)
					}
				})
			}
		}
	}
}
