package hybrid

import (
	"github.com/hybridlimit/ratelimit/internal/breaker"
	"github.com/hybridlimit/ratelimit/internal/script"
)

// The buckets (TokenBucket, GCRA) in the hybrid.
//
// An instance leases tokens from the key's bucket in Redis, the same state
// a global limiter of the algorithm and limit decides on (bucket.lua): a
// call takes at most a share of what the bucket holds, so the fleet never
// consumes more than the bucket allows (Burst + Rate x elapsed) while Redis
// answers, in strict mode. A lease of tokens does not end with a window: it
// is topped up when it runs low and goes back when the key goes quiet (the
// tokens an idle instance holds are the fleet's), leaves the table, or
// Flush or Close drain. Its lease has window index 0 and no end.
//
// Demand is measured over periods of the instance's own clock, and a lease
// is sized to cover the key's demand over the next few ticks (bucketHorizon):
// a bucket refills continuously, and tokens held locally for long are
// tokens other instances cannot have.

// bucketHorizon is how many ticks of demand a lease of tokens covers.
const bucketHorizon = 4

// buckets leases tokens from a key's bucket (bucket.lua).
type buckets struct{ p *params }

// window: the period of the instance's own clock now falls in, which
// demand is counted over (a bucket has no windows of its own).
func (b buckets) window(_ *lockedCounter, now int64, _ fleet) (idx, end int64) {
	idx = now / b.p.periodNS
	return idx, (idx + 1) * b.p.periodNS
}

// obsolete: tokens go back to the bucket whenever.
func (b buckets) obsolete(int64, int64, fleet) bool { return false }

// creditLease: a lease of tokens with none in it yet, to hold credit.
func (b buckets) creditLease(lc *lockedCounter, _ int64, _ fleet) *lease {
	nl := lc.newLease(0, 0, noEnd, true)
	lc.cur.Store(nl)
	return nl
}

// newCreditPeriod starts a new credit budget on the bucket's lease l when the
// period of the instance's clock changed since the last credit: credit for
// a bucket is budgeted per period (its refill over a period), as a
// window's is per window.
func (b buckets) newCreditPeriod(c *counter, l *lease, now int64) {
	if l.budgetIdx.Load() == now/b.p.periodNS {
		return
	}
	lc := c.lock()
	defer lc.unlock()
	b.creditPeriod(l, now)
}

func (b buckets) creditPeriod(l *lease, now int64) {
	w := now / b.p.periodNS
	if l.budgetIdx.Load() == w {
		return
	}
	for {
		v := l.borrowed.Load()
		if v >= closedBudget || l.borrowed.CompareAndSwap(v, 0) {
			break
		}
	}
	l.budgetIdx.Store(w)
}

// horizon is when a lease of tokens asked at now should last until.
func (b buckets) horizon(now int64, f fleet) int64 {
	return now + bucketHorizon*max(b.p.interval, f.tickGap)
}

func (b buckets) ask(lc *lockedCounter, k *leaseCall, n, have, now int64, f fleet) {
	a := &k.bkt
	lc.attachBucketDebts(a)
	a.Want, a.Min = lc.want(b.p, n, have, now, b.horizon(now, f), f), max(1, n-have)
}

// release gives the bucket's tokens back when the key went quiet or
// leaves, but for a few left to the refill (see refill).
func (b buckets) release(lc *lockedCounter, t tickFacts, f fleet) {
	if l := lc.cur.Load(); l != nil && (t.dead || f.draining || t.now-t.lastUse >= t.gap) {
		lc.cur.Store(nil)
		if !t.dead && !f.draining && b.refill(lc, l) {
			lc.expired += l.avail.Swap(0)
		}
		lc.retire(b.p, l, t.now, f)
	}
}

// refill reports whether the tokens lease l still holds, as its key went
// quiet, are left to the bucket's refill rather than sent back: the bucket
// was last heard at least half full, the tokens are no more than it
// refills in a sync interval (so it has them again within a tick), and
// nothing else of the key would go in the call (no credit, no debt).
// Such a key is one asked a few times and then not (the long tail): its
// lease, at least a share of a quarter of the bucket (bucket.lua), goes
// mostly unused, and a call to give it back cost about as much again as
// the lease (the sim's TokenBucket cold row: 146 refund calls per 1,000
// decisions; 1.04x per-request global with them, 1.22-1.26x without,
// p99 3.1-3.2 to 1.8ms). In strict mode tokens not given back are never
// an admission too many: at worst a burst right after is short of them
// for the time the bucket takes to refill them. They count in
// Stats().Expired. Flush, Close and a key leaving the table give all back.
func (b buckets) refill(lc *lockedCounter, l *lease) bool {
	if l.credit.Load() != 0 || len(lc.debts) > 0 {
		return false
	}
	level, known := lc.knownFree(0)
	return known && level >= b.p.capacity-level && // (no product to overflow)
		float64(l.avail.Load())*float64(b.p.periodNS) <= float64(b.p.rate)*float64(b.p.interval)
}

