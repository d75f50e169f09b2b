package hybrid

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/script"
)

// Cold keys: exact accounting of each decision in Redis.
//
// A key this instance sees less than about once a window (a user, an API
// key, an IP in the long tail) would lease quota it then mostly gives back
// unused: a lease call and a refund for one decision, and quota stranded
// meanwhile. Such a key's decisions are counted exactly instead, each in
// one call (an exactCall) that shares its round trip with every other call
// of that moment: for FixedWindow an increment of the window's counter
// (a plain HINCRBY, see plainRequest; take.lua near the window's edges),
// what lands over the limit owed back (settleExact: the next tick sends
// it, unless a call of the key carries it first); for SlidingWindow, an
// increment and reads of the windows around it (a plain sliding call, see
// plainsliding.go; the lease script near the limit or the window's edges);
// for the buckets, a call of the lease script for exactly n units,
// consumed at once. A FixedWindow key's first decision in two windows (Strict
// mode) is such a call made before the key has a counter (first.go). A
// key leases again once it is asked leaseAt times in a window,
// or (FixedWindow, the buckets) once in each of two windows running (on a crowded
// instance, one whose decisions wait on Redis by the dozen at once, a key
// without a counter gets one only at its crowdedAt-th decision of a
// window: see crowd in first.go); a leased key
// keeps leasing ahead while it is asked leaseAt units a window
// (worthAhead; a SlidingWindow key, slidingAheadAt), so the two regimes
// have hysteresis. Keys are counted
// exactly also when the instance's share of the limit is too small
// to lease (Rate < leaseShare x instances) and when a window is nearly
// spent (its last-known remainder at most twice the instances): the last
// units go one decision at a time, to whoever asks, none stranded in a
// lease.

const (
	leaseAt    = 2 // units a key is asked in a window on an instance before it leases
	leaseShare = 8 // the least Rate / instances that leases
)

// exactCall is one decision of a cold key counted exactly in Redis: n
// units, sent once, with what the key owes. It is never sent again, so its
// units are never counted twice: when its reply is lost the decision takes
// the safe side (the units may stay counted; the decision goes as a slow
// reply does), and when the reply comes after the decision stopped
// waiting, what it counted is owed back (see settleExact).
type exactCall struct {
	c     *counter // nil for a key's first decision (first): then key
	key   string
	n     int64
	fw    bool            // take.lua or a plain increment; else the lease or bucket script for exactly n
	take  script.TakeArgs // fw
	plain bool            // fw: a plain increment of window take.AdjustIdx (see plainWindow)
	wkey  string          // plain: the key of the window's counter ("": work it out)
	// plain: the server time the call is made at (the estimate, or
	// WithClock's), microseconds
	serverUS int64
	call     *leaseCall // !fw: the arguments, not an outstanding call
	// sw: a SlidingWindow call as plain commands (plainsliding.go), of
	// window swIdx, run by Redis at least swElapsed µs into it
	sw               bool
	swIdx, swElapsed int64
	// back: a plain sliding call refused, what became of its give-back
	// (slidingBack): backSent once sent (the units are not owed again)
	back  int8
	owed  []debt        // what the call carries of the key's debts
	done  chan struct{} // closed when res is set
	state atomic.Int32  // exactWaited, exactAnswered or exactAbandoned
	res   result        // the reply, or the error
	x     exchange      // the round trip that answered
}

// exactWithArgs is an exactCall that is not FixedWindow's, with the
// arguments its call points to: one allocation for both.
type exactWithArgs struct {
	exactCall
	args leaseCall
}

// exact returns w's exactCall, its call pointing to w's arguments.
func (w *exactWithArgs) exact() *exactCall {
	w.call = &w.args
	return &w.exactCall
}

// exactCall.back
const (
	backNone   = iota // none sent
	backSent          // sent: it ran, or may have
	backNotRun        // it certainly did not run
)

const (
	exactWaited    = iota // the decision waits for the reply
	exactAnswered         // the reply is the decision's
	exactAbandoned        // the decision stopped waiting: what the reply counted is owed back
)

// abandon is called by a decision that stops waiting for e. It reports
// false when the reply came first: then it is the decision's after all.
func (e *exactCall) abandon() bool { return e.state.CompareAndSwap(exactWaited, exactAbandoned) }

