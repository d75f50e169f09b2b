package hybrid

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	mrand "math/rand/v2"
	"net"
	"strings"
	gosync "sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/breaker"
	"github.com/hybridlimit/ratelimit/internal/check"
	"github.com/hybridlimit/ratelimit/internal/script"
	"github.com/hybridlimit/ratelimit/local"
	bgsync "github.com/hybridlimit/ratelimit/sync"
)

// Limiter is a rate limiter shared by a fleet of instances: it answers
// almost every decision from memory, out of quota leased from Redis, and a
// background syncer reconciles with Redis every sync interval.
//
// A Limiter is safe for concurrent use. Make one per process and Limit with
// New (the zero value is not usable), share it between goroutines, and Close
// it to give its unused quota back and stop its goroutines.
type Limiter struct {
	client    redis.UniversalClient
	limit     ratelimit.Limit
	rate      int64
	capacity  int64 // the most one decision can ask: Rate (windows), Burst (buckets)
	bucket    bool  // TokenBucket or GCRA: leases tokens, not a window's quota
	cfg       config
	kind      string // Redis counter kind
	periodNS  int64
	periodUS  int64
	useGrain  int64     // resolution of counter.lastUse, ns
	start     time.Time // monotonic base of every instant
	id        string
	clk       *serverClock
	probeBase string // the Redis key base the breaker's probes name

	table  *local.Table[*counter]
	index  gosync.Map // key -> *counter: the lock-free read path in front of table
	syncer *bgsync.Syncer[*counter]
	brk    *breaker.Breaker

	sq struct { // decisions' lease calls waiting to be sent (enqueue)
		gosync.Mutex
		ops     []op
		running int
	}

	wheelMu gosync.Mutex         // guards wheel and wheelAt
	wheel   map[int64][]*counter // sync tick -> counters to visit then
	wheelAt int64                // the last tick whose visits are done

	lastErr       atomic.Pointer[errAt] // the last Redis error, and when
	learned       atomic.Bool           // a heartbeat told the fleet size at least once
	lastTick      int64                 // mono of the last tick; owned by the syncer goroutine
	tickGap       atomic.Int64          // smoothed time between ticks, ns
	lastGap       atomic.Int64          // time from the tick before to this one, ns
	liveInstances atomic.Int64
	nextBeat      int64        // mono; owned by the syncer goroutine
	seq           atomic.Int64 // sequence of lease calls, for replay protection
	draining      atomic.Int32 // Flush or Close in progress: give back, do not lease

	closed    atomic.Bool
	closeOnce gosync.Once
	closeErr  error
	gate      gosync.RWMutex   // slow-path decisions hold it shared while they join inflight; Close takes it
	inflight  gosync.WaitGroup // slow-path decisions and the senders of their calls, so Close can wait for them
	calls     gosync.WaitGroup // goroutines of Redis calls (see bounded)

	st stats
}

type stats struct {
	roundTrips, syncRoundTrips, leases, leasedUnits, refunded, reported atomic.Uint64
	flushErrors, fallback, noReply, leasedAhead                         atomic.Uint64
	retiredAllowed, retiredDenied, retiredWaited, retiredExpired        atomic.Uint64
}

var _ ratelimit.Limiter = (*Limiter)(nil)

