package global

import (
	"context"
	_ "embed"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/check"
	"github.com/hybridlimit/ratelimit/internal/script"
)

//go:embed multi.lua
var multiLua string

// multiScript decides several limits at once and settles reservations.
var multiScript = script.New(algorithmsLua + multiLua)

// SettleRecordTTL is how long Redis keeps the record of a settled
// reservation (one small string per settlement): a Settle retried within it
// after an error (a lost reply, say) finds the record and is applied at most
// once. A retry later than SettleRecordTTL - 10s after the first attempt
// gives nothing back (a refund could be applied twice) but still charges an
// overdraft (which then may be charged twice: the safe side).
const SettleRecordTTL = time.Minute

// settleLate is how long after its first attempt a Settle is sent as a late
// retry: the record of an applied first attempt lives until at least
// SettleRecordTTL after that attempt was sent; 10s cover its transit. A
// variable for tests.
var settleLate = SettleRecordTTL - 10*time.Second

// Multi is an exact limiter of several limits per key whose state lives in
// Redis: each decision is one atomic Lua script call that asks every limit
// and consumes from all of them or, when any denies, from none (a request
// the daily limit denies is not counted by the per-second one, and writes
// nothing). All state of a key shares one Cluster hash tag, so each call
// touches one slot.
//
// Each limit counts with its own Algorithm to the semantics of
// docs/algorithms.md, exactly as package local's Multi, in the state a
// Limiter of that limit and algorithm counts in (its keys are named by the
// algorithm and the limit), so a Multi and Limiters, or a hybrid limiter,
// on one prefix share each limit's quota.
//
// The Decision describes the tightest limit and lists every limit's state
// in Decision.Limits (see ratelimit.Combine).
//
// A Multi is made by NewMulti; the zero value is not usable. It is safe for
// concurrent use by multiple goroutines, and holds no resources of its own.
type Multi struct {
	set    limitSet
	client redis.UniversalClient
	prefix string
	clock  func() time.Time
	fail   *failure
	ledger *ledger // FailLocal: the outage bound of each limit (ledger.go)
}

var _ ratelimit.MultiLimiter = (*Multi)(nil)

// NewMulti returns a Multi that enforces every one of limits on each key,
// through client. The Algorithm of each limit is given by WithAlgorithms
// (one per limit, in order) or WithAlgorithm (the same for all); the
// default is DefaultAlgorithm. Any algorithms may be mixed. The other
// options are those of New; with WithFailureMode, FailLocal's fallback
// should be a local.Multi of this instance's share of each limit, and
// WithInstances (or WithInstancesFunc) the fleet's size: FailLocal keeps
// each limit within the outage bound of a Limiter of it (see Limiter).
//
// It returns an error wrapping ratelimit.ErrInvalidLimit,
// ErrInvalidAlgorithm or ErrInvalidOption for no limits, more than
// ratelimit.MaxLimits, an invalid one, two of one Algorithm and Period, or
// not one algorithm per limit, and ratelimit.ErrInvalidOption for a nil
// client or an option out of range. NewMulti does not talk to
// Redis.
func NewMulti(client redis.UniversalClient, limits []ratelimit.Limit, opts ...Option) (*Multi, error) {
	c, err := newConfig(client, opts)
	if err != nil {
		return nil, err
	}
	algs := c.algorithmsFor(len(limits))
	if err := check.Limits(limits, algs); err != nil {
		return nil, err
	}
	m := &Multi{set: newLimitSet(limits, algs, true), client: client, prefix: c.prefix, clock: c.clock}
	if m.fail, err = newFailure(&c); err != nil {
		return nil, err
	}
	if m.fail != nil && m.fail.mode == ratelimit.FailLocal {
		m.ledger = newLedger(limits, algs, m.fail.settle(), c.instancesFunc())
	}
	return m, nil
}

// Limits returns the limits the Multi enforces, in order.
func (m *Multi) Limits() []ratelimit.Limit { return append([]ratelimit.Limit(nil), m.set.limits...) }

// Algorithms returns the Algorithm of each limit, in order.
func (m *Multi) Algorithms() []ratelimit.Algorithm {
	return append([]ratelimit.Algorithm(nil), m.set.algs...)
}