// answered hands e its reply; it reports false when the decision left
// first.
func (e *exactCall) answered(r result, x exchange) bool {
	e.res, e.x = r, x
	ok := e.state.CompareAndSwap(exactWaited, exactAnswered)
	close(e.done)
	return ok
}

// admitted reports whether Redis admitted e's n units.
func (e *exactCall) admitted() bool {
	if e.sw && e.res.plain {
		return e.res.win.Grant >= e.n
	}
	_, units := e.counted()
	return units > 0 && (!e.fw || e.res.take.Admitted)
}

// counted returns what Redis counted of e, in window idx: its n units when
// admitted, and for a plain increment, whatever the answer (what lands
// over the limit is given back: see settleExact).
func (e *exactCall) counted() (idx, units int64) {
	switch {
	case e.fw:
		if e.res.take.Admitted || e.res.plain {
			units = e.n
		}
		return e.res.take.Idx, units
	case e.sw && e.res.plain:
		// the increment ran, whatever it decided (a call that decided
		// nothing gives it back)
		return e.swIdx, e.n
	case e.call.bucket:
		if e.res.bkt.Grant >= e.n {
			units = e.n
		}
		return 0, units
	default:
		if e.res.win.Grant >= e.n {
			units = e.n
		}
		return e.res.win.Idx, units
	}
}

// window is the window e counts in: the one it increments when plain.
func (e *exactCall) window() int64 {
	switch {
	case e.fw:
		return e.take.AdjustIdx
	case e.sw:
		return e.swIdx
	}
	return 0
}

func (e *exactCall) base() string {
	if e.fw {
		return e.take.Base
	}
	return e.call.base()
}

func (e *exactCall) request() request {
	switch {
	case e.plain:
		return e.plainRequest()
	case e.sw:
		return e.slidingRequest()
	case e.fw:
		return e.takeRequest()
	}
	return e.call.request()
}

func (e *exactCall) takeRequest() request {
	return request{script: script.Take, keys: e.take.Keys(), args: e.take.Args(), parse: parseFunc(parseTake)}
}

// plainRequest is a FixedWindow exact call as plain commands: the
// window's counter (the field c of the hash the lease script writes)
// incremented by n and what the call carries of the key's debts, and its
// expiry set to the window's end and a second of grace, as take.lua sets
// it. About a tenth of take.lua's Redis CPU (no script to run). The
// decision is admitted when the count after it is within the limit; when
// it is not, its n units stay counted until given back (settleExact), on
// the safe side. A counter a global limiter wrote (a string: WRONGTYPE)
// is counted by take.lua instead, in the same exchange.
func (e *exactCall) plainRequest() request {
	a := e.take
	k := e.wkey
	if k == "" {
		k = script.WindowKey(a.Base, a.Kind, a.AdjustIdx)
	}
	periodUS := int64(a.Limit.Period / time.Microsecond)
	expireAt := ((a.AdjustIdx+1)*periodUS+999)/1000 + 1000 // ms
	// One allocation for the commands and their arguments, the key boxed
	// once for both.
	b := new(plainCmds)
	var kv any = k
	b.hincrby = [...]any{"hincrby", kv, "c", e.n + a.Use - a.Refund}
	b.pexpireat = [...]any{"pexpireat", kv, expireAt}
	b.cmds = [...][]any{b.hincrby[:], b.pexpireat[:]}
	return request{
		cmds:     b.cmds[:],
		parse:    (*plainExact)(e),
		fallback: (*plainExact)(e),
	}
}

// plainCmds holds the commands of a plain exact call.
type plainCmds struct {
	cmds      [2][]any
	hincrby   [4]any
	pexpireat [3]any
}

// plainExact is an exactCall sent as a plain increment: it reads the
// increment's reply, and falls back to take.lua. (What it reads of the
// call, take and serverUS, is set when the call is made and never
// changes.)
type plainExact exactCall

func (e *plainExact) parseReply(v any) (reply, error) {
	c, err := hincrbyReply(v)
	if err != nil {
		return reply{}, err
	}
	a := &e.take
	return reply{plain: true, take: script.TakeReply{Idx: a.AdjustIdx, Now: e.serverUS, Count: c, Admitted: c <= int64(a.Limit.Rate), Adjusted: true}}, nil
}

// hincrbyReply reads the reply of a plain call's HINCRBY: the count after
// it.
func hincrbyReply(v any) (int64, error) {
	c, ok := v.(int64)
	if !ok {
		return 0, fmt.Errorf("hybrid: unexpected reply to HINCRBY: %T", v)
	}
	return c, nil
}

