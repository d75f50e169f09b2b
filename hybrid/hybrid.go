package hybrid

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	gosync "sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/internal/breaker"
	"github.com/hybridlimit/ratelimit/local"
	bgsync "github.com/hybridlimit/ratelimit/sync"
)

// Limiter is a rate limiter shared by a fleet of instances: it answers
// almost every decision from memory, out of quota leased from Redis, and a
// background syncer reconciles with Redis every sync interval.
//
// A Limiter is safe for concurrent use. Make one per process and Limit with
// New (the zero value is not usable), share it between goroutines, and Close
// it to give its unused quota back and stop its goroutines. Its default
// algorithm is FixedWindow; a global.Limiter defaults to SlidingWindow, so
// name the algorithm when a fleet mixes the two on one quota.
type Limiter struct {
	client   redis.UniversalClient
	limit    ratelimit.Limit
	cfg      config
	periodUS int64
	periodNS int64
	useGrain int64     // resolution of counter.lastUse, ns
	start    time.Time // monotonic base of every deadline
	startUS  int64     // wall clock at start, microseconds since the epoch
	id       string

	table  *local.Table[*counter]
	index  gosync.Map // key -> *counter: the lock-free read path in front of table
	syncer *bgsync.Syncer[*counter]
	brk    *breaker.Breaker

	offsetUS      atomic.Int64 // Redis time minus local wall time, microseconds
	offsetErr     atomic.Int64 // bound of offsetUS's error, ns
	offsetMu      gosync.Mutex // guards offsetRTT and offsetAt
	offsetRTT     int64        // round trip of the sample offsetUS came from, ns
	offsetAt      int64        // monotonic ns of that sample
	liveInstances atomic.Int64
	nextBeat      int64        // monotonic ns; owned by the syncer goroutine
	seq           atomic.Int64 // sequence of the syncer's calls, for replay protection
	draining      atomic.Int32 // Flush or Close in progress: give back, do not top up

	closed    atomic.Bool
	closeOnce gosync.Once
	closeErr  error
	inflight  gosync.WaitGroup // slow-path calls, so Close can wait for them

	st stats
}

type stats struct {
	roundTrips, syncRoundTrips, leases, leasedUnits, refunded, reported atomic.Uint64
	flushErrors, fallback                                               atomic.Uint64
	retiredAllowed, retiredDenied, retiredWaited                        atomic.Uint64
}

var _ ratelimit.Limiter = (*Limiter)(nil)

// New returns a hybrid Limiter enforcing limit per key across every instance
// that shares client's Redis (standalone, Sentinel or Cluster) and prefix.
// It starts the background syncer; Close stops it.
func New(client redis.UniversalClient, limit ratelimit.Limit, opts ...Option) (*Limiter, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil Redis client", ratelimit.ErrInvalidOption)
	}
	if err := limit.Validate(); err != nil {
		return nil, err
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.instanceID == "" {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, err
		}
		cfg.instanceID = hex.EncodeToString(b[:])
	}
	now := time.Now()
	h := &Limiter{
		client:   client,
		limit:    limit,
		cfg:      cfg,
		periodUS: int64(limit.Period / time.Microsecond),
		periodNS: int64(limit.Period),
		useGrain: max(int64(time.Millisecond), int64(limit.Period)/32),
		start:    now,
		startUS:  now.UnixMicro(),
		id:       cfg.instanceID,
	}
	h.liveInstances.Store(1)
	h.brk = breaker.New(breaker.Config{FailureThreshold: cfg.breakerFailures, OpenTimeout: cfg.breakerOpenFor})
	h.brk.OnStateChange(func(from, to breaker.State) {
		switch to {
		case breaker.Open:
			if from == breaker.Closed {
				h.emit(Event{Kind: EventDegraded})
			}
		case breaker.Closed:
			h.emit(Event{Kind: EventRecovered})
		}
	})
	h.table = local.NewTable[*counter](cfg.maxKeys, h.evicted)
	s, err := bgsync.New[*counter](h.flush,
		bgsync.WithInterval(cfg.syncInterval),
		bgsync.WithTimeout(cfg.timeout),
		bgsync.WithBackoff(cfg.syncInterval, max(5*time.Second, cfg.syncInterval)),
		bgsync.WithOnTick(h.tick),
	)
	if err != nil {
		return nil, err
	}
	h.syncer = s
	if cfg.instances == 0 { // learn the fleet size before the first decision, best effort
		ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
		h.heartbeat(ctx, true)
		cancel()
	}
	return h, nil
}

