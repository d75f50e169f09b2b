package hybrid

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/breaker"
	"github.com/hybridlimit/ratelimit/internal/script"
)

// op is one lease-script call for a counter.
type op struct {
	c    *counter
	call call
	f    *flight // the decisions waiting for it, if any
}

// tick runs at the start of every sync tick, on the syncer goroutine.
func (h *Limiter) tick(ctx context.Context) {
	now := h.mono()
	if h.lastTick > 0 {
		// the time from one tick to the next: the interval, plus what the
		// previous pass took (or the backoff), smoothed
		gap := now - h.lastTick
		h.tickGap.Store((h.tickGap.Load() + gap) / 2)
		h.lastGap.Store(gap)
	}
	h.lastTick = now
	if h.brk.State() != breaker.Closed || h.brk.Failures() > 0 {
		h.probe(ctx)
	}
	h.visitDue()
	if h.cfg.instances == 0 && h.mono() >= h.nextBeat {
		h.nextBeat = h.mono() + int64(h.cfg.heartbeatEvery)
		hctx, cancel := context.WithTimeout(ctx, h.callTimeout())
		h.heartbeat(hctx, true)
		cancel()
	}
}

// probe asks Redis, in the background, whether it serves lease calls: when
// the breaker is open (so that it closes even when no decision and no flush
// asks Redis anything), and when a call failed lately (so that an outage
// opens it after a few ticks even when few calls are made, for few keys).
// The probe is a lease call that asks for nothing and writes nothing: like
// the real ones, Redis refuses it when out of memory.
func (h *Limiter) probe(ctx context.Context) {
	a := script.LeaseArgs{Base: h.probeBase, Kind: h.kind, Limit: h.limit, Instances: 1, Min: 1}
	pctx, cancel := context.WithTimeout(ctx, h.cfg.timeout)
	defer cancel()
	err := h.callErr(pctx, func(ctx context.Context) error {
		return script.Lease.Run(ctx, h.client, a.Keys(), a.Args()...).Err()
	})
	h.st.roundTrips.Add(1)
	if err == nil {
		h.brk.Success()
	} else {
		h.noteErr(err)
		h.brk.Failure()
	}
}

// heartbeat registers (or, with join false, removes) this instance and
// learns how many instances share the quota.
func (h *Limiter) heartbeat(ctx context.Context, join bool) {
	live := int64(h.cfg.heartbeatEvery.Milliseconds()) * instanceLivenessFactor
	flag := "1"
	if !join {
		flag = "0"
	}
	err := h.callErr(ctx, func(ctx context.Context) error {
		n, err := script.Instances.Run(ctx, h.client, []string{script.InstancesKey(h.cfg.prefix)}, h.id, live, flag).Int64()
		h.st.roundTrips.Add(1)
		if err == nil && n > 0 {
			h.liveInstances.Store(n)
			h.learned.Store(true)
		}
		return err
	})
	h.noteErr(err)
}

// flush is the syncer's FlushFunc: for every counter of the batch it turns
// what the counter owes or needs into lease-script calls, sends them all in
// one pipeline, and applies the replies. It returns the counters that still
// hold quota, owe something or wait for a reply, to be visited again.
func (h *Limiter) flush(ctx context.Context, batch []*counter) ([]*counter, error) {
	mono := h.mono()
	var ops []op
	for _, c := range batch {
		ops = h.plan(ops, c, mono)
	}
	var err error
	if len(ops) > 0 {
		err = h.send(ctx, ops)
	}
	again := batch[:0]
	for _, c := range batch {
		c.mu.Lock()
		soon := len(c.debts) > 0 || c.call != nil
		holds := c.cur.Load() != nil || c.next != nil
		c.mu.Unlock()
		switch {
		case soon:
			again = append(again, c) // the next tick sends it
		case c.dead.Load() && holds:
			again = append(again, c)
		case c.dead.Load():
			h.fold(c)
		}
	}
	return again, err
}

