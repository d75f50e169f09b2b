// Package local provides in-process rate limiters and the bounded, sharded
// key table they (and the hybrid limiter) keep per-key state in.
//
// A Limiter enforces one ratelimit.Limit per key with any of the five
// algorithms of package ratelimit (FixedWindow, SlidingWindow, SlidingLog,
// TokenBucket, GCRA). Its decisions follow docs/algorithms.md exactly, in
// integer microseconds, so that a Limiter and a global.Limiter given the same
// requests at the same instants decide identically; only the state lives in
// process memory instead of Redis, so the limit holds per process, not per
// fleet.
//
//	lim, err := local.New(ratelimit.PerSecond(100), local.WithAlgorithm(ratelimit.GCRA))
//	...
//	d, err := lim.Allow(ctx, userID)
//	if err != nil { ... }          // invalid key or n; never a runtime failure
//	if !d.Allowed { retry after d.RetryAfter }
//
// Multi enforces several limits on each key at once (per second, per
// minute, per day...), each with its own Algorithm, all or nothing: a
// request one limit denies is counted by none (NewMulti, WithAlgorithms).
// Limiter and Multi also reserve quota for work whose cost is known only
// after it (Reserve, then Reservation.Settle with the actual cost: the
// difference goes back, or is charged as an overdraft). Multi decides and
// settles exactly as package global's Multi does.
//
// Memory is bounded: a Limiter keeps at most WithMaxKeys keys (default
// DefaultMaxKeys) and, beyond that, forgets keys left unused the longest
// (approximately: see Limiter). A forgotten key starts afresh on its next
// request, like a key never seen, so the bound should exceed the number of
// keys active within one Period. Memory per key is about 230 bytes for a
// short key and at most 400 whatever the key, since a key longer than 128
// bytes is kept by its SHA-256 (measured by TestLimiterHeapBounded and
// TestLongKeyMemoryBounded), plus 8 bytes per logged event for SlidingLog:
// WithMaxKeys(n) bounds a Limiter to n x 400 bytes, logs aside.
//
// Table is the key table itself: a generic LRU split into up to 64 shards,
// each a hashicorp/golang-lru simplelru.LRU under its own mutex, chosen by
// hash/maphash. A lookup of an existing key takes one shard lock and
// allocates nothing.
package local
