package hybrid_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/faultproxy"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/hybridlimit/ratelimit/internal/script"
)

// A key's first decision in two windows is one exact call and no counter:
// Redis counts exactly its unit, the key table does not grow, no lease is
// taken (FixedWindow and SlidingWindow, whose call is a plain sliding
// call). Asked again in the window, the key gets its counter and leases,
// as a key with a counter all along would have (its first use counted).
func TestFirstDecisionNoCounter(t *testing.T) {
	srv := redistest.Standalone(t)
	for _, alg := range []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingWindow} {
		t.Run(alg.String(), func(t *testing.T) { firstDecisionNoCounter(t, srv, alg) })
	}
}

func firstDecisionNoCounter(t *testing.T, srv *redistest.Server, alg ratelimit.Algorithm) {
	c := srv.Client()
	defer c.Close()
	prefix := uniq(t)
	limit := ratelimit.PerHour(1000)
	idx := freshWindow(t, c, time.Hour, 30*time.Second)
	redisCount := func(t *testing.T, c *redis.Client, prefix, key string, idx int64) int {
		return windowCount(t, c, prefix, key, alg, limit, idx)
	}
	h, err := hybrid.New(c, limit, hybrid.WithPrefix(prefix), hybrid.WithInstances(1), hybrid.WithAlgorithm(alg))
	require.NoError(t, err)
	defer h.Close()
	ctx := context.Background()
	_, err = h.Allow(ctx, "warm") // Redis time learnt: the next calls know their window
	require.NoError(t, err)
	before := h.Stats()
	const n = 50
	for i := range n {
		d, err := h.Allow(ctx, fmt.Sprint("first-", i))
		require.NoError(t, err)
		require.True(t, d.Allowed)
		require.Equal(t, 999, d.Remaining)
		require.Greater(t, d.ResetAfter, 29*time.Second)
	}
	s := h.Stats()
	require.Equal(t, before.KeysTracked, s.KeysTracked, "no counter made")
	require.Equal(t, uint64(n), s.ExactDecisions-before.ExactDecisions)
	require.Equal(t, uint64(n), s.Allowed-before.Allowed)
	require.Equal(t, before.LocalDecisions, s.LocalDecisions, "each waited on Redis")
	require.Equal(t, before.Leases, s.Leases, "no lease taken")
	for i := range n {
		require.Equal(t, 1, redisCount(t, c, prefix, fmt.Sprint("first-", i), idx))
	}

	d, err := h.Allow(ctx, "first-0") // again in the window: warm (asked twice)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	s2 := h.Stats()
	require.Equal(t, s.KeysTracked+1, s2.KeysTracked)
	// (the grant is counted once applied, which the decision need not wait for)
	require.Eventually(t, func() bool { return h.Stats().Leases == s.Leases+1 }, 5*time.Second, time.Millisecond,
		"a key asked twice in a window leases")
	require.Equal(t, s.ExactDecisions, s2.ExactDecisions)
	require.NoError(t, h.Flush(ctx))
	require.Equal(t, 2, redisCount(t, c, prefix, "first-0", idx), "after Flush Redis counts what was admitted")
}

