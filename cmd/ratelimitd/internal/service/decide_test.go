package service

// The decision logic on the memory backend and an injected clock: no
// Redis, no sleeps. Time moves only when a test moves it.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
)

// fakeClock is a clock a test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// epoch starts every test's clock: a whole day, so every window begins there.
var epoch = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

type memSvc struct {
	*Service
	clock   *fakeClock
	backend *MemoryBackend
}

// memService returns a Service on the memory backend and a fake clock,
// with the rules of yaml in force; tweak may change its options.
func memService(t testing.TB, yaml string, tweak func(*Options)) *memSvc {
	t.Helper()
	clk := &fakeClock{t: epoch}
	mb := NewMemoryBackend(clk.Now, 2)
	o := Options{Backend: mb, Clock: clk.Now, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))}
	if tweak != nil {
		tweak(&o)
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if yaml != "" {
		apply(t, s, yaml)
	}
	return &memSvc{Service: s, clock: clk, backend: mb}
}

func apply(t testing.TB, s *Service, yaml string) {
	t.Helper()
	cfg, err := config.Parse(config.Defaults{}, config.Source{Name: "t.yaml", Data: []byte(yaml)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(cfg); err != nil {
		t.Fatal(err)
	}
}

func dsc(kv ...string) *rlcommon.RateLimitDescriptor {
	return &rlcommon.RateLimitDescriptor{Entries: entries(kv...)}
}

func req(domain string, ds ...*rlcommon.RateLimitDescriptor) *pb.RateLimitRequest {
	return &pb.RateLimitRequest{Domain: domain, Descriptors: ds}
}

// call decides r and fails the test on an error.
func (m *memSvc) call(t testing.TB, r *pb.RateLimitRequest) *pb.RateLimitResponse {
	t.Helper()
	resp, err := m.ShouldRateLimit(context.Background(), r)
	if err != nil {
		t.Fatalf("ShouldRateLimit(%v): %v", r, err)
	}
	if len(resp.Statuses) != len(r.Descriptors) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(r.Descriptors))
	}
	return resp
}

// codesOf returns the overall code and each descriptor's, with its
// remaining: "OK:OK/4,OVER_LIMIT/0".
func codesOf(r *pb.RateLimitResponse) string {
	var b strings.Builder
	b.WriteString(r.OverallCode.String() + ":")
	for i, st := range r.Statuses {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s/%d", st.Code, st.LimitRemaining)
	}
	return b.String()
}

func expect(t *testing.T, what, got, want string) {
	t.Helper()
	if got != want {
		t.Errorf("%s: got %s, want %s", what, got, want)
	}
}

const decideConfig = `
domain: d
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: q1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: q2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
  - key: never
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: big
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: exact
    rate_limit: {unit: minute, requests_per_unit: 4, mode: exact, algorithm: sliding_log}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: token_bucket}
  - key: open
    rate_limit: {unit: minute, requests_per_unit: 4, failure_mode: open}
  - key: closed
    rate_limit: {unit: minute, requests_per_unit: 4, failure_mode: closed}
  - key: local
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: old
    rate_limit: {unit: minute, requests_per_unit: 1, name: old}
  - key: new
    rate_limit: {unit: minute, requests_per_unit: 5, replaces: [{name: old}]}
  - key: api
    rate_limits:
      - {unit: second, requests_per_unit: 2, name: burst}
      - {unit: minute, requests_per_unit: 3, name: per-minute}
  - key: parent
    descriptors:
      - key: child
        rate_limit: {unit: hour, requests_per_unit: 1}
`

