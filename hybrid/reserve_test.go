package hybrid_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/faultproxy"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// Settled reservations count their actuals: a smaller one gives the rest
// back, a larger one charges the excess, an unsettled one keeps its
// estimate, Cancel gives it all back; Settle is idempotent.
func TestReserveSettleCounts(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	hour := ratelimit.PerHour(1000)
	idx := freshWindow(t, c, time.Hour, 10*time.Second)
	prefix := uniq(t)
	h, err := hybrid.New(c, hour, hybrid.WithPrefix(prefix))
	require.NoError(t, err)
	defer h.Close()
	ctx := context.Background()

	r, err := h.Reserve(ctx, "k", 10)
	require.NoError(t, err)
	require.True(t, r.OK())
	require.Equal(t, 10, r.Estimate())
	require.NoError(t, r.Settle(ctx, 4))
	require.NoError(t, r.Settle(ctx, 4), "again with the same actual: nothing")
	require.ErrorIs(t, r.Settle(ctx, 5), ratelimit.ErrSettled)
	actual, ok := r.Settled()
	require.True(t, ok)
	require.Equal(t, 4, actual)

	r, err = h.Reserve(ctx, "k", 20)
	require.NoError(t, err)
	require.NoError(t, r.Settle(ctx, 20))
	r, err = h.Reserve(ctx, "k", 5)
	require.NoError(t, err)
	require.NoError(t, r.Cancel(ctx))
	r, err = h.Reserve(ctx, "k", 10)
	require.NoError(t, err)
	require.NoError(t, r.Settle(ctx, 15))
	_, err = h.Reserve(ctx, "k", 7) // never settled: keeps its estimate
	require.NoError(t, err)

	require.NoError(t, h.Flush(ctx))
	require.Equal(t, 4+20+0+15+7, windowCount(t, c, prefix, "k", ratelimit.FixedWindow, hour, idx))

	_, err = h.Reserve(ctx, "k", 0)
	require.ErrorIs(t, err, ratelimit.ErrInvalidN)
	_, err = h.Reserve(ctx, "k", 1001)
	require.ErrorIs(t, err, ratelimit.ErrInvalidN)
	_, err = h.Reserve(ctx, "", 1)
	require.ErrorIs(t, err, ratelimit.ErrInvalidKey)
}

// An overdraft denies the fleet's next requests until it is paid back:
// the window ends (windows) or the bucket refills (buckets).
func TestReserveOverdraft(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	t.Run("window", func(t *testing.T) {
		hour := ratelimit.PerHour(10)
		idx := freshWindow(t, c, time.Hour, 10*time.Second)
		prefix := uniq(t)
		hs, _ := fleet(t, 2, func() redis.UniversalClient { return srv.Client() }, hour, hybrid.WithPrefix(prefix), hybrid.WithInstances(2))
		r, err := hs[0].Reserve(ctx, "k", 5)
		require.NoError(t, err)
		require.True(t, r.OK())
		require.NoError(t, r.Settle(ctx, 25))
		require.NoError(t, hs[0].Flush(ctx))
		require.Equal(t, 25, windowCount(t, c, prefix, "k", ratelimit.FixedWindow, hour, idx))
		for _, h := range hs {
			require.NoError(t, h.Flush(ctx))
			d, err := h.Allow(ctx, "k")
			require.NoError(t, err)
			require.False(t, d.Allowed, "the overdraft is not paid back in this window")
			_, left := serverWindow(t, c, time.Hour)
			require.InDelta(t, left.Seconds(), d.RetryAfter.Seconds(), 5, "until the window ends")
		}
	})
	t.Run("bucket", func(t *testing.T) {
		// 1 token a minute, 5 at most: an overdraft of 3 is paid back
		// after 3 minutes, and a global limiter of the bucket agrees.
		bucket := ratelimit.Limit{Rate: 1, Period: time.Minute, Burst: 5}
		prefix := uniq(t)
		h, err := hybrid.New(c, bucket, hybrid.WithPrefix(prefix), hybrid.WithAlgorithm(ratelimit.TokenBucket))
		require.NoError(t, err)
		defer h.Close()
		r, err := h.Reserve(ctx, "k", 5)
		require.NoError(t, err)
		require.True(t, r.OK())
		require.NoError(t, r.Settle(ctx, 8))
		require.NoError(t, h.Flush(ctx))
		g, err := global.New(c, bucket, global.WithPrefix(prefix), global.WithAlgorithm(ratelimit.TokenBucket))
		require.NoError(t, err)
		d, err := g.Allow(ctx, "k")
		require.NoError(t, err)
		require.False(t, d.Allowed)
		require.InDelta(t, (4 * time.Minute).Seconds(), d.RetryAfter.Seconds(), 2, "3 tokens to repay and 1 to take, at 1 a minute")
		d, err = h.Allow(ctx, "k")
		require.NoError(t, err)
		require.False(t, d.Allowed)
	})
}

// A smaller actual gives tokens back to a bucket: they serve the next
// reservation.
func TestReserveBucketGivesBack(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		bucket := ratelimit.Limit{Rate: 1, Period: time.Hour, Burst: 20}
		h, err := hybrid.New(c, bucket, hybrid.WithPrefix(uniq(t)), hybrid.WithAlgorithm(alg))
		require.NoError(t, err)
		r, err := h.Reserve(ctx, "k", 10)
		require.NoError(t, err)
		require.NoError(t, r.Settle(ctx, 3))
		r, err = h.Reserve(ctx, "k", 17)
		require.NoError(t, err)
		require.True(t, r.OK(), "%v: 20 - 3 tokens are left", alg)
		d, err := h.Allow(ctx, "k")
		require.NoError(t, err)
		require.False(t, d.Allowed, "%v", alg)
		require.NoError(t, h.Close())
	}
}

