package hybrid_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// benchLimiter is a hybrid limiter on a real local redis-server with a limit
// so high that the benchmark runs on quota in hand: it measures the local
// decision, with leases topped up in the background.
func benchLimiter(b *testing.B) *hybrid.Limiter {
	b.Helper()
	srv := redistest.Standalone(b)
	c := srv.Client()
	b.Cleanup(func() { c.Close() })
	h, err := hybrid.New(c, ratelimit.Limit{Rate: 100_000_000, Period: time.Minute},
		hybrid.WithPrefix("bench"+strconv.FormatInt(time.Now().UnixNano(), 10)), hybrid.WithInstances(1))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { h.Close() })
	return h
}

func reportDecisions(b *testing.B, h *hybrid.Limiter) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	s := h.Stats()
	b.ReportMetric(float64(s.SyncRoundTrips)/float64(max(1, s.Decisions))*1e6, "syncRT/1M")
}

func BenchmarkAllowHotKey(b *testing.B) {
	h := benchLimiter(b)
	ctx := context.Background()
	h.Allow(ctx, "hot") // lease once
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if d, _ := h.Allow(ctx, "hot"); !d.Allowed {
			b.Fatal("denied")
		}
	}
	reportDecisions(b, h)
}

func BenchmarkAllowHotKeyParallel(b *testing.B) {
	h := benchLimiter(b)
	ctx := context.Background()
	h.Allow(ctx, "hot")
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if d, _ := h.Allow(ctx, "hot"); !d.Allowed {
				b.Error("denied")
				return
			}
		}
	})
	reportDecisions(b, h)
}

func keys10k() []string {
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "user-" + strconv.Itoa(i)
	}
	return keys
}

func BenchmarkAllow10kKeys(b *testing.B) {
	h := benchLimiter(b)
	ctx := context.Background()
	keys := keys10k()
	for _, k := range keys {
		h.Allow(ctx, k) // every key leases once
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		h.Allow(ctx, keys[i%len(keys)])
	}
	reportDecisions(b, h)
}

func BenchmarkAllow10kKeysParallel(b *testing.B) {
	h := benchLimiter(b)
	ctx := context.Background()
	keys := keys10k()
	for _, k := range keys {
		h.Allow(ctx, k)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			h.Allow(ctx, keys[i%len(keys)])
			i++
		}
	})
	reportDecisions(b, h)
}

// BenchmarkColdKeys: every decision on a key the limiter has not seen in
// its window (an exact call each, sharing round trips under RunParallel),
// beside two peers on the same server: global, one limiter whose
// concurrent decisions share round trips as the hybrid's do, and
// global-per-request, a limiter per goroutine (as ratelimit-sim's
// per-request phase): a round trip per decision. FixedWindow's at the top
// level; the other algorithms' (the hybrid and the per-request peer) under
// the algorithm's name: SlidingWindow/hybrid, TokenBucket/hybrid, ...
func BenchmarkColdKeys(b *testing.B) {
	srv := redistest.Standalone(b)
	coldKeys(b, srv, ratelimit.FixedWindow, false, true, "hybrid", "global", "global-per-request")
	for _, alg := range []ratelimit.Algorithm{ratelimit.SlidingWindow, ratelimit.TokenBucket, ratelimit.GCRA} {
		b.Run(alg.String(), func(b *testing.B) { coldKeys(b, srv, alg, false, true, "hybrid", "global-per-request") })
	}
}

// BenchmarkColdKeysLone: BenchmarkColdKeys with one caller, one decision
// at a time, whatever -cpu gives the processes (-cpu 2: a lone caller
// with a processor to spare, where a hand-off between goroutines wakes
// the other), on a go-redis client's default options, and under
// ContextTimeoutEnabled/ on one with ContextTimeoutEnabled (the hybrid's
// call then runs on the caller's goroutine). Every round trip is the
// decision's own, for both.
func BenchmarkColdKeysLone(b *testing.B) {
	srv := redistest.Standalone(b)
	coldKeys(b, srv, ratelimit.FixedWindow, true, false, "hybrid", "global-per-request")
	for _, alg := range []ratelimit.Algorithm{ratelimit.SlidingWindow, ratelimit.TokenBucket, ratelimit.GCRA} {
		b.Run(alg.String(), func(b *testing.B) { coldKeys(b, srv, alg, true, false, "hybrid", "global-per-request") })
	}
	b.Run("ContextTimeoutEnabled", func(b *testing.B) {
		coldKeys(b, srv, ratelimit.FixedWindow, true, true, "hybrid", "global-per-request")
		for _, alg := range []ratelimit.Algorithm{ratelimit.SlidingWindow, ratelimit.TokenBucket, ratelimit.GCRA} {
			b.Run(alg.String(), func(b *testing.B) { coldKeys(b, srv, alg, true, true, "hybrid", "global-per-request") })
		}
	})
}

// coldKeys runs BenchmarkColdKeys' peers named for algorithm alg, on
// clients with ContextTimeoutEnabled when ctxTimeouts; with lone, one
// caller's decisions one at a time (BenchmarkColdKeysLone).
func coldKeys(b *testing.B, srv *redistest.Server, alg ratelimit.Algorithm, lone, ctxTimeouts bool, peers ...string) {
	limit := ratelimit.PerMinute(1_000_000)
	client := func(b *testing.B) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: ctxTimeouts})
		b.Cleanup(func() { c.Close() })
		return c
	}
	prefix := func(p string) string { return p + strconv.FormatInt(time.Now().UnixNano(), 10) }
	// run drives, on each goroutine, the limiter limiter returns: the one
	// all share, or one of the goroutine's own.
	run := func(b *testing.B, limiter func() (ratelimit.Limiter, error)) {
		ctx := context.Background()
		var n atomic.Int64
		b.ReportAllocs()
		if lone {
			l, err := limiter()
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				if _, err := l.AllowN(ctx, "cold-"+strconv.Itoa(i), 1); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
			return
		}
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			l, err := limiter()
			if err != nil {
				b.Error(err)
				return
			}
			for pb.Next() {
				if _, err := l.AllowN(ctx, "cold-"+strconv.FormatInt(n.Add(1), 10), 1); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	}
	peer := map[string]func(b *testing.B){
		"hybrid": func(b *testing.B) {
			h, err := hybrid.New(client(b), limit, hybrid.WithPrefix(prefix("cold")), hybrid.WithInstances(1), hybrid.WithAlgorithm(alg))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { h.Close() })
			before := h.Stats()
			run(b, func() (ratelimit.Limiter, error) { return h, nil })
			s := h.Stats()
			b.ReportMetric(float64(s.SyncRoundTrips-before.SyncRoundTrips)/float64(max(1, s.Decisions-before.Decisions)), "waited-RT/decision")
		},
		"global": func(b *testing.B) {
			g, err := global.New(client(b), limit, global.WithPrefix(prefix("coldg")), global.WithAlgorithm(alg))
			if err != nil {
				b.Fatal(err)
			}
			run(b, func() (ratelimit.Limiter, error) { return g, nil })
		},
		"global-per-request": func(b *testing.B) {
			c, p := client(b), global.WithPrefix(prefix("coldr"))
			run(b, func() (ratelimit.Limiter, error) { return global.New(c, limit, p, global.WithAlgorithm(alg)) })
		},
	}
	for _, name := range peers {
		b.Run(name, peer[name])
	}
}
