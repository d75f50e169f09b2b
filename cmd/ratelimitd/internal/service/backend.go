package service

import (
	"context"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
)

// A Backend makes the limiters a Service counts in, and says whether what
// they count in is ready. The Service keeps the decision logic (matching a
// request to its rules, envoyproxy/ratelimit's answers, metrics, reloads);
// a Backend keeps the counting, as envoyproxy/ratelimit's RateLimitCache
// does. The Redis backend (NewRedisBackend, what New makes from
// Options.Client) counts with the hybrid and global limiters; the memory
// backend (NewMemoryBackend) counts in process memory on an injected
// clock, so the decision logic is tested without Redis and without sleeps.
// The migration mode's counting in envoyproxy/ratelimit's keys
// (Compat.EnvoyKeys) is a limiter of the Redis backend too, of Spec.Layout
// LayoutEnvoy.
//
// A Backend's methods are safe for concurrent use.
type Backend interface {
	// NewLimiter returns the limiter of spec. The Service makes one per
	// distinct Spec and closes it when no rule uses it any more.
	NewLimiter(spec Spec) (Limiter, error)
	// Ready returns nil when the backend serves decisions as it should,
	// else why not (for /readyz).
	Ready(ctx context.Context) error
	// Close stops the backend's own background work. The Service calls it
	// once, after closing every limiter.
	Close() error
}

// Spec is what one limiter enforces: every limit of Limits, each counted
// with its algorithm, all or nothing, in Mode, deciding by FailureMode when
// its store does not answer in time.
type Spec struct {
	Mode        config.Mode
	FailureMode ratelimit.FailureMode
	Limits      []ratelimit.Limit     // one, or up to ratelimit.MaxLimits
	Algorithms  []ratelimit.Algorithm // one per limit
	// Prefix is the limiter's own Redis key prefix (see the package
	// documentation); a backend without Redis may ignore it.
	Prefix string
	// Layout is how the limiter's keys are laid out and counted: the
	// library's (LayoutRatelimitd, the zero value), or envoyproxy/ratelimit's
	// (LayoutEnvoy, for one exact fixed-window limit only).
	Layout KeyLayout
	// Name names the limiter in logs and metrics, e.g.
	// "strict fixed_window 100/60s local".
	Name string
}

// KeyLayout is how a limiter lays out and counts its keys.
type KeyLayout int

const (
	// LayoutRatelimitd counts with the library's limiters, under keys the
	// Service makes from the domain and the descriptor (counterKey) and
	// the limiter places under its Prefix.
	LayoutRatelimitd KeyLayout = iota
	// LayoutEnvoy counts one fixed-window limit of whole seconds as
	// envoyproxy/ratelimit does, in its keys, so that both services behind
	// one Redis share one count (the migration mode, Compat.EnvoyKeys).
	// The Service gives the limiter envoyproxy/ratelimit's cache key
	// without the window start (<CACHE_KEY_PREFIX><domain>_<key>_<value>_
	// ..._); the limiter appends the start of the current window in Unix
	// seconds, counts every hit, denied or not (INCRBY, then EXPIRE of the
	// unit plus jitter), answers over the limit when the count passes it,
	// and checks a descriptor of hits_addend 0 with INCRBY 0 (Checker).
	LayoutEnvoy
)

// Limiter is one limiter of a Backend: a ratelimit.Limiter that also
// reports its counters and gives its quota back.
type Limiter interface {
	ratelimit.Limiter
	// Stats returns the limiter's counters; called by /metrics, not per
	// decision.
	Stats() LimiterStats
	// Flush gives back what the limiter holds (leases), so that rules
	// counted elsewhere now do not keep it; later decisions take again.
	Flush(ctx context.Context) error
	// Close gives everything back and stops the limiter's goroutines.
	Close() error
}

// A Limiter of a Backend may also be a ratelimit.Reserver, which the
// Service uses to give hits back: to check a descriptor without counting
// (hits_addend 0: reserve one hit, cancel it) and for
// Compat.StopIncrementWhenOverLimit (reserve the hits, cancel those of a
// request one of whose descriptors is over). A limiter that is not
// counts as AllowN does, and gives nothing back.

// A Checker is a Limiter with its own answer to a descriptor of
// hits_addend 0, checked without counting; the Service asks a limiter
// that is not one with a reservation of one hit, cancelled at once (so
// OK means one more hit would be admitted now). LayoutEnvoy limiters are
// Checkers: OK unless the count already passed the limit, as
// envoyproxy/ratelimit answers a check (INCRBY 0).
type Checker interface {
	// Check decides key without counting, deciding by the limiter's
	// failure mode when its store does not answer.
	Check(ctx context.Context, key string) (ratelimit.Decision, error)
}

// LimiterStats are a limiter's counters, exported as metrics. The counts
// only grow.
type LimiterStats struct {
	Fallback       uint64 // decisions taken by the failure mode
	LocalDecisions uint64 // decisions taken in memory without waiting on the store
	Leases         uint64 // grants of quota received from the store
	// Tracked says that KeysTracked is meaningful (the hybrid limiters
	// and the memory backend).
	Tracked     bool
	KeysTracked int // keys held in memory
	Instances   int // processes sharing the quota, as last learned; 0: not known
	// DegradedKnown says that Degraded is meaningful.
	DegradedKnown bool
	Degraded      bool // deciding without the store (its circuit breaker is open)
}