// A first decision whose reply comes after it stopped waiting (strict:
// denied) leaves nothing counted once the reply is in: the key gets a
// counter to owe the unit back, and the syncer gives it back. A denial
// makes a counter too, which then denies in memory until the window ends.
// (A lone decision's own call that runs on its goroutine is not read past
// the decision's timeout: it stays counted, in doubt, and the lone calls
// of the next four timeouts go through a runner, whose late replies are
// read: see TestLoneDecisionLate. The late decision here is such a one.)
func TestFirstDecisionAbandonedOrDenied(t *testing.T) {
	srv := redistest.Standalone(t)
	direct := srv.Client()
	defer direct.Close()
	p, err := faultproxy.New(srv.Addr())
	require.NoError(t, err)
	defer p.Close()
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1})
	defer c.Close()
	prefix := uniq(t)
	idx := freshWindow(t, direct, time.Hour, 30*time.Second)
	const timeout = 100 * time.Millisecond
	limit := ratelimit.PerHour(1000)
	h, err := hybrid.New(c, limit, hybrid.WithPrefix(prefix), hybrid.WithInstances(1), hybrid.WithTimeout(timeout))
	require.NoError(t, err)
	defer h.Close()
	ctx := context.Background()
	_, err = h.Allow(ctx, "warm")
	require.NoError(t, err)
	before := h.Stats()

	p.SetLatency(timeout) // a round trip of twice the timeout
	for _, key := range []string{"in-doubt", "late"} {
		d, err := h.Allow(ctx, key)
		require.NoError(t, err)
		require.False(t, d.Allowed, "%s: strict: no reply in time is a denial", key)
	}
	p.SetLatency(0)
	require.Eventually(t, func() bool { return h.Stats().KeysTracked == before.KeysTracked+2 }, 5*time.Second, 10*time.Millisecond,
		"each key denied has a counter, the late one's to owe its reply's unit back: %d keys tracked, %d before", h.Stats().KeysTracked, before.KeysTracked)
	require.NoError(t, h.Flush(ctx))
	require.Equal(t, 0, redisCount(t, direct, prefix, "late", idx), "the late reply's unit given back")
	require.Equal(t, 1, redisCount(t, direct, prefix, "in-doubt", idx), "the call not read stays counted: the safe side")
	require.False(t, h.Stats().Degraded, "a slow reply is not an outage")

	// Over the limit: the window holds 1000 already.
	base, err := script.KeyBase(prefix, "full")
	require.NoError(t, err)
	require.NoError(t, direct.HSet(ctx, script.WindowKey(base, script.Kind(ratelimit.FixedWindow, limit), idx), "c", 1000).Err())
	tracked := h.Stats().KeysTracked
	d, err := h.Allow(ctx, "full")
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Positive(t, d.RetryAfter)
	require.Equal(t, tracked+1, h.Stats().KeysTracked, "a denial makes the key's counter")
	require.NoError(t, h.Flush(ctx))
	require.Equal(t, 1000, redisCount(t, direct, prefix, "full", idx), "the denied unit given back")
	rts := h.Stats().SyncRoundTrips
	d, err = h.Allow(ctx, "full")
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, rts, h.Stats().SyncRoundTrips, "denied in memory after the denial")
}

// A lone decision sends its own call (its instance has nothing else on
// its way to Redis); when its context ends while the call is out, it
// returns with the context's error, whatever the client's options (at
// once; or, with ContextTimeoutEnabled, where the call runs on the
// decision's goroutine, once the call returns), and its call's reply is
// owed back and given back; the next lone decision sends its own call
// again.
func TestLoneDecisionCanceled(t *testing.T) {
	srv := redistest.Standalone(t)
	for _, ctxTimeouts := range []bool{false, true} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", ctxTimeouts), func(t *testing.T) {
			direct, p, h, prefix, idx := loneLimiter(t, srv, ctxTimeouts, 5*time.Second)
			// The connection made and the scripts loaded first: a new
			// connection's handshake and a NOSCRIPT's reload would add
			// round trips of 600ms each to the call below, and take it
			// past the 5s its decision gives it.
			d, err := h.Allow(context.Background(), "warm")
			require.NoError(t, err)
			require.True(t, d.Allowed)
			before := h.Stats()

			p.SetLatency(300 * time.Millisecond)
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(50*time.Millisecond, cancel)
			_, err = h.Allow(ctx, "canceled")
			require.ErrorIs(t, err, context.Canceled, "its context ended before the reply (600ms away)")
			p.SetLatency(0)
			require.Eventually(t, func() bool { return h.Stats().KeysTracked == before.KeysTracked+1 }, 5*time.Second, 10*time.Millisecond,
				"the late reply's unit is owed by a counter")
			require.NoError(t, h.Flush(context.Background()))
			require.Equal(t, 0, redisCount(t, direct, prefix, "canceled", idx), "the late reply's unit given back")

			rts := h.Stats().SyncRoundTrips
			d, err = h.Allow(context.Background(), "next")
			require.NoError(t, err)
			require.True(t, d.Allowed)
			require.Equal(t, rts+1, h.Stats().SyncRoundTrips, "one round trip, its own")
			require.Equal(t, 1, redisCount(t, direct, prefix, "next", idx))
		})
	}
}

