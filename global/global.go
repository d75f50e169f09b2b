package global

import (
	"context"
	_ "embed"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/check"
	"github.com/hybridlimit/ratelimit/internal/script"
)

var (
	//go:embed fixed_window.lua
	fixedWindowLua string
	//go:embed sliding_window.lua
	slidingWindowLua string
	//go:embed sliding_log.lua
	slidingLogLua string
	//go:embed token_bucket.lua
	tokenBucketLua string
	//go:embed gcra.lua
	gcraLua string
)

// scripts holds one script per Algorithm, indexed by it, each built on the
// module's shared Lua prelude.
var scripts = [...]*redis.Script{
	ratelimit.FixedWindow:   script.New(fixedWindowLua),
	ratelimit.SlidingWindow: script.New(slidingWindowLua),
	ratelimit.SlidingLog:    script.New(slidingLogLua),
	ratelimit.TokenBucket:   script.New(tokenBucketLua),
	ratelimit.GCRA:          script.New(gcraLua),
}

// DefaultAlgorithm is the Algorithm a Limiter uses when WithAlgorithm is not
// given: FixedWindow, as for the hybrid and local limiters, so that limiters
// of every package left on their defaults with one prefix share one quota.
const DefaultAlgorithm = ratelimit.FixedWindow

// DefaultPrefix is the Redis key prefix used when WithPrefix is not given.
const DefaultPrefix = script.DefaultPrefix

// Limiter is an exact rate limiter whose state lives in Redis: each AllowN is
// one atomic Lua script call, so every process that uses the same Redis, the
// same prefix and the same Limit and Algorithm enforces one shared limit per
// key.
//
// A Limiter is made by New; the zero value is not usable. It is safe for
// concurrent use by multiple goroutines. It holds no resources of its own:
// the caller owns, and closes, the Redis client.
type Limiter struct {
	client redis.UniversalClient
	limit  ratelimit.Limit
	alg    ratelimit.Algorithm
	prefix string
	clock  func() time.Time
	script *redis.Script
	// args after ARGV[1] (now) and ARGV[2] (n); fixed for the Limiter.
	rest  [4]any
	nrest int

	fail *failure // nil unless WithFailureMode was given
}

var _ ratelimit.Limiter = (*Limiter)(nil)

// New returns a Limiter that enforces limit per key through client.
//
// It returns an error wrapping ratelimit.ErrInvalidLimit when limit does not
// pass Limit.Validate, or, for GCRA, when Period in microseconds is below
// Rate (the emission interval would be zero); ratelimit.ErrInvalidAlgorithm
// for an unknown algorithm; and ratelimit.ErrInvalidOption for a nil client
// or an option out of range. New does not talk to Redis.
func New(client redis.UniversalClient, limit ratelimit.Limit, opts ...Option) (*Limiter, error) {
	if script.IsNilClient(client) {
		return nil, fmt.Errorf("%w: nil Redis client", ratelimit.ErrInvalidOption)
	}
	c := config{alg: DefaultAlgorithm, prefix: DefaultPrefix}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o.apply(&c); err != nil {
			return nil, err
		}
	}
	if err := limit.Validate(); err != nil {
		return nil, err
	}
	p := int64(limit.Period / time.Microsecond)
	l := &Limiter{client: client, limit: limit, alg: c.alg, prefix: c.prefix, clock: c.clock, script: scripts[c.alg]}
	f, err := newFailure(&c)
	if err != nil {
		return nil, err
	}
	l.fail = f
	kind := script.Kind(c.alg, limit) // the last ARGV of every script
	switch c.alg {
	case ratelimit.TokenBucket:
		l.rest, l.nrest = [4]any{int64(limit.Rate), p, int64(limit.Capacity(c.alg)) * p, kind}, 4
	case ratelimit.GCRA:
		if p < int64(limit.Rate) {
			return nil, fmt.Errorf("%w: GCRA needs Period in microseconds >= Rate, got %d/%v", ratelimit.ErrInvalidLimit, limit.Rate, limit.Period)
		}
		t := p / int64(limit.Rate)
		l.rest, l.nrest = [4]any{t, int64(limit.Capacity(c.alg)) * t, kind}, 3
	default: // the windows and the log
		l.rest, l.nrest = [4]any{int64(limit.Rate), p, kind}, 3
	}
	return l, nil
}

// Limit returns the Limit the Limiter enforces.
func (l *Limiter) Limit() ratelimit.Limit { return l.limit }

// Algorithm returns the Algorithm the Limiter counts with.
func (l *Limiter) Algorithm() ratelimit.Algorithm { return l.alg }

// Allow is AllowN(ctx, key, 1).
func (l *Limiter) Allow(ctx context.Context, key string) (ratelimit.Decision, error) {
	return l.AllowN(ctx, key, 1)
}

