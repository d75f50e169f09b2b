package server_test

// The examples of envoyproxy/ratelimit's README (its example configurations
// and the requests it describes, checked at f2fb157), written out again
// here, must get the answers that README states.

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/server"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// readmeConfigs holds each README example's configuration, one domain per
// file as envoyproxy/ratelimit loads them.
var readmeConfigs = map[string]string{
	"ex1.yaml": `
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit: {unit: second, requests_per_unit: 500}
  - key: database
    value: default
    rate_limit: {unit: second, requests_per_unit: 500}
`,
	"ex2.yaml": `
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
`,
	"ex3.yaml": `
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
`,
	"ex5.yaml": `
domain: internal
descriptors:
  - key: ldap
    rate_limit: {unlimited: true}
  - key: azure
    rate_limit: {unit: minute, requests_per_unit: 100}
`,
	"ex6.yaml": `
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit: {requests_per_unit: 10, unit: second}
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit: {requests_per_unit: 20, unit: second}
`,
	"ex7.yaml": `
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit: {name: specific_limit, requests_per_unit: 5, unit: second}
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces: [{name: specific_limit}]
          requests_per_unit: 10
          unit: second
`,
	"ex8.yaml": `
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: key1
    value: value1
    rate_limit: {unit: minute, requests_per_unit: 20}
`,
	"ex9.yaml": `
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: path
    value: /api/*/action
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: route
    value: /api/*/resource/*/action
    rate_limit: {unit: minute, requests_per_unit: 20}
`,
	"ex10.yaml": `
domain: example10
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
`,
	"ex10w.yaml": `
domain: example10_wildcard
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 100}
`,
	"ex11.yaml": `
domain: example11
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit: {unit: hour, requests_per_unit: 10}
`,
	"ex11m.yaml": `
domain: example11_metrics
descriptors:
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 60}
`,
	"json.yaml": `
domain: dummy
descriptors:
  - key: one_per_day
    rate_limit: {unit: day, requests_per_unit: 1}
`,
}

// example4 has two configurations of one domain: the request matches the
// second and not the first.
const example4NoMatch = `
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit: {requests_per_unit: 300, unit: second}
`

const example4Match = `
domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit: {requests_per_unit: 300, unit: second}
`

// fresh starts a daemon on dir with a Redis prefix of its own, so that its
// counters start at zero.
func fresh(t *testing.T, redis *redistest.Server, dir, suffix string) *daemon {
	return start(t, redis.Addr(), dir, func(o *server.Options) { o.Prefix = "t-" + suffix })
}

// drive sends req n times and returns the last response.
func drive(t *testing.T, d *daemon, req *pb.RateLimitRequest, n int) *pb.RateLimitResponse {
	t.Helper()
	var r *pb.RateLimitResponse
	for range n {
		r = d.call(t, req)
	}
	return r
}

func limitOf(st *pb.RateLimitResponse_DescriptorStatus) string {
	if st.CurrentLimit == nil {
		return "none"
	}
	return st.CurrentLimit.Unit.String() + ":" + uitoa(uint64(st.CurrentLimit.RequestsPerUnit))
}

func uitoa(n uint64) string { return strconv.FormatUint(n, 10) }

