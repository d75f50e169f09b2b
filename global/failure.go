package global

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/breaker"
	"github.com/hybridlimit/ratelimit/internal/check"
	"github.com/hybridlimit/ratelimit/internal/option"
)

// Defaults of the failure options.
const (
	DefaultTimeout         = 100 * time.Millisecond
	DefaultBreakerFailures = 3
	DefaultBreakerOpenFor  = 500 * time.Millisecond
)

// failure is what WithFailureMode adds to a Limiter: a deadline on every
// script call, a circuit breaker, and the decision taken without Redis.
type failure struct {
	mode     ratelimit.FailureMode
	fallback ratelimit.Limiter
	timeout  time.Duration
	openFor  time.Duration
	brk      *breaker.Breaker
	count    atomic.Uint64
}

func newFailure(c *config) (*failure, error) {
	if c.failMode == nil {
		if c.fallback != nil || c.timeout != 0 || c.failures != 0 {
			return nil, fmt.Errorf("%w: WithFallback, WithTimeout and WithBreaker need WithFailureMode", ratelimit.ErrInvalidOption)
		}
		return nil, nil
	}
	f := &failure{mode: *c.failMode, fallback: c.fallback, timeout: c.timeout, openFor: c.openFor}
	if !f.mode.Valid() {
		return nil, fmt.Errorf("%w: unknown failure mode %v", ratelimit.ErrInvalidOption, f.mode)
	}
	if f.mode == ratelimit.FailLocal && f.fallback == nil {
		return nil, fmt.Errorf("%w: FailLocal needs WithFallback (e.g. a local.Limiter sized to this instance's share)", ratelimit.ErrInvalidOption)
	}
	if f.timeout == 0 {
		f.timeout = DefaultTimeout
	}
	failures := c.failures
	if failures == 0 {
		failures, f.openFor = DefaultBreakerFailures, DefaultBreakerOpenFor
	}
	f.brk = breaker.New(breaker.Config{FailureThreshold: failures, OpenTimeout: f.openFor})
	return f, nil
}

// settle is how long after an outage a window that begins stays cautious
// for a FailLocal ledger: twice the breaker's open time and a timeout,
// within which every instance's breaker should have closed.
func (f *failure) settle() time.Duration { return 2 * (f.openFor + f.timeout) }

// run calls fn, which calls Redis, under the failure policy of f: with a
// deadline of f.timeout, and not at all while the breaker is open. It
// reports fallback when the decision must be taken without Redis (the
// breaker is open, or fn failed and was counted against it), and returns
// the error of a caller who gave up (which says nothing of Redis). A nil f
// only calls fn.
func (f *failure) run(ctx context.Context, fn func(context.Context) error) (fallback bool, err error) {
	if f == nil {
		err := fn(ctx)
		if err != nil {
			if cerr := callerEnded(ctx); cerr != nil {
				return false, cerr
			}
		}
		return false, err
	}
	if err := ctx.Err(); err != nil {
		// The caller's own deadline or cancellation says nothing of
		// Redis: it must not reach the breaker.
		return false, err
	}
	if !f.brk.Allow() {
		return true, nil
	}
	callCtx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	if err := fn(callCtx); err != nil {
		if cerr := callerEnded(ctx); cerr != nil {
			return false, cerr // the caller gave up, not Redis
		}
		f.brk.Failure()
		return true, nil
	}
	f.brk.Success()
	return false, nil
}

// decideMulti answers a multi-limit request without Redis, per the failure
// mode: FailOpen and FailClosed give every limit the same answer.
func (f *failure) decideMulti(ctx context.Context, s *limitSet, key string, n int, states *[]ratelimit.LimitState) (ratelimit.Decision, error) {
	f.count.Add(1)
	if f.mode == ratelimit.FailLocal {
		if fb, ok := f.fallback.(ratelimit.MultiLimiter); ok {
			return fb.AllowNInto(ctx, key, n, states)
		}
		return f.fallback.AllowN(ctx, key, n)
	}
	states = check.States(states, len(s.limits))
	for i, l := range s.limits {
		d := f.answer(l, s.algs[i], n)
		(*states)[i] = ratelimit.LimitState{Limit: l, Algorithm: s.algs[i], Allowed: d.Allowed, Remaining: max(d.Remaining, 0),
			RetryAfter: d.RetryAfter, ResetAfter: d.ResetAfter}
	}
	return ratelimit.Combine(states), nil
}

