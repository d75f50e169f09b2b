package server_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/server"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// Several limits on one descriptor (rate_limits), in each mode: an hourly
// bucket of 3 with a window of 5 per minute and one of 1000 per day
// (bucket_first), and an hourly bucket of 10 with a window of 5 per minute
// (window_first).
const multiConfig = `
domain: multi
descriptors:
  - key: bucket_first
    rate_limits:
      - {unit: hour, requests_per_unit: 3, algorithm: token_bucket, name: burst, mode: %[1]s}
      - {unit: minute, requests_per_unit: 5, name: per-minute}
      - {unit: day, requests_per_unit: 1000}
  - key: window_first
    rate_limits:
      - {unit: hour, requests_per_unit: 10, algorithm: token_bucket, name: burst, mode: %[1]s}
      - {unit: minute, requests_per_unit: 5, name: per-minute}
`

// TestMultiLimit: a descriptor of several limits is admitted only when
// every limit admits it, and a hit one limit denies is counted by none
// (compared in Redis once the daemon has given its leases back); each
// status describes the tightest limit: its current_limit (name, unit,
// requests_per_unit), limit_remaining and duration_until_reset, as for a
// rule of one limit.
func TestMultiLimit(t *testing.T) {
	srv := redistest.Standalone(t)
	client := srv.Client()
	t.Cleanup(func() { client.Close() })
	for _, mode := range []string{"strict", "exact"} {
		t.Run(mode, func(t *testing.T) {
			dir := configDir(t, map[string]string{"multi.yaml": fmt.Sprintf(multiConfig, mode)})
			inOneWindow(t, time.Minute, 10*time.Second, func(s *soft, sfx string) {
				d := fresh(t, srv, dir, sfx)
				status := func(key, value string) (string, *pb.RateLimitResponse_DescriptorStatus) {
					r := d.call(t, rq("multi", desc(key, value)))
					st := r.Statuses[0]
					return codes(r), st
				}
				describe := func(st *pb.RateLimitResponse_DescriptorStatus) string {
					return st.CurrentLimit.GetName() + " " + limitOf(st) + " remaining " + uitoa(uint64(st.LimitRemaining))
				}

				// The bucket of 3 is the tightest, and denies the fourth.
				for i := range 3 {
					c, st := status("bucket_first", "x")
					s.expect(fmt.Sprintf("bucket_first %d", i), c+" "+describe(st), "OK:OK burst HOUR:3 remaining "+strconv.Itoa(2-i))
				}
				c, st := status("bucket_first", "x")
				s.expect("bucket_first denied", c+" "+describe(st), "OVER_LIMIT:OVER_LIMIT burst HOUR:3 remaining 0")
				reset := st.DurationUntilReset.AsDuration()
				s.expect("bucket_first: reset when the bucket is full again, within the hour", reset > 30*time.Minute && reset <= time.Hour, true)
				c, st = status("bucket_first", "x")
				s.expect("bucket_first denied again", c+" "+describe(st), "OVER_LIMIT:OVER_LIMIT burst HOUR:3 remaining 0")

				// The window of 5 per minute is the tightest, and denies the
				// sixth; hits it denies cost the bucket nothing.
				for i := range 5 {
					c, st := status("window_first", "x")
					s.expect(fmt.Sprintf("window_first %d", i), c+" "+describe(st), "OK:OK per-minute MINUTE:5 remaining "+strconv.Itoa(4-i))
				}
				for range 3 {
					c, st := status("window_first", "x")
					s.expect("window_first denied", c+" "+describe(st), "OVER_LIMIT:OVER_LIMIT per-minute MINUTE:5 remaining 0")
					reset := st.DurationUntilReset.AsDuration()
					s.expect("window_first: reset at the minute's end", reset >= time.Second && reset <= time.Minute, true)
				}

				// hits_addend above one limit: OVER_LIMIT without a call,
				// describing that limit.
				r := d.call(t, rq("multi", withHits(desc("bucket_first", "y"), 4)))
				s.expect("4 hits against a bucket of 3", codes(r)+" "+describe(r.Statuses[0]), "OVER_LIMIT:OVER_LIMIT burst HOUR:3 remaining 0")
				r = d.call(t, rq("multi", withHits(desc("window_first", "y"), 6)))
				s.expect("6 hits against 5 per minute", codes(r)+" "+describe(r.Statuses[0]), "OVER_LIMIT:OVER_LIMIT per-minute MINUTE:5 remaining 0")
				r = d.call(t, rq("multi", withHits(desc("bucket_first", "y"), 3)))
				s.expect("3 hits fit every limit", codes(r)+" "+describe(r.Statuses[0]), "OK:OK burst HOUR:3 remaining 0")

				// The limiters' metrics: one per rule here.
				fams := scrape(t, d)
				v, _ := metric(fams, "ratelimit_limiters")
				s.expect("limiters", v, 2.0)
				name := mode + " token_bucket 3/3600s + fixed_window 5/60s + fixed_window 1000/86400s local"
				keys, found := metric(fams, "ratelimit_keys_tracked", "limiter", name)
				_, degraded := metric(fams, "ratelimit_degraded", "limiter", name)
				if mode == "exact" {
					s.expect("exact: no keys in memory", found, false)
					s.expect("exact: no breaker state known of a global.Multi", degraded, false)
				} else {
					s.expect("strict: keys in memory", keys, 2.0)
					s.expect("strict: breaker state", degraded, true)
					leases, _ := metric(fams, "ratelimit_leases_total")
					s.expect("strict: leases", leases > 0, true)
				}

				// Once the daemon has stopped, giving its leases back, Redis
				// holds what was admitted and nothing of what was denied.
				if err := d.stop(); err != nil {
					t.Errorf("stop: %v", err)
				}
				prefix := "t-" + sfx
				for _, c := range []struct {
					key, kind string
					want      int64
				}{
					{"multi|bucket_first=x", "fw:5:", 3},
					{"multi|bucket_first=x", "fw:1000:", 3},
					{"multi|bucket_first=y", "fw:5:", 3},
					{"multi|window_first=x", "fw:5:", 5},
				} {
					s.expect(c.key+" "+c.kind+" in Redis", windowCount(t, client, prefix, c.key, c.kind), c.want)
				}
			})
		})
	}
}