// Limit returns the limit the Limiter enforces.
func (h *Limiter) Limit() ratelimit.Limit { return h.limit }

// Allow is shorthand for AllowN(ctx, key, 1).
func (h *Limiter) Allow(ctx context.Context, key string) (ratelimit.Decision, error) {
	return h.AllowN(ctx, key, 1)
}

func (h *Limiter) mono() int64 { return int64(time.Since(h.start)) }

// AllowN reports whether n events for key may happen now and consumes them
// if so. With quota leased for key it decides in memory, without waiting on
// Redis; otherwise it leases (one Redis call shared by every concurrent
// caller of key) and waits at most the configured timeout. When Redis
// cannot answer, the ratelimit.FailureMode decides, with a nil error.
//
// It returns an error wrapping ratelimit.ErrInvalidKey for an empty key,
// ratelimit.ErrInvalidN for n <= 0 or n > Rate, ratelimit.ErrClosed after
// Close, and ctx's error when ctx ends first.
func (h *Limiter) AllowN(ctx context.Context, key string, n int) (ratelimit.Decision, error) {
	if h.closed.Load() {
		return ratelimit.Decision{}, ratelimit.ErrClosed
	}
	if key == "" {
		return ratelimit.Decision{}, ratelimit.CheckKey(key)
	}
	if n <= 0 || n > h.limit.Rate {
		return ratelimit.Decision{}, ratelimit.CheckN(h.limit, h.cfg.algorithm, n)
	}
	c := h.lookup(key)
	mono := h.mono()
	if d, ok := h.fast(c, int64(n), mono); ok {
		return d, nil
	}
	return h.slow(ctx, c, key, int64(n))
}

// lookup finds or makes the counter of key. A hit takes no lock: the index
// is read-mostly, and the LRU table, which bounds the keys and decides
// evictions, hears of a key's use at most once per sync tick.
func (h *Limiter) lookup(key string) *counter {
	if v, ok := h.index.Load(key); ok {
		c := v.(*counter)
		if !c.touched.Load() {
			c.touched.Store(true)
			h.table.Get(key)
		}
		return c
	}
	c, created := h.table.GetOrCreate(key, func() *counter {
		base, _ := global.KeyBase(h.cfg.prefix, key) // key is not empty
		return &counter{key: key, base: base}
	})
	if created || !c.dead.Load() {
		h.index.Store(key, c)
	}
	return c
}

// forget drops c from the index, unless the key has a newer counter.
func (h *Limiter) forget(c *counter) { h.index.CompareAndDelete(c.key, c) }

// fast decides from the lease in hand, or denies a key known to be
// exhausted. ok is false when Redis must be asked.
func (h *Limiter) fast(c *counter, n, mono int64) (ratelimit.Decision, bool) {
	l := c.lease.Load()
	if l != nil && mono < l.deadline {
		for {
			a := l.avail.Load()
			if a < n {
				break
			}
			if l.avail.CompareAndSwap(a, a-n) {
				h.admitted(c, l, n, mono)
				return ratelimit.Decision{Allowed: true, Limit: h.limit,
					Remaining:  int(a - n + max(0, l.free.Load())),
					ResetAfter: time.Duration(l.end - mono)}, true
			}
		}
	}
	if until := c.blockedUntil.Load(); mono < until {
		c.denied.Add(1)
		d := ratelimit.Decision{Limit: h.limit, RetryAfter: time.Duration(until - mono), ResetAfter: time.Duration(until - mono)}
		if l != nil && mono < l.deadline {
			d.Remaining = int(max(0, l.avail.Load()))
			d.ResetAfter = time.Duration(l.end - mono)
		}
		return d, true
	}
	return ratelimit.Decision{}, false
}