// Each descriptor is counted against its rule; the request is OVER_LIMIT
// when one is; the window ends when the clock says so.
func TestDecideCountsAndWindows(t *testing.T) {
	m := memService(t, decideConfig, nil)
	r := req("d", dsc("a", "x"), dsc("b", "x"), dsc("a", "y"))
	expect(t, "1st", codesOf(m.call(t, r)), "OK:OK/2,OK/1,OK/2")
	expect(t, "2nd", codesOf(m.call(t, r)), "OK:OK/1,OK/0,OK/1")
	resp := m.call(t, r)
	expect(t, "3rd: b over", codesOf(resp), "OVER_LIMIT:OK/0,OVER_LIMIT/0,OK/0")
	if got := resp.Statuses[1].DurationUntilReset.AsDuration(); got != time.Minute {
		t.Errorf("reset at the window's start: %v, want 1m", got)
	}
	m.clock.Advance(45 * time.Second)
	resp = m.call(t, r)
	expect(t, "4th: all over", codesOf(resp), "OVER_LIMIT:OVER_LIMIT/0,OVER_LIMIT/0,OVER_LIMIT/0")
	if got := resp.Statuses[0].DurationUntilReset.AsDuration(); got != 15*time.Second {
		t.Errorf("reset 45s into the window: %v, want 15s", got)
	}
	if got := resp.Statuses[0].CurrentLimit; got.GetRequestsPerUnit() != 3 || got.GetUnit() != pb.RateLimitResponse_RateLimit_MINUTE {
		t.Errorf("current_limit %v", got)
	}
	m.clock.Advance(15 * time.Second)
	expect(t, "next window", codesOf(m.call(t, r)), "OK:OK/2,OK/1,OK/2")
	// nested descriptors: the request must be as deep as the rule
	expect(t, "nested", codesOf(m.call(t, req("d", dsc("parent", "p", "child", "c")))), "OK:OK/0")
	expect(t, "nested, 2nd", codesOf(m.call(t, req("d", dsc("parent", "p", "child", "c")))), "OVER_LIMIT:OVER_LIMIT/0")
	expect(t, "shallower than the rule", codesOf(m.call(t, req("d", dsc("parent", "p")))), "OK:OK/0")
	expect(t, "deeper than the rule", codesOf(m.call(t, req("d", dsc("a", "x", "z", "z")))), "OK:OK/0")
}

// hits_addend: the descriptor's own wins over the request's; more hits
// than the limit are OVER_LIMIT without counting; exactly what is left fits.
func TestDecideHits(t *testing.T) {
	m := memService(t, decideConfig, nil)
	r := req("d", dsc("big", "x"))
	r.HitsAddend = 10
	expect(t, "request hits 10", codesOf(m.call(t, r)), "OK:OK/90")
	own := dsc("big", "x")
	own.HitsAddend = wrapperspb.UInt64(30)
	r.Descriptors = []*rlcommon.RateLimitDescriptor{own, dsc("big", "y")}
	expect(t, "own 30, request's 10", codesOf(m.call(t, r)), "OK:OK/60,OK/90")
	own.HitsAddend = wrapperspb.UInt64(101)
	resp := m.call(t, req("d", own))
	expect(t, "101 of 100: over, not counted", codesOf(resp), "OVER_LIMIT:OVER_LIMIT/0")
	if got := resp.Statuses[0].DurationUntilReset.AsDuration(); got != time.Minute {
		t.Errorf("uncounted denial's reset at the window start: %v", got)
	}
	own.HitsAddend = wrapperspb.UInt64(60)
	expect(t, "exactly what is left", codesOf(m.call(t, req("d", own))), "OK:OK/0")
	expect(t, "then nothing", codesOf(m.call(t, req("d", dsc("big", "x")))), "OVER_LIMIT:OVER_LIMIT/0")
}

