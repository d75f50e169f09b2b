package httplimit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/httplimit"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/hybridlimit/ratelimit/local"
)

// benchLimit is never reached in a benchmark: every request is allowed, so
// what is measured is the allowed path.
var benchLimit = ratelimit.Limit{Rate: 1_000_000_000, Period: ratelimit.PerSecond(1).Period}

var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })

// benchLimits are an API plan's burst bucket, per-minute and per-ten-minute
// windows, none of which a benchmark fills: every request is allowed.
var (
	benchLimits = []ratelimit.Limit{
		{Rate: 1_000_000_000, Period: time.Second, Burst: 1_000_000_000},
		{Rate: 100_000_000, Period: time.Minute},
		{Rate: 10_000_000, Period: 10 * time.Minute},
	}
	benchAlgs = []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.FixedWindow, ratelimit.SlidingWindow}
)

// BenchmarkMiddleware: one allowed request through the middleware, keyed by
// ClientIP, all headers written, against the bare handler and the limiter
// called alone in the same run. The middleware's own cost is
// middleware - limiter - bare.
//
// The multi cases are the same over a Multi of benchLimits (three policies
// in RateLimit-Policy and RateLimit); their limiter case is AllowNInto with
// a reused buffer, as the middleware calls it.
//
//	go test -run '^$' -bench Middleware -benchmem ./httplimit/
func BenchmarkMiddleware(b *testing.B) {
	loc, err := local.New(benchLimit, local.WithAlgorithm(ratelimit.FixedWindow))
	if err != nil {
		b.Fatal(err)
	}
	srv := redistest.Standalone(b)
	client := srv.Client()
	b.Cleanup(func() { client.Close() })
	hyb, err := hybrid.New(client, benchLimit, hybrid.WithPrefix("bench-http"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { hyb.Close() })
	locMulti, err := local.NewMulti(benchLimits, local.WithAlgorithms(benchAlgs...))
	if err != nil {
		b.Fatal(err)
	}
	hybMulti, err := hybrid.NewMulti(client, benchLimits, hybrid.WithAlgorithms(benchAlgs...), hybrid.WithPrefix("bench-http-multi"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { hybMulti.Close() })

	b.Run("bare", func(b *testing.B) { benchHandler(b, ok) })
	for _, c := range []struct {
		name string
		lim  ratelimit.Limiter
	}{{"local", loc}, {"hybrid", hyb}, {"local-multi", locMulti}, {"hybrid-multi", hybMulti}} {
		b.Run(c.name+"/limiter", func(b *testing.B) {
			ctx := context.Background()
			allow := c.lim.AllowN
			if ml, ok := c.lim.(ratelimit.MultiLimiter); ok {
				states := make([]ratelimit.LimitState, 0, ratelimit.MaxLimits)
				allow = func(ctx context.Context, key string, n int) (ratelimit.Decision, error) {
					return ml.AllowNInto(ctx, key, n, &states)
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				if d, err := allow(ctx, "192.0.2.1", 1); err != nil || !d.Allowed {
					b.Fatal(d, err)
				}
			}
		})
		h := httplimit.New(c.lim)(ok)
		b.Run(c.name+"/middleware", func(b *testing.B) { benchHandler(b, h) })
		b.Run(c.name+"/middleware-parallel", func(b *testing.B) { benchHandlerParallel(b, h) })
	}
}

func benchHandler(b *testing.B, h http.Handler) {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "192.0.2.1:40000"
	w := &recorder{h: make(http.Header)}
	b.ReportAllocs()
	for b.Loop() {
		clear(w.h)
		h.ServeHTTP(w, r)
		if w.status != http.StatusOK {
			b.Fatalf("status %d", w.status)
		}
	}
}

// benchHandlerParallel: each goroutine is its own client (its own key).
func benchHandlerParallel(b *testing.B, h http.Handler) {
	var next atomic.Int32
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = fmt.Sprintf("198.51.100.%d:40000", next.Add(1))
		w := &recorder{h: make(http.Header)}
		for pb.Next() {
			clear(w.h)
			h.ServeHTTP(w, r)
			if w.status != http.StatusOK {
				b.Errorf("status %d", w.status)
				return
			}
		}
	})
}
