package hybrid

import (
	"math"
	gosync "sync"
	"sync/atomic"
	"time"

	"github.com/hybridlimit/ratelimit"
)

// The per-key state machine.
//
// A counter is one key's local state: the lease decisions take from, the
// lease of the next window taken ahead of it, credit, debts to Redis, the
// refusal Redis last gave, and the key's demand. Every transition on it is
// a method that takes the time (mono ns) and the fleet's facts as values
// and returns what the Limiter must do (send a call, mark the key for the
// syncer, count stats): no Redis, no syncer, no stats, no clock reads in
// here, so each transition is tested with explicit times (counter_test.go).
//
// Locking is in the types: the decision path reads the atomics of
// *counter lock-free; whatever needs the key's mutex is a method of
// *lockedCounter, which only counter.lock returns.
type counter struct {
	key  string // the key as kept in memory (see Limiter.lookup)
	hash uint64 // seen.hash of key: where the index holds it (index.go)

	// Read by decisions without a lock.
	cur          atomic.Pointer[lease] // the lease decisions take from
	blockedUntil atomic.Int64          // mono ns: Redis has less than blockedMin for the key until then
	blockedMin   atomic.Int64          // what a lease call failed to get: decisions that need as much from Redis are denied
	blockedRetry atomic.Int64          // mono ns: when Redis said blockedMin would fit (at or after blockedUntil)
	lastUse      atomic.Int64          // mono ns of the last decision, to a 32nd of the period
	missed       atomic.Uint64         // denied since the last tick: decisions << 32 | units
	exact        atomic.Uint64         // admitted by an exact call since the last tick: decisions << 32 | units
	allowed      atomic.Uint64         // allowed decisions of past ticks (the tick folds lease.tick into it)
	denied       atomic.Uint64         // denied decisions of past ticks (the tick folds missed into it)
	waited       atomic.Uint64         // decisions that waited on Redis

	// The Limiter's bookkeeping of the key.
	dirty   atomic.Bool // marked for the syncer
	dead    atomic.Bool // evicted or dropped from the table
	touched atomic.Bool // the LRU table heard of a use since the last tick
	lead    int64       // ns before its window's end that the key leases the next window

	mu gosync.Mutex // guards what follows, and replacing cur: see lockedCounter

	next  *lease // quota of the next window, leased ahead of it
	debts []debt
	// kept: the debts are refunds kept for the key's next call (see
	// keepRefunds), which no tick needs to send.
	kept bool
	old  []*lease   // replaced since the last tick: their counts are folded at the next one
	out  *leaseCall // the key's outstanding lease call, if any (see leaseCall)

	nextIdx int64 // the lowest window an estimated lease may take
	// What the last window seen of this key is known to have: its index,
	// what was borrowed in it on credit, its remainder in Redis.
	spentIdx int64
	spent    int64
	freeIdx  int64
	freeVal  int64

	// Demand, in units asked (allowed or denied): smoothed, in units per
	// period, over the syncer's visits (the last at planned), and counted
	// per window (the window askedIdx, and the one before it).
	rate      float64
	planned   int64
	askedIdx  int64
	asked     int64
	prevAsked int64

	// After an outage (see afterOutage): the budget the key was given on
	// credit in window budIdx, and what was granted it in window
	// cautionIdx since the outage.
	budIdx, bud                int64
	cautionIdx, cautionGranted int64

	// Units asked through the slow path in window slowIdx, and in the one
	// before it: how cold the key is (see cold).
	slowIdx  int64
	slowUses int64
	slowPrev int64

	expired   int64 // leased units whose window ended before they were used
	visitTick int64 // the sync tick a visit is scheduled for (0: none)
}

// visit is how soon the syncer must see a key after a transition.
type visit uint8

const (
	visitNone visit = iota
	visitSoon       // at its next tick: marked once per tick, without a lock (Limiter.soon)
	visitNow        // marked now (Limiter.mark)
)

// or returns the sooner of v and w.
func (v visit) or(w visit) visit { return max(v, w) }

