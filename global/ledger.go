package global

import (
	"context"
	"math/rand/v2"
	"strconv"
	gosync "sync"
	"sync/atomic"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/local"
)

// The outage bound of FailLocal for the window algorithms.
//
// While Redis answers, the limiter notes for each key the remainder Redis
// last reported for its window (a bounded table, DefaultLedgerKeys keys),
// for each limit of a Multi. When a decision must be taken without Redis,
// the window the outage begins in is cautious: this instance may admit in
// it at most its budget, the window's last-known remainder shared by the
// instances (WithInstances), and in a window that begins during the
// outage its share of the limit, Rate / instances; the fallback limiter
// (WithFallback) must admit too, and a Multi's must admit within every
// limit's budget. What it admits locally is charged to the window in
// Redis with its next decision on the key there, in the same script call
// (the charge first, then the decision; take.lua for a FixedWindow
// Limiter, sliding_window.lua for a SlidingWindow one, multi.lua for a
// Multi, whose buckets are charged an overdraft they refill). A window
// stays cautious once Redis answers again, if the outage touched it: the
// instance's admissions in it, Redis' and its own, stay within its
// budget. So a window touched by an outage admits at most what Redis had
// counted before it, plus every instance's budget: at most Rate when every
// instance knew the remainder lately, and Rate in a window that begins
// during the outage. See docs/failure-modes.md.

// DefaultLedgerKeys is how many keys' windows a FailLocal Limiter of a
// window algorithm, or Multi, remembers (least recently used first out).
const DefaultLedgerKeys = 100_000

// ledger is what a FailLocal limiter knows of its keys' windows, limit by
// limit (a Limiter's one, a Multi's every one), and of the last outage it
// saw. It is safe for concurrent use: a decision locks its key's entries
// only, and reads the outage with one atomic load.
type ledger struct {
	lims      []ledgerLimit
	settleUS  int64 // how long after an outage a window that begins stays cautious
	instances func() int
	keys      *local.Table[*ledgerKey]
	out       atomic.Pointer[outageSpan] // the last outage; nil: none yet

	// dropped, for tests: called, the key locked, with units of limit i
	// admitted locally in window win that no call charged to it while it
	// lasted.
	dropped func(i int, win, units int64)
}

// ledgerLimit is one limit of a ledger.
type ledgerLimit struct {
	limit    ratelimit.Limit
	alg      ratelimit.Algorithm
	periodUS int64
	window   bool // FixedWindow or SlidingWindow: budgets per window
	charged  bool // local admissions are charged to Redis: every algorithm but SlidingLog
}

// outageSpan is an outage: the first decision taken without Redis (µs)
// and the first answer after it (0 while it lasts). The ledger replaces
// it whole, never changes it.
type outageSpan struct{ from, to int64 }

// ledgerKey is one key as this instance knows it: an entry per limit.
type ledgerKey struct {
	mu  gosync.Mutex
	w   []ledgerEntry
	one [1]ledgerEntry // w's array for a ledger of one limit
}

// ledgerEntry is one limit's window of a key (a bucket's: debt only).
type ledgerEntry struct {
	win    int64 // window index
	free   int64 // the remainder Redis last reported for win; -1: not known
	budget int64 // what this instance may admit in win once cautious; -1: not cautious
	used   int64 // admitted by this instance in win since it became cautious
	debt   int64 // admitted locally in win (a bucket: ever), not charged to Redis yet
}

// newLedger returns the ledger of limits counted with algs, or nil when
// none of them is charged (SlidingLog only).
func newLedger(limits []ratelimit.Limit, algs []ratelimit.Algorithm, settle time.Duration, instances func() int) *ledger {
	g := &ledger{settleUS: int64(settle / time.Microsecond), instances: instances}
	charged := false
	for i, l := range limits {
		a := algs[i]
		g.lims = append(g.lims, ledgerLimit{limit: l, alg: a, periodUS: int64(l.Period / time.Microsecond),
			window: a == ratelimit.FixedWindow || a == ratelimit.SlidingWindow, charged: a != ratelimit.SlidingLog})
		charged = charged || a != ratelimit.SlidingLog
	}
	if !charged {
		return nil
	}
	g.keys = local.NewTable[*ledgerKey](DefaultLedgerKeys, nil)
	return g
}

