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
	"github.com/hybridlimit/ratelimit/internal/option"
	"github.com/hybridlimit/ratelimit/internal/script"
)

var (
	//go:embed algorithms.lua
	algorithmsLua string
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
// module's shared Lua prelude and the package's algorithms.lua.
var scripts = [...]*redis.Script{
	ratelimit.FixedWindow:   script.New(algorithmsLua + fixedWindowLua),
	ratelimit.SlidingWindow: script.New(algorithmsLua + slidingWindowLua),
	ratelimit.SlidingLog:    script.New(algorithmsLua + slidingLogLua),
	ratelimit.TokenBucket:   script.New(algorithmsLua + tokenBucketLua),
	ratelimit.GCRA:          script.New(algorithmsLua + gcraLua),
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

	kind    string        // the counters' kind (script.Kind)
	fail    *failure      // nil unless WithFailureMode was given
	ledger  *ledger       // FailLocal with a window algorithm: the outage bound (ledger.go)
	buckets *bucketLedger // FailLocal with a bucket: what local admissions owe (ledger.go)
	plain   *plainPath    // FixedWindow: decisions as plain commands (plain.go)
	set     limitSet      // the one limit, for Reserve
}

var _ ratelimit.Limiter = (*Limiter)(nil)

// New returns a Limiter that enforces limit per key through client.
//
// It returns an error wrapping ratelimit.ErrInvalidLimit when limit does not
// pass Limit.ValidateFor its algorithm, or, for GCRA, when Period in microseconds is below
// Rate (the emission interval would be zero); ratelimit.ErrInvalidAlgorithm
// for an unknown algorithm; and ratelimit.ErrInvalidOption for a nil client
// or an option out of range. New does not talk to Redis.
func New(client redis.UniversalClient, limit ratelimit.Limit, opts ...Option) (*Limiter, error) {
	c, err := newConfig(client, opts)
	if err != nil {
		return nil, err
	}
	if c.algs != nil {
		if len(c.algs) != 1 {
			return nil, fmt.Errorf("%w: %d algorithms for one limit", ratelimit.ErrInvalidOption, len(c.algs))
		}
		if c.alg = c.algs[0]; !c.alg.Valid() {
			return nil, fmt.Errorf("%w: %v", ratelimit.ErrInvalidAlgorithm, c.alg)
		}
	}
	if err := limit.ValidateFor(c.alg); err != nil {
		return nil, err
	}
	p := int64(limit.Period / time.Microsecond)
	l := &Limiter{client: client, limit: limit, alg: c.alg, prefix: c.prefix, clock: c.clock, script: scripts[c.alg], kind: script.Kind(c.alg, limit)}
	if l.fail, err = newFailure(&c); err != nil {
		return nil, err
	}
	if l.fail != nil && l.fail.mode == ratelimit.FailLocal {
		switch c.alg {
		case ratelimit.FixedWindow, ratelimit.SlidingWindow:
			l.ledger = newLedger([]ratelimit.Limit{limit}, []ratelimit.Algorithm{c.alg}, l.fail.settle(), c.instancesFunc())
		case ratelimit.TokenBucket, ratelimit.GCRA:
			l.buckets = newBucketLedger()
		}
	}
	if c.alg == ratelimit.FixedWindow {
		l.plain = newPlainPath(client, limit.Period, c.clock != nil)
	}
	l.set = newLimitSet([]ratelimit.Limit{limit}, []ratelimit.Algorithm{c.alg}, false)
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
	now, err := clockArg(l.clock)
	if err != nil {
		return ratelimit.Decision{}, err
	}
	args := make([]any, 0, 6)
	args = append(args, now, n)
	args = append(args, l.rest[:l.nrest]...)
	if l.ledger != nil {
		return l.decideLedger(ctx, key, base, n, args)
	}
	if l.buckets != nil {
		return l.decideBucket(ctx, key, base, n, args)
	}
	var res []int64
	fallback, err := l.fail.run(ctx, func(ctx context.Context) error {
		var err error
		if l.alg == ratelimit.FixedWindow {
			res, _, err = l.take(ctx, base, n, 0, 0)
			return err
		}
		res, err = l.script.Run(ctx, l.client, []string{base}, args...).Int64Slice()
		return err
	})
	switch {
	case fallback:
		return l.fail.decide(ctx, l.limit, l.alg, key, n)
	case err != nil && callerEnded(ctx) != nil:
		return ratelimit.Decision{}, err // the caller gave up, not Redis
	case err != nil:
		return ratelimit.Decision{}, wrapScriptErr(l.alg, err)
	}
	return l.decision(res)
}

// take decides n units of a FixedWindow key: as plain commands when it
// can (plain.go), else with take.lua, the hybrid's exact call: a few
// commands, no shared prelude (a fixed window needs none of it), so about
// half the Redis CPU of the algorithm scripts. It first adds use units
// admitted on credit to window win, when that is the current one
// (reporting whether it did), and returns the reply as the algorithm
// scripts give it: allowed, remaining, retry and reset (µs), and then the
// window it counted in (reset, taken from an estimate of Redis' clock on
// the plain path, cannot tell it near a window's end).
func (l *Limiter) take(ctx context.Context, base string, n int, win, use int64) ([]int64, bool, error) {
	var charged bool
	if l.plain != nil {
		res, ch, ok, err := l.takePlain(ctx, base, n, win, use)
		if ok || err != nil {
			return res, ch, err
		}
		if ch {
			use, charged = 0, true // counted by a reply that came too late to decide
		}
	}
	a := script.TakeArgs{Base: base, Kind: l.kind, Limit: l.limit, N: int64(n), AdjustIdx: win, Use: use}
	if l.clock != nil {
		a.Now = l.clock().UnixMicro()
	}
	var before int64
	if l.plain != nil {
		before = l.plain.mono()
	}
	v, err := script.Take.Run(ctx, l.client, a.Keys(), a.Args()...).Result()
	if err != nil {
		return nil, charged, err
	}
	r, err := script.ParseTake(v)
	if err != nil {
		return nil, charged, err
	}
	if l.plain != nil && a.Now == 0 {
		l.plain.observe(r.Now, before, l.plain.mono())
	}
	p := int64(l.limit.Period / time.Microsecond)
	reset := (r.Idx+1)*p - r.Now
	res := []int64{0, int64(l.limit.Rate) - r.Count, reset, reset, r.Idx}
	if r.Admitted {
		res[0], res[2] = 1, 0
	}
	return res, r.Adjusted || charged, nil
}

func wrapScriptErr(alg ratelimit.Algorithm, err error) error {
	return fmt.Errorf("global: %v script: %w", alg, err)
}

// decision reads a script's reply (or take's, which adds a fifth value).
func (l *Limiter) decision(res []int64) (ratelimit.Decision, error) {
	if len(res) != 4 && len(res) != 5 {
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

// Reserve decides as AllowN(ctx, key, estimate) (without the failure mode:
// a Redis error is returned) and returns the decision as a
// ratelimit.Reservation, to be settled with the actual cost (see
// ratelimit.Reservation for the model, docs/algorithms.md for each
// algorithm's rule). It counts in the same state as AllowN. Settling is one
// script call that applies the settlement at most once, whatever replies
// are lost (see SettleRecordTTL). It returns an error wrapping
// ratelimit.ErrInvalidAlgorithm for SlidingLog, whose log of at most Rate
// events per key cannot hold an overdraft.
func (l *Limiter) Reserve(ctx context.Context, key string, estimate int) (*ratelimit.Reservation, error) {
	return l.set.reserve(ctx, l.client, l.prefix, l.clock, key, estimate)
}

// clockArg returns the now argument of a script: "" for Redis TIME, or
// clock's time in microseconds.
func clockArg(clock func() time.Time) (any, error) {
	if clock == nil {
		return "", nil
	}
	us := clock().UnixMicro()
	if us < 0 {
		return nil, fmt.Errorf("%w: WithClock returned a time before the Unix epoch", ratelimit.ErrInvalidOption)
	}
	return us, nil
}

// config is what the Options set.
type config struct {
	alg      ratelimit.Algorithm
	algs     []ratelimit.Algorithm // WithAlgorithms; nil: alg for every limit
	prefix   string
	clock    func() time.Time
	failMode *ratelimit.FailureMode
	fallback ratelimit.Limiter
	timeout  time.Duration
	failures int
	openFor  time.Duration
	// the fleet size FailLocal shares a window's remainder among
	instances   int
	instancesFn func() int
}

// instancesFunc returns the fleet size the options give: WithInstancesFunc,
// else WithInstances, else 1.
func (c *config) instancesFunc() func() int {
	if c.instancesFn != nil {
		return c.instancesFn
	}
	n := max(1, c.instances)
	return func() int { return n }
}

// Option configures a Limiter made by New. The zero set of options gives
// DefaultAlgorithm, DefaultPrefix and the Redis server's clock. New ignores
// a nil Option and returns the error of the first Option out of range.
// Options are applied in order: a later one overrides an earlier one of
// the same kind.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

// newConfig checks client and applies opts over the defaults.
func newConfig(client redis.UniversalClient, opts []Option) (config, error) {
	c := config{alg: DefaultAlgorithm, prefix: DefaultPrefix}
	if script.IsNilClient(client) {
		return c, fmt.Errorf("%w: nil Redis client", ratelimit.ErrInvalidOption)
	}
	err := option.Apply(&c, opts, Option.apply)
	return c, err
}

// algorithmsFor returns the algorithm of each of k limits.
func (c *config) algorithmsFor(k int) []ratelimit.Algorithm {
	if c.algs != nil {
		return c.algs
	}
	algs := make([]ratelimit.Algorithm, k)
	for i := range algs {
		algs[i] = c.alg
	}
	return algs
}

// WithAlgorithm selects how the Limiter counts (for NewMulti: every
// limit); the default is DefaultAlgorithm (FixedWindow). New rejects an
// unknown Algorithm with ratelimit.ErrInvalidAlgorithm.
func WithAlgorithm(a ratelimit.Algorithm) Option {
	return optionFunc(func(c *config) error {
		if !a.Valid() {
			return fmt.Errorf("%w: %v", ratelimit.ErrInvalidAlgorithm, a)
		}
		c.alg, c.algs = a, nil
		return nil
	})
}

// WithAlgorithms selects the Algorithm of each limit of NewMulti, in the
// order of its limits: one per limit, or NewMulti returns an error
// wrapping ratelimit.ErrInvalidOption (New takes exactly one). It and
// WithAlgorithm override each other, the later winning.
func WithAlgorithms(algs ...ratelimit.Algorithm) Option {
	algs = append(make([]ratelimit.Algorithm, 0, len(algs)), algs...) // never nil: none is an error
	return optionFunc(func(c *config) error {
		c.algs = algs
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
			return option.Invalid("prefix %q must be non-empty and hold no braces", prefix)
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
