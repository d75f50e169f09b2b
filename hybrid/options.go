package hybrid

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/option"
	"github.com/hybridlimit/ratelimit/internal/script"
)

// Mode selects how strictly the hybrid limiter backs its decisions with
// quota granted by Redis.
type Mode int

const (
	// Strict (the default): every allowed decision is backed by quota that
	// Redis granted atomically, so per window the fleet never allows more
	// than the limit while Redis is reachable.
	Strict Mode = iota
	// Optimistic: when its lease runs dry an instance may admit up to a
	// local share of the limit per window on credit, without waiting for
	// Redis, and reports that usage at the next sync. Per window the fleet
	// may overshoot the limit by at most the sum of the instances' shares
	// (see docs/tuning.md).
	Optimistic
)

// String returns "strict" or "optimistic".
func (m Mode) String() string {
	switch m {
	case Strict:
		return "strict"
	case Optimistic:
		return "optimistic"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Defaults of the options.
const (
	DefaultSyncInterval    = 100 * time.Millisecond
	DefaultMaxKeys         = 100_000
	DefaultTimeout         = 500 * time.Millisecond
	DefaultBreakerFailures = 3
	DefaultBreakerOpenFor  = 500 * time.Millisecond
)

const (
	heartbeatEvery          = time.Second
	instanceLivenessFactor  = 3 // an instance counts as alive for 3 heartbeats
	optimisticShareDivisor  = 8 // optimistic share = Rate / (8 x instances)
	defaultFinalFlushBudget = 2 * time.Second
	offsetMaxAge            = 10 * time.Second
	maxLeaseAttempts        = 32 // synchronous lease calls one decision may make, within its one timeout
	minCallTimeout          = time.Second
	syncBatch               = 4096 // lease calls per pipeline
	pipelinesPerNode        = 16   // most decisions' pipelines in flight at once to one Redis node (see queue)
	maxFlushPasses          = 3
	unknownFleet            = 16 // instances assumed before a heartbeat ever told the fleet size
	lastErrKeep             = 10 * time.Second
	idlePeriods             = 2 // a key unused for this many periods leaves the table
)

type config struct {
	algorithm       ratelimit.Algorithm
	algorithms      []ratelimit.Algorithm // WithAlgorithms; nil: algorithm for every limit
	syncInterval    time.Duration
	maxKeys         int
	prefix          string
	mode            Mode
	timeout         time.Duration
	failure         ratelimit.FailureMode
	instances       int
	breakerFailures int
	breakerOpenFor  time.Duration
	heartbeatEvery  time.Duration
	instanceID      string
	holder          string // names the Limiter's records of held tokens (see newConfig)
	observer        func(Event)
	clock           func() time.Time // WithClock; nil: time.Now and Redis TIME
}

// now returns the time by the configured clock.
func (c *config) now() time.Time {
	if c.clock != nil {
		return c.clock()
	}
	return time.Now()
}

// callTimeout is the deadline of one Redis call. It is longer than the
// timeout a decision waits: a reply that comes late is still installed
// (and tells the breaker Redis answers), rather than lost and sent again.
func (c *config) callTimeout() time.Duration {
	return max(minCallTimeout, 4*c.timeout)
}

// drainTimeout is the longest Flush and Close take: max(2s, 5 timeouts).
func (c *config) drainTimeout() time.Duration { return max(defaultFinalFlushBudget, 5*c.timeout) }

func defaultConfig() config {
	return config{
		algorithm:       ratelimit.FixedWindow,
		syncInterval:    DefaultSyncInterval,
		maxKeys:         DefaultMaxKeys,
		prefix:          script.DefaultPrefix,
		mode:            Strict,
		timeout:         DefaultTimeout,
		failure:         ratelimit.FailLocal,
		breakerFailures: DefaultBreakerFailures,
		breakerOpenFor:  DefaultBreakerOpenFor,
		heartbeatEvery:  heartbeatEvery,
	}
}

// newConfig applies opts over the defaults, ignoring a nil Option, and
// draws an instance ID unless one was given.
func newConfig(opts []Option) (config, error) {
	cfg := defaultConfig()
	if err := option.Apply(&cfg, opts, Option.apply); err != nil {
		return cfg, err
	}
	if cfg.instanceID == "" {
		var b [9]byte
		if _, err := rand.Read(b[:]); err != nil {
			return cfg, err
		}
		cfg.instanceID = base64.RawURLEncoding.EncodeToString(b[:])
	}
	// The name this Limiter's records of held tokens go by (bucket.lua):
	// its own, as Limiters of one process may share an instance id.
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return cfg, err
	}
	cfg.holder = cfg.instanceID + "." + base64.RawURLEncoding.EncodeToString(b[:])
	return cfg, nil
}

// Option configures a Limiter in New (and NewMulti). New ignores a nil
// Option, as packages local, global and sync do, and returns the error of
// the first Option out of range. Options are applied in order: a later one
// overrides an earlier one of the same kind.
type Option interface{ apply(*config) error }

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

// invalid is the error of an option out of range.
func invalid(format string, args ...any) error { return option.Invalid(format, args...) }

// WithAlgorithm selects the algorithm: ratelimit.FixedWindow (the default)
// or ratelimit.SlidingWindow, leased as slices of a window's quota, or
// ratelimit.TokenBucket or ratelimit.GCRA, leased as tokens taken from the
// key's bucket. Each shares its state with a global limiter of the same
// algorithm, limit and prefix. SlidingLog cannot be leased in slices (its
// state is every event's time) and is rejected with
// ratelimit.ErrInvalidAlgorithm; use the global package for it.
//
// For NewMulti it selects the algorithm of every limit.
func WithAlgorithm(a ratelimit.Algorithm) Option {
	return optionFunc(func(c *config) error {
		if err := leasable(a); err != nil {
			return err
		}
		c.algorithm, c.algorithms = a, nil
		return nil
	})
}

// WithAlgorithms selects the Algorithm of each limit of NewMulti, in the
// order of its limits (each one WithAlgorithm accepts): one per limit, or
// NewMulti returns an error wrapping ratelimit.ErrInvalidOption (New takes
// exactly one). It and WithAlgorithm override each other, the later
// winning.
func WithAlgorithms(algs ...ratelimit.Algorithm) Option {
	algs = append(make([]ratelimit.Algorithm, 0, len(algs)), algs...) // never nil: none is an error
	return optionFunc(func(c *config) error {
		for _, a := range algs {
			if err := leasable(a); err != nil {
				return err
			}
		}
		c.algorithms = algs
		return nil
	})
}

// leasable reports whether the hybrid can lease algorithm a.
func leasable(a ratelimit.Algorithm) error {
	if a != ratelimit.FixedWindow && a != ratelimit.SlidingWindow && !isBucket(a) {
		return fmt.Errorf("%w: the hybrid limiter leases FixedWindow, SlidingWindow, TokenBucket and GCRA, not %v", ratelimit.ErrInvalidAlgorithm, a)
	}
	return nil
}

// WithSyncInterval sets how often the background syncer reconciles with
// Redis (default 100ms). Shorter intervals mean smaller leases and fresher
// counts for more round trips; see docs/tuning.md.
func WithSyncInterval(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d < time.Millisecond {
			return invalid("sync interval must be >= 1ms, got %v", d)
		}
		c.syncInterval = d
		return nil
	})
}

