package hybrid

import (
	"math"
	mrand "math/rand/v2"

	"github.com/hybridlimit/ratelimit"
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
// is sized to cover the key's demand over the next few ticks (bucketNeed):
// a bucket refills continuously, and tokens held locally for long are
// tokens other instances cannot have.

// bucketHorizon is how many ticks of demand a lease of tokens covers.
const bucketHorizon = 4

// noEnd is the end of a lease of tokens: it does not end with a window.
const noEnd = math.MaxInt64

// isBucket reports whether a is leased as tokens.
func isBucket(a ratelimit.Algorithm) bool {
	return a == ratelimit.TokenBucket || a == ratelimit.GCRA
}

// newBucketCall starts a bucket lease call for c. Caller holds c.mu.
func (h *Limiter) newBucketCall(c *counter) call {
	return call{bucket: true, bkt: script.BucketArgs{
		Base: h.baseOf(c), Algorithm: h.cfg.algorithm, Limit: h.limit,
		Nonce: script.NewNonce(mrand.Uint64()), Seq: h.seq.Add(1), Instances: h.instances(), Min: 1,
	}}
}

// bucketNeed is the tokens c should hold: its demand over the next
// bucketHorizon ticks, with half again for headroom. Caller holds c.mu.
func (h *Limiter) bucketNeed(c *counter, mono int64) int64 {
	horizon := bucketHorizon * max(int64(h.cfg.syncInterval), h.tickGap.Load())
	return int64(math.Ceil(h.demand(c, mono) * float64(horizon) / float64(h.periodNS) * 1.5))
}

// bucketWindow is the period of the instance's own clock that mono falls
// in: what demand is counted over (a bucket has no windows of its own).
func (h *Limiter) bucketWindow(mono int64) (idx, end int64) {
	idx = mono / h.periodNS
	return idx, (idx + 1) * h.periodNS
}

// appliedBucket handles the reply of a bucket call: the call is no longer
// outstanding; its refund and credit are in Redis; its grant tops up the
// lease.
func (h *Limiter) appliedBucket(c *counter, k call, r script.BucketReply, before int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.call == nil || c.call.call.seq() != k.seq() {
		return // a second reply to a call sent more than once
	}
	c.call = nil
	if !r.Unknown {
		h.st.refunded.Add(uint64(k.bkt.Refund))
	}
	h.st.reported.Add(uint64(k.bkt.Use))
	if r.Unknown {
		return
	}
	cur := c.cur.Load()
	c.setFree(cur, 0, r.Level)
	switch {
	case r.Grant > 0:
		h.st.leases.Add(1)
		h.st.leasedUnits.Add(uint64(r.Grant))
		switch {
		case c.dead.Load() || h.draining.Load() > 0:
			c.owe(0, r.Grant, 0)
			h.mark(c)
		case cur == nil:
			nl := c.newLease(0, 0, noEnd, true)
			nl.grow(r.Grant)
			c.cur.Store(nl)
		default:
			cur.grow(r.Grant)
		}
		c.blockedUntil.Store(0)
	case k.bkt.Want > 0 && r.Retry > 0:
		c.block(k.bkt.Min, before, before+r.Retry*1000)
	}
}

// planBucket is plan's part for a bucket limiter, from where the two part:
// c's tokens go back when the key went quiet or leaves; what is owed goes in
// one call, net (tokens are fungible); a key in use whose lease runs low
// leases more. Caller holds c.mu.
func (h *Limiter) planBucket(ops []op, c *counter, mono int64, quiet, dead, draining bool, lastUse, gap int64) []op {
	if l := c.cur.Load(); l != nil && (dead || draining || mono-lastUse >= gap) {
		c.cur.Store(nil)
		c.retireLease(l, false)
	}
	cur := c.cur.Load()
	owedCredit(c)
	if c.flight != nil {
		if !dead {
			h.scheduleLocked(c, mono, noEnd, lastUse, gap)
		}
		return ops
	}
	if k, ok := h.resend(c); ok {
		return h.launch(ops, c, k)
	}
	k := h.newBucketCall(c)
	a := &k.bkt
	attachBucketDebts(c, a)
	active := !quiet || mono-lastUse < gap
	if active && !dead && !draining && h.brk.State() != breaker.Open && mono >= c.blockedUntil.Load() {
		need := h.bucketNeed(c, mono)
		switch {
		case cur == nil:
			if !quiet {
				a.Want = max(need, h.floor())
			}
		case cur.avail.Load() < cur.low.Load():
			a.Want = max(need-cur.avail.Load(), h.floor())
		}
	}
	if !dead {
		h.scheduleLocked(c, mono, noEnd, lastUse, gap)
	}
	if a.Refund > 0 || a.Use > 0 || a.Want > 0 {
		c.call = &sent{call: k}
		ops = h.launch(ops, c, k)
	}
	return ops
}

// bucketReset is a decision's ResetAfter for a bucket limiter: until the
// bucket is full again, at Rate per Period, from what remains.
func (h *Limiter) bucketReset(remaining int64) int64 {
	return max(0, h.capacity-remaining) * h.periodNS / h.rate
}

// bucketBudget starts a new credit budget on a bucket's lease l when the
// period of the instance's clock changed since the last borrow: credit for
// a bucket is budgeted per period (its refill over a period), as a
// window's is per window.
func (h *Limiter) bucketBudget(c *counter, l *lease, mono int64) {
	w := mono / h.periodNS
	if l.budgetIdx.Load() == w {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if l.budgetIdx.Load() == w {
		return
	}
	for {
		b := l.borrowed.Load()
		if b >= closedBudget || l.borrowed.CompareAndSwap(b, 0) {
			break
		}
	}
	l.budgetIdx.Store(w)
}

// attachBucketDebts moves what c owes into bucket call a, net (tokens are
// fungible). Caller holds c.mu.
func attachBucketDebts(c *counter, a *script.BucketArgs) {
	var refund, use int64
	for _, d := range c.debts {
		refund += d.refund
		use += d.use
	}
	c.debts = c.debts[:0]
	if refund >= use {
		a.Refund = refund - use
	} else {
		a.Use = use - refund
	}
}
