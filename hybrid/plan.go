package hybrid

import (
	"math"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/breaker"
	"github.com/hybridlimit/ratelimit/internal/script"
)

// Planning a key at a sync tick, and sizing its lease calls.

// tickFacts is what a tick learned of a key before it plans it.
type tickFacts struct {
	now     int64
	quiet   bool  // not asked since the last tick
	dead    bool  // out of the table: everything goes back
	lastUse int64 // mono ns of the key's last decision
	gap     int64 // how long it may stay quiet before it counts as idle (idleGap)
	end     int64 // the end of the window it counts in now
}

// observe folds what the key decided since the last tick into its counts
// and demand, at now, and rolls its leases: the first step of a tick. It
// returns the facts plan needs but dead, which the Limiter sets.
func (lc *lockedCounter) observe(p *params, now int64, f fleet) (tickFacts, visit) {
	lc.oweLate()
	t := lc.takeTick()
	m := lc.missed.Swap(0)
	lc.allowed.Add(t >> 32)
	lc.denied.Add(m >> 32)
	asked := int64(uint32(t)) + int64(uint32(m))
	if lc.planned > 0 && now > lc.planned {
		lc.rate = (lc.rate + float64(asked)*float64(p.periodNS)/float64(now-lc.planned)) / 2
	}
	lc.planned = now
	_, v := lc.roll(p, now, f)
	idx, end := p.policy.window(lc, now, f)
	if idx != lc.askedIdx {
		if idx == lc.askedIdx+1 {
			lc.prevAsked = lc.asked
		} else {
			lc.prevAsked = 0
		}
		lc.askedIdx, lc.asked = idx, 0
	}
	lc.asked += asked
	return tickFacts{now: now, quiet: asked == 0, lastUse: lc.lastUse.Load(), gap: lc.idleGap(p, now, f), end: end}, v
}

// plan decides what the key sends at this tick: first a call whose reply
// was lost, sent again (Redis replays it if it can tell it was applied,
// and otherwise applies only its credit); else at most one new call,
// carrying what the key owes per window (refunds and credit) and what it
// asks (see policy.fill). It returns the call to send, if any, and when the
// syncer must visit the key next (0: it is visited at the next tick anyway,
// as it waits for a reply or left the table). A new call gets id, which
// may leave its seq 0 and nonce empty, for the caller to give the call
// they send (leaseCall.identify): most visits send nothing.
func (lc *lockedCounter) plan(p *params, id callID, t tickFacts, f fleet) (k *leaseCall, visitAt int64) {
	p.policy.release(lc, t, f)
	lc.oweCredit()
	if lc.inFlight() != nil {
		// A call is on its way (a decision's): what else is owed waits for
		// its reply.
		return nil, lc.nextVisit(p, t)
	}
	if k := lc.resend(); k != nil {
		return k, 0 // the last call's reply was lost: it goes again, alone
	}
	k = blankCalls.Get().(*leaseCall)
	lc.initCall(k, p, id, f)
	p.policy.fill(lc, k, t, f)
	lc.keepRefunds(p, &k.win, t, f)
	visitAt = lc.nextVisit(p, t)
	if k.empty() {
		blankCalls.Put(k) // (never seen outside: nothing refers to it)
		return nil, visitAt
	}
	k.setBase(lc.base(p))
	lc.makePlain(p, k, t.now, f)
	return k, visitAt
}

// nextVisit is when the syncer must visit a key nothing may mark in the
// meantime (its key quiet), or 0 for a key out of the table.
func (lc *lockedCounter) nextVisit(p *params, t tickFacts) int64 {
	if t.dead {
		return 0
	}
	return max(p.policy.schedule(lc, t), t.now+1)
}

// release gives back quota of a window that ended, of a key out of the
// table, while Flush or Close drain (a lease installed since they retired
// the keys: a reply of the tick they waited for), quota leased ahead of
// its window and never used by a key gone quiet, and the lease of a key
// gone quiet while its window has a while to run (see giveBackQuiet).
func (w windows) release(lc *lockedCounter, t tickFacts, f fleet) {
	now := t.now
	if l := lc.cur.Load(); l != nil && (now >= l.end() || t.dead || f.draining || (l.pre && now-max(t.lastUse, l.start) >= t.gap) || giveBackQuiet(w.p, l, t) <= now) {
		lc.cur.Store(nil)
		if now >= l.end() {
			lc.nextIdx = max(lc.nextIdx, l.idx+1)
		}
		lc.retire(w.p, l, now, f)
	}
	if l := lc.next; l != nil && (t.dead || f.draining || now-t.lastUse >= max(t.gap, w.p.periodNS)) {
		lc.next = nil
		lc.retire(w.p, l, now, f)
	}
}