// New returns a hybrid Limiter enforcing limit per key across every instance
// that shares client's Redis (standalone, Sentinel or Cluster) and prefix.
// It starts the background syncer; Close stops it.
//
// New talks to Redis once, to learn the fleet's size by heartbeat (not with
// WithInstances), and waits at most the timeout for it, whatever the
// client's own timeouts. It does not fail on Redis errors: call Ping to
// fail fast on a wrong address, password or mode.
func New(client redis.UniversalClient, limit ratelimit.Limit, opts ...Option) (*Limiter, error) {
	if script.IsNilClient(client) {
		return nil, fmt.Errorf("%w: nil Redis client", ratelimit.ErrInvalidOption)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if cfg.algorithms != nil {
		if len(cfg.algorithms) != 1 {
			return nil, fmt.Errorf("%w: WithAlgorithms gave %d algorithms; New takes one (see NewMulti)", ratelimit.ErrInvalidOption, len(cfg.algorithms))
		}
		cfg.algorithm = cfg.algorithms[0]
	}
	if err := limit.Validate(); err != nil {
		return nil, err
	}
	if cfg.algorithm == ratelimit.GCRA && int64(limit.Period/time.Microsecond) < int64(limit.Rate) {
		return nil, fmt.Errorf("%w: GCRA needs Period in microseconds >= Rate, got %v", ratelimit.ErrInvalidLimit, limit)
	}
	return newLimiter(client, limit, cfg, true)
}

// newLimiter is New with the options applied and checked. With join
// false, it does not learn the fleet's size before it returns (a Multi's
// limits after the first learn it from the first).
func newLimiter(client redis.UniversalClient, limit ratelimit.Limit, cfg config, join bool) (*Limiter, error) {
	now := time.Now()
	h := &Limiter{
		client:   client,
		limit:    limit,
		rate:     int64(limit.Rate),
		capacity: int64(limit.Capacity(cfg.algorithm)),
		bucket:   isBucket(cfg.algorithm),
		cfg:      cfg,
		kind:     script.Kind(cfg.algorithm, limit),
		periodNS: int64(limit.Period),
		periodUS: int64(limit.Period / time.Microsecond),
		useGrain: max(int64(time.Millisecond), int64(limit.Period)/32),
		start:    now,
		id:       cfg.instanceID,
		clk:      newServerClock(now.UnixMicro(), limit.Period, offsetMaxAge),
	}
	h.probeBase, _ = script.KeyBase(cfg.prefix, "probe:"+cfg.instanceID)
	h.liveInstances.Store(1)
	h.tickGap.Store(int64(cfg.syncInterval))
	h.brk = breaker.New(breaker.Config{FailureThreshold: cfg.breakerFailures, OpenTimeout: cfg.breakerOpenFor})
	h.brk.OnStateChange(func(from, to breaker.State) {
		switch to {
		case breaker.Open:
			if from == breaker.Closed {
				e := Event{Kind: EventDegraded}
				if last := h.lastErr.Load(); last != nil {
					e.Err = last.err
				}
				h.emit(e)
			}
		case breaker.Closed:
			h.emit(Event{Kind: EventRecovered})
		}
	})
	h.table = local.NewTable[*counter](cfg.maxKeys, h.evicted)
	s, err := bgsync.New[*counter](h.flush,
		bgsync.WithInterval(cfg.syncInterval),
		bgsync.WithTimeout(h.callTimeout()),
		bgsync.WithBatchSize(syncBatch),
		bgsync.WithBackoff(cfg.syncInterval, max(5*time.Second, cfg.syncInterval)),
		bgsync.WithOnTick(h.tick),
	)
	if err != nil {
		return nil, err
	}
	h.syncer = s
	if join && cfg.instances == 0 { // learn the fleet size before the first decision, best effort
		ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
		h.heartbeat(ctx, true)
		cancel()
	}
	return h, nil
}

// callTimeout is the deadline of one Redis call. It is longer than the
// timeout a decision waits: a reply that comes late is still installed
// (and tells the breaker Redis answers), rather than lost and sent again.
func (h *Limiter) callTimeout() time.Duration {
	return max(minCallTimeout, 4*h.cfg.timeout)
}

// Ping reports whether Redis serves the limiter: it sends PING, then a
// lease call that asks for nothing and writes nothing, within a call's
// deadline (4 timeouts, at least 1s) or ctx's if sooner, and returns the
// first error Redis or the client
// gave, as it gave it (NOAUTH, WRONGPASS, connection refused, a Cluster
// client on a standalone server...). Call it at startup to fail fast on a
// wrong address or password: decisions never return Redis errors (the
// failure mode decides), and without it a misconfigured limiter is
// visible only in Stats().LastError and the observer's events.
func (h *Limiter) Ping(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, h.callTimeout())
	defer cancel()
	err := h.callErr(pctx, func(ctx context.Context) error { return h.client.Ping(ctx).Err() })
	if err == nil {
		a := script.LeaseArgs{Base: h.probeBase, Kind: h.kind, Limit: h.limit, Instances: 1, Min: 1}
		err = h.callErr(pctx, func(ctx context.Context) error {
			return script.Lease.Run(ctx, h.client, a.Keys(), a.Args()...).Err()
		})
	}
	if err != nil {
		err = h.noteErr(err)
		return fmt.Errorf("hybrid: Redis does not serve the limiter: %w", err)
	}
	return nil
}

// errAt is an error and when it happened.
type errAt struct {
	err error
	at  time.Time
}

// noteErr keeps err as the last Redis error, and returns it, explained
// where Redis' own words mislead.
func (h *Limiter) noteErr(err error) error {
	if err == nil {
		return nil
	}
	if strings.Contains(err.Error(), "unauthenticated") {
		// Redis answers a command of many arguments on a connection that
		// did not AUTH with a protocol error, not NOAUTH.
		err = fmt.Errorf("NOAUTH: the Redis server requires authentication (set the client's Password); it answered: %w", err)
	}
	now := time.Now()
	if vague(err) {
		// A timeout or a dropped connection says less than the error that
		// likely caused it (a refused connection retried by the client
		// past the deadline; Redis closing a connection that did not AUTH
		// after its protocol error): it does not replace one less than
		// lastErrKeep old.
		if last := h.lastErr.Load(); last != nil && !vague(last.err) && now.Sub(last.at) < lastErrKeep {
			return err
		}
	}
	h.lastErr.Store(&errAt{err: err, at: now})
	return err
}

// vague reports whether err tells only that a call got no answer: a
// deadline, or a connection closed under it.
func vague(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed)
}

// Limit returns the limit the Limiter enforces.
func (h *Limiter) Limit() ratelimit.Limit { return h.limit }

// Algorithm returns the window algorithm the Limiter counts with.
func (h *Limiter) Algorithm() ratelimit.Algorithm { return h.cfg.algorithm }

// Allow is shorthand for AllowN(ctx, key, 1).
func (h *Limiter) Allow(ctx context.Context, key string) (ratelimit.Decision, error) {
	return h.AllowN(ctx, key, 1)
}

func (h *Limiter) mono() int64 { return int64(time.Since(h.start)) }

// AllowN reports whether n events for key may happen now and consumes them
// if so. With quota leased for key it decides in memory, without waiting on
// Redis; otherwise it leases (one Redis call shared by every concurrent
// caller of key) and waits at most the configured timeout. A reply slower
// than that is not taken for an outage: in Strict mode the decision is
// denied (RetryAfter set), in Optimistic mode admitted on credit within
// what Redis last reported free. Once the circuit breaker has opened, the
// ratelimit.FailureMode decides, with a nil error.
//
// It returns an error wrapping ratelimit.ErrInvalidKey for an empty key,
// ratelimit.ErrInvalidN for n <= 0 or n > Rate, ratelimit.ErrClosed after
// Close, and ctx's error when ctx ends first.
func (h *Limiter) AllowN(ctx context.Context, key string, n int) (ratelimit.Decision, error) {
	if h.closed.Load() {
		return ratelimit.Decision{}, ratelimit.ErrClosed
	}
	if key == "" {
		return ratelimit.Decision{}, check.Key(key)
	}
	if n <= 0 || int64(n) > h.capacity {
		return ratelimit.Decision{}, check.N(h.limit, h.cfg.algorithm, n)
	}
	c := h.lookup(key)
	mono := h.mono()
	if d, _, ok := h.fast(c, int64(n), mono); ok {
		return d, nil
	}
	d, _, err := h.slow(ctx, c, key, int64(n), nil)
	return d, err
}

