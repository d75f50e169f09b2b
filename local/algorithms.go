package local

import (
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
type state struct {
	promoted uint64 // the shard's tick when the entry last moved to the LRU front
	a, b, c  int64
	log      []int64
	head, n  int
}

func (l *Limiter) newState(now int64) *state {
	st := &state{}
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

// decide takes the decision for n events at now on st into d, which the
// caller passes zeroed. It runs under the lock of the key's shard.
func (l *Limiter) decide(d *ratelimit.Decision, st *state, now, n int64) {
	switch l.alg {
	case ratelimit.FixedWindow:
		l.fixedWindow(d, st, now, n)
	case ratelimit.SlidingWindow:
		l.slidingWindow(d, st, now, n)
	case ratelimit.SlidingLog:
		l.slidingLog(d, st, now, n)
	case ratelimit.TokenBucket:
		l.tokenBucket(d, st, now, n)
	default:
		l.gcra(d, st, now, n)
	}
}

// windowStart returns now - now mod P, skipping the division when now is in
// the window that starts at last.
func (l *Limiter) windowStart(now, last int64) int64 {
	if now >= last && now-last < l.p {
		return last
	}
	return now - now%l.p
}

func (l *Limiter) fixedWindow(d *ratelimit.Decision, st *state, now, n int64) {
	ws := l.windowStart(now, st.a)
	if ws != st.a {
		st.a, st.b = ws, 0
	}
	if st.b+n <= l.r {
		st.b += n
		d.Allowed = true
	}
	d.Remaining = int(max(l.r-st.b, 0))
	d.ResetAfter = us(ws + l.p - now)
	if !d.Allowed {
		d.RetryAfter = d.ResetAfter
	}
}

// first returns the smallest e in [0, P] with floor(c*(P-e)/P) <= room, for
// c > 0 and room >= 0.
func (l *Limiter) first(c, room int64) int64 {
	return max(0, l.p-ceilDiv((room+1)*l.p, c)+1)
}

func (l *Limiter) slidingWindow(d *ratelimit.Decision, st *state, now, n int64) {
	ws := l.windowStart(now, st.a)
	e := now - ws
	switch {
	case ws == st.a:
	case ws == st.a+l.p:
		st.a, st.c, st.b = ws, st.b, 0
	default: // more than a window idle (or the clock went back): nothing counts
		st.a, st.c, st.b = ws, 0, 0
	}
	est := st.b
	if st.c > 0 {
		est += st.c * (l.p - e) / l.p
	}
	if est+n <= l.r {
		st.b += n
		est += n
		d.Allowed = true
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

func (l *Limiter) slidingLog(d *ratelimit.Decision, st *state, now, n int64) {
	for st.n > 0 && st.log[st.head] <= now-l.p {
		st.head++
		if st.head == len(st.log) {
			st.head = 0
		}
		st.n--
	}
	if int64(st.n)+n <= l.r {
		st.push(now, int(n), int(l.r))
		d.Allowed = true
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

func (l *Limiter) tokenBucket(d *ratelimit.Decision, st *state, now, n int64) {
	u, ts := st.a, st.b
	if dt := now - ts; dt > 0 {
		// u = min(C, u + dt*R), without overflow: at dt >= fullAfter,
		// dt*R >= C; below it dt*R < C + R.
		if dt >= l.fullAfter {
			u = l.c
		} else {
			u = min(l.c, u+dt*l.r)
		}
		ts = now
	}
	need := n * l.p
	if u >= need {
		u -= need
		st.a, st.b = u, ts
		d.Allowed = true
	} else {
		d.RetryAfter = us(ceilDiv(need-u, l.r))
	}
	d.Remaining = int(u / l.p)
	d.ResetAfter = us(ceilDiv(l.c-u, l.r))
}

func (l *Limiter) gcra(d *ratelimit.Decision, st *state, now, n int64) {
	tat := max(st.a, now)
	ntat := tat + n*l.t
	if ntat-now <= l.tau {
		tat = ntat
		st.a = tat
		d.Allowed = true
	} else {
		d.RetryAfter = us(ntat - l.tau - now)
	}
	d.Remaining = int(max((l.tau-(tat-now))/l.t, 0))
	d.ResetAfter = us(tat - now)
}