// Concurrent reservations with random actuals on a fleet of 4: once
// flushed, the window's count in Redis is exactly the sum of the admitted
// reservations' actuals (no window ends meanwhile, so every give-back
// counts). With replies now and then lost on the way, it is never less
// (nothing admitted goes uncounted, and nothing is applied twice): a lease
// call resent after another instance's call on the key cannot be told
// applied or not, and its grant stays counted, unused (the safe side that
// the one replay record per counter buys; see docs/architecture.md).
func TestReserveConcurrentSettle(t *testing.T) {
	t.Run("exact", func(t *testing.T) { testReserveConcurrent(t, false) })
	t.Run("lost replies", func(t *testing.T) { testReserveConcurrent(t, true) })
}

func testReserveConcurrent(t *testing.T, lose bool) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	hour := ratelimit.PerHour(20000)
	idx := freshWindow(t, c, time.Hour, 20*time.Second)
	prefix := uniq(t)
	const instances, workers = 4, 4
	var proxies []*faultproxy.Proxy
	hs, _ := fleet(t, instances, func() redis.UniversalClient {
		p, err := faultproxy.New(srv.Addr())
		require.NoError(t, err)
		t.Cleanup(func() { p.Close() })
		proxies = append(proxies, p)
		return redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1})
	}, hour, hybrid.WithPrefix(prefix), hybrid.WithInstances(instances), hybrid.WithTimeout(100*time.Millisecond))

	var sum, admitted, denied atomic.Int64
	until := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	for i, h := range hs {
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(i), uint64(w)))
				for time.Now().Before(until) {
					time.Sleep(3 * time.Millisecond)
					est := 1 + rng.IntN(20)
					r, err := h.Reserve(context.Background(), "k", est)
					if err != nil {
						t.Errorf("Reserve: %v", err)
						return
					}
					if !r.OK() {
						denied.Add(1)
						continue
					}
					admitted.Add(1)
					actual := rng.IntN(31)
					if rng.IntN(10) == 0 {
						actual = est // settled as estimated: no call at all
					}
					if err := r.Settle(context.Background(), actual); err != nil {
						t.Errorf("Settle: %v", err)
						return
					}
					sum.Add(int64(actual))
				}
			}()
		}
	}
	// lose a reply on one instance or another, now and then
	for i := 0; lose && time.Now().Before(until); i++ {
		time.Sleep(25 * time.Millisecond)
		proxies[i%len(proxies)].DropReplies(1)
	}
	wg.Wait()
	var lost int64
	for _, p := range proxies {
		lost += p.Stats().RepliesDropped
	}
	for _, h := range hs {
		flushUntil(t, h)
	}
	count := windowCount(t, c, prefix, "k", ratelimit.FixedWindow, hour, idx)
	t.Logf("admitted %d, denied %d, actuals %d, replies lost %d; counted in Redis %d", admitted.Load(), denied.Load(), sum.Load(), lost, count)
	require.Positive(t, denied.Load(), "the limit was reached")
	if !lose {
		require.Equal(t, int(sum.Load()), count)
		return
	}
	require.Positive(t, lost, "replies were lost")
	require.GreaterOrEqual(t, count, int(sum.Load()), "nothing admitted goes uncounted")
}

// flushUntil flushes h until a flush succeeds (a reply lost on the way
// fails one).
func flushUntil(t *testing.T, h *hybrid.Limiter) {
	t.Helper()
	for i := 0; ; i++ {
		err := h.Flush(context.Background())
		if err == nil {
			return
		}
		require.Less(t, i, 20, "Flush: %v", err)
		time.Sleep(100 * time.Millisecond)
	}
}

// A Multi's reservation settles on every limit.
func TestMultiReserve(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	hour, day := ratelimit.PerHour(50), ratelimit.Limit{Rate: 100, Period: 24 * time.Hour}
	hourIdx := freshWindow(t, c, time.Hour, 10*time.Second)
	dayIdx, _ := serverWindow(t, c, 24*time.Hour)
	prefix := uniq(t)
	m, err := hybrid.NewMulti(c, []ratelimit.Limit{hour, day}, hybrid.WithPrefix(prefix))
	require.NoError(t, err)
	defer m.Close()
	r, err := m.Reserve(ctx, "k", 10)
	require.NoError(t, err)
	require.True(t, r.OK())
	require.Len(t, r.Decision().Limits(), 2)
	require.NoError(t, r.Settle(ctx, 30))
	r, err = m.Reserve(ctx, "k", 10)
	require.NoError(t, err)
	require.NoError(t, r.Settle(ctx, 2))
	r, err = m.Reserve(ctx, "k", 20)
	require.NoError(t, err)
	require.False(t, r.OK(), "50 - 32 left in the hour")
	require.NoError(t, r.Cancel(ctx))
	require.ErrorIs(t, r.Settle(ctx, 1), ratelimit.ErrNotReserved)
	require.NoError(t, m.Flush(ctx))
	require.Equal(t, 32, windowCount(t, c, prefix, "k", ratelimit.FixedWindow, hour, hourIdx))
	require.Equal(t, 32, windowCount(t, c, prefix, "k", ratelimit.FixedWindow, day, dayIdx), "the denial left the day alone")
}
