package hybrid

import (
	"context"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/script"
	"github.com/hybridlimit/ratelimit/internal/srvclock"
)

// Plain sliding calls: a SlidingWindow cold key's exact call as plain
// commands, not lease.lua.
//
// lease.lua, called for exactly n units, reads three window counters,
// decides and writes, at several times the Redis CPU of the plain
// commands; for a cold SlidingWindow key asked about once a window on an
// instance that made the hybrid slower than per-request `global` (the
// sim's cold row: 0.59x, Redis CPU 22 against 16µs per decision). A plain
// sliding call is four commands in the decision's pipeline: HINCRBY of the
// current window's counter by n, HMGET of the previous and of the next
// window's counters (in that order, after the increment), and the current
// counter's PEXPIREAT (two periods and a second of grace, as lease.lua
// keeps a SlidingWindow counter). The decision is admitted when the bound
// global's SlidingWindow script checks, read from these replies, is within
// the limit: the previous count weighted by what is left of the window,
// plus the current count, and the current plus the next count (what the
// instances leased ahead of the next window). It is as exact:
//
//   - the current count read is the count after this increment: every
//     admission before it is in it, and so are increments still to be
//     given back (the safe side);
//   - the other two counters are read after the increment, so a lease of
//     the next window made meanwhile either is in what was read or saw
//     this increment; and in Strict mode nothing adds to a window that has
//     ended (the previous one only shrinks, by refunds);
//   - the weight is taken at the earliest instant Redis can run the call
//     by this instance's estimate of its clock (the estimate less its error
//     bound): a weight at least Redis's own.
//
// A reply that does not admit refuses when it would at any instant Redis
// can have run the call (the previous count weighted at the latest: the
// reply's arrival by the estimate, and its error bound; WithClock's time
// is exact): the decision is a denial, the key refused until the units
// could fit by what the call read (as lease.lua computes it), and the
// units the call counted go back in a plain HINCRBY of -n (slidingBack)
// before the decision returns, so that a denial does not count. A
// refusal costs Redis two plain commands, not a lease.lua call; on the
// sim's row of keys driven far past a limit of 2 (docs/tuning.md), 13%
// of Redis' CPU per decision. A reply over the limit only by the weight
// at the earliest instant decides nothing: the units it counted are owed
// back, the key's remainder is noted as the bound read, and the decision
// asks again, through lease.lua (which gives the units back in the same
// call, computes when they could fit and refuses the key until then).
// So a plain call is made only far from the limit by what the key
// last heard (half the limit free, as for a plain lease: a plain increment
// counts what it asks before Redis can say it fits); near it, or with the
// window not surely known (srvclock.View.Certain), lease.lua decides. A
// counter a global limiter wrote (a string) makes HINCRBY fail: lease.lua
// is sent instead in the same exchange; an HMGET that meets one decides
// nothing, as a denial. The call carries none of the key's debts (they go
// with its next call or the tick), and, as every exact call, is never sent
// again: a lost reply leaves its units counted.

// plainSliding reports whether a SlidingWindow exact call of n units made
// at at (mono; serverUS > 0: WithClock's time) can be plain (see above),
// and returns its window and the least time into that window, in
// microseconds, at which Redis can run it.
func (lc *lockedCounter) plainSliding(p *params, serverUS, n, at int64, f fleet) (ok bool, idx, srv, elapsed int64) {
	if ok, idx, srv, elapsed = slidingPlainAt(p, serverUS, at, f); !ok {
		return false, 0, 0, 0
	}
	free, known := lc.knownFree(idx)
	if !known {
		free, known = lc.knownFree(idx - 1)
	}
	if known && free-n < p.rate/2 {
		return false, 0, 0, 0
	}
	return true, idx, srv, elapsed
}