func TestReadmeExamples(t *testing.T) {
	redis := redistest.Standalone(t)
	dir := configDir(t, readmeConfigs)

	t.Run("1 simple", func(t *testing.T) {
		inOneWindow(t, time.Second, 900*time.Millisecond, func(s *soft, sfx string) {
			d := fresh(t, redis, dir, sfx)
			users := rq("mongo_cps", desc("database", "users"))
			r := d.call(t, rq("mongo_cps", withHits(desc("database", "users"), 499)))
			s.expect("499 hits of 500", codes(r), "OK:OK")
			s.expect("remaining after 499", r.Statuses[0].LimitRemaining, uint32(1))
			s.expect("limit", limitOf(r.Statuses[0]), "SECOND:500")
			r = d.call(t, users)
			s.expect("500th", codes(r), "OK:OK")
			s.expect("remaining after 500", r.Statuses[0].LimitRemaining, uint32(0))
			s.expect("501st", codes(d.call(t, users)), "OVER_LIMIT:OVER_LIMIT")
			r = d.call(t, rq("mongo_cps", desc("database", "default")))
			s.expect("default has its own 500", codes(r)+" "+uitoa(uint64(r.Statuses[0].LimitRemaining)), "OK:OK 499")
			r = d.call(t, rq("mongo_cps", desc("database", "other")))
			s.expect("no rule for other databases", codes(r)+" "+limitOf(r.Statuses[0]), "OK:OK none")
		})
	})

	t.Run("2 nested and several descriptors", func(t *testing.T) {
		inOneWindow(t, 24*time.Hour, 30*time.Second, func(s *soft, sfx string) {
			d := fresh(t, redis, dir, sfx)
			both := rq("messaging", desc("message_type", "marketing", "to_number", "2061111111"), desc("to_number", "2061111111"))
			for i := range 5 {
				r := d.call(t, both)
				s.expect("marketing message within 5", codes(r), "OK:OK,OK")
				s.expect("marketing remaining", r.Statuses[0].LimitRemaining, uint32(4-i))
				s.expect("per-number remaining", r.Statuses[1].LimitRemaining, uint32(99-i))
			}
			r := d.call(t, both)
			s.expect("6th marketing message: the whole request is over", codes(r), "OVER_LIMIT:OVER_LIMIT,OK")
			s.expect("limits", limitOf(r.Statuses[0])+" "+limitOf(r.Statuses[1]), "DAY:5 DAY:100")
			r = d.call(t, rq("messaging", desc("message_type", "marketing", "to_number", "2062222222")))
			s.expect("another number has its own 5", codes(r)+" "+uitoa(uint64(r.Statuses[0].LimitRemaining)), "OK:OK 4")
			r = d.call(t, rq("messaging", desc("to_number", "2061111111")))
			s.expect("the 100 a day of one number counted all 6", codes(r)+" "+uitoa(uint64(r.Statuses[0].LimitRemaining)), "OK:OK 93")
		})
	})

	t.Run("3 value before key", func(t *testing.T) {
		inOneWindow(t, time.Second, 900*time.Millisecond, func(s *soft, sfx string) {
			d := fresh(t, redis, dir, sfx)
			ip := rq("edge_proxy_per_ip", desc("remote_address", "50.0.0.1"))
			s.expect("10 per second per IP", codes(drive(t, d, ip, 10)), "OK:OK")
			s.expect("11th", codes(d.call(t, ip)), "OVER_LIMIT:OVER_LIMIT")
			r := d.call(t, rq("edge_proxy_per_ip", desc("remote_address", "50.0.0.5")))
			s.expect("the black-listed IP, first request", codes(r)+" "+limitOf(r.Statuses[0]), "OVER_LIMIT:OVER_LIMIT SECOND:0")
			s.expect("another IP has its own 10", codes(d.call(t, rq("edge_proxy_per_ip", desc("remote_address", "50.0.0.2")))), "OK:OK")
		})
	})

	t.Run("4 depth must match", func(t *testing.T) {
		req := rq("example4", desc("key", "value", "subkey", "subvalue"))
		a := start(t, redis.Addr(), configDir(t, map[string]string{"a.yaml": example4NoMatch}), nil)
		r := a.call(t, req)
		if codes(r) != "OK:OK" || r.Statuses[0].CurrentLimit != nil {
			t.Fatalf("a two-entry request matched a one-level rule: %v", r)
		}
		b := start(t, redis.Addr(), configDir(t, map[string]string{"b.yaml": example4Match}), func(o *server.Options) { o.Prefix = uniq("ex4") })
		r = b.call(t, req)
		if codes(r) != "OK:OK" || limitOf(r.Statuses[0]) != "SECOND:300" {
			t.Fatalf("the two-level rule did not match: %v", r)
		}
	})

	t.Run("5 unlimited", func(t *testing.T) {
		inOneWindow(t, time.Minute, 5*time.Second, func(s *soft, sfx string) {
			d := fresh(t, redis, dir, sfx)
			r := drive(t, d, rq("internal", desc("ldap", "x")), 50)
			s.expect("ldap", codes(r), "OK:OK")
			s.expect("ldap remaining", r.Statuses[0].LimitRemaining, uint32(math.MaxUint32))
			s.expect("ldap has no limit", limitOf(r.Statuses[0]), "none")
			r = d.call(t, rq("internal", desc("azure", "x")))
			s.expect("azure", codes(r)+" "+limitOf(r.Statuses[0])+" "+uitoa(uint64(r.Statuses[0].LimitRemaining)), "OK:OK MINUTE:100 99")
		})
	})

	t.Run("6 shadow mode", func(t *testing.T) {
		inOneWindow(t, time.Second, 900*time.Millisecond, func(s *soft, sfx string) {
			d := fresh(t, redis, dir, sfx)
			a := rq("example6", desc("service", "auth-service", "user", "user-a"))
			for i := range 15 {
				s.expect("user-a is never limited, request "+uitoa(uint64(i)), codes(d.call(t, a)), "OK:OK")
			}
			fams := scrape(t, d)
			v, _ := metric(fams, "ratelimit_decisions_total", "domain", "example6", "rule", "service.user_user-a", "result", "shadow_over_limit")
			s.expect("user-a's breaches counted", v, 5.0)
			b := rq("example6", desc("service", "auth-service", "user", "user-b"))
			s.expect("user-b's 20", codes(drive(t, d, b, 20)), "OK:OK")
			s.expect("user-b's 21st", codes(d.call(t, b)), "OVER_LIMIT:OVER_LIMIT")
		})
	})

	t.Run("7 replaces", func(t *testing.T) {
		inOneWindow(t, time.Second, 900*time.Millisecond, func(s *soft, sfx string) {
			d := fresh(t, redis, dir, sfx)
			both := rq("example7", desc("key_1", "value_1", "user", "bkthomps"), desc("key_2", "value_2", "user", "bkthomps"))
			for range 10 {
				r := d.call(t, both)
				s.expect("both: 10 per second", codes(r), "OK:OK,OK")
				s.expect("the replaced rule is not evaluated", limitOf(r.Statuses[0]), "none")
			}
			s.expect("both, 11th", codes(d.call(t, both)), "OVER_LIMIT:OK,OVER_LIMIT")
			one := rq("example7", desc("key_1", "value_1", "user", "bkthomps"))
			s.expect("the replaced rule's 5 are untouched", codes(drive(t, d, one, 5)), "OK:OK")
			s.expect("its 6th", codes(d.call(t, one)), "OVER_LIMIT:OVER_LIMIT")
		})
	})

	t.Run("8 detailed metric", func(t *testing.T) {
		inOneWindow(t, time.Minute, 5*time.Second, func(s *soft, sfx string) {
			d := fresh(t, redis, dir, sfx)
			for _, v := range []string{"unspecified_value", "unspecified_value2"} {
				req := rq("example8", desc("key1", v))
				s.expect(v+": 10 a minute", codes(drive(t, d, req, 10)), "OK:OK")
				s.expect(v+": 11th", codes(d.call(t, req)), "OVER_LIMIT:OVER_LIMIT")
			}
			s.expect("value1: 20 a minute", codes(drive(t, d, rq("example8", desc("key1", "value1")), 20)), "OK:OK")
			fams := scrape(t, d)
			for _, label := range []string{"key1_unspecified_value", "key1_unspecified_value2"} {
				v, _ := metric(fams, "ratelimit_decisions_total", "domain", "example8", "rule", label, "result", "ok")
				s.expect("decisions of "+label, v, 10.0)
			}
			v, _ := metric(fams, "ratelimit_decisions_total", "domain", "example8", "rule", "key1_value1", "result", "ok")
			s.expect("decisions of key1_value1", v, 20.0)
			_, rolled := metric(fams, "ratelimit_decisions_total", "domain", "example8", "rule", "key1", "result", "ok")
			s.expect("no rolled-up key1 series with detailed_metric", rolled, false)
		})
	})

	t.Run("9 wildcards", func(t *testing.T) {
		inOneWindow(t, time.Minute, 5*time.Second, func(s *soft, sfx string) {
			d := fresh(t, redis, dir, sfx)
			for _, v := range []string{"value1", "value2", "valueXYZ"} {
				req := rq("example9", desc("key1", v))
				s.expect(v+": its own 20", codes(drive(t, d, req, 20)), "OK:OK")
				s.expect(v+": 21st", codes(d.call(t, req)), "OVER_LIMIT:OVER_LIMIT")
			}
			for _, v := range []string{"/api/123/action", "/api/user-id/action"} {
				r := d.call(t, rq("example9", desc("path", v)))
				s.expect(v, codes(r)+" "+limitOf(r.Statuses[0]), "OK:OK MINUTE:20")
			}
			r := d.call(t, rq("example9", desc("path", "/api/123/other")))
			s.expect("/api/123/other does not match", limitOf(r.Statuses[0]), "none")
			for _, v := range []string{"/api/v1/resource/123/action", "/api/v2/resource/456/action"} {
				r := d.call(t, rq("example9", desc("route", v)))
				s.expect(v, codes(r)+" "+limitOf(r.Statuses[0]), "OK:OK MINUTE:20")
			}
		})
	})

	t.Run("10 value to metric", func(t *testing.T) {
		inOneWindow(t, time.Minute, 5*time.Second, func(s *soft, sfx string) {
			d := fresh(t, redis, dir, sfx)
			d.call(t, rq("example10", desc("route", "api", "http_method", "GET", "subject_id", "123")))
			d.call(t, rq("example10", desc("route", "web", "http_method", "POST", "subject_id", "456")))
			d.call(t, rq("example10_wildcard", desc("user", "alice", "action", "readfile", "resource", "documents")))
			fams := scrape(t, d)
			for _, c := range [][2]string{
				{"example10", "route_api.http_method_GET.subject_id"},
				{"example10", "route_web.http_method_POST.subject_id"},
				{"example10_wildcard", "user_alice.action_readfile.resource"},
			} {
				v, _ := metric(fams, "ratelimit_decisions_total", "domain", c[0], "rule", c[1], "result", "ok")
				s.expect("decisions of "+c[1], v, 1.0)
			}
			req := rq("example10", desc("route", "api", "http_method", "GET", "subject_id", "123"))
			s.expect("60 a minute", codes(drive(t, d, req, 59)), "OK:OK")
			s.expect("61st", codes(d.call(t, req)), "OVER_LIMIT:OVER_LIMIT")
		})
	})

	t.Run("11 share threshold", func(t *testing.T) {
		inOneWindow(t, time.Hour, 10*time.Second, func(s *soft, sfx string) {
			d := fresh(t, redis, dir, sfx)
			s.expect("files/a.pdf x5", codes(drive(t, d, rq("example11", desc("files", "files/a.pdf")), 5)), "OK:OK")
			s.expect("files/b.csv x5", codes(drive(t, d, rq("example11", desc("files", "files/b.csv")), 5)), "OK:OK")
			s.expect("files/c.txt shares the exhausted 10", codes(d.call(t, rq("example11", desc("files", "files/c.txt")))), "OVER_LIMIT:OVER_LIMIT")
			a := rq("example11", desc("files_no_share", "files_no_share/a.pdf"))
			s.expect("files_no_share/a.pdf x10", codes(drive(t, d, a, 10)), "OK:OK")
			s.expect("its 11th", codes(d.call(t, a)), "OVER_LIMIT:OVER_LIMIT")
			b := rq("example11", desc("files_no_share", "files_no_share/b.csv"))
			s.expect("files_no_share/b.csv has its own 10", codes(drive(t, d, b, 10)), "OK:OK")
		})
		inOneWindow(t, time.Minute, 5*time.Second, func(s *soft, sfx string) {
			d := fresh(t, redis, dir, sfx)
			v1 := rq("example11_metrics", withHits(desc("route", "api/v1", "method", "GET"), 30))
			v2 := rq("example11_metrics", withHits(desc("route", "api/v2", "method", "GET"), 30))
			s.expect("api/v1 takes 30 of 60", codes(d.call(t, v1)), "OK:OK")
			s.expect("api/v2 takes the other 30", codes(d.call(t, v2)), "OK:OK")
			s.expect("api/v3 finds none left", codes(d.call(t, rq("example11_metrics", desc("route", "api/v3", "method", "GET")))), "OVER_LIMIT:OVER_LIMIT")
		})
	})

	t.Run("json endpoint", func(t *testing.T) {
		inOneWindow(t, 24*time.Hour, 30*time.Second, func(s *soft, sfx string) {
			d := fresh(t, redis, dir, sfx)
			body := `{"domain": "dummy", "descriptors": [{"entries": [{"key": "one_per_day", "value": "something"}]}]}`
			for _, path := range []string{"/v1/check", "/json"} {
				code, out, _ := httpPost(t, d, path, body)
				want := http.StatusOK
				if path == "/json" {
					want = http.StatusTooManyRequests
				}
				s.expect(path+" status", code, want)
				if want == http.StatusTooManyRequests {
					for _, frag := range []string{`"overallCode":"OVER_LIMIT"`, `"code":"OVER_LIMIT"`, `"currentLimit":{"requestsPerUnit":1,"unit":"DAY"}`} {
						s.expect(path+" body holds "+frag, strings.Contains(strings.ReplaceAll(out, " ", ""), frag), true)
					}
				} else {
					s.expect(path+" body", strings.Contains(strings.ReplaceAll(out, " ", ""), `"overallCode":"OK"`), true)
				}
			}
		})
	})
}

