package bench

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"golang.org/x/time/rate"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// hybridRate is so high that the hybrid decides from quota in hand: the
// benchmarks measure the local decision, leases topped up in the background.
var hybridLimit = ratelimit.Limit{Rate: 100_000_000, Period: time.Minute}

func newHybrid(b *testing.B, srv *redistest.Server) *hybrid.Limiter {
	b.Helper()
	c := srv.Client()
	b.Cleanup(func() { c.Close() })
	h, err := hybrid.New(c, hybridLimit, hybrid.WithInstances(1),
		hybrid.WithPrefix("bench"+strconv.FormatInt(time.Now().UnixNano(), 10)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { h.Close() })
	return h
}

// BenchmarkHybridHotKey: one key with quota in hand, against
// golang.org/x/time/rate Limiter.Allow in the same run, serial and parallel.
func BenchmarkHybridHotKey(b *testing.B) {
	srv := redistest.Standalone(b)
	ctx := context.Background()
	b.Run("xtime-rate", func(b *testing.B) {
		lim := rate.NewLimiter(peerRate, peerRate)
		b.ReportAllocs()
		for b.Loop() {
			lim.Allow()
		}
	})
	b.Run("hybrid", func(b *testing.B) {
		h := newHybrid(b, srv)
		h.Allow(ctx, "hot")
		b.ReportAllocs()
		for b.Loop() {
			h.Allow(ctx, "hot")
		}
	})
	b.Run("xtime-rate-parallel", func(b *testing.B) {
		lim := rate.NewLimiter(peerRate, peerRate)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				lim.Allow()
			}
		})
	})
	b.Run("hybrid-parallel", func(b *testing.B) {
		h := newHybrid(b, srv)
		h.Allow(ctx, "hot")
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				h.Allow(ctx, "hot")
			}
		})
	})
}

// BenchmarkHybrid10kKeys: 10,000 keys round-robin with quota in hand,
// serial and parallel (run with -cpu 1,2 to see the scaling).
func BenchmarkHybrid10kKeys(b *testing.B) {
	srv := redistest.Standalone(b)
	ctx := context.Background()
	h := newHybrid(b, srv)
	for _, k := range keys10k {
		h.Allow(ctx, k)
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			h.Allow(ctx, keys10k[i])
			if i++; i == len(keys10k) {
				i = 0
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		var next = make(chan int, 64)
		for i := 0; i < 64; i++ {
			next <- i * 7919
		}
		b.RunParallel(func(pb *testing.PB) {
			i := <-next % len(keys10k)
			for pb.Next() {
				h.Allow(ctx, keys10k[i])
				if i++; i == len(keys10k) {
					i = 0
				}
			}
		})
	})
}

// BenchmarkHybridDisjointKeys: each goroutine decides on its own 1,000
// keys, as a service whose instances see different users would: no key is
// shared between cores, so this shows whether anything else is (run with
// -cpu 1,2).
func BenchmarkHybridDisjointKeys(b *testing.B) {
	srv := redistest.Standalone(b)
	ctx := context.Background()
	h := newHybrid(b, srv)
	for _, k := range keys10k {
		h.Allow(ctx, k)
	}
	b.ReportAllocs()
	b.ResetTimer()
	next := make(chan int, 10)
	for i := 0; i < 10; i++ {
		next <- i * 1000
	}
	b.RunParallel(func(pb *testing.PB) {
		base := <-next
		i := 0
		for pb.Next() {
			h.Allow(ctx, keys10k[base+i])
			if i++; i == 1000 {
				i = 0
			}
		}
	})
}

// BenchmarkPerRequestRedis: what a decision costs when every one is a Redis
// round trip: our global limiter and go-redis/redis_rate (GCRA), against a
// local redis-server, parallel.
func BenchmarkPerRequestRedis(b *testing.B) {
	srv := redistest.Standalone(b)
	ctx := context.Background()
	c := srv.Client()
	defer c.Close()
	b.Run("global-FixedWindow", func(b *testing.B) {
		g, err := global.New(c, ratelimit.Limit{Rate: 1_000_000_000, Period: time.Second}, global.WithAlgorithm(ratelimit.FixedWindow))
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				g.Allow(ctx, "k")
			}
		})
	})
	b.Run("redis_rate-GCRA", func(b *testing.B) {
		l := redis_rate.NewLimiter(c)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l.Allow(ctx, "k", redis_rate.PerSecond(1_000_000))
			}
		})
	})
}
