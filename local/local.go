package local

import (
	"context"
	"fmt"
	"time"
	"unsafe"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/check"
	"github.com/hybridlimit/ratelimit/internal/memkey"
	"github.com/hybridlimit/ratelimit/internal/option"
)

// DefaultAlgorithm is the Algorithm of a Limiter built without
// WithAlgorithm: FixedWindow, the same default as packages global and
// hybrid.
const DefaultAlgorithm = ratelimit.FixedWindow

// An Option configures a Limiter. Options are made by WithAlgorithm,
// WithAlgorithms, WithMaxKeys and WithClock; New ignores a nil Option, as
// packages global, hybrid and sync do. Options are applied in order: a
// later one overrides an earlier one of the same kind.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	algorithm  ratelimit.Algorithm
	algorithms []ratelimit.Algorithm // WithAlgorithms; nil: algorithm for every limit
	maxKeys    int
	clock      func() time.Time
}

// WithAlgorithm selects how the Limiter counts (for NewMulti: every limit).
// The default is DefaultAlgorithm (FixedWindow). New rejects an unknown
// Algorithm with an error wrapping ratelimit.ErrInvalidAlgorithm.
func WithAlgorithm(a ratelimit.Algorithm) Option {
	return optionFunc(func(c *config) error {
		if !a.Valid() {
			return fmt.Errorf("%w: %v", ratelimit.ErrInvalidAlgorithm, a)
		}
		c.algorithm, c.algorithms = a, nil
		return nil
	})
}

// WithAlgorithms selects the Algorithm of each limit of NewMulti, in the
// order of its limits: one per limit, or NewMulti returns an error wrapping
// ratelimit.ErrInvalidOption (New takes exactly one). It and WithAlgorithm
// override each other, the later winning.
func WithAlgorithms(algs ...ratelimit.Algorithm) Option {
	algs = append(make([]ratelimit.Algorithm, 0, len(algs)), algs...) // never nil: none is an error
	return optionFunc(func(c *config) error {
		c.algorithms = algs
		return nil
	})
}

// newConfig applies opts over the defaults, ignoring a nil Option.
func newConfig(opts []Option) (config, error) {
	cfg := config{algorithm: DefaultAlgorithm}
	err := option.Apply(&cfg, opts, Option.apply)
	return cfg, err
}

// algorithmsFor returns the algorithm of each of k limits.
func (c *config) algorithmsFor(k int) []ratelimit.Algorithm {
	if c.algorithms != nil {
		return c.algorithms
	}
	algs := make([]ratelimit.Algorithm, k)
	for i := range algs {
		algs[i] = c.algorithm
	}
	return algs
}

// WithMaxKeys bounds the number of keys whose state the Limiter keeps; when
// a shard of the key table is full, a key unused for long (see Limiter) is
// forgotten, and its next request starts afresh, as a key never seen.
// 0 means DefaultMaxKeys, as in package hybrid; New rejects a negative n
// with ratelimit.ErrInvalidOption.
//
// It bounds the Limiter's memory whatever keys it is given: at most 400
// bytes per key (see Limiter), so n x 400 bytes in the worst case, plus 8
// bytes per logged event for SlidingLog.
func WithMaxKeys(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 0 {
			return option.Invalid("max keys must be >= 0, got %d", n)
		}
		c.maxKeys = n
		return nil
	})
}

// WithClock makes the Limiter read the time from now, for tests and
// simulations. now must be safe for concurrent use if the Limiter is used
// concurrently. The Limiter counts in whole microseconds of
// now().UnixMicro().
//
// A nil now, like no WithClock at all, selects the default clock: the wall
// clock, as time.Now, but read for half its cost (the wall time at an anchor
// plus the monotonic time elapsed since, re-anchored on time.Now every
// second; a step of the system clock is followed within a second).
func WithClock(now func() time.Time) Option {
	return optionFunc(func(c *config) error {
		c.clock = now
		return nil
	})
}

// Limiter is an in-process rate limiter that enforces one Limit per key with
// one of the five algorithms of package ratelimit, to the exact semantics of
// docs/algorithms.md (the same decisions, to the microsecond, as package
// global on Redis given the same clock).
//
// The state of each key lives in a bounded, sharded LRU table (see Table).
// A decision on a key takes only the lock of that key's shard, for tens of
// nanoseconds, and allocates nothing unless the key is new.
//
// Recency is tracked lazily: a key is moved to the front of its shard's LRU
// list only once it has drifted past the first three quarters of the list,
// so a key is forgotten only after at least a quarter of its shard's
// capacity of other keys were inserted or used after its last use.
//
// Memory per key, measured by TestLongKeyMemoryBounded: about 230 bytes for
// a 16-byte key with FixedWindow, SlidingWindow, TokenBucket and GCRA (table
// entry, key bytes and counters), and never more than 400 whatever the key:
// a key of up to 128 bytes is kept as it is (about 350 bytes at 128), a
// longer one (or one starting with a zero byte) by its 33-byte SHA-256 form
// (about 270 bytes), so a caller sending 10 KB keys holds no more memory per
// key than one sending short keys; SHA-256 costs a decision on such a key
// about 0.7µs per KB. SlidingLog adds 8 bytes per logged event, at most Rate
// events per key (the ring grows on demand up to Rate entries).
//
// A Limiter must be made with New; the zero Limiter is not usable. A Limiter
// is safe for concurrent use by multiple goroutines.
type Limiter struct {
	algo
	clock func() time.Time // nil: mono
	mono  *monoClock
	table *Table[*state]
}

