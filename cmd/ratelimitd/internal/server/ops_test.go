package server_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/server"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

const opsConfig = `
domain: ops
descriptors:
  - key: strict
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: exact
    rate_limit: {unit: minute, requests_per_unit: 1000, mode: exact}
  - key: closed
    rate_limit: {unit: minute, requests_per_unit: 1000, failure_mode: closed}
  - key: small
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
`

// TestRedisFrozen: with Redis stopped by SIGSTOP (connections open, no
// answer), every call is still answered, by the rules' failure modes,
// within the timeout; /readyz says Redis is unreachable; all is back to
// normal once Redis is.
func TestRedisFrozen(t *testing.T) {
	redis := redistest.Standalone(t)
	dir := configDir(t, map[string]string{"ops.yaml": opsConfig})
	const timeout = 100 * time.Millisecond
	d := start(t, redis.Addr(), dir, func(o *server.Options) { o.Timeout = timeout })
	d.call(t, rq("ops", desc("strict", "warm"), desc("exact", "warm")))
	if code, _ := httpGet(t, d, "/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz before the fault: %d", code)
	}
	must(t, redis.Freeze())
	thawed := false
	defer func() {
		if !thawed {
			redis.Thaw()
		}
	}()
	var calls, answered atomic.Int64
	var mu sync.Mutex
	var slowest time.Duration
	codesSeen := map[string]int{}
	var wg sync.WaitGroup
	stop := time.Now().Add(1500 * time.Millisecond)
	for w := range 4 {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				// cold keys, so that each decision needs Redis
				key := uniq("cold")
				req := rq("ops", desc([]string{"strict", "exact", "closed"}[(i+w)%3], key))
				if i%4 == 0 {
					req = rq("ops", desc("strict", key), desc("exact", key), desc("closed", key))
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*timeout)
				begin := time.Now()
				r, err := d.rls.ShouldRateLimit(ctx, req)
				took := time.Since(begin)
				cancel()
				calls.Add(1)
				if err != nil {
					t.Errorf("with Redis stopped: %v after %v", err, took)
					continue
				}
				answered.Add(1)
				mu.Lock()
				slowest = max(slowest, took)
				codesSeen[codes(r)]++
				mu.Unlock()
			}
		})
	}
	code, body := httpGet(t, d, "/readyz")
	wg.Wait()
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "redis unreachable") {
		t.Errorf("/readyz with Redis stopped: %d %q", code, body)
	}
	t.Logf("Redis stopped: %d of %d calls answered, slowest %v; answers %v", answered.Load(), calls.Load(), slowest, codesSeen)
	if answered.Load() == 0 || answered.Load() != calls.Load() {
		t.Fatalf("%d of %d calls answered", answered.Load(), calls.Load())
	}
	if codesSeen["OK:OK"] == 0 || codesSeen["OVER_LIMIT:OVER_LIMIT"] == 0 {
		t.Errorf("want local and open answers (OK) and closed ones (OVER_LIMIT), got %v", codesSeen)
	}
	if v, _ := metric(scrape(t, d), "ratelimit_fallback_decisions_total"); v == 0 {
		t.Error("ratelimit_fallback_decisions_total did not count the decisions taken without Redis")
	}
	must(t, redis.Thaw())
	thawed = true
	eventually(t, 10*time.Second, "/readyz back", func() bool { c, _ := httpGet(t, d, "/readyz"); return c == http.StatusOK })
	eventually(t, 10*time.Second, "decisions from Redis again", func() bool {
		r := d.call(t, rq("ops", desc("closed", uniq("after"))))
		return codes(r) == "OK:OK"
	})
}

