package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/server"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

const semanticsConfig = `
domain: sem
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: q1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: q2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: big
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: exact_fw
    rate_limit: {unit: minute, requests_per_unit: 4, mode: exact}
  - key: exact_sw
    rate_limit: {unit: minute, requests_per_unit: 4, mode: exact, algorithm: sliding_window}
  - key: exact_log
    rate_limit: {unit: minute, requests_per_unit: 4, mode: exact, algorithm: sliding_log}
  - key: exact_bucket
    rate_limit: {unit: minute, requests_per_unit: 4, mode: exact, algorithm: token_bucket}
  - key: exact_gcra
    rate_limit: {unit: minute, requests_per_unit: 4, mode: exact, algorithm: gcra}
  - key: optimistic
    rate_limit: {unit: minute, requests_per_unit: 4, mode: optimistic}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 4, algorithm: sliding_window}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 4, algorithm: token_bucket}
  - key: gcra
    rate_limit: {unit: minute, requests_per_unit: 4, algorithm: gcra}
  - key: optimistic_bucket
    rate_limit: {unit: minute, requests_per_unit: 4, algorithm: token_bucket, mode: optimistic}
`

// TestDescriptorSemantics checks the answers of envoyproxy/ratelimit's
// request semantics that its README examples do not cover.
func TestDescriptorSemantics(t *testing.T) {
	redis := redistest.Standalone(t)
	dir := configDir(t, map[string]string{"sem.yaml": semanticsConfig})

	t.Run("each descriptor counted", func(t *testing.T) {
		inOneWindow(t, time.Minute, 5*time.Second, func(s *soft, sfx string) {
			d := fresh(t, redis, dir, sfx)
			req := rq("sem", desc("a", "x"), desc("b", "x"), desc("a", "y"))
			for i := range 3 {
				r := d.call(t, req)
				s.expect("within both", codes(r), "OK:OK,OK,OK")
				s.expect("a=x remaining", r.Statuses[0].LimitRemaining, uint32(4-i))
				s.expect("b=x remaining", r.Statuses[1].LimitRemaining, uint32(2-i))
				s.expect("a=y remaining", r.Statuses[2].LimitRemaining, uint32(4-i))
				reset := r.Statuses[0].DurationUntilReset.AsDuration()
				s.expect("reset within the minute", reset > 0 && reset <= time.Minute, true)
			}
			s.expect("b over, a still within", codes(d.call(t, req)), "OVER_LIMIT:OK,OVER_LIMIT,OK")
		})
	})

	t.Run("hits_addend", func(t *testing.T) {
		inOneWindow(t, time.Minute, 5*time.Second, func(s *soft, sfx string) {
			d := fresh(t, redis, dir, sfx)
			req := rq("sem", desc("big", "x"))
			req.HitsAddend = 10
			r := d.call(t, req)
			s.expect("request hits_addend 10", codes(r)+" "+uitoa(uint64(r.Statuses[0].LimitRemaining)), "OK:OK 90")
			r = d.call(t, rq("sem", withHits(desc("big", "x"), 0)))
			s.expect("descriptor hits_addend 0 checks, counting nothing", codes(r)+" "+uitoa(uint64(r.Statuses[0].LimitRemaining)), "OK:OK 90")
			req = rq("sem", withHits(desc("big", "x"), 9), desc("big", "y"))
			req.HitsAddend = 20
			r = d.call(t, req)
			s.expect("the descriptor's own hits_addend wins over the request's", uitoa(uint64(r.Statuses[0].LimitRemaining))+" "+uitoa(uint64(r.Statuses[1].LimitRemaining)), "81 80")
			r = d.call(t, rq("sem", withHits(desc("big", "x"), 101)))
			s.expect("more hits than the limit: over, nothing counted", codes(r)+" "+uitoa(uint64(r.Statuses[0].LimitRemaining)), "OVER_LIMIT:OVER_LIMIT 0")
			s.expect("its limit", limitOf(r.Statuses[0]), "MINUTE:100")
			s.expect("then the rest, one by one", codes(drive(t, d, rq("sem", desc("big", "x")), 81)), "OK:OK")
			s.expect("then nothing", codes(d.call(t, rq("sem", desc("big", "x")))), "OVER_LIMIT:OVER_LIMIT")
			s.expect("a check when nothing is left", codes(d.call(t, rq("sem", withHits(desc("big", "x"), 0)))), "OVER_LIMIT:OVER_LIMIT")
			// exact mode: a hits_addend of exactly what is left fits
			r = d.call(t, rq("sem", withHits(desc("exact_fw", "h"), 3)))
			s.expect("exact: 3 hits of 4", codes(r)+" "+uitoa(uint64(r.Statuses[0].LimitRemaining)), "OK:OK 1")
			r = d.call(t, rq("sem", withHits(desc("exact_fw", "h"), 2)))
			s.expect("exact: 2 hits, 1 left: over, nothing counted", codes(r), "OVER_LIMIT:OVER_LIMIT")
			r = d.call(t, rq("sem", withHits(desc("exact_fw", "h"), 1)))
			s.expect("exact: the last one", codes(r)+" "+uitoa(uint64(r.Statuses[0].LimitRemaining)), "OK:OK 0")
		})
	})

	t.Run("quota_mode", func(t *testing.T) {
		inOneWindow(t, time.Minute, 5*time.Second, func(s *soft, sfx string) {
			d := fresh(t, redis, dir, sfx)
			req := rq("sem", desc("q1", "x"), desc("q2", "x"))
			s.expect("both quotas left", codes(d.call(t, req)), "OK:OK,OK")
			s.expect("one quota left is enough", codes(d.call(t, req)), "OK:OVER_LIMIT,OK")
			s.expect("every quota over", codes(d.call(t, req)), "OVER_LIMIT:OVER_LIMIT,OVER_LIMIT")
			mixed := rq("sem", desc("q1", "y"), desc("b", "y"), desc("b", "y"), desc("b", "y"), desc("b", "y"))
			s.expect("a rate limit over is over whatever the quotas", codes(d.call(t, mixed)), "OVER_LIMIT:OK,OK,OK,OK,OVER_LIMIT")
		})
	})

	t.Run("modes and algorithms", func(t *testing.T) {
		inOneWindow(t, time.Minute, 5*time.Second, func(s *soft, sfx string) {
			d := fresh(t, redis, dir, sfx)
			// optimistic: at most its share (Rate / 8 per instance, at least
			// 1) above the limit per window
			allowed := 0
			for range 8 {
				if codes(d.call(t, rq("sem", desc("optimistic", "x")))) == "OK:OK" {
					allowed++
				}
			}
			s.expect("optimistic: the limit, plus at most its share", allowed >= 4 && allowed <= 5, true)
			allowed = 0
			for range 8 {
				if codes(d.call(t, rq("sem", desc("optimistic_bucket", "x")))) == "OK:OK" {
					allowed++
				}
			}
			s.expect("optimistic bucket: the burst, plus at most its share", allowed >= 4 && allowed <= 5, true)
			for _, key := range []string{"exact_fw", "exact_sw", "exact_log", "exact_bucket", "exact_gcra", "sliding", "a", "bucket", "gcra"} {
				req := rq("sem", desc(key, "x"))
				n := 4
				if key == "a" {
					n = 5
				}
				bucket := strings.Contains(key, "bucket") || strings.Contains(key, "gcra")
				for i := range n {
					r := d.call(t, req)
					s.expect(key+" within", codes(r), "OK:OK")
					if !bucket { // buckets report whole tokens refilled meanwhile
						s.expect(key+" remaining", r.Statuses[0].LimitRemaining, uint32(n-1-i))
					}
				}
				r := d.call(t, req)
				s.expect(key+" over", codes(r), "OVER_LIMIT:OVER_LIMIT")
				// A window ends, and a bucket of requests_per_unit refills,
				// within the unit.
				reset := r.Statuses[0].DurationUntilReset.AsDuration()
				s.expect(key+" over: reset within the minute", reset >= time.Second && reset <= time.Minute, true)
				if bucket { // empty, it is full again about a minute later
					s.expect(key+" over: reset when the bucket is full", reset >= 45*time.Second, true)
				}
			}
			before := d.srv.Service().RoundTrips()
			for range 10 {
				d.call(t, rq("sem", desc("exact_fw", uniq("k"))))
			}
			s.expect("exact mode: one round trip per decision", d.srv.Service().RoundTrips()-before >= 10, true)
		})
	})

	t.Run("limit override", func(t *testing.T) {
		inOneWindow(t, time.Minute, 5*time.Second, func(s *soft, sfx string) {
			d := fresh(t, redis, dir, sfx)
			od := desc("big", "x")
			od.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_MINUTE}
			r := drive(t, d, rq("sem", od), 2)
			s.expect("the override's 2", codes(r)+" "+limitOf(r.Statuses[0]), "OK:OK MINUTE:2")
			s.expect("its 3rd", codes(d.call(t, rq("sem", od))), "OVER_LIMIT:OVER_LIMIT")
			r = d.call(t, rq("sem", desc("unconfigured", "x")))
			s.expect("no rule", limitOf(r.Statuses[0]), "none")
			ud := desc("unconfigured", "x")
			ud.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
			s.expect("an override applies without a rule", codes(d.call(t, rq("sem", ud))), "OK:OK")
			s.expect("an override applies without a rule, 2nd", codes(d.call(t, rq("sem", ud))), "OVER_LIMIT:OVER_LIMIT")
		})
	})

	t.Run("response headers", func(t *testing.T) {
		inOneWindow(t, time.Minute, 5*time.Second, func(s *soft, sfx string) {
			d := start(t, redis.Addr(), dir, func(o *server.Options) { o.Prefix, o.ResponseHeaders = "t-"+sfx, true })
			r := d.call(t, rq("sem", desc("big", "x"), desc("b", "x")))
			h := map[string]string{}
			for _, hv := range r.ResponseHeadersToAdd {
				h[hv.Key] = hv.Value
			}
			s.expect("RateLimit-Limit of the closest", h["RateLimit-Limit"], "3")
			s.expect("RateLimit-Remaining", h["RateLimit-Remaining"], "2")
			reset := r.Statuses[1].DurationUntilReset.GetSeconds()
			s.expect("RateLimit-Reset", h["RateLimit-Reset"], uitoa(uint64(reset)))
			d.call(t, rq("sem", desc("b", "x"), desc("b", "x")))
			r = d.call(t, rq("sem", desc("b", "x"), desc("big", "x")))
			s.expect("over", codes(r), "OVER_LIMIT:OVER_LIMIT,OK")
			h = map[string]string{}
			for _, hv := range r.ResponseHeadersToAdd {
				h[hv.Key] = hv.Value
			}
			s.expect("headers of the descriptor over", h["RateLimit-Limit"]+"/"+h["RateLimit-Remaining"], "3/0")
		})
	})

	t.Run("global shadow mode", func(t *testing.T) {
		inOneWindow(t, time.Minute, 5*time.Second, func(s *soft, sfx string) {
			d := start(t, redis.Addr(), dir, func(o *server.Options) { o.Prefix, o.ShadowMode = "t-"+sfx, true })
			req := rq("sem", desc("b", "x"), desc("big", "x"))
			s.expect("within", codes(drive(t, d, req, 3)), "OK:OK,OK")
			s.expect("over, answered OK; the statuses tell", codes(d.call(t, req)), "OK:OVER_LIMIT,OK")
			v, _ := metric(scrape(t, d), "ratelimit_shadow_overrides_total")
			s.expect("overrides counted", v, 1.0)
		})
	})

	t.Run("bad requests", func(t *testing.T) {
		d := start(t, redis.Addr(), dir, nil)
		if r := d.call(t, rq("nope", desc("a", "x"), desc("b", "y"))); codes(r) != "OK:OK,OK" || r.Statuses[0].CurrentLimit != nil {
			t.Errorf("unknown domain: %v, want OK with no limit, as envoyproxy/ratelimit answers", r)
		}
		neg := desc("a", "x")
		neg.IsNegativeHits = true
		for _, c := range []struct {
			name string
			req  *pb.RateLimitRequest
			code grpccodes.Code
		}{
			{"empty domain", rq("", desc("a", "x")), grpccodes.InvalidArgument},
			{"no descriptor", rq("sem"), grpccodes.InvalidArgument},
			{"negative hits", rq("sem", neg), grpccodes.InvalidArgument},
			{"override with an unknown unit", rq("sem", &rlcommon.RateLimitDescriptor{
				Entries: desc("a", "x").Entries,
				Limit:   &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit(99)}}), grpccodes.InvalidArgument},
		} {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := d.rls.ShouldRateLimit(ctx, c.req)
			cancel()
			if status.Code(err) != c.code {
				t.Errorf("%s: got %v, want %v", c.name, err, c.code)
			}
		}
		r := d.call(t, rq("sem", desc()))
		if codes(r) != "OK:OK" || r.Statuses[0].CurrentLimit != nil {
			t.Errorf("a descriptor without entries matches nothing: %v", r)
		}
		r = d.call(t, rq("sem", desc("a", "x", "deeper", "y")))
		if codes(r) != "OK:OK" || r.Statuses[0].CurrentLimit != nil || r.Statuses[0].LimitRemaining != 0 {
			t.Errorf("a deeper descriptor matches nothing: %v", r)
		}
	})
}
