package hybrid

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/check"
	"github.com/hybridlimit/ratelimit/internal/script"
)

// Multi is a hybrid limiter that enforces several limits on each key at
// once, all or nothing: a decision consumes from every limit or, when any
// of them denies, from none (a request the daily limit denies is not
// counted by the per-second one).
//
// Each limit is leased as a Limiter of its own would lease it (same Redis
// state as a Limiter, or a global limiter, of that algorithm, limit and
// prefix), and its lease answers in memory. A decision takes n from the
// lease of every limit; when one denies, it gives back what it took from
// the others, in memory. When a limit's lease cannot decide, the decision
// first gives back what it holds (it never waits on Redis with quota in
// hand), leases for every such limit at once, within one timeout, and
// tries again. So in Strict mode no limit is ever exceeded while Redis
// answers, and a request denied by one limit leaves the others' counts in
// Redis as they were once the instance's leases are settled (Flush).
//
// The Decision describes the tightest limit and lists every limit's state
// in Decision.Limits (see ratelimit.Combine). A limit that did not have to
// be consulted, because another denied first from memory, reports its
// state as the instance last knew it. AllowN allocates Decision.Limits;
// AllowNInto fills a caller's buffer instead, and a decision answered from
// the leases allocates nothing.
//
// Every limit of a Multi has its own key table, syncer and circuit
// breaker, so a key costs about as much memory as it does in one Limiter
// per limit, and each sync tick sends one pipeline per limit. Options apply
// to every limit, but WithAlgorithms, which gives each limit its
// Algorithm.
//
// A Multi must be made with NewMulti. It is safe for concurrent use by
// multiple goroutines.
type Multi struct {
	lims    []*Limiter
	limits  []ratelimit.Limit
	algs    []ratelimit.Algorithm
	maxN    int64
	timeout time.Duration
}

var (
	_ ratelimit.MultiLimiter = (*Multi)(nil)
	_ ratelimit.Reserver     = (*Multi)(nil)
)