// loneLimiter returns a client of srv, a fault proxy in front of srv, and
// a Limiter of 1,000 an hour for one instance through the proxy (its
// client with ContextTimeoutEnabled when ctxTimeouts), with its prefix
// and the index of an hour window with 30s or more left; all closed when
// the test ends.
func loneLimiter(t *testing.T, srv *redistest.Server, ctxTimeouts bool, timeout time.Duration) (*redis.Client, *faultproxy.Proxy, *hybrid.Limiter, string, int64) {
	t.Helper()
	direct := srv.Client()
	t.Cleanup(func() { direct.Close() })
	p, err := faultproxy.New(srv.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, ContextTimeoutEnabled: ctxTimeouts})
	t.Cleanup(func() { c.Close() })
	prefix := uniq(t)
	idx := freshWindow(t, direct, time.Hour, 30*time.Second)
	h, err := hybrid.New(c, ratelimit.PerHour(1000), hybrid.WithPrefix(prefix), hybrid.WithInstances(1), hybrid.WithTimeout(timeout))
	require.NoError(t, err)
	t.Cleanup(func() { h.Close() })
	return direct, p, h, prefix, idx
}

// A lone decision's own call runs on its goroutine, given until the
// decision's timeout: with ContextTimeoutEnabled by the client itself, on
// go-redis's defaults by a clone of the client whose reads and writes
// time out then (see timedClients). A reply later than that is not
// waited for: the decision is denied (strict) at its timeout, and a slow
// reply is not an outage (the breaker stays closed). For a while after,
// lone decisions' calls go through a runner at a call's deadline (4
// timeouts), as a Cluster client without ContextTimeoutEnabled has them:
// a reply later than the decision's timeout is then still read, and its
// unit owed back and given back.
func TestLoneDecisionLate(t *testing.T) {
	srv := redistest.Standalone(t)
	for _, ctxTimeouts := range []bool{false, true} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", ctxTimeouts), func(t *testing.T) {
			const timeout = 100 * time.Millisecond
			direct, p, h, prefix, idx := loneLimiter(t, srv, ctxTimeouts, timeout)
			ctx := context.Background()
			d, err := h.Allow(ctx, "warm")
			require.NoError(t, err)
			require.True(t, d.Allowed)

			p.SetLatency(timeout) // a round trip of twice the timeout
			for i, key := range []string{"inline", "runner"} {
				start := time.Now()
				d, err := h.Allow(ctx, key)
				took := time.Since(start)
				require.NoError(t, err, key)
				require.False(t, d.Allowed, "%s: strict: no reply in time is a denial", key)
				require.False(t, h.Stats().Degraded, "%s: a slow reply is not an outage", key)
				require.Less(t, took, timeout+timeout/2, "%s: the decision waited %v", key, took)
				if i == 0 {
					_, lost := hybrid.ExactCalls(h)
					require.EqualValues(t, 1, lost, "the first call, on the decision's goroutine, was not waited for past the decision's timeout")
				}
			}
			require.Eventually(t, func() bool { out, _ := hybrid.ExactCalls(h); return out == 0 }, 5*time.Second, 10*time.Millisecond,
				"the second decision's call came back")
			_, lost := hybrid.ExactCalls(h)
			require.EqualValues(t, 1, lost, "the second decision's call, through a runner, had its late reply read")
			p.SetLatency(0)
			require.NoError(t, h.Flush(ctx))
			require.Equal(t, 0, redisCount(t, direct, prefix, "runner", idx), "and its unit given back")
			require.False(t, h.Stats().Degraded)
			d, err = h.Allow(ctx, "after")
			require.NoError(t, err)
			require.True(t, d.Allowed)
			require.Equal(t, 1, redisCount(t, direct, prefix, "after", idx))
		})
	}
}