// AllowN reports whether n events for key may happen now and, if so,
// consumes them, in one atomic script call on the Redis node that owns key.
// Admission is all-or-nothing; a denied request changes nothing in Redis.
//
// It returns an error wrapping ratelimit.ErrInvalidKey for an empty key or
// ratelimit.ErrInvalidN for n <= 0 or n above the capacity (Rate for the
// window algorithms, Burst for the buckets), before any Redis call; and the
// Redis error (or ctx's) when the script cannot run, with a zero Decision.
func (l *Limiter) AllowN(ctx context.Context, key string, n int) (ratelimit.Decision, error) {
	if err := check.Key(key); err != nil {
		return ratelimit.Decision{}, err
	}
	if err := check.N(l.limit, l.alg, n); err != nil {
		return ratelimit.Decision{}, err
	}
	base, err := script.KeyBase(l.prefix, key)
	if err != nil {
		return ratelimit.Decision{}, err
	}
	var now any = ""
	if l.clock != nil {
		us := l.clock().UnixMicro()
		if us < 0 {
			return ratelimit.Decision{}, fmt.Errorf("%w: WithClock returned a time before the Unix epoch", ratelimit.ErrInvalidOption)
		}
		now = us
	}
	args := make([]any, 0, 5)
	args = append(args, now, n)
	args = append(args, l.rest[:l.nrest]...)
	callCtx := ctx
	if l.fail != nil {
		if err := ctx.Err(); err != nil {
			// The caller's own deadline or cancellation says nothing of
			// Redis: it must not reach the breaker.
			return ratelimit.Decision{}, err
		}
		if !l.fail.brk.Allow() {
			return l.fail.decide(ctx, l.limit, l.alg, key, n)
		}
		var cancel context.CancelFunc
		callCtx, cancel = context.WithTimeout(ctx, l.fail.timeout)
		defer cancel()
	}
	res, err := l.script.Run(callCtx, l.client, []string{base}, args...).Int64Slice()
	if err != nil {
		if cerr := callerEnded(ctx); cerr != nil {
			return ratelimit.Decision{}, cerr // the caller gave up, not Redis
		}
		if l.fail != nil {
			l.fail.brk.Failure()
			return l.fail.decide(ctx, l.limit, l.alg, key, n)
		}
		return ratelimit.Decision{}, fmt.Errorf("global: %v script: %w", l.alg, err)
	}
	if l.fail != nil {
		l.fail.brk.Success()
	}
	if len(res) != 4 {
		return ratelimit.Decision{}, fmt.Errorf("global: %v script returned %d values, want 4", l.alg, len(res))
	}
	return ratelimit.Decision{
		Allowed:    res[0] == 1,
		Limit:      l.limit,
		Algorithm:  l.alg,
		Remaining:  int(max(res[1], 0)),
		RetryAfter: time.Duration(res[2]) * time.Microsecond,
		ResetAfter: time.Duration(res[3]) * time.Microsecond,
	}, nil
}

// callerEnded returns ctx's error once ctx has ended, and
// context.DeadlineExceeded once its deadline has passed even if ctx is not
// marked done yet: go-redis sets the socket's deadline from ctx's, and the
// read that times out can return a moment before ctx's own timer fires.
func callerEnded(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// config is what the Options set.
type config struct {
	alg      ratelimit.Algorithm
	prefix   string
	clock    func() time.Time
	failMode *ratelimit.FailureMode
	fallback ratelimit.Limiter
	timeout  time.Duration
	failures int
	openFor  time.Duration
}

// Option configures a Limiter made by New. The zero set of options gives
// DefaultAlgorithm, DefaultPrefix and the Redis server's clock. New ignores
// a nil Option and returns the error of the first Option out of range.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

// WithAlgorithm selects how the Limiter counts; the default is
// DefaultAlgorithm (FixedWindow). New rejects an unknown Algorithm with
// ratelimit.ErrInvalidAlgorithm.
func WithAlgorithm(a ratelimit.Algorithm) Option {
	return optionFunc(func(c *config) error {
		if !a.Valid() {
			return fmt.Errorf("%w: %v", ratelimit.ErrInvalidAlgorithm, a)
		}
		c.alg = a
		return nil
	})
}

// WithPrefix sets the first part of every Redis key the Limiter writes; the
// default is DefaultPrefix. Limiters that share a prefix (and a Limit and
// Algorithm) share their counts. New rejects an empty prefix or one holding
// '{' or '}' (which would break the Cluster hash tag) with
// ratelimit.ErrInvalidOption.
func WithPrefix(prefix string) Option {
	return optionFunc(func(c *config) error {
		if prefix == "" || strings.ContainsAny(prefix, "{}") {
			return fmt.Errorf("%w: prefix %q must be non-empty and hold no braces", ratelimit.ErrInvalidOption, prefix)
		}
		c.prefix = prefix
		return nil
	})
}

// WithClock makes the scripts use now() instead of the Redis server's TIME,
// passed to them in microseconds. It is meant for tests; in production every
// instance should count on the server's clock, the default. A nil now
// restores the default. AllowN returns an error wrapping
// ratelimit.ErrInvalidOption when now returns a time before the Unix epoch.
func WithClock(now func() time.Time) Option {
	return optionFunc(func(c *config) error {
		c.clock = now
		return nil
	})
}