// admitted records an admitted decision: one atomic add for the counts
// (beside avail), a store of the last use only when it moved by a 32nd of
// the period (it serves idle detection only, and a store on every decision
// would make the counter's cache line bounce between cores), and a mark for
// the syncer once per tick.
func (h *Limiter) admitted(c *counter, l *lease, n, mono int64) {
	l.tick.Add(1<<32 | uint64(n))
	if mono-c.lastUse.Load() > h.useGrain {
		c.lastUse.Store(mono)
	}
	if !c.dirty.Load() && c.dirty.CompareAndSwap(false, true) {
		h.syncer.Mark(c)
	}
}

func (h *Limiter) mark(c *counter) {
	c.dirty.Store(true)
	h.syncer.Mark(c)
}

// slow handles a decision the lease in hand cannot: credit in optimistic
// mode, a synchronous lease otherwise, the failure mode when Redis fails.
func (h *Limiter) slow(ctx context.Context, c *counter, key string, n int64) (ratelimit.Decision, error) {
	h.inflight.Add(1)
	defer h.inflight.Done()
	// One deadline for the whole decision, however many lease calls it
	// takes: a decision never waits on Redis longer than the timeout.
	timer := time.NewTimer(h.cfg.timeout)
	defer timer.Stop()
	for attempt := 0; ; attempt++ {
		if c.dead.Load() {
			c = h.lookup(key)
		}
		mono := h.mono()
		if attempt > 0 {
			if d, ok := h.fast(c, n, mono); ok {
				c.waited.Add(1)
				return d, nil
			}
		}
		if h.cfg.mode == Optimistic && h.brk.State() == breaker.Closed {
			if d, ok := h.borrow(c, n, mono, h.optimisticShare()); ok {
				if attempt > 0 {
					c.waited.Add(1)
				}
				return d, nil
			}
		}
		if attempt >= maxLeaseAttempts {
			// Every grant was taken by concurrent callers before this one
			// got to it, again and again, while Redis kept granting: deny
			// rather than spin. (Exhaustion ends the loop sooner: Redis
			// answers with no grant and fast denies until the reset.)
			c.denied.Add(1)
			c.waited.Add(1)
			return ratelimit.Decision{Limit: h.limit, RetryAfter: h.cfg.syncInterval, ResetAfter: h.cfg.syncInterval}, nil
		}
		if !h.brk.Allow() {
			d := h.fallback(c, n, mono)
			if attempt > 0 {
				c.waited.Add(1)
			}
			return d, nil
		}
		if err := h.leaseWait(ctx, c, n, timer.C); err != nil {
			if ctx.Err() != nil {
				return ratelimit.Decision{}, ctx.Err()
			}
			c.waited.Add(1)
			return h.fallback(c, n, h.mono()), nil
		}
	}
}

// leaseWait leases for c, sharing one Redis call among concurrent callers of
// the key (a per-key singleflight), and waits at most the configured timeout
// for it whatever the Redis client's own timeouts are. The call itself runs
// on a goroutine that Close waits for.
func (h *Limiter) leaseWait(ctx context.Context, c *counter, n int64, timeout <-chan time.Time) error {
	c.mu.Lock()
	f := c.flight
	if f == nil {
		f = &flight{done: make(chan struct{})}
		c.flight = f
		h.inflight.Add(1) // the caller is counted too, so this never races Close's Wait
		go func() {
			defer h.inflight.Done()
			f.err = h.leaseNow(c, n)
			c.mu.Lock()
			c.flight = nil
			c.mu.Unlock()
			close(f.done)
		}()
	}
	c.mu.Unlock()
	select {
	case <-f.done:
		return f.err
	case <-timeout:
		// The call may go on (a client without ContextTimeoutEnabled waits
		// its ReadTimeout); the breaker must learn of the hang now.
		h.brk.Failure()
		return context.DeadlineExceeded
	case <-ctx.Done():
		return ctx.Err()
	}
}

