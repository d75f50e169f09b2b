package global_test

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/internal/faultproxy"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/hybridlimit/ratelimit/internal/script"
)

// settleLimits are a window per hour, a bucket and a sliding window per
// minute, all far from their limits, so that every reservation is admitted
// and, on a clock that stands still, every refund counts.
var (
	settleLimits = []ratelimit.Limit{
		{Rate: 1_000_000, Period: time.Hour},
		{Rate: 1, Period: time.Second, Burst: 1_000_000},
		{Rate: 1_000_000, Period: time.Minute},
	}
	settleAlgs = []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.TokenBucket, ratelimit.SlidingWindow}
)

// settleState reads what settleLimits hold for key at t0 in Redis: the
// hour's and the minute's counts, and the tokens taken from the bucket.
func settleState(t *testing.T, c redis.UniversalClient, prefix, key string) [3]int64 {
	t.Helper()
	ctx := context.Background()
	base := prefix + ":{" + key + "}:"
	var out [3]int64
	for i, l := range settleLimits {
		p := int64(l.Period / time.Microsecond)
		kind := script.Kind(settleAlgs[i], l)
		switch settleAlgs[i] {
		case ratelimit.TokenBucket:
			u, err := c.HGet(ctx, base+kind, "u").Int64()
			require.NoError(t, err)
			out[i] = (int64(l.Capacity(settleAlgs[i]))*p - u) / p
		default:
			n, err := c.Get(ctx, base+kind+":"+strconv.FormatInt(t0/p, 10)).Int64()
			require.NoError(t, err)
			out[i] = n
		}
	}
	return out
}

// TestSettleThroughLostReplies: 8 goroutines reserve and settle with random
// actuals (refunds, overdrafts, cancels; a tenth never settle) while a
// fault proxy loses the replies to settle calls Redis applied. Settle is
// retried until it succeeds, by the caller (MaxRetries -1) or by go-redis
// itself (its default retries): every limit ends at exactly the sum of the
// actuals and of the unsettled estimates.
func TestSettleThroughLostReplies(t *testing.T) {
	srv := redistest.Standalone(t)
	direct := srv.Client()
	defer direct.Close()
	for _, retries := range []int{-1, 3} {
		t.Run("MaxRetries="+strconv.Itoa(retries), func(t *testing.T) {
			p, err := faultproxy.New(srv.Addr())
			require.NoError(t, err)
			defer p.Close()
			c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: retries, PoolSize: 8})
			defer c.Close()
			clk := &fakeClock{}
			clk.Set(t0)
			prefix := uniquePrefix(t)
			m, err := global.NewMulti(c, settleLimits, global.WithAlgorithms(settleAlgs...), global.WithPrefix(prefix), global.WithClock(clk.Now))
			require.NoError(t, err)

			// Load the script first: its source holds the word the proxy
			// looks for, and a lost reply to a reservation is not what
			// this test is about.
			_, err = m.Allow(context.Background(), "warm")
			require.NoError(t, err)
			stop := make(chan struct{})
			var (
				dropper sync.WaitGroup
				settled atomic.Int64
			)
			dropper.Add(1)
			go func() {
				// Lose the reply to the next settle call, and again once a
				// settle call succeeded since: each lost reply is followed
				// by a success, so that the last caller left, whose every
				// call would otherwise be the next one, is not starved.
				defer dropper.Done()
				for {
					seen := settled.Load()
					p.DropReplyTo([]byte("settle"))
					for settled.Load() == seen {
						select {
						case <-stop:
							return
						case <-time.After(time.Millisecond):
						}
					}
				}
			}()

			var (
				want, failures atomic.Int64
				wg             sync.WaitGroup
			)
			for g := 0; g < 8; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					counted, failed := reserveAndSettle(t, m, uint64(g)<<8|uint64(retries+10), 60, &settled)
					want.Add(counted)
					failures.Add(failed)
				}()
			}
			wg.Wait()
			close(stop)
			dropper.Wait()
			p.DropReplyTo(nil)
			s := want.Load()
			require.Equal(t, [3]int64{s, s, s}, settleState(t, direct, prefix, "k"))
			dropped := p.Stats().RepliesDropped
			t.Logf("sum %d; %d replies lost, %d Settle calls failed and were retried", s, dropped, failures.Load())
			require.Positive(t, dropped)
			if retries < 0 {
				require.Positive(t, failures.Load())
			}
		})
	}
	requireAllTTL(t, direct)
}