// lookup finds or makes the counter of key. A hit takes no lock: the index
// is read-mostly, and the LRU table, which bounds the keys and decides
// evictions, hears of a key's use at most once per sync tick.
//
// A key is kept once, in the index, the table and the counter alike: a
// copy of it (so a caller's larger buffer is not retained), or, for a key
// longer than script.MaxVerbatimKey bytes, a digest of it (see indexKey),
// so a key costs a bounded number of bytes whatever its length.
func (h *Limiter) lookup(key string) *counter {
	k := key
	if len(k) > script.MaxVerbatimKey {
		k = indexKey(key)
	}
	if v, ok := h.index.Load(k); ok {
		c := v.(*counter)
		if !c.touched.Load() {
			c.touched.Store(true)
			h.table.Get(k)
		}
		return c
	}
	if len(key) <= script.MaxVerbatimKey {
		k = strings.Clone(key)
	}
	c, created := h.table.GetOrCreate(k, func() *counter {
		return &counter{key: k, lead: h.leadOf(k)}
	})
	if created || !c.dead.Load() {
		h.index.Store(k, c)
	}
	return c
}

// indexKey is how a key longer than script.MaxVerbatimKey is kept in
// memory: 0xff, then the hex SHA-256 of the key (script.HashTag's digest,
// so Redis sees the same tag), then padding to MaxVerbatimKey+1 bytes. No
// key short enough to be kept verbatim can equal it.
func indexKey(key string) string {
	tag := script.HashTag(key) // "#" and 64 hex digits
	var b [script.MaxVerbatimKey + 1]byte
	for i := range b {
		b[i] = 0xff
	}
	copy(b[1:], tag[1:])
	return string(b[:])
}

// tagOf returns the Redis hash tag of the key kept as k (see lookup).
func tagOf(k string) string {
	if len(k) > script.MaxVerbatimKey {
		return "#" + k[1:65]
	}
	return script.HashTag(k)
}

// baseOf returns the Redis key base of c's key.
func (h *Limiter) baseOf(c *counter) string {
	return h.cfg.prefix + ":{" + tagOf(c.key) + "}:"
}

// forget drops c from the index, unless the key has a newer counter.
func (h *Limiter) forget(c *counter) { h.index.CompareAndDelete(c.key, c) }

// fast decides from the lease in hand, or denies a key known to be
// exhausted. ok is false when the lease cannot decide. An admission
// returns the lease it took n from.
func (h *Limiter) fast(c *counter, n, mono int64) (ratelimit.Decision, *lease, bool) {
	l := c.cur.Load()
	if l != nil && mono < l.end {
		for {
			a := l.avail.Load()
			if a < n {
				break
			}
			if l.avail.CompareAndSwap(a, a-n) {
				h.admitted(c, l, n, mono)
				if a-n < l.low.Load() {
					h.soon(c) // running low: the syncer tops it up
				}
				rem := min(a-n+max(0, l.free.Load()), h.capacity)
				reset := l.end - mono
				if h.bucket {
					reset = h.bucketReset(rem)
				}
				return ratelimit.Decision{Allowed: true, Limit: h.limit, Algorithm: h.cfg.algorithm,
					Remaining: int(rem), ResetAfter: time.Duration(reset)}, l, true
			}
		}
	}
	if until := c.blockedUntil.Load(); mono < until && n-availAt(l, mono) >= c.blockedMin.Load() {
		h.deniedOn(c, n)
		retry := max(until, c.blockedRetry.Load()) - mono
		d := ratelimit.Decision{Limit: h.limit, Algorithm: h.cfg.algorithm, RetryAfter: time.Duration(retry), ResetAfter: time.Duration(retry)}
		if l != nil && mono < l.end {
			d.Remaining = int(max(0, l.avail.Load()))
			d.ResetAfter = time.Duration(l.end - mono)
		}
		return d, nil, true
	}
	return ratelimit.Decision{}, nil, false
}

// availAt returns what lease l holds for decisions at mono: 0 for no
// lease or one whose window ended.
func availAt(l *lease, mono int64) int64 {
	if l == nil || mono >= l.end {
		return 0
	}
	return max(0, l.avail.Load())
}

// admitted records an admitted decision: one atomic add for the counts
// (beside avail), and a store of the last use only when it moved by a 32nd
// of the period (it serves idle detection only, and a store on every
// decision would make the counter's cache line bounce between cores). The
// syncer does not hear of every key in use every tick (with many keys,
// marking each once per tick is a lock every goroutine meets): it visits a
// key when its lease runs low (see fast), and at the times it scheduled
// (see scheduleLocked).
func (h *Limiter) admitted(c *counter, l *lease, n, mono int64) {
	l.tick.Add(1<<32 | uint64(n))
	h.used(c, mono)
}

// deniedOn records a denied decision of n units (one atomic add): it
// counts as demand, and the syncer hears of it.
func (h *Limiter) deniedOn(c *counter, n int64) {
	c.missed.Add(1<<32 | uint64(n))
	h.used(c, h.mono())
	h.soon(c)
}

func (h *Limiter) used(c *counter, mono int64) {
	if mono-c.lastUse.Load() > h.useGrain {
		c.lastUse.Store(mono)
	}
}

// soon marks c for the syncer's next tick, once per tick.
func (h *Limiter) soon(c *counter) {
	if !c.dirty.Load() && c.dirty.CompareAndSwap(false, true) {
		h.syncer.Mark(c)
	}
}