// NewMulti returns a Multi enforcing every one of limits per key across the
// instances that share client's Redis and prefix. The Algorithm of each
// limit is given by WithAlgorithms (one per limit, in order) or
// WithAlgorithm (the same for all); the default is FixedWindow. Any of the
// algorithms the hybrid leases may be mixed: every one leaves its state
// unchanged on a denial and only turns a denial into an admission by
// waiting, so the conjunction is exact (docs/algorithms.md).
//
// It returns an error wrapping ratelimit.ErrInvalidLimit,
// ratelimit.ErrInvalidAlgorithm or ratelimit.ErrInvalidOption for no
// limits, more than ratelimit.MaxLimits, an invalid one, two of one
// Algorithm and Period, not one algorithm per limit, or an option out of
// range. Like New, it does not fail on Redis errors: call Ping.
func NewMulti(client redis.UniversalClient, limits []ratelimit.Limit, opts ...Option) (*Multi, error) {
	if script.IsNilClient(client) {
		return nil, fmt.Errorf("%w: nil Redis client", ratelimit.ErrInvalidOption)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	algs := cfg.algorithms
	if algs == nil {
		algs = make([]ratelimit.Algorithm, len(limits))
		for i := range algs {
			algs[i] = cfg.algorithm
		}
	}
	if err := check.Limits(limits, algs); err != nil {
		return nil, err
	}
	m := &Multi{
		limits:  append([]ratelimit.Limit(nil), limits...),
		algs:    append([]ratelimit.Algorithm(nil), algs...),
		timeout: cfg.timeout,
	}
	for i, l := range limits {
		c := cfg
		c.algorithm, c.algorithms = algs[i], nil
		h, err := newLimiter(client, l, c, i == 0)
		if err != nil {
			m.Close()
			return nil, err
		}
		if i > 0 && m.lims[0].health.learned.Load() {
			h.health.live.Store(m.lims[0].health.live.Load())
			h.health.learned.Store(true)
		}
		m.lims = append(m.lims, h)
		if i == 0 || h.p.capacity < m.maxN {
			m.maxN = h.p.capacity
		}
	}
	return m, nil
}

// Limits returns the limits the Multi enforces, in order.
func (m *Multi) Limits() []ratelimit.Limit { return append([]ratelimit.Limit(nil), m.limits...) }

// Algorithms returns the Algorithm of each limit, in order.
func (m *Multi) Algorithms() []ratelimit.Algorithm {
	return append([]ratelimit.Algorithm(nil), m.algs...)
}

// Allow is shorthand for AllowN(ctx, key, 1).
func (m *Multi) Allow(ctx context.Context, key string) (ratelimit.Decision, error) {
	return m.AllowNInto(ctx, key, 1, nil)
}

// AllowN reports whether n events for key may happen now under every limit
// and, if so, consumes them from every limit. Like Limiter.AllowN, it
// waits on Redis only when a lease cannot decide, and then at most the
// timeout in all, whatever the number of limits. It returns an error
// wrapping ratelimit.ErrInvalidKey for an empty key,
// ratelimit.ErrInvalidN for n <= 0 or n above the capacity of any limit,
// ratelimit.ErrClosed after Close, and ctx's error when ctx ends first.
func (m *Multi) AllowN(ctx context.Context, key string, n int) (ratelimit.Decision, error) {
	return m.AllowNInto(ctx, key, n, nil)
}

// AllowNInto is AllowN that writes the state of each limit into *states,
// reusing its array when its capacity holds them all (see
// ratelimit.MultiLimiter); the Decision's Limits is *states. A nil states
// is AllowN.
func (m *Multi) AllowNInto(ctx context.Context, key string, n int, states *[]ratelimit.LimitState) (ratelimit.Decision, error) {
	states = check.States(states, len(m.lims))
	if _, err := m.decide(ctx, key, n, *states); err != nil {
		return ratelimit.Decision{}, err
	}
	return ratelimit.Combine(states), nil
}

// Reserve decides as AllowN(ctx, key, estimate) does and returns the
// decision as a Reservation, to be settled with the actual cost once it is
// known (see ratelimit.Reservation for the model, and Limiter.Reserve for
// how the hybrid settles in memory): a settlement applies to every limit.
func (m *Multi) Reserve(ctx context.Context, key string, estimate int) (*ratelimit.Reservation, error) {
	states := make([]ratelimit.LimitState, len(m.lims))
	idx, err := m.decide(ctx, key, estimate, states)
	if err != nil {
		return nil, err
	}
	d := ratelimit.Combine(&states)
	if !d.Allowed {
		return ratelimit.NewReservation(d, estimate, nil), nil
	}
	return ratelimit.NewReservation(d, estimate, &multiSettler{m: m, key: key, idx: idx, estimate: int64(estimate)}), nil
}

// multiSettler settles an admitted reservation of a Multi: estimate units
// taken from each limit i in its window idx[i].
type multiSettler struct {
	m        *Multi
	key      string
	idx      [ratelimit.MaxLimits]int64
	estimate int64
}

func (s *multiSettler) Settle(ctx context.Context, actual int) error {
	for i, h := range s.m.lims {
		ss := settler{h: h, key: s.key, idx: s.idx[i], estimate: s.estimate}
		if err := ss.Settle(ctx, actual); err != nil {
			return err
		}
	}
	return nil
}

// maxMultiAttempts bounds the rounds of a decision whose leases others
// keep taking before it can use them.
const maxMultiAttempts = 8

// round is one decision of a Multi in progress.
type round struct {
	cs    [ratelimit.MaxLimits]*counter
	took  [ratelimit.MaxLimits]*lease // an admission holds n on took[i]
	asked [ratelimit.MaxLimits]bool   // states[i] is this round's
}

// decide takes the decision of n events for key into states and, when it
// admits, returns the window each limit took them in.
func (m *Multi) decide(ctx context.Context, key string, n int, states []ratelimit.LimitState) ([ratelimit.MaxLimits]int64, error) {
	var idx [ratelimit.MaxLimits]int64
	if m.lims[0].closed.Load() {
		return idx, ratelimit.ErrClosed
	}
	if key == "" || n <= 0 || int64(n) > m.maxN {
		if err := check.Key(key); err != nil {
			return idx, err
		}
		return idx, check.NLimits(m.limits, m.algs, n)
	}
	var r round
	for i, h := range m.lims {
		r.cs[i] = h.lookup(key)
	}
	if denied, missed := m.fast(&r, int64(n), states); denied || missed > 0 {
		if err := m.slow(ctx, &r, key, int64(n), states, denied); err != nil {
			return idx, err
		}
	}
	for i := range m.lims {
		if r.took[i] != nil { // admitted: every limit holds n
			idx[i] = r.took[i].idx
		}
	}
	return idx, nil
}

// fast decides every limit that does not hold n yet from the lease in
// hand, without waiting: it reports whether one denied and how many could
// not decide.
func (m *Multi) fast(r *round, n int64, states []ratelimit.LimitState) (denied bool, missed int) {
	for i, h := range m.lims {
		if r.took[i] != nil {
			continue // it holds n already
		}
		var d ratelimit.Decision
		l, v, ok := r.cs[i].take(h.p, n, h.mono(), &d)
		h.tell(r.cs[i], v)
		r.asked[i] = ok
		if !ok {
			missed++
			continue
		}
		states[i], r.took[i] = stateOf(d), l
		denied = denied || !d.Allowed
	}
	return denied, missed
}

// giveBack gives back what r holds.
func (m *Multi) giveBack(r *round, n int64) {
	for i, h := range m.lims {
		if r.took[i] != nil {
			h.giveBack(r.cs[i], r.took[i].idx, n)
			r.took[i] = nil
		}
	}
}

// slow finishes a decision the leases in hand could not take (denied
// false) or that one of them denied: it gives back what it holds first
// (it never waits on Redis with quota in hand), then decides every limit
// that could not through its slow path (a lease, or a cold key's exact
// call), at once and within one timeout, and the limits it gave back
// again from their leases.
func (m *Multi) slow(ctx context.Context, r *round, key string, n int64, states []ratelimit.LimitState, denied bool) error {
	m.giveBack(r, n)
	var expired chan struct{}
	for attempt := 0; !denied && attempt < maxMultiAttempts; attempt++ {
		if expired == nil {
			ch := make(chan struct{})
			t := time.AfterFunc(m.timeout, func() { close(ch) })
			defer t.Stop()
			expired = ch
		}
		var ask [ratelimit.MaxLimits]bool
		for i := range m.lims {
			ask[i] = !r.asked[i]
		}
		res := m.lease(ctx, key, r.cs, ask, n, expired)
		var err error
		for i := range m.lims {
			if !ask[i] {
				continue
			}
			r.asked[i], states[i], r.took[i] = true, res[i].st, res[i].l
			denied = denied || !res[i].st.Allowed
			if err == nil {
				err = res[i].err
			}
		}
		for i, h := range m.lims {
			if r.cs[i].dead.Load() {
				// The syncer dropped the key's counter meanwhile (it looked
				// idle): a limit's slow path leases on its successor, which
				// the round goes on with. What the round gives back may go
				// to the successor's lease of the same window: Redis counts
				// those units for the key and window either way.
				r.cs[i] = h.lookup(key)
			}
		}
		if err != nil {
			m.giveBack(r, n)
			return err
		}
		if denied {
			break
		}
		// What the round admitted it holds (a cold key's exact call counted
		// it in Redis); the limits it gave back at the start decide again
		// from their leases in hand.
		d, missed := m.fast(r, n, states)
		if !d && missed == 0 {
			return nil
		}
		m.giveBack(r, n)
		denied = d
	}
	m.giveBack(r, n)
	for i, h := range m.lims {
		if !r.asked[i] {
			states[i] = r.cs[i].peek(h.p, n, h.mono(), h.facts())
		} else if states[i].Allowed {
			// It took nothing in the end: its state as it stands.
			states[i].Remaining = int(min(int64(states[i].Remaining)+n, h.p.capacity))
		}
	}
	if !denied { // the leases kept going to others: deny, as Limiter does
		for i, h := range m.lims {
			states[i].Allowed, states[i].RetryAfter = false, h.cfg.syncInterval
		}
	}
	return nil
}

// leased is what a limit's slow path decided, for Multi.lease.
type leased struct {
	st  ratelimit.LimitState
	l   *lease // the lease an admission holds n on
	err error
}

// lease decides, through each limit's slow path and concurrently, every
// limit whose lease could not decide (ask[i]), all within expired. Its
// arguments and results are values, so that the fast path's arrays never
// escape to the heap for it.
func (m *Multi) lease(ctx context.Context, key string, cs [ratelimit.MaxLimits]*counter, ask [ratelimit.MaxLimits]bool,
	n int64, expired chan struct{}) (res [ratelimit.MaxLimits]leased) {
	one := func(i int) {
		h := m.lims[i]
		d, l, err := h.slow(ctx, cs[i], key, 0, n, h.mono(), expired)
		res[i] = leased{st: stateOf(d), err: err}
		if err == nil && d.Allowed {
			res[i].l = l
		}
	}
	var wg sync.WaitGroup
	inline := -1
	for i := range m.lims {
		if !ask[i] {
			continue
		}
		if inline < 0 {
			inline = i // the first runs on this goroutine
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); one(i) }()
	}
	if inline >= 0 {
		one(inline)
	}
	wg.Wait()
	return res
}

