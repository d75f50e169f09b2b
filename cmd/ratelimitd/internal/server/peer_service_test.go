package server_test

// envoyproxy/ratelimit's service and cache test cases (test/service,
// test/redis and test/limiter, read at f2fb157), written again in our own
// words as black-box tests of a running ratelimitd: where the peer's tests
// hand its service the statuses of a mocked cache, these drive real counts
// in Redis to the same statuses and expect the peer's answer. Its cache
// tests, which assert Redis keys and counts, run in the migration mode
// (--key-layout envoy), the one that writes the peer's keys.

import (
	"context"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/server"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// peerServiceConfig gives each descriptor of the peer's service tests a
// rule: foo and regular 10 (and 5) a minute, quota ones in quota_mode,
// shadow ones in shadow_mode, baz unlimited, hello none.
const peerServiceConfig = `
domain: different-domain
descriptors:
  - {key: foo, rate_limit: {name: key_name, unit: minute, requests_per_unit: 10}}
  - {key: shadow1, shadow_mode: true, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: shadow2, shadow_mode: true, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: baz, rate_limit: {unlimited: true}}
---
`

const peerQuotaConfig = `
domain: quota-domain
descriptors:
  - {key: regular, rate_limit: {unit: minute, requests_per_unit: 5}, metadata: {name: service_1}}
  - {key: quota, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 3}, metadata: {name: service_2}}
  - {key: quota1, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 5}}
  - {key: quota2, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 3}}
  - {key: plain1, rate_limit: {unit: minute, requests_per_unit: 10}, metadata: {name: service_1}}
  - {key: plain2, rate_limit: {unit: minute, requests_per_unit: 5}, metadata: {some_other_name: service_2}}
  - {key: plain3, rate_limit: {unit: minute, requests_per_unit: 5}, metadata: {name: service_2}}
`

// exhaust drives a descriptor to its limit, so that its next call is over.
func exhaust(t *testing.T, d *daemon, domain string, kv []string, n int) {
	t.Helper()
	for range n {
		d.call(t, rq(domain, desc(kv...)))
	}
}

func TestPeerService(t *testing.T) {
	rs := redistest.Standalone(t)
	dir := configDir(t, map[string]string{"svc.yaml": peerServiceConfig, "quota.yaml": peerQuotaConfig})
	newDaemon := func(tweak func(*server.Options)) *daemon {
		return start(t, rs.Addr(), dir, func(o *server.Options) {
			o.Prefix = uniq("psvc")
			if tweak != nil {
				tweak(o)
			}
		})
	}
	// TestService, TestServiceGlobalShadowMode, TestRuleShadowMode,
	// TestMixedRuleShadowMode, TestUnlimited: the overall code from the
	// descriptors' statuses.
	inOneWindow(t, time.Minute, 10*time.Second, func(s *soft, sfx string) {
		d := newDaemon(nil)
		r := d.call(t, rq("test-domain", desc("hello", "world")))
		s.expect("TestService: unknown", codes(r)+" "+limitOf(r.Statuses[0]), "OK:OK none")
		exhaust(t, d, "different-domain", []string{"foo", sfx}, 10)
		r = d.call(t, rq("different-domain", desc("foo", sfx), desc("hello", "world")))
		s.expect("TestService: over and none", codes(r)+" "+limitOf(r.Statuses[0])+" "+limitOf(r.Statuses[1]), "OVER_LIMIT:OVER_LIMIT,OK MINUTE:10 none")
		s.expect("TestService: the limit's name", r.Statuses[0].CurrentLimit.GetName(), "key_name")
		r = d.call(t, rq("different-domain", desc("hello", "world"), desc("foo", sfx)))
		s.expect("TestService: order does not matter", codes(r), "OVER_LIMIT:OK,OVER_LIMIT")
		exhaust(t, d, "different-domain", []string{"shadow1", sfx}, 10)
		exhaust(t, d, "different-domain", []string{"shadow2", sfx}, 10)
		r = d.call(t, rq("different-domain", desc("shadow1", sfx), desc("shadow2", sfx)))
		s.expect("TestRuleShadowMode", codes(r), "OK:OK,OK")
		r = d.call(t, rq("different-domain", desc("shadow1", sfx), desc("foo", sfx)))
		s.expect("TestMixedRuleShadowMode", codes(r), "OVER_LIMIT:OK,OVER_LIMIT")
		r = d.call(t, rq("different-domain", desc("foo", "u"+sfx), desc("hello", "world"), desc("baz", "qux")))
		s.expect("TestUnlimited", codes(r)+" "+uitoa(uint64(r.Statuses[0].LimitRemaining))+" "+limitOf(r.Statuses[1])+" "+limitOf(r.Statuses[2]), "OK:OK,OK,OK 9 none none")
		s.expect("TestUnlimited: remaining of unlimited", r.Statuses[2].LimitRemaining, uint32(math.MaxUint32))
	})
	inOneWindow(t, time.Minute, 10*time.Second, func(s *soft, sfx string) {
		d := newDaemon(func(o *server.Options) { o.ShadowMode = true })
		exhaust(t, d, "different-domain", []string{"foo", sfx}, 10)
		r := d.call(t, rq("different-domain", desc("foo", sfx), desc("hello", "world")))
		s.expect("TestServiceGlobalShadowMode", codes(r), "OK:OVER_LIMIT,OK")
		v, _ := metric(scrape(t, d), "ratelimit_shadow_overrides_total")
		s.expect("TestServiceGlobalShadowMode: counted", v, float64(1))
	})
	// TestServiceWithCustomRatelimitHeaders, ...DefaultRatelimitHeaders.
	for _, names := range [][3]string{{"A-Ratelimit-Limit", "A-Ratelimit-Remaining", "A-Ratelimit-Reset"}, {"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"}} {
		inOneWindow(t, time.Minute, 10*time.Second, func(s *soft, sfx string) {
			d := newDaemon(func(o *server.Options) {
				o.ResponseHeaders = true
				o.Compat.HeaderLimit, o.Compat.HeaderRemaining, o.Compat.HeaderReset = names[0], names[1], names[2]
			})
			exhaust(t, d, "different-domain", []string{"foo", sfx}, 10)
			r := d.call(t, rq("different-domain", desc("foo", sfx), desc("hello", "world")))
			reset := strconv.FormatInt(60-time.Now().Unix()%60, 10)
			h := r.ResponseHeadersToAdd
			s.expect("headers "+names[0], len(h), 3)
			if len(h) == 3 {
				s.expect("limit header", h[0].Key+"="+h[0].Value, names[0]+"=10")
				s.expect("remaining header", h[1].Key+"="+h[1].Value, names[1]+"=0")
				s.expect("reset header", h[2].Key+"="+h[2].Value, names[2]+"="+reset)
			}
		})
	}
	// TestEmptyDomain, TestEmptyDescriptors: errors.
	d := newDaemon(nil)
	for name, req := range map[string]*pb.RateLimitRequest{
		"TestEmptyDomain": rq("", desc("hello", "world")), "TestEmptyDescriptors": rq("test-domain"),
	} {
		_, err := d.rls.ShouldRateLimit(context.Background(), req)
		if status.Code(err) != grpccodes.InvalidArgument {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestPeerServiceQuotaMode: the quota mode and dynamic metadata cases of
// the peer's service tests.
func TestPeerServiceQuotaMode(t *testing.T) {
	rs := redistest.Standalone(t)
	dir := configDir(t, map[string]string{"quota.yaml": peerQuotaConfig})
	run := func(name string, tweak func(*server.Options), over []string, req []string, want string, md map[string]string) {
		t.Helper()
		inOneWindow(t, time.Minute, 10*time.Second, func(s *soft, sfx string) {
			d := start(t, rs.Addr(), dir, func(o *server.Options) {
				o.Prefix = uniq("pq")
				if tweak != nil {
					tweak(o)
				}
			})
			limits := map[string]int{"regular": 5, "quota": 3, "quota1": 5, "quota2": 3, "plain1": 10, "plain2": 5, "plain3": 5}
			for _, k := range over {
				exhaust(t, d, "quota-domain", []string{k, sfx}, limits[k])
			}
			var ds = rq("quota-domain")
			for _, k := range req {
				ds.Descriptors = append(ds.Descriptors, desc(k, sfx))
			}
			r := d.call(t, ds)
			s.expect(name, codes(r), want)
			if md != nil {
				f := r.DynamicMetadata.GetFields()["metadata"].GetStructValue().GetFields()
				s.expect(name+": metadata fields", len(f), len(md))
				for k, v := range md {
					s.expect(name+": metadata "+k, f[k].GetStringValue(), v)
				}
			}
		})
	}
	global := func(o *server.Options) { o.Compat.QuotaMode = true }
	withMD := func(o *server.Options) { o.Compat.QuotaMode, o.Compat.ResponseDynamicMetadata = true, true }
	shadow := func(o *server.Options) { o.ShadowMode = true }
	run("TestServiceGlobalQuotaMode", global, []string{"plain1", "plain2"}, []string{"plain1", "plain2"}, "OVER_LIMIT:OVER_LIMIT,OVER_LIMIT", nil)
	run("TestMetadataReturnedForPassedDescriptors", withMD, []string{"quota"}, []string{"plain1", "quota"}, "OK:OK,OVER_LIMIT", map[string]string{"name": "service_1"})
	run("TestMetadataReturnedForAllPassedDescriptors", withMD, nil, []string{"plain1", "plain2"}, "OK:OK,OK", map[string]string{"name": "service_1", "some_other_name": "service_2"})
	run("TestOverlappingMetadataReturnsTheFirstValue", withMD, nil, []string{"plain1", "plain3"}, "OK:OK,OK", map[string]string{"name": "service_1"})
	run("TestServicePerDescriptorQuotaMode", nil, []string{"regular"}, []string{"regular", "quota"}, "OVER_LIMIT:OVER_LIMIT,OK", nil)
	run("TestServiceMixedPerDescriptorModes", nil, []string{"quota"}, []string{"regular", "quota"}, "OVER_LIMIT:OK,OVER_LIMIT", nil)
	run("TestServiceMixedPerDescriptorModesUnderLimit", nil, nil, []string{"regular", "quota"}, "OK:OK,OK", nil)
	run("TestServiceQuotaModeOnlyAllOverTheLimit", nil, []string{"quota1", "quota2"}, []string{"quota1", "quota2"}, "OVER_LIMIT:OVER_LIMIT,OVER_LIMIT", nil)
	run("TestServiceQuotaModeOnlySomeOverTheLimit", nil, []string{"quota1"}, []string{"quota1", "quota2"}, "OK:OVER_LIMIT,OK", nil)
	run("TestServiceQuotaModeWithShadowMode", shadow, []string{"quota1", "quota2"}, []string{"quota1", "quota2"}, "OK:OVER_LIMIT,OVER_LIMIT", nil)
	run("TestServiceMixedModeWithShadowMode", shadow, []string{"regular", "quota"}, []string{"regular", "quota"}, "OK:OVER_LIMIT,OVER_LIMIT", nil)
}

// TestPeerServiceCacheError is TestCacheError: Redis failing. The peer
// returns an error (Envoy's failure_mode_deny decides); ratelimitd answers
// within its timeout with the rule's failure mode (deliberately: an outage
// of Redis is not an outage of rate limiting). With failure_mode closed it
// denies, with open it admits.
func TestPeerServiceCacheError(t *testing.T) {
	rs := redistest.Standalone(t)
	dir := configDir(t, map[string]string{"c.yaml": "domain: different-domain\ndescriptors:\n  - {key: closed, rate_limit: {unit: minute, requests_per_unit: 10, failure_mode: closed, mode: exact}}\n  - {key: open, rate_limit: {unit: minute, requests_per_unit: 10, failure_mode: open, mode: exact}}\n"})
	d := start(t, rs.Addr(), dir, func(o *server.Options) { o.Prefix = uniq("pce") })
	rs.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := d.rls.ShouldRateLimit(ctx, rq("different-domain", desc("closed", "bar"), desc("open", "bar")))
	if err != nil || codes(r) != "OVER_LIMIT:OVER_LIMIT,OK" {
		t.Fatalf("Redis down: %v %v", r, err)
	}
}

// peerCacheConfig holds the limits of the peer's cache tests.
const peerCacheConfig = `
domain: domain
descriptors:
  - {key: key, value: value, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: key2, value: value2, descriptors: [{key: subkey2, value: subvalue2, rate_limit: {unit: minute, requests_per_unit: 10}}]}
  - key: key3
    value: value3
    rate_limit: {unit: hour, requests_per_unit: 10}
    descriptors: [{key: subkey3, value: subvalue3, rate_limit: {unit: day, requests_per_unit: 10}}]
  - {key: key4, value: value4, rate_limit: {unit: hour, requests_per_unit: 15}}
  - {key: key5, value: value5, rate_limit: {unit: hour, requests_per_unit: 14}}
  - {key: near5, value: value5, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: key6, value: value6, rate_limit: {unit: minute, requests_per_unit: 8}}
  - {key: key7, value: value7, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: key8, value: value8, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: key9, value: value9, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: key10, value: value10, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: shadow4, value: value4, shadow_mode: true, rate_limit: {unit: hour, requests_per_unit: 15}}
  - {key: small, value: value, rate_limit: {unit: minute, requests_per_unit: 5}}
  - {key: smallshadow, value: value, shadow_mode: true, rate_limit: {unit: minute, requests_per_unit: 5}}
  - {key: files, value: files/*, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 100}}
  - {key: parent, value: value1, descriptors: [{key: files, value: nested/*, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 100}}]}
  - {key: files, value: top/*, share_threshold: true, descriptors: [{key: files, value: nested/*, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 100}}]}
`

// TestPeerCache: the peer's redis cache and base limiter cases in the
// migration mode, where the same keys and counts apply. The peer's tests
// set the count INCRBY returns; here the count is set in Redis beforehand,
// as the peer's own earlier hits would have left it. Minute units stand for
// the peer's second ones (the same arithmetic, away from window edges).
func TestPeerCache(t *testing.T) {
	rs := redistest.Standalone(t)
	c := rs.Client()
	defer c.Close()
	ctx := context.Background()
	dir := configDir(t, map[string]string{"c.yaml": peerCacheConfig})
	for _, stop := range []bool{false, true} {
		inOneWindow(t, time.Minute, 15*time.Second, func(s *soft, sfx string) {
			prefix := "pc" + sfx + ":"
			d := start(t, rs.Addr(), dir, func(o *server.Options) {
				o.Defaults.Mode = config.Exact
				o.Compat.EnvoyKeys, o.Compat.CacheKeyPrefix, o.Compat.ExpirationJitterMaxSeconds = true, prefix, 0
				o.Compat.StopIncrementWhenOverLimit = stop
			})
			now := time.Now().Unix()
			win := func(p int64) string { return strconv.FormatInt(now/p*p, 10) }
			key := func(parts string, p int64) string { return prefix + "domain_" + parts + "_" + win(p) }
			set := func(k string, n int64) { must(t, c.Set(ctx, k, n, time.Hour).Err()) }
			get := func(k string) int64 { v, _ := c.Get(ctx, k).Int64(); return v }
			status := func(r *pb.RateLimitResponse, i int) string {
				st := r.Statuses[i]
				return st.Code.String() + " " + limitOf(st) + " " + uitoa(uint64(st.LimitRemaining))
			}
			if !stop {
				// TestRedis
				set(key("key_value", 60), 4)
				r := d.call(t, rq("domain", desc("key", "value")))
				s.expect("TestRedis 1", status(r, 0), "OK MINUTE:10 5")
				s.expect("TestRedis 1: reset", r.Statuses[0].DurationUntilReset.GetSeconds(), 60-now%60)
				set(key("key2_value2_subkey2_subvalue2", 60), 10)
				r = d.call(t, rq("domain", desc("key2", "value2"), desc("key2", "value2", "subkey2", "subvalue2")))
				s.expect("TestRedis 2", codes(r)+" "+status(r, 1), "OVER_LIMIT:OK,OVER_LIMIT OVER_LIMIT MINUTE:10 0")
				s.expect("TestRedis 2: no limit", limitOf(r.Statuses[0]), "none")
				set(key("key3_value3", 3600), 11)
				set(key("key3_value3_subkey3_subvalue3", 86400), 12)
				r = d.call(t, rq("domain", withHits(desc("key3", "value3"), 0), withHits(desc("key3", "value3", "subkey3", "subvalue3"), 1)))
				s.expect("TestRedis 3", status(r, 0)+", "+status(r, 1), "OVER_LIMIT HOUR:10 0, OVER_LIMIT DAY:10 0")
				s.expect("TestRedis 3: INCRBY 0", get(key("key3_value3", 3600)), int64(11))
				s.expect("TestRedis 3: INCRBY 1", get(key("key3_value3_subkey3_subvalue3", 86400)), int64(13))
				// TestNearLimit and TestOverLimitWithLocalCache (without the
				// local cache: the 4th call goes to Redis too, same answer)
				k4 := key("key4_value4", 3600)
				for i, c := range []struct {
					before int64
					want   string
				}{{10, "OK HOUR:15 4"}, {12, "OK HOUR:15 2"}, {15, "OVER_LIMIT HOUR:15 0"}, {16, "OVER_LIMIT HOUR:15 0"}} {
					set(k4, c.before)
					s.expect("TestNearLimit "+strconv.Itoa(i), status(d.call(t, rq("domain", desc("key4", "value4"))), 0), c.want)
				}
				for _, c := range []struct {
					k      string
					before int64
					hits   uint64
					want   string
				}{
					{"near5", 2, 3, "OK MINUTE:20 15"}, {"key6", 5, 2, "OK MINUTE:8 1"}, {"key7", 16, 3, "OK MINUTE:20 1"},
					{"key8", 19, 3, "OVER_LIMIT MINUTE:20 0"}, {"key9", 15, 7, "OVER_LIMIT MINUTE:20 0"}, {"key10", 27, 3, "OVER_LIMIT MINUTE:10 0"},
				} {
					v := "value" + strings.TrimLeft(c.k, "keynar")
					set(key(c.k+"_"+v, 60), c.before)
					req := rq("domain", desc(c.k, v))
					req.HitsAddend = uint32(c.hits)
					s.expect("TestNearLimit "+c.k, status(d.call(t, req), 0), c.want)
				}
				// TestOverLimitWithLocalCacheShadowRule
				ks := key("shadow4_value4", 3600)
				for i, c := range []struct {
					before int64
					want   string
				}{{10, "OK HOUR:15 4"}, {12, "OK HOUR:15 2"}, {15, "OK HOUR:15 0"}, {16, "OK HOUR:15 0"}} {
					set(ks, c.before)
					s.expect("TestOverLimitWithLocalCacheShadowRule "+strconv.Itoa(i), status(d.call(t, rq("domain", desc("shadow4", "value4"))), 0), c.want)
				}
				// base limiter: GetResponseStatus{OverLimit,BelowLimit}{,ShadowMode}
				for _, c := range []struct {
					k             string
					before, hits  int64
					want, comment string
				}{{"small", 2, 5, "OVER_LIMIT MINUTE:5 0", "over"}, {"smallshadow", 2, 5, "OK MINUTE:5 0", "over, shadow"},
					{"key", 2, 4, "OK MINUTE:10 4", "below"}} {
					set(key(c.k+"_value", 60), c.before)
					req := rq("domain", desc(c.k, "value"))
					req.HitsAddend = uint32(c.hits)
					s.expect("TestGetResponseStatus "+c.comment, status(d.call(t, req), 0), c.want)
				}
				// base limiter: TestGenerateCacheKeys*WithShareThreshold
				d.call(t, rq("domain", desc("files", "files/a.pdf")))
				d.call(t, rq("domain", desc("files", "files/b.csv")))
				s.expect("share_threshold key", get(key("files_files/*", 60)), int64(2))
				d.call(t, rq("domain", desc("parent", "value1", "files", "nested/x")))
				s.expect("nested share_threshold key", get(key("parent_value1_files_nested/*", 60)), int64(1))
				d.call(t, rq("domain", desc("files", "top/1", "files", "nested/2")))
				s.expect("two share_threshold keys", get(key("files_top/*_files_nested/*", 60)), int64(1))
				return
			}
			// TestOverLimitWithStopCacheKeyIncrementWhenOverlimitConfig
			k4, k5 := key("key4_value4", 3600), key("key5_value5", 3600)
			for i, c := range []struct {
				before, hits int64
				want         string
				after4       int64
			}{{10, 1, "OK HOUR:15 4, OK HOUR:14 3", 11}, {11, 2, "OK HOUR:15 2, OK HOUR:14 1", 13}, {13, 2, "OK HOUR:15 2, OVER_LIMIT HOUR:14 0", 13}} {
				set(k4, c.before)
				set(k5, c.before)
				r := d.call(t, rq("domain", withHits(desc("key4", "value4"), uint64(c.hits)), withHits(desc("key5", "value5"), uint64(c.hits))))
				s.expect("STOP "+strconv.Itoa(i), status(r, 0)+", "+status(r, 1), c.want)
				s.expect("STOP "+strconv.Itoa(i)+": key4 count", get(k4), c.after4)
			}
		})
	}
}

// TestPeerJSONHandler is the peer's TestJsonHandler against /json: a
// missing or broken body and a request the service refuses are 400; OK is
// 200, OVER_LIMIT 429, with the response as JSON.
func TestPeerJSONHandler(t *testing.T) {
	rs := redistest.Standalone(t)
	d := start(t, rs.Addr(), configDir(t, map[string]string{"c.yaml": "domain: foo\ndescriptors: [{key: k, rate_limit: {unit: minute, requests_per_unit: 1}}]\n"}),
		func(o *server.Options) { o.Prefix = uniq("json") })
	v := uniq("v")
	for _, c := range []struct {
		body, frag string
		code       int
	}{
		{"", `"error"`, 400},
		{"}", `"error"`, 400},
		{`{"domain": "foo"}`, `"error"`, 400},
		{`{"domain": "foo", "descriptors": [{"entries": [{"key": "k", "value": "` + v + `"}]}]}`, `{"overallCode":"OK"`, 200},
		{`{"domain": "foo", "descriptors": [{"entries": [{"key": "k", "value": "` + v + `"}]}]}`, `{"overallCode":"OVER_LIMIT"`, 429},
	} {
		code, body, hdr := httpPost(t, d, "/json", c.body)
		if code != c.code || !strings.Contains(strings.Join(strings.Fields(body), ""), strings.Join(strings.Fields(c.frag), "")) || hdr.Get("Content-Type") != "application/json" {
			t.Errorf("%q: %d %s %s, want %d %s", c.body, code, hdr.Get("Content-Type"), body, c.code, c.frag)
		}
	}
}