// exampleDemo is the configuration of envoyproxy/ratelimit's docker-compose
// demo (examples/ratelimit/config/example.yaml), the rules its README's
// curl requests exercise; the descriptors below are what the demo's Envoy
// (examples/envoy/proxy.yaml) sends for each request.
const exampleDemo = `
domain: rl
descriptors:
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: mock
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: foo
    rate_limit: {unit: minute, requests_per_unit: 2}
    descriptors:
      - key: bar
        rate_limit: {unit: minute, requests_per_unit: 3}
      - key: bar
        value: banned
        rate_limit: {name: banned_limit, unit: minute, requests_per_unit: 0}
      - key: baz
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: baz
        value: not-so-shady
        rate_limit: {unit: minute, requests_per_unit: 3}
      - key: baz
        value: shady
        rate_limit: {unit: minute, requests_per_unit: 3}
        shadow_mode: true
`

func TestReadmeDemo(t *testing.T) {
	redis := redistest.Standalone(t)
	dir := configDir(t, map[string]string{"example.yaml": exampleDemo})
	inOneWindow(t, time.Minute, 5*time.Second, func(s *soft, sfx string) {
		d := fresh(t, redis, dir, sfx)
		test := rq("rl", desc("source_cluster", "proxy", "destination_cluster", "mock"))
		s.expect("curl /test", codes(d.call(t, test)), "OK:OK")
		s.expect("curl /test again: 1 a minute", codes(d.call(t, test)), "OVER_LIMIT:OVER_LIMIT")
		header := rq("rl", desc("foo", "foo"))
		s.expect("curl /header -H foo", codes(drive(t, d, header, 2)), "OK:OK")
		s.expect("curl /header -H foo, 3rd", codes(d.call(t, header)), "OVER_LIMIT:OVER_LIMIT")
		two := rq("rl", desc("foo", "foo", "bar", "bar"))
		s.expect("curl /twoheader -H foo -H bar", codes(drive(t, d, two, 3)), "OK:OK")
		s.expect("curl /twoheader -H foo -H bar, 4th", codes(d.call(t, two)), "OVER_LIMIT:OVER_LIMIT")
		banned := rq("rl", desc("foo", "foo", "bar", "banned"))
		s.expect("curl /twoheader -H bar: banned", codes(d.call(t, banned)), "OVER_LIMIT:OVER_LIMIT")
		shady := rq("rl", desc("foo", "foo", "baz", "shady"))
		s.expect("curl /twoheader -H baz: shady is never limited", codes(drive(t, d, shady, 6)), "OK:OK")
		notShady := rq("rl", desc("foo", "foo", "baz", "not-so-shady"))
		s.expect("curl /twoheader -H baz: not-so-shady", codes(drive(t, d, notShady, 3)), "OK:OK")
		s.expect("curl /twoheader -H baz: not-so-shady, 4th", codes(d.call(t, notShady)), "OVER_LIMIT:OVER_LIMIT")
	})
	inOneWindow(t, time.Second, 900*time.Millisecond, func(s *soft, sfx string) {
		d := fresh(t, redis, dir, sfx)
		baz := rq("rl", desc("foo", "foo", "baz", "baz"))
		s.expect("curl /twoheader -H baz: baz", codes(d.call(t, baz)), "OK:OK")
		s.expect("curl /twoheader -H baz: baz again: rate limited", codes(d.call(t, baz)), "OVER_LIMIT:OVER_LIMIT")
	})
}