// decide answers without Redis, per the failure mode.
func (f *failure) decide(ctx context.Context, limit ratelimit.Limit, alg ratelimit.Algorithm, key string, n int) (ratelimit.Decision, error) {
	f.count.Add(1)
	if f.mode == ratelimit.FailLocal {
		return f.fallback.AllowN(ctx, key, n)
	}
	return f.answer(limit, alg, n), nil
}

// answer is the decision of FailOpen (allowed) or FailClosed (denied until
// the breaker probes again).
func (f *failure) answer(limit ratelimit.Limit, alg ratelimit.Algorithm, n int) ratelimit.Decision {
	if f.mode == ratelimit.FailOpen {
		return ratelimit.Decision{Allowed: true, Limit: limit, Algorithm: alg, Remaining: limit.Capacity(alg) - n}
	}
	return ratelimit.Decision{Limit: limit, Algorithm: alg, RetryAfter: f.openFor, ResetAfter: f.openFor}
}

// WithFailureMode makes AllowN decide without Redis, with a nil error, when
// a script call fails or takes longer than the timeout (WithTimeout, default
// 100ms): ratelimit.FailOpen allows, ratelimit.FailClosed denies, and
// ratelimit.FailLocal asks the limiter given with WithFallback. A circuit
// breaker (WithBreaker) then keeps decisions from calling Redis at all until
// a probe succeeds. Without this option AllowN returns Redis errors.
//
// The timeout is a context deadline on the call: go-redis honours it only
// when the client has ContextTimeoutEnabled (or ReadTimeout and WriteTimeout
// no longer than it). The hybrid limiter enforces its timeout by itself.
func WithFailureMode(m ratelimit.FailureMode) Option {
	return optionFunc(func(c *config) error {
		c.failMode = &m
		return nil
	})
}

// WithFallback is the limiter FailLocal decides with while Redis cannot
// answer, typically a local.Limiter with this instance's share of the limit
// (Rate / instances).
func WithFallback(l ratelimit.Limiter) Option {
	return optionFunc(func(c *config) error {
		c.fallback = l
		return nil
	})
}

// WithTimeout sets the deadline of every script call when WithFailureMode
// is given (default 100ms). d must be > 0.
func WithTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return option.Invalid("timeout must be > 0, got %v", d)
		}
		c.timeout = d
		return nil
	})
}

// WithBreaker sets the circuit breaker of WithFailureMode: after failures
// consecutive failed calls (default 3) decisions skip Redis for openFor
// (default 500ms), then one call probes.
func WithBreaker(failures int, openFor time.Duration) Option {
	return optionFunc(func(c *config) error {
		if failures < 1 || openFor <= 0 {
			return option.Invalid("breaker needs failures >= 1 and openFor > 0")
		}
		c.failures, c.openFor = failures, openFor
		return nil
	})
}

// WithInstances tells a FailLocal Limiter or Multi how many instances
// share the limit (default 1): while Redis cannot answer, a window's
// last-known remainder is shared among them, and a window that begins
// during the outage gets Rate / n here, for each limit of a Multi (see
// docs/failure-modes.md). n must be >= 1.
func WithInstances(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 {
			return option.Invalid("instances must be >= 1, got %d", n)
		}
		c.instances, c.instancesFn = n, nil
		return nil
	})
}

// WithInstancesFunc is WithInstances for a fleet whose size is learned as
// it runs: fn is asked at the start of each outage's window (values below
// 1 count as 1). fn must not be nil.
func WithInstancesFunc(fn func() int) Option {
	return optionFunc(func(c *config) error {
		if fn == nil {
			return option.Invalid("nil instances function")
		}
		c.instancesFn = fn
		return nil
	})
}

// Degraded reports whether the circuit breaker of WithFailureMode is open:
// decisions are being taken without Redis. It is false without
// WithFailureMode.
func (l *Limiter) Degraded() bool { return l.fail.degraded() }

// FallbackDecisions returns how many decisions were taken without Redis
// since New.
func (l *Limiter) FallbackDecisions() uint64 { return l.fail.decisions() }

// Degraded reports whether the circuit breaker of WithFailureMode is open:
// decisions are being taken without Redis. It is false without
// WithFailureMode.
func (m *Multi) Degraded() bool { return m.fail.degraded() }

// FallbackDecisions returns how many decisions were taken without Redis
// since NewMulti.
func (m *Multi) FallbackDecisions() uint64 { return m.fail.decisions() }

func (f *failure) degraded() bool { return f != nil && f.brk.State() != breaker.Closed }

func (f *failure) decisions() uint64 {
	if f == nil {
		return 0
	}
	return f.count.Load()
}