// WithMaxKeys bounds the keys tracked in memory (default DefaultMaxKeys,
// also what 0 means). The least recently used key beyond it is evicted;
// its unused lease is returned to Redis at the next sync. New rejects a
// negative n.
func WithMaxKeys(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 0 {
			return invalid("max keys must be >= 0, got %d", n)
		}
		if n == 0 {
			n = DefaultMaxKeys
		}
		c.maxKeys = n
		return nil
	})
}

// WithPrefix sets the Redis key prefix (default "ratelimit"). Limiters that
// share a prefix, limit and algorithm, hybrid or global, share one quota.
func WithPrefix(p string) Option {
	return optionFunc(func(c *config) error {
		if p == "" || strings.ContainsAny(p, "{}") {
			return invalid("prefix %q must be non-empty and hold no braces (they would break the Cluster hash tag)", p)
		}
		c.prefix = p
		return nil
	})
}

// WithMode selects Strict (the default) or Optimistic.
func WithMode(m Mode) Option {
	return optionFunc(func(c *config) error {
		if m != Strict && m != Optimistic {
			return invalid("unknown mode %v", m)
		}
		c.mode = m
		return nil
	})
}

// WithTimeout sets how long a decision waits on Redis at most (default
// DefaultTimeout, 500ms). A Redis call gets four times as long (at least
// 1s) before it counts as lost.
func WithTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return invalid("timeout must be > 0, got %v", d)
		}
		c.timeout = d
		return nil
	})
}

