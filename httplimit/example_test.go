package httplimit_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/httplimit"
	"github.com/hybridlimit/ratelimit/local"
)

// Two requests per API key per minute. Any ratelimit.Limiter works the same
// way: a hybrid.Limiter shares the quota across a fleet.
func Example() {
	// A fixed clock makes the output reproducible; leave WithClock out in a service.
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	lim, err := local.New(ratelimit.PerMinute(2), local.WithAlgorithm(ratelimit.FixedWindow),
		local.WithClock(func() time.Time { return now }))
	if err != nil {
		log.Fatal(err)
	}

	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") })
	limit := httplimit.New(lim,
		httplimit.WithKey(httplimit.Header("X-API-Key")),
		httplimit.WithPolicyName("per-key"))
	srv := httptest.NewServer(limit(api))
	defer srv.Close()

	for i := 0; i < 3; i++ {
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		req.Header.Set("X-API-Key", "key-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.Status)
		for _, h := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "RateLimit-Policy", "RateLimit", "Retry-After"} {
			if v := resp.Header.Get(h); v != "" {
				fmt.Printf("  %s: %s\n", h, v)
			}
		}
		fmt.Println(" ", strings.TrimSpace(string(body)))
	}
	// Output:
	// 200 OK
	//   X-RateLimit-Limit: 2
	//   X-RateLimit-Remaining: 1
	//   RateLimit-Policy: "per-key";q=2;w=60
	//   RateLimit: "per-key";r=1;t=60
	//   hello
	// 200 OK
	//   X-RateLimit-Limit: 2
	//   X-RateLimit-Remaining: 0
	//   RateLimit-Policy: "per-key";q=2;w=60
	//   RateLimit: "per-key";r=0;t=60
	//   hello
	// 429 Too Many Requests
	//   X-RateLimit-Limit: 2
	//   X-RateLimit-Remaining: 0
	//   RateLimit-Policy: "per-key";q=2;w=60
	//   RateLimit: "per-key";r=0;t=60
	//   Retry-After: 60
	//   {"error":"rate_limit_exceeded","retry_after":60}
}

// Behind a load balancer of your own at 10.0.0.0/8, the client is the
// rightmost address in X-Forwarded-For that is not the balancer's; what the
// client wrote itself, further left, is ignored.
func ExampleClientIP() {
	key := httplimit.ClientIP(netip.MustParsePrefix("10.0.0.0/8"))

	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "10.0.0.1:51234"                         // the balancer
	r.Header.Set("X-Forwarded-For", "6.6.6.6, 203.0.113.9") // 6.6.6.6 is the client's own claim
	fmt.Println(key(r))

	r.Header.Set("X-Forwarded-For", "2001:db8:1:2:3:4:5:6") // IPv6: the /64
	fmt.Println(key(r))
	// Output:
	// 203.0.113.9 <nil>
	// 2001:db8:1:2::/64 <nil>
}

// A quota per route and user: the same user has one quota per route.
func ExampleJoin() {
	key := httplimit.Join(httplimit.Static("POST /rides"), httplimit.Header("X-User-Id"))

	r := httptest.NewRequest(http.MethodPost, "/rides", nil)
	r.Header.Set("X-User-Id", "rider-4421")
	fmt.Println(key(r))

	r.Header.Del("X-User-Id")
	fmt.Println(key(r))
	// Output:
	// POST /rides|rider-4421 <nil>
	//  httplimit: cannot key the request: header X-User-Id missing or empty
}

// Several limits on one key, all or nothing: a burst of 2 refilled at 1 per
// second, and 3 per minute. Each limit is a policy of its own in
// RateLimit-Policy and RateLimit; X-RateLimit-* and Retry-After describe
// the tightest, which on a denial is the limit that denied.
func Example_severalLimits() {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC) // a fake clock, for reproducible output
	lim, err := local.NewMulti(
		[]ratelimit.Limit{{Rate: 1, Period: time.Second, Burst: 2}, ratelimit.PerMinute(3)},
		local.WithAlgorithms(ratelimit.TokenBucket, ratelimit.FixedWindow),
		local.WithClock(func() time.Time { return now }))
	if err != nil {
		log.Fatal(err)
	}
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") })
	h := httplimit.New(lim, httplimit.WithKey(httplimit.Header("X-API-Key")))(api)

	for i, wait := range []time.Duration{0, 0, 0, 2 * time.Second, 0} {
		now = now.Add(wait)
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("X-API-Key", "key-1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("request %d after %v: %d\n", i+1, wait, w.Code)
		for _, name := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "Retry-After", "RateLimit-Policy", "RateLimit"} {
			if v := w.Header().Get(name); v != "" {
				fmt.Printf("  %s: %s\n", name, v)
			}
		}
	}
	// Output:
	// request 1 after 0s: 200
	//   X-RateLimit-Limit: 2
	//   X-RateLimit-Remaining: 1
	//   RateLimit-Policy: "default-1s";q=2;w=1, "default-60s";q=3;w=60
	//   RateLimit: "default-1s";r=1;t=1, "default-60s";r=2;t=60
	// request 2 after 0s: 200
	//   X-RateLimit-Limit: 2
	//   X-RateLimit-Remaining: 0
	//   RateLimit-Policy: "default-1s";q=2;w=1, "default-60s";q=3;w=60
	//   RateLimit: "default-1s";r=0;t=2, "default-60s";r=1;t=60
	// request 3 after 0s: 429
	//   X-RateLimit-Limit: 2
	//   X-RateLimit-Remaining: 0
	//   Retry-After: 1
	//   RateLimit-Policy: "default-1s";q=2;w=1, "default-60s";q=3;w=60
	//   RateLimit: "default-1s";r=0;t=2, "default-60s";r=1;t=60
	// request 4 after 2s: 200
	//   X-RateLimit-Limit: 3
	//   X-RateLimit-Remaining: 0
	//   RateLimit-Policy: "default-1s";q=2;w=1, "default-60s";q=3;w=60
	//   RateLimit: "default-1s";r=1;t=1, "default-60s";r=0;t=58
	// request 5 after 0s: 429
	//   X-RateLimit-Limit: 3
	//   X-RateLimit-Remaining: 0
	//   Retry-After: 58
	//   RateLimit-Policy: "default-1s";q=2;w=1, "default-60s";q=3;w=60
	//   RateLimit: "default-1s";r=1;t=1, "default-60s";r=0;t=58
}
