// Package service answers rate-limit requests (Envoy's RLS v3
// ShouldRateLimit, over gRPC or as JSON over HTTP) from the rules of a
// config.Config, with the hybrid limiter (modes strict and optimistic) or the
// global one (mode exact) of github.com/hybridlimit/ratelimit.
//
// # Limiters
//
// A Service keeps one limiter per distinct (mode, algorithm, limit, failure
// mode) and counts every rule of that kind in it, under a key made of the
// domain and the request's descriptor entries, as envoyproxy/ratelimit keys
// its counters. Each such limiter has a Redis key prefix of its own
// (<prefix>:<algorithm>:<rate>:<period>:<mode>-<failure mode>), because a
// hybrid limiter registers as one instance of its prefix's fleet: one
// limiter per prefix per process keeps the fleet size each instance learns
// equal to the number of processes. Strict and exact rules of the same limit
// share a prefix, so a rule moved between the two keeps its counts.
//
// A rule of several limits (rate_limits) gets one multi-limit limiter
// (hybrid.NewMulti, or global.NewMulti in mode exact) per distinct (mode,
// list of limits with their algorithms, failure mode), whose prefix joins
// the limits with '+'. A descriptor is admitted only when every limit
// admits it, and a hit one limit denies is counted by none; its status
// describes the tightest limit (current_limit, limit_remaining and
// duration_until_reset as for a rule of one limit), as ratelimit.Combine
// chooses it: the least remaining when admitted, and when denied the
// denying limit that frees last.
//
// # Backends
//
// The Service decides; a Backend counts (see Backend). New makes the Redis
// backend from Options.Client: the hybrid limiters for strict and
// optimistic rules, the global ones for exact rules, and in the migration
// mode (Compat.EnvoyKeys) limiters that count exact fixed-window rules in
// envoyproxy/ratelimit's keys and its way (Spec.Layout LayoutEnvoy; the
// Service makes their keys, as the peer's cache key without the window).
// The memory backend (NewMemoryBackend) counts with the library's local
// limiters on an injected clock, so that everything above the counting is
// tested without Redis and without sleeps. Giving hits back (a
// hits_addend 0 check, Compat.StopIncrementWhenOverLimit) goes through the
// limiters' reservations (ratelimit.Reserver) whatever the backend; a
// limiter with its own answer to a check is a Checker.
//
// # Reload
//
// Apply installs a new Config atomically: a request sees the old rules or
// the new ones, never a mix, and never waits for a reload. Limiters the new
// rules still use are kept with their state (their leases and counts);
// limiters no rule uses any more are closed, giving their leases back; a
// limiter still used but by fewer rules is flushed, so the removed rules'
// leases go back too. A request that raced with a reload and met a closed
// limiter is decided again against the new rules.
//
// # Decisions
//
// Each descriptor of a request is matched, counted and answered as
// envoyproxy/ratelimit does (see docs/ratelimitd.md for the differences):
// the request is OVER_LIMIT when any descriptor is, shadow_mode turns a
// rule's OVER_LIMIT into OK, quota_mode descriptors make the request
// OVER_LIMIT only when all of them are, replaces drops the rules it names,
// unlimited rules answer OK without counting (nor measuring), and
// requests_per_unit 0 denies every request. A hits_addend above the limit
// can never be admitted and is answered OVER_LIMIT without a Redis call; a
// descriptor's own hits_addend of 0 checks without counting. An unknown
// domain is answered OK with no limit. Compat asks for the rest of
// envoyproxy/ratelimit's behaviours a migrating deployment relies on
// (dynamic metadata, header names, quota mode, stopping the count of a
// request over the limit).
//
// A request holds at most MaxDescriptors descriptors of at most MaxEntries
// entries each (InvalidArgument beyond). Its descriptors of distinct keys
// are counted concurrently, those of one key one after the other, within
// one deadline for the whole request (Timeout): a descriptor still waiting
// when it passes is answered without counting, OK under failure mode open
// and OVER_LIMIT otherwise. So a request waits for Redis about one timeout
// at most, however many descriptors it has.
//
// A Service is safe for concurrent use.
package service
