package global_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
)

// An exact token bucket on an embedded Redis (miniredis) so the example
// runs anywhere: a burst of 2, refilled at 1 per hour. Every decision is
// one script call on Redis.
func ExampleLimiter_Allow() {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()

	limiter, err := global.New(client, ratelimit.Limit{Rate: 1, Period: 3600e9, Burst: 2},
		global.WithAlgorithm(ratelimit.TokenBucket))
	if err != nil {
		panic(err)
	}
	for i := 0; i < 3; i++ {
		d, err := limiter.Allow(context.Background(), "user-1")
		if err != nil {
			panic(err)
		}
		fmt.Printf("allowed=%v remaining=%d retry in about %v\n", d.Allowed, d.Remaining, d.RetryAfter.Round(3600e9))
	}
	// Output:
	// allowed=true remaining=1 retry in about 0s
	// allowed=true remaining=0 retry in about 0s
	// allowed=false remaining=0 retry in about 1h0m0s
}

// Several limits on one key, all or nothing, on an embedded Redis: a bucket
// of 2 refilled at 1 per second, and 3 per hour. The third request is
// denied by the bucket and, being denied, not counted by the hour; the
// fourth, a second later, is admitted and fills the hour.
func ExampleMulti_Allow() {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()

	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) // a fixed clock, for the example's output
	limiter, err := global.NewMulti(client, []ratelimit.Limit{{Rate: 1, Period: time.Second, Burst: 2}, ratelimit.PerHour(3)},
		global.WithAlgorithms(ratelimit.TokenBucket, ratelimit.FixedWindow),
		global.WithClock(func() time.Time { return now }))
	if err != nil {
		panic(err)
	}
	for i := 0; i < 5; i++ {
		if i == 3 {
			now = now.Add(time.Second)
		}
		d, err := limiter.Allow(context.Background(), "user-1")
		if err != nil {
			panic(err)
		}
		fmt.Printf("allowed=%v by %v: retry in %v; left: bucket %d, hour %d\n",
			d.Allowed, d.Limit, d.RetryAfter, d.Limits()[0].Remaining, d.Limits()[1].Remaining)
	}
	// Output:
	// allowed=true by 1/1s burst 2: retry in 0s; left: bucket 1, hour 2
	// allowed=true by 1/1s burst 2: retry in 0s; left: bucket 0, hour 1
	// allowed=false by 1/1s burst 2: retry in 1s; left: bucket 0, hour 1
	// allowed=true by 3/1h0m0s: retry in 0s; left: bucket 0, hour 0
	// allowed=false by 3/1h0m0s: retry in 59m59s; left: bucket 0, hour 0
}
