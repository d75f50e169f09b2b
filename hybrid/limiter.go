package hybrid

// The Limiter, and one decision through it, top to bottom:
//
//  1. AllowN checks its input and reads the clock once: now.
//  2. find (keys.go): the key's counter, from the index without a lock,
//     or from the table. A key the table does not hold goes to slow,
//     where its first decision in two windows is one exact call made
//     without a counter (first.go); its counter is made (lookup) when it
//     is asked again, or when the call's reply needs one.
//  3. counter.take (counter.go): n from the lease in hand with one CAS:
//     allowed; or denied while Redis refused the key. No Redis, no
//     allocation, no lock.
//  4. slow, for a decision the lease in hand cannot take:
//     a. counter.roll: to the lease taken ahead for the next window, once
//        it has begun; then take again;
//     b. Optimistic mode: counter.onCredit admits on credit, within the
//        instance's share of the window;
//     c. the breaker is open: counter.fallback (failure.go) decides by
//        the failure mode;
//     d. ask: the key's one lease call, sized by the state machine
//        (call.go, policy.go), shared by the key's concurrent decisions
//        and queued with every other key's into one pipeline (queue.go,
//        pipe.go), or sent by the caller itself when it is the only
//        decision waiting (queue.own, syncer.go's sendOwn); wait for it,
//        at most the timeout, then take again (3);
//     e. no reply in time: counter.slowReply (failure.go), or the failure
//        mode once the breaker opened.
//  5. The syncer (sync.go) visits marked keys every sync interval: it
//     plans each (plan.go: refunds, credit, top-ups, the next window's
//     lease), sends the calls in one pipeline, and applies the replies
//     (apply.go).

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	gosync "sync"
	"sync/atomic"
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
	p     *params
	cfg   config
	clock func() time.Time // WithClock; nil: time.Now and Redis TIME
	start time.Time        // the base of every instant (mono)
	clk   *serverClock

	table  *local.Table[*counter]
	seen   *seen    // keys decided without a counter (first.go)
	held   held     // the keys the table holds, by hash (keys.go)
	crowd  crowd    // how many calls the round trips decisions wait on carry (first.go)
	index  keyIndex // key -> *counter: the lock-free read path in front of table, for keys used more than once (see lookup, index.go)
	syncer *bgsync.Syncer[*counter]
	wheel  wheel        // visits the syncer scheduled
	asks   *router      // decisions' calls, sent in shared pipelines per Redis node
	spent  *spentSignal // the fleet's word of windows spent (spent.go); nil but for FixedWindow and SlidingWindow in Strict mode
	pipe   pipe
	health health

	seq        atomic.Int64 // sequence of lease calls
	exacts     atomic.Int64 // exact calls on their way
	lostExacts atomic.Int64 // exact calls that got no reply
	// ownLate: until this mono ns, a decision's own call runs on a runner
	// (see sendOwn): one given only until its decision's wait ended got no
	// reply in time
	ownLate  atomic.Int64
	asking   atomic.Int64 // decisions waiting on a call they sent or queued (see own)
	draining atomic.Int32 // Flush or Close in progress: give back, do not lease

	closed    atomic.Bool
	closeOnce gosync.Once
	closeErr  error
	gate      gosync.RWMutex   // slow-path decisions hold it shared while they join inflight; Close takes it
	inflight  gosync.WaitGroup // slow-path decisions and the senders of their calls, so Close can wait for them
	calls     gosync.WaitGroup // goroutines of Redis calls (see pipe.bounded)

	st stats
}