// TestMetrics scrapes /metrics and reads it with the Prometheus text parser.
func TestMetrics(t *testing.T) {
	redis := redistest.Standalone(t)
	dir := configDir(t, map[string]string{"ops.yaml": opsConfig})
	inOneWindow(t, time.Minute, 10*time.Second, func(s *soft, sfx string) {
		d := fresh(t, redis, dir, sfx)
		drive(t, d, rq("ops", desc("small", "zq-1")), 3)
		drive(t, d, rq("ops", desc("shadow", "zq-2")), 3)
		drive(t, d, rq("ops", desc("free", "zq-3")), 2)
		req := rq("ops", desc("exact", "zq-4"))
		req.HitsAddend = 5
		d.call(t, req)
		d.call(t, rq("ops", desc("nothing", "zq-5")))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		d.rls.ShouldRateLimit(ctx, rq("unknown", desc("a", "b")))
		cancel()
		fams := scrape(t, d)
		for _, c := range []struct {
			name   string
			labels []string
			want   float64
		}{
			{"ratelimit_decisions_total", []string{"domain", "ops", "rule", "small", "result", "ok"}, 2},
			{"ratelimit_decisions_total", []string{"domain", "ops", "rule", "small", "result", "over_limit"}, 1},
			{"ratelimit_decisions_total", []string{"domain", "ops", "rule", "shadow", "result", "ok"}, 1},
			{"ratelimit_decisions_total", []string{"domain", "ops", "rule", "shadow", "result", "shadow_over_limit"}, 2},
			{"ratelimit_domain_not_found_total", nil, 1},
			{"ratelimit_decisions_total", []string{"domain", "ops", "rule", "exact", "result", "ok"}, 1},
			{"ratelimit_hits_total", []string{"domain", "ops", "rule", "exact"}, 5},
			{"ratelimit_hits_total", []string{"domain", "ops", "rule", "small"}, 3},
			{"ratelimit_requests_total", []string{"code", "ok"}, 2 + 3 + 2 + 1 + 1 + 1},
			{"ratelimit_requests_total", []string{"code", "over_limit"}, 1},
			{"ratelimit_requests_total", []string{"code", "error"}, 0},
			{"ratelimit_decision_duration_seconds", nil, 11},
			{"ratelimit_config_reloads_total", []string{"result", "success"}, 1},
			{"ratelimit_config_reloads_total", []string{"result", "error"}, 0},
			{"ratelimit_config_last_reload_successful", nil, 1},
			{"ratelimit_config_rules", nil, 6},
			{"ratelimit_fallback_decisions_total", nil, 0},
			// one per kind: strict 1000, exact 1000, strict 1000 failing
			// closed, strict 2, strict 1
			{"ratelimit_limiters", nil, 5},
		} {
			got, found := metric(fams, c.name, c.labels...)
			s.expect(c.name+" "+strings.Join(c.labels, ","), got, c.want)
			s.expect(c.name+" present", found, true)
		}
		// unlimited descriptors are neither counted nor measured, as upstream
		for _, labels := range [][]string{{"domain", "ops", "rule", "free", "result", "unlimited"}, {"domain", "ops", "rule", "free", "result", "ok"}} {
			if _, found := metric(fams, "ratelimit_decisions_total", labels...); found {
				s.Errorf("an unlimited rule measured: %v", labels)
			}
		}
		if _, found := metric(fams, "ratelimit_hits_total", "domain", "ops", "rule", "free"); found {
			s.Errorf("the hits of an unlimited rule measured")
		}
		trips, _ := metric(fams, "ratelimit_redis_round_trips_total")
		s.expect("round trips counted", trips >= 1, true)
		for _, name := range []string{"go_goroutines", "process_cpu_seconds_total", "ratelimit_keys_tracked", "ratelimit_instances", "ratelimit_degraded", "ratelimit_local_decisions_total", "ratelimit_leases_total"} {
			_, found := metric(fams, name)
			s.expect(name+" present", found, true)
		}
		// rules are labelled by their path; no series is left of a rule removed
		if f := fams["ratelimit_decisions_total"]; f != nil {
			for _, m := range f.Metric {
				for _, l := range m.Label {
					if l.GetName() == "rule" && strings.Contains(l.GetValue(), "zq-") {
						s.Errorf("a request value leaked into a rule label: %v", l.GetValue())
					}
				}
			}
		}
	})
}