// lock returns key's entries, locked, each window limit's set to its
// window in wins.
func (g *ledger) lock(key string, wins ...int64) *ledgerKey {
	k, _ := g.keys.GetOrCreate(key, func() *ledgerKey {
		k := &ledgerKey{}
		if len(g.lims) == 1 {
			k.w = k.one[:]
		} else {
			k.w = make([]ledgerEntry, len(g.lims))
		}
		for i := range k.w {
			k.w[i].free, k.w[i].budget = -1, -1
		}
		return k
	})
	k.mu.Lock()
	for i := range g.lims {
		if g.lims[i].window {
			g.moveTo(i, &k.w[i], wins[i])
		}
	}
	return k
}

// moveTo sets e, limit i's entry, locked, to window win if that is a
// later one (a clock that stepped back keeps the later window): a window
// that ended owes nothing more.
func (g *ledger) moveTo(i int, e *ledgerEntry, win int64) {
	if win > e.win {
		if e.debt > 0 && g.dropped != nil {
			g.dropped(i, e.win, e.debt)
		}
		e.win, e.free, e.budget, e.used, e.debt = win, -1, -1, 0, 0
	}
}

// decidedIn returns the window of limit i a decision counted in, from
// the time t (µs) read before it was taken and its ResetAfter for the
// limit (the time to its window's end when it was taken; <= 0: not
// known): a decision that crossed a window's end counts in the next.
func (g *ledger) decidedIn(i int, win, t int64, reset time.Duration) int64 {
	if reset <= 0 {
		return win
	}
	return max(win, (t+reset.Microseconds()-1)/g.lims[i].periodUS)
}

// cautious reports whether window win of limit i was touched by the last
// outage, or begins within settleUS after it ended (another instance may
// still be deciding locally then, its breaker open a while longer, its
// admissions not charged yet), or one is under way.
func (g *ledger) cautious(i int, win int64) bool {
	o := g.out.Load()
	if o == nil {
		return false
	}
	p := g.lims[i].periodUS
	start := win * p
	return (o.to == 0 || start < o.to+g.settleUS) && start+p > o.from
}

// down notes a decision taken without Redis at now (µs): an outage
// begins, unless one is under way.
func (g *ledger) down(now int64) {
	for {
		o := g.out.Load()
		if o != nil && o.to == 0 {
			return
		}
		if g.out.CompareAndSwap(o, &outageSpan{from: now}) {
			return
		}
	}
}

// up notes an answer from Redis at now (µs): the outage under way, if
// one is, ends.
func (g *ledger) up(now int64) {
	for {
		o := g.out.Load()
		if o == nil || o.to != 0 {
			return
		}
		if g.out.CompareAndSwap(o, &outageSpan{from: o.from, to: now}) {
			return
		}
	}
}

// caution makes e, limit i's entry, locked, cautious if it is not: its
// budget is the window's last-known remainder shared by the instances,
// or, not known, the instances' share of the limit.
func (g *ledger) caution(i int, e *ledgerEntry) {
	if e.budget >= 0 {
		return
	}
	n := int64(max(1, g.instances()))
	if e.free >= 0 {
		e.budget = e.free / n
	} else {
		e.budget = int64(g.lims[i].limit.Rate) / n
	}
}

// window returns limit i's window of now (µs) and the time left in it.
func (g *ledger) window(i int, now int64) (int64, time.Duration) {
	p := g.lims[i].periodUS
	win := now / p
	return win, time.Duration((win+1)*p-now) * time.Microsecond
}

