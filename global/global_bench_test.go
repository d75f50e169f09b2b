package global_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// BenchmarkAllow measures one decision (one script call over loopback) per
// algorithm, serially and from parallel goroutines, against a local
// redis-server. The limit is high enough that most calls are admitted; keys
// rotate over 1000 user keys.
func BenchmarkAllow(b *testing.B) {
	srv := redistest.Standalone(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 256})
	defer c.Close()
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = "user-" + strconv.Itoa(i)
	}
	ctx := context.Background()
	limit := ratelimit.Limit{Rate: 1_000_000, Period: time.Second}
	for _, alg := range ratelimit.Algorithms() {
		l, err := global.New(c, limit, global.WithAlgorithm(alg), global.WithPrefix("bench"+alg.String()))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := l.Allow(ctx, "warm"); err != nil { // load the script
			b.Fatal(err)
		}
		b.Run(alg.String()+"/serial", func(b *testing.B) {
			b.ReportAllocs()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				if _, err := l.Allow(ctx, keys[i%len(keys)]); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decisions/s")
		})
		b.Run(alg.String()+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					if _, err := l.Allow(ctx, keys[i%len(keys)]); err != nil {
						b.Error(err)
						return
					}
					i++
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decisions/s")
		})
	}
}