// In optimistic mode a rule of several limits admits the first hits, and
// denies, by the tightest limit, once the credit is spent.
func TestMultiLimitOptimistic(t *testing.T) {
	srv := redistest.Standalone(t)
	dir := configDir(t, map[string]string{"multi.yaml": fmt.Sprintf(multiConfig, "optimistic")})
	inOneWindow(t, time.Minute, 10*time.Second, func(s *soft, sfx string) {
		d := fresh(t, srv, dir, sfx)
		req := rq("multi", desc("bucket_first", "x"))
		r := d.call(t, req)
		// (On credit, a cold key's limits may all report 0 remaining: the
		// status then describes the one that resets last, the day.)
		s.expect("the first hit", codes(r), "OK:OK")
		s.expect("describes one of the limits", strings.Contains("HOUR:3 MINUTE:5 DAY:1000", limitOf(r.Statuses[0])), true)
		allowed := 1
		for range 9 {
			r = d.call(t, req)
			if r.OverallCode == ok {
				allowed++
			}
		}
		s.expect("the bucket of 3, plus at most its share on credit", allowed >= 3 && allowed <= 4, true)
		s.expect("denied by the bucket", codes(r)+" "+limitOf(r.Statuses[0]), "OVER_LIMIT:OVER_LIMIT HOUR:3")
	})
}

