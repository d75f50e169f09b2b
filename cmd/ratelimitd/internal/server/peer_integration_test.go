package server_test

// envoyproxy/ratelimit's integration tests (test/integration) and its
// end-to-end scripts (integration-test/scripts, which call Envoy in front
// of it), read at f2fb157, written again in our own words. The scripts'
// requests are sent as the descriptors Envoy's route configuration of
// that test (examples/envoy/proxy.yaml) makes of them.

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/server"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// The configuration directory of the peer's integration tests.
var peerIntegrationConfigs = map[string]string{
	"basic.yaml": `
domain: basic
descriptors:
  - {key: key1, rate_limit: {unit: second, requests_per_unit: 50}}
  - {key: one_per_minute, rate_limit: {unit: minute, requests_per_unit: 1}}
`,
	"another.yaml": `
domain: another
descriptors:
  - {key: key2, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: key3, rate_limit: {unit: hour, requests_per_unit: 10}}
  - {key: key4, rate_limit: {unit: day, requests_per_unit: 20}}
`,
	"share_threshold.yaml": `
domain: share-threshold-test
descriptors:
  - {key: files, value: files/*, share_threshold: true, rate_limit: {unit: hour, requests_per_unit: 10}}
  - {key: files_no_share, value: files_no_share/*, rate_limit: {unit: hour, requests_per_unit: 10}}
`,
}

const peerReloadConfig = `
domain: reload
descriptors:
  - {key: key1, rate_limit: {unit: second, requests_per_unit: 50}}
  - {key: block, rate_limit: {unit: second, requests_per_unit: 0}}
  - {key: one_per_minute, rate_limit: {unit: minute, requests_per_unit: 1}}
`

func statusOf(st *pb.RateLimitResponse_DescriptorStatus) string {
	return st.Code.String() + " " + limitOf(st) + " " + uitoa(uint64(st.LimitRemaining))
}

// basicFlow is the peer's testBasicBaseConfig, less its statsd and local
// cache counters: an unknown domain, a first hit, going over a minute
// limit, two descriptors of one request, and a reset that counts down
// (with durations).
func basicFlow(t *testing.T, d *daemon, stop, durations bool) {
	t.Helper()
	r := d.call(t, rq("foo", desc("hello", "world")))
	if codes(r) != "OK:OK" || r.Statuses[0].CurrentLimit != nil {
		t.Fatalf("unknown domain: %v", r)
	}
	if r := d.call(t, rq("basic", desc("key1", "foo"))); statusOf(r.Statuses[0]) != "OK SECOND:50 49" {
		t.Fatalf("first hit: %s", statusOf(r.Statuses[0]))
	}
	inOneWindow(t, time.Minute, 10*time.Second, func(s *soft, sfx string) {
		v := strconv.Itoa(rand.Int()) + sfx
		for i := 0; i < 25; i++ {
			r := d.call(t, rq("another", desc("key2", v)))
			want := "OK MINUTE:20 " + strconv.Itoa(20-(i+1))
			if i >= 20 {
				want = "OVER_LIMIT MINUTE:20 0"
			}
			s.expect("key2 call "+strconv.Itoa(i), statusOf(r.Statuses[0]), want)
		}
		v = strconv.Itoa(rand.Int()) + sfx
		for i := 0; i < 15; i++ {
			r := d.call(t, rq("another", desc("key2", v), desc("key3", v)))
			rem1, rem2, code := 20-(i+1), 10-(i+1), "OK"
			if i >= 10 {
				rem2, code = 0, "OVER_LIMIT"
				if stop {
					rem1 = 10
				}
			}
			s.expect("key2+key3 call "+strconv.Itoa(i), r.OverallCode.String()+" "+statusOf(r.Statuses[0])+", "+statusOf(r.Statuses[1]),
				code+" OK MINUTE:20 "+strconv.Itoa(rem1)+", "+code+" HOUR:10 "+strconv.Itoa(rem2))
		}
	})
	if durations {
		r1 := d.call(t, rq("another", desc("key4", "durTest"+uniq(""))))
		time.Sleep(2 * time.Second)
		r2 := d.call(t, rq("another", desc("key4", "durTest"+uniq(""))))
		if r2.Statuses[0].DurationUntilReset.GetSeconds() >= r1.Statuses[0].DurationUntilReset.GetSeconds() {
			t.Fatalf("the reset does not count down: %v then %v", r1.Statuses[0].DurationUntilReset, r2.Statuses[0].DurationUntilReset)
		}
	}
}