// leaseNow runs one synchronous lease call for c and installs the reply.
func (h *Limiter) leaseNow(c *counter, n int64) error {
	// Synchronous leases have a replay stream of their own (one flight per
	// key at a time, so Redis sees them in the order they were issued): a
	// call whose reply is lost is handed to the syncer, which sends it again
	// as it was and gets the grant back instead of leaking it.
	args := global.LeaseArgs{
		Base: c.base, Algorithm: h.cfg.algorithm, Limit: h.limit,
		RefundIdx: -1, UseIdx: -1,
		Want: max(n, h.target(c)), Min: n, Instances: h.instances(),
		Instance: h.id + "/s", Seq: h.seq.Add(1),
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.cfg.timeout)
	defer cancel()
	before := h.mono()
	v, err := global.LeaseScript.Run(ctx, h.client, args.Keys(), args.Args()...).Result()
	after := h.mono()
	h.st.roundTrips.Add(1)
	h.st.syncRoundTrips.Add(1)
	if err == nil {
		var res global.Lease
		if res, err = global.ParseLease(v); err == nil {
			h.brk.Success()
			if res.Superseded {
				return nil
			}
			h.observeTime(res.Now, before, after)
			h.install(c, res, before, after)
			return nil
		}
	}
	h.brk.Failure()
	c.mu.Lock()
	c.pending = append(c.pending, args)
	c.mu.Unlock()
	h.mark(c)
	return err
}

// target is the lease a counter should hold: twice what it admitted in a
// sync interval lately, and at least a floor of Rate / (16 x instances) so a
// key that went quiet does not turn its next decisions into round trips.
// The lease script caps the grant at remainder / instances.
func (h *Limiter) target(c *counter) int64 {
	floor := max(1, int64(h.limit.Rate)/(16*h.instances()))
	return max(floor, 2*int64(math.Ceil(c.rate.load())))
}

func (h *Limiter) instances() int64 {
	if h.cfg.instances > 0 {
		return int64(h.cfg.instances)
	}
	return max(1, h.liveInstances.Load())
}

// optimisticShare is what an instance may admit per window on credit in
// optimistic mode: Rate / (8 x instances), at least 1.
func (h *Limiter) optimisticShare() int64 {
	return max(1, int64(h.limit.Rate)/(DefaultOptimisticShare*h.instances()))
}

// fallbackShare is this instance's share of the limit while Redis is
// unreachable: Rate / instances, at least 1.
func (h *Limiter) fallbackShare() int64 {
	return max(1, int64(h.limit.Rate)/h.instances())
}

// observeTime keeps the offset between Redis time and the local wall clock,
// NTP style: from the reply with the shortest round trip, since the error
// of a sample is at most half its round trip. A sample older than
// offsetMaxAge gives way to any newer one, so a drifting clock is followed.
func (h *Limiter) observeTime(serverUS, before, after int64) {
	rtt := after - before
	localUS := h.startUS + (before+after)/2/1000
	h.offsetMu.Lock()
	if h.offsetAt == 0 || rtt <= h.offsetRTT || after-h.offsetAt > int64(offsetMaxAge) {
		h.offsetRTT, h.offsetAt = rtt, after
		h.offsetUS.Store(serverUS - localUS)
		h.offsetErr.Store(rtt/2 + int64(time.Microsecond)) // + Redis TIME's resolution
	}
	h.offsetMu.Unlock()
}

// deadline is when a lease granted by res stops being used: the end of its
// window by the best estimate of Redis time, less that estimate's error, so
// never after the window's end in Redis. Redis computed res.Reset somewhere
// between before and after, so the end lies in [before+Reset, after+Reset]:
// a reply that waited long (a loaded host) does not cut its lease short.
func (h *Limiter) deadline(res global.Lease, before, after int64) int64 {
	lo, hi := before+res.Reset*1000, after+res.Reset*1000
	est := h.monoAt((res.Idx+1)*h.periodUS) - h.offsetErr.Load()
	return min(max(est, lo), hi)
}

// monoAt maps a Redis time (microseconds since the epoch) to this
// limiter's monotonic clock, through the offset.
func (h *Limiter) monoAt(serverUS int64) int64 {
	return (serverUS - h.offsetUS.Load() - h.startUS) * 1000
}