// lockedCounter is a counter whose mutex is held: the transitions that
// need the lock are its methods, so that holding it is a matter of types.
type lockedCounter counter

// lock locks c and returns it as a lockedCounter; unlock it when done.
func (c *counter) lock() *lockedCounter {
	c.mu.Lock()
	return (*lockedCounter)(c)
}

func (lc *lockedCounter) unlock()           { lc.mu.Unlock() }
func (lc *lockedCounter) counter() *counter { return (*counter)(lc) }

// take decides n units at now from the lease in hand, or denies them when
// Redis refused the key until later, into *d (the zero Decision). ok is false when neither can
// decide: the decision goes on to the slow path. An admission returns the
// lease it took n from. The syncer should hear of the key soon when its
// lease ran low, or when it was refused. (The decision is written through
// d, not returned: the hot path copies it once less.)
func (c *counter) take(p *params, n, now int64, d *ratelimit.Decision) (l *lease, v visit, ok bool) {
	l = c.cur.Load()
	if l != nil && now < l.end() {
		for {
			a := l.avail.Load()
			if a < n {
				break
			}
			if l.avail.CompareAndSwap(a, a-n) {
				c.admitted(p, l, n, now)
				if a-n < l.low.Load() {
					v = visitSoon // running low: the syncer tops it up
				}
				p.allowedInto(d, a-n+max(0, l.free.Load()), l, now)
				return l, v, true
			}
		}
	}
	if until := c.blockedUntil.Load(); now < until && n-availAt(l, now) >= c.blockedMin.Load() {
		c.refused(p, n, now)
		retry := max(until, c.blockedRetry.Load()) - now
		*d = p.denied(retry, retry)
		if l != nil && now < l.end() {
			d.Remaining = int(max(0, l.avail.Load()))
			d.ResetAfter = time.Duration(l.end() - now)
		}
		return nil, visitSoon, true
	}
	return nil, visitNone, false
}

// admitted records an admitted decision: one atomic add for the counts
// (beside avail), and a store of the last use only when it moved by a 32nd
// of the period (it serves idle detection only, and a store on every
// decision would make the line bounce between cores).
func (c *counter) admitted(p *params, l *lease, n, now int64) {
	l.tick.Add(1<<32 | uint64(n))
	c.noteUse(p, now)
}

// refused records a denied decision of n units: it counts as demand.
func (c *counter) refused(p *params, n, now int64) {
	c.missed.Add(1<<32 | uint64(n))
	c.noteUse(p, now)
}

func (c *counter) noteUse(p *params, now int64) {
	if now-c.lastUse.Load() > p.useGrain {
		c.lastUse.Store(now)
	}
}

// block records, at now, that Redis could not grant least units until
// retry (mono ns): decisions that would need as much from it are denied
// (and told retry) without asking again until then, or for maxBlock at
// most; smaller ones may still ask. Redis is asked again before retry
// because the window's remainder may be held in other instances' leases,
// which come back (a key gone quiet elsewhere, an instance closed) long
// before a long window ends.
func (c *counter) block(least, now, retry int64) {
	c.blockedMin.Store(max(0, least))
	c.blockedRetry.Store(retry)
	c.blockedUntil.Store(min(retry, now+maxBlock))
}

// maxBlock bounds how long a key waits, in ns, before asking Redis again
// for quota Redis refused it.
const maxBlock = int64(1e9)

// roll makes the lease taken ahead for the next window the one decisions
// take from, once that window has begun. It reports whether it did.
func (c *counter) roll(p *params, now int64, f fleet) (rolled bool, v visit) {
	if l := c.cur.Load(); l != nil && now < l.end() {
		return false, visitNone
	}
	lc := c.lock()
	defer lc.unlock()
	return lc.roll(p, now, f)
}