// Allow is AllowN(ctx, key, 1).
func (m *Multi) Allow(ctx context.Context, key string) (ratelimit.Decision, error) {
	return m.AllowNInto(ctx, key, 1, nil)
}

// AllowN reports whether n events for key may happen now under every limit
// and, if so, consumes them from every limit, in one atomic script call.
//
// It returns an error wrapping ratelimit.ErrInvalidKey for an empty key or
// ratelimit.ErrInvalidN for n <= 0 or n above the capacity of any limit,
// before any Redis call; and the Redis error (or ctx's) when the script
// cannot run, with a zero Decision, unless WithFailureMode says otherwise.
func (m *Multi) AllowN(ctx context.Context, key string, n int) (ratelimit.Decision, error) {
	return m.AllowNInto(ctx, key, n, nil)
}

// AllowNInto is AllowN that writes the state of each limit into *states,
// reusing its array when its capacity holds them all; the Decision's
// Limits is *states. A nil states is AllowN.
func (m *Multi) AllowNInto(ctx context.Context, key string, n int, states *[]ratelimit.LimitState) (ratelimit.Decision, error) {
	base, now, err := m.set.check(m.prefix, m.clock, key, n)
	if err != nil {
		return ratelimit.Decision{}, err
	}
	if m.ledger != nil {
		return m.decideLedger(ctx, key, base, now, n, states)
	}
	var d ratelimit.Decision
	fallback, err := m.fail.run(ctx, func(ctx context.Context) error {
		var err error
		d, _, _, err = m.set.take(ctx, m.client, base, now, n, states, nil)
		return err
	})
	switch {
	case fallback:
		return m.fail.decideMulti(ctx, &m.set, key, n, states)
	case err != nil:
		return ratelimit.Decision{}, err
	}
	return d, nil
}

// decideLedger is AllowNInto of a FailLocal Multi: each limit within its
// outage bound (ledger.go), and what the fallback admitted charged to
// every limit with the key's next script call.
func (m *Multi) decideLedger(ctx context.Context, key, base string, now any, n int, states *[]ratelimit.LimitState) (ratelimit.Decision, error) {
	g := m.ledger
	k := len(m.set.limits)
	states = check.States(states, k)
	var c ledgerCall
	var buf [2 * ratelimit.MaxLimits]int64
	if !g.begin(&c, key, nowUS(m.clock), n, *states) {
		if carry := c.charges(k, &buf); carry != nil {
			m.chargeLedger(ctx, key, base, now, &c, carry)
		}
		return ratelimit.Combine(states), nil
	}
	carry := c.charges(k, &buf) // nil: no charge
	var d ratelimit.Decision
	var charged uint16
	fallback, err := m.fail.run(ctx, func(ctx context.Context) error {
		var err error
		d, _, charged, err = m.set.take(ctx, m.client, base, now, n, states, carry)
		return err
	})
	switch {
	case fallback:
		lk := g.lockOutage(&c, key, *states)
		if lk == nil {
			m.fail.count.Add(1)
			return ratelimit.Combine(states), nil
		}
		defer lk.mu.Unlock()
		t := nowUS(m.clock)
		d, err := m.fail.decideMulti(ctx, &m.set, key, n, states)
		if err == nil && d.Allowed {
			ls := d.Limits()
			if len(ls) != k { // a fallback of one limit: the windows as asked
				var none [ratelimit.MaxLimits]ratelimit.LimitState
				if !g.admitLocal(lk, &c, t, none[:k]) {
					return ratelimit.Decision{Limit: d.Limit, Algorithm: d.Algorithm}, nil
				}
			} else if !g.admitLocal(lk, &c, t, ls) {
				return ratelimit.Combine(&ls), nil
			}
		}
		return d, err
	case err != nil:
		g.abort(&c, key)
		return ratelimit.Decision{}, err
	}
	if !g.end(&c, key, nowUS(m.clock), d.Allowed, charged, *states) {
		return ratelimit.Combine(states), nil
	}
	return d, nil
}