// nowUS is the ledger's time: WithClock's, or the local clock.
func nowUS(clock func() time.Time) int64 {
	if clock != nil {
		return clock().UnixMicro()
	}
	return time.Now().UnixMicro()
}

// ledgerCall is one decision's dealings with a ledger, limit by limit. It
// lives on its decider's stack.
type ledgerCall struct {
	now      int64                              // µs: when the decision began
	n        int64                              // its events
	win      [ratelimit.MaxLimits]int64         // window limits: the window of now
	left     [ratelimit.MaxLimits]time.Duration // and the time left in it
	cautious uint16                             // bit i: limit i's window is cautious, n reserved in it
	charge   [ratelimit.MaxLimits]int64         // of each limit's debt, what the call carries to Redis
	cwin     [ratelimit.MaxLimits]int64         // and the window it is owed to (the entry's, maybe later than win)
	exact    uint16                             // bit i: counted[i] is the window Redis counted limit i in
	counted  [ratelimit.MaxLimits]int64         // (a reply that says: take's; else read from ResetAfter)
}

// The debt a call carries is taken out of its entry while the call is on
// its way, so that concurrent calls on the key do not carry it again, and
// given back unless Redis reports it applied: a call that failed, whose
// reply may have been lost, leaves it to the next (counted twice at worst,
// the safe side).

// begin starts a decision of n events on key at now: for each window
// limit its window, and whether an outage touched it (cautious); n is
// reserved within the budget of each cautious window, and each limit's
// debt becomes the call's charge (taken out of the entry until the call
// ends: see restore). When a cautious window's budget cannot take n,
// nothing is reserved, and begin returns false with the refusal's states
// in states (one per limit); the debts are the call's charge still, for
// the caller to send alone (a decision of nothing: a spent budget must
// not keep them from Redis) and end, or abort.
func (g *ledger) begin(c *ledgerCall, key string, now int64, n int, states []ratelimit.LimitState) bool {
	c.now, c.n = now, int64(n)
	for i := range g.lims {
		if g.lims[i].window {
			c.win[i], c.left[i] = g.window(i, now)
			if g.cautious(i, c.win[i]) {
				c.cautious |= 1 << i
			}
		}
	}
	k := g.lock(key, c.win[:len(g.lims)]...)
	defer k.mu.Unlock()
	if c.cautious != 0 {
		for i := range g.lims {
			if c.cautious&(1<<i) != 0 {
				g.caution(i, &k.w[i])
			}
		}
		if g.refused(k, c, c.cautious, states) {
			c.cautious = 0
			g.carry(k, c)
			return false
		}
		for i := range g.lims {
			if c.cautious&(1<<i) != 0 {
				k.w[i].used += c.n // reserved: given back unless Redis admits
			}
		}
	}
	g.carry(k, c)
	return true
}

// carry makes each limit's debt, k locked, c's charge, owed to the
// entry's window (another decision may have moved it past c's).
func (g *ledger) carry(k *ledgerKey, c *ledgerCall) {
	for i := range g.lims {
		c.charge[i], c.cwin[i], k.w[i].debt = k.w[i].debt, k.w[i].win, 0
	}
}

// charges returns c's charges as multi.lua takes them, two values per
// limit of k (the window, the events), in buf; nil when there are none.
func (c *ledgerCall) charges(k int, buf *[2 * ratelimit.MaxLimits]int64) []int64 {
	var out []int64
	for i := range k {
		buf[2*i], buf[2*i+1] = c.cwin[i], c.charge[i]
		if c.charge[i] > 0 {
			out = buf[:2*k]
		}
	}
	return out
}

// restore gives back, k locked, the charges of c that Redis did not apply
// (bit i of applied: limit i's was), to windows still k's.
func (g *ledger) restore(k *ledgerKey, c *ledgerCall, applied uint16) {
	for i := range g.lims {
		e := &k.w[i]
		switch {
		case c.charge[i] == 0 || applied&(1<<i) != 0:
		case !g.lims[i].window || e.win == c.cwin[i]:
			e.debt += c.charge[i]
		case g.dropped != nil: // its window has ended
			g.dropped(i, c.cwin[i], c.charge[i])
		}
	}
}