// roll: see counter.roll. The next window begins at the current lease's
// end; without a current lease, at the next lease's start less the
// estimate's error (the two come from different replies).
func (lc *lockedCounter) roll(p *params, now int64, f fleet) (rolled bool, v visit) {
	nl := lc.next
	if nl == nil {
		return false, visitNone
	}
	cur := lc.cur.Load()
	switch {
	case cur != nil && cur.idx < nl.idx && now < cur.end():
		return false, visitNone // the current window still runs
	case cur == nil && now < nl.start-f.clock.ErrorBound():
		return false, visitNone
	}
	lc.next = nil
	if cur != nil && cur.idx >= nl.idx || now >= nl.end() {
		// It cannot serve: a lease of its window is in hand, or its window
		// is over too.
		lc.retire(p, nl, now, f)
		return false, visitNone
	}
	lc.cur.Store(nl)
	if cur != nil {
		lc.retireAndStep(p, cur, now, f)
		return true, visitNow
	}
	return true, visitNone
}

// retire turns what lease l holds into debts, or drops its unused units
// when its window bounds nothing any more (see policy.obsolete), and
// remembers what its window borrowed. l must be unpublished already.
func (lc *lockedCounter) retire(p *params, l *lease, now int64, f fleet) {
	lc.old = append(lc.old, l)
	b := l.closeBorrowing()
	refund, use := l.avail.Swap(0), l.credit.Swap(0)
	if p.policy.obsolete(l.idx, now, f) {
		lc.expired += refund
		refund = 0
	}
	lc.owe(l.idx, refund, use)
	if l.idx >= lc.spentIdx {
		lc.spentIdx, lc.spent = l.idx, b
	}
}

// retireAndStep retires the lease that was current and keeps estimates
// from ever stepping back into its window; the syncer must then visit the
// key (visitNow).
func (lc *lockedCounter) retireAndStep(p *params, l *lease, now int64, f fleet) {
	lc.retire(p, l, now, f)
	lc.nextIdx = max(lc.nextIdx, l.idx+1)
}

// retireAll takes c's leases away and turns what they hold into debts
// (Flush, Close, eviction). It reports whether there is something to send.
func (lc *lockedCounter) retireAll(p *params, now int64, f fleet) bool {
	if l := lc.cur.Swap(nil); l != nil {
		lc.retire(p, l, now, f)
	}
	if l := lc.next; l != nil {
		lc.next = nil
		lc.retire(p, l, now, f)
	}
	return len(lc.debts) > 0 || lc.out != nil
}

// awaitsTick reports whether the key needs the syncer's next tick: it
// owes Redis what a tick sends (refunds kept for its next call excepted,
// while it is in the table), or its call waits for a reply (resent at the
// tick if it was lost).
func (lc *lockedCounter) awaitsTick() bool {
	return len(lc.debts) > 0 && (!lc.kept || lc.dead.Load()) || lc.out != nil
}

// owe records quota owed for window idx (for a tick to send).
func (lc *lockedCounter) owe(idx, refund, use int64) {
	lc.oweDebt(debt{idx: idx, refund: refund, use: use})
}

// oweDebt adds d to what the key owes for d's window.
func (lc *lockedCounter) oweDebt(d debt) {
	if d.refund == 0 && d.use == 0 && d.back == 0 {
		return
	}
	lc.kept = false
	for i := range lc.debts {
		if o := &lc.debts[i]; o.idx == d.idx {
			o.refund, o.use, o.back = o.refund+d.refund, o.use+d.use, o.back+d.back
			return
		}
	}
	lc.debts = append(lc.debts, d)
}

// oweBack records n units a decision of window idx gives back (it used
// less than it took), for a tick to send. A bucket's go as Back: the
// tokens may be ones its record no longer covers (taken by an exact call,
// or from a lease whose record a call since reported as spent), which a
// refund would not return (see buckets.hold).
func (lc *lockedCounter) oweBack(bucket bool, idx, n int64) {
	if bucket {
		lc.oweDebt(debt{idx: idx, back: n})
	} else {
		lc.owe(idx, n, 0)
	}
}