// reserveAndSettle makes count reservations of random estimates on key "k"
// and settles them with random actuals (refunds, overdrafts, cancels; a
// tenth are never settled), retrying each Settle until it succeeds. It
// returns what they leave counted and how many Settle calls failed, and
// counts each settle that succeeded in settled, if not nil. It may run on
// any goroutine.
func reserveAndSettle(t *testing.T, m *global.Multi, seed uint64, count int, settled *atomic.Int64) (counted, failures int64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	ctx := context.Background()
	for i := 0; i < count; i++ {
		est := 1 + rng.IntN(50)
		r, err := m.Reserve(ctx, "k", est)
		if err != nil || !r.OK() {
			t.Error("reserve", err)
			return
		}
		actual := est
		switch rng.IntN(10) {
		case 0: // never settled
			counted += int64(est)
			continue
		case 1:
			actual = 0
		default:
			actual = rng.IntN(100)
		}
		for try := 0; ; try++ {
			err := r.Settle(ctx, actual)
			if err == nil {
				if settled != nil {
					settled.Add(1)
				}
				break
			}
			failures++
			if try == 50 {
				t.Error("settle keeps failing:", err)
				return
			}
		}
		if err := r.Settle(ctx, actual); err != nil {
			t.Error("settled again with the same actual:", err)
		}
		counted += int64(actual)
	}
	return counted, failures
}

// TestSettleConcurrentCluster is the same without faults on a Cluster, from
// 16 clients.
func TestSettleConcurrentCluster(t *testing.T) {
	cl := redistest.NewCluster(t)
	clk := &fakeClock{}
	clk.Set(t0)
	prefix := uniquePrefix(t)
	var want atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		c := cl.Client()
		defer c.Close()
		m, err := global.NewMulti(c, settleLimits, global.WithAlgorithms(settleAlgs...), global.WithPrefix(prefix), global.WithClock(clk.Now))
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			counted, failed := reserveAndSettle(t, m, uint64(g)<<8|99, 50, nil)
			want.Add(counted)
			if failed > 0 {
				t.Errorf("%d Settle calls failed without faults", failed)
			}
		}()
	}
	wg.Wait()
	c := cl.Client()
	defer c.Close()
	s := want.Load()
	require.Equal(t, [3]int64{s, s, s}, settleState(t, c, prefix, "k"))
	requireAllTTL(t, c)
}