// WithFailureMode selects what a decision does when Redis cannot answer in
// time and the key has no leased quota left: ratelimit.FailLocal (the
// default: this instance's share, Rate / instances, per window, reported to
// Redis when it is back), ratelimit.FailOpen or ratelimit.FailClosed. Quota
// already leased is always served first.
func WithFailureMode(f ratelimit.FailureMode) Option {
	return optionFunc(func(c *config) error {
		if !f.Valid() {
			return invalid("unknown failure mode %v", f)
		}
		c.failure = f
		return nil
	})
}

// WithInstances fixes the number of instances sharing the quota. By default
// (0) each instance heartbeats to Redis and learns how many are alive. The
// number sizes leases (a lease takes at most remainder / instances),
// the optimistic share, and the FailLocal budget (Rate / instances).
func WithInstances(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 0 {
			return invalid("instances must be >= 0, got %d", n)
		}
		c.instances = n
		return nil
	})
}

// WithBreaker sets the circuit breaker: after failures consecutive failed
// Redis calls (default 3) no decision waits on Redis for openFor (default
// 500ms); then one call probes, and the background syncer probes too.
func WithBreaker(failures int, openFor time.Duration) Option {
	return optionFunc(func(c *config) error {
		if failures < 1 || openFor <= 0 {
			return invalid("breaker needs failures >= 1 and openFor > 0, got %d, %v", failures, openFor)
		}
		c.breakerFailures, c.breakerOpenFor = failures, openFor
		return nil
	})
}

// WithInstanceID names this instance in the fleet registry (default:
// random), where heartbeats count the instances that share a quota.
// Limiters of one process on one prefix may share an id, so the process
// counts once; two processes must never share one, or the fleet looks
// smaller than it is (larger leases, and a larger FailLocal budget, per
// instance).
func WithInstanceID(id string) Option {
	return optionFunc(func(c *config) error {
		if id == "" {
			return invalid("empty instance id")
		}
		c.instanceID = id
		return nil
	})
}

// WithObserver registers fn to receive Events (degraded, recovered, flush
// errors). fn runs on the limiter's goroutines and must not block.
func WithObserver(fn func(Event)) Option {
	return optionFunc(func(c *config) error {
		c.observer = fn
		return nil
	})
}

// WithClock makes the Limiter read the time from now, and pass it to its
// Redis scripts in place of the server's TIME, so that tests and
// simulations drive windows, leases and buckets without sleeping. now must
// be safe for concurrent use, and every limiter that shares keys with this
// one (hybrid or global, WithClock too) must read the same clock. A nil
// now, like no WithClock at all, selects the default: the process's clock
// for leases, and Redis server time for windows, which production fleets
// must use (instances with skewed clocks then still count in one window).
func WithClock(now func() time.Time) Option {
	return optionFunc(func(c *config) error {
		c.clock = now
		return nil
	})
}