// oweCredit turns the credit of the current lease into a debt.
func (lc *lockedCounter) oweCredit() {
	if cur := lc.cur.Load(); cur != nil {
		if cr := cur.credit.Swap(0); cr > 0 {
			lc.owe(cur.idx, 0, cr)
		}
	}
}

// oweLate turns credit added to replaced leases after they were replaced
// (a borrower between its CAS and its add) into debts.
func (lc *lockedCounter) oweLate() {
	for _, l := range lc.old {
		if cr := l.credit.Swap(0); cr > 0 {
			lc.owe(l.idx, 0, cr)
		}
	}
}

// newLease makes the lease of window idx. A window's credit budget and its
// last-known remainder survive the lease object: a lease made again for the
// same window carries them.
func (lc *lockedCounter) newLease(idx, start, end int64, known bool) *lease {
	l := &lease{idx: idx, start: start, known: known}
	l.until.Store(end)
	l.free.Store(unknownFree)
	if idx == lc.spentIdx {
		l.borrowed.Store(lc.spent)
	}
	if idx == lc.freeIdx {
		l.free.Store(lc.freeVal)
	}
	return l
}

// setFree records window idx's remainder in Redis on l (which may be nil).
// A window's count grows but for refunds, and replies may be applied out
// of order (the syncer's and the decisions' pipelines): the least remainder heard of a
// window stands, never a stale larger one.
func (lc *lockedCounter) setFree(l *lease, idx, free int64) {
	if l != nil && l.idx == idx {
		if f := l.free.Load(); f != unknownFree && f < free {
			free = f
		}
		l.free.Store(free)
	}
	switch {
	case idx > lc.freeIdx:
		lc.freeIdx, lc.freeVal = idx, free
	case idx == lc.freeIdx:
		lc.freeVal = min(lc.freeVal, free)
	}
}

// setLevel records what a bucket holds in Redis, on l (which may be nil):
// it refills, so the last word stands.
func (lc *lockedCounter) setLevel(l *lease, level int64) {
	if l != nil {
		l.free.Store(level)
	}
	lc.freeIdx, lc.freeVal = 0, level
}

// knownFree returns window idx's remainder as last heard from Redis.
func (lc *lockedCounter) knownFree(idx int64) (int64, bool) {
	for _, l := range [...]*lease{lc.cur.Load(), lc.next} {
		if l != nil && l.idx == idx {
			if f := l.free.Load(); f != unknownFree {
				return f, true
			}
		}
	}
	if idx == lc.freeIdx {
		return lc.freeVal, true
	}
	return 0, false
}

// takeTick returns and resets what the key admitted since the last tick,
// from its leases and by exact calls: allowed decisions << 32 | units. A lease taken ahead that was
// taken from is no longer untouched.
func (lc *lockedCounter) takeTick() uint64 {
	t := lc.exact.Swap(0)
	for _, l := range lc.old {
		t += l.tick.Swap(0)
	}
	lc.old = lc.old[:0]
	if l := lc.cur.Load(); l != nil {
		lt := l.tick.Swap(0)
		if lt != 0 {
			l.pre = false
		}
		t += lt
	}
	return t
}

// peekTick is takeTick without the reset.
func (lc *lockedCounter) peekTick() uint64 {
	t := lc.exact.Load()
	for _, l := range lc.old {
		t += l.tick.Load()
	}
	if l := lc.cur.Load(); l != nil {
		t += l.tick.Load()
	}
	return t
}

// counts returns what the key decided, folding in what its leases and
// refusals hold since the last tick: for Stats.
func (lc *lockedCounter) counts() (allowed, denied, waited uint64, expired int64) {
	t := lc.peekTick()
	return lc.allowed.Load() + t>>32, lc.denied.Load() + lc.missed.Load()>>32, lc.waited.Load(), lc.expired
}

