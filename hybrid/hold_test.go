package hybrid_test

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// A key each instance sees about once a window is cold: it never leases.
// Its first decisions wait on Redis; from the second window in which an
// instance sees it, its exact call holds a unit of the next window, and
// once the key uses that hold the syncer holds the window after it. So
// from the third window on, its decisions are taken in memory: 4
// instances, 400 keys at 64 per second, each asked once a window by every
// instance, wait on Redis for at most one decision in 5 in windows 3 to 6,
// where they waited for every one without holds. No key-window goes over
// its limit, and what the fleet admitted of a key in a window is never
// more than Redis counted. Standalone and Cluster (a hold is a counter of
// the key's own slot).
func TestHoldAheadColdKeys(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		srv := redistest.Standalone(t)
		holdColdKeys(t, func() redis.UniversalClient { return srv.Client() })
	})
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.NewCluster(t)
		holdColdKeys(t, func() redis.UniversalClient { return cl.Client() })
	})
}

func holdColdKeys(t *testing.T, client func() redis.UniversalClient) {
	limit := ratelimit.PerSecond(64)
	prefix := uniq(t)
	var hs []*hybrid.Limiter
	for i := 0; i < 4; i++ {
		c := client()
		t.Cleanup(func() { c.Close() })
		h, err := hybrid.New(c, limit, hybrid.WithPrefix(prefix), hybrid.WithInstances(4))
		require.NoError(t, err)
		t.Cleanup(func() { h.Close() })
		hs = append(hs, h)
	}
	keys := make([]string, 400)
	for i := range keys {
		keys[i] = "hold-" + strconv.Itoa(i)
	}
	tl := newTally(limit.Period)
	from := time.Now()
	var before hybrid.Stats
	for w := 1; w <= 6; w++ {
		// the next window's start, and a little: each round asks every
		// key once on every instance, within one window
		time.Sleep(time.Until(time.Now().Truncate(limit.Period).Add(limit.Period + 20*time.Millisecond)))
		if w == 3 {
			before = sumStats(hs)
		}
		var wg sync.WaitGroup
		for i, h := range hs {
			order := rand.Perm(len(keys))
			for g := 0; g < 2; g++ {
				wg.Add(1)
				go func(h *hybrid.Limiter, order []int) {
					defer wg.Done()
					for _, j := range order {
						start := time.Now()
						d, err := h.AllowN(context.Background(), keys[j], 1)
						if err != nil || !d.Allowed {
							t.Errorf("instance %d key %s: %+v, %v; want admitted (far under the limit)", i, keys[j], d, err)
							return
						}
						tl.add(keys[j], d, 1, start)
					}
				}(h, order[g*len(order)/2:(g+1)*len(order)/2])
			}
		}
		wg.Wait()
		x := sumStats(hs)
		t.Logf("window %d: decisions %d local %d ahead %d exact %d leases %d", w, x.Decisions, x.LocalDecisions, x.LeasedAhead, x.ExactDecisions, x.Leases)
	}
	s := sumStats(hs)
	decisions, local := s.Decisions-before.Decisions, s.LocalDecisions-before.LocalDecisions
	t.Logf("windows 3 to 6: %d decisions, %d in memory; holds and leases ahead %d (all windows), exact decisions %d, leases %d",
		decisions, local, s.LeasedAhead, s.ExactDecisions, s.Leases)
	require.EqualValues(t, 4*4*len(keys), decisions)
	require.Positive(t, s.LeasedAhead)
	require.GreaterOrEqual(t, 5*local, 4*decisions, "at most one decision in 5 waits on Redis once the keys hold their next window")
	over, _, _, _ := quota(tl, tl, keys, limit.Rate, from, time.Now())
	require.Empty(t, over, "key-windows over the limit")
	// Redis counted at least what was admitted, in every window (holds
	// not used stay counted).
	rc := client()
	defer rc.Close()
	ctx := context.Background()
	for _, k := range keys[:50] {
		_, all := tl.windows(k, from, time.Now())
		for idx, n := range all {
			v, err := rc.HGet(ctx, prefix+":{"+k+"}:fw:64:"+strconv.FormatInt(idx, 10), "c").Int64()
			if err == redis.Nil {
				continue // expired: its window is long over
			}
			require.NoError(t, err)
			require.GreaterOrEqual(t, v, int64(n), "key %s window %d: Redis counted %d, the fleet admitted %d", k, idx, v, n)
		}
	}
}

// Close gives a hold back: what an instance held of the next window and
// never used is refunded to its counter, not left stranded.
func TestHoldAheadClose(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	limit := ratelimit.PerSecond(64)
	prefix := uniq(t)
	h, err := hybrid.New(c, limit, hybrid.WithPrefix(prefix), hybrid.WithInstances(4))
	require.NoError(t, err)
	ctx := context.Background()
	var idx int64
	for w := 0; w < 2; w++ {
		// early in a window: the second decision, seen in the window
		// before, holds the next one
		time.Sleep(time.Until(time.Now().Truncate(limit.Period).Add(limit.Period + 50*time.Millisecond)))
		idx = time.Now().UnixMicro() / limit.Period.Microseconds()
		d, err := h.AllowN(ctx, "k", 1)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	next := prefix + ":{k}:fw:64:" + strconv.FormatInt(idx+1, 10)
	held, err := c.HGet(ctx, next, "c").Int64()
	require.NoError(t, err, "the next window's counter holds units")
	require.Positive(t, held)
	require.NoError(t, h.Close())
	left, err := c.HGet(ctx, next, "c").Int64()
	require.NoError(t, err)
	require.Zero(t, left, "Close gave the %d held units back", held)
}
