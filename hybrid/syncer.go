package hybrid

import (
	"context"
	"fmt"
	gosync "sync"
	"time"

	"github.com/hybridlimit/ratelimit/internal/breaker"
)

// The Limiter's side of the background syncer (package sync): every tick,
// the marked keys are planned (plan.go), their calls sent in one pipeline,
// and the replies applied (apply.go).

// tick runs at the start of every sync tick, on the syncer goroutine.
func (h *Limiter) tick(ctx context.Context) {
	hl := &h.health
	hl.ticked(h.mono())
	if hl.brk.State() != breaker.Closed || hl.brk.Failures() > 0 {
		hl.probe(ctx)
	}
	h.sendNotes(ctx)
	for _, c := range h.wheel.due(h.mono()) {
		if !c.dead.Load() {
			h.tell(c, visitNow)
		}
	}
	if h.cfg.instances == 0 && h.mono() >= hl.nextBeat {
		hl.nextBeat = h.mono() + beatGap(h.cfg.heartbeatEvery, hl.beats)
		hl.beats++
		hctx, cancel := context.WithTimeout(ctx, h.cfg.callTimeout())
		hl.heartbeat(hctx, true)
		cancel()
	}
}

// flush is the syncer's FlushFunc: for every counter of the batch it plans
// what the counter owes or needs, sends the calls in one pipeline, and
// applies the replies. It returns the counters that still hold quota, owe
// something or wait for a reply, to be visited again.
func (h *Limiter) flush(ctx context.Context, batch []*counter) ([]*counter, error) {
	now := h.mono()
	var calls []queued
	for _, c := range batch {
		if k := h.plan(c, now); k != nil {
			calls = append(calls, k)
		}
	}
	var err error
	if len(calls) > 0 {
		err = h.send(ctx, calls)
	}
	again := batch[:0]
	for _, c := range batch {
		lc := c.lock()
		owes := lc.awaitsTick()
		holds := lc.cur.Load() != nil || lc.next != nil
		lc.unlock()
		switch {
		case owes:
			again = append(again, c) // the next tick sends it
		case c.dead.Load() && holds:
			again = append(again, c)
		case c.dead.Load():
			h.archive(c)
		}
	}
	return again, err
}

// plan runs the key's state machine at a tick and returns the call to
// send for it, if any, on its way.
func (h *Limiter) plan(c *counter, now int64) *leaseCall {
	c.dirty.Store(false)
	c.touched.Store(false) // its next use tells the LRU table again
	f := h.facts()
	lc := c.lock()
	defer lc.unlock()
	t, v := lc.observe(h.p, now, f)
	t.dead = c.dead.Load()
	if t.quiet && !t.dead && now-t.lastUse >= idlePeriods*h.p.periodNS &&
		h.table.RemoveIf(c.key, func(v *counter) bool { return v == c }) {
		// idle for idlePeriods whole periods: the key leaves the table
		h.left(c)
		t.dead = true
	}
	k, at := lc.plan(h.p, h.clockID(), t, f)
	if k != nil {
		if k.seq() == 0 {
			k.identify(h.newID())
		}
		lc.startFlight(k)
	}
	if at > 0 {
		h.wheel.visitAt(lc, at, now)
	}
	h.tell(c, v)
	return k
}

// send sends the calls of batch in one pipeline and applies the replies:
// lease calls' grants go into their keys' leases (a call whose reply was
// not seen stays outstanding, and the syncer sends it again); exact calls'
// replies go to the decisions waiting for them.
func (h *Limiter) send(ctx context.Context, batch []queued) error {
	batch, buf, reqs, res := h.requests(batch)
	return h.answerAll(batch, buf, res, h.pipe.exec(ctx, reqs, res))
}

