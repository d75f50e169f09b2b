package hybrid_test

import (
	"errors"
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
		switch {
		case errors.Is(err, ratelimit.ErrInvalidKey): // no API key
			http.Error(w, "missing API key", http.StatusBadRequest)
			return
		case err != nil: // the request was canceled, or the limiter is closed
			log.Printf("rate limiter: %v", err) // the error's text is for the logs, not the client
			http.Error(w, "try again later", http.StatusServiceUnavailable)
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