func stateOf(d ratelimit.Decision) ratelimit.LimitState {
	return ratelimit.LimitState{Limit: d.Limit, Algorithm: d.Algorithm, Allowed: d.Allowed,
		Remaining: d.Remaining, RetryAfter: d.RetryAfter, ResetAfter: d.ResetAfter}
}

// peek returns c's state as the instance knows it at now, without
// consuming or asking Redis: what its lease holds and what Redis last
// reported free.
func (c *counter) peek(p *params, n, now int64, f fleet) ratelimit.LimitState {
	idx, end := int64(0), int64(noEnd) // a bucket's lease and remainder
	lc := c.lock()
	if !p.bucket {
		idx, end = p.policy.window(lc, now, f)
	}
	have := int64(0)
	if l := lc.cur.Load(); l != nil && l.idx == idx && now < l.end() {
		have = max(0, l.avail.Load())
	}
	free, known := lc.knownFree(idx)
	lc.unlock()
	rem := p.capacity
	if known {
		rem = min(have+max(0, free), p.capacity)
	}
	st := ratelimit.LimitState{Limit: p.limit, Algorithm: p.alg, Remaining: int(rem)}
	var wait int64
	if p.bucket {
		st.ResetAfter = time.Duration(p.bucketReset(rem))
		if rem < n { // until the refill brings the missing tokens
			wait = ((n-rem)*p.periodNS + p.rate - 1) / p.rate
		}
	} else {
		st.ResetAfter = time.Duration(max(0, end-now))
		if rem < n {
			wait = max(0, end-now)
		}
	}
	if until := c.blockedUntil.Load(); now < until {
		wait = max(wait, until-now, c.blockedRetry.Load()-now)
	}
	st.RetryAfter, st.Allowed = time.Duration(wait), wait == 0
	return st
}

// Ping reports whether Redis serves every limit of the Multi (see
// Limiter.Ping).
func (m *Multi) Ping(ctx context.Context) error {
	for _, h := range m.lims {
		if err := h.Ping(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Stats returns the statistics of each limit, in order (see Stats). A
// limit counts as allowed the decisions it admitted that another limit
// then denied: it gave their units back.
func (m *Multi) Stats() []Stats {
	s := make([]Stats, len(m.lims))
	for i, h := range m.lims {
		s[i] = h.Stats()
	}
	return s
}

// Flush reconciles every limit's leases with Redis now (see
// Limiter.Flush).
func (m *Multi) Flush(ctx context.Context) error {
	errs := make([]error, len(m.lims))
	var wg sync.WaitGroup
	for i, h := range m.lims {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = h.Flush(ctx) }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Close stops every limit's syncer after a final flush, in parallel (see
// Limiter.Close). Decisions after Close return ratelimit.ErrClosed.
func (m *Multi) Close() error {
	errs := make([]error, len(m.lims))
	var wg sync.WaitGroup
	for i, h := range m.lims {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = h.Close() }()
	}
	wg.Wait()
	return errors.Join(errs...)
}
