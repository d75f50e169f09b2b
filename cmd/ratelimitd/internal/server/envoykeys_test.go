package server_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/server"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// The migration mode (--key-layout envoy): exact fixed-window rules count
// in envoyproxy/ratelimit's keys and its way, so that both services behind
// one Redis share one count. The key names and values asserted here are
// those envoyproxy/ratelimit writes (its cache key generator and its redis
// fixed cache, read at f2fb157): <CACHE_KEY_PREFIX><domain>_<key>_<value>_
// ... _<window start in Unix seconds>, INCRBY of the hits then EXPIRE of the
// unit's seconds (plus jitter), every hit counted, denied or not.

const envoyKeysConfig = `
domain: mig
descriptors:
  - key: key
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: key2
    value: value2
    descriptors:
      - key: subkey2
        rate_limit: {unit: hour, requests_per_unit: 10}
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: service
    value: service_2
    rate_limit: {unit: minute, requests_per_unit: 2}
`

// peerIncr counts n hits in key as envoyproxy/ratelimit does, and returns
// the count after.
func peerIncr(t *testing.T, c *redis.Client, key string, n, expire int64) int64 {
	t.Helper()
	ctx := context.Background()
	var incr *redis.IntCmd
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		incr = p.IncrBy(ctx, key, n)
		p.Expire(ctx, key, time.Duration(expire)*time.Second)
		return nil
	})
	must(t, err)
	return incr.Val()
}

func TestEnvoyKeys(t *testing.T) {
	rs := redistest.Standalone(t)
	c := rs.Client()
	defer c.Close()
	ctx := context.Background()
	dir := configDir(t, map[string]string{"m.yaml": envoyKeysConfig})
	inOneWindow(t, time.Minute, 10*time.Second, func(s *soft, sfx string) {
		prefix := "p" + sfx + ":"
		d := start(t, rs.Addr(), dir, func(o *server.Options) {
			o.Defaults.Mode = config.Exact
			o.Compat.EnvoyKeys, o.Compat.CacheKeyPrefix, o.Compat.ExpirationJitterMaxSeconds = true, prefix, 0
		})
		now := time.Now().Unix()
		minute, hour := strconv.FormatInt(now/60*60, 10), strconv.FormatInt(now/3600*3600, 10)
		key := prefix + "mig_key_v1_" + minute

		r := d.call(t, rq("mig", desc("key", "v1")))
		s.expect("first call", codes(r), "OK:OK")
		s.expect("remaining", r.Statuses[0].LimitRemaining, uint32(4))
		v, err := c.Get(ctx, key).Int64()
		s.expect("the peer's key holds the count", v, int64(1))
		s.expect("no error", err, nil)
		ttl := c.TTL(ctx, key).Val()
		s.expect("expires after the unit, as the peer's EXPIRE", ttl > 50*time.Second && ttl <= time.Minute, true)

		// The peer's fleet counts 2 in the same key: one count.
		s.expect("the peer counts on", peerIncr(t, c, key, 2, 60), int64(3))
		r = d.call(t, rq("mig", desc("key", "v1")))
		s.expect("ratelimitd sees the peer's hits", r.Statuses[0].LimitRemaining, uint32(1))
		r = d.call(t, rq("mig", withHits(desc("key", "v1"), 2)))
		s.expect("over the limit", codes(r), "OVER_LIMIT:OVER_LIMIT")
		v, _ = c.Get(ctx, key).Int64()
		s.expect("denied hits are counted, as the peer counts them", v, int64(6))
		r = d.call(t, rq("mig", withHits(desc("key", "v1"), 0)))
		s.expect("a check is INCRBY 0: over when the count passed the limit", codes(r), "OVER_LIMIT:OVER_LIMIT")
		v, _ = c.Get(ctx, key).Int64()
		s.expect("a check counts nothing", v, int64(6))

		// Nested descriptors, share_threshold, and a request repeating a key.
		d.call(t, rq("mig", desc("key2", "value2", "subkey2", "subvalue2")))
		v, _ = c.Get(ctx, prefix+"mig_key2_value2_subkey2_subvalue2_"+hour).Int64()
		s.expect("nested key", v, int64(1))
		r = d.call(t, rq("mig", desc("files", "files/a.pdf"), desc("files", "files/b.csv")))
		s.expect("share_threshold: one count", r.Statuses[1].LimitRemaining, uint32(98))
		v, _ = c.Get(ctx, prefix+"mig_files_files/*_"+minute).Int64()
		s.expect("share_threshold key with the wildcard", v, int64(2))

		// The peer's token-quota example: check on the request, debit on the
		// response; the peer rejects the 4th request of a limit of 2.
		check := rq("mig", withHits(desc("service", "service_2"), 0))
		debit := rq("mig", withHits(desc("service", "service_2"), 1))
		for i := 1; i <= 3; i++ {
			s.expect("token quota check "+strconv.Itoa(i), codes(d.call(t, check)), "OK:OK")
			d.call(t, debit)
		}
		s.expect("token quota: the 4th is rejected, as the peer rejects it", codes(d.call(t, check)), "OVER_LIMIT:OVER_LIMIT")
	})
}