// refused reports whether the budget of a window of the limits in mask,
// cautious, cannot take c.n more events, and then writes the refusal in
// states: such a window denies until its end, the other limits of mask
// report what their budgets leave, the rest are not asked and allow.
func (g *ledger) refused(k *ledgerKey, c *ledgerCall, mask uint16, states []ratelimit.LimitState) bool {
	over := false
	for i := range g.lims {
		over = over || (mask&(1<<i) != 0 && k.w[i].used+c.n > k.w[i].budget)
	}
	if !over {
		return false
	}
	for i := range g.lims {
		l := &g.lims[i]
		s := ratelimit.LimitState{Limit: l.limit, Algorithm: l.alg, Allowed: true}
		if e := &k.w[i]; mask&(1<<i) != 0 {
			s.Remaining, s.ResetAfter = int(max(0, e.budget-e.used)), c.left[i]
			if e.used+c.n > e.budget {
				s.Allowed, s.RetryAfter = false, c.left[i]
			}
		}
		states[i] = s
	}
	return true
}

// unreserve gives back, k locked, what c reserved in windows still k's.
func (g *ledger) unreserve(k *ledgerKey, c *ledgerCall) {
	for i := range g.lims {
		if e := &k.w[i]; c.cautious&(1<<i) != 0 && e.win == c.win[i] {
			e.used = max(0, e.used-c.n)
		}
	}
}

// abort ends a decision that Redis did not take and no one else will:
// what begin reserved is given back, and what it carried is owed again.
func (g *ledger) abort(c *ledgerCall, key string) {
	k := g.lock(key, c.win[:len(g.lims)]...)
	g.unreserve(k, c)
	g.restore(k, c, 0)
	k.mu.Unlock()
}

// lockOutage starts a decision taken without Redis: it notes the outage,
// gives back what begin reserved (and owes again what it carried), makes
// every window limit's window cautious and returns key's entries locked,
// for the caller to ask the fallback limiter, note what it admitted
// (admitLocal) and unlock. When a window's budget cannot take c.n it
// returns nil, the refusal in states.
func (g *ledger) lockOutage(c *ledgerCall, key string, states []ratelimit.LimitState) *ledgerKey {
	g.down(c.now)
	k := g.lock(key, c.win[:len(g.lims)]...)
	g.unreserve(k, c)
	g.restore(k, c, 0)
	var windows uint16
	for i := range g.lims {
		if g.lims[i].window {
			g.caution(i, &k.w[i])
			windows |= 1 << i
		}
	}
	if g.refused(k, c, windows, states) {
		k.mu.Unlock()
		return nil
	}
	return k
}

// admitLocal notes, k locked, that the fallback limiter admitted c.n
// events, having been asked at t (µs), with the limits' states in states
// (a ResetAfter of 0: its window not known): they count in the window
// each limit counted them in, and are owed to Redis. It reports false,
// noting nothing, when the fallback counted them in a window whose budget
// lockOutage did not check and that cannot take them (one begun since:
// the decision crossed its start) or that it can no longer check (one the
// entry has left); the caller refuses them then, states marking the
// limits that did (the fallback keeps them counted: the safe side).
func (g *ledger) admitLocal(k *ledgerKey, c *ledgerCall, t int64, states []ratelimit.LimitState) bool {
	ok := true
	for i := range g.lims {
		if !g.lims[i].window {
			continue
		}
		e := &k.w[i]
		dw := g.decidedIn(i, c.win[i], t, states[i].ResetAfter)
		if dw > e.win {
			g.moveTo(i, e, dw) // the fallback counted it in the next window
			g.caution(i, e)
		}
		if dw < e.win || e.used+c.n > e.budget {
			refuseState(&states[i])
			ok = false
		}
	}
	if !ok {
		return false
	}
	for i := range g.lims {
		e := &k.w[i]
		if g.lims[i].window {
			e.used += c.n
		}
		if g.lims[i].charged {
			e.debt += c.n
		}
	}
	return true
}

