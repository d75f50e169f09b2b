// Package breaker is a small, concurrency-safe circuit breaker.
//
// A Breaker starts Closed and lets every call through. FailureThreshold
// consecutive failures open it: Allow then returns false until OpenTimeout has
// elapsed, after which exactly one caller is let through as a probe
// (HalfOpen). The probe's Success closes the breaker; its Failure opens it
// again for a fresh OpenTimeout.
//
// The hot path is lock-free: Allow in the Closed state is a single atomic
// load, and Success in the Closed state with no recorded failures is two
// atomic loads and no write. A mutex guards state transitions only.
package breaker

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Default configuration values, used for zero fields of Config.
const (
	DefaultFailureThreshold = 5
	DefaultOpenTimeout      = time.Second
)

// Config configures a Breaker. Zero fields take their defaults.
type Config struct {
	// FailureThreshold is the number of consecutive failures that opens
	// the breaker (default DefaultFailureThreshold).
	FailureThreshold int
	// OpenTimeout is how long the breaker stays open before it lets one
	// probe through (half-open) (default DefaultOpenTimeout).
	OpenTimeout time.Duration
	// Now is the clock (default time.Now). Tests inject a fake one.
	Now func() time.Time
}

// State is the state of a Breaker.
type State int32

const (
	// Closed lets every call through; failures are counted.
	Closed State = iota
	// Open rejects every call until OpenTimeout has elapsed.
	Open
	// HalfOpen has let one probe through and rejects every other call
	// until the probe reports Success or Failure.
	HalfOpen
)

// String returns "closed", "open" or "half-open".
func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half-open"
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// Breaker is a circuit breaker. Its methods are safe for concurrent use. Make
// one with New.
type Breaker struct {
	// state and failures are read without the lock on the hot path and
	// written only with mu held.
	state    atomic.Int32
	failures atomic.Int32

	mu         sync.Mutex
	openedAt   time.Time // when the breaker last opened (Open)
	probeSince time.Time // when the current probe was let through (HalfOpen)

	threshold int32
	timeout   time.Duration
	now       func() time.Time
	hook      atomic.Pointer[func(from, to State)]
}

// New returns a Closed Breaker configured by cfg.
func New(cfg Config) *Breaker {
	if cfg.FailureThreshold <= 0 {
		cfg.FailureThreshold = DefaultFailureThreshold
	}
	if cfg.OpenTimeout <= 0 {
		cfg.OpenTimeout = DefaultOpenTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	th := cfg.FailureThreshold
	if th > 1<<30 {
		th = 1 << 30
	}
	return &Breaker{threshold: int32(th), timeout: cfg.OpenTimeout, now: cfg.Now}
}

// OnStateChange registers fn to be called after every state transition with
// the old and the new state, replacing any earlier hook (nil removes it). fn
// is called outside the breaker's lock, on the goroutine that caused the
// transition; calls from concurrent transitions may run concurrently and
// are not ordered with respect to each other.
func (b *Breaker) OnStateChange(fn func(from, to State)) {
	if fn == nil {
		b.hook.Store(nil)
		return
	}
	b.hook.Store(&fn)
}

// State returns the current state. An Open breaker whose OpenTimeout has
// elapsed still reports Open until the next Allow lets the probe through.
func (b *Breaker) State() State { return State(b.state.Load()) }

// Failures returns the consecutive failures counted in the Closed state.
func (b *Breaker) Failures() int { return int(b.failures.Load()) }

// Allow reports whether the caller may call the dependency. Closed: always
// true. Open: false until OpenTimeout has elapsed since it opened; then the
// breaker turns HalfOpen and exactly one caller gets true (the probe), which
// must report Success or Failure. HalfOpen: false while the probe is
// outstanding. A probe that never reports is presumed lost after another
// OpenTimeout, and one new probe is let through.
func (b *Breaker) Allow() bool {
	if State(b.state.Load()) == Closed {
		return true
	}
	return b.allowSlow()
}

func (b *Breaker) allowSlow() bool {
	b.mu.Lock()
	from := State(b.state.Load())
	switch from {
	case Closed:
		b.mu.Unlock()
		return true
	case Open:
		now := b.now()
		if now.Sub(b.openedAt) < b.timeout {
			b.mu.Unlock()
			return false
		}
		b.probeSince = now
		b.state.Store(int32(HalfOpen))
		b.mu.Unlock()
		b.notify(Open, HalfOpen)
		return true
	default: // HalfOpen
		now := b.now()
		if now.Sub(b.probeSince) < b.timeout {
			b.mu.Unlock()
			return false
		}
		b.probeSince = now // the last probe is lost: let one more through
		b.mu.Unlock()
		return true
	}
}

// Success records a successful call: the breaker closes (from any state) and
// the failure count is reset. When already Closed with no failures counted it
// only loads two atomics.
func (b *Breaker) Success() {
	if State(b.state.Load()) == Closed && b.failures.Load() == 0 {
		return
	}
	b.mu.Lock()
	from := State(b.state.Load())
	b.failures.Store(0)
	if from == Closed {
		b.mu.Unlock()
		return
	}
	b.state.Store(int32(Closed))
	b.mu.Unlock()
	b.notify(from, Closed)
}

// Failure records a failed call. In the Closed state it counts, and the
// FailureThreshold-th consecutive failure opens the breaker. In HalfOpen any
// failure opens it again with a fresh OpenTimeout. In the Open state it
// changes nothing (the timeout is not extended).
func (b *Breaker) Failure() {
	b.mu.Lock()
	from := State(b.state.Load())
	switch from {
	case Closed:
		n := b.failures.Load() + 1
		if n < b.threshold {
			b.failures.Store(n)
			b.mu.Unlock()
			return
		}
		b.failures.Store(n)
	case HalfOpen:
	default: // Open
		b.mu.Unlock()
		return
	}
	b.openedAt = b.now()
	b.state.Store(int32(Open))
	b.mu.Unlock()
	b.notify(from, Open)
}

// Trip records a failure that alone is evidence enough of an outage (for
// the hybrid limiter: a call that got no reply at all within its deadline):
// the breaker opens as if the FailureThreshold were reached, from Closed or
// HalfOpen. In the Open state it changes nothing.
func (b *Breaker) Trip() {
	b.mu.Lock()
	from := State(b.state.Load())
	if from == Open {
		b.mu.Unlock()
		return
	}
	b.failures.Store(b.threshold)
	b.openedAt = b.now()
	b.state.Store(int32(Open))
	b.mu.Unlock()
	b.notify(from, Open)
}

// Reset forces the breaker Closed and clears the failure count.
func (b *Breaker) Reset() {
	b.mu.Lock()
	from := State(b.state.Load())
	b.failures.Store(0)
	b.state.Store(int32(Closed))
	b.mu.Unlock()
	if from != Closed {
		b.notify(from, Closed)
	}
}

func (b *Breaker) notify(from, to State) {
	if fn := b.hook.Load(); fn != nil {
		(*fn)(from, to)
	}
}