// window estimates the current window from the local clock and the last
// known offset to Redis time: its index and its end, in monotonic ns.
func (h *Limiter) window(mono int64) (idx, deadline int64) {
	now := h.startUS + mono/1000 + h.offsetUS.Load()
	idx = now / h.periodUS
	end := (idx + 1) * h.periodUS
	return idx, mono + (end-now)*1000
}

// install applies a lease reply to c; the call was sent at before and its
// reply read at after (monotonic ns).
func (h *Limiter) install(c *counter, res global.Lease, before, after int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.lease.Load()
	if res.Grant == 0 {
		if res.Retry > 0 {
			c.blockedUntil.Store(before + res.Retry*1000)
		}
		if l != nil && l.idx == res.Idx {
			l.free.Store(int64(h.limit.Rate) - res.Count)
		}
		return
	}
	h.st.leases.Add(1)
	h.st.leasedUnits.Add(uint64(res.Grant))
	c.blockedUntil.Store(0)
	switch {
	case c.dead.Load() || h.draining.Load() > 0:
		c.owe(res.Idx, res.Grant, 0)
		h.mark(c)
	case l != nil && l.idx == res.Idx && l.known && before < l.deadline:
		l.avail.Add(res.Grant)
		l.free.Store(int64(h.limit.Rate) - res.Count)
	case l == nil || res.Idx >= l.idx:
		// A new window, or the same one with a better deadline (the lease in
		// hand was estimated, or its conservative deadline passed while Redis
		// is still in the window): what l holds moves over or is owed.
		nl := c.newLease(res.Idx, h.deadline(res, before, after), true)
		nl.end = max(nl.deadline, h.monoAt((res.Idx+1)*h.periodUS))
		nl.free.Store(int64(h.limit.Rate) - res.Count)
		nl.avail.Store(res.Grant)
		carried := nl.borrowed.Load()
		// Publish first, then retire l: a caller holding l fails its CAS and
		// finds nl at once.
		c.lease.Store(nl)
		switch {
		case l == nil:
		case l.idx == res.Idx:
			// The same window: l's quota, credit and budget move over. l
			// started from the same carried budget as nl.
			nl.borrowed.Add(max(0, l.closeBorrowing()-carried))
			nl.credit.Add(l.credit.Swap(0))
			nl.avail.Add(l.avail.Swap(0))
			c.old = append(c.old, l) // late counts and credit on it are folded at the next tick
		default:
			c.drop(l)
			h.mark(c)
		}
	default: // a reply about a window older than the lease in hand
		c.owe(res.Idx, res.Grant, 0)
		h.mark(c)
	}
}

// borrow admits n on credit against the current window, within share per
// window; the syncer reports the credit to Redis.
func (h *Limiter) borrow(c *counter, n, mono, share int64) (ratelimit.Decision, bool) {
	l := h.currentLease(c, mono)
	for {
		b := l.borrowed.Load()
		if b >= closedBudget { // replaced meanwhile: borrow on its successor
			l = h.currentLease(c, mono)
			continue
		}
		if b+n > share {
			return ratelimit.Decision{}, false
		}
		if l.borrowed.CompareAndSwap(b, b+n) {
			l.credit.Add(n)
			h.admitted(c, l, n, mono)
			rem := share - b - n
			if share == math.MaxInt64 {
				rem = int64(h.limit.Rate)
			}
			return ratelimit.Decision{Allowed: true, Limit: h.limit, Remaining: int(min(rem, int64(h.limit.Rate))),
				ResetAfter: time.Duration(l.end - mono)}, true
		}
	}
}

