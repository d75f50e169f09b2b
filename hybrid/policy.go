package hybrid

import (
	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/script"
)

// policy is what differs between leasing a window's quota (windows:
// FixedWindow and SlidingWindow, lease.lua) and leasing tokens from a
// bucket (buckets: TokenBucket and GCRA, bucket.lua). The state machine
// calls it where the two part; no other code asks which one it runs.
type policy interface {
	// window returns the window a decision at now counts in and its end:
	// the lease's, or the estimate's; for a bucket, the period of the
	// instance's own clock its demand is counted over.
	window(lc *lockedCounter, now int64, f fleet) (idx, end int64)
	// obsolete reports whether window idx no longer bounds any decision at
	// now: refunds and credit for it are dropped, not sent.
	obsolete(idx, now int64, f fleet) bool
	// creditLease makes, publishes and returns an empty lease for the
	// window now falls in, to hold credit, when the key has none.
	creditLease(lc *lockedCounter, now int64, f fleet) *lease
	// newCreditPeriod starts a new credit budget on l when its period changed
	// (buckets budget credit per period of the instance's clock).
	newCreditPeriod(c *counter, l *lease, now int64)
	// creditPeriod is newCreditPeriod with the key locked.
	creditPeriod(l *lease, now int64)
	// ask fills call k, made for a decision of n units that found have in
	// the lease in hand: what the key owes, and what it asks.
	ask(lc *lockedCounter, k *leaseCall, n, have, now int64, f fleet)
	// release, at a sync tick, gives back the leases the key no longer
	// needs: of a window that ended, of a key gone quiet or out of the
	// table, everything while Flush or Close drain.
	release(lc *lockedCounter, t tickFacts, f fleet)
	// fill fills call k at a sync tick with what the key owes and what
	// it asks, or leaves it empty.
	fill(lc *lockedCounter, k *leaseCall, t tickFacts, f fleet)
	// schedule returns when the syncer must visit the key next, for a
	// key nothing may mark meanwhile (its key quiet).
	schedule(lc *lockedCounter, t tickFacts) int64
	// takeGrants puts the grants of reply r of call k, which came within
	// exchange x, into the key's leases.
	takeGrants(lc *lockedCounter, k *leaseCall, r *reply, x exchange, f fleet) effects
}

// windows leases slices of a window's quota (lease.lua).
type windows struct{ p *params }

func (w windows) window(lc *lockedCounter, now int64, f fleet) (idx, end int64) {
	if l := lc.cur.Load(); l != nil && l.known && now < l.end() {
		return l.idx, l.end()
	}
	return f.clock.Window(now)
}

// obsolete: a FixedWindow counter once its window ended, a SlidingWindow one
// a period later.
func (w windows) obsolete(idx, now int64, f fleet) bool {
	last := idx + 1
	if w.p.alg == ratelimit.SlidingWindow {
		last = idx + 2
	}
	return now >= f.clock.MonoAt(last*w.p.periodUS)
}

// creditLease: a lease on the estimated window, never one this key left.
func (w windows) creditLease(lc *lockedCounter, now int64, f fleet) *lease {
	if l := lc.cur.Load(); l != nil {
		lc.cur.Store(nil)
		lc.retireAndStep(w.p, l, now, f) // its window is over: never estimate back into it
	}
	idx, end := f.clock.Window(now)
	if idx < lc.nextIdx {
		// The offset to Redis time jitters by a round trip; an estimate must
		// never step back into a window this counter already left, or that
		// window would get a second credit budget.
		end += (lc.nextIdx - idx) * w.p.periodNS
		idx = lc.nextIdx
	}
	nl := lc.newLease(idx, end-w.p.periodNS, end, false)
	lc.cur.Store(nl)
	return nl
}

func (w windows) newCreditPeriod(*counter, *lease, int64) {}
func (w windows) creditPeriod(*lease, int64)              {}

func (w windows) ask(lc *lockedCounter, k *leaseCall, n, have, now int64, f fleet) {
	a := &k.win
	lc.attachDebts(w.p, a, now, f)
	_, end := w.window(lc, now, f)
	a.Want, a.Min = lc.want(w.p, n, have, now, end, f), max(1, n-have)
	if lead := max(lc.lead, 2*f.tickGap); lc.next == nil && end-now <= lead && lc.worthAhead(w.p) {
		// near the window's end: the next window's quota in the same call
		a.WantNext = lc.want(w.p, 0, 0, end, end+w.p.periodNS, f)
		a.Lead = (lead + w.p.interval) / 1000
	}
}

// attachDebts moves what the key owes into call a, as far as it holds
// them; debts of windows that no longer count are dropped.
func (lc *lockedCounter) attachDebts(p *params, a *script.LeaseArgs, now int64, f fleet) {
	kept := lc.debts[:0]
	for _, d := range lc.debts {
		switch {
		case p.policy.obsolete(d.idx, now, f):
		case len(a.Adjust) < script.MaxAdjust:
			a.Adjust = append(a.Adjust, script.Adjust{Idx: d.idx, Refund: d.refund, Use: d.use})
		default:
			kept = append(kept, d)
		}
	}
	lc.debts = kept
}

// worthAhead reports whether the key is worth leasing the next window for:
// it was asked at least leaseAt units in this window, or, for FixedWindow,
// in this window and the last (about once a window or more); a
// SlidingWindow key, slidingAheadAt units in this window. A key an
// instance sees about once a window or less gives much of such a lease back
// unused. A FixedWindow lease far from the limit is
// a plain increment whose unused units expire with their window, and keys
// asked in two windows running leasing ahead take the cold row's closed loop
// up in the seconds its keys warm (docs/tuning.md, "A key's first decision
// without a counter").
func (lc *lockedCounter) worthAhead(p *params) bool {
	if p.alg == ratelimit.SlidingWindow {
		return lc.asked >= slidingAheadAt
	}
	return lc.asked >= leaseAt || p.alg == ratelimit.FixedWindow && lc.asked > 0 && lc.prevAsked > 0
}

// slidingAheadAt: a SlidingWindow key leases ahead once asked this many
// units in the window (by the syncer's last look). A lease ahead is one
// lease.lua call, and the key would make one at its next window's first
// decision anyway: what it saves is that decision's wait, and the wait of
// whatever joins it. Its cost is when it goes: every key's lead ends at the
// same window boundary, so the leases ahead of all keys asked twice (as
// the rule was until this constant) went out in the window's last few
// hundred milliseconds, and decisions queued behind them. On the sim's
// SlidingWindow cold row (about one decision per key, instance and window)
// the hybrid's p99 was 3.9-4.3ms against `global`'s 1.1ms, its slow
// decisions (over 2ms) in the window's last 400ms; at 4 it was 2.2-3.1ms
// in 8 runs, decisions/s about unchanged (2.2-2.4ms, and faster, with
// keepsAtEnd too), the hot row (keys asked hundreds of times a window)
// unchanged (docs/tuning.md, "Since: a SlidingWindow key leases
// ahead once asked four times").
const slidingAheadAt = 4
