package script_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/hybridlimit/ratelimit/internal/script"
)

// Take adds n to the current window's counter whatever its type (a string
// a global limiter wrote, a hash the lease script wrote, none yet), sets
// the expiry of a counter it creates, and tells the count after it.
func TestTake(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	lim := ratelimit.Limit{Rate: 10, Period: time.Second}
	l := newLeaser(t, c, "k", ratelimit.FixedWindow, lim)
	take := func(now, n int64, adj ...int64) script.TakeReply {
		t.Helper()
		a := script.TakeArgs{Base: l.base, Kind: l.kind, Limit: lim, Now: now, N: n}
		if len(adj) == 3 {
			a.AdjustIdx, a.Refund, a.Use = adj[0], adj[1], adj[2]
		}
		v, err := script.Take.Run(ctx, c, a.Keys(), a.Args()...).Result()
		require.NoError(t, err)
		r, err := script.ParseTake(v)
		require.NoError(t, err)
		return r
	}
	now := 1000*sec + 300_000
	r := take(now, 2)
	require.Equal(t, script.TakeReply{Idx: 1000, Now: now, Count: 2, Admitted: true}, r)
	k := script.WindowKey(l.base, l.kind, 1000)
	ttl := c.PTTL(ctx, k).Val()
	require.InDelta(t, float64(1700*time.Millisecond), float64(ttl), float64(50*time.Millisecond), "the window's remaining 700ms and a second of grace")
	require.Equal(t, "hash", c.Type(ctx, k).Val(), "the counter the plain increments (HINCRBY) and the lease script write")

	// the lease script counts in the same hash
	l.call(script.LeaseArgs{Now: now, Want: 3, Min: 1, Nonce: "abcdef"})
	require.Equal(t, "hash", c.Type(ctx, k).Val())
	require.Equal(t, int64(5), l.count(1000))
	require.Equal(t, int64(9), take(now, 4).Count)
	require.Equal(t, script.TakeReply{Idx: 1000, Now: now, Count: 9}, take(now, 3), "over the limit: denied, nothing counted")
	require.Equal(t, int64(9), l.count(1000))
	require.Equal(t, script.TakeReply{Idx: 1000, Now: now, Count: 10, Admitted: true}, take(now, 1), "a smaller decision fits")
	// units given back first: 3 of this window, then 2 of them taken
	require.Equal(t, script.TakeReply{Idx: 1000, Now: now, Count: 9, Admitted: true, Adjusted: true}, take(now, 2, 1000, 3, 0))
	// an adjustment of another window is not applied, and says so
	require.Equal(t, script.TakeReply{Idx: 1000, Now: now, Count: 10, Admitted: true}, take(now, 1, 999, 5, 0))
	// credit counts first, even past the limit: then nothing fits
	require.Equal(t, script.TakeReply{Idx: 1000, Now: now, Count: 12, Adjusted: true}, take(now, 1, 1000, 0, 2))
	// never below zero
	require.Equal(t, script.TakeReply{Idx: 1000, Now: now, Count: 1, Admitted: true, Adjusted: true}, take(now, 1, 1000, 50, 0))
	// an adjustment that creates the counter sets its expiry
	require.Equal(t, script.TakeReply{Idx: 1002, Now: 1002 * sec, Count: 4, Adjusted: true}, take(1002*sec, 7, 1002, 0, 4))
	require.Positive(t, c.PTTL(ctx, script.WindowKey(l.base, l.kind, 1002)).Val())

	// a string counter (global's algorithm scripts write strings) is
	// counted in as it is
	ks := script.WindowKey(l.base, l.kind, 1003)
	require.NoError(t, c.Set(ctx, ks, "5", time.Minute).Err())
	require.Equal(t, script.TakeReply{Idx: 1003, Now: 1003 * sec, Count: 7, Admitted: true}, take(1003*sec, 2))
	require.Equal(t, script.TakeReply{Idx: 1003, Now: 1003 * sec, Count: 7}, take(1003*sec, 4), "over the limit: denied, nothing counted")
	require.Equal(t, "string", c.Type(ctx, ks).Val())
	require.Equal(t, "7", c.Get(ctx, ks).Val())
	require.Equal(t, script.TakeReply{Idx: 1003, Now: 1003 * sec, Count: 6, Admitted: true, Adjusted: true}, take(1003*sec, 1, 1003, 2, 0), "a refund read from a string")

	// the next window, by the time passed in
	require.Equal(t, script.TakeReply{Idx: 1001, Now: 1001 * sec, Count: 1, Admitted: true}, take(1001*sec, 1))
	// Redis TIME when none is passed
	r = take(-1, 1)
	require.InDelta(t, float64(time.Now().UnixMicro()), float64(r.Now), float64(2*time.Second/time.Microsecond))
	require.Equal(t, r.Now/sec, r.Idx)
}
