package hybrid

import (
	"context"
	"runtime"
	gosync "sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// queued is what decisions send to Redis and wait for: a key's lease call
// (leaseCall), or a cold key's exact call (exactCall).
type queued interface {
	request() request
	base() string // the Redis key base, which names the node
}

// queue gathers what decisions must send to one Redis node now and hands it
// to send in batches (auto-pipelining). An idle queue sends at once: no
// timer adds latency to a lone call. While a batch is on its way, what is
// queued meanwhile goes out together: in the next batch when the one on its
// way comes back and the callers it answered have had a turn to queue their
// next calls (awaitReturn); or, with Redis far away (its round trip farRTT
// or more), once the last batch has been out for gap (a fraction of the
// round trip), in a batch of its own beside it, up to maxInFlight at once.
// Near Redis one batch is out at a time, and each carries all that came
// meanwhile: fewer round trips, less Redis CPU, and a closed loop that
// warms sooner; but while the round trips run near their floor (nothing
// queues before Redis), a caller's own call may go beside it (see
// overlaps), so that two callers do not wait on each other's round trips
// in turn. Far away, a decision waits about one round trip and a gap,
// not the rest of the batch on its way and then its own.
type queue struct {
	mu          gosync.Mutex
	items       []queued
	running     int   // goroutines sending batches (a caller sending its own among them: see own)
	sentAt      int64 // mono ns: when the last batch went out
	lastLen     int   // how many calls it carried
	armed       bool  // a timer will start a sender
	timer       *time.Timer
	maxInFlight int
	gap         func() time.Duration // how long a batch is out before another may go beside it; 0: none may
	mono        func() int64
	send        func(batch []queued) // must not keep batch once it returns: its slice is queued into again
	wg          *gosync.WaitGroup    // the goroutines sending, for Close to wait on
	yield       func()               // runtime.Gosched when nil (a test's stand-in)
	now         func() time.Time     // time.Now when nil (a test's stand-in): times the yields

	// sendOwn sends a caller's own batch (see own and Limiter.sendOwn);
	// nil: own queues as add does.
	sendOwn func(batch []queued, w waitFor, after func()) error

	// After a slow yield (see awaitReturn): batches left to take without
	// yielding first, and how many the next slow yield skips.
	skip, skipNext atomic.Int64

	rtt rttTrack // the round trips of its batches and own sends, with mu held (see overlaps)
}

// rttTrack follows a queue's round trips (a batch sent to its exchange
// finished and answered): their mean, smoothed, and their floor, the
// least of the last one or two epochs of rttEpoch (a floor that ages, so
// that a Redis that moved or slowed for good sets a new one).
type rttTrack struct {
	avg      int64    // ns, smoothed over about rttSmooth round trips
	floor    [2]int64 // ns: the least of this epoch, of the one before (0: none)
	epochEnd int64    // mono ns: when this epoch ends
	n        int      // round trips seen, up to rttSamples
}

const (
	rttEpoch   = int64(time.Second)
	rttSmooth  = 8
	rttSamples = 16 // round trips seen before the mean is trusted
	rttNear    = 4
)

// add counts a round trip of d ns that ended at now (mono ns).
func (r *rttTrack) add(d, now int64) {
	if d <= 0 {
		d = 1
	}
	if now >= r.epochEnd {
		r.floor[1], r.floor[0] = r.floor[0], 0
		r.epochEnd = now + rttEpoch
	}
	if r.floor[0] == 0 || d < r.floor[0] {
		r.floor[0] = d
	}
	if r.avg == 0 {
		r.avg = d
	} else {
		r.avg += (d - r.avg) / rttSmooth
	}
	r.n = min(r.n+1, rttSamples)
}

// atFloor reports whether the round trips run near their floor: their
// mean within rttNear times it. Then little queues before Redis, and the
// callers' own time between batches is what holds them back; a mean far
// above the floor is time spent waiting on a busy Redis or host, which
// one batch out at a time, carrying all that came meanwhile, spends
// least of. (On the 2-core VM, an instance whose callers alone use Redis
// sees a mean of 2.4-3.6 times its floor, scheduling and wake-ups
// included; eight instances sharing the host's processors with Redis
// 2.8-7 times theirs, and the more so the more batches are out.)
func (r *rttTrack) atFloor() bool {
	f := r.floor[0]
	if g := r.floor[1]; g > 0 && (f == 0 || g < f) {
		f = g
	}
	return r.n >= rttSamples && f > 0 && r.avg <= rttNear*f
}

// The queue's gap: with Redis farRTT or more away, the round trip over
// gapDiv, at least minGap.
const (
	farRTT = 2 * time.Millisecond
	minGap = time.Millisecond
	gapDiv = 12
)

// gapFor is the queue's gap for a round trip of rtt: 0 (one batch out at
// a time) for a Redis nearer than farRTT.
func gapFor(rtt time.Duration) time.Duration {
	if rtt < farRTT {
		return 0
	}
	return max(minGap, rtt/gapDiv)
}

// add queues t, and starts a goroutine to send it when none is sending, or
// when another batch may go beside those on their way (see beside).
func (q *queue) add(t queued) {
	q.mu.Lock()
	q.items = append(q.items, t)
	q.unlockStarting(q.running == 0 || q.beside())
}

// own sends t, a decision's call, at once on the caller's goroutine
// (through sendOwn) when the caller is alone (w.alone: no other decision
// waits on Redis), the queue is idle (nothing queued, no batch out) and
// its last batch carried one call: a lone caller's call does not wait
// for a sender goroutine to be scheduled, nor the caller to be woken by
// it again, two hand-offs that cost a lone cold decision about a sixth of
// its time on the 2-core VM (the sim with one caller: 0.86-0.87 times
// per-request Redis's decisions/s, against 0.67-0.76). It sends t on the
// caller's goroutine too beside one batch on its way, while nothing is
// queued, when overlaps allows it. Otherwise it queues t as add does:
// the calls of an instance whose batches carry several go together,
// gathered as awaitReturn gathers them. Either way it returns
// when w's done closes or the caller's wait ends first, with w's answer
// (see wait); the exchange goes on without a caller that left.
func (q *queue) own(t queued, w waitFor) error {
	q.mu.Lock()
	lone := w.alone && q.running == 0 && q.lastLen <= 1
	if q.sendOwn == nil || len(q.items) > 0 || !(lone || q.overlaps()) {
		q.items = append(q.items, t)
		q.unlockStarting(q.running == 0 || q.beside())
		return w.wait()
	}
	q.running++
	q.wg.Add(1)
	at := q.mono()
	q.sentAt, q.lastLen = at, 1
	q.mu.Unlock()
	return q.sendOwn([]queued{t}, w, func() { q.ownSent(at) })
}

// overlaps reports, with q locked and nothing queued, whether a caller
// may send its own call beside the one batch on its way to a Redis near
// by: only while the round trips run near their floor (rttTrack.atFloor),
// where the callers' time between batches, not Redis's, holds them back
// (a few callers of an instance, each of whose calls then waits on its
// own round trip, as with per-request Redis, not on the rest of the one
// on its way first). On a busy Redis or host, one batch at a
// time carries what came meanwhile, and costs both less.
func (q *queue) overlaps() bool {
	return q.running == 1 && q.gap() <= 0 && q.rtt.atFloor()
}

// ownSent ends a send of own that went at mono ns at: a sender takes
// what was queued meanwhile.
func (q *queue) ownSent(at int64) {
	q.mu.Lock()
	now := q.mono()
	q.rtt.add(now-at, now)
	if len(q.items) > 0 {
		q.mu.Unlock()
		go q.drain() // (in the send's place: running and wg count it still)
		return
	}
	q.running--
	q.mu.Unlock()
	q.wg.Done()
}

// beside reports, with q locked and a batch on its way, whether another
// may go beside it now: Redis is far, fewer than maxInFlight are out, and
// the last has been out for the gap. When it may only later, a timer
// starts one then (kick), unless a batch that comes back first takes
// what is queued.
func (q *queue) beside() bool {
	g := q.gap()
	if g <= 0 || q.running >= q.maxInFlight || q.armed {
		return false
	}
	wait := time.Duration(q.sentAt + int64(g) - q.mono())
	if wait <= 0 {
		return true
	}
	q.armed = true
	if q.timer == nil {
		q.timer = time.AfterFunc(wait, q.kick)
	} else {
		q.timer.Reset(wait)
	}
	return false
}

// kick starts a sender for what is still queued once the gap has passed.
func (q *queue) kick() {
	q.mu.Lock()
	q.armed = false
	q.unlockStarting(len(q.items) > 0 && q.running < q.maxInFlight)
}

// unlockStarting unlocks q, having counted a new sender when start, and
// starts it.
func (q *queue) unlockStarting(start bool) {
	if start {
		q.running++
		q.wg.Add(1)
	}
	q.mu.Unlock()
	if start {
		go q.drain()
	}
}

// drain sends queued batches until none is left. The calls queued while
// one batch is out go into the slice of the batch before it, emptied:
// a closed loop's queue grows no slice per round trip.
func (q *queue) drain() {
	defer q.wg.Done()
	var spare []queued
	var at, back int64 // when the batch before went, and came back (0: none)
	for {
		q.mu.Lock()
		if at != 0 {
			q.rtt.add(back-at, back)
		}
		batch := q.items
		if len(batch) == 0 {
			q.running--
			q.mu.Unlock()
			return
		}
		q.items = spare
		at = q.mono()
		q.sentAt, q.lastLen = at, len(batch)
		q.mu.Unlock()
		q.send(batch)
		back = q.mono()
		clear(batch) // (the calls it answered are not kept alive by it)
		spare = batch[:0]
		q.awaitReturn()
	}
}

// awaitReturn lets the goroutines that send just answered run before the
// next batch is taken: it yields the processor returnYields times. A
// caller answered from Redis often decides again at once (a handler that
// checks several keys, the next request on a connection, a client in a
// closed loop); taken before it comes, the next batch goes without its
// call, which then waits a whole round trip for a batch of its own, and
// the callers of one instance split into groups that never share a round
// trip again. It is not a timer: a processor with nothing else to run
// comes back at once.
//
// On a busy host (more runnable goroutines than processors, all of them
// busy) a yield is slow: it puts the sender behind every runnable
// goroutine, a turn that takes tens to hundreds of milliseconds, while
// what was queued meanwhile waits, and with it callers that hold other
// keys' quota they cannot use before their window ends. So a yield that
// took slowYield or more ends the yielding, and the next batches go
// without yields: skipYields of them, twice as many after each slow yield
// in a row (up to maxSkipYields), as many again after a quick one.
func (q *queue) awaitReturn() {
	if q.skip.Load() > 0 {
		q.skip.Add(-1)
		return
	}
	yield, now := q.yield, q.now
	if yield == nil {
		yield = runtime.Gosched
	}
	if now == nil {
		now = time.Now
	}
	for range returnYields {
		t := now()
		yield()
		if now().Sub(t) >= slowYield {
			n := max(skipYields, q.skipNext.Load())
			q.skip.Store(n)
			q.skipNext.Store(min(2*n, maxSkipYields))
			return
		}
	}
	q.skipNext.Store(skipYields)
}

// returnYields: on the sim's cold row (8 instances x 4 callers), one
// yield took the round trips per 1,000 decisions from about 500 to 230,
// and four to about 200 (of 1,000 - in memory / 4 at best); waiting
// instead until as many calls as were answered are queued again did worse
// (240: other callers' calls come too).
const returnYields = 4

// A yield of slowYield or more means a busy host: the next skipYields
// batches go without yields, up to maxSkipYields after slow yields in a
// row (see awaitReturn). On an idle host the four yields take
// microseconds each; on one whose processors all run, a turn of every
// runnable goroutine at up to 10ms each. At 2ms the sim's cold row (which
// keeps both processors of a 2-core host busy) went from about 220 round
// trips per 1,000 decisions to 270: its yields, slower than an idle
// host's, still gather the callers. At 20ms it stays at 220, and
// TestBusyHostDefaults under the race detector beside two busy loops used
// at least 1,909 of every full window's 2,000 in 13 runs, against 1,727
// to 1,970 (9 of 20 runs under 1,900) with yields always.
const (
	slowYield     = 20 * time.Millisecond
	skipYields    = 64
	maxSkipYields = 4096
)

// idle reports whether nothing is queued or being sent.
func (q *queue) idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.running == 0 && len(q.items) == 0
}