// TestPeerIntegrationBasic is TestBasicConfig with the peer's variants that
// apply: Redis alone (its per-second Redis and local cache variants expect
// the same answers), a cache key prefix (the migration mode's keys), and
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT; each in ratelimitd's counting
// (strict, exact) and in the peer's keys.
func TestPeerIntegrationBasic(t *testing.T) {
	rs := redistest.Standalone(t)
	dir := configDir(t, peerIntegrationConfigs)
	for i, v := range []struct {
		name        string
		exact, keys bool
		stop        bool
	}{
		{"WithoutPerSecondRedis", false, false, false},
		{"exact", true, false, false},
		{"WithoutPerSecondRedisWithCachePrefix", true, true, false},
		{"WithoutPerSecondRedisWithstopCacheKeyIncrementWhenOverlimitConfig", false, false, true},
		{"stop, exact", true, false, true},
		{"stop, the peer's keys", true, true, true},
	} {
		t.Run(v.name, func(t *testing.T) {
			d := start(t, rs.Addr(), dir, func(o *server.Options) {
				o.Prefix, o.Compat.CacheKeyPrefix = uniq("pib"), uniq("prefix")+":"
				if v.exact {
					o.Defaults.Mode = config.Exact
				}
				o.Compat.EnvoyKeys, o.Compat.StopIncrementWhenOverLimit = v.keys, v.stop
			})
			basicFlow(t, d, v.stop, i == 0)
		})
	}
}

// TestPeerIntegrationRedisDeployments: TestBasicAuthConfig (a password),
// TestBasicTLSConfig (TLS and a password), ...WithClientCert, and the
// basic flow against a Redis Cluster (...WithRedisCluster) and Sentinels
// (...WithRedisSentinel; both without a password here).
func TestPeerIntegrationRedisDeployments(t *testing.T) {
	dir := configDir(t, peerIntegrationConfigs)
	t.Run("TestBasicAuthConfig", func(t *testing.T) {
		rs := redistest.Standalone(t, "--requirepass", "password123")
		d := start(t, rs.Addr(), dir, func(o *server.Options) { o.Prefix, o.RedisPassword = uniq("auth"), "password123" })
		basicFlow(t, d, false, false)
	})
	ca := redistest.NewCA(t, "redis")
	scert, skey := ca.Issue("localhost", "127.0.0.1")
	for _, clientCert := range []bool{false, true} {
		name := "TestBasicTLSConfig"
		if clientCert {
			name = "TestBasicTLSConfig/WithClientCert"
		}
		t.Run(name, func(t *testing.T) {
			rs := redistest.StandaloneTLS(t, redistest.TLSFiles{Cert: scert, Key: skey, CA: ca.Cert, AuthClients: clientCert}, "--requirepass", "password123")
			tlsOpts := server.TLSOptions{Redis: true, RedisCA: ca.Cert}
			if clientCert {
				tlsOpts.RedisCert, tlsOpts.RedisKey = ca.Issue("client")
			}
			d := start(t, rs.TLSAddr(), dir, func(o *server.Options) {
				o.Prefix, o.RedisPassword, o.TLS = uniq("tls"), "password123", tlsOpts
			})
			basicFlow(t, d, false, false)
		})
	}
	t.Run("TestBasicAuthConfigWithRedisCluster", func(t *testing.T) {
		cl, err := redistest.StartCluster()
		must(t, err)
		t.Cleanup(cl.Close)
		d := start(t, cl.Addrs()[0], dir, func(o *server.Options) { o.Prefix, o.RedisAddrs = uniq("cl"), cl.Addrs() })
		basicFlow(t, d, false, false)
	})
	t.Run("TestBasicAuthConfigWithRedisSentinel", func(t *testing.T) {
		sn, err := redistest.StartSentinel()
		must(t, err)
		t.Cleanup(sn.Close)
		d := start(t, sn.SentinelAddrs()[0], dir, func(o *server.Options) {
			o.Prefix, o.RedisAddrs, o.RedisMaster = uniq("sn"), sn.SentinelAddrs(), redistest.SentinelMaster
		})
		basicFlow(t, d, false, false)
	})
}

