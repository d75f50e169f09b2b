package global_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/redis/go-redis/v9"
)

// Example limits each API key to 100 requests per minute across every
// instance of a service that shares one Redis. (It needs a Redis server, so
// it is compiled but not run.)
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()

	lim, err := global.New(rdb, ratelimit.PerMinute(100),
		global.WithAlgorithm(ratelimit.SlidingWindow))
	if err != nil {
		log.Fatal(err)
	}

	handler := func(w http.ResponseWriter, r *http.Request) {
		d, err := lim.Allow(r.Context(), r.Header.Get("X-API-Key"))
		switch {
		case errors.Is(err, ratelimit.ErrInvalidKey): // no API key
			http.Error(w, "missing API key", http.StatusBadRequest)
			return
		case err != nil: // Redis failed (no WithFailureMode), or the request was canceled
			log.Printf("rate limiter: %v", err) // the error's text is for the logs, not the client
			http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
			return
		}
		ratelimit.SetHeaders(w.Header(), d)
		if !d.Allowed {
			http.Error(w, "too many requests", http.StatusTooManyRequests)
			return
		}
		fmt.Fprintln(w, "hello")
	}
	http.HandleFunc("/", handler)
}

// ExampleLimiter_AllowN takes 5 tokens at once from a bucket of 20 that
// refills 10 per second: all five or none.
func ExampleLimiter_AllowN() {
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"localhost:7000"}})
	defer rdb.Close()

	lim, err := global.New(rdb, ratelimit.Limit{Rate: 10, Period: time.Second, Burst: 20},
		global.WithAlgorithm(ratelimit.TokenBucket), global.WithPrefix("uploads"))
	if err != nil {
		log.Fatal(err)
	}
	d, err := lim.AllowN(context.Background(), "tenant-42", 5)
	if err != nil {
		log.Fatal(err)
	}
	if !d.Allowed {
		fmt.Println("retry in", d.RetryAfter)
	}
}

func ExampleNewMulti() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()

	lim, err := global.NewMulti(rdb, []ratelimit.Limit{
		{Rate: 10, Period: time.Second, Burst: 20},
		ratelimit.PerMinute(300),
		{Rate: 10_000, Period: 24 * time.Hour},
	}, global.WithAlgorithms(ratelimit.TokenBucket, ratelimit.FixedWindow, ratelimit.FixedWindow))
	if err != nil {
		log.Fatal(err)
	}
	handler := func(w http.ResponseWriter, r *http.Request) {
		d, err := lim.Allow(r.Context(), r.Header.Get("X-API-Key"))
		if err != nil {
			http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
			return
		}
		ratelimit.SetHeaders(w.Header(), d) // the tightest limit
		for _, s := range d.Limits() {      // and each policy
			w.Header().Add("X-RateLimit-Policy", fmt.Sprintf("%d;w=%d", s.Limit.Capacity(s.Algorithm), int(s.Limit.Period.Seconds())))
		}
		if !d.Allowed {
			http.Error(w, "too many requests", http.StatusTooManyRequests)
			return
		}
		fmt.Fprintln(w, "hello")
	}
	http.HandleFunc("/", handler)
}

// ExampleMulti_Reserve charges an LLM call by the tokens it really used:
// the estimate is reserved before the call and settled after it, once,
// whatever replies are lost on the way (a retried Settle is a no-op).
func ExampleMulti_Reserve() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	lim, err := global.NewMulti(rdb, []ratelimit.Limit{ratelimit.PerMinute(40_000), {Rate: 1_000_000, Period: 24 * time.Hour}},
		global.WithPrefix("llm-tokens"))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	r, err := lim.Reserve(ctx, "tenant-42", 2000)
	if err != nil {
		log.Fatal(err)
	}
	if !r.OK() {
		fmt.Println("retry in", r.Decision().RetryAfter)
		return
	}
	used := 1234 // from the model's reply
	for try := 0; try < 3; try++ {
		if err = r.Settle(ctx, used); err == nil {
			break
		}
	}
	if err != nil {
		log.Print("unsettled: the estimate stands: ", err)
	}
}