// giveBackQuiet is when the syncer gives back what lease l holds for a key
// quiet since t.lastUse or the window's start (math.MaxInt64: never): once
// the key has surely been quiet for its idle gap in the window (lastUse
// moves in steps of useGrain), if the window then has at least as long to
// run, and at least maxBlock (an instance Redis refused asks again within
// maxBlock: quota given back later may not reach it in time, and windows
// of a second or less never give back this way). A client that moved to
// another instance (it reconnected, a load balancer rebalanced) leaves its
// lease here, and the instances it now reaches are refused until the
// quota comes back: at the window's end, for a window of a minute or an
// hour most of it. A key used at random is quiet for its gap about once
// in 50 gaps, and then leases again; a key used about once a window or
// less has a gap of a period, and keeps its lease. (A bucket's tokens go
// back on a like rule: see buckets.release.)
func giveBackQuiet(p *params, l *lease, t tickFacts) int64 {
	at := max(t.lastUse, l.start) + p.useGrain + t.gap
	if l.pre || !l.known || l.end()-at < max(t.gap, maxBlock) || l.avail.Load() <= 0 {
		return math.MaxInt64
	}
	return at
}

// fill asks, for a key in use, a lease when it holds none of its own or
// is about to run dry, and, within its lead of the window's end, the next
// window's quota.
func (w windows) fill(lc *lockedCounter, k *leaseCall, t tickFacts, f fleet) {
	a, p, now := &k.win, w.p, t.now
	lc.attachDebts(p, a, now, f)
	// In use in this window or the last, and not quiet for longer than a
	// key of its rate stays quiet: a key used a couple of times a window
	// may not have been used yet this window when its lead comes.
	inUse := (lc.asked > 0 || lc.prevAsked > 0) && now-t.lastUse < max(t.gap, idlePeriods*p.periodNS)
	active := inUse
	if lc.asked > 0 || lc.prevAsked == 0 {
		active = active && now-t.lastUse < t.gap
	}
	if !inUse || t.dead || f.draining || f.breaker == breaker.Open || !lc.warm(p, t, f) {
		return // (a cold key is counted exactly: see exact.go)
	}
	blocked := now < lc.blockedUntil.Load()
	switch cur := lc.cur.Load(); {
	case blocked, !active:
	case cur == nil || !cur.known:
		if !t.quiet {
			// In use without quota of its own (its lease ran out, or it
			// lives on credit): lease in the background.
			a.Want = lc.want(p, 0, 0, now, t.end, f)
		}
	case lowOn(cur, lc.rate*float64(2*f.tickGap)/float64(p.periodNS)):
		a.Want = lc.want(p, 0, cur.avail.Load(), now, t.end, f) // about to run dry
	}
	// The next window is leased for a key asked in this one, however long
	// it has been quiet since: a process that spends a while waiting (on
	// Redis, on its CPUs) leaves its keys quiet for that while, all at
	// once, and had they lost their lease ahead each would wait on Redis at
	// the window's start, which makes the next wait longer. Quota leased
	// ahead for a key that then stays quiet goes back soon after its window
	// begins (release).
	if lead := max(lc.lead, 2*f.tickGap); lc.next == nil && t.end-now <= lead && lc.worthAhead(p) && now-t.lastUse < p.periodNS {
		a.WantNext = lc.want(p, 0, 0, t.end, t.end+p.periodNS, f)
		a.Lead = (lead + p.interval) / 1000
	}
}

// keepsAtEnd reports whether a SlidingWindow lease l may stay unretired
// past its window's end, until the key's next call or visit: it holds no
// credit (units admitted beyond it, which Redis must hear of) and its
// window was last heard far from the limit (half of it free), where what
// it would give back is kept with the key anyway (keepRefunds), and, once
// its window bounds nothing, dropped. Such leases are not visited at their
// window's end: every key's window ends at the same instant, and the visits
// of all of them made one syncer pass of thousands of keys (9-25ms of a
// 2-core host's CPU per instance on the sim's SlidingWindow cold row) in
// which decisions queued. A reply that brings the key a lease of a later
// window retires it (putGrant), as the visit would have.
func (lc *lockedCounter) keepsAtEnd(p *params, l *lease, t tickFacts) bool {
	if t.dead || l.credit.Load() != 0 {
		return false
	}
	free, known := lc.knownFree(l.idx)
	return known && free >= p.rate/2
}