// TestPeerIntegrationReload is TestBasicReloadConfig: a file added to the
// directory is in force without a restart, its removal reloads again.
func TestPeerIntegrationReload(t *testing.T) {
	rs := redistest.Standalone(t)
	dir := configDir(t, peerIntegrationConfigs)
	d := start(t, rs.Addr(), dir, func(o *server.Options) { o.Prefix = uniq("rl") })
	if r := d.call(t, rq("reload", desc("block", "foo"))); codes(r) != "OK:OK" {
		t.Fatalf("before the reload: %s", codes(r))
	}
	before := reloads(t, d, "success")
	writeFile(t, filepath.Join(dir, "reload.yaml"), peerReloadConfig)
	eventually(t, 10*time.Second, "the reload", func() bool { return reloads(t, d, "success") > before })
	if r := d.call(t, rq("reload", desc("key1", "foo"))); statusOf(r.Statuses[0]) != "OK SECOND:50 49" {
		t.Fatalf("after the reload: %s", statusOf(r.Statuses[0]))
	}
	before = reloads(t, d, "success")
	must(t, os.Remove(filepath.Join(dir, "reload.yaml")))
	eventually(t, 10*time.Second, "the reload on removal", func() bool { return reloads(t, d, "success") > before })
}

// TestPeerIntegrationShareThreshold is TestShareThreshold: values matching
// a share_threshold wildcard share one count; without it, each its own.
func TestPeerIntegrationShareThreshold(t *testing.T) {
	rs := redistest.Standalone(t)
	d := start(t, rs.Addr(), configDir(t, peerIntegrationConfigs), func(o *server.Options) { o.Prefix = uniq("st") })
	for range 10 {
		d.call(t, rq("share-threshold-test", desc("files", "files/a.pdf")))
	}
	if r := d.call(t, rq("share-threshold-test", desc("files", "files/b.csv"))); codes(r)+" "+statusOf(r.Statuses[0]) != "OVER_LIMIT:OVER_LIMIT OVER_LIMIT HOUR:10 0" {
		t.Fatalf("shared: %s", statusOf(r.Statuses[0]))
	}
	for i := 0; i < 10; i++ {
		r := d.call(t, rq("share-threshold-test", desc("files_no_share", "files_no_share/"+uniq(""))))
		if statusOf(r.Statuses[0]) != "OK HOUR:10 9" {
			t.Fatalf("not shared %d: %s", i, statusOf(r.Statuses[0]))
		}
	}
}

// peerExampleConfigs are the example configurations the peer's end-to-end
// scripts run against (examples/ratelimit/config), in our words.
var peerExampleConfigs = map[string]string{
	"example.yaml": `
domain: rl
descriptors:
  - {key: category, value: account, rate_limit: {replaces: [{name: bkthomps}, {name: fake_name}], unit: minute, requests_per_unit: 4}}
  - key: source_cluster
    value: proxy
    descriptors:
      - {key: destination_cluster, value: bkthomps, rate_limit: {replaces: [{name: bkthomps}], unit: minute, requests_per_unit: 2}}
      - {key: destination_cluster, value: mock, rate_limit: {unit: minute, requests_per_unit: 1}}
      - {key: destination_cluster, value: override, rate_limit: {replaces: [{name: banned_limit}], unit: minute, requests_per_unit: 2}}
      - {key: destination_cluster, value: fake, rate_limit: {name: fake_name, unit: minute, requests_per_unit: 2}}
  - key: foo
    rate_limit: {unit: minute, requests_per_unit: 2}
    descriptors:
      - {key: bar, rate_limit: {unit: minute, requests_per_unit: 3}}
      - {key: bar, value: bkthomps, rate_limit: {name: bkthomps, unit: minute, requests_per_unit: 1}}
      - {key: bar, value: banned, rate_limit: {name: banned_limit, unit: minute, requests_per_unit: 0}}
      - {key: baz, rate_limit: {unit: second, requests_per_unit: 1}}
      - {key: baz, value: not-so-shady, rate_limit: {unit: minute, requests_per_unit: 3}}
      - {key: baz, value: shady, shadow_mode: true, rate_limit: {unit: minute, requests_per_unit: 3}}
      - {key: bay, rate_limit: {unlimited: true}}
  - {key: unspec, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 2}}
  - {key: qux, rate_limit: {unlimited: true}}
  - {key: service, value: service_1, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 1}, metadata: {service_with_quota: {name: service_1}}}
  - {key: service, value: service_2, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 2}, metadata: {service_with_quota: {name: service_2}}}
`,
	"config.yaml": `
---
domain: mongo_cps
descriptors:
  - {key: database, value: users, rate_limit: {unit: second, requests_per_unit: 500}}
  - {key: database, value: default, rate_limit: {unit: second, requests_per_unit: 500}}
`,
}