// quota_mode descriptors make the request OVER_LIMIT only when all are;
// shadow_mode answers OK and counts; unlimited and requests_per_unit 0;
// replaces; a rule of several limits describes the tightest.
func TestDecideSemantics(t *testing.T) {
	m := memService(t, decideConfig, nil)
	q := req("d", dsc("q1", "x"), dsc("q2", "x"))
	expect(t, "quotas", codesOf(m.call(t, q)), "OK:OK/0,OK/1")
	expect(t, "one quota left is enough", codesOf(m.call(t, q)), "OK:OVER_LIMIT/0,OK/0")
	expect(t, "every quota over", codesOf(m.call(t, q)), "OVER_LIMIT:OVER_LIMIT/0,OVER_LIMIT/0")
	expect(t, "a rate limit over is over whatever the quotas",
		codesOf(m.call(t, req("d", dsc("q1", "y"), dsc("b", "y"), dsc("b", "y"), dsc("b", "y")))), "OVER_LIMIT:OK/0,OK/1,OK/0,OVER_LIMIT/0")

	expect(t, "shadow within", codesOf(m.call(t, req("d", dsc("shadow", "x")))), "OK:OK/0")
	expect(t, "shadow over: OK", codesOf(m.call(t, req("d", dsc("shadow", "x")))), "OK:OK/0")

	resp := m.call(t, req("d", dsc("free", "x")))
	expect(t, "unlimited", codesOf(resp), fmt.Sprintf("OK:OK/%d", uint32(math.MaxUint32)))
	resp = m.call(t, req("d", dsc("never", "x")))
	expect(t, "requests_per_unit 0", codesOf(resp), "OVER_LIMIT:OVER_LIMIT/0")
	if resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 0 {
		t.Errorf("current_limit of a rule of 0: %v", resp.Statuses[0].CurrentLimit)
	}

	expect(t, "old alone", codesOf(m.call(t, req("d", dsc("old", "x")))), "OK:OK/0")
	expect(t, "old alone, over", codesOf(m.call(t, req("d", dsc("old", "x")))), "OVER_LIMIT:OVER_LIMIT/0")
	expect(t, "old replaced by new: not evaluated", codesOf(m.call(t, req("d", dsc("old", "x"), dsc("new", "x")))), "OK:OK/0,OK/4")

	api := req("d", dsc("api", "k"))
	resp = m.call(t, api)
	expect(t, "several limits", codesOf(resp), "OK:OK/1")
	if got := resp.Statuses[0].CurrentLimit.GetName(); got != "burst" {
		t.Errorf("the tightest, burst 1 left of 2/s before per-minute 2 of 3: %q", got)
	}
	expect(t, "several limits, 2nd", codesOf(m.call(t, api)), "OK:OK/0")
	resp = m.call(t, api)
	expect(t, "several limits, 3rd: burst over", codesOf(resp), "OVER_LIMIT:OVER_LIMIT/0")
	m.clock.Advance(time.Second)
	resp = m.call(t, api)
	expect(t, "a second later: per-minute's last", codesOf(resp), "OK:OK/0")
	if got := resp.Statuses[0].CurrentLimit.GetName(); got != "per-minute" {
		t.Errorf("the tightest after the burst refilled: %q", got)
	}
	m.clock.Advance(time.Second)
	resp = m.call(t, api)
	expect(t, "per-minute over", codesOf(resp), "OVER_LIMIT:OVER_LIMIT/0")
	if got, name := resp.Statuses[0].DurationUntilReset.AsDuration(), resp.Statuses[0].CurrentLimit.GetName(); name != "per-minute" || got != 58*time.Second {
		t.Errorf("denied by per-minute: %q, reset %v, want 58s", name, got)
	}
}

// The algorithms count on the injected clock: a token bucket refills as
// it moves, a sliding log forgets what left the window.
func TestDecideAlgorithmsOnTheClock(t *testing.T) {
	m := memService(t, decideConfig, nil)
	b := req("d", dsc("bucket", "x"))
	expect(t, "bucket 1", codesOf(m.call(t, b)), "OK:OK/1")
	expect(t, "bucket 2", codesOf(m.call(t, b)), "OK:OK/0")
	expect(t, "bucket empty", codesOf(m.call(t, b)), "OVER_LIMIT:OVER_LIMIT/0")
	m.clock.Advance(500 * time.Millisecond) // one token back
	expect(t, "one token refilled", codesOf(m.call(t, b)), "OK:OK/0")
	e := req("d", dsc("exact", "x"))
	for i := range 4 {
		expect(t, "log", codesOf(m.call(t, e)), fmt.Sprintf("OK:OK/%d", 3-i))
		m.clock.Advance(10 * time.Second)
	}
	expect(t, "log full", codesOf(m.call(t, e)), "OVER_LIMIT:OVER_LIMIT/0")
	m.clock.Advance(20 * time.Second) // the first left the log
	expect(t, "log: one left the window", codesOf(m.call(t, e)), "OK:OK/0")
}