// sendOwn sends batch, a decision's own call (see queue.own), as send
// does, and returns w's answer. With a client that ends a call at its
// context's deadline (ctxBound), or a *redis.Client whose clone bounds it
// (timedClients), and a wait with a deadline, the pipeline runs on the
// caller's goroutine (no hand-off: a lone cold decision about a quarter
// faster on the 2-core VM), given until the wait's end: a reply
// later than that is not waited for, and the calls are in doubt, as an
// exchange abandoned at its deadline leaves them (see ownLate). A caller
// whose context ends meanwhile learns it when the pipeline returns, and
// goes then with its context's error, its exact call's reply owed back.
// Otherwise the pipeline runs on a runner while the caller waits on w:
// when the caller's wait ends first, it goes, and the exchange is
// finished (its replies read and applied, a call's reply owed back as
// when any wait ends first) on a goroutine of its own. after runs once
// the exchange is finished, on whichever goroutine finished it.
func (h *Limiter) sendOwn(batch []queued, w waitFor, after func()) error {
	now := time.Now()
	limit := now.Add(h.cfg.callTimeout())
	end, inline := w.end(limit)
	inline = inline && h.pipe.inlines() && h.mono() >= h.ownLate.Load()
	if !inline {
		end = limit
	}
	ctx, cancel := context.WithDeadline(context.Background(), end)
	h.st.syncRoundTrips.Add(1)
	h.crowd.add(len(batch))
	batch, buf, reqs, res := h.requests(batch)
	e := h.pipe.newRun(ctx, reqs)
	finish := func(ok bool) {
		var x exchange
		if ok {
			x = e.read(res)
		}
		x.own = inline
		h.answerAll(batch, buf, res, x) // (its error went to the breaker, and each call's to the call)
		cancel()
		after()
	}
	if inline {
		// (A read that timed out may return before ctx says its deadline
		// passed: the clock decides.)
		ok := h.pipe.bounded(ctx, e) && time.Now().Before(end)
		err := w.left()
		if err != nil && w.exact != nil {
			w.exact.abandon() // (before its answer: the reply is owed back, as when it leaves a wait)
		}
		finish(ok)
		if err != nil {
			return err
		}
		return w.wait()
	}
	h.pipe.start(e)
	var err error
	select {
	case <-e.done:
		finish(true)
		return w.wait()
	case <-ctx.Done():
		finish(false)
		return w.wait()
	case <-w.timeout:
		err = context.DeadlineExceeded
	case <-w.expired:
		err = context.DeadlineExceeded
	case <-w.ctx.Done():
		err = w.ctx.Err()
	}
	go func() {
		select {
		case <-e.done:
			finish(true)
		case <-ctx.Done():
			finish(false)
		}
	}()
	return err
}

// requests returns batch with the notes to send beside it (withNotes),
// and a buffer with their requests and room for their results.
func (h *Limiter) requests(batch []queued) ([]queued, *sendBuf, []request, []result) {
	batch = h.withNotes(batch)
	buf := sendBufs.Get().(*sendBuf)
	reqs, res := buf.grow(len(batch))
	for i, q := range batch {
		reqs[i] = q.request()
	}
	return batch, buf, reqs, res
}

// answerAll applies the results res of batch, sent in exchange x, with
// buf, which held their requests: what send does once the pipeline is
// over or abandoned.
func (h *Limiter) answerAll(batch []queued, buf *sendBuf, res []result, x exchange) error {
	if x.ok {
		defer buf.release()
	} // (else a pipeline abandoned at its deadline may still read reqs: buf is left to it)
	if !x.ok {
		// No reply at all within a call's deadline: Redis is away, not
		// slow. The breaker opens now.
		err := fmt.Errorf("hybrid: no reply from Redis in time: %w", context.DeadlineExceeded)
		for i, q := range batch {
			res[i].err = err
			h.answer(q, res[i], x)
		}
		if x.own {
			// Or a decision's own call, given only until the decision's
			// own wait ended: slow perhaps, not away. A while of lone
			// calls through a runner, at a call's deadline, tells.
			h.ownLate.Store(h.mono() + int64(h.cfg.callTimeout()))
			return err
		}
		h.health.brk.Trip()
		h.health.failed(err)
		return err
	}
	var first error
	fresh := false // a call was applied anew: Redis writes, not only answers
	noted := false // a note failed: the pipeline's error may be its
	for i, q := range batch {
		if _, ok := q.(*spentNote); ok {
			noted = noted || res[i].err != nil
			h.answer(q, res[i], x)
			continue
		}
		if err := res[i].err; err != nil && first == nil {
			first = err
		}
		if k, ok := q.(*leaseCall); !ok || !k.resent() {
			fresh = fresh || res[i].err == nil
		}
		h.answer(q, res[i], x)
	}
	if first == nil && !noted {
		first = x.err // (a note refused is no failure of Redis: see noteSent)
	}
	if first != nil {
		h.health.failed(first)
		return first
	}
	if fresh {
		// (A pipeline of resent calls only tells nothing: a Redis out of
		// memory answers them, and refuses every write.)
		h.health.brk.Success()
		h.health.healed()
	}
	return nil
}

// sendBuf holds a batch's requests and results while send sends it: kept
// for the next batch, not allocated for each.
type sendBuf struct {
	reqs []request
	res  []result
	n    int // the length grow last returned: what release clears
}

var sendBufs = gosync.Pool{New: func() any { return new(sendBuf) }}

// grow returns n requests and n zero results.
func (b *sendBuf) grow(n int) ([]request, []result) {
	if cap(b.reqs) < n {
		b.reqs, b.res = make([]request, n), make([]result, n)
	}
	b.n = n
	return b.reqs[:n], b.res[:n]
}

