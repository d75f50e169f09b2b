package global_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// BenchmarkMulti measures one decision on a key's per-second burst bucket,
// per-minute window and per-day sliding window against a local
// redis-server: a Multi (one script call) against three Limiters asked in
// turn (three calls, and a request the third denies already counted by
// the first two), serially and from parallel goroutines, over 1000 keys.
func BenchmarkMulti(b *testing.B) {
	srv := redistest.Standalone(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 256})
	defer c.Close()
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = "user-" + strconv.Itoa(i)
	}
	ctx := context.Background()
	limits := []ratelimit.Limit{
		{Rate: 1_000_000, Period: time.Second, Burst: 1_000_000},
		{Rate: 100_000_000, Period: time.Minute},
		{Rate: 100_000, Period: 24 * time.Hour},
	}
	algs := []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.FixedWindow, ratelimit.SlidingWindow}

	m, err := global.NewMulti(c, limits, global.WithAlgorithms(algs...), global.WithPrefix("benchmulti"))
	if err != nil {
		b.Fatal(err)
	}
	var three [3]*global.Limiter
	for i, l := range limits {
		if three[i], err = global.New(c, l, global.WithAlgorithm(algs[i]), global.WithPrefix("benchthree"+strconv.Itoa(i))); err != nil {
			b.Fatal(err)
		}
	}
	deciders := []struct {
		name  string
		allow func(key string) error
	}{
		{"Multi", func(key string) error {
			var arr [3]ratelimit.LimitState
			buf := arr[:0]
			_, err := m.AllowNInto(ctx, key, 1, &buf)
			return err
		}},
		{"ThreeLimiters", func(key string) error {
			for _, l := range three {
				d, err := l.Allow(ctx, key)
				if err != nil || !d.Allowed {
					return err
				}
			}
			return nil
		}},
	}
	for _, dc := range deciders {
		if err := dc.allow("warm"); err != nil { // load the scripts
			b.Fatal(err)
		}
		b.Run(dc.name+"/serial", func(b *testing.B) {
			b.ReportAllocs()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				if err := dc.allow(keys[i%len(keys)]); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decisions/s")
		})
		b.Run(dc.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					if err := dc.allow(keys[i%len(keys)]); err != nil {
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
