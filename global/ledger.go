package global

import (
	"context"
	"math/rand/v2"
	"strconv"
	gosync "sync"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/local"
)

// The outage bound of FailLocal for the window algorithms.
//
// While Redis answers, the Limiter notes for each key the remainder Redis
// last reported for its window (a bounded table, DefaultLedgerKeys keys).
// When a decision must be taken without Redis, the window the outage
// begins in is cautious: this instance may admit in it at most its budget,
// the window's last-known remainder shared by the instances
// (WithInstances), and in a window that begins during the outage its
// share of the limit, Rate / instances; the fallback limiter (WithFallback)
// must admit too. What it admits locally in a FixedWindow is charged to the
// window in Redis with its next decision on the key there (one take.lua
// call: the credit first, then the decision). A window stays cautious once Redis answers
// again, if the outage touched it: the instance's admissions in it, Redis'
// and its own, stay within its budget. So a window touched by an outage
// admits at most what Redis had counted before it, plus every instance's
// budget: at most Rate when every instance knew the remainder lately, and
// Rate in a window that begins during the outage. See
// docs/failure-modes.md.

// DefaultLedgerKeys is how many keys' windows a FailLocal Limiter of a
// window algorithm remembers (least recently used first out).
const DefaultLedgerKeys = 100_000

// ledger is what a FailLocal Limiter knows of its keys' windows and of the
// last outage it saw. It is safe for concurrent use.
type ledger struct {
	limit     ratelimit.Limit
	periodUS  int64
	fw        bool  // FixedWindow: local admissions are charged to Redis
	settleUS  int64 // how long after an outage a window that begins stays cautious
	instances func() int
	keys      *local.Table[*ledgerEntry]

	mu      gosync.Mutex
	outFrom int64 // microseconds: the first decision taken without Redis of the last outage; 0: none
	outTo   int64 // microseconds: the first answer after it; 0 while it lasts
}

// ledgerEntry is one key's window as this instance knows it.
type ledgerEntry struct {
	mu     gosync.Mutex
	win    int64 // window index
	free   int64 // the remainder Redis last reported for win; -1: not known
	budget int64 // what this instance may admit in win once cautious; -1: not cautious
	used   int64 // admitted by this instance in win since it became cautious
	debt   int64 // admitted locally in win, not charged to Redis yet
}

func newLedger(limit ratelimit.Limit, alg ratelimit.Algorithm, settle time.Duration, instances func() int) *ledger {
	return &ledger{limit: limit, periodUS: int64(limit.Period / time.Microsecond), fw: alg == ratelimit.FixedWindow,
		settleUS: int64(settle / time.Microsecond), instances: instances, keys: local.NewTable[*ledgerEntry](DefaultLedgerKeys, nil)}
}

// entry returns key's entry, set to window win.
func (g *ledger) entry(key string, win int64) *ledgerEntry {
	e, _ := g.keys.GetOrCreate(key, func() *ledgerEntry { return &ledgerEntry{win: win, free: -1, budget: -1} })
	e.mu.Lock()
	e.moveTo(win)
	return e // locked
}

// moveTo sets e, locked, to window win if that is a later one (a clock
// that stepped back keeps the later window): a window that ended owes
// nothing more.
func (e *ledgerEntry) moveTo(win int64) {
	if win > e.win {
		e.win, e.free, e.budget, e.used, e.debt = win, -1, -1, 0, 0
	}
}

// decidedIn returns the window a decision counted in, from the time t
// (µs) read before it was taken and its ResetAfter (for FixedWindow, the
// time to its window's end when it was taken): a decision that crossed a
// window's end counts in the next. Other algorithms: win.
func (g *ledger) decidedIn(win, t int64, d ratelimit.Decision) int64 {
	if !g.fw || d.ResetAfter <= 0 {
		return win
	}
	return max(win, (t+d.ResetAfter.Microseconds()-1)/g.periodUS)
}

// cautious reports whether window win was touched by the last outage, or
// begins within settleUS after it ended (another instance may still be
// deciding locally then, its breaker open a while longer, its admissions
// not charged yet), or one is under way.
func (g *ledger) cautious(win int64) bool {
	g.mu.Lock()
	from, to := g.outFrom, g.outTo
	g.mu.Unlock()
	start := win * g.periodUS
	return from != 0 && (to == 0 || start < to+g.settleUS) && start+g.periodUS > from
}