// keepRefunds keeps with the key the refunds call a carries when they are
// all it would send, for a SlidingWindow key whose windows were last heard
// far from the limit (half of it free): they ride the key's next call, and
// are dropped once their windows bound nothing (two periods on). A
// SlidingWindow lease gives back at its window's end what it left unused
// (the window's count weighs into the next one), which for a key that then
// goes quiet was a lease.lua call of its own, as many as the leases: on
// the sim's SlidingWindow cold row, refunds were about a third of the
// hybrid's script calls. Far from the limit the units they would give
// back are not missed: they stay counted (the safe side), as a FixedWindow
// lease's unused units expire with their window. Near the limit, for a key
// leaving the table, and while Flush or Close drain, refunds go at once.
//
// Kept refunds wait for no tick (awaitsTick): a key that owed only them
// was visited again at every tick until they were dropped, two periods
// on, each visit keeping them again; on the sim's SlidingWindow cold row
// that was about 1,800 of the 2,400 keys each instance's syncer visited
// per tick, a quarter of a core of the two.
func (lc *lockedCounter) keepRefunds(p *params, a *script.LeaseArgs, t tickFacts, f fleet) {
	if p.alg != ratelimit.SlidingWindow || a.Want > 0 || a.WantNext > 0 || len(a.Adjust) == 0 || t.dead || f.draining {
		return
	}
	for _, d := range a.Adjust {
		free, known := lc.knownFree(d.Idx)
		if !known && lc.freeIdx >= d.Idx-1 && lc.freeIdx <= d.Idx+1 {
			free, known = lc.freeVal, true // (a neighbour's: the windows weigh into each other)
		}
		if d.Use > 0 || !known || free < p.rate/2 {
			return
		}
	}
	rest := len(lc.debts) // (what call a could not carry: not looked at here)
	for _, d := range a.Adjust {
		lc.owe(d.Idx, d.Refund, 0)
	}
	a.Adjust = a.Adjust[:0]
	lc.kept = rest == 0
}

// schedule: to lease the next window within the key's lead, to give back
// quota leased ahead if the key stays quiet, to give a SlidingWindow lease
// back when its window ends (near the limit: see keepsAtEnd), to drop the
// key once idle.
func (w windows) schedule(lc *lockedCounter, t tickFacts) int64 {
	at := t.lastUse + idlePeriods*w.p.periodNS // idle
	if cur := lc.cur.Load(); cur != nil {
		// A key in use is visited within its lead of the window's end, to
		// lease the next window if by then it is worth it (see worthAhead):
		// a key leased by a decision early in a window has been asked once
		// when the syncer first sees it, and would otherwise never lease
		// ahead, waiting on Redis at every window's start.
		if at2 := t.end - lc.lead; lc.next == nil && (at2 > t.now && (lc.asked > 0 || lc.prevAsked > 0) || lc.worthAhead(w.p)) {
			at = min(at, at2)
		}
		if cur.pre {
			at = min(at, max(t.lastUse, cur.start)+t.gap)
		}
		at = min(at, giveBackQuiet(w.p, cur, t))
		if w.p.alg == ratelimit.SlidingWindow && !lc.keepsAtEnd(w.p, cur, t) {
			at = min(at, cur.end())
		}
	}
	if lc.next != nil {
		at = min(at, t.lastUse+t.gap, lc.next.start)
	}
	return at
}

// want is the one sizing rule of lease calls: what a key that holds have
// units asks to serve from now until end (its window's end; for a bucket,
// a few ticks ahead), sized from its demand with half again for headroom,
// less what it holds; at least n (the decision waiting for it, if any) and
// at least minLease.
func (lc *lockedCounter) want(p *params, n, have, now, end int64, f fleet) int64 {
	need := ceilUnits(lc.demand(p, now, f), end-now, p.periodNS)
	return max(n, need-have, p.minLease(f))
}

// demand is the key's demand in units per period: the most of what it
// asked in the last whole window, what it asked so far in this one scaled
// to a period, and its smoothed rate (which follows a burst within a tick
// or two).
func (lc *lockedCounter) demand(p *params, now int64, f fleet) float64 {
	return max(lc.windowRate(p, now, p.interval, f), lc.rate)
}

// windowRate is the key's demand in units per period over whole windows:
// what it asked in the last one, and what it asked so far in this one
// scaled to a period once at least least ns of it went.
func (lc *lockedCounter) windowRate(p *params, now, least int64, f fleet) float64 {
	d := float64(lc.prevAsked)
	if idx, end := p.policy.window(lc, now, f); idx == lc.askedIdx {
		if elapsed := now - (end - p.periodNS); elapsed >= least {
			d = max(d, float64(lc.asked)*float64(p.periodNS)/float64(elapsed))
		}
	}
	return d
}

// idleGap is how long a key may stay quiet before it counts as idle: quota
// it leased ahead goes back then, and it leases ahead no more. One sync
// interval (as the syncer keeps it: longer when its passes take long) for
// a key used several times per interval; for a sparser key, four times its
// mean time between requests (a key used at random at that rate is quiet
// that long about once in 50 gaps), at most a period (for a bucket last
// heard at least half full, longer: see bucketHold).
func (lc *lockedCounter) idleGap(p *params, now int64, f fleet) int64 {
	// Not shorter than the last tick's gap and an interval: a key is not
	// judged quiet over a time the syncer itself did not run (the process
	// was starved of CPU, or paused), before it could be used again.
	gap := max(p.interval, f.tickGap, f.lastGap+p.interval)
	// The key's mean rate over whole windows, not its smoothed rate, which
	// follows bursts: a process that was stalled and catches up uses its
	// keys in bursts, and a burst's short gaps would make the next stall
	// look like idleness.
	most := p.periodNS
	if p.bucket {
		most = lc.bucketHold(p, f)
	}
	if d := lc.windowRate(p, now, p.periodNS/2, f); d > 0 {
		return max(gap, min(most, int64(4*float64(p.periodNS)/d)))
	}
	return max(gap, most)
}
