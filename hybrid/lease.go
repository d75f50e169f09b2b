package hybrid

import (
	"math"
	"sync/atomic"
)

// lease is the quota a key holds for one window (or, for a bucket, tokens
// taken from its bucket). The decision path takes from avail with a CAS;
// nothing else on that path writes to it but the count of what it took
// (tick, on the same cache line).
type lease struct {
	avail     atomic.Int64  // leased units not yet used
	tick      atomic.Uint64 // since the last sync tick: allowed decisions << 32 | units
	low       atomic.Int64  // when avail falls below it, the key asks the syncer for more (read beside avail)
	credit    atomic.Int64  // units admitted on credit (optimistic, slow reply, fallback), not yet reported
	borrowed  atomic.Int64  // units admitted on credit in this window, reported or not
	budgetIdx atomic.Int64  // buckets: the period of the instance's clock the credit budget is for
	free      atomic.Int64  // the window's remainder in Redis at the last reply; unknownFree if none
	idx       int64         // window index: the window starts at idx x Period since the epoch (0 for a bucket)
	start     int64         // mono ns of the window's start, by the best estimate
	until     atomic.Int64  // mono ns the lease serves before (end): its window's end, by the best estimate; for a bucket, its tokens' deadline (see bucketHoldFor), pushed on by each reply
	known     bool          // idx came from Redis (false: estimated, to hold credit)
	recorded  int64         // buckets: avail never exceeds it, so the key's record in Redis covers avail (see buckets.hold); guarded by the key's mutex
	pre       bool          // leased ahead of its window and not used yet; guarded by the key's mutex
}

// end is the mono time the lease serves before.
func (l *lease) end() int64 { return l.until.Load() }

// unknownFree is lease.free when no reply told the window's remainder.
const unknownFree = math.MinInt64

// noEnd is the end of a lease of tokens: it does not end with a window.
const noEnd = math.MaxInt64

// debt is quota a key owes Redis for window idx: leased units to give back
// and units admitted on credit to report.
type debt struct {
	idx    int64
	refund int64
	use    int64
	back   int64 // buckets: units decisions gave back (see oweBack)
}

// grow adds g units to l and sets its low-water mark: a quarter of what it
// then holds, so the syncer hears of the key while the lease still covers
// about a third of the demand it was sized for.
func (l *lease) grow(g int64) {
	a := l.avail.Add(g)
	l.low.Store(max(1, a/4))
}

// availAt returns what lease l holds for decisions at now: 0 for no lease
// or one whose window ended.
func availAt(l *lease, now int64) int64 {
	if l == nil || now >= l.end() {
		return 0
	}
	return max(0, l.avail.Load())
}

// closedBudget marks a lease's credit budget as closed: no borrow's CAS can
// succeed on it any more (b+n > share for every share).
const closedBudget = math.MaxInt64 / 4

// closeBorrowing closes l's credit budget and returns what was borrowed on
// it. A borrower that loaded l before it was replaced fails its CAS and
// retries on the new lease, so a window's budget is never handed out twice.
func (l *lease) closeBorrowing() int64 {
	b := l.borrowed.Swap(closedBudget)
	if b >= closedBudget {
		return 0 // closed before
	}
	return b
}

// lowOn reports whether lease l is about to run dry for a key that asks
// for perTwoTicks units in two ticks: below its low-water mark (a quarter
// of what it held when last topped up), or below two ticks of demand, but
// then only once half of it went. A lease that was not used never tops up
// again: the demand of a limit of a Multi counts decisions another limit
// denied (each took its units and gave them back), and a lease of a long
// window topped up at every tick on that demand would take the window's
// whole remainder from the other instances.
func lowOn(l *lease, perTwoTicks float64) bool {
	low := l.low.Load()
	return l.avail.Load() < max(low, min(int64(perTwoTicks)+1, 2*low))
}