func (e *plainExact) fallbackRequest() request { return (*exactCall)(e).takeRequest() }

// plainWindow reports whether a FixedWindow exact call made at at (mono)
// can be a plain increment, and of which window: the one Redis would
// count it in. With WithClock (serverUS > 0) every call counts at the
// time it is given, so the window is that time's. Otherwise Redis counts
// at its own clock (TIME), which this instance knows within clk's error
// bound (srvclock.View.Certain); a reply read too near the window's end
// to be sure Redis ran it before the end decides nothing (see late).
func plainWindow(p *params, serverUS, at int64, clk clockView) (bool, int64) {
	if serverUS > 0 {
		return true, floorDiv(serverUS, p.periodUS)
	}
	return clk.Certain(at)
}

// late reports whether e, a plain increment with its reply, may have run
// after its window ended by Redis' clock (srvclock.View.Late): then it
// counted in a window that was over, and decides nothing; its units are
// owed back and the decision is taken again.
//
// A plain sliding call is late in the same way, and also when its reply
// does not admit it but would have at some instant Redis can have run it:
// it decides nothing then either (see plainsliding.go).
func (e *exactCall) late(clk clockView) bool {
	if e.sw && e.res.err == nil && e.res.plain {
		if e.call.win.Now <= 0 && clk.Late(e.swIdx, e.x.after) {
			return true
		}
		return !e.admitted() && !e.refusedSurely(clk)
	}
	if !e.plain || e.take.Now > 0 || e.res.err != nil || !e.res.plain {
		return false
	}
	return clk.Late(e.res.take.Idx, e.x.after)
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

func parseTake(v any) (reply, error) {
	r, err := script.ParseTake(v)
	return reply{take: r}, err
}

// cold counts a decision of n units that the lease in hand cannot take at
// now, and reports whether it is to be counted exactly in Redis rather
// than by a lease (see the comment at the top of this file).
func (lc *lockedCounter) cold(p *params, n, now int64, f fleet) bool {
	idx, _ := p.policy.window(lc, now, f)
	if idx != lc.slowIdx {
		lc.slowPrev = 0
		if idx == lc.slowIdx+1 {
			lc.slowPrev = lc.slowUses
		}
		lc.slowIdx, lc.slowUses = idx, 0
	}
	lc.slowUses += n
	this, last := lc.slowUses, lc.slowPrev
	switch lc.askedIdx {
	case idx:
		this, last = max(this, lc.asked), max(last, lc.prevAsked)
	case idx - 1:
		last = max(last, lc.asked)
	}
	if l := lc.cur.Load(); l != nil && l.known && now < l.end() && l.avail.Load() > 0 {
		return false // it holds units of the window: a lease call adds what it lacks
	}
	if _, end := p.policy.window(lc, now, f); p.cautious(f, end-p.periodNS, end) {
		return false // after an outage a grant is bounded (afterOutage); an exact call is not
	}
	// Warm: asked leaseAt units in this window or the last, or, for
	// FixedWindow and the buckets, asked in both (about once a window or
	// more). A FixedWindow lease far from the limit costs Redis about what
	// an exact call does (plainlease.go), and what such a key leaves unused
	// expires with its window, no refund sent: leasing at the first ask of
	// a window pays from about one ask per window (the sim's cold row: from
	// 1.7x to a median of 2.2x per-request global; docs/tuning.md). A
	// bucket lease costs what the exact call does (the same script), is
	// kept two periods while the bucket is half full (bucketHold), and
	// what it leaves unused then is left to the refill, no refund sent
	// (buckets.refill): the same from about one ask per period (the GCRA
	// cold row: 3.4-3.6x per-request global to 4.5x). A SlidingWindow lease
	// left unused counts in the next window's weight until a refund call
	// gives it back.
	warm := this >= leaseAt || last >= leaseAt || last >= 1 && (p.alg == ratelimit.FixedWindow || p.bucket)
	return !lc.leasable(p, idx, f) || !warm
}

// leasable reports whether the key may lease in window idx at all: the
// instance's share of the limit is large enough, and the window is not
// nearly spent.
func (lc *lockedCounter) leasable(p *params, idx int64, f fleet) bool {
	if p.rate < leaseShare*f.instances {
		return false
	}
	if p.bucket {
		return true // (a bucket refills all the time: a few tokens leased are used soon)
	}
	free, known := lc.knownFree(idx)
	return !known || free > 2*f.instances
}

// warm reports, at a tick, whether the key leases in the background: it
// holds a lease of its own, or it was asked leaseAt units in this window
// or the last; and it may lease at all.
func (lc *lockedCounter) warm(p *params, t tickFacts, f fleet) bool {
	idx, _ := p.policy.window(lc, t.now, f)
	if !lc.leasable(p, idx, f) {
		return false
	}
	if l := lc.cur.Load(); l != nil && l.known {
		return true
	}
	return lc.asked >= leaseAt || lc.prevAsked >= leaseAt
}

// newExact makes the exact call of a decision of n units at now. It
// carries what the key owes, credit first (see lease.lua and take.lua):
// for FixedWindow, what it owes the window the call counts in (if another
// by the time the call runs, nothing is applied and the debt stays).
//
// A FixedWindow call is a plain increment when plainWindow, at at (mono)
// when it is made, finds the window it counts in.
func (lc *lockedCounter) newExact(p *params, id callID, n, now, at int64, f fleet) *exactCall {
	fw := p.alg == ratelimit.FixedWindow
	var e *exactCall
	if fw {
		e = &exactCall{c: lc.counter(), n: n, fw: true, done: make(chan struct{})}
	} else {
		e = (&exactWithArgs{exactCall: exactCall{c: lc.counter(), n: n, done: make(chan struct{})}}).exact()
	}
	lc.oweLate()
	lc.oweCredit()
	if e.fw {
		idx, _ := p.policy.window(lc, now, f)
		plain, pidx := plainWindow(p, id.now, at, f.clock)
		var base string
		if plain {
			idx = pidx
			e.wkey, base = windowKey(p.prefix, lc.key, p.kind, idx)
		} else {
			base = lc.base(p)
		}
		e.take = script.TakeArgs{Base: base, Kind: p.kind, Limit: p.limit, Now: id.now, N: n, AdjustIdx: idx}
		for i, d := range lc.debts {
			if d.idx == idx {
				e.take.Refund, e.take.Use = d.refund, d.use
				e.owed = append(e.owed, d)
				lc.debts = append(lc.debts[:i], lc.debts[i+1:]...)
				break
			}
		}
		if plain {
			e.plain = true
			e.serverUS = id.now
			if e.serverUS <= 0 {
				e.serverUS = f.clock.ServerAt(at)
			}
		}
		return e
	}
	id.nonce = "" // never sent twice: no replay record
	lc.initCall(e.call, p, id, f)
	e.call.setBase(lc.base(p))
	if ok, idx, srv, elapsed := lc.plainSliding(p, id.now, n, at, f); ok {
		// (its debts stay with the key: see plainsliding.go)
		e.call.win.Want, e.call.win.Min, e.call.win.Instances = n, n, 1
		e.sw, e.swIdx, e.serverUS, e.swElapsed = true, idx, srv, elapsed
		return e
	}
	if e.call.bucket {
		// (its refunds stay with the key: they go with what the key keeps,
		// in the key's own call: see buckets.hold)
		e.call.bkt.Want, e.call.bkt.Min, e.call.bkt.Instances = n, n, 1
		lc.attachBucketDebts(&e.call.bkt, false)
		e.owed = append(e.owed, debt{use: e.call.bkt.Use, back: e.call.bkt.Back})
		return e
	}
	e.call.win.Want, e.call.win.Min, e.call.win.Instances = n, n, 1
	lc.attachDebts(p, &e.call.win, now, f)
	for _, a := range e.call.win.Adjust {
		e.owed = append(e.owed, debt{idx: a.Idx, refund: a.Refund, use: a.Use})
	}
	return e
}

// settleExact settles what exact call e carried and counted once its
// decision is over: with its reply, a FixedWindow adjustment that did not
// apply is owed again, and when the decision stopped waiting (abandoned),
// the units the call counted are owed back. A call without a reply is in
// doubt: its credit is owed again (counted twice at worst, the safe side)
// and its refunds are dropped (never given back, the safe side).
func (lc *lockedCounter) settleExact(e *exactCall, abandoned bool) visit {
	v := visitNone
	if e.res.err != nil {
		for _, d := range e.owed { // (what it gave back is dropped)
			if d.use > 0 {
				lc.owe(d.idx, 0, d.use)
				v = visitNow
			}
		}
		return v
	}
	if e.fw && !e.res.take.Adjusted {
		for _, d := range e.owed {
			lc.owe(d.idx, d.refund, d.use)
			v = visitNow
		}
	}
	if e.sw && e.res.plain && !e.admitted() {
		// what the plain call read bounds the window until the key hears
		// again: near the limit, lease.lua decides
		lc.setFree(lc.cur.Load(), e.swIdx, int64(e.call.win.Limit.Rate)-e.res.win.Count)
	}
	if idx, units := e.counted(); units > 0 && (abandoned || !e.admitted()) && e.back != backSent {
		// (a plain increment that landed over the limit gives its units back)
		lc.oweBack(e.call != nil && e.call.bucket, idx, units)
		v = visitNow
	}
	return v
}

// decideExact decides the exact call e of the key from its reply, at now:
// admitted when Redis counted its n units within the limit; else denied,
// and the key is refused until the units could fit (for a second at most,
// as a refused lease is). An admission returns a lease of its window that
// holds nothing, for a reservation or a Multi to give back to.
func (c *counter) decideExact(p *params, e *exactCall, now int64, f fleet) (ratelimit.Decision, *lease, visit) {
	x, n := e.x, e.n
	lc := c.lock()
	defer lc.unlock()
	v := lc.settleExact(e, false)
	var end, remaining, retry int64
	switch {
	case e.fw && e.res.plain && e.take.Now <= 0:
		// the window's end by the estimate of Redis time (with WithClock's
		// time, as for take.lua: the reply's Now is that time)
		r := e.res.take
		end = f.clock.MonoAt((r.Idx + 1) * p.periodUS)
		remaining, retry = p.rate-r.Count, end-now
		lc.setFree(lc.cur.Load(), r.Idx, p.rate-r.Count)
	case e.fw:
		r := e.res.take
		end = f.clock.End(r.Idx, (r.Idx+1)*p.periodUS-r.Now, x.before, x.after)
		remaining, retry = p.rate-r.Count, end-now
		lc.setFree(lc.cur.Load(), r.Idx, p.rate-r.Count)
	case e.sw && e.res.plain && e.call.win.Now <= 0:
		// the window's end by the estimate of Redis time; refused surely
		// (see late), the time the units could fit by it
		r := e.res.win
		end = f.clock.MonoAt((r.Idx + 1) * p.periodUS)
		remaining, retry = p.rate-r.Count, end-now
		if !e.admitted() {
			retry = f.clock.MonoAt(r.Idx*p.periodUS+e.swElapsed+r.Retry) - now
		}
		lc.setFree(lc.cur.Load(), r.Idx, p.rate-r.Count)
	case p.bucket:
		r := e.res.bkt
		end = noEnd
		remaining, retry = r.Level, x.before+r.Retry*1000-now
		lc.setLevel(lc.cur.Load(), r.Level)
	default:
		r := e.res.win
		end = f.clock.End(r.Idx, r.Reset, x.before, x.after)
		remaining, retry = p.rate-r.Count, x.before+r.Retry*1000-now
		lc.setFree(lc.cur.Load(), r.Idx, p.rate-r.Count)
	}
	remaining = min(max(0, remaining), p.capacity)
	if idx, _ := e.counted(); e.admitted() {
		c.exact.Add(1<<32 | uint64(n))
		c.noteUse(p, now)
		d := ratelimit.Decision{Allowed: true, Limit: p.limit, Algorithm: p.alg, Remaining: int(remaining), ResetAfter: time.Duration(max(0, end-now))}
		if p.bucket {
			d.ResetAfter = time.Duration(p.bucketReset(remaining))
		}
		if e.fw && remaining == 0 {
			// The window is full: nothing fits before its end, so the
			// next decisions are denied here (as after a denial).
			c.block(1, now, end)
		}
		l := &lease{idx: idx, start: end - p.periodNS, known: true}
		l.until.Store(end)
		return d, l, v
	}
	c.refused(p, n, now)
	retry = max(retry, int64(time.Millisecond))
	c.block(n, now, now+retry)
	d := p.denied(retry, retry)
	d.Remaining = int(remaining)
	if p.bucket {
		d.ResetAfter = time.Duration(max(retry, p.bucketReset(remaining)))
	} else {
		d.ResetAfter = time.Duration(max(retry, end-now))
	}
	return d, nil, v.or(visitSoon)
}
