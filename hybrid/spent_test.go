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

// spentLimit is a limit too small to lease over four instances, with a
// window long enough that a test runs inside one (see awayFromEdge).
var spentLimit = ratelimit.Limit{Rate: 1, Period: time.Hour}

// awayFromEdge waits, when Redis time is within a minute of the end of a
// spentLimit window, until the next one has begun. It returns when the
// window then current ends.
func awayFromEdge(t *testing.T, c redis.UniversalClient) time.Time {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	require.NoError(t, err)
	end := now.Truncate(spentLimit.Period).Add(spentLimit.Period)
	if left := end.Sub(now); left < time.Minute {
		time.Sleep(left + 100*time.Millisecond)
		end = end.Add(spentLimit.Period)
	}
	return end
}

// spentFleet starts n instances of spentLimit, each on a client of
// newClient, once Redis time is away from a window's edge; it returns
// them and when the window then current ends.
func spentFleet(t *testing.T, n int, newClient func() redis.UniversalClient, opts ...hybrid.Option) ([]*hybrid.Limiter, time.Time) {
	t.Helper()
	rc := newClient()
	defer rc.Close()
	end := awayFromEdge(t, rc)
	hs, _ := fleet(t, n, newClient, spentLimit, append([]hybrid.Option{hybrid.WithPrefix(uniq(t)), hybrid.WithInstances(n)}, opts...)...)
	return hs, end
}

// fillAll admits each key once on h: with spentLimit, each fills its window.
func fillAll(t *testing.T, h *hybrid.Limiter, keys []string) {
	t.Helper()
	for _, k := range keys {
		d, err := h.Allow(context.Background(), k)
		require.NoError(t, err)
		require.True(t, d.Allowed, k)
		require.Zero(t, d.Remaining, k)
	}
}

// heardAll waits until each limiter has heard at least n words of windows
// spent.
func heardAll(t *testing.T, hs []*hybrid.Limiter, n int) {
	t.Helper()
	for i, h := range hs {
		require.Eventually(t, func() bool { return h.Stats().SpentHeard >= uint64(n) }, 10*time.Second, 5*time.Millisecond,
			"instance %d heard %d of %d", i, h.Stats().SpentHeard, n)
	}
}

// The instance whose call fills a window of a limit too small to lease
// tells the fleet, and the others deny the key in memory until the window
// ends: no round trip waited on, none over the limit. Standalone and
// Cluster (where the words go at the tick, and PUBLISH reaches every node).
func TestSpentWordStandalone(t *testing.T) {
	srv := redistest.Standalone(t)
	spentWord(t, func() redis.UniversalClient { return srv.Client() })
}

func TestSpentWordCluster(t *testing.T) {
	cl := redistest.NewCluster(t)
	spentWord(t, func() redis.UniversalClient { return cl.Client() })
}

// A SlidingWindow window is spent when its own count reaches the limit
// (the previous window's weight only adds to what bounds it), which a
// plain sliding call reads: the same word, once the filling instance has
// a sample of Redis time (before it, lease.lua decides, and tells only
// the bound).
func TestSpentWordSliding(t *testing.T) {
	srv := redistest.Standalone(t)
	spentWord(t, func() redis.UniversalClient { return srv.Client() }, hybrid.WithAlgorithm(ratelimit.SlidingWindow))
}

func spentWord(t *testing.T, newClient func() redis.UniversalClient, opts ...hybrid.Option) {
	ctx := context.Background()
	hs, end := spentFleet(t, 4, newClient, opts...)
	// Each subscribes at New on a goroutine of its own: a word published
	// before an instance's subscription is in place does not reach it (it
	// asks Redis then, as one that never hears), so the count of words
	// heard starts once every instance is subscribed.
	for i, h := range hs {
		require.Eventually(t, func() bool { return hybrid.SpentSubscriptions(h) >= 1 }, 10*time.Second, time.Millisecond,
			"instance %d subscribed", i)
	}
	keys := numberedKeys("spent-", 200)
	warmed := 0
	if hs[0].Algorithm() == ratelimit.SlidingWindow {
		// a sample of Redis time first: then the keys' calls are plain
		d, err := hs[0].Allow(ctx, "warm")
		require.NoError(t, err)
		require.True(t, d.Allowed)
		warmed = 1
	}
	fillAll(t, hs[0], keys)
	heardAll(t, hs, len(keys))
	require.EqualValues(t, len(keys), hs[0].Stats().SpentSent)
	for i, h := range hs {
		before := h.Stats()
		for _, k := range keys {
			d, err := h.Allow(ctx, k)
			require.NoError(t, err)
			require.False(t, d.Allowed, "instance %d, %s", i, k)
			require.InDelta(t, time.Until(end), d.RetryAfter, float64(5*time.Second), "denied until the window's end")
		}
		after := h.Stats()
		require.Equal(t, before.SyncRoundTrips, after.SyncRoundTrips, "instance %d waited on Redis", i)
		require.EqualValues(t, len(keys), after.Denied-before.Denied)
		require.EqualValues(t, len(keys), after.LocalDecisions-before.LocalDecisions)
		if i > 0 {
			require.EqualValues(t, len(keys), after.SpentDenied, "instance %d: keys without a counter", i)
		}
	}
	require.EqualValues(t, len(keys)+warmed, sumStats(hs).Allowed)
}