// TestSettleRecord: a settlement leaves one small record with an expiry; a
// second Settle with the same actual finds it and changes nothing, one with
// another actual is refused, even from a Reservation that does not know it
// settled (its reply was lost); settling at the estimate, or a denied
// reservation, writes nothing.
func TestSettleRecord(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	clk := &fakeClock{}
	clk.Set(t0)
	prefix := uniquePrefix(t)
	m, err := global.NewMulti(c, settleLimits, global.WithAlgorithms(settleAlgs...), global.WithPrefix(prefix), global.WithClock(clk.Now))
	require.NoError(t, err)

	r, err := m.Reserve(ctx, "k", 10)
	require.NoError(t, err)
	require.NoError(t, r.Settle(ctx, 10))
	require.Empty(t, keysLike(t, c, prefix+":{k}:rsv:*"), "the estimate needs no record")

	r, err = m.Reserve(ctx, "k", 10)
	require.NoError(t, err)
	require.NoError(t, r.Settle(ctx, 4))
	rec := keysLike(t, c, prefix+":{k}:rsv:*")
	require.Len(t, rec, 1)
	ttl, err := c.PTTL(ctx, rec[0]).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, global.SettleRecordTTL-5*time.Second)
	require.LessOrEqual(t, ttl, global.SettleRecordTTL)
	mem, err := c.MemoryUsage(ctx, rec[0], 0).Result()
	require.NoError(t, err)
	t.Logf("record %s: MEMORY USAGE %d bytes", rec[0], mem)
	require.Less(t, mem, int64(128))
	require.Equal(t, [3]int64{14, 14, 14}, settleState(t, c, prefix, "k"))
	require.NoError(t, r.Settle(ctx, 4))
	require.ErrorIs(t, r.Settle(ctx, 5), ratelimit.ErrSettled)

	// A lost reply: the Reservation does not know, Redis does.
	p, err := faultproxy.New(srv.Addr())
	require.NoError(t, err)
	defer p.Close()
	pc := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1})
	defer pc.Close()
	pm, err := global.NewMulti(pc, settleLimits, global.WithAlgorithms(settleAlgs...), global.WithPrefix(prefix), global.WithClock(clk.Now))
	require.NoError(t, err)
	r, err = pm.Reserve(ctx, "k", 10)
	require.NoError(t, err)
	p.DropReplyTo([]byte("settle"))
	require.Error(t, r.Settle(ctx, 30))
	require.Equal(t, [3]int64{44, 44, 44}, settleState(t, c, prefix, "k"), "applied, reply lost")
	require.ErrorIs(t, r.Settle(ctx, 31), ratelimit.ErrSettled, "Redis knows it settled with 30")
	require.NoError(t, r.Settle(ctx, 30))
	require.Equal(t, [3]int64{44, 44, 44}, settleState(t, c, prefix, "k"), "applied once")

	// A denied reservation holds nothing and writes nothing.
	tight, err := global.NewMulti(c, []ratelimit.Limit{ratelimit.PerSecond(1)}, global.WithPrefix(prefix+"t"), global.WithClock(clk.Now))
	require.NoError(t, err)
	_, err = tight.Allow(ctx, "k")
	require.NoError(t, err)
	before := dump(t, c, prefix+"t:*")
	r, err = tight.Reserve(ctx, "k", 1)
	require.NoError(t, err)
	require.False(t, r.OK())
	require.NoError(t, r.Cancel(ctx))
	require.ErrorIs(t, r.Settle(ctx, 1), ratelimit.ErrNotReserved)
	require.Equal(t, before, dump(t, c, prefix+"t:*"))
}

// TestSettleLateRetry: a retry so late that the first attempt's record may
// have expired gives nothing back (the refund might be given twice) and
// charges an overdraft again (counted twice: the safe side).
func TestSettleLateRetry(t *testing.T) {
	defer global.SetSettleLate(50 * time.Millisecond)()
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	p, err := faultproxy.New(srv.Addr())
	require.NoError(t, err)
	defer p.Close()
	pc := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1})
	defer pc.Close()
	ctx := context.Background()
	clk := &fakeClock{}
	clk.Set(t0)
	prefix := uniquePrefix(t)
	m, err := global.NewMulti(pc, settleLimits, global.WithAlgorithms(settleAlgs...), global.WithPrefix(prefix), global.WithClock(clk.Now))
	require.NoError(t, err)
	expire := func() { // the record's expiry, at once
		t.Helper()
		for _, k := range keysLike(t, c, prefix+":{k}:rsv:*") {
			require.NoError(t, c.Del(ctx, k).Err())
		}
	}

	for _, tc := range []struct {
		est, actual int
		first, late int64 // the counts after the first attempt and after the late retry
		why         string
	}{
		{10, 2, 2, 2, "no second refund"},
		{5, 9, 11, 15, "the overdraft of 4 again"},
	} {
		r, err := m.Reserve(ctx, "k", tc.est)
		require.NoError(t, err)
		p.DropReplyTo([]byte("settle"))
		require.Error(t, r.Settle(ctx, tc.actual))
		require.Equal(t, [3]int64{tc.first, tc.first, tc.first}, settleState(t, c, prefix, "k"), "applied, reply lost")
		expire()
		time.Sleep(60 * time.Millisecond)
		require.NoError(t, r.Settle(ctx, tc.actual))
		require.Equal(t, [3]int64{tc.late, tc.late, tc.late}, settleState(t, c, prefix, "k"), tc.why)
	}
}

