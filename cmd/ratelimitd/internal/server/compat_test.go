package server_test

// ratelimitd's answers to what envoyproxy/ratelimit deployments rely on:
// health checks, response headers only when asked, dynamic metadata,
// checks without counting, STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT,
// QUOTA_MODE, limits above 2^53 us and the metric labels of overrides.

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/server"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

const compatConfig = `
domain: compat
descriptors:
  - key: min
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: hour
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
  - key: day
    rate_limit: {unit: day, requests_per_unit: 1000000}
  - key: year
    rate_limit: {unit: year, requests_per_unit: 4294967295}
  - key: service
    value: service_1
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata: {name: service_1, quota: {tier: gold}}
  - key: service
    value: service_2
    rate_limit: {unit: minute, requests_per_unit: 2}
    metadata: {name: service_2, quota: {tier: silver, region: eu}}
`

func TestHealthcheckAsEnvoy(t *testing.T) {
	redis := redistest.Standalone(t)
	d := start(t, redis.Addr(), configDir(t, map[string]string{"c.yaml": compatConfig}), nil)
	if code, body := httpGet(t, d, "/healthcheck"); code != 200 || body != "OK" {
		t.Fatalf("GET /healthcheck: %d %q, want 200 OK", code, body)
	}
	hc := healthpb.NewHealthClient(d.conn)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, name := range []string{"ratelimit", "", "envoy.service.ratelimit.v3.RateLimitService"} {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: name})
		if err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("gRPC health %q: %v %v", name, r, err)
		}
	}
	// From the start of a shutdown, both say so.
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: "ratelimit"})
	must(t, err)
	if r, err := w.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watch: %v %v", r, err)
	}
	addr := d.srv.HTTPAddr()
	done := make(chan error, 1)
	go func() { done <- d.stop() }()
	if r, err := w.Recv(); err != nil || r.Status == healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("gRPC health of a draining daemon: %v %v", r, err)
	}
	if resp, err := http.Get("http://" + addr + "/healthcheck"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatalf("GET /healthcheck while draining: %s", resp.Status)
		}
	}
	must(t, <-done)
}

// TestResponseHeadersOnlyWhenAsked: RateLimit-* headers come with
// --response-headers only, also on OVER_LIMIT answers and in global shadow
// mode; LIMIT_*_HEADER rename them.
func TestResponseHeadersOnlyWhenAsked(t *testing.T) {
	redis := redistest.Standalone(t)
	dir := configDir(t, map[string]string{"c.yaml": compatConfig})
	for _, shadow := range []bool{false, true} {
		d := start(t, redis.Addr(), dir, func(o *server.Options) { o.ShadowMode = shadow; o.Prefix = uniq("hdr") })
		req := rq("compat", desc("hour", "a"))
		for i := 0; i < 3; i++ {
			if r := d.call(t, req); len(r.ResponseHeadersToAdd) != 0 {
				t.Fatalf("shadow %v, call %d (%s): headers %v without --response-headers", shadow, i, codes(r), r.ResponseHeadersToAdd)
			}
		}
		code, _, hdr := httpPost(t, d, "/json", `{"domain":"compat","descriptors":[{"entries":[{"key":"hour","value":"a"}]}]}`)
		if hdr.Get("RateLimit-Limit") != "" || (code == 200) == !shadow {
			t.Fatalf("shadow %v: HTTP %d, headers %v", shadow, code, hdr)
		}
	}
	d := start(t, redis.Addr(), dir, func(o *server.Options) {
		o.ResponseHeaders, o.Prefix = true, uniq("hdr")
		o.Compat.HeaderLimit, o.Compat.HeaderRemaining, o.Compat.HeaderReset = "A-Ratelimit-Limit", "A-Ratelimit-Remaining", "A-Ratelimit-Reset"
	})
	req := rq("compat", desc("hour", "a"), desc("nothing", "x"))
	d.call(t, req)
	d.call(t, req)
	r := d.call(t, req)
	h := map[string]string{}
	for _, kv := range r.ResponseHeadersToAdd {
		h[kv.Key] = kv.Value
	}
	if codes(r) != "OVER_LIMIT:OVER_LIMIT,OK" || h["A-Ratelimit-Limit"] != "2" || h["A-Ratelimit-Remaining"] != "0" || h["A-Ratelimit-Reset"] == "" || len(h) != 3 {
		t.Fatalf("%s with headers %v", codes(r), h)
	}
}

