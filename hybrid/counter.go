package hybrid

import (
	"math"
	gosync "sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit/internal/script"
)

// lease is the quota a counter holds for one window. The request path takes
// from avail with a CAS; nothing else on the request path writes to it but
// the count of what it took (tick, on the same cache line).
type lease struct {
	avail     atomic.Int64  // leased units not yet used
	tick      atomic.Uint64 // since the last sync tick: allowed decisions << 32 | units
	low       atomic.Int64  // when avail falls below it, the key asks the syncer for more (read beside avail)
	credit    atomic.Int64  // units admitted on credit (optimistic, slow reply, fallback), not yet reported
	borrowed  atomic.Int64  // units admitted on credit in this window, reported or not
	budgetIdx atomic.Int64  // buckets: the period of the instance's clock the credit budget is for
	free      atomic.Int64  // the window's remainder in Redis at the last reply; unknownFree if none
	idx       int64         // window index: the window starts at idx x Period since the epoch
	start     int64         // mono ns of the window's start, by the best estimate
	end       int64         // mono ns of the window's end, by the best estimate: the lease serves before it
	known     bool          // idx came from Redis (false: estimated, to hold credit)
	pre       bool          // leased ahead of its window and not used yet; guarded by counter.mu
}

// unknownFree is lease.free when no reply told the window's remainder.
const unknownFree = math.MinInt64

// debt is quota a counter owes Redis for window idx: leased units to give
// back and units admitted on credit to report.
type debt struct {
	idx    int64
	refund int64
	use    int64
}

// call is one lease call: on the window counters (win), or, for a bucket
// limiter (TokenBucket, GCRA), on the bucket (bkt).
type call struct {
	win    script.LeaseArgs
	bkt    script.BucketArgs
	bucket bool
}

func (k *call) seq() int64 {
	if k.bucket {
		return k.bkt.Seq
	}
	return k.win.Seq
}

func (k *call) resent() bool {
	if k.bucket {
		return k.bkt.Resent
	}
	return k.win.Resent
}

func (k *call) setResent() {
	if k.bucket {
		k.bkt.Resent = true
	} else {
		k.win.Resent = true
	}
}

func (k *call) script() *redis.Script {
	if k.bucket {
		return script.Bucket
	}
	return script.Lease
}

func (k *call) keys() []string {
	if k.bucket {
		return k.bkt.Keys()
	}
	return k.win.Keys()
}

func (k *call) argv() []any {
	if k.bucket {
		return k.bkt.Args()
	}
	return k.win.Args()
}

// sent is a key's outstanding lease call: on its way, or sent and its reply
// not seen (in doubt), to be sent again.
type sent struct {
	call call
	// notApplied: the call certainly did not run (NOSCRIPT, no
	// connection): it is sent again as new.
	notApplied bool
}

// counter is the local state of one key.
type counter struct {
	key string // the key as kept in memory (see Limiter.lookup)

	cur          atomic.Pointer[lease] // the lease decisions take from
	blockedUntil atomic.Int64          // mono ns: Redis has less than blockedMin for the key until then
	blockedMin   atomic.Int64          // what a lease call failed to get: decisions that need as much from Redis are denied
	blockedRetry atomic.Int64          // mono ns: when Redis said blockedMin would fit (at or after blockedUntil)
	dirty        atomic.Bool           // marked for the syncer
	dead         atomic.Bool           // evicted or dropped from the table
	touched      atomic.Bool           // the LRU table heard of a use since the last tick
	lastUse      atomic.Int64          // mono ns of the last decision, to a 32nd of the period
	missed       atomic.Uint64         // denied since the last tick: decisions << 32 | units

	allowed atomic.Uint64 // allowed decisions of past ticks (the syncer folds tick into it)
	denied  atomic.Uint64 // denied decisions of past ticks (the syncer folds missed into it)
	waited  atomic.Uint64 // decisions that waited on Redis

	mu    gosync.Mutex // guards what follows, and lease replacement
	next  *lease       // quota of the next window, leased ahead of it
	debts []debt
	old   []*lease // replaced since the last tick: their counts are folded at the next one
	// A key has at most one lease call outstanding: a new one is made only
	// once the last one's reply was seen. Redis keeps a replay record of
	// the last call on a counter, so a call resent after a lost reply finds
	// its own record unless another instance's call came between.
	call    *sent
	flight  *flight // the outstanding call, while it is on its way
	nextIdx int64   // the lowest window an estimated lease may take
	// What the last window seen of this key is known to have: its index,
	// what was borrowed in it on credit, its remainder in Redis.
	spentIdx int64
	spent    int64
	freeIdx  int64
	freeVal  int64

	// Demand, in units asked (allowed or denied), guarded by mu: smoothed,
	// in units per period, over the visits of the syncer (the last at
	// planned), and counted per window (the window askedIdx, and the one
	// before it).
	rate      float64
	planned   int64
	askedIdx  int64
	asked     int64
	prevAsked int64

	expired int64 // leased units whose window ended before they were used; guarded by mu

	lead  int64 // ns before its window's end that the key leases the next window
	visit int64 // the sync tick a visit is scheduled for (0: none); guarded by mu
}