// down notes a decision taken without Redis at now (µs).
func (g *ledger) down(now int64) {
	g.mu.Lock()
	if g.outFrom == 0 || g.outTo != 0 {
		g.outFrom, g.outTo = now, 0
	}
	g.mu.Unlock()
}

// up notes an answer from Redis at now (µs).
func (g *ledger) up(now int64) {
	g.mu.Lock()
	if g.outFrom != 0 && g.outTo == 0 {
		g.outTo = now
	}
	g.mu.Unlock()
}

// caution makes e, locked, cautious if it is not: its budget is the
// window's last-known remainder shared by the instances, or, not known,
// the instances' share of the limit.
func (g *ledger) caution(e *ledgerEntry) {
	if e.budget >= 0 {
		return
	}
	n := int64(max(1, g.instances()))
	if e.free >= 0 {
		e.budget = e.free / n
	} else {
		e.budget = int64(g.limit.Rate) / n
	}
}

// window returns the window of now (µs) and the time left in it.
func (g *ledger) window(now int64) (int64, time.Duration) {
	win := now / g.periodUS
	return win, time.Duration((win+1)*g.periodUS-now) * time.Microsecond
}

// refuse is the denial of a cautious window's spent budget.
func (g *ledger) refuse(alg ratelimit.Algorithm, left time.Duration) ratelimit.Decision {
	return ratelimit.Decision{Limit: g.limit, Algorithm: alg, RetryAfter: left, ResetAfter: left}
}

// now is the ledger's time: WithClock's, or the local clock.
func nowUS(clock func() time.Time) int64 {
	if clock != nil {
		return clock().UnixMicro()
	}
	return time.Now().UnixMicro()
}

// decideLedger is AllowN of a FailLocal Limiter of a window algorithm.
func (l *Limiter) decideLedger(ctx context.Context, key, base string, n int, args []any) (ratelimit.Decision, error) {
	g := l.ledger
	now := nowUS(l.clock)
	win, left := g.window(now)
	cautious := g.cautious(win)
	var charge int64
	if cautious || g.fw {
		e := g.entry(key, win)
		if cautious {
			g.caution(e)
			if e.used+int64(n) > e.budget {
				e.mu.Unlock()
				return g.refuse(l.alg, left), nil
			}
			e.used += int64(n) // reserved: given back unless Redis admits
		}
		charge = e.debt
		e.mu.Unlock()
	}
	// unreserve gives back what a cautious decision reserved, e locked.
	unreserve := func(e *ledgerEntry) {
		if cautious && e.win == win {
			e.used = max(0, e.used-int64(n))
		}
	}
	var res []int64
	var charged bool
	fallback, err := l.fail.run(ctx, func(ctx context.Context) error {
		var err error
		if g.fw {
			// (the charge and the decision in one take.lua call)
			res, charged, err = l.take(ctx, base, n, win, charge)
			return err
		}
		res, err = l.script.Run(ctx, l.client, []string{base}, args...).Int64Slice()
		return err
	})
	switch {
	case fallback:
		g.down(now)
		e := g.entry(key, win)
		defer e.mu.Unlock()
		unreserve(e)
		g.caution(e)
		if e.used+int64(n) > e.budget {
			l.fail.count.Add(1)
			return g.refuse(l.alg, left), nil
		}
		t := nowUS(l.clock)
		d, err := l.fail.decide(ctx, l.limit, l.alg, key, n)
		if err == nil && d.Allowed {
			if dw := g.decidedIn(win, t, d); dw > e.win {
				e.moveTo(dw) // the fallback counted it in the next window
				g.caution(e)
			}
			e.used += int64(n)
			if g.fw {
				e.debt += int64(n)
			}
		}
		return d, err
	case err != nil:
		e := g.entry(key, win)
		unreserve(e)
		e.mu.Unlock()
		if callerEnded(ctx) != nil {
			return ratelimit.Decision{}, err
		}
		return ratelimit.Decision{}, wrapScriptErr(l.alg, err)
	}
	d, err := l.decision(res)
	if err != nil {
		e := g.entry(key, win)
		unreserve(e)
		e.mu.Unlock()
		return d, err
	}
	// The outage ends when the answer comes (the call may have been sent
	// during it): a window that began before is cautious.
	g.up(nowUS(l.clock))
	e := g.entry(key, win)
	if charged && e.win == win {
		e.debt = max(0, e.debt-charge)
	}
	if !d.Allowed {
		unreserve(e)
	}
	dw := g.decidedIn(win, now, d)
	if len(res) == 5 {
		dw = max(win, res[4]) // take's window: exact
	}
	if dw > e.win {
		// Redis counted it in the next window: it is that window's
		unreserve(e)
		e.moveTo(dw)
		if d.Allowed && g.cautious(dw) {
			g.caution(e)
			e.used += int64(n)
		}
	}
	if dw == e.win {
		e.free = int64(d.Remaining) // (not a reply of a window gone by)
	}
	e.mu.Unlock()
	return d, nil
}