// TestCheckWithoutCounting is the token-quota pattern of
// envoyproxy/ratelimit's examples: the request path checks with
// hits_addend 0, the response path debits 1. ratelimitd admits the limit
// exactly (the 3rd request of a limit of 2 is denied); envoyproxy/ratelimit,
// whose check passes at a count equal to the limit, admits one more. With
// --key-layout envoy and mode exact, ratelimitd counts its way (TestEnvoyKeys).
func TestCheckWithoutCounting(t *testing.T) {
	redis := redistest.Standalone(t)
	dir := configDir(t, map[string]string{"c.yaml": compatConfig})
	for _, exact := range []bool{false, true} {
		inOneWindow(t, time.Minute, 5*time.Second, func(s *soft, sfx string) {
			d := start(t, redis.Addr(), dir, func(o *server.Options) {
				o.Prefix = "chk-" + sfx
				if exact {
					o.Defaults.Mode = config.Exact
				}
			})
			check := rq("compat", withHits(desc("service", "service_2"), 0))
			debit := rq("compat", withHits(desc("service", "service_2"), 1))
			for i := 1; i <= 2; i++ {
				r := d.call(t, check)
				s.expect("check "+uitoa(uint64(i)), codes(r), "OK:OK")
				s.expect("check counts nothing", r.Statuses[0].LimitRemaining, uint32(3-i))
				d.call(t, debit)
			}
			s.expect("the 3rd request's check", codes(d.call(t, check)), "OVER_LIMIT:OVER_LIMIT")
		})
	}
}

// TestDynamicMetadata is RESPONSE_DYNAMIC_METADATA: the domain, the
// descriptors, and the metadata of the descriptors that passed, merged,
// the first value of a field winning.
func TestDynamicMetadata(t *testing.T) {
	redis := redistest.Standalone(t)
	dir := configDir(t, map[string]string{"c.yaml": compatConfig})
	d := start(t, redis.Addr(), dir, func(o *server.Options) {
		o.Compat.ResponseDynamicMetadata, o.Compat.QuotaMode, o.Prefix = true, true, uniq("md")
	})
	req := rq("compat", desc("service", "service_1"), withHits(desc("service", "service_2"), 1))
	req.HitsAddend = 1
	r := d.call(t, req)
	md := r.DynamicMetadata.GetFields()
	m := md["metadata"].GetStructValue().GetFields()
	if md["domain"].GetStringValue() != "compat" || md["hitsAddend"].GetNumberValue() != 1 ||
		m["name"].GetStringValue() != "service_1" || m["quota"].GetStructValue().GetFields()["tier"].GetStringValue() != "gold" ||
		m["quota"].GetStructValue().GetFields()["region"].GetStringValue() != "eu" {
		t.Fatalf("dynamic metadata %v", r.DynamicMetadata)
	}
	ds := md["descriptors"].GetListValue().GetValues()
	if len(ds) != 2 || ds[0].GetStructValue().GetFields()["entries"].GetListValue().GetValues()[0].GetStringValue() != "service=service_1" ||
		ds[1].GetStructValue().GetFields()["hitsAddend"].GetNumberValue() != 1 {
		t.Fatalf("descriptors %v", ds)
	}
	// service_1 (1/min) is now over: only service_2's metadata passes, and
	// under QUOTA_MODE the request is OK while one quota descriptor is.
	r = d.call(t, req)
	m = r.DynamicMetadata.GetFields()["metadata"].GetStructValue().GetFields()
	if codes(r) != "OK:OVER_LIMIT,OK" || m["name"].GetStringValue() != "service_2" {
		t.Fatalf("%s, metadata %v", codes(r), m)
	}
	if r := d.call(t, req); codes(r) != "OVER_LIMIT:OVER_LIMIT,OVER_LIMIT" || r.DynamicMetadata.GetFields()["metadata"] != nil {
		t.Fatalf("all over under QUOTA_MODE: %s, %v", codes(r), r.DynamicMetadata)
	}
	// An unknown domain has its dynamic metadata too.
	if r := d.call(t, rq("elsewhere", desc("a", "b"))); r.DynamicMetadata.GetFields()["domain"].GetStringValue() != "elsewhere" {
		t.Fatalf("unknown domain: %v", r.DynamicMetadata)
	}
}