// On a crowded instance (its decisions' round trips carry dozens of calls)
// a key asked once in each of two windows running, or fewer than 4 times in
// one, makes no counter: each of its decisions is one exact call. At its
// 4th decision of a window it gets its counter and leases, and from then on
// it is found (decided in memory), crowded or not. An instance that is not
// crowded makes the counter at a key's decision in the second window, as
// before.
func TestCrowdedKeysStayExact(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	prefix := uniq(t)
	crowded, err := hybrid.New(c, ratelimit.PerSecond(1000), hybrid.WithPrefix(prefix+"c"), hybrid.WithInstances(1))
	require.NoError(t, err)
	defer crowded.Close()
	calm, err := hybrid.New(c, ratelimit.PerSecond(1000), hybrid.WithPrefix(prefix+"q"), hybrid.WithInstances(1))
	require.NoError(t, err)
	defer calm.Close()
	ctx := context.Background()
	allow := func(h *hybrid.Limiter, key string) {
		t.Helper()
		if h == crowded {
			hybrid.Crowd(h, 64)
		}
		d, err := h.Allow(ctx, key)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	for _, h := range []*hybrid.Limiter{crowded, calm} {
		allow(h, "warm") // Redis time learnt: the next calls know their window
	}
	const n = 20
	cb, qb := crowded.Stats(), calm.Stats()
	for w := range 2 {
		idx := freshWindow(t, c, time.Second, 700*time.Millisecond)
		if w == 0 {
			cb, qb = crowded.Stats(), calm.Stats()
		}
		for i := range n {
			allow(crowded, fmt.Sprint("k-", i))
			allow(calm, fmt.Sprint("k-", i))
		}
		for i := range n {
			require.Equal(t, 1, redisCount(t, c, prefix+"c", fmt.Sprint("k-", i), idx))
		}
		if w == 0 {
			_, left := serverWindow(t, c, time.Second)
			time.Sleep(left + 20*time.Millisecond)
		}
	}
	cs, qs := crowded.Stats(), calm.Stats()
	require.Equal(t, cb.KeysTracked, cs.KeysTracked, "crowded: asked once in each of two windows, no counter")
	require.Equal(t, uint64(2*n), cs.ExactDecisions-cb.ExactDecisions)
	require.Equal(t, cb.Leases, cs.Leases)
	require.Equal(t, qb.KeysTracked+n, qs.KeysTracked, "not crowded: the second window's decision makes the counter")

	// 4 decisions of one key in a window, crowded: the 4th makes the counter.
	idx := freshWindow(t, c, time.Second, 700*time.Millisecond)
	before := crowded.Stats()
	for range 3 {
		allow(crowded, "busy")
	}
	require.Equal(t, before.KeysTracked, crowded.Stats().KeysTracked, "3 decisions in a window: no counter yet")
	allow(crowded, "busy")
	s := crowded.Stats()
	require.Equal(t, before.KeysTracked+1, s.KeysTracked, "the 4th decision in a window makes the counter")
	require.Eventually(t, func() bool { return crowded.Stats().Leases == before.Leases+1 }, 5*time.Second, time.Millisecond,
		"its counter leases")
	require.Equal(t, 3, redisCount(t, c, prefix+"c", "busy", idx)-int(crowded.Stats().LeasedUnits-before.LeasedUnits),
		"3 exact units counted before the lease")
	allow(crowded, "busy")
	require.Equal(t, s.LocalDecisions+1, crowded.Stats().LocalDecisions, "a crowded instance finds the key's counter")
}

// A bucket key's first decision is one call of the bucket script for its
// units and no counter, as a window key's: the key table does not grow, no
// lease is taken, and a global limiter of the same bucket sees the token
// taken. Asked again in the instance's period, the key gets its counter.
func TestFirstBucketDecisionNoCounter(t *testing.T) {
	srv := redistest.Standalone(t)
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		t.Run(alg.String(), func(t *testing.T) {
			c := srv.Client()
			defer c.Close()
			prefix := uniq(t)
			limit := ratelimit.PerHour(1000)
			h, err := hybrid.New(c, limit, hybrid.WithPrefix(prefix), hybrid.WithInstances(1), hybrid.WithAlgorithm(alg))
			require.NoError(t, err)
			defer h.Close()
			ctx := context.Background()
			before := h.Stats()
			const n = 50
			for i := range n {
				d, err := h.Allow(ctx, fmt.Sprint("first-", i))
				require.NoError(t, err)
				require.True(t, d.Allowed)
				require.Equal(t, 999, d.Remaining)
			}
			s := h.Stats()
			require.Equal(t, before.KeysTracked, s.KeysTracked, "no counter made")
			require.Equal(t, uint64(n), s.ExactDecisions-before.ExactDecisions)
			require.Equal(t, before.Leases, s.Leases, "no lease taken")
			g, err := global.New(c, limit, global.WithPrefix(prefix), global.WithAlgorithm(alg))
			require.NoError(t, err)
			d, err := g.Allow(ctx, "first-1")
			require.NoError(t, err)
			require.True(t, d.Allowed)
			require.InDelta(t, 998, d.Remaining, 1, "the global limiter sees the hybrid's token taken")

			_, err = h.Allow(ctx, "first-0") // again: the key gets its counter
			require.NoError(t, err)
			require.Equal(t, s.KeysTracked+1, h.Stats().KeysTracked)
		})
	}
}

