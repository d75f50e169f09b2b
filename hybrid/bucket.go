package hybrid

import (
	"time"

	"github.com/hybridlimit/ratelimit/internal/breaker"
	"github.com/hybridlimit/ratelimit/internal/script"
)

// The buckets (TokenBucket, GCRA) in the hybrid.
//
// An instance leases tokens from the key's bucket in Redis, the same state
// a global limiter of the algorithm and limit decides on (bucket.lua): a
// call takes at most a share of what the bucket holds. The tokens out in
// leases are still the bucket's: each Limiter keeps a record beside the
// bucket of what it holds, until a deadline, and the bucket refills only to
// its capacity less what the records hold (see hold); so the fleet never
// admits more than the bucket allows (Burst + Rate x elapsed, over any
// stretch of time) while Redis answers, in strict mode. A lease of tokens
// does not end with a window: it is topped up when it runs low and goes
// back when the key goes quiet (the tokens an idle instance holds are the
// fleet's), leaves the table, or Flush or Close drain; it serves until its
// record's deadline, which each of its calls pushes on. Its lease has
// window index 0.
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
	lc.attachBucketDebts(a, true)
	b.hold(lc, k, now, f)
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
// refills in a sync interval, and nothing else of the key would go in the
// call (no credit, no debt). The key's record in Redis keeps them off the
// bucket's burst until its deadline (see hold), when they count as spent;
// the bucket's rate is the same either way.
// Such a key is one asked a few times and then not (the long tail): its
// lease, at least a share of a quarter of the bucket (bucket.lua), goes
// mostly unused, and a call to give it back cost about as much again as
// the lease (the sim's TokenBucket cold row: 146 refund calls per 1,000
// decisions; 1.04x per-request global with them, 1.22-1.26x without,
// p99 3.1-3.2 to 1.8ms). In strict mode tokens not given back are never
// an admission too many: at worst a burst is short of them until the
// record's deadline, and the bucket's refill from there. They count in
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

// holdNS is how long the record of a key's held tokens lasts (HoldUS), ns:
// two periods (a key quiet that long leaves the table, and gives its
// tokens back first), at least minHold and eight ticks. A key in use
// renews its record before (fill) when no call of its own did: a key of
// the long tail, asked about once a period, holds a lease for dozens of
// decisions, and renews about once per minHold.
func (b buckets) holdNS(f fleet) int64 {
	return max(idlePeriods*b.p.periodNS, minHold, 8*max(b.p.interval, f.tickGap))
}

// minHold is the shortest record of held tokens, ns. A longer one costs
// only while the bucket is near full: the tokens of a holder that crashed,
// or that left a few to the refill (see refill), stay off the bucket's
// burst until the record's deadline.
const minHold = int64(10 * time.Second)

// renewLead is how long before its lease's end a key in use renews the
// record of its tokens (a call for nothing else, when no other goes).
func (b buckets) renewLead() int64 { return 4 * b.p.interval }

// hold makes k, the key's bucket call made at now, the Limiter's word on
// the tokens it holds (bucket.lua): the bucket refills only to its
// capacity less what the records of the holders say, so that the bucket
// and the tokens out in leases are never more than the capacity (else a
// stretch of time could admit the held tokens and a full bucket: more than
// Burst + Rate x its length). Keep is what the lease in hand holds now (it
// only shrinks until the reply: decisions take from it); the record
// becomes Keep plus the grant, until HoldUS from when Redis runs the call,
// and the lease serves until HoldUS from now, earlier (takeGrants). The
// lease's recorded drops to Keep: a decision's units given back go into
// the lease only while the record covers them (giveBack).
func (b buckets) hold(lc *lockedCounter, k *leaseCall, now int64, f fleet) {
	a := &k.bkt
	a.Holder, a.HoldUS, a.Keep, k.built = b.p.holder, b.holdNS(f)/1000, 0, now
	if l := lc.cur.Load(); l != nil {
		if now < l.end() {
			a.Keep = max(0, l.avail.Load())
		} else {
			lc.expired += max(0, l.avail.Swap(0)) // past its record's deadline: spent
		}
		l.recorded = min(l.recorded, a.Keep)
	}
}