var _ ratelimit.Limiter = (*Limiter)(nil)

// New returns a Limiter that enforces limit on every key. It returns an
// error wrapping ratelimit.ErrInvalidLimit if limit.Validate fails (or, for
// GCRA, if Period in microseconds is below Rate, since the emission interval
// Period/Rate must be at least 1µs), ratelimit.ErrInvalidAlgorithm for an
// unknown Algorithm, and ratelimit.ErrInvalidOption for an option out of
// range.
func New(limit ratelimit.Limit, opts ...Option) (*Limiter, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	alg := cfg.algorithm
	if cfg.algorithms != nil {
		if len(cfg.algorithms) != 1 {
			return nil, fmt.Errorf("%w: %d algorithms for one limit", ratelimit.ErrInvalidOption, len(cfg.algorithms))
		}
		if alg = cfg.algorithms[0]; !alg.Valid() {
			return nil, fmt.Errorf("%w: %v", ratelimit.ErrInvalidAlgorithm, alg)
		}
	}
	a, err := newAlgo(limit, alg)
	if err != nil {
		return nil, err
	}
	l := &Limiter{algo: a, clock: cfg.clock, table: NewTable[*state](cfg.maxKeys, nil)}
	if l.clock == nil {
		l.mono = newMonoClock()
	}
	return l, nil
}

// Limit returns the Limit the Limiter enforces.
func (l *Limiter) Limit() ratelimit.Limit { return l.limit }

// Algorithm returns the Algorithm the Limiter counts with.
func (l *Limiter) Algorithm() ratelimit.Algorithm { return l.alg }

// Len returns the number of keys whose state the Limiter currently keeps.
func (l *Limiter) Len() int { return l.table.Len() }

// Allow is shorthand for AllowN(ctx, key, 1).
func (l *Limiter) Allow(ctx context.Context, key string) (ratelimit.Decision, error) {
	return l.AllowN(ctx, key, 1)
}

// AllowN reports whether n events for key may happen now and, if so,
// consumes them; admission is all-or-nothing. It returns an error wrapping
// ratelimit.ErrInvalidKey for an empty key and ratelimit.ErrInvalidN for
// n <= 0 or n above the Limit's capacity (Rate for the window algorithms,
// Burst for the buckets). ctx is not consulted: a local decision never
// waits.
func (l *Limiter) AllowN(ctx context.Context, key string, n int) (ratelimit.Decision, error) {
	if key == "" || n <= 0 || n > l.maxN { // the checks of check.Key and check.N, inlined
		if err := check.Key(key); err != nil {
			return ratelimit.Decision{}, err
		}
		return ratelimit.Decision{}, check.N(l.limit, l.alg, n)
	}
	if memkey.Hashed(key) {
		return l.allowHashed(key, int64(n)), nil
	}
	return l.allow(key, int64(n)), nil
}

// allowHashed decides for a key kept by its digest (see Limiter's memory).
func (l *Limiter) allowHashed(key string, n int64) ratelimit.Decision {
	var k [memkey.DigestLen]byte
	memkey.Digest(&k, key)
	// allow only looks the digest up, and copies it to store it: a string
	// over the array spares allocating one per decision.
	return l.allow(unsafe.String(&k[0], len(k)), n)
}

// allow decides for key, the form the table keeps it in.
func (l *Limiter) allow(key string, n int64) ratelimit.Decision {
	var now int64
	if l.clock != nil {
		now = l.clock().UnixMicro()
	} else {
		now = l.mono.nowMicro()
	}

	s := l.table.shard(key)
	s.mu.Lock()
	st, ok := s.lru.Peek(key) // l.entry, inlined: this is the hot path
	if !ok {
		st = new(state)
		*st = l.newState(now)
		st.promoted = s.insert(key, st)
	} else if s.stale(st.promoted) {
		st.promoted = s.moveToFront(key)
	}
	d := l.decision()
	l.decide(&d, st, now, n, true)
	s.mu.Unlock()
	return d
}

// now returns the time in µs since the Unix epoch.
func (l *Limiter) now() int64 {
	if l.clock != nil {
		return l.clock().UnixMicro()
	}
	return l.mono.nowMicro()
}

// entry returns the state of key (in the form the table keeps it) in s,
// whose lock the caller holds, making it when key is new.
func (l *Limiter) entry(s *tableShard[*state], key string, now int64) *state {
	st, ok := s.lru.Peek(key)
	if !ok {
		st = new(state)
		*st = l.newState(now)
		st.promoted = s.insert(key, st)
	} else if s.stale(st.promoted) {
		st.promoted = s.moveToFront(key)
	}
	return st
}

// tableKey returns the form key is kept in a table: key itself, or its
// digest (see Limiter's memory) in buf.
func tableKey(key string, buf *[memkey.DigestLen]byte) string {
	if !memkey.Hashed(key) {
		return key
	}
	memkey.Digest(buf, key)
	return unsafe.String(&buf[0], len(buf))
}
