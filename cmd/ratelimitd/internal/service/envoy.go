package service

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit"
)

// The migration mode (Compat.EnvoyKeys, --key-layout envoy): exact
// fixed-window rules of one limit count in envoyproxy/ratelimit's Redis
// keys and its way, so that ratelimitd and envoyproxy/ratelimit processes
// behind one Redis share one count per descriptor and window. The Service
// makes the keys (envoyKey); the Redis backend counts in them (envoyLimiter,
// a Limiter of Spec.Layout LayoutEnvoy).

// envoyKey is envoyproxy/ratelimit's cache key of a descriptor without the
// window start: <prefix><domain>_<key>_<value>_..._, a share_threshold
// wildcard in place of the value it matched. The limiter appends the
// window start.
func envoyKey(prefix, domain string, it *item) string {
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
	return b.String()
}

// envoyLimiter counts one fixed-window limit of whole seconds as
// envoyproxy/ratelimit does (see LayoutEnvoy): per call, INCRBY of the hits
// and EXPIRE of the unit plus up to RedisOptions.EnvoyExpirationJitter, in
// one pipeline, within the backend's timeout; over the limit when the
// count after passes it, the hits counted all the same. When Redis does
// not answer, the failure mode decides: closed denies, open admits, local
// admits the limit shared by the fleet (the backend's fleetFallback, as
// for the other exact rules). A check (Check, hits_addend 0) is INCRBY 0.
type envoyLimiter struct {
	b      *redisBackend
	spec   Spec
	rate   int64
	period int64          // seconds: envoyproxy/ratelimit's unit divider
	fb     *fleetFallback // nil unless the failure mode is local
	fell   atomic.Uint64  // decisions taken by the failure mode (open and closed; local counts in fb)
	closed atomic.Bool
}

func (b *redisBackend) newEnvoy(spec Spec) (Limiter, error) {
	if len(spec.Limits) != 1 || spec.Algorithms[0] != ratelimit.FixedWindow {
		return nil, errors.New("envoyproxy/ratelimit's keys count one fixed-window limit")
	}
	l := spec.Limits[0]
	if l.Period < time.Second || l.Period%time.Second != 0 {
		return nil, fmt.Errorf("envoyproxy/ratelimit's keys need a period of whole seconds, got %v", l.Period)
	}
	if err := l.ValidateFor(ratelimit.FixedWindow); err != nil {
		return nil, err
	}
	e := &envoyLimiter{b: b, spec: spec, rate: int64(l.Rate), period: int64(l.Period / time.Second)}
	if spec.FailureMode == ratelimit.FailLocal {
		fb, err := b.newFleetFallback(spec)
		if err != nil {
			return nil, err
		}
		e.fb = fb
	}
	return e, nil
}

// incr counts n hits (0: a check) in the window of now, and decides.
func (e *envoyLimiter) incr(ctx context.Context, key string, n int64) (ratelimit.Decision, string, error) {
	ctx, cancel := context.WithTimeout(ctx, e.b.o.Timeout)
	defer cancel()
	now := time.Now().Unix()
	k := key + strconv.FormatInt(now/e.period*e.period, 10)
	var incr *redis.IntCmd
	_, err := e.b.o.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		incr = p.IncrBy(ctx, k, n)
		exp := e.period
		if j := e.b.o.EnvoyExpirationJitter; j > 0 {
			exp += rand.Int64N(j)
		}
		p.Expire(ctx, k, time.Duration(exp)*time.Second)
		return nil
	})
	if err != nil {
		if refusal(err) && !e.b.refusing() {
			e.b.note(err)
		}
		return ratelimit.Decision{}, k, err
	}
	after := incr.Val()
	d := ratelimit.Decision{Limit: e.spec.Limits[0], Algorithm: ratelimit.FixedWindow,
		ResetAfter: time.Duration(e.period-now%e.period) * time.Second, Allowed: after <= e.rate}
	if d.Allowed {
		d.Remaining = int(e.rate - after)
	} else {
		d.RetryAfter = d.ResetAfter
	}
	return d, k, nil
}

// failed decides by the failure mode a call Redis did not answer: closed
// denies, open admits, local takes n from this process's share (n 0, a
// check, is admitted: it spends nothing). It returns the caller's error
// when the caller gave up.
func (e *envoyLimiter) failed(ctx context.Context, key string, n int, err error) (ratelimit.Decision, error) {
	if ctx.Err() != nil || !redisError(err) {
		return ratelimit.Decision{}, err
	}
	if e.fb != nil && n > 0 {
		return e.fb.AllowN(ctx, key, n)
	}
	e.fell.Add(1)
	d := ratelimit.Decision{Limit: e.spec.Limits[0], Algorithm: ratelimit.FixedWindow,
		ResetAfter: time.Duration(e.period-time.Now().Unix()%e.period) * time.Second}
	if e.spec.FailureMode == ratelimit.FailClosed {
		d.RetryAfter = d.ResetAfter
		return d, nil
	}
	d.Allowed = true
	return d, nil
}

