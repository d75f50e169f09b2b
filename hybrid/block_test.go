package hybrid_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// A key Redis refused asks again within a second, not at the window's end:
// the window's remainder may sit unused in another instance's lease and
// come back long before a long window ends. Here instance A holds the
// whole hour's quota unused (a reservation of 100 settled at 0 gives it
// back to A's lease, in memory); B is refused and told to retry at the
// hour's end; A closes and gives its lease back to Redis; a second later
// B is served. (Before, B denied every request until the hour ended.)
func TestRefusedKeyAsksAgain(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	limit := ratelimit.Limit{Rate: 100, Period: time.Hour}
	prefix := uniq(t)
	newH := func() *hybrid.Limiter {
		c := srv.Client()
		t.Cleanup(func() { c.Close() })
		h, err := hybrid.New(c, limit, hybrid.WithPrefix(prefix), hybrid.WithInstances(2))
		require.NoError(t, err)
		t.Cleanup(func() { h.Close() })
		return h
	}
	c := srv.Client()
	defer c.Close()
	freshWindow(t, c, time.Hour, time.Minute)
	a, b := newH(), newH()

	r, err := a.Reserve(ctx, "k", 100)
	require.NoError(t, err)
	require.True(t, r.Decision().Allowed)
	require.NoError(t, r.Settle(ctx, 0)) // back into A's lease: Redis still counts 100

	d, err := b.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, d.Allowed, "A holds the whole window")
	require.Greater(t, d.RetryAfter, time.Minute, "B is told when Redis said quota would fit: the hour's end")
	d, err = b.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Greater(t, d.RetryAfter, time.Minute, "a denial from the block tells the same")

	require.NoError(t, a.Close()) // gives A's 100 back to Redis
	deadline := time.Now().Add(3 * time.Second)
	for {
		d, err = b.Allow(ctx, "k")
		require.NoError(t, err)
		if d.Allowed || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.True(t, d.Allowed, "B asks Redis again within a second of its refusal, and is served")
}

// A client that moves to another instance within a window (it
// reconnects, a load balancer rebalances) leaves what its first instance
// leased for it there. That instance gives the lease back once the key
// has been quiet for its idle gap (a few of its mean gaps between
// requests), and the other instance, refused meanwhile, asks again and is
// served: the window reaches its limit before it ends, exactly. (Before,
// the lease stayed until the window's end: for a window of a minute or an
// hour, most of it.)
func TestQuietKeyGivesLeaseBack(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	c := srv.Client()
	defer c.Close()
	limit := ratelimit.Limit{Rate: 600, Period: 4 * time.Second}
	prefix := uniq(t)
	newH := func() *hybrid.Limiter {
		h, err := hybrid.New(srv.Client(), limit, hybrid.WithPrefix(prefix))
		require.NoError(t, err)
		t.Cleanup(func() { h.Close() })
		return h
	}
	a, b := newH(), newH()
	tl := newTally(limit.Period)
	allow := func(h *hybrid.Limiter) bool {
		start := time.Now()
		d, err := h.Allow(ctx, "k")
		require.NoError(t, err)
		if d.Allowed {
			tl.add("k", d, 1, start)
		}
		return d.Allowed
	}

	// The client uses A, 50 a second, for a while in one window (so that
	// A knows the key's rate) and 400ms into the next, window w.
	idx, left := serverWindow(t, c, limit.Period)
	if left < 1500*time.Millisecond {
		idx, left = idx+1, left+limit.Period
	}
	w := idx + 1
	from := time.Now()
	for stop := from.Add(left + 400*time.Millisecond); time.Now().Before(stop); {
		require.True(t, allow(a))
		time.Sleep(20 * time.Millisecond)
	}
	// Then it uses B, as fast as it goes, until w is spent or nearly over.
	for deadline := from.Add(left + limit.Period - 300*time.Millisecond); time.Now().Before(deadline); {
		if _, all := tl.windows("k", from, from); all[w] == limit.Rate {
			break
		}
		allow(b)
		time.Sleep(time.Millisecond)
	}
	_, all := tl.windows("k", from, from)
	s := a.Stats()
	t.Logf("window %d: %d admitted; A leased %d units in all, gave back %d", w, all[w], s.LeasedUnits, s.Refunded)
	require.Equal(t, limit.Rate, all[w], "what A leased for window w and did not use reaches B before w ends")
	require.Positive(t, s.Refunded)
}