// Redis restarted (its counts gone): the subscription is made anew and
// every word heard is forgotten, so the fleet admits again what the new
// Redis counts.
func TestSpentWordForgottenOnRestart(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	hs, _ := spentFleet(t, 4, func() redis.UniversalClient { return srv.Client() })
	keys := numberedKeys("restart-", 50)
	fillAll(t, hs[0], keys)
	heardAll(t, hs, len(keys))
	subs := make([]uint64, len(hs))
	for i, h := range hs {
		subs[i] = hybrid.SpentSubscriptions(h)
		require.EqualValues(t, 1, subs[i])
	}
	require.NoError(t, srv.Restart())
	for i, h := range hs {
		require.Eventually(t, func() bool { return hybrid.SpentSubscriptions(h) > subs[i] }, 15*time.Second, 10*time.Millisecond,
			"instance %d subscribed anew", i)
	}
	// Each key once more, on an instance that heard it spent: the new Redis
	// has room, and the breaker, open or not, gives no more than the limit.
	allowed := 0
	for j, k := range keys {
		h := hs[1+j%3]
		require.Eventually(t, func() bool { return !h.Stats().Degraded }, 15*time.Second, 10*time.Millisecond)
		d, err := h.Allow(ctx, k)
		require.NoError(t, err)
		if d.Allowed {
			allowed++
		}
	}
	require.Equal(t, len(keys), allowed, "every key admitted once by the restarted Redis")
}

// A reservation settled below its estimate gives units of a window it
// filled back: the fleet hears that the window is open again, and asks
// Redis rather than deny in memory.
func TestSpentWordOpenedBySettle(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	hs, _ := spentFleet(t, 2, func() redis.UniversalClient { return srv.Client() })
	r, err := hs[0].Reserve(ctx, "settled", 1)
	require.NoError(t, err)
	require.True(t, r.OK())
	heardAll(t, hs, 1)
	before := hs[1].Stats()
	d, err := hs[1].Allow(ctx, "settled")
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, before.SyncRoundTrips, hs[1].Stats().SyncRoundTrips, "denied in memory")

	require.NoError(t, r.Settle(ctx, 0))
	heardAll(t, hs, 2)
	before = hs[1].Stats()
	_, err = hs[1].Allow(ctx, "settled")
	require.NoError(t, err)
	require.Greater(t, hs[1].Stats().SyncRoundTrips, before.SyncRoundTrips, "asked Redis once the window was open")
	require.LessOrEqual(t, sumStats(hs).Allowed, uint64(2), "the reservation's unit, and at most that unit again")
}

// A Redis that refuses PUBLISH and SUBSCRIBE (an ACL without channels):
// the limiter decides as it would without words, Redis counts every
// decision, the breaker stays closed, and no word is sent again.
func TestSpentWordRefused(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	rc := srv.Client()
	defer rc.Close()
	require.NoError(t, rc.Do(ctx, "ACL", "SETUSER", "nochannels", "on", ">secret", "~*", "resetchannels", "+@all").Err())
	hs, _ := spentFleet(t, 2, func() redis.UniversalClient {
		return redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "nochannels", Password: "secret"})
	})
	keys := numberedKeys("refused-", 20)
	fillAll(t, hs[0], keys)
	require.Eventually(t, func() bool { return hybrid.SpentRefused(hs[0]) }, 5*time.Second, 5*time.Millisecond)
	for _, k := range keys {
		d, err := hs[1].Allow(ctx, k)
		require.NoError(t, err)
		require.False(t, d.Allowed, k)
	}
	s := sumStats(hs)
	require.EqualValues(t, len(keys), s.Allowed)
	require.Zero(t, s.SpentSent)
	require.Zero(t, s.SpentHeard)
	require.Zero(t, s.FlushErrors)
	for _, h := range hs {
		require.False(t, h.Stats().Degraded)
	}
	require.GreaterOrEqual(t, hs[1].Stats().SyncRoundTrips, uint64(len(keys)), "each denial asked Redis")
}