// chargeLedger sends what a decision the ledger refused carries, alone:
// a decision of nothing with the charges, under the failure policy. Its
// outcome is the ledger's only; a charge not applied is owed again.
func (m *Multi) chargeLedger(ctx context.Context, key, base string, now any, c *ledgerCall, charges []int64) {
	g := m.ledger
	var states []ratelimit.LimitState
	var charged uint16
	fallback, err := m.fail.run(ctx, func(ctx context.Context) error {
		var err error
		_, _, charged, err = m.set.take(ctx, m.client, base, now, 0, &states, charges)
		return err
	})
	if fallback || err != nil {
		g.abort(c, key)
		return
	}
	g.end(c, key, nowUS(m.clock), false, charged, states)
}

// Reserve decides as AllowN(ctx, key, estimate) (without the failure mode:
// a Redis error is returned) and returns the decision as a
// ratelimit.Reservation, to be settled with the actual cost (see
// ratelimit.Reservation for the model, docs/algorithms.md for each
// algorithm's rule). Settling is one script call that applies the
// settlement at most once, whatever replies are lost (see
// SettleRecordTTL). It returns an error wrapping
// ratelimit.ErrInvalidAlgorithm when a limit counts with SlidingLog, whose
// log of at most Rate events per key cannot hold an overdraft.
func (m *Multi) Reserve(ctx context.Context, key string, estimate int) (*ratelimit.Reservation, error) {
	return m.set.reserve(ctx, m.client, m.prefix, m.clock, key, estimate)
}

// limitSet is what multi.lua needs to know of a limiter's limits. global's
// Limiter reserves through a limitSet of its one limit, named as its own
// keys.
type limitSet struct {
	single     bool // a Limiter's: its Decisions list no Limits
	limits     []ratelimit.Limit
	algs       []ratelimit.Algorithm
	spec       []any // ARGV[9:] of multi.lua: k, then five values per limit
	maxN       int   // the largest n every limit can take
	canReserve bool  // no SlidingLog limit
}

// newLimitSet describes limits and algs, checked by the caller, to
// multi.lua. Each limit's state is named by script.Kind, as a single
// limiter's of the same limit and algorithm, so they share it. multi is
// false for a Limiter's one limit: its Decisions list no Limits.
func newLimitSet(limits []ratelimit.Limit, algs []ratelimit.Algorithm, multi bool) limitSet {
	s := limitSet{
		single:     !multi,
		limits:     append([]ratelimit.Limit(nil), limits...),
		algs:       append([]ratelimit.Algorithm(nil), algs...),
		spec:       make([]any, 0, 1+5*len(limits)),
		canReserve: true,
	}
	s.spec = append(s.spec, len(limits))
	for i, l := range limits {
		a := algs[i]
		s.spec = append(s.spec, int(a), script.Kind(a, l), l.Rate, int64(l.Period/time.Microsecond), l.Capacity(a))
		if maxN := l.Capacity(a); i == 0 || maxN < s.maxN {
			s.maxN = maxN
		}
		if a == ratelimit.SlidingLog {
			s.canReserve = false
		}
	}
	return s
}

// check validates a request and returns the key's base and the now
// argument of the script: "" for Redis TIME, or the clock's microseconds.
func (s *limitSet) check(prefix string, clock func() time.Time, key string, n int) (string, any, error) {
	if err := check.Key(key); err != nil {
		return "", nil, err
	}
	if n <= 0 || n > s.maxN {
		return "", nil, check.NLimits(s.limits, s.algs, n)
	}
	base, err := script.KeyBase(prefix, key)
	if err != nil {
		return "", nil, err
	}
	now, err := clockArg(clock)
	return base, now, err
}

// args returns the ARGV of one multi.lua call, with charges (two values
// per limit, or none) after the limits.
func (s *limitSet) args(op string, now any, n int, actual, t0 int64, id string, late bool, charges []int64) []any {
	lateArg := 0
	if late {
		lateArg = 1
	}
	args := make([]any, 0, 8+len(s.spec)+len(charges))
	args = append(args, op, now, n, actual, t0, id, lateArg, SettleRecordTTL.Milliseconds())
	args = append(args, s.spec...)
	for _, v := range charges {
		args = append(args, v)
	}
	return args
}

