package hybrid_test

import (
	"context"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/hybrid"
)

// Three requests per key per hour, on an embedded Redis (miniredis) so the
// example runs anywhere; in production the client points at the Redis the
// fleet shares.
func ExampleLimiter_Allow() {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()

	limiter, err := hybrid.New(client, ratelimit.PerHour(3), hybrid.WithInstances(1))
	if err != nil {
		panic(err)
	}
	defer limiter.Close()
	if err := limiter.Ping(context.Background()); err != nil {
		panic(err) // a wrong address or password shows here, not in Allow
	}
	for i := 0; i < 4; i++ {
		d, err := limiter.Allow(context.Background(), "api-key-1")
		if err != nil {
			panic(err)
		}
		fmt.Printf("allowed=%v remaining=%d\n", d.Allowed, d.Remaining)
	}
	// Output:
	// allowed=true remaining=2
	// allowed=true remaining=1
	// allowed=true remaining=0
	// allowed=false remaining=0
}