// Limit overrides: the request's limit instead of the rule's, or where no
// rule applies; each distinct override limit is a limiter, up to
// MaxOverrides.
func TestDecideOverrides(t *testing.T) {
	m := memService(t, decideConfig, func(o *Options) { o.MaxOverrides = 2 })
	od := dsc("big", "x")
	od.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_MINUTE}
	expect(t, "override", codesOf(m.call(t, req("d", od))), "OK:OK/1")
	expect(t, "override 2nd", codesOf(m.call(t, req("d", od))), "OK:OK/0")
	resp := m.call(t, req("d", od))
	expect(t, "override 3rd", codesOf(resp), "OVER_LIMIT:OVER_LIMIT/0")
	if resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 2 {
		t.Errorf("current_limit of an override: %v", resp.Statuses[0].CurrentLimit)
	}
	expect(t, "the rule's own count is untouched", codesOf(m.call(t, req("d", dsc("big", "x")))), "OK:OK/99")
	ud := dsc("unconfigured", "x")
	ud.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
	expect(t, "override without a rule", codesOf(m.call(t, req("d", ud))), "OK:OK/0")
	third := dsc("unconfigured", "x")
	third.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: typev3.RateLimitUnit_DAY}
	if _, err := m.ShouldRateLimit(context.Background(), req("d", third)); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a 3rd distinct override limit of at most 2: %v", err)
	}
}

// Response headers describe the descriptor closest to its limit, or the
// one over; global shadow mode answers OK and counts the overrides.
func TestDecideHeadersAndShadow(t *testing.T) {
	m := memService(t, decideConfig, func(o *Options) { o.ResponseHeaders = true })
	m.clock.Advance(20 * time.Second)
	resp := m.call(t, req("d", dsc("big", "x"), dsc("b", "x")))
	h := map[string]string{}
	for _, hv := range resp.ResponseHeadersToAdd {
		h[hv.Key] = hv.Value
	}
	expect(t, "headers of the closest", h[HeaderLimit]+" "+h[HeaderRemaining]+" "+h[HeaderReset], "2 1 40")

	sh := memService(t, decideConfig, func(o *Options) { o.ShadowMode = true })
	r := req("d", dsc("b", "x"))
	sh.call(t, r)
	sh.call(t, r)
	expect(t, "global shadow: over answered OK", codesOf(sh.call(t, r)), "OK:OVER_LIMIT/0")
	if got := counterValue(t, sh.Service, "ratelimit_shadow_overrides_total"); got != 1 {
		t.Errorf("shadow overrides counted: %v", got)
	}
}