// slidingPlainAt reports whether a SlidingWindow call made at at (mono;
// serverUS > 0: WithClock's time) can be plain as far as the clock goes:
// the window Redis runs it in is certain. It returns that window, the
// server time of at, and how far into the window Redis runs it at the
// earliest, in microseconds.
func slidingPlainAt(p *params, serverUS, at int64, f fleet) (ok bool, idx, srv, elapsed int64) {
	if p.alg != ratelimit.SlidingWindow {
		return false, 0, 0, 0
	}
	if serverUS > 0 {
		idx = floorDiv(serverUS, p.periodUS)
		return true, idx, serverUS, serverUS - idx*p.periodUS
	}
	certain, idx := f.clock.Certain(at)
	if !certain {
		return false, 0, 0, 0
	}
	srv = f.clock.ServerAt(at)
	return true, idx, srv, earliestElapsed(p, srv, idx, f.clock)
}

// earliestElapsed is how far into window idx Redis is at the earliest
// when this instance's estimate of its clock reads serverUS: the estimate
// less its error bound and srvclock's margin, in microseconds.
func earliestElapsed(p *params, serverUS, idx int64, clk clockView) int64 {
	earliest := serverUS - (clk.ErrorBound()+srvclock.Margin)/1000
	return min(max(0, earliest-idx*p.periodUS), p.periodUS)
}

// slidingKind reports whether a window counter kind is a SlidingWindow's
// (as lease.lua tells it).
func slidingKind(kind string) bool { return strings.HasPrefix(kind, "sw") }

// slidingRequest is plain sliding call e as its four commands.
func (e *exactCall) slidingRequest() request {
	a := &e.call.win
	cur := script.WindowKey(a.Base, a.Kind, e.swIdx)
	periodUS := int64(a.Limit.Period / time.Microsecond)
	expireAt := ((e.swIdx+2)*periodUS+999)/1000 + 1000 // ms, as lease.lua's expiry of a SlidingWindow counter
	// One allocation for the commands and their arguments, the counter's
	// key boxed once for both of its commands.
	b := new(slidingCmds)
	var kv any = cur
	b.hincrby = [...]any{"hincrby", kv, "c", e.n}
	b.prev = [...]any{"hmget", script.WindowKey(a.Base, a.Kind, e.swIdx-1), "c"}
	b.next = [...]any{"hmget", script.WindowKey(a.Base, a.Kind, e.swIdx+1), "c"}
	b.pexpireat = [...]any{"pexpireat", kv, expireAt}
	b.cmds = [...][]any{b.hincrby[:], b.prev[:], b.next[:], b.pexpireat[:]}
	return request{
		cmds:     b.cmds[:],
		parse:    (*slidingExact)(e),
		fallback: (*slidingExact)(e),
	}
}

// slidingCmds holds the commands of a plain sliding call.
type slidingCmds struct {
	cmds       [4][]any
	hincrby    [4]any
	prev, next [3]any
	pexpireat  [3]any
}

// slidingExact is an exactCall sent as a plain sliding call: it reads its
// replies, and falls back to lease.lua for exactly n units. (What it reads
// of the call is set when the call is made and never changes.)
type slidingExact exactCall

// parseReply reads the increment's reply: the current count after it.
func (e *slidingExact) parseReply(v any) (reply, error) {
	c, err := hincrbyReply(v)
	if err != nil {
		return reply{}, err
	}
	periodUS := int64(e.call.win.Limit.Period / time.Microsecond)
	return reply{plain: true, win: script.Reply{Idx: e.swIdx, Now: e.serverUS, Reset: (e.swIdx+1)*periodUS - e.serverUS, Count: c}}, nil
}

