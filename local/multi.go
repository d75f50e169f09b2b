package local

import (
	"context"
	"fmt"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/check"
	"github.com/hybridlimit/ratelimit/internal/memkey"
)

// Multi is an in-process rate limiter that enforces several limits on each
// key at once, all or nothing: a decision consumes from every limit or, when
// any of them denies, from none (a request the daily limit denies is not
// counted by the per-second one). Each limit keeps its own state, counted
// with its own Algorithm to the semantics of docs/algorithms.md, so a Multi
// decides exactly as package global's Multi does for the same requests at
// the same instants.
//
// The Decision describes the tightest limit and lists every limit's state
// in Decision.Limits (see ratelimit.Combine). AllowN allocates that list;
// AllowNInto fills a caller's buffer instead and allocates nothing for a
// key already known.
//
// The state of every limit of a key lives in one entry of a bounded,
// sharded LRU table, as for Limiter (WithMaxKeys), so a decision takes one
// shard lock. Memory per key is about 140 bytes plus 80 per limit (about
// 380 for three, measured by TestMultiHeapBounded).
//
// A Multi must be made with NewMulti; the zero Multi is not usable. It is
// safe for concurrent use by multiple goroutines.
type Multi struct {
	algos   []algo
	limits  []ratelimit.Limit
	algs    []ratelimit.Algorithm
	maxN    int  // the largest n every limit can take
	reserve bool // no SlidingLog limit
	clock   func() time.Time
	mono    *monoClock
	table   *Table[[]state] // the state of limit i is entry[i]; entry[0].promoted is the entry's
}

var _ ratelimit.MultiLimiter = (*Multi)(nil)

// NewMulti returns a Multi that enforces every one of limits on each key.
// The Algorithm of each limit is given by WithAlgorithms (one per limit, in
// order) or WithAlgorithm (the same for all); the default is
// DefaultAlgorithm. Any algorithms may be mixed.
//
// It returns an error wrapping ratelimit.ErrInvalidLimit,
// ErrInvalidAlgorithm or ErrInvalidOption for no limits, more than
// ratelimit.MaxLimits, an invalid one, two of one Algorithm and Period, or
// not one algorithm per limit, and ratelimit.ErrInvalidOption for an option
// out of range.
func NewMulti(limits []ratelimit.Limit, opts ...Option) (*Multi, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	algs := cfg.algorithmsFor(len(limits))
	if err := check.Limits(limits, algs); err != nil {
		return nil, err
	}
	m := &Multi{
		limits:  append([]ratelimit.Limit(nil), limits...),
		algs:    append([]ratelimit.Algorithm(nil), algs...),
		algos:   make([]algo, len(limits)),
		reserve: true,
		clock:   cfg.clock,
		table:   NewTable[[]state](cfg.maxKeys, nil),
	}
	for i, l := range limits {
		a, err := newAlgo(l, algs[i])
		if err != nil {
			return nil, err
		}
		m.algos[i] = a
		if i == 0 || a.maxN < m.maxN {
			m.maxN = a.maxN
		}
		if a.alg == ratelimit.SlidingLog {
			m.reserve = false
		}
	}
	if m.clock == nil {
		m.mono = newMonoClock()
	}
	return m, nil
}

// Limits returns the limits the Multi enforces, in order.
func (m *Multi) Limits() []ratelimit.Limit { return append([]ratelimit.Limit(nil), m.limits...) }

// Algorithms returns the Algorithm of each limit, in order.
func (m *Multi) Algorithms() []ratelimit.Algorithm {
	return append([]ratelimit.Algorithm(nil), m.algs...)
}

// Len returns the number of keys whose state the Multi currently keeps.
func (m *Multi) Len() int { return m.table.Len() }

// Allow is shorthand for AllowN(ctx, key, 1).
func (m *Multi) Allow(ctx context.Context, key string) (ratelimit.Decision, error) {
	return m.AllowNInto(ctx, key, 1, nil)
}

// AllowN reports whether n events for key may happen now under every limit
// and, if so, consumes them from every limit. It returns an error wrapping
// ratelimit.ErrInvalidKey for an empty key and ratelimit.ErrInvalidN for
// n <= 0 or n above the capacity of any limit. ctx is not consulted.
func (m *Multi) AllowN(ctx context.Context, key string, n int) (ratelimit.Decision, error) {
	return m.AllowNInto(ctx, key, n, nil)
}

