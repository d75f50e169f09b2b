package local

import (
	"fmt"
	"time"

	"github.com/hybridlimit/ratelimit"
)

// state is the per-key state of every algorithm; it is only read and written
// under the lock of the key's shard. All times are µs since the Unix epoch.
//
//	FixedWindow:   a = window start, b = count
//	SlidingWindow: a = window start, b = current count, c = previous count
//	SlidingLog:    log = ring of admitted event times, head = oldest, n = length
//	TokenBucket:   a = content u (one token = P units), b = ts
//	GCRA:          a = tat
//
// A settled overdraft (see settle) can take a count past Rate, u below 0
// and tat past now + tau.
type state struct {
	promoted uint64 // the shard's tick when the entry last moved to the LRU front
	a, b, c  int64
	log      []int64
	head, n  int
}

// maxExact is 2^53, the bound of the integers every implementation (Redis'
// Lua doubles included) computes exactly; Limit.ValidateFor keeps Rate x
// Period and Burst x Period within it (but for FixedWindow, which needs no
// such product), and overdrafts saturate at it.
const maxExact = 1 << 53

// algo is one Limit counted with one Algorithm: the constants a decision
// needs, in integer microseconds (docs/algorithms.md).
type algo struct {
	limit     ratelimit.Limit
	alg       ratelimit.Algorithm
	maxN      int   // the largest valid n: Rate (windows) or Capacity (buckets)
	p, r, b   int64 // Period in µs, Rate, Capacity
	c         int64 // TokenBucket capacity in units: b * p
	fullAfter int64 // TokenBucket: ceil(c / r), the refill time of an empty bucket
	t, tau    int64 // GCRA emission interval and tolerance, µs
}

func newAlgo(limit ratelimit.Limit, alg ratelimit.Algorithm) (algo, error) {
	if err := limit.ValidateFor(alg); err != nil {
		return algo{}, err
	}
	p := int64(limit.Period / time.Microsecond)
	a := algo{limit: limit, alg: alg, p: p, r: int64(limit.Rate), b: int64(limit.Capacity(alg)), maxN: limit.Capacity(alg)}
	if alg == ratelimit.TokenBucket { // b x p may exceed 2^63 for a FixedWindow (ValidateFor)
		a.c = a.b * p
		a.fullAfter = ceilDiv(a.c, a.r)
	}
	if alg == ratelimit.GCRA {
		if p < a.r {
			return algo{}, fmt.Errorf("%w: GCRA needs Period >= Rate microseconds (emission interval Period/Rate >= 1µs), got %v", ratelimit.ErrInvalidLimit, limit)
		}
		a.t = p / a.r
		a.tau = a.b * a.t
	}
	return a, nil
}

func (l *algo) newState(now int64) state {
	var st state
	switch l.alg {
	case ratelimit.FixedWindow, ratelimit.SlidingWindow:
		st.a = now - now%l.p
	case ratelimit.TokenBucket:
		st.a, st.b = l.c, now
	case ratelimit.GCRA:
		st.a = now
	}
	return st
}

func us(v int64) time.Duration { return time.Duration(v) * time.Microsecond }

// ceilDiv returns ceil(a/b) for a >= 0, b > 0.
func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// decision returns the Decision of l with what its algorithm fills left
// zero: its Limit and Algorithm.
func (l *algo) decision() ratelimit.Decision {
	return ratelimit.Decision{Limit: l.limit, Algorithm: l.alg}
}

// limitState returns d, a decision of one limit, as a LimitState.
func limitState(d *ratelimit.Decision) ratelimit.LimitState {
	return ratelimit.LimitState{Limit: d.Limit, Algorithm: d.Algorithm, Allowed: d.Allowed, Remaining: d.Remaining,
		RetryAfter: d.RetryAfter, ResetAfter: d.ResetAfter}
}

// decide takes the decision for n events at now on st into d, which the
// caller passes with only Limit and Algorithm set (decision): whether they
// fit (Allowed) and, when commit is true and they do, consumes them. Without commit it leaves
// st as it was, up to bringing it to now (rolling windows, dropping old log
// entries, refilling the bucket), which changes no later decision. It runs
// under the lock of the key's shard.
func (l *algo) decide(d *ratelimit.Decision, st *state, now, n int64, commit bool) {
	if (l.alg == ratelimit.FixedWindow || l.alg == ratelimit.SlidingWindow) && now < st.a {
		// A clock reading taken before another decision rolled the key's
		// window (this one waited for the shard's lock meanwhile), or a
		// clock that stepped back: decided in the key's window, never
		// rolling it back, which would forget its count.
		now = st.a
	}
	switch l.alg {
	case ratelimit.FixedWindow:
		l.fixedWindow(d, st, now, n, commit)
	case ratelimit.SlidingWindow:
		l.slidingWindow(d, st, now, n, commit)
	case ratelimit.SlidingLog:
		l.slidingLog(d, st, now, n, commit)
	case ratelimit.TokenBucket:
		l.tokenBucket(d, st, now, n, commit)
	default:
		l.gcra(d, st, now, n, commit)
	}
}

// windowStart returns now - now mod P, skipping the division when now is in
// the window that starts at last.
func (l *algo) windowStart(now, last int64) int64 {
	if now >= last && now-last < l.p {
		return last
	}
	return now - now%l.p
}

// rollFixed brings a FixedWindow state to the window of now and returns its
// start.
func (l *algo) rollFixed(st *state, now int64) int64 {
	ws := l.windowStart(now, st.a)
	if ws != st.a {
		st.a, st.b = ws, 0
	}
	return ws
}