// bucketHold is the longest a bucket key keeps its lease while quiet (its
// idle gap's cap): a period; or, when the bucket was last heard at least
// half full, until two ticks before the key would leave the table (quiet
// for idlePeriods periods), so that the lease goes at a visit of its own,
// where what it holds is left to the refill (see refill), not with the
// key's leaving, which gives everything back in a call. The tokens are at
// most a share of a quarter of the bucket (bucket.lua), which the other
// instances do not miss while it is half full; and a key of the long tail,
// asked about once a period on an instance, is often asked again within
// two periods: each such decision is taken from the lease in memory
// instead of by a bucket call. On the sim's GCRA cold row, 1.48-1.82x
// per-request Redis with a period's hold, 3.35-3.50x with this (decisions
// in memory 409-526 per 1,000 against 781-809; docs/tuning.md). A key
// under half full gives its tokens back after a period at most, as before.
func (lc *lockedCounter) bucketHold(p *params, f fleet) int64 {
	level, known := lc.knownFree(0)
	if !known || level < p.capacity-level {
		return p.periodNS
	}
	return max(p.periodNS, idlePeriods*p.periodNS-2*max(p.interval, f.tickGap))
}

// fill: what is owed goes in one call, net (tokens are fungible); a key
// in use whose lease runs low leases more.
func (b buckets) fill(lc *lockedCounter, k *leaseCall, t tickFacts, f fleet) {
	a := &k.bkt
	lc.attachBucketDebts(a)
	now := t.now
	active := !t.quiet || now-t.lastUse < t.gap
	if !active || t.dead || f.draining || f.breaker == breaker.Open || now < lc.blockedUntil.Load() || !lc.warm(b.p, t, f) {
		return // (a cold key is counted exactly: see exact.go)
	}
	switch cur := lc.cur.Load(); {
	case cur == nil:
		if !t.quiet {
			a.Want = lc.want(b.p, 0, 0, now, b.horizon(now, f), f)
		}
	case cur.avail.Load() < cur.low.Load():
		a.Want = lc.want(b.p, 0, cur.avail.Load(), now, b.horizon(now, f), f)
	}
}

// schedule: the tokens of a key that holds some go back if it stays
// quiet.
func (b buckets) schedule(lc *lockedCounter, t tickFacts) int64 {
	at := t.lastUse + idlePeriods*b.p.periodNS // idle
	if lc.cur.Load() != nil {
		at = min(at, t.lastUse+t.gap)
	}
	return at
}

func (b buckets) takeGrants(lc *lockedCounter, k *leaseCall, rep *reply, x exchange, f fleet) effects {
	r := &rep.bkt
	var e effects
	cur := lc.cur.Load()
	lc.setLevel(cur, r.Level)
	grant := r.Grant
	if period := x.after / b.p.periodNS; grant > 0 && b.p.cautious(f, period*b.p.periodNS, (period+1)*b.p.periodNS) {
		if kept := lc.afterOutage(b.p, period, grant, f); kept < grant {
			e.visit = visitNow // the rest goes back
			grant = kept
		}
	}
	switch {
	case r.Grant > 0 && grant == 0:
		e.leases, e.leasedUnits = 1, uint64(r.Grant)
	case grant > 0:
		e.leases, e.leasedUnits = 1, uint64(r.Grant)
		switch {
		case lc.dead.Load() || f.draining:
			lc.owe(0, grant, 0)
			e.visit = visitNow
		case cur == nil:
			nl := lc.newLease(0, 0, noEnd, true)
			nl.grow(grant)
			lc.cur.Store(nl)
		default:
			cur.grow(grant)
		}
		lc.blockedUntil.Store(0)
	case k.bkt.Want > 0 && r.Retry > 0:
		lc.counter().block(k.bkt.Min, x.before, x.before+r.Retry*1000)
	}
	return e
}

// attachBucketDebts moves what the key owes into bucket call a, net
// (tokens are fungible).
func (lc *lockedCounter) attachBucketDebts(a *script.BucketArgs) {
	var refund, use int64
	for _, d := range lc.debts {
		refund += d.refund
		use += d.use
	}
	lc.debts = lc.debts[:0]
	if refund >= use {
		a.Refund = refund - use
	} else {
		a.Use = use - refund
	}
}