// plan appends to ops what to send for c: first every call whose reply was
// lost, sent again (Redis replays it if it can tell it was applied, and
// otherwise applies only its credit); then at most one new call, carrying
// what c owes per window (refunds and credit), a top-up of the current
// window when the key's demand is about to outrun its lease, and, within
// its lead of the window's end, the next window's quota for a key in use in
// this window.
func (h *Limiter) plan(ops []op, c *counter, mono int64) []op {
	c.dirty.Store(false)
	c.touched.Store(false) // its next use tells the LRU table again
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reportLate()
	t := c.takeTick()
	m := c.missed.Swap(0)
	c.allowed.Add(t >> 32)
	c.denied.Add(m >> 32)
	asked := int64(uint32(t)) + int64(uint32(m))
	if c.planned > 0 && mono > c.planned {
		c.rate = (c.rate + float64(asked)*float64(h.periodNS)/float64(mono-c.planned)) / 2
	}
	c.planned = mono
	quiet := asked == 0

	dead := c.dead.Load()
	lastUse := c.lastUse.Load()
	if quiet && !dead && mono-lastUse >= idlePeriods*h.periodNS {
		// idle for idlePeriods whole periods: the key leaves the table
		if h.table.RemoveIf(c.key, func(v *counter) bool { return v == c }) {
			c.dead.Store(true)
			h.forget(c)
			dead = true
		}
	}
	draining := h.draining.Load() > 0
	h.rollLocked(c, mono)
	idx, end := h.windowOf(c, mono)
	if idx != c.askedIdx {
		if idx == c.askedIdx+1 {
			c.prevAsked = c.asked
		} else {
			c.prevAsked = 0
		}
		c.askedIdx, c.asked = idx, 0
	}
	c.asked += asked
	gap := h.idleGap(c, mono)
	if h.bucket {
		return h.planBucket(ops, c, mono, quiet, dead, draining, lastUse, gap)
	}
	// While Flush or Close drains, a lease installed since they retired the
	// counters (a reply of the tick they waited for) goes back too. So does
	// quota leased ahead of its window and never used by a key gone quiet.
	if l := c.cur.Load(); l != nil && (mono >= l.end || dead || draining || (l.pre && mono-max(lastUse, l.start) >= gap)) {
		c.cur.Store(nil)
		if mono >= l.end {
			c.nextIdx = max(c.nextIdx, l.idx+1)
		}
		c.retireLease(l, h.moot(l.idx, mono))
	}
	if l := c.next; l != nil && (dead || draining || mono-lastUse >= max(gap, h.periodNS)) {
		c.next = nil
		c.retireLease(l, h.moot(l.idx, mono))
	}
	cur := c.cur.Load()
	owedCredit(c)

	if c.flight != nil {
		// A call is on its way (a decision's): what else is owed waits for
		// its reply.
		if !dead {
			h.scheduleLocked(c, mono, end, lastUse, gap)
		}
		return ops
	}
	if k, ok := h.resend(c); ok {
		// The last call's reply was lost: it goes again, alone.
		return h.launch(ops, c, k)
	}
	a := h.newCall(c)
	h.attachDebts(c, &a, mono)
	// In use in this window or the last, and not quiet for longer than a
	// key of its rate stays quiet: a key used a couple of times a window
	// may not have been used yet this window when its lead comes.
	inUse := (c.asked > 0 || c.prevAsked > 0) && mono-lastUse < max(gap, idlePeriods*h.periodNS)
	active := inUse
	if c.asked > 0 || c.prevAsked == 0 {
		active = active && mono-lastUse < gap
	}
	if inUse && !dead && !draining && h.brk.State() != breaker.Open {
		blocked := mono < c.blockedUntil.Load()
		switch {
		case blocked, !active:
		case cur == nil || !cur.known:
			if !quiet {
				// In use without quota of its own (its lease ran out, or it
				// lives on credit): lease in the background.
				a.Want = max(h.need(c, mono, end), h.floor())
			}
		case lowOn(cur, c.rate*float64(2*h.tickGap.Load())/float64(h.periodNS)):
			// about to run dry
			a.Want = max(h.need(c, mono, end)-cur.avail.Load(), h.floor())
		}
		// The next window is leased for a key asked in this one, however
		// long it has been quiet since: a process that spends a while
		// waiting (on Redis, on its CPUs) leaves its keys quiet for that
		// while, all at once, and had they lost their lease ahead each
		// would wait on Redis at the window's start, which makes the next
		// wait longer. Quota leased ahead for a key that then stays quiet
		// goes back soon after its window begins (above).
		if lead := max(c.lead, 2*h.tickGap.Load()); c.next == nil && end-mono <= lead && leaseAhead(c) && mono-lastUse < h.periodNS {
			a.WantNext = max(h.need(c, end, end+h.periodNS), h.floor())
			a.Lead = (lead + int64(h.cfg.syncInterval)) / 1000
		}
	}
	if !dead {
		h.scheduleLocked(c, mono, end, lastUse, gap)
	}
	if len(a.Adjust) > 0 || a.Want > 0 || a.WantNext > 0 {
		k := call{win: a}
		c.call = &sent{call: k}
		ops = h.launch(ops, c, k)
	}
	return ops
}

