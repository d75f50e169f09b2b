package hybrid

import (
	"time"

	"github.com/hybridlimit/ratelimit/internal/breaker"
)

// Stats are counters of a Limiter since New. Every field only grows, but
// KeysTracked, Instances and Degraded, which are current values.
type Stats struct {
	Decisions      uint64 // AllowN calls that returned a decision
	Allowed        uint64 // decisions that admitted
	Denied         uint64 // decisions that denied
	LocalDecisions uint64 // decisions taken in memory, without waiting on Redis
	ExactDecisions uint64 // decisions of cold keys counted exactly in Redis, one call each (shared round trips), not by a lease
	RoundTrips     uint64 // Redis round trips of every kind (a pipeline counts once)
	SyncRoundTrips uint64 // round trips a decision waited on
	Leases         uint64 // grants of quota received from Redis
	LeasedUnits    uint64 // units of quota granted
	LeasedAhead    uint64 // grants of the next window's quota, leased before it began
	NoReply        uint64 // decisions Redis did not answer in time (or answered with an error) while the breaker was closed: denied in Strict, on credit in Optimistic
	Refunded       uint64 // unused leased units given back to Redis
	Expired        uint64 // leased units whose window ended before they were used (counted in Redis, never admitted), and a bucket's tokens a quiet key left to the refill
	Reported       uint64 // units admitted on credit (optimistic or fallback) reported to Redis
	FlushErrors    uint64 // syncer flushes that failed (and were retried)
	Fallback       uint64 // decisions taken by the failure mode because Redis did not answer
	SpentSent      uint64 // windows this instance filled and told the fleet were spent (a FixedWindow limit too small to lease, in Strict mode: see the package doc)
	SpentHeard     uint64 // such words heard for a window then current (its own included)
	SpentDenied    uint64 // decisions of keys without a counter denied in memory on such a word (counted in Denied and LocalDecisions too)
	KeysTracked    int    // keys held in memory now (not a key decided once in two windows, which keeps no counter)
	Instances      int    // instances sharing the quota, as last learned (16 while never learned; see WithInstances)
	Degraded       bool   // the circuit breaker is open: decisions do not wait on Redis
	// LastError is the last error Redis or the client returned to any
	// call of the limiter (nil if none), and LastErrorAt when. Decisions
	// never return Redis errors: this is where a wrong address, password
	// or mode shows (and in Ping, and the observer's events).
	LastError   error
	LastErrorAt time.Time
}

// Stats returns the Limiter's counters. It walks the key table, so call it
// from monitoring, not per request.
func (h *Limiter) Stats() Stats {
	s := Stats{
		RoundTrips:     h.st.roundTrips.Load(),
		SyncRoundTrips: h.st.syncRoundTrips.Load(),
		Leases:         h.st.leases.Load(),
		LeasedUnits:    h.st.leasedUnits.Load(),
		LeasedAhead:    h.st.leasedAhead.Load(),
		NoReply:        h.st.noReply.Load(),
		Refunded:       h.st.refunded.Load(),
		Reported:       h.st.reported.Load(),
		FlushErrors:    h.st.flushErrors.Load(),
		Fallback:       h.st.fallback.Load(),
		SpentDenied:    h.st.spentDenied.Load(),
		ExactDecisions: h.st.exact.Load(),
		Allowed:        h.st.retiredAllowed.Load(),
		Expired:        h.st.retiredExpired.Load(),
		Denied:         h.st.retiredDenied.Load(),
		KeysTracked:    h.table.Len(),
		Instances:      int(h.health.instances()),
		Degraded:       h.health.brk.State() != breaker.Closed,
	}
	if sp := h.spent; sp != nil {
		s.SpentSent, s.SpentHeard = sp.sent.Load(), sp.heard.Load()
	}
	if e := h.health.lastErr.Load(); e != nil {
		s.LastError, s.LastErrorAt = e.err, e.at
	}
	waited := h.st.retiredWaited.Load()
	h.table.Range(func(_ string, c *counter) bool {
		lc := c.lock()
		allowed, denied, w, expired := lc.counts()
		lc.unlock()
		s.Allowed += allowed
		s.Denied += denied
		s.Expired += uint64(expired)
		waited += w
		return true
	})
	s.Decisions = s.Allowed + s.Denied
	s.LocalDecisions = s.Decisions - min(waited, s.Decisions)
	return s
}

// EventKind tells what an Event reports.
type EventKind int

const (
	// EventDegraded: Redis failed repeatedly; the circuit breaker opened and
	// decisions follow the failure mode without waiting on Redis.
	EventDegraded EventKind = iota + 1
	// EventRecovered: Redis answers again; the breaker closed.
	EventRecovered
	// EventFlushError: a background sync failed; it will be retried.
	EventFlushError
)

// String returns "degraded", "recovered" or "flush-error".
func (k EventKind) String() string {
	switch k {
	case EventDegraded:
		return "degraded"
	case EventRecovered:
		return "recovered"
	case EventFlushError:
		return "flush-error"
	}
	return "EventKind(?)"
}

// Event is what an observer registered with WithObserver receives.
type Event struct {
	Kind EventKind
	Err  error // the failure: for EventFlushError, and for EventDegraded the last Redis error before the breaker opened
	Time time.Time
}