func TestHTTP(t *testing.T) {
	redis := redistest.Standalone(t)
	dir := configDir(t, map[string]string{"ops.yaml": opsConfig})
	d := start(t, redis.Addr(), dir, func(o *server.Options) {
		o.Prefix, o.DenyStatus, o.ResponseHeaders = uniq("http"), http.StatusForbidden, true
	})
	for _, c := range []struct {
		name, body string
		code       int
		frag       string
	}{
		{"allowed", `{"domain":"ops","descriptors":[{"entries":[{"key":"small","value":"h"}]}]}`, 200, `"overallCode":"OK"`},
		{"snake_case names", `{"domain":"ops","descriptors":[{"entries":[{"key":"small","value":"h"}]}],"hits_addend":1}`, 200, `"code":"OK"`},
		{"deny status", `{"domain":"ops","descriptors":[{"entries":[{"key":"small","value":"h"}]}]}`, 403, `"overallCode":"OVER_LIMIT"`},
		{"not JSON", `{"domain":`, 400, `"error":"not a RateLimitRequest`},
		{"unknown field", `{"domain":"ops","nope":1}`, 400, `"error"`},
		{"no descriptor", `{"domain":"ops"}`, 400, `at least one descriptor`},
		{"unknown domain: OK, no limit", `{"domain":"nope","descriptors":[{"entries":[{"key":"a","value":"b"}]}]}`, 200, `{"overallCode":"OK","statuses":[{"code":"OK"}]}`},
	} {
		code, body, hdr := httpPost(t, d, "/v1/check", c.body) // protojson varies its spaces: compared without them
		if code != c.code || !strings.Contains(strings.Join(strings.Fields(body), ""), strings.Join(strings.Fields(c.frag), "")) {
			t.Errorf("%s: %d %s, want %d and %s", c.name, code, body, c.code, c.frag)
		}
		if c.code == 200 && strings.Contains(c.body, `"small"`) && hdr.Get("RateLimit-Limit") != "2" {
			t.Errorf("%s: RateLimit-Limit header %q", c.name, hdr.Get("RateLimit-Limit"))
		}
	}
	resp, err := http.Get("http://" + d.srv.HTTPAddr() + "/v1/check")
	must(t, err)
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/check: %s", resp.Status)
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		if code, body := httpGet(t, d, p); code != 200 || body != "ok\n" {
			t.Errorf("%s: %d %q", p, code, body)
		}
	}
}

// TestShutdown: stopping drains the calls in flight (they get answers, not
// errors), gives every lease back, and ends in bounded time.
func TestShutdown(t *testing.T) {
	redis := redistest.Standalone(t)
	dir := configDir(t, map[string]string{"ops.yaml": opsConfig})
	t.Run("leases back", func(t *testing.T) {
		inOneWindow(t, time.Minute, 10*time.Second, func(s *soft, sfx string) {
			a := fresh(t, redis, dir, sfx)
			s.expect("a takes 1", codes(a.call(t, rq("ops", desc("small", "k")))), "OK:OK")
			must(t, a.stop())
			b := fresh(t, redis, dir, sfx)
			s.expect("b finds the other 1", codes(b.call(t, rq("ops", desc("small", "k")))), "OK:OK")
			s.expect("and no more", codes(b.call(t, rq("ops", desc("small", "k")))), "OVER_LIMIT:OVER_LIMIT")
			logs := a.logs.String()
			for _, m := range []string{`"msg":"draining"`, `"msg":"drained"`, `"msg":"stopped","leases_returned":true`} {
				s.expect("a's log holds "+m, strings.Contains(logs, m), true)
			}
		})
	})
	t.Run("in-flight calls finish", func(t *testing.T) {
		exactOnly := configDir(t, map[string]string{"x.yaml": "domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 9, mode: exact}\n"})
		d := start(t, redis.Addr(), exactOnly, func(o *server.Options) { o.Timeout = 400 * time.Millisecond })
		d.call(t, rq("x", desc("k", "warm")))
		must(t, redis.Freeze())
		defer redis.Thaw()
		var wg sync.WaitGroup
		var answered, failed atomic.Int64
		for range 8 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if _, err := d.rls.ShouldRateLimit(ctx, rq("x", desc("k", uniq("c")))); err != nil {
					failed.Add(1)
					t.Errorf("a call in flight at shutdown: %v", err)
					return
				}
				answered.Add(1)
			})
		}
		time.Sleep(100 * time.Millisecond) // the calls wait on the stopped Redis
		begin := time.Now()
		if err := d.stop(); err != nil {
			t.Fatalf("Run: %v", err)
		}
		wg.Wait()
		took := time.Since(begin)
		if answered.Load() != 8 {
			t.Fatalf("%d of 8 calls in flight answered", answered.Load())
		}
		if took > 5*time.Second {
			t.Fatalf("shutdown took %v, beyond the drain timeout", took)
		}
	})
}

// TestEmbeddedRedis: without Redis addresses ratelimitd runs on an
// in-process Redis, says so, and enforces its limits.
func TestEmbeddedRedis(t *testing.T) {
	dir := configDir(t, map[string]string{"ops.yaml": opsConfig})
	d := start(t, "", dir, func(o *server.Options) { o.RedisAddrs = nil })
	if !strings.Contains(d.logs.String(), "embedded in-process Redis") {
		t.Fatalf("no warning about the embedded Redis:\n%s", d.logs.String())
	}
	inOneWindow(t, time.Minute, 5*time.Second, func(s *soft, sfx string) {
		req := rq("ops", desc("small", sfx))
		s.expect("2 a minute", codes(drive(t, d, req, 2)), "OK:OK")
		s.expect("3rd", codes(d.call(t, req)), "OVER_LIMIT:OVER_LIMIT")
	})
}