// drain empties the key's counts for good (it leaves the table), for
// Stats' retired counts.
func (lc *lockedCounter) drain() (allowed, denied, waited uint64, expired int64) {
	t := lc.takeTick()
	expired, lc.expired = lc.expired, 0
	return lc.allowed.Swap(0) + t>>32, lc.denied.Swap(0) + lc.missed.Swap(0)>>32, lc.waited.Swap(0), expired
}

// creditShare is what the instance may admit on credit in window idx when
// Redis is slow or away: per, bounded by the window's last-known remainder
// shared by the instances.
func (lc *lockedCounter) creditShare(idx, per int64, f fleet) int64 {
	if free, ok := lc.knownFree(idx); ok {
		return min(per, max(0, free)/f.instances)
	}
	return per
}

// creditLease returns the lease of the window now falls in, to hold credit,
// making an empty one when the key has none.
func (c *counter) creditLease(p *params, now int64, f fleet) (*lease, visit) {
	if l := c.cur.Load(); l != nil && now < l.end() {
		return l, visitNone
	}
	lc := c.lock()
	defer lc.unlock()
	return lc.creditLease(p, now, f)
}

// creditLease is counter.creditLease with the key locked.
func (lc *lockedCounter) creditLease(p *params, now int64, f fleet) (*lease, visit) {
	if l := lc.cur.Load(); l != nil && now < l.end() {
		return l, visitNone
	}
	_, v := lc.roll(p, now, f)
	if l := lc.cur.Load(); l != nil && now < l.end() {
		return l, v
	}
	return p.policy.creditLease(lc, now, f), visitNow
}

// onCredit admits n on credit against the window now falls in, within share
// per window; the syncer reports the credit to Redis, so the caller has it
// visit the key after an admission. An admission returns the lease that
// holds the credit.
func (c *counter) onCredit(p *params, n, now, share int64, f fleet) (d ratelimit.Decision, l *lease, v visit, ok bool) {
	l, v = c.creditLease(p, now, f)
	p.policy.newCreditPeriod(c, l, now)
	for {
		b := l.borrowed.Load()
		if b >= closedBudget { // replaced meanwhile: take credit on its successor
			var w visit
			l, w = c.creditLease(p, now, f)
			v = v.or(w)
			continue
		}
		if b+n > share {
			return ratelimit.Decision{}, nil, v, false
		}
		if d, ok := c.borrow(p, l, b, n, now, share); ok {
			return d, l, v.or(visitSoon), true
		}
	}
}

// onCreditLocked is onCredit with the key locked, for a share computed
// under the same lock: a grant bounded by afterOutage (which runs locked)
// cannot come between the share and the credit taken within it.
// (Leases are closed only once unpublished, under the lock: the one in
// hand stays open.)
func (lc *lockedCounter) onCreditLocked(p *params, n, now, share int64, f fleet) (d ratelimit.Decision, l *lease, v visit, ok bool) {
	c := lc.counter()
	l, v = lc.creditLease(p, now, f)
	p.policy.creditPeriod(l, now)
	for {
		b := l.borrowed.Load()
		if b+n > share {
			return ratelimit.Decision{}, nil, v, false
		}
		if d, ok := c.borrow(p, l, b, n, now, share); ok {
			return d, l, v.or(visitSoon), true
		}
	}
}

// borrow admits n on credit on l, whose borrowed was b (b + n within
// share): it reports false when l's borrowed changed meanwhile, and the
// caller tries again.
func (c *counter) borrow(p *params, l *lease, b, n, now, share int64) (ratelimit.Decision, bool) {
	if !l.borrowed.CompareAndSwap(b, b+n) {
		return ratelimit.Decision{}, false
	}
	l.credit.Add(n)
	c.admitted(p, l, n, now)
	rem := share - b - n
	if share == math.MaxInt64 {
		rem = p.capacity
	}
	return p.allowed(rem, l, now), true
}