// parseReplies reads the previous and the next window's counts and
// decides: Grant n when the bound is within the limit, Count the bound.
// A counter of another type decides nothing (Count the limit: no room).
func (e *slidingExact) parseReplies(r reply, rest []*redis.Cmd) (reply, error) {
	a := &e.call.win
	rate, periodUS := int64(a.Limit.Rate), int64(a.Limit.Period/time.Microsecond)
	counts, other, err := readCounts(rest)
	if err != nil {
		return reply{}, err
	}
	if other {
		r.win.Count = max(r.win.Count, rate)
		return r, nil
	}
	curr, prev, next := r.win.Count, counts[0], counts[1]
	r.sw = slidingRead{prev: prev, curr: curr, next: next, read: true}
	bound := r.sw.bound(e.swElapsed, periodUS)
	r.win.Count = bound
	if bound <= rate {
		r.win.Grant = e.n
	} else {
		r.win.Retry = max(1, r.sw.fit(rate, e.n, periodUS)-e.swElapsed)
	}
	return r, nil
}

// slidingRead is what a plain sliding call read: the previous, the
// current (after its increment) and the next window's counts.
type slidingRead struct {
	prev, curr, next int64
	read             bool // the counts were read (none met a counter of another type)
}

// bound is the count that bounds the current window elapsed µs into it,
// as global's SlidingWindow script checks it: the previous count weighted
// by what is left of the window plus the current count, or the current
// plus the next count, whichever is larger.
func (s slidingRead) bound(elapsed, periodUS int64) int64 {
	return max(satAdd(weighted(s.prev, periodUS-elapsed, periodUS), s.curr), satAdd(s.curr, s.next))
}

// fit is how far into the current window, in microseconds, the call's n
// units could fit at the earliest once given back, as lease.lua computes a
// refusal's retry: when the previous count's weight has fallen enough, or,
// when the current and the next count leave no room, that far into the
// next window (beyond periodUS).
func (s slidingRead) fit(rate, n, periodUS int64) int64 {
	curr := s.curr - n // without the call's own units
	if satAdd(satAdd(curr, s.next), n) <= rate {
		return firstAt(s.prev, rate-curr-n, periodUS)
	}
	return periodUS + firstAt(curr, rate-s.next-n, periodUS)
}

// firstAt is the least time into a window, in microseconds and at most
// periodUS + 1, at which a count c of the window before, weighted by what
// is left of this one, leaves room units free: lease.lua's first.
func firstAt(c, room, periodUS int64) int64 {
	if c <= 0 {
		return 0
	}
	if room < 0 {
		return periodUS + 1
	}
	// the least e with floor(c x (P - e) / P) <= room: c x (P - e) < (room + 1) x P
	hi, lo := bits.Mul64(uint64(room+1), uint64(periodUS))
	if hi != 0 || lo >= uint64(maxCount) {
		return 0
	}
	q := (lo + uint64(c) - 1) / uint64(c) // ceil((room + 1) x P / c)
	return max(0, periodUS-int64(q)+1)
}

// refusedSurely reports whether what plain sliding call e read refuses it
// wherever Redis's clock stood when it ran: with the previous count
// weighted at the latest instant it can have run (its reply's arrival by
// this instance's estimate of Redis time, and the estimate's error bound),
// or at WithClock's time. Then the refusal is global's too, and decides:
// no script call is needed to ask again.
func (e *exactCall) refusedSurely(clk clockView) bool {
	s := e.res.sw
	if !s.read {
		return false // a counter of another type: lease.lua decides
	}
	a := &e.call.win
	rate, periodUS := int64(a.Limit.Rate), int64(a.Limit.Period/time.Microsecond)
	elapsed := e.swElapsed
	if a.Now <= 0 {
		latest := clk.ServerAt(e.x.after) + (clk.ErrorBound()+srvclock.Margin+999)/1000
		elapsed = min(max(0, latest-e.swIdx*periodUS), periodUS)
	}
	return s.bound(elapsed, periodUS) > rate
}

func (e *slidingExact) fallbackRequest() request { return e.call.request() }