// AllowNInto is AllowN that writes the state of each limit into *states,
// reusing its array when its capacity holds them all, and allocates
// nothing then for a key already known; the Decision's Limits is *states.
// A nil states is AllowN.
func (m *Multi) AllowNInto(ctx context.Context, key string, n int, states *[]ratelimit.LimitState) (ratelimit.Decision, error) {
	if err := m.check(key, n); err != nil {
		return ratelimit.Decision{}, err
	}
	states = check.States(states, len(m.algos))
	var buf [memkey.DigestLen]byte
	key = tableKey(key, &buf)
	now := m.now()
	s := m.table.shard(key)
	s.mu.Lock()
	m.decide(m.entry(s, key, now), now, int64(n), *states)
	s.mu.Unlock()
	return ratelimit.Combine(states), nil
}

func (m *Multi) check(key string, n int) error {
	if key == "" || n <= 0 || n > m.maxN {
		if err := check.Key(key); err != nil {
			return err
		}
		return check.NLimits(m.limits, m.algs, n)
	}
	return nil
}

// decide takes the decision for n events at now on a key's states into
// states: every limit is asked first, and only when all admit n are they
// consumed from each.
func (m *Multi) decide(sts []state, now, n int64, states []ratelimit.LimitState) {
	all := true
	for i := range m.algos {
		d := m.algos[i].decision()
		m.algos[i].decide(&d, &sts[i], now, n, false)
		states[i] = limitState(&d)
		all = all && d.Allowed
	}
	if !all {
		return
	}
	for i := range m.algos {
		d := m.algos[i].decision()
		m.algos[i].decide(&d, &sts[i], now, n, true)
		states[i] = limitState(&d)
	}
}

func (m *Multi) now() int64 {
	if m.clock != nil {
		return m.clock().UnixMicro()
	}
	return m.mono.nowMicro()
}

// entry returns key's states in s, whose lock the caller holds, making them
// when key is new.
func (m *Multi) entry(s *tableShard[[]state], key string, now int64) []state {
	sts, ok := s.lru.Peek(key)
	if !ok {
		sts = make([]state, len(m.algos))
		for i := range m.algos {
			sts[i] = m.algos[i].newState(now)
		}
		sts[0].promoted = s.insert(key, sts)
	} else if s.stale(sts[0].promoted) {
		sts[0].promoted = s.moveToFront(key)
	}
	return sts
}

// Reserve decides as AllowN(ctx, key, estimate) and returns the decision as
// a ratelimit.Reservation, to be settled with the actual cost (see
// ratelimit.Reservation for the model, docs/algorithms.md for each
// algorithm's rule). Settling takes the key's shard lock once and never
// fails. It returns an error wrapping ratelimit.ErrInvalidAlgorithm when a
// limit counts with SlidingLog, whose log of at most Rate events per key
// cannot hold an overdraft.
func (m *Multi) Reserve(ctx context.Context, key string, estimate int) (*ratelimit.Reservation, error) {
	if !m.reserve {
		return nil, fmt.Errorf("%w: SlidingLog limits cannot be reserved", ratelimit.ErrInvalidAlgorithm)
	}
	if err := m.check(key, estimate); err != nil {
		return nil, err
	}
	states := check.States(nil, len(m.algos))
	var buf [memkey.DigestLen]byte
	tk := tableKey(key, &buf)
	now := m.now()
	s := m.table.shard(tk)
	s.mu.Lock()
	m.decide(m.entry(s, tk, now), now, int64(estimate), *states)
	s.mu.Unlock()
	return reservation(ratelimit.Combine(states), estimate, m, key, now), nil
}

// settleKey applies a settlement to every limit of key's state.
func (m *Multi) settleKey(key string, t0, est, actual int64) {
	var buf [memkey.DigestLen]byte
	key = tableKey(key, &buf)
	now := m.now()
	s := m.table.shard(key)
	s.mu.Lock()
	sts := m.entry(s, key, now)
	for i := range m.algos {
		m.algos[i].settle(&sts[i], now, t0, est, actual)
	}
	s.mu.Unlock()
}
