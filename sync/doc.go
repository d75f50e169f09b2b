// Package sync is the background syncer of the hybrid limiter: a dirty set
// that the request path marks items in, and one owner goroutine that, every
// interval, takes the set and hands it in batches to a flush function.
//
// The syncer knows nothing of Redis nor of the limiters: the hybrid package
// supplies a FlushFunc (which reconciles a batch of counters with Redis in one
// pipeline) and marks a counter whenever it has something to report. The
// syncer owns the rest:
//
//   - Mark is non-blocking and never waits on a flush in progress. It takes a
//     mutex for one map insert; the owner swaps the whole set for an empty
//     one at each tick (double buffering), so marks made during a flush land
//     in the next tick. An item marked several times before a tick is flushed
//     once.
//   - At most one FlushFunc call runs at any time: ticks, Flush and the final
//     flush of Close are serialized, so two flushes of the same item never
//     overlap.
//   - No item is ever dropped: when a batch fails (FlushFunc returns an
//     error) all of its items, and those of the batches of the same pass not
//     yet attempted, stay marked; items a FlushFunc returns in again are
//     marked again. After a failed tick the next tick waits an exponential
//     backoff with full jitter instead of the interval, until a tick
//     succeeds.
//   - Close stops the owner goroutine and flushes what is left, retrying
//     until its context is done. No goroutine outlives Close.
//
// Inside the module this package is imported under another name when the
// standard library's sync is needed too, e.g.
//
//	import bgsync "github.com/hybridlimit/ratelimit/sync"
package sync