func (h *Limiter) mark(c *counter) {
	c.dirty.Store(true)
	h.syncer.Mark(c)
}

// slow handles a decision the lease in hand cannot: the next window's
// lease when its window has begun, credit in optimistic mode, a
// synchronous lease otherwise, the failure mode when Redis fails. It waits
// on Redis at most the timeout, or until expired closes when the caller
// gives one (a deadline shared by the limits of a Multi). An admission
// returns the lease it took n from, or holds credit on.
func (h *Limiter) slow(ctx context.Context, c *counter, key string, n int64, expired <-chan struct{}) (ratelimit.Decision, *lease, error) {
	// The gate orders this decision before Close or after it: Close waits
	// for the decisions it let in, and none starts after (its WaitGroup
	// must not grow while Close waits).
	h.gate.RLock()
	if h.closed.Load() {
		h.gate.RUnlock()
		return ratelimit.Decision{}, nil, ratelimit.ErrClosed
	}
	h.inflight.Add(1)
	h.gate.RUnlock()
	defer h.inflight.Done()
	// One deadline for the whole decision, however many lease calls it
	// takes: a decision never waits on Redis longer than the timeout.
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for attempt := 0; ; attempt++ {
		if c.dead.Load() {
			c = h.lookup(key)
		}
		mono := h.mono()
		if h.roll(c, mono) || attempt > 0 {
			if d, l, ok := h.fast(c, n, mono); ok {
				if attempt > 0 {
					c.waited.Add(1)
				}
				return d, l, nil
			}
		}
		if h.cfg.mode == Optimistic && h.brk.State() == breaker.Closed {
			if d, l, ok := h.borrow(c, n, mono, h.optimisticShare()); ok {
				if attempt > 0 {
					c.waited.Add(1)
				}
				return d, l, nil
			}
		}
		if attempt >= maxLeaseAttempts {
			// Every grant was taken by concurrent callers before this one
			// got to it, again and again, while Redis kept granting: deny
			// rather than spin. (Exhaustion ends the loop sooner: Redis
			// answers with no grant and fast denies until the reset.)
			h.deniedOn(c, n)
			c.waited.Add(1)
			return ratelimit.Decision{Limit: h.limit, Algorithm: h.cfg.algorithm, RetryAfter: h.cfg.syncInterval, ResetAfter: h.cfg.syncInterval}, nil, nil
		}
		if !h.brk.Allow() {
			d, l := h.fallback(c, n, mono)
			if attempt > 0 {
				c.waited.Add(1)
			}
			return d, l, nil
		}
		var fire <-chan time.Time
		if expired == nil {
			if timer == nil {
				timer = time.NewTimer(h.cfg.timeout)
			}
			fire = timer.C
		}
		if err := h.leaseWait(ctx, c, n, fire, expired); err != nil {
			if ctx.Err() != nil {
				return ratelimit.Decision{}, nil, ctx.Err()
			}
			c.waited.Add(1)
			if h.brk.State() == breaker.Closed {
				d, l := h.slowReply(c, n, h.mono())
				return d, l, nil
			}
			d, l := h.fallback(c, n, h.mono())
			return d, l, nil
		}
	}
}

// roll makes the lease leased ahead for the next window the one decisions
// take from, once that window has begun. It reports whether it did.
func (h *Limiter) roll(c *counter, mono int64) bool {
	if c.cur.Load() != nil && mono < c.cur.Load().end {
		return false
	}
	c.mu.Lock()
	ok := h.rollLocked(c, mono)
	c.mu.Unlock()
	return ok
}

// rollLocked: see roll. The next window begins at the current lease's end;
// without a current lease, at the next lease's start less the estimate's
// error (the two come from different replies). Caller holds c.mu.
func (h *Limiter) rollLocked(c *counter, mono int64) bool {
	nl := c.next
	if nl == nil {
		return false
	}
	cur := c.cur.Load()
	switch {
	case cur != nil && cur.idx < nl.idx && mono < cur.end:
		return false // the current window still runs
	case cur == nil && mono < nl.start-h.clk.errorBound():
		return false
	}
	c.next = nil
	if cur != nil && cur.idx >= nl.idx { // cannot serve: a lease of its window is in hand
		c.retireLease(nl, h.moot(nl.idx, mono))
		return false
	}
	if mono >= nl.end { // its window is over too
		c.retireLease(nl, h.moot(nl.idx, mono))
		return false
	}
	c.cur.Store(nl)
	if cur != nil {
		c.retireLease(cur, h.moot(cur.idx, mono))
		c.nextIdx = max(c.nextIdx, cur.idx+1)
		h.mark(c)
	}
	return true
}

// moot reports whether window idx no longer bounds any decision at mono: a
// FixedWindow counter once its window ended, a SlidingWindow one a period
// later. Refunds and credit for a moot window are dropped, not sent.
func (h *Limiter) moot(idx, mono int64) bool {
	if h.bucket {
		return false // tokens go back to the bucket whenever
	}
	last := idx + 1
	if h.cfg.algorithm == ratelimit.SlidingWindow {
		last = idx + 2
	}
	return mono >= h.clk.monoAt(last*h.periodUS)
}

