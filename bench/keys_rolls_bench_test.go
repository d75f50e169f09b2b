package bench

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"golang.org/x/time/rate"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/hybridlimit/ratelimit/internal/rtcount"
)

// rollPeriod is the window of n keys: 1s up to 10,000 keys, 5s for more.
// Every key in use costs one lease call per window per instance, pipelined:
// 100,000 keys on 1s windows would ask one Redis for 100,000 script calls a
// second per instance, more than this machine's Redis serves while the
// benchmark runs (and more than most deployments would give one limit).
// With -benchtime 16s every run crosses at least 3 window rolls (the
// "windows" metric says how many).
func rollPeriod(n int) time.Duration {
	if n > 10_000 {
		return 5 * time.Second
	}
	return time.Second
}

const rollSync = 100 * time.Millisecond

func keyset(n int) []string {
	k := make([]string, n)
	for i := range k {
		k[i] = "user:" + strconv.Itoa(i)
	}
	return k
}

// keyedRate is what users build from golang.org/x/time/rate for per-key
// limits: a limiter per key in a sync.Map.
type keyedRate struct{ m sync.Map }

func (k *keyedRate) allow(key string) bool {
	v, ok := k.m.Load(key)
	if !ok {
		v, _ = k.m.LoadOrStore(key, rate.NewLimiter(peerRate, peerRate))
	}
	return v.(*rate.Limiter).Allow()
}

// BenchmarkKeysAcrossRolls: decisions on 100, 10,000 and 100,000 active
// keys drawn at random from every goroutine, for long enough to cross
// window rolls, far under the limit: the hybrid (strict,
// keys leased ahead of each window) against per-key x/time/rate and
// go-limiter's memorystore in memory, and redis_rate and our global limiter
// on Redis, in the same run. The Redis limiters report round trips per
// 1,000 decisions (rt/1k); the hybrid's include the first decision of
// every key, which leases.
//
//	cd bench && go test -run '^$' -bench KeysAcrossRolls -benchtime 16s -benchmem ./...
func BenchmarkKeysAcrossRolls(b *testing.B) {
	srv := redistest.Standalone(b)
	ctx := context.Background()
	for _, n := range []int{100, 10_000, 100_000} {
		keys := keyset(n)
		name := strconv.Itoa(n) + "keys"
		// One hybrid limiter for all the runs of the sub-benchmark, warmed
		// up first: every key's first decision leases (a round trip, by
		// design in strict mode), and a key keeps its quota across windows
		// only while it is in use (see docs/tuning.md, regimes).
		c := srv.Client()
		hook := &rtcount.Hook{}
		c.AddHook(hook)
		period := rollPeriod(n)
		h, err := hybrid.New(c, ratelimit.Limit{Rate: 1 << 30, Period: period}, hybrid.WithInstances(1),
			hybrid.WithSyncInterval(rollSync), hybrid.WithMaxKeys(2*n),
			hybrid.WithPrefix("rolls"+strconv.FormatInt(time.Now().UnixNano(), 10)))
		if err != nil {
			b.Fatal(err)
		}
		warm(keys, period, func(k string) { h.Allow(ctx, k) })
		b.Run(name+"/hybrid", func(b *testing.B) {
			rt0, start := hook.RoundTrips(), time.Now()
			runKeys(b, keys, func(k string) { h.Allow(ctx, k) })
			b.ReportMetric(float64(hook.RoundTrips()-rt0)*1000/float64(b.N), "rt/1k")
			b.ReportMetric(float64(time.Since(start))/float64(period), "windows")
		})
		h.Close()
		c.Close()
		b.Run(name+"/xtime-rate", func(b *testing.B) {
			var k keyedRate
			runKeys(b, keys, func(key string) { k.allow(key) })
		})
		b.Run(name+"/memorystore", func(b *testing.B) {
			s := newMemorystore(b)
			runKeys(b, keys, func(key string) { s.Take(ctx, key) })
		})
		if n > 10_000 {
			continue // per-request Redis: the key count changes nothing but Redis memory
		}
		b.Run(name+"/global", func(b *testing.B) {
			c := srv.Client()
			defer c.Close()
			hook := &rtcount.Hook{}
			c.AddHook(hook)
			g, err := global.New(c, ratelimit.Limit{Rate: 1 << 30, Period: rollPeriod(n)},
				global.WithPrefix("rollsg"+strconv.FormatInt(time.Now().UnixNano(), 10)))
			if err != nil {
				b.Fatal(err)
			}
			runKeys(b, keys, func(key string) { g.Allow(ctx, key) })
			b.ReportMetric(float64(hook.RoundTrips())*1000/float64(b.N), "rt/1k")
		})
		b.Run(name+"/redis_rate", func(b *testing.B) {
			c := srv.Client()
			defer c.Close()
			hook := &rtcount.Hook{}
			c.AddHook(hook)
			l := redis_rate.NewLimiter(c)
			runKeys(b, keys, func(key string) { l.Allow(ctx, key, redis_rate.PerSecond(peerRate)) })
			b.ReportMetric(float64(hook.RoundTrips())*1000/float64(b.N), "rt/1k")
		})
	}
}

// warm brings every key into use: one decision per key from 64
// goroutines, then decisions at random for two windows.
func warm(keys []string, period time.Duration, fn func(string)) {
	var wg sync.WaitGroup
	for g := 0; g < 64; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := g; i < len(keys); i += 64 {
				fn(keys[i])
			}
			x := uint64(g+1) * 0x9E3779B97F4A7C15
			for end := time.Now().Add(2 * period); time.Now().Before(end); {
				for i := 0; i < 256; i++ {
					x ^= x << 13
					x ^= x >> 7
					x ^= x << 17
					fn(keys[x%uint64(len(keys))])
				}
			}
		}(g)
	}
	wg.Wait()
}

// runKeys runs fn over keys at random from RunParallel goroutines (4 per
// core).
func runKeys(b *testing.B, keys []string, fn func(string)) {
	var seed atomic.Uint64
	b.ReportAllocs()
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		x := seed.Add(0x9E3779B97F4A7C15) | 1
		for pb.Next() {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			fn(keys[x%uint64(len(keys))])
		}
	})
}
