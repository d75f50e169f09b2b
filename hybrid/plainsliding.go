package hybrid

import (
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
// A reply that does not admit decides nothing: the units it counted are
// owed back, the key's remainder is noted as the bound read, and the
// decision asks again, through lease.lua (which gives the units back in
// the same call, computes when they could fit and refuses the key until
// then). So a plain call is made only far from the limit by what the key
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
	return request{
		cmds: [][]any{
			{"hincrby", cur, "c", e.n},
			{"hmget", script.WindowKey(a.Base, a.Kind, e.swIdx-1), "c"},
			{"hmget", script.WindowKey(a.Base, a.Kind, e.swIdx+1), "c"},
			{"pexpireat", cur, expireAt},
		},
		parse:    (*slidingExact)(e),
		fallback: (*slidingExact)(e),
	}
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
	bound := weighted(prev, periodUS-e.swElapsed, periodUS)
	bound = satAdd(bound, curr)
	bound = max(bound, satAdd(curr, next))
	r.win.Count = bound
	if bound <= rate {
		r.win.Grant = e.n
	}
	return r, nil
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
		if redis.HasErrorPrefix(err, "WRONGTYPE") {
			return counts, true, nil
		}
		if err != nil {
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
	prev, next := counts[0], counts[1]
	bound := max(satAdd(weighted(prev, periodUS-k.plainElapsed, periodUS), before), satAdd(before, next))
	g := min(w, rate-bound)
	if g < max(1, a.Min) {
		g = 0
		r.win.Retry = max(1, r.win.Reset)
	}
	r.win.Grant, r.win.Count = g, bound+g
	return r, nil
}
