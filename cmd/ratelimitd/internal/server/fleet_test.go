package server_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/server"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

const fleetConfig = `
domain: fleet
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 100, mode: exact}
  - key: bucket
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: token_bucket}
  - key: gcra
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: gcra}
`

// TestFleetStrict: three ratelimitd, each with its own Redis client and
// limiters, on one Redis, hammered on the same keys: per key and window
// they never admit more than the limit together, they learn that they are
// three, and once they have stopped (giving their leases back) a fourth
// finds exactly the rest of the quota: nothing over, nothing lost. The
// buckets (strict, hybrid) hold 100 and refill 100 per hour: together the
// fleet admits at most 100 + one per 36s elapsed, and what it admitted and
// what is left add up to that.
func TestFleetStrict(t *testing.T) {
	redis := redistest.Standalone(t)
	dir := configDir(t, map[string]string{"fleet.yaml": fleetConfig})
	for _, kind := range []string{"user", "client", "bucket", "gcra"} { // strict, exact, strict bucket, strict gcra
		t.Run(kind, func(t *testing.T) {
			inOneWindow(t, time.Minute, 15*time.Second, func(s *soft, sfx string) {
				began := time.Now()
				prefix := "fleet-" + sfx
				var fleet []*daemon
				for range 3 {
					fleet = append(fleet, start(t, redis.Addr(), dir, func(o *server.Options) { o.Prefix = prefix }))
				}
				keys := []string{"k0", "k1", "k2", "k3", "k4"}
				allowed, calls := hammer(t, fleet, kind, keys, 1500*time.Millisecond)
				if kind != "client" {
					v, _ := metric(scrape(t, fleet[0]), "ratelimit_instances")
					s.expect("instances learned by each hybrid limiter", v, 3.0)
				}
				var trips uint64
				for _, d := range fleet {
					trips += d.srv.Service().RoundTrips()
					if err := d.stop(); err != nil {
						t.Errorf("stop: %v", err)
					}
				}
				t.Logf("%s: %d calls, allowed per key %v, %.1f Redis round trips per 1,000 calls",
					kind, calls, allowed, 1000*float64(trips)/float64(calls))
				last := start(t, redis.Addr(), dir, func(o *server.Options) { o.Prefix = prefix })
				for k, key := range keys {
					a := allowed[k]
					s.expect(fmt.Sprintf("key %s: hammered past its limit", key), calls/5 > 100, true)
					rest := 0
					for ; rest <= 100; rest++ {
						if codes(last.call(t, rq("fleet", desc(kind, key)))) != "OK:OK" {
							break
						}
					}
					if kind == "bucket" || kind == "gcra" {
						refill := int64(time.Since(began) / (36 * time.Second)) // whole tokens refilled at most
						s.expect(fmt.Sprintf("key %s: admitted by the fleet at most the burst + the refill", key), a <= 100+refill, true)
						s.expect(fmt.Sprintf("key %s: what the fleet admitted + what is left, nothing lost", key),
							a+int64(rest) >= 100 && a+int64(rest) <= 100+refill, true)
						continue
					}
					s.expect(fmt.Sprintf("key %s: admitted by the fleet at most the limit", key), a <= 100, true)
					s.expect(fmt.Sprintf("key %s: what the fleet admitted + what is left", key), int(a)+rest, 100)
				}
			})
		})
	}
}

// hammer has four workers per daemon call ShouldRateLimit on descriptors
// (descKey, keys[i]), each key in turn, for dur; it returns the calls
// allowed per key, and the calls made.
func hammer(t *testing.T, fleet []*daemon, descKey string, keys []string, dur time.Duration) ([]int64, int64) {
	allowed := make([]atomic.Int64, len(keys))
	var calls atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(dur)
	for di, d := range fleet {
		for w := range 4 {
			wg.Go(func() {
				for i := di*4 + w; time.Now().Before(stop); i++ {
					k := i % len(keys)
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					r, err := d.rls.ShouldRateLimit(ctx, rq("fleet", desc(descKey, keys[k])))
					cancel()
					if err != nil {
						t.Errorf("daemon %d: %v", di, err)
						return
					}
					calls.Add(1)
					if r.OverallCode == ok {
						allowed[k].Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	out := make([]int64, len(keys))
	for i := range allowed {
		out[i] = allowed[i].Load()
	}
	return out, calls.Load()
}