// leaseAhead reports whether c is worth leasing the next window for: it
// was asked at least twice in this window, or in this window and the
// last. A key an instance sees about once a window or less (many keys over
// many instances) would give a lease ahead back unused: a lease call and a
// refund call for nothing. Caller holds c.mu.
func leaseAhead(c *counter) bool {
	return c.asked >= 2 || (c.asked > 0 && c.prevAsked > 0)
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

// owedCredit turns the credit of c's current lease into a debt. Caller
// holds c.mu.
func owedCredit(c *counter) {
	if cur := c.cur.Load(); cur != nil {
		if cr := cur.credit.Swap(0); cr > 0 {
			c.owe(cur.idx, 0, cr)
		}
	}
}

// attachDebts moves what c owes into call a, as far as it holds them;
// debts of windows that no longer count are dropped. Caller holds c.mu.
func (h *Limiter) attachDebts(c *counter, a *script.LeaseArgs, mono int64) {
	kept := c.debts[:0]
	for _, d := range c.debts {
		switch {
		case h.moot(d.idx, mono):
		case len(a.Adjust) < script.MaxAdjust:
			a.Adjust = append(a.Adjust, script.Adjust{Idx: d.idx, Refund: d.refund, Use: d.use})
		default:
			kept = append(kept, d)
		}
	}
	c.debts = kept
}

// launch appends c's call k to ops, with a flight for decisions of the key
// to wait on. Caller holds c.mu.
func (h *Limiter) launch(ops []op, c *counter, k call) []op {
	f := &flight{done: make(chan struct{})}
	c.flight = f
	return append(ops, op{c: c, call: k, f: f})
}

// scheduleLocked arranges the next visit of a counter nothing may mark in
// the meantime (its key quiet): to lease the next window within its lead,
// to give back quota leased ahead if the key stays quiet, to give a
// SlidingWindow lease back when its window ends, to drop the key once idle
// for a period. Counters that owe something or wait for a reply are
// visited at the next tick anyway (the syncer offers them again). Caller
// holds c.mu.
func (h *Limiter) scheduleLocked(c *counter, mono, end, lastUse, gap int64) {
	at := lastUse + idlePeriods*h.periodNS // idle
	if cur := c.cur.Load(); cur != nil && h.bucket {
		at = min(at, lastUse+gap) // its tokens go back if it stays quiet
	} else if cur != nil {
		// A key in use is visited within its lead of the window's end, to
		// lease the next window if by then it is worth it (see leaseAhead):
		// a key leased by a decision early in a window has been asked once
		// when the syncer first sees it, and would otherwise never lease
		// ahead, waiting on Redis at every window's start.
		if t := end - c.lead; c.next == nil && (t > mono && (c.asked > 0 || c.prevAsked > 0) || leaseAhead(c)) {
			at = min(at, t)
		}
		if cur.pre {
			at = min(at, max(lastUse, cur.start)+gap)
		}
		if h.cfg.algorithm == ratelimit.SlidingWindow {
			at = min(at, cur.end)
		}
	}
	if c.next != nil {
		at = min(at, lastUse+gap, c.next.start)
	}
	h.visitAt(c, max(at, mono+1))
}

// send runs ops in one pipeline (go-redis splits it per Cluster node) and
// applies the replies. Calls that met NOSCRIPT (Redis lost its scripts: a
// restart, SCRIPT FLUSH) did not run: the script is loaded and they are sent
// again, at once. The pipeline gets until ctx's deadline, whatever the
// client's own timeouts: past it, every call of the pipeline is in doubt
// and its replies, should they come, are ignored.
func (h *Limiter) send(ctx context.Context, ops []op) error {
	var before, after int64
	var err error
	var cmds []*redis.Cmd // written by the call's goroutine: read only once it finished
	finished := h.bounded(ctx, func(ctx context.Context) {
		before = h.mono()
		cmds, err = h.exec(ctx, ops)
		if script.IsNoScript(err) || anyNoScript(cmds) {
			lerr := script.Lease.Load(ctx, h.client).Err()
			if lerr == nil && h.bucket {
				lerr = script.Bucket.Load(ctx, h.client).Err()
			}
			if lerr == nil {
				var again []op
				var at []int
				for i, cmd := range cmds {
					if script.IsNoScript(cmd.Err()) {
						again, at = append(again, ops[i]), append(at, i)
					}
				}
				if len(again) > 0 {
					before = h.mono()
					var redo []*redis.Cmd
					redo, err = h.exec(ctx, again)
					for j, i := range at {
						cmds[i] = redo[j]
					}
				}
			}
		}
		after = h.mono()
	})
	if !finished {
		// No reply at all within a call's deadline: Redis is away, not
		// slow. The breaker opens now.
		err := fmt.Errorf("hybrid: no reply from Redis in time: %w", context.DeadlineExceeded)
		for _, o := range ops {
			h.unanswered(o, err, false)
		}
		h.brk.Trip()
		h.failed(err)
		return err
	}
	var first error
	fresh := false // a call was applied anew: Redis writes, not only answers
	for i, o := range ops {
		v, cerr := cmds[i].Result()
		if cerr == nil && v == nil && err != nil {
			cerr = err // the pipeline failed before this call got a reply
		}
		if cerr == nil && o.call.bucket {
			var r script.BucketReply
			if r, cerr = script.ParseBucket(v); cerr == nil {
				fresh = fresh || !o.call.resent()
				h.appliedBucket(o.c, o.call, r, before)
				h.landed(o, nil)
				if o.f != nil {
					h.soon(o.c)
				}
				continue
			}
		}
		if cerr == nil {
			var r script.Reply
			if r, cerr = script.ParseLease(v); cerr == nil {
				fresh = fresh || !o.call.resent()
				h.applied(o.c, o.call.win, r, before, after)
				h.landed(o, nil)
				if o.f != nil {
					// a decision's lease: the syncer schedules the key's
					// next visits (to lease ahead of the next window)
					h.soon(o.c)
				}
				continue
			}
		}
		h.unanswered(o, cerr, notApplied(cerr))
		if first == nil {
			first = cerr
		}
	}
	if first == nil {
		first = err
	}
	if first != nil {
		h.failed(first)
		return first
	}
	if fresh {
		// (A pipeline of resent calls only tells nothing: a Redis out of
		// memory answers them, and refuses every write.)
		h.brk.Success()
	}
	return nil
}

// unanswered hands a call whose reply was not seen to the syncer, which
// sends it again (as new when it certainly did not run).
func (h *Limiter) unanswered(o op, err error, notRun bool) {
	o.c.mu.Lock()
	if o.c.call != nil && o.c.call.call.seq() == o.call.seq() {
		o.c.call.notApplied = notRun
	}
	o.c.mu.Unlock()
	h.mark(o.c)
	h.landed(o, err)
}

// failed records a failed exchange with Redis.
func (h *Limiter) failed(err error) {
	err = h.noteErr(err)
	h.st.flushErrors.Add(1)
	h.brk.Failure()
	h.emit(Event{Kind: EventFlushError, Err: err})
}

// callErr is bounded for one call: it returns fn's error, or ctx's when fn
// did not return in time.
func (h *Limiter) callErr(ctx context.Context, fn func(ctx context.Context) error) error {
	res := make(chan error, 1)
	h.calls.Add(1)
	go func() {
		defer h.calls.Done()
		res <- fn(ctx)
	}()
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// bounded runs fn on a goroutine the Limiter tracks and waits for it until
// ctx is done, whatever the Redis client's own timeouts: a call the client
// does not give up on by itself (one without ContextTimeoutEnabled waits its
// ReadTimeout) is abandoned there, and ends on its own later. It reports
// whether fn returned in time; only then may the caller read what fn
// wrote.
func (h *Limiter) bounded(ctx context.Context, fn func(ctx context.Context)) bool {
	done := make(chan struct{})
	h.calls.Add(1)
	go func() {
		defer h.calls.Done()
		fn(ctx)
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// landed tells the decisions waiting for o, if any, that it is over.
func (h *Limiter) landed(o op, err error) {
	if o.f == nil {
		return
	}
	o.c.mu.Lock()
	if o.c.flight == o.f {
		o.c.flight = nil
	}
	o.c.mu.Unlock()
	o.f.err = err
	close(o.f.done)
}

func (h *Limiter) exec(ctx context.Context, ops []op) ([]*redis.Cmd, error) {
	pipe := h.client.Pipeline()
	cmds := make([]*redis.Cmd, len(ops))
	for i := range ops {
		k := &ops[i].call
		cmds[i] = k.script().EvalSha(ctx, pipe, k.keys(), k.argv()...)
	}
	_, err := pipe.Exec(ctx)
	h.st.roundTrips.Add(1)
	return cmds, err
}

func anyNoScript(cmds []*redis.Cmd) bool {
	for _, cmd := range cmds {
		if script.IsNoScript(cmd.Err()) {
			return true
		}
	}
	return false
}

// notApplied reports whether a call that failed with err certainly did not
// run on Redis: the script was missing, the connection was refused its
// authentication, or no connection could be made.
// Any other failure leaves the call in doubt.
func notApplied(err error) bool {
	if script.IsNoScript(err) || redis.HasErrorPrefix(err, "NOAUTH") || redis.HasErrorPrefix(err, "WRONGPASS") {
		return true
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrClosed)
}

// visitAt schedules a visit of c by the syncer at the first tick at or after
// mono, unless one is scheduled sooner. Caller holds c.mu.
func (h *Limiter) visitAt(c *counter, mono int64) {
	iv := int64(h.cfg.syncInterval)
	t := mono/iv + 1
	if c.visit > h.mono()/iv && c.visit <= t {
		return // one is due sooner
	}
	c.visit = t
	h.wheelMu.Lock()
	if h.wheel == nil {
		h.wheel = make(map[int64][]*counter)
	}
	h.wheel[t] = append(h.wheel[t], c)
	h.wheelMu.Unlock()
}

// visitDue marks the counters whose visit is due. It runs at the start of
// every tick, on the syncer goroutine.
func (h *Limiter) visitDue() {
	now := h.mono() / int64(h.cfg.syncInterval)
	h.wheelMu.Lock()
	var due [][]*counter
	for t := h.wheelAt + 1; t <= now; t++ {
		if cs, ok := h.wheel[t]; ok {
			due = append(due, cs)
			delete(h.wheel, t)
		}
	}
	h.wheelAt = max(h.wheelAt, now)
	h.wheelMu.Unlock()
	for _, cs := range due {
		for _, c := range cs {
			c.mu.Lock()
			ok := c.visit != 0 && c.visit <= now
			if ok {
				c.visit = 0
			}
			c.mu.Unlock()
			if ok && !c.dead.Load() {
				h.mark(c)
			}
		}
	}
}