// leaseWait leases for c, sharing one Redis call among concurrent callers of
// the key (a per-key singleflight), and waits at most until timeout fires
// or expired closes, whatever the Redis client's own timeouts are. The call goes out
// with every other key's synchronous lease queued meanwhile, in one
// pipeline (see enqueue), with a deadline of its own.
func (h *Limiter) leaseWait(ctx context.Context, c *counter, n int64, timeout <-chan time.Time, expired <-chan struct{}) error {
	mono := h.mono()
	c.mu.Lock()
	f := c.flight
	if f == nil {
		k, ok := h.resend(c)
		if !ok {
			// The grant adds to the lease in hand: n less what it holds will do.
			have := int64(0)
			if l := c.cur.Load(); l != nil && l.known && mono < l.end {
				have = max(0, l.avail.Load())
			}
			// What the key owes goes first: credit (an overdraft, say) is
			// counted before anything is granted.
			owedCredit(c)
			if h.bucket {
				k = h.newBucketCall(c)
				attachBucketDebts(c, &k.bkt)
				k.bkt.Want, k.bkt.Min = max(n, h.bucketNeed(c, mono), h.floor()), max(1, n-have)
			} else {
				args := h.newCall(c)
				h.attachDebts(c, &args, mono)
				_, end := h.windowOf(c, mono)
				args.Want, args.Min = max(n, h.need(c, mono, end), h.floor()), max(1, n-have)
				if lead := max(c.lead, 2*h.tickGap.Load()); c.next == nil && end-mono <= lead && leaseAhead(c) {
					// near the window's end: the next window's quota in the same call
					args.WantNext = max(h.need(c, end, end+h.periodNS), h.floor())
					args.Lead = (lead + int64(h.cfg.syncInterval)) / 1000
				}
				k = call{win: args}
			}
			c.call = &sent{call: k}
		}
		f = &flight{done: make(chan struct{})}
		c.flight = f
		c.mu.Unlock()
		h.enqueue(op{c: c, call: k, f: f})
	} else {
		c.mu.Unlock()
	}
	select {
	case <-f.done:
		return f.err
	case <-timeout:
		return context.DeadlineExceeded
	case <-expired:
		return context.DeadlineExceeded
	case <-ctx.Done():
		return ctx.Err()
	}
}

// resend returns c's outstanding call to send again, if it has one: as it
// was if it certainly did not run, else marked resent (Redis replays it, or
// applies only its credit). Caller holds c.mu, and c has no flight.
func (h *Limiter) resend(c *counter) (call, bool) {
	if c.call == nil {
		return call{}, false
	}
	if c.call.notApplied {
		c.call.notApplied = false
	} else {
		c.call.call.setResent()
	}
	return c.call.call, true
}

// enqueue queues a decision's lease call. Up to maxSyncPipelines pipelines
// are in flight at once; calls queued meanwhile go out together in the
// next, so cold keys share round trips instead of queueing for
// connections, and an idle limiter sends at once.
func (h *Limiter) enqueue(o op) {
	h.sq.Lock()
	h.sq.ops = append(h.sq.ops, o)
	start := h.sq.running < maxSyncPipelines
	if start {
		h.sq.running++
		h.inflight.Add(1)
	}
	h.sq.Unlock()
	if start {
		go h.drain()
	}
}

// drain sends queued decision calls until none is left.
func (h *Limiter) drain() {
	defer h.inflight.Done()
	for {
		h.sq.Lock()
		ops := h.sq.ops
		h.sq.ops = nil
		if len(ops) == 0 {
			h.sq.running--
			h.sq.Unlock()
			return
		}
		h.sq.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), h.callTimeout())
		h.st.syncRoundTrips.Add(1)
		h.send(ctx, ops)
		cancel()
	}
}

// newCall starts a lease call for c. Caller holds c.mu or owns c.
func (h *Limiter) newCall(c *counter) script.LeaseArgs {
	return script.LeaseArgs{
		Base: h.baseOf(c), Kind: h.kind, Limit: h.limit,
		Nonce: script.NewNonce(mrand.Uint64()), Seq: h.seq.Add(1), Instances: h.instances(), Min: 1,
	}
}

// windowOf returns the window c's decisions count in at mono and its end:
// its lease's, or the estimate's. Caller holds c.mu.
func (h *Limiter) windowOf(c *counter, mono int64) (idx, end int64) {
	if h.bucket {
		return h.bucketWindow(mono)
	}
	if l := c.cur.Load(); l != nil && l.known && mono < l.end {
		return l.idx, l.end
	}
	return h.clk.window(mono)
}

// demand is c's demand in units per period: the most of what it asked in
// the last whole window, what it asked so far in this one scaled to a
// period, and its smoothed rate (which follows a burst within a tick or
// two). Caller holds c.mu.
func (h *Limiter) demand(c *counter, mono int64) float64 {
	return max(h.windowRate(c, mono, int64(h.cfg.syncInterval)), c.rate)
}

// windowRate is c's demand in units per period over whole windows: what it
// asked in the last one, and what it asked so far in this one scaled to a
// period once at least least ns of it went. Caller holds c.mu.
func (h *Limiter) windowRate(c *counter, mono, least int64) float64 {
	d := float64(c.prevAsked)
	if idx, end := h.windowOf(c, mono); idx == c.askedIdx {
		if elapsed := mono - (end - h.periodNS); elapsed >= least {
			d = max(d, float64(c.asked)*float64(h.periodNS)/float64(elapsed))
		}
	}
	return d
}

// need is what c should hold to serve from mono until end at its demand,
// with half again for headroom. Caller holds c.mu.
func (h *Limiter) need(c *counter, mono, end int64) int64 {
	return int64(math.Ceil(h.demand(c, mono) * float64(end-mono) / float64(h.periodNS) * 1.5))
}

// floor is the least a lease asks for: Rate / (16 x instances), at least 1,
// so that a key without history, or one that went quiet, does not turn its
// next decisions into round trips.
func (h *Limiter) floor() int64 {
	return max(1, min(h.rate, h.capacity)/(16*h.instances()))
}

// leadOf is how long before its window's end a key leases the next window:
// at least two sync intervals, so the call lands before the roll, and
// spread by key over up to five more (within half the period), so that the
// leases of keys whose windows all end together go out over several ticks.
func (h *Limiter) leadOf(k string) int64 {
	iv := int64(h.cfg.syncInterval)
	spread := max(0, min(h.periodNS/2, 7*iv)-2*iv)
	f := fnv.New32a()
	f.Write([]byte(k))
	return 2*iv + int64(f.Sum32())%(spread+1)
}