// router queues decisions' calls by Redis node: one queue for a server
// (standalone or Sentinel), one per master of a Cluster, so that calls
// for different nodes never wait on each other's round trips.
type router struct {
	cluster *redis.ClusterClient // nil: one node
	one     *queue
	make    func() *queue

	mu    gosync.Mutex
	nodes map[string]*queue // Cluster master address -> its queue
}

func newRouter(client rediser, make func() *queue) *router {
	r := &router{one: make(), make: make}
	r.cluster, _ = client.(*redis.ClusterClient)
	return r
}

// add queues t for the node that owns its key.
func (r *router) add(t queued) {
	r.queueOf(t.base()).add(t)
}

// own sends or queues t, a decision's call, for the node that owns its
// key, and waits on w (see queue.own).
func (r *router) own(t queued, w waitFor) error {
	return r.queueOf(t.base()).own(t, w)
}

func (r *router) queueOf(base string) *queue {
	if r.cluster == nil {
		return r.one
	}
	node, err := r.cluster.MasterForKey(context.Background(), base)
	if err != nil {
		return r.one // the client routes it, with its own errors
	}
	addr := node.Options().Addr
	r.mu.Lock()
	defer r.mu.Unlock()
	q := r.nodes[addr]
	if q == nil {
		if r.nodes == nil {
			r.nodes = make(map[string]*queue)
		}
		q = r.make()
		r.nodes[addr] = q
	}
	return q
}

// idle reports whether no queue holds or sends anything.
func (r *router) idle() bool {
	if !r.one.idle() {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, q := range r.nodes {
		if !q.idle() {
			return false
		}
	}
	return true
}
