package ratelimit

import (
	"context"
	"time"
)

// MaxLimits is the most limits one multi-limit limiter enforces on a key.
// Real APIs stack a few (per second, minute, hour, day, month); the bound
// keeps a decision's work and its Redis script call small.
const MaxLimits = 8

// LimitState is the state of one limit of a multi-limit decision (see
// Decision.Limits).
//
// Allowed reports whether this limit alone would admit the request; the
// request itself is admitted only when every limit allows it. When it is
// admitted, Remaining and ResetAfter are the limit's state after it
// consumed the request; when it is denied, nothing was consumed anywhere and
// they are the limit's state as it stands. RetryAfter is zero for a limit
// that allows, and otherwise, as in Decision, the earliest time after which
// this limit would admit the request if nothing else happened.
type LimitState struct {
	Limit      Limit
	Algorithm  Algorithm
	Allowed    bool
	Remaining  int
	RetryAfter time.Duration
	ResetAfter time.Duration
}

// Combine returns the Decision of a multi-limit decision from the state of
// each of its limits, *states, in the limiter's order. Limiters call it; it
// is exported so that every package combines the same way.
//
// The Decision is Allowed when every limit allows. It describes the
// tightest limit: when allowed, the one with the least Remaining (ties: the
// one with the longer ResetAfter, then the first); when denied, the denying
// limit with the latest RetryAfter (ties: less Remaining, longer
// ResetAfter, then the first), so that its RetryAfter is the time after
// which every limit admits the request (no algorithm turns an admission
// into a denial by waiting). The Decision's Limits is *states itself, not
// a copy (Combine keeps the pointer, so that a Decision stays nine words).
//
// For a nil or empty *states Combine returns the zero Decision.
func Combine(states *[]LimitState) Decision {
	if states == nil || len(*states) == 0 {
		return Decision{}
	}
	return combine(*states, states)
}

func combine(states []LimitState, p *[]LimitState) Decision {
	allowed := true
	for i := range states {
		if !states[i].Allowed {
			allowed = false
			break
		}
	}
	best := -1
	for i := range states {
		s := &states[i]
		if !allowed && s.Allowed {
			continue
		}
		if best < 0 || tighter(s, &states[best], allowed) {
			best = i
		}
	}
	s := &states[best]
	d := Decision{Allowed: allowed, Limit: s.Limit, Algorithm: s.Algorithm, Remaining: s.Remaining, ResetAfter: s.ResetAfter, limits: p}
	if !allowed {
		d.RetryAfter = s.RetryAfter
	}
	return d
}

// tighter reports whether a describes the decision better than b.
func tighter(a, b *LimitState, allowed bool) bool {
	if !allowed && a.RetryAfter != b.RetryAfter {
		return a.RetryAfter > b.RetryAfter
	}
	if a.Remaining != b.Remaining {
		return a.Remaining < b.Remaining
	}
	return a.ResetAfter > b.ResetAfter
}

// MultiLimiter is a Limiter that enforces several limits on each key, all
// or nothing: a decision consumes from every limit or from none. The
// limiters made by NewMulti in the local, global and hybrid packages
// implement it.
//
// A multi-limit limiter is built from a []Limit and one Algorithm per
// limit, given in the same order (an option WithAlgorithms(a0, a1, ...) of
// its package, or WithAlgorithm(a) for all); Decision.Limits lists the
// limits in that order. Its Decision describes the tightest limit (see
// Combine). Any algorithms may be mixed (for example a TokenBucket for
// bursts and a FixedWindow per day): each limit keeps its own state, and
// every algorithm leaves its state unchanged on a denial and only ever
// turns a denial into an admission by waiting, so the conjunction is exact
// and its RetryAfter is the latest of the denying limits'. See
// docs/algorithms.md.
type MultiLimiter interface {
	Limiter
	Reserver
	// Limits returns the limits in order; Algorithms their algorithms.
	Limits() []Limit
	Algorithms() []Algorithm
	// AllowNInto is AllowN that writes the state of each limit into
	// *states, reusing its array when its capacity holds them all, so that
	// a caller who reuses a buffer decides without allocating; the
	// Decision's Limits is *states. A nil states is AllowN.
	AllowNInto(ctx context.Context, key string, n int, states *[]LimitState) (Decision, error)
}
