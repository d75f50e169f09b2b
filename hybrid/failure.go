package hybrid

import (
	"math"
	"time"

	"github.com/hybridlimit/ratelimit"
)

// Decisions Redis did not answer in time: the key's state machine decides
// them from what Redis last said.

// slowReply decides when a lease call took longer than the timeout while
// the breaker is closed: Redis answers, slowly, and its last word on the
// window stands. Strict denies; Optimistic admits on credit within its
// share, bounded by what Redis last reported free in the window.
func (c *counter) slowReply(p *params, n, now int64, f fleet) (ratelimit.Decision, *lease, visit) {
	var v visit
	if p.mode == Optimistic {
		l, w := c.creditLease(p, now, f)
		lc := c.lock()
		share := lc.creditShare(l.idx, p.optimisticShare(f), f)
		lc.unlock()
		d, l, w2, ok := c.onCredit(p, n, now, share, f)
		if v = w.or(w2); ok {
			return d, l, v
		}
	}
	c.refused(p, n, now)
	lc := c.lock()
	idx, end := p.policy.window(lc, now, f)
	free, known := lc.knownFree(idx)
	lc.unlock()
	wait := min(p.interval, end-now)
	if known && free <= 0 {
		wait = end - now // spent: nothing frees before the window ends
	}
	wait = max(wait, int64(time.Millisecond))
	return p.denied(wait, max(end-now, wait)), nil, v.or(visitSoon)
}

// fallback decides while the breaker is open, per the failure mode:
// FailOpen admits on unbounded credit; FailLocal within the instance's
// share of the window (Rate / instances), bounded by the window's
// last-known remainder shared by the instances; FailClosed denies.
func (c *counter) fallback(p *params, n, now int64, f fleet) (ratelimit.Decision, *lease, visit) {
	switch p.failure {
	case ratelimit.FailOpen:
		d, l, v, _ := c.onCredit(p, n, now, math.MaxInt64, f)
		return d, l, v
	case ratelimit.FailLocal:
		// The budget and the credit taken within it under one lock: a grant
		// that comes meanwhile (afterOutage, locked too) is bounded by the
		// credit taken before it, and the credit after it by the budget
		// it leaves.
		lc := c.lock()
		l, v := lc.creditLease(p, now, f)
		share := lc.creditShare(l.idx, p.localShare(f), f)
		idx := l.idx
		if p.bucket {
			idx = now / p.periodNS // a bucket's budget is per period of the instance's clock
		}
		lc.noteBudget(idx, share)
		share = lc.budgetLeft(idx, share)
		d, l2, w, ok := lc.onCreditLocked(p, n, now, share, f)
		end := l.end()
		if !ok && p.bucket {
			_, end = p.policy.window(lc, now, f) // the budget's next period
		}
		lc.unlock()
		if v = v.or(w); ok {
			return d, l2, v
		}
		c.refused(p, n, now)
		wait := max(end-now, int64(time.Millisecond))
		return p.denied(wait, wait), nil, v.or(visitSoon)
	default: // FailClosed
		c.refused(p, n, now)
		return p.denied(p.openFor, p.openFor), nil, visitSoon
	}
}
