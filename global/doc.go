// Package global provides exact rate limiters whose state lives in Redis:
// every decision is one atomic Lua script call, or for FixedWindow an
// increment of its window's counter, so any number of processes sharing a
// Redis deployment enforce one limit per key.
//
// # FixedWindow without a script
//
// A FixedWindow decision is usually no script at all: once the Limiter
// knows Redis' clock (from the times its script replies carry), a
// decision far enough from a window's edges to be sure of its window is a
// pipelined HINCRBY of the window's counter and a PEXPIRE NX, and
// concurrent decisions of one Limiter share round trips (one pipeline on
// its way at a time). The count after the increment decides; a decision
// over the limit is denied and its units are given back before it
// returns, and the key's later decisions in that window go to the script,
// which denies without counting. Near a window's edge, before the first
// sample of Redis' clock, and on a counter another script wrote as a
// string, the script decides. This costs Redis about two thirds of what
// envoyproxy/ratelimit's pipelined INCRBY and EXPIRE cost per decision
// (bench/redis_cpu_bench_test.go). Between an increment over the limit
// and its give-back, a concurrent decision of more than one unit may be
// denied for units that are about to come back; nothing is ever admitted
// over the limit.
//
// # Algorithms and exactness
//
// A Limiter runs one of the five algorithms of ratelimit.Algorithm
// (FixedWindow unless WithAlgorithm says otherwise) exactly as
// docs/algorithms.md specifies them, in integer microseconds. Redis Lua
// numbers are IEEE doubles; every quantity the scripts compute is an integer
// no larger than 2^53 for a Limit that passes ratelimit.Limit.Validate, and
// every division is corrected for rounding, so a decision here is identical,
// field by field, to the one the in-memory package local takes for the same
// requests at the same instants. Instants that can pass 2^53 microseconds
// for very long periods (an instant plus a Period of decades, GCRA's
// theoretical arrival time) are computed as differences from now, and GCRA's
// is stored as exact decimal digits, never as a double.
//
// # Several limits, and reservations
//
// Multi (NewMulti) enforces several limits on each key, each with its own
// Algorithm (WithAlgorithms), in one script call that consumes from every
// limit or, when any denies, from none and writes nothing. Limiter and Multi
// reserve quota for work whose cost is known only after it (Reserve, then
// Reservation.Settle): the settlement is one script call that applies it at
// most once, kept so by a small record per settled reservation that lives
// SettleRecordTTL, so a Settle retried after a lost reply is a no-op.
//
// # Keys and expiry
//
// All state of one user key lives under "<prefix>:{<tag>}:" (see KeyBase and
// HashTag): the default prefix is DefaultPrefix, and a user key that is
// longer than MaxVerbatimKey bytes, holds '{' or '}', or starts with '#' is
// replaced by a hash of it, so user keys never reach Redis verbatim. The
// suffixes are "fw:<window>", "sw:<window>", "sl" and "sl:seq", "tb", and
// "gcra", each with the limit in it (see docs/algorithms.md), so a Multi's
// limit and a Limiter of the same limit and algorithm count in one state; a
// settled reservation's record is "rsv:<id>". Every key a script writes gets its PEXPIRE in the same script (a plain increment: in the same write; the
// time the state matters, rounded up to milliseconds, plus one second of
// grace), so no key outlives its use whatever the crash point, and a denied
// request leaves every key as it was (FixedWindow's plain path gives its
// increment back before it returns).
//
// # When Redis is away
//
// Without WithFailureMode, AllowN returns Redis' error. With it, a decision
// whose call fails or outlasts WithTimeout is taken without Redis, and a
// circuit breaker keeps later ones off Redis until a probe answers:
// FailOpen allows, FailClosed denies, FailLocal asks the WithFallback
// limiter. FailLocal also keeps the outage bound of docs/failure-modes.md:
// a window the outage touches admits at most its last-known remainder
// shared by the instances (WithInstances), for a Multi each limit's, and
// what was admitted locally is charged to Redis when it is back (for the
// buckets, as an overdraft).
//
// # Redis Cluster
//
// The braces around the tag are a Cluster hash tag: every key of one user key
// hashes to one slot, each script touches one slot, and go-redis routes the
// call by KEYS[1]. Any redis.UniversalClient works: standalone, Sentinel
// (failover) and Cluster clients alike.
//
// # Time
//
// The scripts read the Redis server's clock (TIME), never the caller's, so
// instances with skewed clocks count in the same windows. WithClock replaces
// it with a caller's clock, for tests.
//
// Scripts are run with EVALSHA, falling back to EVAL when the server does not
// have them cached (NOSCRIPT), so a SCRIPT FLUSH or a failover is harmless.
package global
