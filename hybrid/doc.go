// Package hybrid is the main API of the module: a rate limiter for a fleet
// of service instances that share one limit per key, answering almost every
// decision from process memory while Redis keeps the fleet honest.
//
// Each instance keeps a bounded LRU of per-key counters. A counter leases a
// slice of the key's quota for the current window from Redis (one atomic Lua
// script on the same fw:/sw: window counters the global package uses) and
// admits requests from that slice with one CAS: no lock shared by all
// goroutines, no allocation, no wait on Redis. When the slice runs dry the
// counter leases again, one call shared by every concurrent caller of the
// key. A background syncer (package sync) tops up busy keys' leases in one
// pipelined round trip per tick, gives back what idle, evicted and closed
// counters hold, and reports usage admitted on credit.
//
// Guarantees, while Redis answers:
//
//   - Strict mode (the default): every allowed decision is backed by quota
//     Redis granted atomically, so per key and window the fleet never admits
//     more than Rate. Leases are sized from the key's observed rate, at most
//     remainder / instances (the last quarter of a window in chunks of Rate
//     / (4 x instances)), so no one instance takes what is left. What an
//     instance leaves unused of its lease when the window ends is lost to
//     the others for that window: a key driven far past its limit uses all
//     of it, a key asked just past it may fall a few units short
//     (docs/tuning.md).
//   - Optimistic mode: an instance whose lease ran dry may admit up to Rate /
//     (8 x instances) per window on credit, reported at the next sync; the
//     fleet may overshoot by at most the sum of those shares per window.
//   - Small limits: a key of a FixedWindow or SlidingWindow limit too
//     small to lease (Rate under 8 per instance, a login limit, say) is
//     counted exactly, a call per decision. The instance whose call fills
//     such a window (for SlidingWindow, brings the window's own count to
//     the limit) publishes it on the channel prefix + ":spent" with its
//     next pipeline, and the instances that hear it deny the key in memory
//     until the window ends, rather than each ask Redis to be denied. A word heard only ever
//     denies; it is forgotten when the subscription (one connection per
//     Limiter, made once such a limit is decided) is made anew, as after a
//     restart of Redis, and a reservation given back says the window is
//     open again. An ACL without channels turns it off.
//   - Counts are never silently lost: unused quota of a counter that is
//     evicted, idle for a whole window, flushed or closed goes back to Redis,
//     and so does the lease of a key gone quiet in a window with over a
//     second to run (its client moved to another instance).
//
// When Redis does not answer within the timeout, decisions follow the
// ratelimit.FailureMode (FailLocal by default) with a nil error, and a circuit breaker
// keeps later decisions from waiting on Redis until it answers again.
//
// Windows come from Redis server time; see docs/architecture.md and
// docs/tuning.md for the design and its trade-offs.
package hybrid
