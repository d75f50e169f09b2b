package hybrid

import (
	"math"
	gosync "sync"
	"sync/atomic"

	"github.com/hybridlimit/ratelimit/global"
)

// lease is the quota a counter holds for one window. The request path takes
// from avail with a CAS; nothing else on the request path writes to it.
type lease struct {
	avail    atomic.Int64  // leased units not yet used
	tick     atomic.Uint64 // since the last sync tick: allowed decisions << 32 | units (beside avail: one cache line for a decision)
	credit   atomic.Int64  // units admitted on credit (optimistic or fallback), not yet reported
	borrowed atomic.Int64  // units admitted on credit in this window, reported or not
	free     atomic.Int64  // the window's remainder in Redis at the last reply
	idx      int64         // window index: the window starts at idx x Period since the epoch
	deadline int64         // monotonic ns (since Limiter.start) after which the lease is not used: never after the window ends in Redis
	end      int64         // monotonic ns of the window\'s end by the best estimate of Redis time (for ResetAfter)
	known    bool          // idx came from Redis (false: estimated from the local clock)
}

// debt is quota a counter owes Redis for window idx: leased units to give
// back and units admitted on credit to report.
type debt struct {
	idx    int64
	refund int64
	use    int64
}

// counter is the local state of one key.
type counter struct {
	key  string
	base string // Redis key base of the key

	lease        atomic.Pointer[lease]
	blockedUntil atomic.Int64 // monotonic ns: the window is exhausted in Redis until then
	dirty        atomic.Bool  // marked for the syncer
	dead         atomic.Bool  // evicted or dropped from the table
	touched      atomic.Bool  // the LRU table heard of a use since the last tick
	lastUse      atomic.Int64 // monotonic ns of the last admitted request, to the millisecond

	allowed atomic.Uint64 // allowed decisions of past ticks (the syncer folds tick into it)
	denied  atomic.Uint64
	waited  atomic.Uint64 // decisions that waited on Redis

	mu      gosync.Mutex // guards debts and lease replacement
	debts   []debt
	old     []*lease           // dropped since the last tick: their counts are folded at the next one
	pending []global.LeaseArgs // sent by the syncer, reply not seen: resent as they are

	flight   *flight // the synchronous lease call in progress, guarded by mu
	nextIdx  int64   // the lowest window an estimated lease may take, guarded by mu
	spentIdx int64   // the window of the last dropped lease, guarded by mu
	spent    int64   // what that window borrowed on credit, guarded by mu

	rate atomicFloat // smoothed units admitted per sync tick, written by the syncer
}

// flight is one synchronous lease call shared by every caller of a key.
type flight struct {
	done chan struct{}
	err  error
}

type atomicFloat struct{ bits atomic.Uint64 }

func (f *atomicFloat) load() float64   { return math.Float64frombits(f.bits.Load()) }
func (f *atomicFloat) store(v float64) { f.bits.Store(math.Float64bits(v)) }

// owe records quota owed for window idx. Caller holds c.mu.
func (c *counter) owe(idx, refund, use int64) {
	if refund == 0 && use == 0 {
		return
	}
	for i := range c.debts {
		if c.debts[i].idx == idx {
			c.debts[i].refund += refund
			c.debts[i].use += use
			return
		}
	}
	c.debts = append(c.debts, debt{idx: idx, refund: refund, use: use})
}

// newLease makes the lease of window idx. A window's credit budget survives
// its lease object: a lease made again for the same window carries what was
// borrowed in it. Caller holds c.mu.
func (c *counter) newLease(idx, deadline int64, known bool) *lease {
	nl := &lease{idx: idx, deadline: deadline, known: known}
	if idx == c.spentIdx {
		nl.borrowed.Store(c.spent)
	}
	return nl
}

// drop turns what lease l holds into debts and remembers what its window
// borrowed. Caller holds c.mu and has already unpublished l.
func (c *counter) drop(l *lease) {
	c.old = append(c.old, l)
	b := l.closeBorrowing()
	c.owe(l.idx, l.avail.Swap(0), l.credit.Swap(0))
	if l.idx >= c.spentIdx {
		c.spentIdx, c.spent = l.idx, b
	}
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

// reportLate turns credit added to replaced leases after they were
// replaced (a borrower between its CAS and its add) into debts. Caller
// holds c.mu.
func (c *counter) reportLate() {
	for _, l := range c.old {
		if cr := l.credit.Swap(0); cr > 0 {
			c.owe(l.idx, 0, cr)
		}
	}
}

// takeTick returns and resets what the counter's leases admitted since the
// last tick: allowed decisions << 32 | units. Caller holds c.mu.
func (c *counter) takeTick() uint64 {
	var t uint64
	for _, l := range c.old {
		t += l.tick.Swap(0)
	}
	c.old = c.old[:0]
	if l := c.lease.Load(); l != nil {
		t += l.tick.Swap(0)
	}
	return t
}

// peekTick is takeTick without the reset. Caller holds c.mu.
func (c *counter) peekTick() uint64 {
	var t uint64
	for _, l := range c.old {
		t += l.tick.Load()
	}
	if l := c.lease.Load(); l != nil {
		t += l.tick.Load()
	}
	return t
}

// retire takes the counter's lease away and turns what it holds into debts.
// It returns true when there is something to report.
func (c *counter) retire() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.lease.Swap(nil); l != nil {
		c.drop(l)
	}
	return len(c.debts) > 0 || len(c.pending) > 0
}