// refuseState makes s a refusal until its window's end.
func refuseState(s *ratelimit.LimitState) {
	s.Allowed, s.Remaining, s.RetryAfter = false, 0, s.ResetAfter
}

// end closes a decision Redis answered at now, admitted or not, with the
// limits' states in states. The outage under way, if one is, ends (the
// call may have been sent during it: a window that began before is
// cautious). A charge Redis applied (bit i of charged) is owed no more;
// the others are owed again. What begin reserved stays counted in an
// admission; each window limit's decision counts in the window Redis
// counted it in, whose remainder the entry notes. An admission Redis
// counted in a cautious window begun since begin reserved must fit that
// window's budget too: when it does not, end reports false and marks the
// limits in states, and the caller refuses it (Redis keeps it counted:
// the safe side).
func (g *ledger) end(c *ledgerCall, key string, now int64, admitted bool, charged uint16, states []ratelimit.LimitState) bool {
	g.up(now)
	k := g.lock(key, c.win[:len(g.lims)]...)
	defer k.mu.Unlock()
	if !admitted {
		g.unreserve(k, c)
	}
	g.restore(k, c, charged)
	ok := true
	for i := range g.lims {
		e := &k.w[i]
		if !g.lims[i].window {
			continue
		}
		dw := g.decidedIn(i, c.win[i], c.now, states[i].ResetAfter)
		if c.exact&(1<<i) != 0 {
			// (a ResetAfter from an estimate of Redis' clock, as on
			// take's plain path, can put it a microsecond past the
			// window's end)
			dw = max(c.win[i], c.counted[i])
		}
		if dw > e.win {
			g.moveTo(i, e, dw) // Redis counted it in the next window
		}
		if r := int64(states[i].Remaining); dw == e.win && (e.free < 0 || r < e.free) {
			// (not a window that has ended since) The least remainder
			// reported: concurrent decisions' replies are noted in any
			// order, and one decided earlier (a larger remainder) noted
			// last would leave a stale remainder to share in an outage.
			// A window's count only grows but by refunds, so the least
			// is the latest or the safe side.
			e.free = r
			if e.budget >= 0 {
				// A cautious window's budget is its last news shared
				// (caution): news of less left shrinks what the budget
				// still allows to its share of it. Kept from news
				// older than the reply (none, when the window became
				// cautious before any reply of it), it would let the
				// instance admit on credit a window Redis has spent.
				e.budget = min(e.budget, e.used+r/int64(max(1, g.instances())))
			}
		}
		if admitted && dw > c.win[i] && g.cautious(i, dw) {
			if dw == e.win {
				g.caution(i, e)
			}
			if dw < e.win || e.used+c.n > e.budget {
				refuseState(&states[i])
				ok = false
			} else {
				e.used += c.n
			}
		}
	}
	return ok
}

