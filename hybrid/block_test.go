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