func (e *envoyLimiter) AllowN(ctx context.Context, key string, n int) (ratelimit.Decision, error) {
	if e.closed.Load() {
		return ratelimit.Decision{}, ratelimit.ErrClosed
	}
	if n <= 0 {
		return ratelimit.Decision{}, fmt.Errorf("%w: n must be at least 1, got %d", ratelimit.ErrInvalidN, n)
	}
	d, _, err := e.incr(ctx, key, int64(n))
	if err != nil {
		return e.failed(ctx, key, n, err)
	}
	return d, nil
}

// Check answers as envoyproxy/ratelimit answers hits_addend 0: INCRBY 0,
// OK unless the count already passed the limit.
func (e *envoyLimiter) Check(ctx context.Context, key string) (ratelimit.Decision, error) {
	if e.closed.Load() {
		return ratelimit.Decision{}, ratelimit.ErrClosed
	}
	d, _, err := e.incr(ctx, key, 0)
	if err != nil {
		return e.failed(ctx, key, 0, err)
	}
	return d, nil
}

// Reserve counts n hits as AllowN does, as a reservation whose Cancel
// takes back what it counted (DECRBY) while its window is the current one
// (Compat.StopIncrementWhenOverLimit). A reservation over the limit holds
// nothing (the hits stay counted, as envoyproxy/ratelimit counts them).
// When Redis does not answer: the local failure mode reserves in this
// process's share, open admits with nothing to give back, closed denies.
func (e *envoyLimiter) Reserve(ctx context.Context, key string, n int) (*ratelimit.Reservation, error) {
	if e.closed.Load() {
		return nil, ratelimit.ErrClosed
	}
	if n <= 0 {
		return nil, fmt.Errorf("%w: estimate must be at least 1, got %d", ratelimit.ErrInvalidN, n)
	}
	d, k, err := e.incr(ctx, key, int64(n))
	if err != nil {
		if ctx.Err() != nil || !redisError(err) {
			return nil, err
		}
		if e.fb != nil {
			return e.fb.Reserve(ctx, key, n)
		}
		d, _ := e.failed(ctx, key, n, err)
		if d.Allowed {
			return ratelimit.NewReservation(d, n, nothingCounted{}), nil
		}
		return ratelimit.NewReservation(d, n, nil), nil
	}
	if !d.Allowed {
		return ratelimit.NewReservation(d, n, nil), nil
	}
	return ratelimit.NewReservation(d, n, &envoySettler{e: e, key: k, estimate: int64(n)}), nil
}

func (e *envoyLimiter) Stats() LimiterStats {
	st := LimiterStats{Fallback: e.fell.Load()}
	if e.fb != nil {
		st.Fallback += e.fb.n.Load()
		st.Instances = int(e.fb.fleet())
	}
	if e.b.refusing() {
		st.DegradedKnown, st.Degraded = true, true
	}
	return st
}

func (e *envoyLimiter) Flush(context.Context) error { return nil }

func (e *envoyLimiter) Close() error {
	if !e.closed.Swap(true) {
		e.b.forget(e.fb)
	}
	return nil
}

// envoySettler settles a reservation of an envoyLimiter: it adds
// actual - estimate to the count of the reservation's window while that
// window is the current one (after, giving back would only lower a count
// no one reads). It tries once: after a failed call it cannot tell
// whether Redis applied it, and refuses to apply it again.
type envoySettler struct {
	e        *envoyLimiter
	key      string // with the window start
	estimate int64
	tried    atomic.Bool
}

func (s *envoySettler) Settle(ctx context.Context, actual int) error {
	if s.tried.Swap(true) {
		return fmt.Errorf("%w: a settlement of this reservation may have been applied already", ratelimit.ErrSettled)
	}
	i := strings.LastIndexByte(s.key, '_')
	start, _ := strconv.ParseInt(s.key[i+1:], 10, 64)
	if time.Now().Unix()/s.e.period*s.e.period != start {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.e.b.o.Timeout)
	defer cancel()
	return s.e.b.o.Client.IncrBy(ctx, s.key, int64(actual)-s.estimate).Err()
}

// nothingCounted settles a reservation admitted without counting anything
// (failure mode open): there is nothing to give back or to charge.
type nothingCounted struct{}

func (nothingCounted) Settle(context.Context, int) error { return nil }