// idleGap is how long a key may stay quiet before it counts as idle: quota
// it leased ahead goes back then, and it leases ahead no more. One sync
// interval (as the syncer keeps it: longer when its passes take long) for
// a key used several times per interval; for a sparser key, four times its
// mean time between requests (a key used at random at that rate is quiet
// that long about once in 50 gaps), at most a period. Caller holds c.mu.
func (h *Limiter) idleGap(c *counter, mono int64) int64 {
	// Not shorter than the last tick's gap and an interval: a key is not
	// judged quiet over a time the syncer itself did not run (the process
	// was starved of CPU, or paused), before it could be used again.
	gap := max(int64(h.cfg.syncInterval), h.tickGap.Load(), h.lastGap.Load()+int64(h.cfg.syncInterval))
	// The key's mean rate over whole windows, not its smoothed rate, which
	// follows bursts: a process that was stalled and catches up uses its
	// keys in bursts, and a burst's short gaps would make the next stall
	// look like idleness.
	if d := h.windowRate(c, mono, h.periodNS/2); d > 0 {
		return max(gap, min(h.periodNS, int64(4*float64(h.periodNS)/d)))
	}
	return max(gap, h.periodNS)
}

func (h *Limiter) instances() int64 {
	if h.cfg.instances > 0 {
		return int64(h.cfg.instances)
	}
	if !h.learned.Load() {
		// No heartbeat ever reached Redis: the fleet's size is unknown, and
		// taking it for one would let a fleet of N admit N times the limit
		// while Redis is away. Assume unknownFleet.
		return unknownFleet
	}
	return max(1, h.liveInstances.Load())
}

// optimisticShare is what an instance may admit per window on credit in
// optimistic mode: Rate / (8 x instances), at least 1.
func (h *Limiter) optimisticShare() int64 {
	return max(1, h.rate/(optimisticShareDivisor*h.instances()))
}

// applied handles the reply of a lease call: the call is no longer
// pending; its refunds and credit are in Redis; its grants are installed.
func (h *Limiter) applied(c *counter, args script.LeaseArgs, r script.Reply, before, after int64) {
	h.clk.observe(r.Now, before, after)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.call == nil || c.call.call.seq() != args.Seq {
		// A second reply to a call sent more than once (resent while the
		// first attempt was still on its way): the first one was installed.
		return
	}
	c.call = nil
	for _, a := range args.Adjust {
		if !r.Unknown {
			h.st.refunded.Add(uint64(a.Refund))
		}
		h.st.reported.Add(uint64(a.Use))
	}
	if r.Unknown {
		return // nothing was granted
	}
	h.install(c, args, r, before, after)
}

// install puts the grants of reply r into c's leases. Caller holds c.mu.
func (h *Limiter) install(c *counter, args script.LeaseArgs, r script.Reply, before, after int64) {
	end := h.clk.end(r.Idx, r.Reset, before, after) // window r.Idx's end
	h.rollLocked(c, after)
	if args.Want > 0 || r.Grant > 0 {
		c.setFree(c.cur.Load(), r.Idx, h.rate-r.Count)
		switch {
		case r.Grant > 0:
			h.place(c, r.Idx, r.Grant, end-h.periodNS, end, after)
		case r.Retry > 0 && r.Reset > 0:
			c.block(args.Min, before, before+r.Retry*1000)
		}
	}
	if args.WantNext > 0 || r.GrantNext > 0 {
		l := c.next
		if l == nil || l.idx != r.Idx+1 {
			l = c.cur.Load()
		}
		c.setFree(l, r.Idx+1, h.rate-r.CountNext)
		if r.GrantNext > 0 {
			h.st.leasedAhead.Add(1)
			h.place(c, r.Idx+1, r.GrantNext, end, end+h.periodNS, after)
		}
	}
}

// place puts g units granted from window idx (from start to end, mono)
// into c's leases, at mono: into the lease of that window in hand, a new
// current lease, or a lease for the next window; what has no place is owed
// back. Caller holds c.mu.
func (h *Limiter) place(c *counter, idx, g, start, end, mono int64) {
	h.st.leases.Add(1)
	h.st.leasedUnits.Add(uint64(g))
	cur := c.cur.Load()
	switch {
	case c.dead.Load() || h.draining.Load() > 0 || mono >= end:
		c.owe(idx, g, 0)
		h.mark(c)
	case cur != nil && cur.idx == idx && cur.known:
		cur.grow(g)
		c.blockedUntil.Store(0)
	case cur != nil && cur.idx == idx:
		// The lease in hand was estimated to hold credit: a known lease of
		// the same window replaces it, and its quota, credit and budget
		// move over. Publish first, then retire: a caller holding the old
		// one fails its CAS and finds the new one.
		nl := c.newLease(idx, start, end, true)
		nl.grow(g)
		carried := nl.borrowed.Load()
		c.cur.Store(nl)
		nl.borrowed.Add(max(0, cur.closeBorrowing()-carried))
		nl.credit.Add(cur.credit.Swap(0))
		nl.grow(cur.avail.Swap(0))
		c.old = append(c.old, cur)
		c.blockedUntil.Store(0)
	case mono >= start-h.clk.errorBound() && (cur == nil || cur.idx < idx):
		// The window has begun: a new current lease, which takes over the
		// quota leased ahead for it, if any (given back, it would come too
		// late for callers already told the window is spent).
		nl := c.newLease(idx, start, end, true)
		if n := c.next; n != nil && n.idx == idx {
			c.next = nil
			nl = n
			nl.pre = false
		}
		nl.grow(g)
		c.cur.Store(nl)
		if cur != nil {
			c.retireLease(cur, h.moot(cur.idx, mono))
			c.nextIdx = max(c.nextIdx, cur.idx+1)
			h.mark(c)
		}
		if c.next != nil && c.next.idx <= idx {
			c.retireLease(c.next, h.moot(c.next.idx, mono))
			c.next = nil
			h.mark(c)
		}
		c.blockedUntil.Store(0)
	case c.next != nil && c.next.idx == idx:
		c.next.grow(g)
	case c.next == nil && (cur == nil || cur.idx < idx):
		nl := c.newLease(idx, start, end, true)
		nl.grow(g)
		nl.pre = true
		c.next = nl
		h.mark(c) // the syncer watches it: given back if the key goes quiet
	default: // an older window than the one in hand
		c.owe(idx, g, 0)
		h.mark(c)
	}
}