// readCounts reads the two HMGETs of a plain sliding call or lease, the
// first two of rest: their counts; other when one met a key of another
// type (a counter a global Multi wrote), which the call decides nothing
// by.
func readCounts(rest []*redis.Cmd) (counts [2]int64, other bool, err error) {
	if len(rest) < 2 {
		return counts, false, fmt.Errorf("hybrid: a plain sliding call lacks replies: %d", len(rest))
	}
	for i, cmd := range rest[:2] {
		v, err := cmd.Result()
		if err != nil { // (HasErrorPrefix allocates even for no error: asked only of one)
			if redis.HasErrorPrefix(err, "WRONGTYPE") {
				return counts, true, nil
			}
			return counts, false, err
		}
		if counts[i], err = hmgetCount(v); err != nil {
			return counts, false, err
		}
	}
	return counts, false, nil
}

// hmgetCount reads an HMGET of one field: the count, 0 when absent.
func hmgetCount(v any) (int64, error) {
	vs, ok := v.([]any)
	if !ok || len(vs) != 1 {
		return 0, fmt.Errorf("hybrid: unexpected reply to HMGET: %T", v)
	}
	switch x := vs[0].(type) {
	case nil:
		return 0, nil
	case string:
		c, err := strconv.ParseInt(x, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("hybrid: a window counter is not a number: %q", x)
		}
		return c, nil
	}
	return 0, fmt.Errorf("hybrid: unexpected value in HMGET's reply: %T", vs[0])
}

// maxCount is where counts saturate, as the scripts' (2^53).
const maxCount = 1 << 53

// weighted is floor(c x left / period), as the scripts weigh the previous
// window's count, saturating at maxCount.
func weighted(c, left, period int64) int64 {
	if c <= 0 || left <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(c), uint64(left))
	if hi != 0 || lo >= maxCount {
		return maxCount
	}
	return int64(lo / uint64(period))
}

// satAdd is a + b for counts, saturating at maxCount.
func satAdd(a, b int64) int64 {
	if a >= maxCount-b {
		return maxCount
	}
	return a + b
}

// Plain sliding leases: a SlidingWindow lease call of one window, far from
// the limit, as a FixedWindow plain lease is (plainlease.go), with the reads
// a plain sliding call makes. Its grant is read as lease.lua would make it
// from the bound before the increment: for the current window, the
// previous count weighted (at the earliest instant Redis can run the call)
// plus the current count, or the current plus the next count, whichever is
// larger; for the next window, the current count plus the next. What was
// counted and not granted is owed back; a read that meets a counter of
// another type grants nothing.

// slidingRequest is plain lease k of a SlidingWindow: the increment of its
// window's counter, the reads of the counters that bound it, the record a
// resend finds, and the expiry (two periods from the window's start and a
// second, as lease.lua's).
func (k *leaseCall) slidingRequest() request {
	a := &k.win
	win, w := k.plainWindow()
	key := script.WindowKey(a.Base, a.Kind, win)
	periodUS := int64(a.Limit.Period / time.Microsecond)
	expireAt := ((win+2)*periodUS+999)/1000 + 1000 // ms
	// the current window reads the one before and the one after it; the
	// next window (a lease ahead), the current one
	first, second := win-1, win+1
	if win != k.plainIdx {
		first, second = k.plainIdx, k.plainIdx
	}
	return request{
		cmds: [][]any{
			{"hincrby", key, "c", w},
			{"hmget", script.WindowKey(a.Base, a.Kind, first), "c"},
			{"hmget", script.WindowKey(a.Base, a.Kind, second), "c"},
			{"hset", key, "r", a.Nonce + "!"},
			{"pexpireat", key, expireAt},
		},
		parse:    (*slidingLease)(k),
		fallback: leaseFallback(k.win),
	}
}

// slidingLease is a SlidingWindow leaseCall sent as a plain lease.
type slidingLease leaseCall