// release clears what b refers to (the calls' closures, replies' errors)
// and keeps it, unless a batch made it large. Only what the last batch
// used is cleared: a buffer goes back to the pool only through release,
// so the rest is zero already (clearing all of a large one for a batch of
// a few calls cost about 5% of the instance's CPU on the sim's
// SlidingWindow cold row).
func (b *sendBuf) release() {
	if cap(b.reqs) > 1024 {
		return
	}
	clear(b.reqs[:b.n])
	clear(b.res[:b.n])
	sendBufs.Put(b)
}

// answer hands call q the result r of exchange x.
func (h *Limiter) answer(q queued, r result, x exchange) {
	switch q := q.(type) {
	case *spentNote:
		h.noteSent(r.err)
	case *slidingBack:
		q.res = r
		close(q.done)
	case *leaseCall:
		if r.err != nil {
			h.unanswered(q, r.err, r.notRun)
		} else {
			h.applyReply(q, r.reply, x)
		}
	case *exactCall:
		defer h.exacts.Add(-1)
		if r.err != nil && !x.ok {
			h.lostExacts.Add(1)
		}
		if r.err == nil {
			switch {
			case q.fw && r.plain && q.take.Now <= 0: // (Now is the estimate: no sample)
			case q.sw && r.plain: // (the same)
			case q.fw:
				h.clk.Observe(r.take.Now, x.before, x.after)
			case !q.call.bucket:
				h.clk.Observe(r.win.Now, x.before, x.after)
			}
		}
		if !q.answered(r, x) { // the decision left: what the call counted goes back
			c := q.c
			if c == nil {
				c = h.lookup(q.key) // (first: the decision left before the key had a counter)
			}
			lc := c.lock()
			v := lc.settleExact(q, true)
			lc.unlock()
			h.tell(c, v)
		}
	}
}

// applyReply applies the reply of call k to its key, ends its flight, and
// has the syncer visit the key (to schedule its next visits: to lease
// ahead of the next window, say).
func (h *Limiter) applyReply(k *leaseCall, r reply, x exchange) {
	if !k.bucket && !(r.plain && k.win.Now <= 0) {
		// (a plain lease's Now is this instance's own estimate, made
		// before the call went out: observed, it would pull the estimate
		// back by the call's wait each time, and claim the round trip's
		// error bound)
		h.clk.Observe(r.win.Now, x.before, x.after)
	}
	f := h.facts()
	lc := k.c.lock()
	e := lc.apply(h.p, k, r, x, f)
	if fl := k.flight; fl != nil {
		lc.endFlight(k, fl, nil, false)
	}
	lc.unlock()
	h.do(k.c, e)
	h.tell(k.c, visitSoon)
}

// unanswered ends the flight of a call whose reply was not seen: it stays
// outstanding, and the syncer sends it again (as new when it certainly did
// not run).
func (h *Limiter) unanswered(k *leaseCall, err error, notRun bool) {
	lc := k.c.lock()
	if fl := k.flight; fl != nil {
		lc.endFlight(k, fl, err, notRun)
	} else if lc.out == k {
		k.notRun = notRun
	}
	lc.unlock()
	h.tell(k.c, visitNow)
}

// wheel holds the visits the syncer scheduled for quiet keys, by tick.
type wheel struct {
	interval int64 // the sync interval, ns
	mu       gosync.Mutex
	at       map[int64][]*counter // sync tick -> counters to visit then
	done     int64                // the last tick whose visits are done
}

// visitAt schedules a visit of the key at the first tick at or after at,
// unless one is scheduled sooner.
func (w *wheel) visitAt(lc *lockedCounter, at, now int64) {
	t := at/w.interval + 1
	if lc.visitTick > now/w.interval && lc.visitTick <= t {
		return // one is due sooner
	}
	lc.visitTick = t
	w.mu.Lock()
	if w.at == nil {
		w.at = make(map[int64][]*counter)
	}
	w.at[t] = append(w.at[t], lc.counter())
	w.mu.Unlock()
}

// due returns the counters whose visit is due at now.
func (w *wheel) due(now int64) []*counter {
	tick := now / w.interval
	w.mu.Lock()
	var due [][]*counter
	for t := w.done + 1; t <= tick; t++ {
		if cs, ok := w.at[t]; ok {
			due = append(due, cs)
			delete(w.at, t)
		}
	}
	w.done = max(w.done, tick)
	w.mu.Unlock()
	var out []*counter
	for _, cs := range due {
		for _, c := range cs {
			lc := c.lock()
			ok := lc.visitTick != 0 && lc.visitTick <= tick
			if ok {
				lc.visitTick = 0
			}
			lc.unlock()
			if ok {
				out = append(out, c)
			}
		}
	}
	return out
}
