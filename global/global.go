package global

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/redis/go-redis/v9"
)

var (
	//go:embed prelude.lua
	preludeLua string
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

// scripts holds one script per Algorithm, indexed by it.
// newScript builds a script from the shared prelude and its body.
func newScript(body string) *redis.Script { return redis.NewScript(preludeLua + body) }

var scripts = [...]*redis.Script{
	ratelimit.FixedWindow:   newScript(fixedWindowLua),
	ratelimit.SlidingWindow: newScript(slidingWindowLua),
	ratelimit.SlidingLog:    newScript(slidingLogLua),
	ratelimit.TokenBucket:   newScript(tokenBucketLua),
	ratelimit.GCRA:          newScript(gcraLua),
}

// DefaultAlgorithm is the Algorithm a Limiter uses when WithAlgorithm is not
// given: the two-window weighted counter, constant memory per key and no
// boundary burst.
const DefaultAlgorithm = ratelimit.SlidingWindow

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
	rest  [3]int64
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
	if isNil(client) {
		return nil, fmt.Errorf("%w: nil Redis client", ratelimit.ErrInvalidOption)
	}
	c := config{alg: DefaultAlgorithm, prefix: DefaultPrefix}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	if c.err != nil {
		return nil, c.err
	}
	if err := limit.Validate(); err != nil {
		return nil, err
	}
	if !c.alg.Valid() {
		return nil, fmt.Errorf("%w: %v", ratelimit.ErrInvalidAlgorithm, c.alg)
	}
	p := int64(limit.Period / time.Microsecond)
	l := &Limiter{client: client, limit: limit, alg: c.alg, prefix: c.prefix, clock: c.clock, script: scripts[c.alg]}
	f, err := newFailure(&c)
	if err != nil {
		return nil, err
	}
	l.fail = f
	switch c.alg {
	case ratelimit.TokenBucket:
		l.rest, l.nrest = [3]int64{int64(limit.Rate), p, int64(limit.Capacity()) * p}, 3
	case ratelimit.GCRA:
		if p < int64(limit.Rate) {
			return nil, fmt.Errorf("%w: GCRA needs Period in microseconds >= Rate, got %d/%v", ratelimit.ErrInvalidLimit, limit.Rate, limit.Period)
		}
		t := p / int64(limit.Rate)
		l.rest, l.nrest = [3]int64{t, int64(limit.Capacity()) * t}, 2
	default:
		l.rest, l.nrest = [3]int64{int64(limit.Rate), p}, 2
	}
	return l, nil
}

// isNil reports whether c is nil, or a nil pointer of a go-redis client type.
func isNil(c redis.UniversalClient) bool {
	switch v := c.(type) {
	case nil:
		return true
	case *redis.Client:
		return v == nil
	case *redis.ClusterClient:
		return v == nil
	case *redis.Ring:
		return v == nil
	}
	return false
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
	if err := ratelimit.CheckKey(key); err != nil {
		return ratelimit.Decision{}, err
	}
	if err := ratelimit.CheckN(l.limit, l.alg, n); err != nil {
		return ratelimit.Decision{}, err
	}
	base, err := KeyBase(l.prefix, key)
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
	for _, a := range l.rest[:l.nrest] {
		args = append(args, a)
	}
	if l.fail != nil {
		if !l.fail.brk.Allow() {
			return l.fail.decide(ctx, l.limit, key, n)
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.fail.timeout)
		defer cancel()
	}
	res, err := l.script.Run(ctx, l.client, []string{base}, args...).Int64Slice()
	if err != nil {
		if l.fail != nil && ctx.Err() != context.Canceled {
			l.fail.brk.Failure()
			return l.fail.decide(ctx, l.limit, key, n)
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
		Remaining:  int(max(res[1], 0)),
		RetryAfter: time.Duration(res[2]) * time.Microsecond,
		ResetAfter: time.Duration(res[3]) * time.Microsecond,
	}, nil
}

// config is what the Options set.
type config struct {
	alg      ratelimit.Algorithm
	prefix   string
	clock    func() time.Time
	err      error
	failMode *ratelimit.FailureMode
	fallback ratelimit.Limiter
	timeout  time.Duration
	failures int
	openFor  time.Duration
}

// Option configures a Limiter made by New. The zero set of options gives
// DefaultAlgorithm, DefaultPrefix and the Redis server's clock.
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithAlgorithm selects how the Limiter counts; the default is
// DefaultAlgorithm (SlidingWindow). New rejects an unknown Algorithm with
// ratelimit.ErrInvalidAlgorithm.
func WithAlgorithm(a ratelimit.Algorithm) Option {
	return optionFunc(func(c *config) { c.alg = a })
}

// WithPrefix sets the first part of every Redis key the Limiter writes; the
// default is DefaultPrefix. Limiters that share a prefix (and a Limit and
// Algorithm) share their counts. New rejects an empty prefix or one holding
// '{' or '}' (which would break the Cluster hash tag) with
// ratelimit.ErrInvalidOption.
func WithPrefix(prefix string) Option {
	return optionFunc(func(c *config) {
		if prefix == "" || strings.ContainsAny(prefix, "{}") {
			c.err = errors.Join(c.err, fmt.Errorf("%w: prefix %q must be non-empty and hold no braces", ratelimit.ErrInvalidOption, prefix))
			return
		}
		c.prefix = prefix
	})
}

// WithClock makes the scripts use now() instead of the Redis server's TIME,
// passed to them in microseconds. It is meant for tests; in production every
// instance should count on the server's clock, the default. A nil now
// restores the default. AllowN returns an error wrapping
// ratelimit.ErrInvalidOption when now returns a time before the Unix epoch.
func WithClock(now func() time.Time) Option {
	return optionFunc(func(c *config) { c.clock = now })
}