// parseReply reads the increment's reply; parseReplies grants.
func (k *slidingLease) parseReply(v any) (reply, error) {
	c, err := hincrbyReply(v)
	if err != nil {
		return reply{}, err
	}
	a := &k.win
	periodUS := int64(a.Limit.Period / time.Microsecond)
	return reply{plain: true, win: script.Reply{Idx: k.plainIdx, Now: k.serverUS, Reset: (k.plainIdx+1)*periodUS - k.serverUS, Count: c}}, nil
}

func (k *slidingLease) parseReplies(r reply, rest []*redis.Cmd) (reply, error) {
	a := &k.win
	rate, periodUS := int64(a.Limit.Rate), int64(a.Limit.Period/time.Microsecond)
	win, w := (*leaseCall)(k).plainWindow()
	after := r.win.Count // the incremented window's count after the increment
	r.win.Count = 0
	counts, other, err := readCounts(rest)
	if err != nil {
		return reply{}, err
	}
	if other {
		// a counter a global Multi wrote: nothing granted, all owed back
		if win == k.plainIdx {
			r.win.Count, r.win.Retry = rate, 1
		} else {
			r.win.CountNext = rate
		}
		return r, nil
	}
	before := after - w
	if win != k.plainIdx {
		bound := satAdd(counts[0], before) // current + next
		g := min(w, rate-bound)
		if g < 1 {
			g = 0
		}
		r.win.GrantNext, r.win.CountNext = g, bound+g
		return r, nil
	}
	bound := slidingRead{prev: counts[0], curr: before, next: counts[1]}.bound(k.plainElapsed, periodUS)
	g := min(w, rate-bound)
	if g < max(1, a.Min) {
		g = 0
		r.win.Retry = max(1, r.win.Reset)
	}
	r.win.Grant, r.win.Count = g, bound+g
	return r, nil
}

// slidingBack gives back the n units a plain sliding call counted in its
// window and did not admit: a plain HINCRBY of the counter by -n, and
// the counter's expiry again (the call's own, so the same). The decision
// waits for it, as global's plain FixedWindow decisions wait for theirs,
// so that a denial does not count when it returns: a refusal costs Redis
// a give-back of two commands, not a lease.lua call that asks again. (A
// counter Redis lost between the call and its give-back, in a restart
// without persistence or a flush, is made anew at -n, and expires with
// its window: that window, whose count was lost anyway, admits n more.)
type slidingBack struct {
	key, kbase string
	n          int64
	expireAt   int64 // ms
	done       chan struct{}
	res        result // set before done closes
}

func (b *slidingBack) base() string { return b.kbase }

func (b *slidingBack) request() request {
	return request{cmds: [][]any{
		{"hincrby", b.key, "c", -b.n},
		{"pexpireat", b.key, b.expireAt},
	}, parse: parseFunc(ignoreReply)}
}

// newSlidingBack is the give-back of plain sliding call e.
func newSlidingBack(e *exactCall) *slidingBack {
	a := &e.call.win
	periodUS := int64(a.Limit.Period / time.Microsecond)
	return &slidingBack{
		key:      script.WindowKey(a.Base, a.Kind, e.swIdx),
		kbase:    a.Base,
		n:        e.n,
		expireAt: ((e.swIdx+2)*periodUS+999)/1000 + 1000, // as slidingRequest's
		done:     make(chan struct{}),
	}
}

// giveBackSliding gives back what plain sliding call e, refused, counted, and
// waits for it until the decision's deadline (fire, expired or ctx). A
// give-back without a reply may have run: its units are not owed again
// (they stay counted at worst, the safe side); one that certainly did
// not run leaves them owed, to go with the key's next call or the tick.
func (h *Limiter) giveBackSliding(ctx context.Context, e *exactCall, fire <-chan time.Time, expired <-chan struct{}) {
	b := newSlidingBack(e)
	e.back = backSent
	h.asks.add(b)
	select {
	case <-b.done:
		if b.res.err != nil && b.res.notRun {
			e.back = backNotRun
		}
	case <-ctx.Done():
	case <-fire:
	case <-expired:
	}
}