func (l *algo) fixedWindow(d *ratelimit.Decision, st *state, now, n int64, commit bool) {
	ws := l.rollFixed(st, now)
	d.Allowed = st.b+n <= l.r
	if d.Allowed && commit {
		st.b += n
	}
	d.Remaining = int(max(l.r-st.b, 0))
	d.ResetAfter = us(ws + l.p - now)
	if !d.Allowed {
		d.RetryAfter = d.ResetAfter
	}
}

// first returns the smallest e in [0, P] with floor(c*(P-e)/P) <= room, for
// c > 0 and room >= 0.
func (l *algo) first(c, room int64) int64 {
	return max(0, l.p-ceilDiv((room+1)*l.p, c)+1)
}

// rollSliding brings a SlidingWindow state to the window of now and returns
// the time elapsed in it.
func (l *algo) rollSliding(st *state, now int64) int64 {
	ws := l.windowStart(now, st.a)
	switch {
	case ws == st.a:
	case ws == st.a+l.p:
		st.a, st.c, st.b = ws, st.b, 0
	default: // more than a window idle (or the clock went back): nothing counts
		st.a, st.c, st.b = ws, 0, 0
	}
	return now - ws
}

func (l *algo) slidingWindow(d *ratelimit.Decision, st *state, now, n int64, commit bool) {
	e := l.rollSliding(st, now)
	est := st.b
	if w := l.p - e; st.c > (maxExact-1)/w {
		// An overdraft's count weighs at least MaxExact: far above Rate,
		// whose product with P is at most MaxExact. Saturate, as global
		// must (its doubles would round the product).
		est = maxExact
	} else if st.c > 0 {
		est += st.c * w / l.p
	}
	d.Allowed = est+n <= l.r
	if d.Allowed && commit {
		st.b += n
		est += n
	}
	d.Remaining = int(max(l.r-est, 0))
	d.ResetAfter = us(l.p - e)
	if !d.Allowed {
		if room := l.r - st.b - n; room >= 0 {
			d.RetryAfter = us(l.first(st.c, room) - e)
		} else {
			d.RetryAfter = us(l.p - e + l.first(st.b, l.r-n))
		}
	}
}

// at returns the i-th oldest logged time (0-based).
func (st *state) at(i int) int64 { return st.log[(st.head+i)%len(st.log)] }

func (l *algo) slidingLog(d *ratelimit.Decision, st *state, now, n int64, commit bool) {
	for st.n > 0 && st.log[st.head] <= now-l.p {
		st.head++
		if st.head == len(st.log) {
			st.head = 0
		}
		st.n--
	}
	d.Allowed = int64(st.n)+n <= l.r
	if d.Allowed && commit {
		st.push(now, int(n), int(l.r))
	}
	d.Remaining = int(max(l.r-int64(st.n), 0))
	if st.n > 0 {
		d.ResetAfter = us(st.at(st.n-1) + l.p - now)
	}
	if !d.Allowed {
		k := int64(st.n) + n - l.r // 1-based, 1 <= k <= st.n
		d.RetryAfter = us(st.at(int(k-1)) + l.p - now)
	}
}

// push appends k copies of t to the log, growing the ring (by doubling, up
// to limit entries) when it is full. The caller guarantees st.n+k <= limit.
func (st *state) push(t int64, k, limit int) {
	if need := st.n + k; need > len(st.log) {
		size := max(2*len(st.log), 4, need)
		size = min(size, limit)
		grown := make([]int64, size)
		for i := 0; i < st.n; i++ {
			grown[i] = st.at(i)
		}
		st.log, st.head = grown, 0
	}
	for ; k > 0; k-- {
		i := st.head + st.n
		if i >= len(st.log) {
			i -= len(st.log)
		}
		st.log[i] = t
		st.n++
	}
}

// refill brings a TokenBucket state to now: u = min(C, u + dt*R), without
// overflow.
func (l *algo) refill(st *state, now int64) {
	dt := now - st.b
	if dt <= 0 {
		return
	}
	// At dt >= fullAfter, dt*R >= C >= C - u for u >= 0; below it, dt*R <
	// C + R. An overdraft (u < 0) needs longer.
	switch {
	case dt < l.fullAfter:
		st.a = min(l.c, st.a+dt*l.r)
	case st.a >= 0 || dt >= ceilDiv(l.c-st.a, l.r):
		st.a = l.c
	default:
		st.a += dt * l.r
	}
	st.b = now
}

func (l *algo) tokenBucket(d *ratelimit.Decision, st *state, now, n int64, commit bool) {
	l.refill(st, now)
	u := st.a
	need := n * l.p
	d.Allowed = u >= need
	if d.Allowed && commit {
		u -= need
		st.a = u
	}
	if !d.Allowed {
		d.RetryAfter = us(ceilDiv(need-u, l.r))
	}
	d.Remaining = int(max(u, 0) / l.p)
	d.ResetAfter = us(ceilDiv(l.c-u, l.r))
}

func (l *algo) gcra(d *ratelimit.Decision, st *state, now, n int64, commit bool) {
	tat := max(st.a, now)
	ntat := tat + n*l.t
	d.Allowed = ntat-now <= l.tau
	if d.Allowed && commit {
		tat = ntat
	}
	st.a = tat
	if !d.Allowed {
		d.RetryAfter = us(ntat - l.tau - now)
	}
	d.Remaining = int(max(l.tau-(tat-now), 0) / l.t)
	d.ResetAfter = us(tat - now)
}
