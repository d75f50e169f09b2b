package global_test

import (
	"context"
	"fmt"

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