// windowCount returns the count of the current fixed window of the given
// kind ("fw:<rate>:") of a key under prefix, read from Redis: the sum of
// every such counter (one window is current). A counter is a string when
// only global limiters wrote it, a hash whose field c is the count when
// the hybrid did.
func windowCount(t *testing.T, c *redis.Client, prefix, key, kind string) int64 {
	t.Helper()
	ctx := context.Background()
	keys, err := c.Keys(ctx, prefix+":*{"+key+"}:"+kind+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, k := range keys {
		typ, err := c.Type(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		var v int64
		if typ == "hash" {
			v, err = c.HGet(ctx, k, "c").Int64()
		} else {
			v, err = c.Get(ctx, k).Int64()
		}
		if err != nil {
			t.Fatalf("%s (%s): %v", k, typ, err)
		}
		n += v
	}
	return n
}

// A fleet of three on a rule of several limits, hammered: together they
// admit no more than the tightest limit allows, and the per-minute window
// in Redis counts exactly what was admitted, the denied hits none.
func TestMultiLimitFleet(t *testing.T) {
	srv := redistest.Standalone(t)
	client := srv.Client()
	t.Cleanup(func() { client.Close() })
	dir := configDir(t, map[string]string{"fleet.yaml": `
domain: fleet
descriptors:
  - key: multi
    rate_limits:
      - {unit: minute, requests_per_unit: 100}
      - {unit: hour, requests_per_unit: 60, algorithm: token_bucket}
`})
	inOneWindow(t, time.Minute, 15*time.Second, func(s *soft, sfx string) {
		began := time.Now()
		prefix := "fleet-" + sfx
		var fleet []*daemon
		for range 3 {
			fleet = append(fleet, start(t, srv.Addr(), dir, func(o *server.Options) { o.Prefix = prefix }))
		}
		allowed, calls := hammer(t, fleet, "multi", []string{"k0", "k1", "k2"}, 1500*time.Millisecond)
		for _, d := range fleet {
			if err := d.stop(); err != nil {
				t.Errorf("stop: %v", err)
			}
		}
		refill := int64(time.Since(began) / time.Minute) // the bucket's whole tokens refilled at most
		for k, key := range []string{"k0", "k1", "k2"} {
			a := allowed[k]
			s.expect("key "+key+": hammered past its limits", calls/3 > 100, true)
			s.expect("key "+key+": admitted at most the bucket's 60 + its refill", a <= 60+refill, true)
			s.expect("key "+key+": admitted at least the bucket's 60", a >= 60, true)
			s.expect("key "+key+": the minute window counted what was admitted, and only that",
				windowCount(t, client, prefix, "fleet|multi="+key, "fw:100:"), a)
		}
	})
}

// A reload that drops one rule of several limits closes its limiter and
// keeps the other's, with its counts.
func TestMultiLimitReload(t *testing.T) {
	srv := redistest.Standalone(t)
	dir := configDir(t, map[string]string{"multi.yaml": fmt.Sprintf(multiConfig, "strict")})
	inOneWindow(t, time.Minute, 10*time.Second, func(s *soft, sfx string) {
		d := fresh(t, srv, dir, sfx)
		s.expect("bucket_first", codes(d.call(t, rq("multi", desc("bucket_first", "x")))), "OK:OK")
		s.expect("window_first", codes(d.call(t, rq("multi", desc("window_first", "x")))), "OK:OK")
		cfg := fmt.Sprintf(multiConfig, "strict")
		writeFile(t, dir+"/multi.yaml", cfg[:strings.Index(cfg, "  - key: window_first")])
		eventually(t, 10*time.Second, "the reload closes the dropped rule's limiter", func() bool {
			v, _ := metric(scrape(t, d), "ratelimit_limiters")
			return v == 1
		})
		s.expect("window_first is gone", codes(d.call(t, rq("multi", desc("window_first", "x")))), "OK:OK")
		s.expect("window_first has no rule", limitOf(d.call(t, rq("multi", desc("window_first", "x"))).Statuses[0]), "none")
		s.expect("bucket_first kept its count: 2 left", codes(drive(t, d, rq("multi", desc("bucket_first", "x")), 2)), "OK:OK")
		s.expect("then denied", codes(d.call(t, rq("multi", desc("bucket_first", "x")))), "OVER_LIMIT:OVER_LIMIT")
	})
}