// take runs the script's take for n events at base and returns the
// Decision, with the limits' states in *states (see check.States), and the
// time the script used. charges, unless nil, are what this instance
// admitted without Redis, two values per limit (the window, the events),
// charged first; bit i of charged reports limit i's applied.
func (s *limitSet) take(ctx context.Context, c redis.UniversalClient, base string, now any, n int, states *[]ratelimit.LimitState, charges []int64) (d ratelimit.Decision, t int64, charged uint16, err error) {
	res, err := multiScript.Run(ctx, c, []string{base}, s.args("take", now, n, 0, 0, "", false, charges)...).Int64Slice()
	if err != nil {
		if cerr := callerEnded(ctx); cerr != nil {
			return ratelimit.Decision{}, 0, 0, cerr // the caller gave up, not Redis
		}
		return ratelimit.Decision{}, 0, 0, fmt.Errorf("global: multi-limit script: %w", err)
	}
	k := len(s.limits)
	want := 2 + 4*k
	if charges != nil {
		want += k
	}
	if len(res) != want {
		return ratelimit.Decision{}, 0, 0, fmt.Errorf("global: multi-limit script returned %d values, want %d", len(res), want)
	}
	if charges != nil {
		for i, v := range res[2+4*k:] {
			if v == 1 {
				charged |= 1 << i
			}
		}
	}
	if s.single { // a Limiter's decision lists no Limits
		r := res[2:]
		return ratelimit.Decision{Allowed: r[0] == 1, Limit: s.limits[0], Algorithm: s.algs[0], Remaining: int(r[1]),
			RetryAfter: time.Duration(r[2]) * time.Microsecond, ResetAfter: time.Duration(r[3]) * time.Microsecond}, res[0], charged, nil
	}
	states = check.States(states, k)
	for i := range *states {
		r := res[2+4*i:]
		(*states)[i] = ratelimit.LimitState{Limit: s.limits[i], Algorithm: s.algs[i], Allowed: r[0] == 1,
			Remaining: int(r[1]), RetryAfter: time.Duration(r[2]) * time.Microsecond, ResetAfter: time.Duration(r[3]) * time.Microsecond}
	}
	return ratelimit.Combine(states), res[0], charged, nil
}

// reserve is Reserve for the limits of s.
func (s *limitSet) reserve(ctx context.Context, c redis.UniversalClient, prefix string, clock func() time.Time, key string, estimate int) (*ratelimit.Reservation, error) {
	if !s.canReserve {
		return nil, fmt.Errorf("%w: SlidingLog limits cannot be reserved", ratelimit.ErrInvalidAlgorithm)
	}
	base, now, err := s.check(prefix, clock, key, estimate)
	if err != nil {
		return nil, err
	}
	d, t0, _, err := s.take(ctx, c, base, now, estimate, nil, nil)
	if err != nil {
		return nil, err
	}
	if !d.Allowed {
		return ratelimit.NewReservation(d, estimate, nil), nil
	}
	id := strconv.FormatUint(rand.Uint64(), 36)
	return ratelimit.NewReservation(d, estimate, &settler{set: s, client: c, base: base, clock: clock, id: id, t0: t0, est: int64(estimate)}), nil
}

// settler settles one reservation: multi.lua applies it and leaves a
// record, KEYS[1] .. "rsv:" .. id, that makes any retry a no-op. The
// Reservation serializes its calls.
type settler struct {
	set    *limitSet
	client redis.UniversalClient
	base   string
	clock  func() time.Time
	id     string
	t0     int64
	est    int64
	first  time.Time // when the first attempt was sent; zero before
}

func (s *settler) Settle(ctx context.Context, actual int) error {
	now, err := clockArg(s.clock)
	if err != nil {
		return err
	}
	late := false
	if s.first.IsZero() {
		s.first = time.Now()
	} else {
		late = time.Since(s.first) > settleLate
	}
	args := s.set.args("settle", now, int(s.est), int64(actual), s.t0, s.id, late, nil)
	res, err := multiScript.Run(ctx, s.client, []string{s.base}, args...).Int64Slice()
	if err != nil {
		return fmt.Errorf("global: settle: %w", err)
	}
	if len(res) != 3 {
		return fmt.Errorf("global: settle script returned %d values, want 3", len(res))
	}
	if res[1] == 2 {
		return fmt.Errorf("%w: with %d, not %d", ratelimit.ErrSettled, res[2], actual)
	}
	return nil
}
