// Package ratelimit is the shared vocabulary of a rate-limiting library for
// fleets of Go service instances that must enforce one limit per key (user,
// API key, IP, tenant) together.
//
// The root package holds what every limiter shares: Limit (Rate events per
// Period, with a Burst for the bucket algorithms) and ParseLimit to read one
// from configuration ("100/min"), Algorithm, Decision, the Limiter
// interface, the error values and SetHeaders for HTTP responses; for
// limiters of several limits per key, MultiLimiter, LimitState and Combine;
// for work whose cost is known only after it, Reserver and Reservation
// (reserve an estimate, settle with the actual cost). The limiters live in
// subpackages:
//
//   - hybrid: the main API. Each instance answers almost every decision from
//     memory, out of a slice of the global quota leased from Redis, and a
//     background syncer keeps the fleet's counts in Redis honest.
//   - global: exact limiters that run one atomic Lua script on Redis per
//     decision (FixedWindow, SlidingWindow, SlidingLog, TokenBucket, GCRA).
//   - local: the same five algorithms in process memory, for one instance.
//
// The exact semantics of each algorithm, which local and global share to the
// microsecond, are written down in docs/algorithms.md.
package ratelimit
