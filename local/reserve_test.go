package local_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/local"
)

// reserver is what the reservation tests need of Limiter and Multi.
type reserver interface {
	ratelimit.Limiter
	ratelimit.Reserver
}

// both returns a Limiter and a Multi of one limit for limit and alg: the
// reservation rules hold for each.
func both(t *testing.T, limit ratelimit.Limit, alg ratelimit.Algorithm, c *fakeClock) map[string]reserver {
	return map[string]reserver{
		"Limiter": newLim(t, limit, alg, c),
		"Multi":   newMulti(t, []ratelimit.Limit{limit}, []ratelimit.Algorithm{alg}, c),
	}
}

func reserve(t *testing.T, l ratelimit.Reserver, est int) *ratelimit.Reservation {
	t.Helper()
	r, err := l.Reserve(context.Background(), "k", est)
	require.NoError(t, err)
	require.True(t, r.OK())
	return r
}

func allowN(t *testing.T, l ratelimit.Limiter, n int) ratelimit.Decision {
	t.Helper()
	d, err := l.AllowN(context.Background(), "k", n)
	require.NoError(t, err)
	return d
}

func TestReserveFixedWindow(t *testing.T) {
	ctx := context.Background()
	for name, l := range both(t, ratelimit.PerSecond(10), ratelimit.FixedWindow, newClock()) {
		t.Run(name+"/refund in the window", func(t *testing.T) {
			r := reserve(t, l, 6)
			require.Equal(t, 4, r.Decision().Remaining)
			require.NoError(t, r.Settle(ctx, 2))
			require.True(t, allowN(t, l, 8).Allowed, "4 of the 6 came back")
			require.False(t, allowN(t, l, 1).Allowed)
		})
	}
	c := newClock()
	for name, l := range both(t, ratelimit.PerSecond(10), ratelimit.FixedWindow, c) {
		t.Run(name+"/no refund to a later window", func(t *testing.T) {
			c.Set(900 * time.Millisecond)
			r := reserve(t, l, 6)
			c.Set(1100 * time.Millisecond)
			require.True(t, allowN(t, l, 5).Allowed)
			require.NoError(t, r.Cancel(ctx))
			require.True(t, allowN(t, l, 5).Allowed)
			require.False(t, allowN(t, l, 1).Allowed, "the cancel gave nothing to the new window")
		})
	}
	c = newClock()
	for name, l := range both(t, ratelimit.PerSecond(10), ratelimit.FixedWindow, c) {
		t.Run(name+"/overdraft", func(t *testing.T) {
			c.Set(0)
			r := reserve(t, l, 5)
			c.Set(500 * time.Millisecond)
			require.NoError(t, r.Settle(ctx, 25))
			d := allowN(t, l, 1)
			require.False(t, d.Allowed)
			require.Equal(t, 500*time.Millisecond, d.RetryAfter)
			c.Set(time.Second) // a FixedWindow's debt ends with its window
			require.True(t, allowN(t, l, 10).Allowed)
		})
	}
}

func TestReserveSlidingWindow(t *testing.T) {
	ctx := context.Background()
	c := newClock()
	for name, l := range both(t, ratelimit.PerSecond(10), ratelimit.SlidingWindow, c) {
		t.Run(name+"/refund to the previous window", func(t *testing.T) {
			c.Set(500 * time.Millisecond)
			r := reserve(t, l, 10)
			c.Set(1500 * time.Millisecond) // the 10 weigh half: 5
			require.False(t, allowN(t, l, 6).Allowed)
			require.NoError(t, r.Settle(ctx, 4)) // prev = 4, weighs 2
			require.True(t, allowN(t, l, 8).Allowed)
			require.False(t, allowN(t, l, 1).Allowed)
		})
	}
	c = newClock()
	for name, l := range both(t, ratelimit.PerSecond(10), ratelimit.SlidingWindow, c) {
		t.Run(name+"/overdraft weighs on the next window", func(t *testing.T) {
			c.Set(0)
			r := reserve(t, l, 5)
			c.Set(500 * time.Millisecond)
			require.NoError(t, r.Settle(ctx, 25))
			c.Set(1500 * time.Millisecond) // 25 weigh half: 12
			d := allowN(t, l, 1)
			require.False(t, d.Allowed)
			// floor(25 x (P - e) / P) <= 9 from e = 600001µs on.
			require.Equal(t, usd(100_001), d.RetryAfter)
			c.SetMicro(1_600_001)
			require.True(t, allowN(t, l, 1).Allowed)
		})
	}
}

func TestReserveBuckets(t *testing.T) {
	ctx := context.Background()
	limit := ratelimit.Limit{Rate: 1, Period: time.Second, Burst: 10}
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		c := newClock()
		for name, l := range both(t, limit, alg, c) {
			t.Run(alg.String()+"/"+name+"/refund less what refilled", func(t *testing.T) {
				c.Set(0)
				r := reserve(t, l, 10)
				c.Set(3 * time.Second) // 3 refilled
				// 6 to give back, less the 3 a refill would have restored
				// by now: 3 back, 6 in the bucket.
				require.NoError(t, r.Settle(ctx, 4))
				require.Equal(t, 5, allowN(t, l, 1).Remaining)
				require.True(t, allowN(t, l, 5).Allowed)
				require.False(t, allowN(t, l, 1).Allowed)
			})
		}
		c = newClock()
		for name, l := range both(t, limit, alg, c) {
			t.Run(alg.String()+"/"+name+"/overdraft", func(t *testing.T) {
				c.Set(0)
				r := reserve(t, l, 10)
				require.NoError(t, r.Settle(ctx, 15)) // 5 in debt
				d := allowN(t, l, 1)
				require.False(t, d.Allowed)
				require.Equal(t, 6*time.Second, d.RetryAfter)
				require.Equal(t, 0, d.Remaining)
				c.SetMicro(5_999_999)
				require.False(t, allowN(t, l, 1).Allowed)
				c.Set(6 * time.Second)
				require.True(t, allowN(t, l, 1).Allowed)
			})
		}
	}
}