// giveBack returns n units a decision took in window idx: into the lease
// in hand when it is of that window (the instance's next decisions take
// them), else as a refund the syncer sends, unless the window no longer
// counts. Whether the decision took from the lease or on credit, the units
// are the instance's to give: credit is reported to Redis all the same.
func (lc *lockedCounter) giveBack(p *params, idx, n, now int64, f fleet) visit {
	if l := lc.cur.Load(); l != nil && l.idx == idx && now < l.end() && (!p.bucket || l.avail.Load()+n <= l.recorded) {
		l.avail.Add(n)
		return visitNone
	}
	if p.policy.obsolete(idx, now, f) {
		lc.expired += n
		return visitNone
	}
	lc.oweBack(p.bucket, idx, n)
	return visitNow
}

// charge takes n units for work already done, even past the limit: from
// the lease in hand as far as it goes, the rest on credit against the
// current window (or the bucket), outside any credit budget. The syncer
// reports the credit; Redis then counts the window over its limit (or the bucket below empty)
// and grants nothing until it is paid back.
func (c *counter) charge(p *params, n, now int64, f fleet) visit {
	if l := c.cur.Load(); l != nil && now < l.end() {
		for {
			a := l.avail.Load()
			t := min(a, n)
			if t <= 0 {
				break
			}
			if l.avail.CompareAndSwap(a, a-t) {
				l.tick.Add(uint64(t))
				n -= t
				break
			}
		}
	}
	if n == 0 {
		return visitNone
	}
	l, v := c.creditLease(p, now, f)
	for {
		b := l.borrowed.Load()
		if b >= closedBudget { // replaced meanwhile: charge its successor
			var w visit
			l, w = c.creditLease(p, now, f)
			v = v.or(w)
			continue
		}
		if l.borrowed.CompareAndSwap(b, b+n) {
			l.credit.Add(n)
			l.tick.Add(uint64(n))
			return v.or(visitSoon)
		}
	}
}

// afterOutage bounds a grant of g units of window idx (for a bucket, the
// period of the instance's clock idx) that comes after the instance's
// outage touched it (params.cautious): it returns what
// the key keeps, and owes the rest back. While Redis was away each
// instance admitted on credit within its budget for the window (the
// window's last-known remainder shared by the instances); Redis does not
// know yet what the other instances admitted, so it may grant units they
// already used. The key keeps what its budget leaves after its own credit:
// then the fleet admits, all in all, what Redis granted before the outage
// and the instances' budgets, whatever order their reports and grants come
// in.
func (lc *lockedCounter) afterOutage(p *params, idx, g int64, f fleet) (kept int64) {
	bud := lc.bud
	if lc.budIdx != idx {
		bud = lc.creditShare(idx, p.localShare(f), f)
	}
	credit := int64(0)
	if l := lc.cur.Load(); l != nil {
		switch b := l.borrowed.Load(); {
		case b >= closedBudget:
		case !p.bucket && l.idx == idx, p.bucket && l.budgetIdx.Load() == idx:
			credit = b
		}
	}
	if !p.bucket && lc.spentIdx == idx {
		credit = max(credit, lc.spent)
	}
	if lc.cautionIdx != idx {
		lc.cautionIdx, lc.cautionGranted = idx, 0
	}
	kept = min(g, max(0, bud-credit-lc.cautionGranted))
	lc.cautionGranted += kept
	if g > kept {
		owed := idx
		if p.bucket {
			owed = 0 // a bucket's debts have no window
		}
		lc.owe(owed, g-kept, 0)
	}
	return kept
}

// budgetLeft is the credit budget share of window idx less what was
// granted the key in it since the outage: grants after an outage and
// credit share one budget (see afterOutage).
func (lc *lockedCounter) budgetLeft(idx, share int64) int64 {
	if lc.cautionIdx == idx {
		return max(0, share-lc.cautionGranted)
	}
	return share
}

// noteBudget records share as the key's credit budget in window idx while
// Redis is away (the largest it was).
func (lc *lockedCounter) noteBudget(idx, share int64) {
	if lc.budIdx != idx {
		lc.budIdx, lc.bud = idx, share
		return
	}
	lc.bud = max(lc.bud, share)
}