// envoyRequest is the request Envoy's example route configuration makes of
// an HTTP request with these headers to path: one descriptor per
// rate_limits entry whose headers are all present.
func envoyRequest(path string, headers map[string]string) *pb.RateLimitRequest {
	actions := map[string][][]string{
		"/twoheader":  {{"foo", "bar"}, {"foo", "baz"}},
		"/fourheader": {{"foo", "bar"}, {"source_cluster", "destination_cluster"}},
		"/fiveheader": {{"foo", "bar"}, {"source_cluster", "destination_cluster"}, {"category"}},
		"/unspec":     {{"unspec"}},
	}[path]
	req := rq("rl")
	for _, keys := range actions {
		var kv []string
		for _, k := range keys {
			v, ok := headers[k]
			if !ok {
				kv = nil
				break
			}
			kv = append(kv, k, v)
		}
		if kv != nil {
			req.Descriptors = append(req.Descriptors, desc(kv...))
		}
	}
	return req
}

func h(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// TestPeerScripts: the peer's end-to-end scripts. token-quota and
// multiservice-tokenquota differ on purpose in ratelimitd's counting (a
// check passes only while one more hit fits) and agree in the migration
// mode, which counts the peer's way (TestPeerScriptsTokenQuotaAsEnvoy).
func TestPeerScripts(t *testing.T) {
	rs := redistest.Standalone(t)
	dir := configDir(t, peerExampleConfigs)
	call := func(d *daemon, req *pb.RateLimitRequest) bool { // true: Envoy passes the request
		if len(req.Descriptors) == 0 {
			return true
		}
		return d.call(t, req).OverallCode == pb.RateLimitResponse_OK
	}
	fresh := func() *daemon {
		return start(t, rs.Addr(), dir, func(o *server.Options) { o.Prefix = uniq("scr"); o.Compat.ResponseDynamicMetadata = true })
	}
	type step struct {
		path    string
		headers map[string]string
		pass    bool
	}
	scripts := map[string][]step{
		"simple-get": {{"/twoheader", h("foo", "test", "baz", "shady"), true}},
		"trigger-ratelimit": {
			{"/twoheader", h("foo", "pelle", "baz", "not-so-shady"), true}, {"/twoheader", h("foo", "pelle", "baz", "not-so-shady"), true},
			{"/twoheader", h("foo", "pelle", "baz", "not-so-shady"), true}, {"/twoheader", h("foo", "pelle", "baz", "not-so-shady"), false},
			{"/twoheader", h("foo", "pelle", "baz", "not-so-shady"), false},
		},
		"trigger-shadow-mode-key": {
			{"/twoheader", h("foo", "pelle", "baz", "shady"), true}, {"/twoheader", h("foo", "pelle", "baz", "shady"), true},
			{"/twoheader", h("foo", "pelle", "baz", "shady"), true}, {"/twoheader", h("foo", "pelle", "baz", "shady"), true},
			{"/twoheader", h("foo", "pelle", "baz", "shady"), true}, {"/twoheader", h("foo", "pelle", "baz", "shady"), true},
		},
		"value-included-in-stats-key-when-unspecified": {
			{"/unspec", h("unspec", "unspecified_value"), true}, {"/unspec", h("unspec", "unspecified_value"), true},
			{"/unspec", h("unspec", "unspecified_value"), false},
		},
	}
	banned := h("foo", "bkthomps", "bar", "banned", "source_cluster", "proxy", "destination_cluster", "override")
	notBk := h("foo", "my_foo", "bar", "bkthomps", "source_cluster", "proxy", "destination_cluster", "not_bkthomps")
	bk := h("foo", "my_foo", "bar", "bkthomps", "source_cluster", "proxy", "destination_cluster", "bkthomps")
	five := h("foo", "my_foo", "bar", "bkthomps", "source_cluster", "proxy", "destination_cluster", "fake", "category", "account")
	foo3 := h("foo", "foo_3", "bar", "bar_3", "source_cluster", "proxy", "destination_cluster", "fake")
	scripts["replaces"] = []step{
		{"/twoheader", h("foo", "bkthomps", "bar", "banned"), false},
		{"/fourheader", h("foo", "bkthomps", "bar", "banned", "source_cluster", "proxy", "destination_cluster", "mock"), false},
		{"/fourheader", banned, true}, {"/fourheader", banned, true}, {"/fourheader", banned, false},
		{"/fourheader", bk, true}, {"/fourheader", bk, true}, {"/fourheader", bk, false},
		{"/fourheader", notBk, true}, {"/fourheader", notBk, false}, {"/fourheader", bk, false},
		{"/fiveheader", five, true}, {"/fiveheader", five, true}, {"/fiveheader", five, true}, {"/fiveheader", five, true}, {"/fiveheader", five, false},
		{"/twoheader", h("foo", "foo_2", "bar", "bkthomps"), true}, {"/twoheader", h("foo", "foo_2", "bar", "bkthomps"), false},
		{"/fourheader", foo3, true}, {"/fourheader", foo3, true}, {"/fourheader", foo3, false},
		{"/fiveheader", five, false},
	}
	for name, steps := range scripts {
		t.Run(name, func(t *testing.T) {
			inOneWindow(t, time.Minute, 10*time.Second, func(s *soft, sfx string) {
				d := fresh()
				for i, st := range steps {
					s.expect(name+" step "+strconv.Itoa(i+1), call(d, envoyRequest(st.path, st.headers)), st.pass)
				}
				if name == "value-included-in-stats-key-when-unspecified" {
					v, _ := metric(scrape(t, d), "ratelimit_decisions_total", "domain", "rl", "rule", "unspec_unspecified_value", "result", "over_limit")
					s.expect("over_limit of the detailed key", v, float64(1))
				}
			})
		})
	}
	t.Run("quota", func(t *testing.T) {
		inOneWindow(t, time.Minute, 10*time.Second, func(s *soft, sfx string) {
			d := fresh()
			req := rq("rl", desc("service", "service_1"), desc("service", "service_2"))
			s.expect("1st", call(d, req), true)
			s.expect("2nd", call(d, req), true)
			s.expect("3rd is rejected: every quota descriptor is over", call(d, req), false)
		})
	})
	t.Run("token-quota, deliberately different", func(t *testing.T) {
		inOneWindow(t, time.Minute, 10*time.Second, func(s *soft, sfx string) {
			served := tokenQuota(t, fresh(), 4)
			s.expect("served of 4 (the peer: 3; a limit of 2 here admits 2)", served, 2)
		})
	})
	t.Run("multiservice-tokenquota, deliberately different", func(t *testing.T) {
		inOneWindow(t, time.Minute, 10*time.Second, func(s *soft, sfx string) {
			served := multiserviceTokenQuota(t, fresh(), 6)
			s.expect("served by (the peer: 1,1,2,2,2,-; here each service its limit)", served, "1,2,2,-,-,-")
		})
	})
}

// TestPeerScriptsTokenQuotaAsEnvoy: in the migration mode (the peer's keys
// and counting, mode exact) the token-quota scripts get the peer's answers.
func TestPeerScriptsTokenQuotaAsEnvoy(t *testing.T) {
	rs := redistest.Standalone(t)
	dir := configDir(t, peerExampleConfigs)
	fresh := func() *daemon {
		return start(t, rs.Addr(), dir, func(o *server.Options) {
			o.Defaults.Mode = config.Exact
			o.Compat.EnvoyKeys, o.Compat.CacheKeyPrefix, o.Compat.ResponseDynamicMetadata = true, uniq("tq")+"_", true
		})
	}
	inOneWindow(t, time.Minute, 10*time.Second, func(s *soft, sfx string) {
		s.expect("token-quota: served of 4 (the 4th rejected)", tokenQuota(t, fresh(), 4), 3)
		s.expect("multiservice-tokenquota: served by", multiserviceTokenQuota(t, fresh(), 6), "1,1,2,2,2,-")
	})
}

// tokenQuota runs the token-quota script n times: a check of service_2
// (hits_addend 0) on the request path, a debit of 1 when the response
// ends; it returns how many requests were served.
func tokenQuota(t *testing.T, d *daemon, n int) int {
	served := 0
	for range n {
		if d.call(t, rq("rl", withHits(desc("service", "service_2"), 0))).OverallCode != pb.RateLimitResponse_OK {
			continue
		}
		served++
		d.call(t, rq("rl", withHits(desc("service", "service_2"), 1)))
	}
	return served
}

// multiserviceTokenQuota runs the multiservice-tokenquota script n times:
// checks of both services on the request path, routing by the dynamic
// metadata of the one that passed, a debit of the serving one at the end;
// it returns which service served each request ("-": rejected).
func multiserviceTokenQuota(t *testing.T, d *daemon, n int) string {
	out := ""
	for i := range n {
		if i > 0 {
			out += ","
		}
		r := d.call(t, rq("rl", withHits(desc("service", "service_1"), 0), withHits(desc("service", "service_2"), 0)))
		if r.OverallCode != pb.RateLimitResponse_OK {
			out += "-"
			continue
		}
		svc := r.DynamicMetadata.GetFields()["metadata"].GetStructValue().GetFields()["service_with_quota"].GetStructValue().GetFields()["name"].GetStringValue()
		if svc == "" {
			t.Fatalf("request %d passed without the metadata of a service: %v", i, r.DynamicMetadata)
		}
		out += svc[len(svc)-1:]
		d.call(t, &pb.RateLimitRequest{Domain: "rl", Descriptors: []*rlcommon.RateLimitDescriptor{withHits(desc("service", svc), 1)}})
	}
	return out
}