// TestReserveOverdraft: an overdraft denies the next requests until it is
// paid back, the window's end for a FixedWindow, the refill for a bucket.
func TestReserveOverdraft(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	clk := &fakeClock{}
	clk.Set(t0)
	m := newMulti(t, c, []ratelimit.Limit{ratelimit.PerSecond(10), {Rate: 5, Period: time.Second, Burst: 10}},
		[]ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.TokenBucket}, global.WithClock(clk.Now))
	r, err := m.Reserve(ctx, "k", 5)
	require.NoError(t, err)
	require.True(t, r.OK())
	require.NoError(t, r.Settle(ctx, 20)) // the window at 20 of 10; the bucket 10 in debt
	d, err := m.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, []time.Duration{time.Second, 2200 * time.Millisecond}, []time.Duration{d.Limits()[0].RetryAfter, d.Limits()[1].RetryAfter})
	require.Equal(t, 2200*time.Millisecond, d.RetryAfter)
	clk.Add(2199 * time.Millisecond)
	d, err = m.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, d.Allowed, "the window rolled, the bucket is still in debt")
	require.True(t, d.Limits()[0].Allowed)
	clk.Add(time.Millisecond)
	d, err = m.Allow(ctx, "k")
	require.NoError(t, err)
	require.True(t, d.Allowed, "repaid")
}

// TestLimiterReserve: global's Limiter reserves from the state its AllowN
// counts in.
func TestLimiterReserve(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	clk := &fakeClock{}
	clk.Set(t0)
	for _, alg := range []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingWindow, ratelimit.TokenBucket, ratelimit.GCRA} {
		l := newLimiter(t, c, ratelimit.Limit{Rate: 10, Period: time.Second}, global.WithAlgorithm(alg), global.WithClock(clk.Now))
		r, err := l.Reserve(ctx, "k", 8)
		require.NoError(t, err)
		require.Equal(t, 2, r.Decision().Remaining, alg)
		require.Nil(t, r.Decision().Limits(), "a single limit lists none")
		require.False(t, must(l.AllowN(ctx, "k", 3)).Allowed, alg)
		require.NoError(t, r.Settle(ctx, 5))
		require.True(t, must(l.AllowN(ctx, "k", 5)).Allowed, alg)
		require.False(t, must(l.Allow(ctx, "k")).Allowed, alg)
	}
	l := newLimiter(t, c, ratelimit.PerSecond(10), global.WithAlgorithm(ratelimit.SlidingLog))
	_, err := l.Reserve(ctx, "k", 1)
	require.ErrorIs(t, err, ratelimit.ErrInvalidAlgorithm)
	m := newMulti(t, c, []ratelimit.Limit{ratelimit.PerSecond(10), ratelimit.PerMinute(10)},
		[]ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingLog})
	_, err = m.Reserve(ctx, "k", 1)
	require.ErrorIs(t, err, ratelimit.ErrInvalidAlgorithm)
}

func must(d ratelimit.Decision, err error) ratelimit.Decision {
	if err != nil {
		panic(err)
	}
	return d
}

func keysLike(t *testing.T, c *redis.Client, pattern string) []string {
	t.Helper()
	keys, err := c.Keys(context.Background(), pattern).Result()
	require.NoError(t, err)
	return keys
}