// TestStopIncrementWhenOverLimit is the second part of envoyproxy/ratelimit's
// basic integration test with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: once
// one descriptor of a request is over, the others count nothing either, in
// ratelimitd's counting (strict and exact) and in the peer's keys.
func TestStopIncrementWhenOverLimit(t *testing.T) {
	redis := redistest.Standalone(t)
	dir := configDir(t, map[string]string{"c.yaml": `
domain: another
descriptors:
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 10}
`})
	for _, mode := range []string{"strict", "exact", "envoy"} {
		inOneWindow(t, time.Minute, 10*time.Second, func(s *soft, sfx string) {
			d := start(t, redis.Addr(), dir, func(o *server.Options) {
				o.Prefix, o.Compat.CacheKeyPrefix = "stop-"+sfx, "stop-"+sfx+"_"
				o.Compat.StopIncrementWhenOverLimit = true
				if mode != "strict" {
					o.Defaults.Mode = config.Exact
				}
				o.Compat.EnvoyKeys = mode == "envoy"
			})
			req := rq("another", desc("key2", sfx), desc("key3", sfx))
			for i := 0; i < 15; i++ {
				r := d.call(t, req)
				want, rem1, rem2 := "OK:OK,OK", uint32(20-(i+1)), uint32(10-(i+1))
				if i >= 10 {
					want, rem1, rem2 = "OVER_LIMIT:OK,OVER_LIMIT", 10, 0
				}
				s.expect(mode+" call "+uitoa(uint64(i)), codes(r), want)
				s.expect(mode+" key2 remaining "+uitoa(uint64(i)), r.Statuses[0].LimitRemaining, rem1)
				s.expect(mode+" key3 remaining "+uitoa(uint64(i)), r.Statuses[1].LimitRemaining, rem2)
			}
		})
	}
}

// TestLargeLimits: requests_per_unit x unit above 2^53 us starts and
// counts (1,000,000 a day; 4,294,967,295 a year), as envoyproxy/ratelimit
// takes any uint32: in the rules' own mode (strict, the hybrid limiter),
// without a warning.
func TestLargeLimits(t *testing.T) {
	redis := redistest.Standalone(t)
	d := start(t, redis.Addr(), configDir(t, map[string]string{"c.yaml": compatConfig}), func(o *server.Options) { o.Prefix = uniq("big") })
	if strings.Contains(d.logs.String(), "configuration warning") {
		t.Errorf("a warning about a large limit:\n%s", d.logs.String())
	}
	r := d.call(t, rq("compat", desc("day", "a"), desc("year", "a")))
	if codes(r) != "OK:OK,OK" || r.Statuses[0].LimitRemaining != 999_999 || r.Statuses[1].LimitRemaining != 4_294_967_294 {
		t.Fatalf("%s %v", codes(r), r.Statuses)
	}
	req := rq("compat", withHits(desc("day", "a"), 999_999))
	if r := d.call(t, req); codes(r) != "OK:OK" || r.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("the rest of the day: %s %v", codes(r), r.Statuses)
	}
	if r := d.call(t, rq("compat", desc("day", "a"))); codes(r) != "OVER_LIMIT:OVER_LIMIT" {
		t.Fatalf("over a day's 1,000,000: %s", codes(r))
	}
	// counted by the hybrid limiters of their mode (keys tracked in memory)
	fams := scrape(t, d)
	for _, name := range []string{"strict fixed_window 1000000/86400s local", "strict fixed_window 4294967295/31536000s local"} {
		if v, found := metric(fams, "ratelimit_keys_tracked", "limiter", name); !found || v < 1 {
			t.Errorf("no hybrid limiter %q tracking the key: %v %v", name, v, found)
		}
	}
}

// TestOverrideMetricLabel: a request's limit override is measured under
// envoyproxy/ratelimit's statistics key (key_value.key_value), and
// unlimited descriptors are not measured.
func TestOverrideMetricLabel(t *testing.T) {
	redis := redistest.Standalone(t)
	d := start(t, redis.Addr(), configDir(t, map[string]string{"c.yaml": compatConfig}), func(o *server.Options) { o.Prefix = uniq("ovr") })
	o := desc("key1", "value1", "subkey1", "something")
	o.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 10, Unit: typev3.RateLimitUnit_DAY}
	d.call(t, rq("compat", o, desc("free", "x")))
	fams := scrape(t, d)
	if v, _ := metric(fams, "ratelimit_decisions_total", "domain", "compat", "rule", "key1_value1.subkey1_something", "result", "ok"); v != 1 {
		t.Fatalf("override label: %v", v)
	}
	if v, found := metric(fams, "ratelimit_decisions_total", "domain", "compat", "rule", "free", "result", "unlimited"); found {
		t.Fatalf("an unlimited descriptor measured: %v", v)
	}
}
