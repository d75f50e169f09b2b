package rtcount_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/hybridlimit/ratelimit/internal/rtcount"
)

func TestHook(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	var h rtcount.Hook
	rtcount.Attach(c, &h)
	round := func() {
		if err := c.Set(ctx, "a", 1, 0).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.Incr(ctx, "a")
			p.Incr(ctx, "b")
			p.Incr(ctx, "c")
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	round() // the connections' handshakes (HELLO, CLIENT SETINFO) count too
	s0, rt0, c0 := h.Single(), h.RoundTrips(), h.Commands()
	round()
	if s, rt, n := h.Single()-s0, h.RoundTrips()-rt0, h.Commands()-c0; s != 1 || rt != 2 || n != 4 {
		t.Fatalf("single %d, round trips %d, commands %d; want 1, 2, 4", s, rt, n)
	}
}

// On a Cluster the hook counts per node: a pipeline over keys of three
// masters is three round trips.
func TestAttachCluster(t *testing.T) {
	ctx := context.Background()
	cl := redistest.NewCluster(t)
	c := cl.Client()
	defer c.Close()
	var h rtcount.Hook
	rtcount.Attach(c, &h)
	// {a}, {b}, {c}: hash slots 15495, 3300 and 7365, one per master of
	// three.
	pipe := func() {
		if _, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.Incr(ctx, "{a}")
			p.Incr(ctx, "{b}")
			p.Incr(ctx, "{c}")
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	pipe() // the nodes' clients made, their connections' handshakes done
	rt0, c0 := h.RoundTrips(), h.Commands()
	pipe()
	if rt, n := h.RoundTrips()-rt0, h.Commands()-c0; rt != 3 || n != 3 {
		t.Fatalf("round trips %d, commands %d; want 3 round trips of the 3 commands, one per node", rt, n)
	}
}
