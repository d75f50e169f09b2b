package hybrid_test

import (
	"log"
	"net/http"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/hybrid"
)

// A limit of 100 requests per API key per minute, shared by every instance
// of the service that uses the same Redis. (Not run: it needs a Redis.)
func Example() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	limiter, err := hybrid.New(client, ratelimit.PerMinute(100))
	if err != nil {
		log.Fatal(err)
	}
	defer limiter.Close() // gives unused quota back, stops the syncer

	http.HandleFunc("/api", func(w http.ResponseWriter, r *http.Request) {
		d, err := limiter.Allow(r.Context(), r.Header.Get("X-API-Key"))
		if err != nil { // an empty key, or the limiter is closed
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		ratelimit.SetHeaders(w.Header(), d)
		if !d.Allowed {
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		w.Write([]byte("ok"))
	})
}

// Optimistic mode, a fixed fleet of 8 instances and fail-closed behaviour
// for a limit that protects money. (Not run: it needs a Redis.)
func ExampleNew_options() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	limiter, err := hybrid.New(client, ratelimit.PerSecond(50),
		hybrid.WithMode(hybrid.Optimistic),
		hybrid.WithInstances(8),
		hybrid.WithFailureMode(ratelimit.FailClosed),
		hybrid.WithPrefix("payments"),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer limiter.Close()
}
