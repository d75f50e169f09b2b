package service

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
	"github.com/hybridlimit/ratelimit/local"
)

// envoyCounter counts one exact fixed-window limit in envoyproxy/ratelimit's
// Redis keys and its way (Compat.EnvoyKeys): the migration mode, in which
// ratelimitd and envoyproxy/ratelimit processes behind one Redis share one
// count per descriptor and window.
type envoyCounter struct {
	rate     int64
	period   int64 // seconds: envoyproxy/ratelimit's unit divider
	failure  ratelimit.FailureMode
	fallback ratelimit.Limiter // failure mode local: this process's share
}

func (s *Service) newEnvoyCounter(sig signature) (*envoyCounter, error) {
	l := sig.lims[0]
	c := &envoyCounter{rate: int64(l.rate), period: int64(l.period / time.Second), failure: sig.failure}
	if c.period <= 0 || l.period%time.Second != 0 {
		return nil, fmt.Errorf("envoyproxy/ratelimit's keys need a period of whole seconds, got %v", l.period)
	}
	if sig.failure == ratelimit.FailLocal {
		share := l.limit()
		share.Rate = max(1, share.Rate/max(1, s.opts.Instances))
		fb, err := local.New(share)
		if err != nil {
			return nil, fmt.Errorf("local fallback: %w", err)
		}
		c.fallback = fb
	}
	return c, nil
}

// envoyEligible reports whether a limiter of sig counts in
// envoyproxy/ratelimit's keys under Compat.EnvoyKeys: an exact fixed window
// of one limit, as envoyproxy/ratelimit counts every limit.
func (s *Service) envoyEligible(sig signature) bool {
	return s.opts.Compat.EnvoyKeys && sig.mode == config.Exact && sig.n == 1 && sig.lims[0].alg == ratelimit.FixedWindow
}

// envoyKey is envoyproxy/ratelimit's cache key of a descriptor at Unix
// second now for a window of period seconds:
// <prefix><domain>_<key>_<value>_..._<window start>, a share_threshold
// wildcard in place of the value it matched.
func envoyKey(prefix, domain string, it *item, period, now int64) string {
	var b strings.Builder
	b.WriteString(prefix)
	b.WriteString(domain)
	b.WriteByte('_')
	for i, e := range it.desc.GetEntries() {
		b.WriteString(e.GetKey())
		b.WriteByte('_')
		v := e.GetValue()
		if it.shared != nil && it.shared[i] != "" {
			v = it.shared[i]
		}
		b.WriteString(v)
		b.WriteByte('_')
	}
	b.WriteString(strconv.FormatInt(now/period*period, 10))
	return b.String()
}

// countEnvoy counts a request's items of EnvoyKeys limiters in one pipeline,
// as envoyproxy/ratelimit does: INCRBY of the hits (0 for a check) and
// EXPIRE of the unit plus jitter for each, over the limit when the count
// after passes it. With stop (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT) it
// first reads the counts and, when a descriptor would go over (or another
// of the request is over: othersOver), increments only those that would.
// It reports whether an item is over the limit. When Redis does not answer
// within the timeout, each rule's failure mode decides.
func (s *Service) countEnvoy(ctx context.Context, domain string, items []item, stop, othersOver bool) bool {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	now := time.Now().Unix()
	keys := make([]string, len(items))
	for i := range items {
		if it := &items[i]; it.envoy {
			keys[i] = envoyKey(s.opts.Compat.CacheKeyPrefix, domain, it, it.ent().envoy.period, now)
		}
	}
	hits := make([]int64, len(items))
	for i := range items {
		hits[i] = int64(items[i].hits)
	}
	client := s.opts.Client
	if stop {
		gets := make([]*redis.StringCmd, len(items))
		_, err := client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := range items {
				if items[i].envoy {
					gets[i] = p.Get(ctx, keys[i])
				}
			}
			return nil
		})
		if err != nil && err != redis.Nil {
			return s.envoyFailed(ctx, items, keys, err)
		}
		near := make([]bool, len(items))
		any := othersOver
		for i, g := range gets {
			if g == nil {
				continue
			}
			cur, err := g.Int64()
			if err != nil && err != redis.Nil {
				return s.envoyFailed(ctx, items, keys, err)
			}
			near[i] = cur+hits[i] > items[i].ent().envoy.rate
			any = any || near[i]
		}
		if any {
			for i := range items {
				if items[i].envoy && !near[i] {
					hits[i] = 0
				}
			}
		}
	}
	incrs := make([]*redis.IntCmd, len(items))
	_, err := client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range items {
			it := &items[i]
			if !it.envoy {
				continue
			}
			c := it.ent().envoy
			incrs[i] = p.IncrBy(ctx, keys[i], hits[i])
			exp := c.period
			if j := s.opts.Compat.ExpirationJitterMaxSeconds; j > 0 {
				exp += rand.Int64N(j)
			}
			p.Expire(ctx, keys[i], time.Duration(exp)*time.Second)
		}
		return nil
	})
	if err != nil {
		return s.envoyFailed(ctx, items, keys, err)
	}
	over := false
	for i, cmd := range incrs {
		if cmd == nil {
			continue
		}
		it := &items[i]
		c := it.ent().envoy
		after := cmd.Val()
		d := ratelimit.Decision{Limit: ratelimit.Limit{Rate: int(c.rate), Period: time.Duration(c.period) * time.Second},
			Algorithm: ratelimit.FixedWindow, ResetAfter: untilSecond(now, c.period), Allowed: after <= c.rate}
		if d.Allowed {
			d.Remaining = int(c.rate - after)
		} else {
			d.RetryAfter = d.ResetAfter
			over = true
		}
		it.dec = d
	}
	return over
}

// envoyFailed decides the EnvoyKeys items of a request Redis did not
// answer by their rules' failure modes, and reports whether one is over.
func (s *Service) envoyFailed(ctx context.Context, items []item, keys []string, err error) bool {
	over := false
	for i := range items {
		it := &items[i]
		if !it.envoy {
			continue
		}
		c := it.ent().envoy
		switch {
		case c.failure == ratelimit.FailLocal && !it.check:
			// the share is counted per key without the window start: the
			// local limiter has windows of its own
			base := keys[i][:strings.LastIndexByte(keys[i], '_')]
			it.dec, it.err = c.fallback.AllowN(ctx, base, int(it.hits))
		default:
			it.dec = s.failureDecision(it)
		}
		if it.err == nil && !it.dec.Allowed {
			over = true
		}
	}
	s.log.Debug("redis did not answer in time: envoyproxy/ratelimit keys decided by the failure modes", "error", err.Error())
	return over
}