// currentLease returns c's lease for the current window, installing an
// empty one on the estimated window when c has none.
func (h *Limiter) currentLease(c *counter, mono int64) *lease {
	if l := c.lease.Load(); l != nil && mono < l.deadline {
		return l
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.lease.Load()
	if l != nil && mono < l.deadline {
		return l
	}
	if l != nil {
		c.lease.Store(nil)
		c.drop(l)
		if mono >= l.deadline { // its window is over: never estimate back into it
			c.nextIdx = max(c.nextIdx, l.idx+1)
		}
	}
	idx, deadline := h.window(mono)
	if idx < c.nextIdx {
		// The offset to Redis time jitters by a round trip; an estimate must
		// never step back into a window this counter already left, or that
		// window would get a second credit budget.
		deadline += (c.nextIdx - idx) * h.periodNS
		idx = c.nextIdx
	}
	nl := c.newLease(idx, deadline, false)
	nl.end = deadline
	if c.dead.Load() {
		// Dead counters hold no lease: whatever is borrowed on nl is
		// reported through debts by the syncer.
		h.mark(c)
	}
	c.lease.Store(nl)
	h.mark(c)
	return nl
}

// fallback decides while Redis cannot answer, per the failure mode.
func (h *Limiter) fallback(c *counter, n, mono int64) ratelimit.Decision {
	h.st.fallback.Add(1)
	switch h.cfg.failure {
	case ratelimit.FailOpen:
		d, _ := h.borrow(c, n, mono, math.MaxInt64)
		return d
	case ratelimit.FailLocal:
		if d, ok := h.borrow(c, n, mono, h.fallbackShare()); ok {
			return d
		}
		_, deadline := h.window(mono)
		if l := c.lease.Load(); l != nil {
			deadline = l.deadline
		}
		c.denied.Add(1)
		wait := time.Duration(max(deadline-mono, 1))
		return ratelimit.Decision{Limit: h.limit, RetryAfter: wait, ResetAfter: wait}
	default: // FailClosed
		c.denied.Add(1)
		return ratelimit.Decision{Limit: h.limit, RetryAfter: h.cfg.breakerOpenFor, ResetAfter: h.cfg.breakerOpenFor}
	}
}

// evicted is the key table's eviction callback: the counter's lease goes
// back to Redis at the next sync.
func (h *Limiter) evicted(_ string, c *counter) {
	c.dead.Store(true)
	h.forget(c)
	if c.retire() {
		h.mark(c)
		return
	}
	h.fold(c)
}

// fold adds a counter that leaves for good to the retired statistics.
func (h *Limiter) fold(c *counter) {
	c.mu.Lock()
	t := c.takeTick()
	c.mu.Unlock()
	h.st.retiredAllowed.Add(c.allowed.Swap(0) + t>>32)
	h.st.retiredDenied.Add(c.denied.Swap(0))
	h.st.retiredWaited.Add(c.waited.Swap(0))
}

// Flush reconciles with Redis now: every unused lease is given back and
// every count admitted on credit is reported, so that right after it the
// counts in Redis are exactly what this instance admitted. The next
// decisions lease again. It returns the first error met.
func (h *Limiter) Flush(ctx context.Context) error {
	if h.closed.Load() {
		return ratelimit.ErrClosed
	}
	h.draining.Add(1)
	defer h.draining.Add(-1)
	h.retireAll()
	// A pass can leave debts behind (a grant that arrived in it goes back
	// as a debt): run passes until nothing is owed, a few at most.
	for i := 0; ; i++ {
		if err := h.syncer.Flush(ctx); err != nil {
			return err
		}
		if h.syncer.Pending() == 0 || i == 3 {
			return nil
		}
	}
}

func (h *Limiter) retireAll() {
	h.table.Range(func(_ string, c *counter) bool {
		if c.retire() {
			h.mark(c)
		}
		return true
	})
}

// Close gives every unused lease back, reports every count, stops the
// background syncer and waits for every goroutine the Limiter started. It is
// idempotent; decisions after Close return ratelimit.ErrClosed. The final
// flush gets up to 2 seconds or 5 timeouts, whichever is longer; what it
// could not give back is reported in the error (and stays counted in Redis
// until its window ends: the safe side).
func (h *Limiter) Close() error {
	h.closeOnce.Do(func() {
		h.closed.Store(true)
		h.draining.Add(1)
		h.inflight.Wait()
		h.retireAll()
		ctx, cancel := context.WithTimeout(context.Background(), max(defaultFinalFlushBudget, 5*h.cfg.timeout))
		defer cancel()
		h.closeErr = h.syncer.Close(ctx)
		if h.cfg.instances == 0 {
			hctx, hcancel := context.WithTimeout(context.Background(), h.cfg.timeout)
			h.heartbeat(hctx, false)
			hcancel()
		}
	})
	return h.closeErr
}