type stats struct {
	roundTrips, syncRoundTrips, leases, leasedUnits, refunded, reported atomic.Uint64
	flushErrors, fallback, noReply, leasedAhead, exact, spentDenied     atomic.Uint64
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
	if err := limit.ValidateFor(cfg.algorithm); err != nil {
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
	h := &Limiter{p: newParams(limit, cfg), cfg: cfg, clock: cfg.clock}
	h.start = cfg.now()
	h.clk = newServerClock(h.start.UnixMicro(), limit.Period, offsetMaxAge)
	h.pipe = pipe{client: client, mono: h.mono, runners: &runners{wg: &h.calls}, roundTrips: &h.st.roundTrips, ctxBound: honorsDeadlines(client)}
	h.pipe.timed.init(client, cfg.timeout, cfg.callTimeout())
	h.asks = newRouter(client, func() *queue {
		gap := func() time.Duration { return gapFor(2 * time.Duration(h.clk.ErrorBound())) } // the kept sample's round trip
		return &queue{maxInFlight: pipelinesPerNode, gap: gap, mono: h.mono, wg: &h.inflight, send: func(batch []queued) {
			ctx, cancel := context.WithTimeout(context.Background(), cfg.callTimeout())
			defer cancel()
			h.st.syncRoundTrips.Add(1)
			h.crowd.add(len(batch))
			h.send(ctx, batch)
		}, sendOwn: h.sendOwn}
	})
	if (cfg.algorithm == ratelimit.FixedWindow || cfg.algorithm == ratelimit.SlidingWindow) && cfg.mode == Strict {
		h.spent = newSpentSignal(client, cfg.prefix)
	}
	h.wheel.interval = int64(cfg.syncInterval)
	h.health.init(h, cfg)
	h.table = local.NewTable[*counter](cfg.maxKeys, h.evicted)
	h.seen = newSeen(cfg.maxKeys)
	h.held = newHeld(h.seen)
	s, err := bgsync.New[*counter](h.flush,
		bgsync.WithInterval(cfg.syncInterval),
		bgsync.WithTimeout(cfg.callTimeout()),
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
		h.health.heartbeat(ctx, true)
		cancel()
	}
	if h.signals(h.facts()) {
		h.listen() // (before the first decision: the fleet's word is heard from the start)
	}
	return h, nil
}

// Limit returns the limit the Limiter enforces.
func (h *Limiter) Limit() ratelimit.Limit { return h.p.limit }

// Algorithm returns the window algorithm the Limiter counts with.
func (h *Limiter) Algorithm() ratelimit.Algorithm { return h.p.alg }

// Allow is shorthand for AllowN(ctx, key, 1).
func (h *Limiter) Allow(ctx context.Context, key string) (ratelimit.Decision, error) {
	return h.AllowN(ctx, key, 1)
}

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
// ratelimit.ErrInvalidN for n <= 0 or n above the capacity (Rate for the
// window algorithms, Burst for the buckets), ratelimit.ErrClosed after
// Close, and ctx's error when ctx ends first. (ctx's deadline bounds the
// decision's Redis call too; a cancellation is seen when a call the
// decision sent itself returns, within the timeout: see
// docs/failure-modes.md, "Every call keeps its bounds".)
func (h *Limiter) AllowN(ctx context.Context, key string, n int) (ratelimit.Decision, error) {
	// decide, written out: the hot path's calls are few, and a Decision
	// copied from one call less.
	if h.closed.Load() || key == "" || n <= 0 || int64(n) > h.p.capacity {
		if err := h.check(key, n); err != nil {
			return ratelimit.Decision{}, err
		}
	}
	var now int64 // mono, inlined
	if h.clock == nil {
		now = int64(time.Since(h.start))
	} else {
		now = int64(h.clock().Sub(h.start))
	}
	c, hk := h.find(key)
	if c == nil { // the table holds no counter of the key: see first
		d, _, err := h.slow(ctx, nil, key, hk, int64(n), now, nil)
		return d, err
	}
	var d ratelimit.Decision
	if _, v, ok := c.take(h.p, int64(n), now, &d); ok {
		h.tell(c, v)
		return d, nil
	}
	d, _, err := h.slow(ctx, c, key, 0, int64(n), now, nil)
	return d, err
}

// decide is AllowN, which also returns the lease an admission took n from
// (or holds its credit on), and waits on Redis until expired closes when
// given one (a deadline shared by the limits of a Multi).
func (h *Limiter) decide(ctx context.Context, key string, n int, expired <-chan struct{}) (ratelimit.Decision, *lease, error) {
	if err := h.check(key, n); err != nil {
		return ratelimit.Decision{}, nil, err
	}
	now := h.mono()
	c := h.lookup(key)
	var d ratelimit.Decision
	if l, v, ok := c.take(h.p, int64(n), now, &d); ok {
		h.tell(c, v)
		return d, l, nil
	}
	return h.slow(ctx, c, key, 0, int64(n), now, expired)
}

// check returns the error of a decision of n units for key before any
// work: ratelimit.ErrClosed, ErrInvalidKey or ErrInvalidN.
func (h *Limiter) check(key string, n int) error {
	switch {
	case h.closed.Load():
		return ratelimit.ErrClosed
	case key == "":
		return check.Key(key)
	case n <= 0 || int64(n) > h.p.capacity:
		return check.N(h.p.limit, h.p.alg, n)
	}
	return nil
}

// slow decides what the lease in hand cannot (see the map at the top of
// this file). It waits on Redis at most the timeout, or until expired
// closes when the caller gives one. With c nil (the table holds no counter
// of key) it tries first, with hk, the key's hash from find or 0.
func (h *Limiter) slow(ctx context.Context, c *counter, key string, hk uint64, n, now int64, expired <-chan struct{}) (ratelimit.Decision, *lease, error) {
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
	var deadline time.Time // the timer's, once set
	defer func() {
		if timer != nil {
			timer.Stop() // (since Go 1.23 a stopped timer sends nothing stale once Reset)
			timers.Put(timer)
		}
	}()
	p := h.p
	for attempt := 0; ; attempt++ {
		var e *exactCall
		var err error
		var f fleet
		var v visit
		made := false // the call of a key's first decision (first.go) is e
		if c == nil {
			w := waitFor{ctx: ctx, expired: expired}
			if expired == nil {
				timer = timers.Get().(*time.Timer)
				timer.Reset(h.cfg.timeout)
				deadline = time.Now().Add(h.cfg.timeout)
				w.timeout, w.deadline = timer.C, deadline
			}
			t := h.first(key, hk, n, now, w)
			if t.done {
				return t.d, nil, nil
			}
			c = h.lookupSeeded(key, t.seed)
			if t.e != nil {
				t.e.c = c // (the reply is in: nothing else reads c)
			}
			e, err, made = t.e, t.err, t.e != nil || t.err != nil
		}
		if !made {
			if c.dead.Load() {
				c = h.lookup(key)
			}
			if attempt > 0 {
				now = h.mono()
			}
			if attempt == 1 {
				c.waited.Add(1) // the decision waited on Redis
			}
			f = h.facts()
			// a. the lease taken ahead, once its window has begun
			var rolled bool
			rolled, v = c.roll(p, now, f)
			h.tell(c, v)
			if rolled || attempt > 0 {
				var d ratelimit.Decision
				if l, v, ok := c.take(p, n, now, &d); ok {
					h.tell(c, v)
					return d, l, nil
				}
			}
			// b. credit, in optimistic mode
			if p.mode == Optimistic && f.breaker == breaker.Closed {
				if d, l, v, ok := c.onCredit(p, n, now, p.optimisticShare(f), f); ok {
					h.tell(c, v)
					return d, l, nil
				}
			}
			if attempt >= maxLeaseAttempts {
				// Every grant was taken by concurrent callers before this one
				// got to it, again and again, while Redis kept granting: deny
				// rather than spin. (Exhaustion ends the loop sooner: Redis
				// answers with no grant and take denies until the reset.)
				c.refused(p, n, now)
				h.tell(c, visitSoon)
				return p.denied(p.interval, p.interval), nil, nil
			}
			// c. the breaker open: the failure mode
			if !h.health.brk.Allow() {
				h.st.fallback.Add(1)
				d, l, v := c.fallback(p, n, now, f)
				h.tell(c, v)
				return d, l, nil
			}
			// d. ask Redis, and wait
			w := waitFor{ctx: ctx, expired: expired}
			if expired == nil {
				if timer == nil {
					timer = timers.Get().(*time.Timer)
					timer.Reset(h.cfg.timeout)
					deadline = time.Now().Add(h.cfg.timeout)
				}
				w.timeout, w.deadline = timer.C, deadline
			}
			e, err = h.ask(c, n, now, w)
		}
		if err == nil && e != nil && e.late(h.clk.View()) {
			// counted, perhaps in the window after its own: given back,
			// and the decision taken again
			lc := c.lock()
			v := lc.settleExact(e, true)
			lc.unlock()
			h.tell(c, v)
			continue
		}
		if err == nil && e != nil {
			// a cold key's exact call: its reply is the decision
			if e.sw && e.res.plain && !e.admitted() {
				// a plain sliding call refused surely (see late): what
				// it counted goes back before the decision returns
				var fire <-chan time.Time
				if expired == nil && timer != nil {
					fire = timer.C
				}
				h.giveBackSliding(ctx, e, fire, expired)
			}
			h.st.exact.Add(1)
			if attempt == 0 {
				c.waited.Add(1)
			}
			f, now = h.facts(), h.mono()
			d, l, v := c.decideExact(p, e, now, f)
			h.tell(c, v)
			if d.Allowed && e.fills(p) && h.signals(f) {
				// This call filled a window of a limit too small to lease:
				// denied here until its end (no lease holds units to give
				// back), and the fleet hears it (spent.go).
				c.blockSpent(now, now+int64(d.ResetAfter))
				idx, _ := e.counted()
				h.tellSpent(idx, opSpent, c.key)
			}
			return d, l, nil
		}
		if e != nil { // its call failed: what it carried is settled on the safe side
			lc := c.lock()
			v := lc.settleExact(e, false)
			lc.unlock()
			h.tell(c, v)
		}
		if err != nil {
			// e. no reply in time
			if ctx.Err() != nil {
				return ratelimit.Decision{}, nil, ctx.Err()
			}
			if attempt == 0 {
				c.waited.Add(1)
			}
			now, f = h.mono(), h.facts()
			var d ratelimit.Decision
			var l *lease
			if f.breaker == breaker.Closed {
				h.st.noReply.Add(1)
				d, l, v = c.slowReply(p, n, now, f)
			} else {
				h.st.fallback.Add(1)
				d, l, v = c.fallback(p, n, now, f)
			}
			h.tell(c, v)
			return d, l, nil
		}
	}
}

// ask asks Redis for a decision of n units of the key at now, and waits
// as w says (at most until its timeout fires or the key's expiry closes),
// whatever the Redis client's own timeouts are. A cold key's decision is
// counted exactly: its exact call is returned with its reply. A warm key's
// lease call is sent, or the one on its way joined (a per-key
// singleflight), and the decision takes from the lease again once it is
// back (nil is returned). Either call goes out with every other call of
// that moment to the same Redis node, in one pipeline, or on its own when
// there is none (see queue).
func (h *Limiter) ask(c *counter, n, now int64, w waitFor) (*exactCall, error) {
	f := h.facts()
	lc := c.lock()
	fl := lc.inFlight()
	var e *exactCall
	var err error
	switch {
	case fl != nil: // joined
		lc.unlock()
		w.done = fl.Done()
		err = w.wait()
	case lc.out == nil && lc.cold(h.p, n, now, f):
		e = lc.newExact(h.p, h.clockID(), n, now, h.mono(), f)
		lc.unlock()
		h.exacts.Add(1)
		w.done, w.exact = e.done, e
		return e.waited(h.own(e, w))
	default:
		var id callID
		if lc.out == nil {
			id = h.newID()
		}
		k := lc.ask(h.p, id, n, now, f)
		if id.seq != 0 {
			lc.makePlain(h.p, k, now, f)
		}
		fl = lc.startFlight(k)
		lc.unlock()
		w.done = fl.Done()
		err = h.own(k, w)
	}
	if err != nil {
		return nil, err
	}
	return nil, fl.err
}

// wait waits until done closes, timeout fires, expired closes or ctx ends.
// It returns nil when done closed, else why it stopped waiting.
func wait(ctx context.Context, done <-chan struct{}, timeout <-chan time.Time, expired <-chan struct{}) error {
	select {
	case <-done:
		return nil
	case <-timeout:
		return context.DeadlineExceeded
	case <-expired:
		return context.DeadlineExceeded
	case <-ctx.Done():
		return ctx.Err()
	}
}

// own sends or queues t, a decision's call, and waits on w (see
// queue.own): sent by the caller itself only when no other decision of h
// waits on Redis meanwhile (w.alone). Where several do (ratelimitd's
// clients, the sim's 4 callers an instance), their calls go in the
// queue's batches, gathered by its sender (awaitReturn), as before: a
// caller sending its own call there split them (ratelimitd's 10,000
// per-second keys at 16 clients about a tenth slower).
func (h *Limiter) own(t queued, w waitFor) error {
	w.alone = h.asking.Add(1) == 1
	err := h.asks.own(t, w)
	h.asking.Add(-1)
	return err
}

// waitFor is what a decision waits on: done, closed once its call is
// answered, unless its timeout fires, the key's expiry closes or its
// context ends first (see wait). deadline is when the timeout fires
// (zero: no timeout, or not known).
type waitFor struct {
	ctx      context.Context
	done     <-chan struct{}
	timeout  <-chan time.Time
	expired  <-chan struct{}
	deadline time.Time
	// alone: no other decision of the Limiter waits on Redis (see own)
	alone bool
	// exact: the decision's exact call, when done is its: a caller that
	// sends its own call and finds its wait ended once the call returns
	// abandons it before it is answered (see sendOwn)
	exact *exactCall
}

func (w waitFor) wait() error { return wait(w.ctx, w.done, w.timeout, w.expired) }

// left reports, without waiting, why the decision's wait has ended
// (its timeout fired, the key's expiry closed, its context ended), or
// nil while it has not.
func (w waitFor) left() error {
	select {
	case <-w.timeout:
		return context.DeadlineExceeded
	case <-w.expired:
		return context.DeadlineExceeded
	case <-w.ctx.Done():
		return w.ctx.Err()
	default:
		return nil
	}
}

// end is when the decision's wait ends at the latest, if it ends by then:
// the earlier of its deadline and its context's, but no later than
// limit; ok is false when the wait has no deadline (the key's expiry
// ends it).
func (w waitFor) end(limit time.Time) (end time.Time, ok bool) {
	if w.deadline.IsZero() {
		return time.Time{}, false
	}
	end = w.deadline
	if d, has := w.ctx.Deadline(); has && d.Before(end) {
		end = d
	}
	if limit.Before(end) {
		end = limit
	}
	return end, true
}

// waited returns exact call e with its error, once a wait for its reply
// (see wait) ended with err: or, when the decision stopped waiting first,
// nil and why (the reply, when it comes, is owed back: see answer).
func (e *exactCall) waited(err error) (*exactCall, error) {
	if err != nil && (e.abandon() || e.state.Load() == exactAbandoned) { // (sendOwn may have abandoned it for the decision)
		return nil, err
	}
	<-e.done // (when it stopped waiting, the reply came meanwhile: it is the decision's)
	return e, e.res.err
}

func (h *Limiter) mono() int64 {
	if h.clock != nil {
		return int64(h.clock().Sub(h.start))
	}
	return int64(time.Since(h.start))
}

// facts returns what the key's state machine needs to know of the fleet,
// now.
func (h *Limiter) facts() fleet {
	return fleet{
		instances:  h.health.instances(),
		tickGap:    h.health.tickGap.Load(),
		lastGap:    h.health.lastGap.Load(),
		draining:   h.draining.Load() > 0,
		breaker:    h.health.brk.State(),
		clock:      h.clk.View(),
		outageFrom: h.health.outageFrom.Load(),
		outageTo:   h.health.outageTo.Load(),
	}
}

// timers are the stopped timers of decisions that waited on Redis: one a
// waiting decision, without an allocation each.
var timers = gosync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}

// newID identifies a new lease call, and gives it the time to count at:
// WithClock's, or none (Redis TIME).
func (h *Limiter) newID() callID {
	id := h.clockID()
	id.seq, id.nonce = h.seq.Add(1), script.NewNonce(mrand.Uint64())
	return id
}

// clockID is a call's identity with only its time to count at: for a call
// never sent twice (an exact call), or not yet known to be sent (plan).
func (h *Limiter) clockID() callID {
	if h.clock != nil {
		return callID{now: h.clock().UnixMicro()}
	}
	return callID{}
}

// tell has the syncer visit c as v asks.
func (h *Limiter) tell(c *counter, v visit) {
	if v != visitNone { // (inlined: the decision path's usual case)
		c.mark(h.syncer, v)
	}
}

// do carries out the effects of a transition of c.
func (h *Limiter) do(c *counter, e effects) {
	h.st.leases.Add(e.leases)
	h.st.leasedUnits.Add(e.leasedUnits)
	h.st.leasedAhead.Add(e.leasedAhead)
	h.st.refunded.Add(e.refunded)
	h.st.reported.Add(e.reported)
	h.tell(c, e.visit)
}