// TestReserveMultiSettlesEveryLimit: one settlement reaches each limit by
// its own rule.
func TestReserveMultiSettlesEveryLimit(t *testing.T) {
	c := newClock()
	c.us.Store(t0 - t0%60_000_000)
	m := newMulti(t, []ratelimit.Limit{{Rate: 1, Period: time.Second, Burst: 10}, ratelimit.PerMinute(20)},
		[]ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.FixedWindow}, c)
	ctx := context.Background()
	r := reserve(t, m, 10)
	require.NoError(t, r.Settle(ctx, 4))
	d := allowN(t, m, 1)
	require.Equal(t, []int{5, 15}, []int{d.Limits()[0].Remaining, d.Limits()[1].Remaining})

	r = reserve(t, m, 5)
	require.NoError(t, r.Settle(ctx, 20)) // 15 over: the bucket -15, the minute 36
	d = allowN(t, m, 1)
	require.False(t, d.Allowed)
	require.Equal(t, []bool{false, false}, []bool{d.Limits()[0].Allowed, d.Limits()[1].Allowed})
	require.Equal(t, 60*time.Second, d.RetryAfter, "the later of the minute's 60s and the bucket's 16s")
}

func TestReserveErrors(t *testing.T) {
	c := newClock()
	ctx := context.Background()
	l := newLim(t, ratelimit.PerSecond(10), ratelimit.SlidingLog, c)
	_, err := l.Reserve(ctx, "k", 1)
	require.ErrorIs(t, err, ratelimit.ErrInvalidAlgorithm)
	m := newMulti(t, []ratelimit.Limit{ratelimit.PerSecond(10), ratelimit.PerMinute(100)},
		[]ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingLog}, c)
	_, err = m.Reserve(ctx, "k", 1)
	require.ErrorIs(t, err, ratelimit.ErrInvalidAlgorithm)

	for name, l := range both(t, ratelimit.PerSecond(10), ratelimit.FixedWindow, c) {
		_, err := l.Reserve(ctx, "", 1)
		require.ErrorIs(t, err, ratelimit.ErrInvalidKey, name)
		_, err = l.Reserve(ctx, "k", 0)
		require.ErrorIs(t, err, ratelimit.ErrInvalidN, name)
		_, err = l.Reserve(ctx, "k", 11)
		require.ErrorIs(t, err, ratelimit.ErrInvalidN, name)
		// A denied reservation holds nothing.
		reserve(t, l, 10)
		r, err := l.Reserve(ctx, "k", 1)
		require.NoError(t, err, name)
		require.False(t, r.OK(), name)
		require.NoError(t, r.Cancel(ctx), name)
		require.ErrorIs(t, r.Settle(ctx, 1), ratelimit.ErrNotReserved, name)
	}
}

// TestReserveSettleConcurrent: 8 goroutines reserve and settle with random
// actuals (some cancel, some never settle) on one window: its count ends
// at exactly the sum of the actuals plus the unsettled estimates.
func TestReserveSettleConcurrent(t *testing.T) {
	for _, alg := range []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingWindow} {
		t.Run(alg.String(), func(t *testing.T) {
			c := newClock()
			limit := ratelimit.Limit{Rate: 1_000_000, Period: time.Hour}
			var m reserver = newMulti(t, []ratelimit.Limit{limit, ratelimit.PerMinute(1_000_000)}, []ratelimit.Algorithm{alg, ratelimit.FixedWindow}, c)
			var want atomic.Int64
			var wg sync.WaitGroup
			for g := 0; g < 8; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(g), 7))
					ctx := context.Background()
					for i := 0; i < 500; i++ {
						est := 1 + rng.IntN(50)
						r, err := m.Reserve(ctx, "k", est)
						if err != nil || !r.OK() {
							t.Error("reserve", err)
							return
						}
						switch rng.IntN(10) {
						case 0:
							want.Add(int64(est)) // never settled: keeps its estimate
						case 1:
							if err := r.Cancel(ctx); err != nil {
								t.Error(err)
							}
						default:
							actual := rng.IntN(100)
							if err := r.Settle(ctx, actual); err != nil {
								t.Error(err)
							}
							want.Add(int64(actual))
						}
					}
				}()
			}
			wg.Wait()
			d := allowN(t, m, 1)
			require.Equal(t, []int{limit.Rate - int(want.Load()) - 1, 1_000_000 - int(want.Load()) - 1},
				[]int{d.Limits()[0].Remaining, d.Limits()[1].Remaining})
		})
	}
}

var _ reserver = (*local.Multi)(nil)