// With the store down every decision follows its rule's failure mode at
// once: local admits the limit shared by the instances, open admits,
// closed denies; more hits than the local share can admit are denied
// without counting; the fallback decisions are counted.
func TestDecideFailureModes(t *testing.T) {
	m := memService(t, decideConfig, nil) // 2 instances
	m.backend.SetDown(true)
	for i := range 3 {
		expect(t, fmt.Sprintf("open %d", i), codesOf(m.call(t, req("d", dsc("open", "x"))))[:2], "OK")
		expect(t, fmt.Sprintf("closed %d", i), codesOf(m.call(t, req("d", dsc("closed", "x")))), "OVER_LIMIT:OVER_LIMIT/0")
	}
	expect(t, "local share 1", codesOf(m.call(t, req("d", dsc("local", "x")))), "OK:OK/1")
	expect(t, "local share 2", codesOf(m.call(t, req("d", dsc("local", "x")))), "OK:OK/0")
	expect(t, "local share spent", codesOf(m.call(t, req("d", dsc("local", "x")))), "OVER_LIMIT:OVER_LIMIT/0")
	three := dsc("local", "y")
	three.HitsAddend = wrapperspb.UInt64(3)
	resp := m.call(t, req("d", three))
	expect(t, "3 hits over a share of 2: denied, not an error", codesOf(resp), "OVER_LIMIT:OVER_LIMIT/0")
	if resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 4 {
		t.Errorf("the rule's limit, not the share: %v", resp.Statuses[0].CurrentLimit)
	}
	if err := m.Ready(context.Background()); err == nil {
		t.Error("Ready with the store down")
	}
	if got := counterValue(t, m.Service, "ratelimit_fallback_decisions_total"); got != 10 {
		t.Errorf("fallback decisions %v, want 10", got)
	}
	if got := gaugeValue(t, m.Service, "ratelimit_degraded"); got != 1 {
		t.Errorf("ratelimit_degraded %v", got)
	}
	m.backend.SetDown(false)
	expect(t, "back: the full limit", codesOf(m.call(t, req("d", dsc("local", "x")))), "OK:OK/3")
}

// A reload keeps the counts of the rules it keeps, drops the limiters no
// rule uses, and answers from the new rules at once.
func TestDecideReload(t *testing.T) {
	m := memService(t, decideConfig, nil)
	m.call(t, req("d", dsc("a", "x")))
	made := m.backend.Limiters()
	apply(t, m.Service, decideConfig+"  - key: c\n    rate_limit: {unit: minute, requests_per_unit: 9}\n")
	expect(t, "a kept its count", codesOf(m.call(t, req("d", dsc("a", "x")))), "OK:OK/1")
	expect(t, "c is new", codesOf(m.call(t, req("d", dsc("c", "x")))), "OK:OK/8")
	if got := m.backend.Limiters(); got != made+1 {
		t.Errorf("limiters made: %d, want %d (one for c)", got, made+1)
	}
	apply(t, m.Service, "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 3}\n")
	expect(t, "a still kept", codesOf(m.call(t, req("d", dsc("a", "x")))), "OK:OK/0")
	expect(t, "c gone", codesOf(m.call(t, req("d", dsc("c", "x")))), "OK:OK/0")
	if got := gaugeValue(t, m.Service, "ratelimit_config_rules"); got != 1 {
		t.Errorf("ratelimit_config_rules %v", got)
	}
}

// Bad requests get a clear status, never a panic.
func TestDecideBadRequests(t *testing.T) {
	empty := memService(t, "", nil)
	if _, err := empty.ShouldRateLimit(context.Background(), req("d", dsc("a", "x"))); status.Code(err) != codes.Unavailable {
		t.Errorf("before Apply: %v", err)
	}
	m := memService(t, decideConfig, nil)
	neg := dsc("a", "x")
	neg.IsNegativeHits = true
	badUnit := dsc("a", "x")
	badUnit.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit(99)}
	for _, c := range []struct {
		name string
		r    *pb.RateLimitRequest
		code codes.Code
	}{
		{"empty domain", req("", dsc("a", "x")), codes.InvalidArgument},
		{"no descriptor", req("d"), codes.InvalidArgument},
		{"negative hits", req("d", neg), codes.InvalidArgument},
		{"override of an unknown unit", req("d", badUnit), codes.InvalidArgument},
	} {
		if _, err := m.ShouldRateLimit(context.Background(), c.r); status.Code(err) != c.code {
			t.Errorf("%s: %v, want %v", c.name, err, c.code)
		}
	}
	expect(t, "no entries matches nothing", codesOf(m.call(t, req("d", dsc()))), "OK:OK/0")
	// an unknown domain is answered OK with no limit, as envoyproxy/ratelimit answers it
	expect(t, "unknown domain", codesOf(m.call(t, req("nope", dsc("a", "x"), dsc("b", "y")))), "OK:OK/0,OK/0")
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.ShouldRateLimit(context.Background(), req("d", dsc("a", "x"))); status.Code(err) != codes.Unavailable {
		t.Errorf("after Close: %v", err)
	}
}

