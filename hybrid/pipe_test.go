package hybrid

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// A *redis.Client on go-redis's defaults (no ContextTimeoutEnabled) has its
// calls bounded by clones that read and write with a timeout no shorter
// than the call's context has left, and at most cloneSlack longer: the
// clone kept for a bound the Limiter uses when the context was made for
// it, one made for the call otherwise. Every clone shares the client's
// pool. A context without a deadline, or past it, and clients that honour
// deadlines or are of another kind, get none: their calls run as before.
func TestTimedClientsBound(t *testing.T) {
	srv := redistest.Standalone(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	var tc timedClients
	tc.init(c, 500*time.Millisecond, 2*time.Second)

	within := func(d time.Duration) (context.Context, context.CancelFunc) {
		return context.WithDeadline(context.Background(), time.Now().Add(d))
	}
	for _, bound := range []time.Duration{500 * time.Millisecond, 2 * time.Second} {
		ctx, cancel := within(bound)
		first, ok := tc.bound(ctx)
		require.True(t, ok, "%v", bound)
		require.Equal(t, bound, first.Options().ReadTimeout, "the clone kept for %v", bound)
		require.Equal(t, bound, first.Options().WriteTimeout)
		again, ok := tc.bound(ctx)
		require.True(t, ok)
		require.Same(t, first, again, "kept: made once")
		require.NoError(t, first.Ping(ctx).Err())
		require.EqualValues(t, 1, c.PoolStats().TotalConns, "one pool: the clone's connection is the client's")
		cancel()
	}

	// Another bound: a clone for the call, its timeout the time left.
	ctx, cancel := within(120 * time.Millisecond)
	left := time.Until(mustDeadline(t, ctx))
	one, ok := tc.bound(ctx)
	require.True(t, ok)
	require.GreaterOrEqual(t, one.Options().ReadTimeout, left-time.Millisecond, "no earlier than the deadline, give or take the time between")
	require.LessOrEqual(t, one.Options().ReadTimeout, 120*time.Millisecond)
	cancel()
	// A context made a while before its call: the kept clone would end the
	// call up to a second after its deadline, so it gets one of its own.
	ctx, cancel = within(500*time.Millisecond - 10*cloneSlack)
	own, ok := tc.bound(ctx)
	require.True(t, ok)
	require.Less(t, own.Options().ReadTimeout, 500*time.Millisecond-9*cloneSlack)
	cancel()

	_, ok = tc.bound(context.Background())
	require.False(t, ok, "no deadline: nothing bounds the call")
	ctx, cancel = within(-time.Second)
	_, ok = tc.bound(ctx)
	require.False(t, ok, "past its deadline")
	cancel()

	bounded := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer bounded.Close()
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cluster.Close()
	for _, other := range []rediser{bounded, cluster} {
		var tc timedClients
		tc.init(other, time.Second)
		ctx, cancel := within(time.Second)
		_, ok := tc.bound(ctx)
		require.False(t, ok, "%T", other)
		cancel()
	}
}

// A run that sends again (its scripts reloaded after NOSCRIPT, a
// WRONGTYPE fallback) on a clone sends on one for the time its context
// has left then, not the kept clone's whole bound; none is left past
// the deadline. A run on the client itself is not changed.
func TestExchangeRunRebound(t *testing.T) {
	srv := redistest.Standalone(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	p := &pipe{client: c}
	p.timed.init(c, 500*time.Millisecond, 2*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	kept, ok := p.timed.bound(ctx)
	require.True(t, ok)
	short, cancelShort := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancelShort()
	e := p.newRun(short, nil)
	e.client = kept // (as a run begun with the whole bound left)
	require.True(t, e.rebound())
	require.LessOrEqual(t, e.client.(*redis.Client).Options().ReadTimeout, 100*time.Millisecond)

	past, cancelPast := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancelPast()
	e = p.newRun(past, nil)
	e.client = kept
	require.False(t, e.rebound(), "no time left: nothing is sent again")

	e = p.newRun(past, nil)
	require.True(t, e.rebound(), "on the client itself: as it was")
	require.Equal(t, rediser(c), e.client)
}

func mustDeadline(t *testing.T, ctx context.Context) time.Time {
	t.Helper()
	d, ok := ctx.Deadline()
	require.True(t, ok)
	return d
}