// The buckets (TokenBucket, GCRA) under FailLocal: a bucket has no
// window to share out, so while Redis cannot answer the fallback limiter
// decides alone (typically a local bucket of Rate / instances and Burst /
// instances), and what it admitted is charged to the key's bucket in
// Redis before this instance's next decision on it there: as the
// settlement of a reservation of nothing, an overdraft that the bucket
// refills (docs/algorithms.md, "Reserve and settle"), applied at most once
// whatever replies are lost (its record). So the fleet admits at most what
// the bucket allows plus what the local buckets held when the outage began
// (at most Burst, for shares that add up to the limit) and what instances
// still cut off admit before they charge.

// bucketDebt is what one key's local admissions owe its bucket in Redis.
type bucketDebt struct {
	mu     gosync.Mutex
	units  int64
	charge *settler // the charge in progress (its id makes a retry a no-op); nil: none
	sent   int64    // the units charge carries
}

// bucketLedger holds the keys' debts.
type bucketLedger struct {
	keys *local.Table[*bucketDebt]
}

func newBucketLedger() *bucketLedger {
	return &bucketLedger{keys: local.NewTable[*bucketDebt](DefaultLedgerKeys, nil)}
}

// decideBucket is AllowN of a FailLocal Limiter of a bucket algorithm.
func (l *Limiter) decideBucket(ctx context.Context, key, base string, n int, args []any) (ratelimit.Decision, error) {
	b := l.buckets
	var res []int64
	fallback, err := l.fail.run(ctx, func(ctx context.Context) error {
		if v, ok := b.keys.Peek(key); ok {
			if err := l.chargeBucket(ctx, v, base); err != nil {
				return err
			}
		}
		var err error
		res, err = l.script.Run(ctx, l.client, []string{base}, args...).Int64Slice()
		return err
	})
	switch {
	case fallback:
		d, err := l.fail.decide(ctx, l.limit, l.alg, key, n)
		if err == nil && d.Allowed {
			v, _ := b.keys.GetOrCreate(key, func() *bucketDebt { return &bucketDebt{} })
			v.mu.Lock()
			v.units += int64(n)
			v.mu.Unlock()
		}
		return d, err
	case err != nil && callerEnded(ctx) != nil:
		return ratelimit.Decision{}, err
	case err != nil:
		return ratelimit.Decision{}, wrapScriptErr(l.alg, err)
	}
	return l.decision(res)
}

// chargeBucket charges what v owes to the key's bucket, as the settlement
// of a reservation of nothing: one settle call, whose id stays until it is
// known applied, so that a call whose reply was lost is sent again as a
// no-op rather than charged twice.
func (l *Limiter) chargeBucket(ctx context.Context, v *bucketDebt, base string) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.charge == nil {
		if v.units == 0 {
			return nil
		}
		now := nowUS(l.clock)
		v.charge = &settler{set: &l.set, client: l.client, base: base, clock: l.clock,
			id: strconv.FormatUint(rand.Uint64(), 36), t0: now}
		v.sent = v.units
	}
	if err := v.charge.Settle(ctx, int(v.sent)); err != nil {
		return err
	}
	v.units -= v.sent
	v.charge, v.sent = nil, 0
	return nil
}