// fill: what is owed goes in one call, net (tokens are fungible); a key
// in use whose lease runs low leases more, and one whose lease nears its
// end renews its record (hold).
func (b buckets) fill(lc *lockedCounter, k *leaseCall, t tickFacts, f fleet) {
	a := &k.bkt
	lc.attachBucketDebts(a, true)
	now := t.now
	b.hold(lc, k, now, f)
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
	case cur.end()-now <= b.renewLead() && cur.avail.Load() > 0:
		k.renew = true
	}
}

// schedule: the tokens of a key that holds some go back if it stays
// quiet.
func (b buckets) schedule(lc *lockedCounter, t tickFacts) int64 {
	at := t.lastUse + idlePeriods*b.p.periodNS // idle
	if cur := lc.cur.Load(); cur != nil {
		at = min(at, t.lastUse+t.gap, cur.end()-b.renewLead())
	}
	return at
}

func (b buckets) takeGrants(lc *lockedCounter, k *leaseCall, rep *reply, x exchange, f fleet) effects {
	r := &rep.bkt
	var e effects
	cur := lc.cur.Load()
	lc.setLevel(cur, r.Level)
	// The lease's end: this call's record covers what the lease kept (all
	// it holds now) and the grant until HoldUS after Redis ran it, later
	// than HoldUS after the call was made. A record that was gone (past
	// its deadline: the lease's end had passed too) covers less: what the
	// lease held is spent. A replayed call's record is not known here: the
	// lease serves no longer than it did.
	end := k.built + k.bkt.HoldUS*1000
	if cur != nil {
		switch {
		case r.Kept < 0:
			end = min(cur.end(), end)
		case r.Kept < k.bkt.Keep:
			lc.expired += max(0, cur.avail.Swap(0))
		}
		cur.until.Store(end)
		cur.recorded = min(cur.recorded, max(0, r.Kept))
	}
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
			nl := lc.newLease(0, 0, end, true)
			nl.grow(grant)
			nl.recorded = grant
			lc.cur.Store(nl)
		default:
			cur.grow(grant)
			cur.recorded += grant
		}
		lc.blockedUntil.Store(0)
	case k.bkt.Want > 0 && r.Retry > 0:
		lc.counter().block(k.bkt.Min, x.before, x.before+max(r.Retry*1000, b.pollGap(f)))
	}
	return e
}

// pollTokens is how many tokens, for each instance sharing a bucket, are
// worth a round trip to a bucket that refused: see pollGap.
const pollTokens = 8

// pollGap is how long, at least, a key whose bucket refused it waits
// before it asks again (its decisions are denied in memory meanwhile):
// the refill of pollTokens tokens for each instance sharing the bucket,
// but never longer than the refill of a quarter of the bucket. A key at
// its limit is one whose bucket stays about empty: asked again as soon as
// one token is in it, every instance polls it for a token or two a round
// trip (the sim's buckets' hot row: 307 decisions in 1,000 waited on a
// round trip, nearly all of them on its three keys at their limit). What
// the bucket refills meanwhile stays in it for the next call of any
// instance: the fleet's rate is the same, the bucket well below full.
func (b buckets) pollGap(f fleet) int64 {
	m := min(pollTokens*max(1, f.instances), b.p.capacity/4)
	return int64(float64(m) * float64(b.p.periodNS) / float64(max(1, b.p.rate)))
}

// attachBucketDebts moves what the key owes into bucket call a: its
// credit (Use) and what decisions gave back (Back); and with refunds, the
// tokens its leases give back (Refund), which go only with what the key
// keeps, in a call of the key's own (see buckets.hold). Not net: a refund
// counts only as far as the key's record covers it, and credit counts
// whatever.
func (lc *lockedCounter) attachBucketDebts(a *script.BucketArgs, refunds bool) {
	left := lc.debts[:0]
	for _, d := range lc.debts {
		a.Use += d.use
		a.Back += d.back
		if refunds {
			a.Refund += d.refund
		} else if d.refund > 0 {
			left = append(left, debt{idx: d.idx, refund: d.refund})
		}
	}
	lc.debts = left
}