// A bucket key asked once in each of two of the instance's periods running
// gets its counter and leases at the second ask, as a FixedWindow key
// asked in two windows running does (a lease left unused is left to the
// refill, no refund sent: see buckets.refill); asked once in a period and
// then not in the next, it stays without one.
func TestBucketAskedInTwoPeriodsLeases(t *testing.T) {
	srv := redistest.Standalone(t)
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		t.Run(alg.String(), func(t *testing.T) {
			c := srv.Client()
			defer c.Close()
			clk := &fakeClock{}
			clk.ns.Store(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
			h, err := hybrid.New(c, ratelimit.PerSecond(1000), hybrid.WithPrefix(uniq(t)), hybrid.WithInstances(1),
				hybrid.WithAlgorithm(alg), hybrid.WithClock(clk.now))
			require.NoError(t, err)
			defer h.Close()
			ctx := context.Background()
			allow := func(key string) {
				t.Helper()
				d, err := h.Allow(ctx, key)
				require.NoError(t, err)
				require.True(t, d.Allowed)
			}
			allow("k")
			allow("quiet")
			s := h.Stats()
			require.Equal(t, uint64(2), s.ExactDecisions, "first decisions: exact calls")
			require.Zero(t, s.KeysTracked, "no counter made")

			clk.advance(time.Second) // the next period
			allow("k")
			require.Equal(t, 1, h.Stats().KeysTracked, "asked in two periods running: a counter")
			require.Eventually(t, func() bool { return h.Stats().Leases == 1 }, 5*time.Second, time.Millisecond,
				"asked in two periods running: a lease")
			require.Equal(t, uint64(2), h.Stats().ExactDecisions, "the second ask leased, not an exact call")

			clk.advance(time.Second) // "quiet" was not asked in the period between
			allow("quiet")
			require.Equal(t, uint64(3), h.Stats().ExactDecisions, "asked again after a period without: exact")
			require.Equal(t, 1, h.Stats().KeysTracked)
		})
	}
}