// flight is a key's lease call on its way; decisions of the key wait for it.
type flight struct {
	done chan struct{}
	err  error
}

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

// newLease makes the lease of window idx. A window's credit budget and its
// last-known remainder survive the lease object: a lease made again for the
// same window carries them. Caller holds c.mu.
func (c *counter) newLease(idx, start, end int64, known bool) *lease {
	l := &lease{idx: idx, start: start, end: end, known: known}
	l.free.Store(unknownFree)
	if idx == c.spentIdx {
		l.borrowed.Store(c.spent)
	}
	if idx == c.freeIdx {
		l.free.Store(c.freeVal)
	}
	return l
}

// setFree records window idx's remainder in Redis on l (which may be nil).
// Caller holds c.mu.
func (c *counter) setFree(l *lease, idx, free int64) {
	if l != nil && l.idx == idx {
		l.free.Store(free)
	}
	if idx >= c.freeIdx {
		c.freeIdx, c.freeVal = idx, free
	}
}

// knownFree returns window idx's remainder as last heard from Redis.
// Caller holds c.mu.
func (c *counter) knownFree(idx int64) (int64, bool) {
	for _, l := range [...]*lease{c.cur.Load(), c.next} {
		if l != nil && l.idx == idx {
			if f := l.free.Load(); f != unknownFree {
				return f, true
			}
		}
	}
	if idx == c.freeIdx {
		return c.freeVal, true
	}
	return 0, false
}

// retireLease turns what lease l holds into debts (refund moot is false) or
// drops its unused units (moot: its window bounds nothing any more), and
// remembers what its window borrowed. Caller holds c.mu and has already
// unpublished l.
func (c *counter) retireLease(l *lease, moot bool) {
	c.old = append(c.old, l)
	b := l.closeBorrowing()
	refund, use := l.avail.Swap(0), l.credit.Swap(0)
	if moot {
		c.expired += refund
		refund = 0
	}
	c.owe(l.idx, refund, use)
	if l.idx >= c.spentIdx {
		c.spentIdx, c.spent = l.idx, b
	}
}

// grow adds g units to l and sets its low-water mark: a quarter of what it
// then holds, so the syncer hears of the key while the lease still covers
// about a third of the demand it was sized for.
func (l *lease) grow(g int64) {
	a := l.avail.Add(g)
	l.low.Store(max(1, a/4))
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
// last tick: allowed decisions << 32 | units. A pre-leased lease that was
// taken from is no longer untouched. Caller holds c.mu.
func (c *counter) takeTick() uint64 {
	var t uint64
	for _, l := range c.old {
		t += l.tick.Swap(0)
	}
	c.old = c.old[:0]
	if l := c.cur.Load(); l != nil {
		lt := l.tick.Swap(0)
		if lt != 0 {
			l.pre = false
		}
		t += lt
	}
	return t
}

// peekTick is takeTick without the reset. Caller holds c.mu.
func (c *counter) peekTick() uint64 {
	var t uint64
	for _, l := range c.old {
		t += l.tick.Load()
	}
	if l := c.cur.Load(); l != nil {
		t += l.tick.Load()
	}
	return t
}

// block records, at mono, that Redis could not grant least units until
// mono ns retry: decisions that would need as much from it are denied
// (and told retry) without asking again until then, or for maxBlock at
// most; smaller ones may still ask. Redis is asked again before retry
// because the window's remainder may be held in other instances' leases,
// which come back (a key gone quiet elsewhere, an instance closed) long
// before a long window ends.
func (c *counter) block(least, mono, retry int64) {
	c.blockedMin.Store(max(0, least))
	c.blockedRetry.Store(retry)
	c.blockedUntil.Store(min(retry, mono+maxBlock))
}

// maxBlock bounds how long a key waits, in ns, before asking Redis again
// for quota Redis refused it.
const maxBlock = int64(1e9)