// decideLedger is AllowN of a FailLocal Limiter of a window algorithm.
func (l *Limiter) decideLedger(ctx context.Context, key, base string, n int, args []any) (ratelimit.Decision, error) {
	g := l.ledger
	var c ledgerCall
	var st [1]ratelimit.LimitState
	if !g.begin(&c, key, nowUS(l.clock), n, st[:]) {
		if c.charge[0] > 0 {
			l.chargeLedger(ctx, key, base, &c, args)
		}
		return single(&st[0]), nil
	}
	var res []int64
	var charged bool
	fallback, err := l.fail.run(ctx, func(ctx context.Context) error {
		var err error
		res, charged, err = l.callLedger(ctx, base, n, c.cwin[0], c.charge[0], args)
		return err
	})
	switch {
	case fallback:
		k := g.lockOutage(&c, key, st[:])
		if k == nil {
			l.fail.count.Add(1)
			return single(&st[0]), nil
		}
		defer k.mu.Unlock()
		t := nowUS(l.clock)
		d, err := l.fail.decide(ctx, l.limit, l.alg, key, n)
		if err == nil && d.Allowed {
			st[0] = ratelimit.LimitState{Limit: l.limit, Algorithm: l.alg, Allowed: true, Remaining: d.Remaining, ResetAfter: d.ResetAfter}
			if !g.admitLocal(k, &c, t, st[:]) {
				return single(&st[0]), nil
			}
		}
		return d, err
	case err != nil:
		g.abort(&c, key)
		if callerEnded(ctx) != nil {
			return ratelimit.Decision{}, err
		}
		return ratelimit.Decision{}, wrapScriptErr(l.alg, err)
	}
	d, err := l.decision(res)
	if err != nil {
		g.abort(&c, key)
		return d, err
	}
	var bits uint16
	if charged {
		bits = 1
	}
	if l.alg == ratelimit.FixedWindow && len(res) == 5 {
		c.exact, c.counted[0] = 1, res[4] // take's window
	}
	st[0] = ratelimit.LimitState{Limit: l.limit, Algorithm: l.alg, Allowed: d.Allowed, Remaining: d.Remaining,
		RetryAfter: d.RetryAfter, ResetAfter: d.ResetAfter}
	if !g.end(&c, key, nowUS(l.clock), d.Allowed, bits, st[:]) {
		return single(&st[0]), nil
	}
	return d, nil
}

// callLedger is the script call of a decision of a FailLocal Limiter of a
// window algorithm, with args (see AllowN): charge units admitted without
// Redis are added to window win first, when it is the current one
// (reported in charged), then n are decided.
func (l *Limiter) callLedger(ctx context.Context, base string, n int, win, charge int64, args []any) (res []int64, charged bool, err error) {
	if l.alg == ratelimit.FixedWindow {
		return l.take(ctx, base, n, win, charge) // (one take.lua call)
	}
	if charge > 0 { // (sliding_window.lua: the charge, then the decision)
		args = append(args[:len(args):len(args)], win, charge)
	}
	res, err = l.script.Run(ctx, l.client, []string{base}, args...).Int64Slice()
	if err == nil && len(res) == 5 {
		return res[:4], res[4] == 1, nil
	}
	return res, false, err
}

// chargeLedger sends what a decision the ledger refused carries, alone:
// a decision of nothing with the charge, under the failure policy. Its
// outcome is the ledger's only; a charge not applied is owed again.
func (l *Limiter) chargeLedger(ctx context.Context, key, base string, c *ledgerCall, args []any) {
	g := l.ledger
	args = append(args[:0:0], args...)
	args[1] = 0 // n
	var res []int64
	var charged bool
	fallback, err := l.fail.run(ctx, func(ctx context.Context) error {
		var err error
		res, charged, err = l.callLedger(ctx, base, 0, c.cwin[0], c.charge[0], args)
		return err
	})
	var d ratelimit.Decision
	if !fallback && err == nil {
		d, err = l.decision(res)
	}
	if fallback || err != nil {
		g.abort(c, key)
		return
	}
	var bits uint16
	if charged {
		bits = 1
	}
	if l.alg == ratelimit.FixedWindow && len(res) == 5 {
		c.exact, c.counted[0] = 1, res[4] // take's window
	}
	st := [1]ratelimit.LimitState{{Remaining: d.Remaining, ResetAfter: d.ResetAfter}}
	g.end(c, key, nowUS(l.clock), false, bits, st[:])
}

// single is the Decision of a limiter of one limit in state s.
func single(s *ratelimit.LimitState) ratelimit.Decision {
	return ratelimit.Decision{Allowed: s.Allowed, Limit: s.Limit, Algorithm: s.Algorithm, Remaining: s.Remaining,
		RetryAfter: s.RetryAfter, ResetAfter: s.ResetAfter}
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
