package local

import "github.com/hybridlimit/ratelimit"

// settle applies the settlement of a reservation of est events, admitted at
// t0, with actual events, at now (docs/algorithms.md, "Reserve and
// settle"). A smaller actual gives est - actual back where it was taken
// from while that still counts; a larger one charges the excess now, past
// the limit if need be. SlidingLog is never reserved.
func (l *algo) settle(st *state, now, t0, est, actual int64) {
	refund, over := est-actual, actual-est
	switch l.alg {
	case ratelimit.FixedWindow:
		ws := l.rollFixed(st, now)
		if refund > 0 && t0-t0%l.p == ws {
			st.b = max(st.b-refund, 0)
		}
		if over > 0 {
			st.b = min(st.b+over, maxExact)
		}
	case ratelimit.SlidingWindow:
		l.rollSliding(st, now)
		if refund > 0 {
			switch t0 - t0%l.p {
			case st.a:
				st.b = max(st.b-refund, 0)
			case st.a - l.p:
				st.c = max(st.c-refund, 0)
			}
		}
		if over > 0 {
			st.b = min(st.b+over, maxExact)
		}
	case ratelimit.TokenBucket:
		l.refill(st, now)
		if refund > 0 {
			// What the bucket has not refilled by itself since t0.
			units, el := refund*l.p, max(now-t0, 0)
			if el < ceilDiv(units, l.r) {
				st.a = min(l.c, st.a+units-el*l.r)
			}
		}
		if over > 0 {
			lo := l.c - maxExact // the deepest debt: C - u <= MaxExact
			if over > (st.a-lo)/l.p {
				st.a = lo
			} else {
				st.a -= over * l.p
			}
		}
	case ratelimit.GCRA:
		d := max(st.a, now) - now
		if refund > 0 {
			if back := refund*l.t - max(now-t0, 0); back > 0 {
				d = max(d-back, 0)
			}
		}
		if over > 0 {
			hi := maxExact - l.tau // the deepest debt: d + n*T <= MaxExact
			if over > max(hi-d, 0)/l.t {
				d = max(d, hi)
			} else {
				d += over * l.t
			}
		}
		st.a = now + d
	}
}