// TestEnvoyKeysJitter: the expiry of a key is the unit plus up to
// EXPIRATION_JITTER_MAX_SECONDS.
func TestEnvoyKeysJitter(t *testing.T) {
	rs := redistest.Standalone(t)
	c := rs.Client()
	defer c.Close()
	prefix := uniq("j") + ":"
	d := start(t, rs.Addr(), configDir(t, map[string]string{"m.yaml": envoyKeysConfig}), func(o *server.Options) {
		o.Defaults.Mode = config.Exact
		o.Compat.EnvoyKeys, o.Compat.CacheKeyPrefix, o.Compat.ExpirationJitterMaxSeconds = true, prefix, 300
	})
	for i := 0; i < 20; i++ {
		d.call(t, rq("mig", desc("key", strconv.Itoa(i))))
	}
	keys, err := c.Keys(context.Background(), prefix+"*").Result()
	must(t, err)
	if len(keys) != 20 {
		t.Fatalf("%d keys: %v", len(keys), keys)
	}
	distinct := map[time.Duration]bool{}
	for _, k := range keys {
		ttl := c.TTL(context.Background(), k).Val()
		if ttl <= 50*time.Second || ttl > 360*time.Second {
			t.Fatalf("%s expires in %v, want within (60s, 360s)", k, ttl)
		}
		distinct[ttl/time.Second] = true
	}
	if len(distinct) < 5 {
		t.Fatalf("20 keys, %d distinct expiries: no jitter?", len(distinct))
	}
}

// TestEnvoyKeysLocalFleet: in the migration mode, an exact rule failing
// local admits, while Redis does not answer, the limit shared by the fleet
// size the processes learned, as every exact rule does (not the whole limit
// in each process).
func TestEnvoyKeysLocalFleet(t *testing.T) {
	rs := redistest.Standalone(t)
	dir := configDir(t, map[string]string{"m.yaml": "domain: mig\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"})
	inOneWindow(t, time.Minute, 20*time.Second, func(s *soft, sfx string) {
		tweak := func(o *server.Options) {
			o.Prefix, o.Timeout = "efleet-"+sfx, 100*time.Millisecond
			o.Defaults.Mode = config.Exact
			o.Compat.EnvoyKeys, o.Compat.CacheKeyPrefix, o.Compat.ExpirationJitterMaxSeconds = true, "efleet-"+sfx+"_", 0
		}
		a, b := start(t, rs.Addr(), dir, tweak), start(t, rs.Addr(), dir, tweak)
		const limiter = "exact fixed_window 10/60s local"
		for _, d := range []*daemon{a, b} {
			eventually(t, 10*time.Second, "the fleet of 2 learned", func() bool {
				v, _ := metric(scrape(t, d), "ratelimit_instances", "limiter", limiter)
				return v == 2
			})
		}
		s.expect("counted in the peer's key while Redis answers", codes(a.call(t, rq("mig", desc("k", "warm")))), "OK:OK")
		must(t, rs.Freeze())
		defer rs.Thaw()
		admitted := 0
		for _, d := range []*daemon{a, b} {
			n := 0
			for range 8 {
				if codes(d.call(t, rq("mig", desc("k", "hot")))) == "OK:OK" {
					n++
				}
			}
			s.expect("one process's share of 10 between 2", n, 5)
			admitted += n
		}
		s.expect("the fleet's window with Redis down", admitted, 10)
		fb, _ := metric(scrape(t, a), "ratelimit_fallback_decisions_total")
		s.expect("decided by the failure mode", fb, float64(8))
		must(t, rs.Thaw())
	})
}