// The metrics count each decision under its rule's label; unlimited rules
// are not measured, as envoyproxy/ratelimit records nothing for them.
func TestDecideMetrics(t *testing.T) {
	m := memService(t, decideConfig, nil)
	for range 3 {
		m.call(t, req("d", dsc("b", "x"), dsc("free", "x"), dsc("nothing", "x")))
	}
	for _, c := range []struct {
		labels []string
		want   float64
	}{
		{[]string{"domain", "d", "rule", "b", "result", "ok"}, 2},
		{[]string{"domain", "d", "rule", "b", "result", "over_limit"}, 1},
	} {
		got := vecValue(t, m.Service, "ratelimit_decisions_total", c.labels...)
		if got != c.want {
			t.Errorf("ratelimit_decisions_total%v = %v, want %v", c.labels, got, c.want)
		}
	}
	for _, name := range []string{"ratelimit_decisions_total", "ratelimit_hits_total"} {
		for _, x := range gather(t, m.Service, name) {
			for _, l := range x.Label {
				if l.GetName() == "rule" && l.GetValue() == "free" {
					t.Errorf("the unlimited rule is measured: %s %v", name, x.Label)
				}
			}
		}
	}
	if got := vecValue(t, m.Service, "ratelimit_hits_total", "domain", "d", "rule", "b"); got != 3 {
		t.Errorf("hits of b: %v", got)
	}
	if got := counterValue(t, m.Service, "ratelimit_local_decisions_total"); got != 3 {
		t.Errorf("ratelimit_local_decisions_total %v, want 3 (b's three; unlimited is not counted)", got)
	}
}

// gather returns the samples of the metric family name.
func gather(t testing.TB, s *Service, name string) []*dto.Metric {
	t.Helper()
	fams, err := s.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return f.Metric
		}
	}
	return nil
}

func counterValue(t testing.TB, s *Service, name string) float64 {
	t.Helper()
	var v float64
	for _, m := range gather(t, s, name) {
		v += m.GetCounter().GetValue()
	}
	return v
}

func gaugeValue(t testing.TB, s *Service, name string) float64 {
	t.Helper()
	v := math.Inf(-1)
	for _, m := range gather(t, s, name) {
		v = max(v, m.GetGauge().GetValue())
	}
	return v
}

// vecValue is the value of the sample of name whose labels include every
// given name, value pair; 0 when none does.
func vecValue(t testing.TB, s *Service, name string, labels ...string) float64 {
	t.Helper()
next:
	for _, m := range gather(t, s, name) {
		for i := 0; i+1 < len(labels); i += 2 {
			hit := false
			for _, l := range m.Label {
				hit = hit || l.GetName() == labels[i] && l.GetValue() == labels[i+1]
			}
			if !hit {
				continue next
			}
		}
		return m.GetCounter().GetValue()
	}
	return 0
}

// A limit override of a fixed window takes any uint32 per any unit, as a
// rule does; the other algorithms keep their bound (2^53 us).
func TestLargeOverride(t *testing.T) {
	m := memService(t, decideConfig, nil)
	d := dsc("big", "v")
	d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 4_000_000_000, Unit: typev3.RateLimitUnit_YEAR}
	expect(t, "4,000,000,000 a year", codesOf(m.call(t, req("d", d))), "OK:OK/3999999999")
	b := memService(t, decideConfig, func(o *Options) { o.Defaults.Algorithm = ratelimit.TokenBucket })
	if _, err := b.ShouldRateLimit(context.Background(), req("d", d)); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a token bucket of 4,000,000,000 a year: %v, want InvalidArgument", err)
	}
}