// borrow admits n on credit against the current window, within share per
// window; the syncer reports the credit to Redis. An admission returns the
// lease that holds the credit.
func (h *Limiter) borrow(c *counter, n, mono, share int64) (ratelimit.Decision, *lease, bool) {
	l := h.currentLease(c, mono)
	if h.bucket {
		h.bucketBudget(c, l, mono)
	}
	for {
		b := l.borrowed.Load()
		if b >= closedBudget { // replaced meanwhile: borrow on its successor
			l = h.currentLease(c, mono)
			continue
		}
		if b+n > share {
			return ratelimit.Decision{}, nil, false
		}
		if l.borrowed.CompareAndSwap(b, b+n) {
			l.credit.Add(n)
			h.admitted(c, l, n, mono)
			h.soon(c) // credit to report
			rem := share - b - n
			if share == math.MaxInt64 {
				rem = h.capacity
			}
			rem = min(rem, h.capacity)
			reset := max(l.end-mono, 0)
			if h.bucket {
				reset = h.bucketReset(rem)
			}
			return ratelimit.Decision{Allowed: true, Limit: h.limit, Algorithm: h.cfg.algorithm, Remaining: int(rem),
				ResetAfter: time.Duration(reset)}, l, true
		}
	}
}

// currentLease returns c's lease for the current window, installing an
// empty one on the estimated window when c has none.
func (h *Limiter) currentLease(c *counter, mono int64) *lease {
	if l := c.cur.Load(); l != nil && mono < l.end {
		return l
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	h.rollLocked(c, mono)
	l := c.cur.Load()
	if l != nil && mono < l.end {
		return l
	}
	if h.bucket { // a lease of tokens with none in it yet, to hold credit
		nl := c.newLease(0, 0, noEnd, true)
		c.cur.Store(nl)
		h.mark(c)
		return nl
	}
	if l != nil {
		c.cur.Store(nil)
		c.retireLease(l, h.moot(l.idx, mono))
		c.nextIdx = max(c.nextIdx, l.idx+1) // its window is over: never estimate back into it
	}
	idx, end := h.clk.window(mono)
	if idx < c.nextIdx {
		// The offset to Redis time jitters by a round trip; an estimate must
		// never step back into a window this counter already left, or that
		// window would get a second credit budget.
		end += (c.nextIdx - idx) * h.periodNS
		idx = c.nextIdx
	}
	nl := c.newLease(idx, end-h.periodNS, end, false)
	c.cur.Store(nl)
	h.mark(c)
	return nl
}

// creditShare is what the instance may admit on credit in window idx when
// Redis is slow or away: per, bounded by the window's last-known remainder
// shared by the instances. Caller holds c.mu.
func (h *Limiter) creditShare(c *counter, idx, per int64) int64 {
	if f, ok := c.knownFree(idx); ok {
		return min(per, max(0, f)/h.instances())
	}
	return per
}

// slowReply decides when a lease call took longer than the timeout while
// the breaker is closed: Redis answers, slowly, and its last word on the
// window stands. Strict denies; Optimistic admits on credit within its
// share, bounded by what Redis last reported free in the window.
func (h *Limiter) slowReply(c *counter, n, mono int64) (ratelimit.Decision, *lease) {
	h.st.noReply.Add(1)
	if h.cfg.mode == Optimistic {
		l := h.currentLease(c, mono)
		c.mu.Lock()
		share := h.creditShare(c, l.idx, h.optimisticShare())
		c.mu.Unlock()
		if d, l, ok := h.borrow(c, n, mono, share); ok {
			return d, l
		}
	}
	h.deniedOn(c, n)
	c.mu.Lock()
	idx, end := h.windowOf(c, mono)
	f, known := c.knownFree(idx)
	c.mu.Unlock()
	wait := min(int64(h.cfg.syncInterval), end-mono)
	if known && f <= 0 {
		wait = end - mono // spent: nothing frees before the window ends
	}
	wait = max(wait, int64(time.Millisecond))
	return ratelimit.Decision{Limit: h.limit, Algorithm: h.cfg.algorithm, RetryAfter: time.Duration(wait), ResetAfter: time.Duration(max(end-mono, wait))}, nil
}

// fallback decides while the breaker is open, per the failure mode.
func (h *Limiter) fallback(c *counter, n, mono int64) (ratelimit.Decision, *lease) {
	h.st.fallback.Add(1)
	switch h.cfg.failure {
	case ratelimit.FailOpen:
		d, l, _ := h.borrow(c, n, mono, math.MaxInt64)
		return d, l
	case ratelimit.FailLocal:
		l := h.currentLease(c, mono)
		c.mu.Lock()
		share := h.creditShare(c, l.idx, max(1, h.rate/h.instances()))
		c.mu.Unlock()
		if d, l, ok := h.borrow(c, n, mono, share); ok {
			return d, l
		}
		h.deniedOn(c, n)
		end := l.end
		if h.bucket {
			_, end = h.bucketWindow(mono) // the budget's next period
		}
		wait := time.Duration(max(end-mono, int64(time.Millisecond)))
		return ratelimit.Decision{Limit: h.limit, Algorithm: h.cfg.algorithm, RetryAfter: wait, ResetAfter: wait}, nil
	default: // FailClosed
		h.deniedOn(c, n)
		return ratelimit.Decision{Limit: h.limit, Algorithm: h.cfg.algorithm, RetryAfter: h.cfg.breakerOpenFor, ResetAfter: h.cfg.breakerOpenFor}, nil
	}
}

// evicted is the key table's eviction callback: the counter's leases go
// back to Redis at the next sync.
func (h *Limiter) evicted(_ string, c *counter) {
	c.dead.Store(true)
	h.forget(c)
	if h.retire(c) {
		h.mark(c)
		return
	}
	h.fold(c)
}

// fold adds a counter that leaves for good to the retired statistics.
func (h *Limiter) fold(c *counter) {
	c.mu.Lock()
	t := c.takeTick()
	expired := c.expired
	c.expired = 0
	c.mu.Unlock()
	h.st.retiredExpired.Add(uint64(expired))
	h.st.retiredAllowed.Add(c.allowed.Swap(0) + t>>32)
	h.st.retiredDenied.Add(c.denied.Swap(0) + c.missed.Swap(0)>>32)
	h.st.retiredWaited.Add(c.waited.Swap(0))
}

// retire takes c's leases away and turns what they hold into debts. It
// returns true when there is something to report.
func (h *Limiter) retire(c *counter) bool { return h.retireAt(c, h.mono()) }

// retireAt is retire at mono.
func (h *Limiter) retireAt(c *counter, mono int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.cur.Swap(nil); l != nil {
		c.retireLease(l, h.moot(l.idx, mono))
	}
	if l := c.next; l != nil {
		c.next = nil
		c.retireLease(l, h.moot(l.idx, mono))
	}
	return len(c.debts) > 0 || c.call != nil
}

// Flush reconciles with Redis now: every unused lease is given back and
// every count admitted on credit is reported, so that right after it the
// counts in Redis are exactly what this instance admitted. The next
// decisions lease again. It returns the first error met, or an error when
// something is still owed after its passes. It returns by ctx's deadline,
// and within max(2s, 5 timeouts) whatever ctx and the Redis client's timeouts.
func (h *Limiter) Flush(ctx context.Context) error {
	if h.closed.Load() {
		return ratelimit.ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, h.budget())
	defer cancel()
	h.draining.Add(1)
	defer h.draining.Add(-1)
	h.retireAll()
	// A pass can leave debts behind (a grant that arrived in it goes back
	// as a debt), and a key whose decision's call is on its way is left
	// for the next pass: run passes until nothing is owed, waiting for
	// those calls between passes, a few at most.
	for i := 0; ; i++ {
		if err := h.syncer.Flush(ctx); err != nil {
			return err
		}
		if h.syncer.Pending() == 0 {
			return nil
		}
		if i == maxFlushPasses {
			return fmt.Errorf("hybrid: flush: %d keys still owe Redis after %d passes", h.syncer.Pending(), i+1)
		}
		if err := h.quiesce(ctx); err != nil {
			return err
		}
	}
}

// quiesce waits until no decision's lease call is queued or on its way.
func (h *Limiter) quiesce(ctx context.Context) error {
	for {
		h.sq.Lock()
		idle := h.sq.running == 0 && len(h.sq.ops) == 0
		h.sq.Unlock()
		if idle {
			return nil
		}
		t := time.NewTimer(time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

// budget is the longest Flush and Close take: max(2s, 5 timeouts).
func (h *Limiter) budget() time.Duration { return max(defaultFinalFlushBudget, 5*h.cfg.timeout) }

// waitOr runs wait and returns when it does or when ctx is done.
func waitOr(ctx context.Context, wait func()) {
	done := make(chan struct{})
	go func() { wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

func (h *Limiter) retireAll() {
	h.table.Range(func(_ string, c *counter) bool {
		if h.retire(c) {
			h.mark(c)
		}
		return true
	})
}

// Close gives every unused lease back, reports every count, stops the
// background syncer and waits for every goroutine the Limiter started. It is
// idempotent; decisions after Close return ratelimit.ErrClosed.
//
// Close returns within max(2s, 5 timeouts), whatever the Redis
// client's own timeouts: what it could not give back by then is reported in
// the error (and stays counted in Redis until its window ends: the safe
// side). A call the client itself does not give up on (one without
// ContextTimeoutEnabled waits its ReadTimeout, 3s by default) ends on its
// own after Close returns.
func (h *Limiter) Close() error {
	h.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), h.budget())
		defer cancel()
		h.closed.Store(true)
		h.draining.Add(1)
		// A barrier: every slow-path decision that took the read lock
		// before closed was set has added itself to inflight; none starts
		// after.
		h.gate.Lock()
		//lint:ignore SA2001 the lock is taken for its wait, not to guard anything
		h.gate.Unlock()
		waitOr(ctx, h.inflight.Wait)
		h.retireAll()
		// The syncer's final flush makes one attempt even past its deadline
		// (a call's deadline at most): leave room for it in the budget.
		dl, _ := ctx.Deadline()
		sctx, scancel := context.WithDeadline(ctx, dl.Add(-h.callTimeout()))
		h.closeErr = h.syncer.Close(sctx)
		scancel()
		if h.cfg.instances == 0 {
			hctx, hcancel := context.WithTimeout(ctx, h.cfg.timeout)
			h.heartbeat(hctx, false)
			hcancel()
		}
		waitOr(ctx, h.calls.Wait)
	})
	return h.closeErr
}
