package service

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/local"
)

// MemoryBackend counts in process memory, with the local limiters of the
// library on the clock it is given: the same algorithms, to the
// microsecond, as the Redis backend's, for one process. It exists so that
// the Service's decision logic is tested without Redis and without sleeps
// (a test moves its clock), and it can stand in for Redis where one
// process is all there is.
//
// SetDown makes it behave as a Redis that does not answer: every decision
// then follows its rule's failure mode at once, as a limiter whose circuit
// breaker is open (local: the limit divided by Instances, counted apart).
//
// Make it with NewMemoryBackend; it is safe for concurrent use.
type MemoryBackend struct {
	clock     func() time.Time
	instances int
	down      atomic.Bool
	made      atomic.Int64
}

// NewMemoryBackend returns a MemoryBackend on clock (time.Now when nil)
// whose local failure mode shares each limit among instances processes
// (1 when < 1).
func NewMemoryBackend(clock func() time.Time, instances int) *MemoryBackend {
	if clock == nil {
		clock = time.Now
	}
	return &MemoryBackend{clock: clock, instances: max(1, instances)}
}

// SetDown makes the backend answer as an unreachable store (true) or
// count again (false).
func (m *MemoryBackend) SetDown(down bool) { m.down.Store(down) }

// Limiters returns how many limiters the backend has made.
func (m *MemoryBackend) Limiters() int { return int(m.made.Load()) }

// NewLimiter returns a limiter of spec's limits, counted in memory. It
// refuses LayoutEnvoy, whose point is a count shared with
// envoyproxy/ratelimit in Redis.
func (m *MemoryBackend) NewLimiter(spec Spec) (Limiter, error) {
	if spec.Layout != LayoutRatelimitd {
		return nil, errors.New("memory backend: envoyproxy/ratelimit's key layout shares counts in Redis; count in memory with the ratelimitd layout")
	}
	opts := []local.Option{local.WithClock(m.clock), local.WithAlgorithms(spec.Algorithms...)}
	l := &memLimiter{b: m, spec: spec}
	var err error
	if l.lim, err = newLocal(spec.Limits, opts); err != nil {
		return nil, err
	}
	if spec.FailureMode == ratelimit.FailLocal {
		shares := make([]ratelimit.Limit, len(spec.Limits))
		for i, lim := range spec.Limits {
			shares[i] = lim
			shares[i].Rate = max(1, lim.Rate/m.instances)
		}
		if l.fb, err = newLocal(shares, opts); err != nil {
			return nil, err
		}
	}
	m.made.Add(1)
	return l, nil
}

func newLocal(limits []ratelimit.Limit, opts []local.Option) (ratelimit.Limiter, error) {
	if len(limits) > 1 {
		return local.NewMulti(limits, opts...)
	}
	return local.New(limits[0], opts...)
}

// Ready returns an error while the backend is set down, else nil.
func (m *MemoryBackend) Ready(context.Context) error {
	if m.down.Load() {
		return errMemoryDown
	}
	return nil
}

// Close does nothing: the memory backend has no background work.
func (m *MemoryBackend) Close() error { return nil }

var errMemoryDown = errors.New("memory backend: set down")

// memLimiter is one limiter of a MemoryBackend.
type memLimiter struct {
	b      *MemoryBackend
	spec   Spec
	lim    ratelimit.Limiter // the limits
	fb     ratelimit.Limiter // the local failure mode's shares; nil unless FailLocal
	local  atomic.Uint64
	fell   atomic.Uint64
	closed atomic.Bool
}

func (l *memLimiter) AllowN(ctx context.Context, key string, n int) (ratelimit.Decision, error) {
	if l.closed.Load() {
		return ratelimit.Decision{}, ratelimit.ErrClosed
	}
	if !l.b.down.Load() {
		l.local.Add(1)
		return l.lim.AllowN(ctx, key, n)
	}
	l.fell.Add(1)
	switch l.spec.FailureMode {
	case ratelimit.FailLocal:
		return l.fb.AllowN(ctx, key, n)
	case ratelimit.FailOpen:
		return ratelimit.Decision{Allowed: true, Limit: l.spec.Limits[0], Algorithm: l.spec.Algorithms[0], Remaining: l.spec.Limits[0].Rate - n}, nil
	}
	return ratelimit.Decision{Limit: l.spec.Limits[0], Algorithm: l.spec.Algorithms[0], RetryAfter: time.Second, ResetAfter: time.Second}, nil
}

// Reserve reserves as AllowN decides, for the Service to give hits back
// (hits_addend 0, Compat.StopIncrementWhenOverLimit). While the backend is
// set down it fails as the Redis backend's exact limiters' Reserve does
// when Redis does not answer (the Service then decides by AllowN, or the
// rule's failure mode).
func (l *memLimiter) Reserve(ctx context.Context, key string, n int) (*ratelimit.Reservation, error) {
	if l.closed.Load() {
		return nil, ratelimit.ErrClosed
	}
	if l.b.down.Load() {
		return nil, errMemoryDown
	}
	l.local.Add(1)
	return l.lim.(ratelimit.Reserver).Reserve(ctx, key, n)
}

func (l *memLimiter) Stats() LimiterStats {
	st := LimiterStats{Fallback: l.fell.Load(), LocalDecisions: l.local.Load(), Tracked: true, Instances: l.b.instances,
		DegradedKnown: true, Degraded: l.b.down.Load()}
	switch x := l.lim.(type) {
	case *local.Limiter:
		st.KeysTracked = x.Len()
	case *local.Multi:
		st.KeysTracked = x.Len()
	}
	return st
}

func (l *memLimiter) Flush(context.Context) error { return nil }

func (l *memLimiter) Close() error {
	l.closed.Store(true)
	return nil
}
