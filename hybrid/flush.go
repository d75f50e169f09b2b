package hybrid

import (
	"context"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/internal/breaker"
)

// op is one lease-script call the syncer sends for a counter.
type op struct {
	c    *counter
	args global.LeaseArgs
	cmd  *redis.Cmd
}

// tick runs at the start of every sync tick, on the syncer goroutine.
func (h *Limiter) tick(ctx context.Context) {
	if h.brk.State() != breaker.Closed {
		// Probe in the background, so that the breaker closes even when no
		// decision and no flush asks Redis anything.
		pctx, cancel := context.WithTimeout(ctx, h.cfg.timeout)
		err := h.client.Ping(pctx).Err()
		cancel()
		h.st.roundTrips.Add(1)
		if err == nil {
			h.brk.Success()
		} else {
			h.brk.Failure()
		}
	}
	if h.cfg.instances == 0 && h.mono() >= h.nextBeat {
		h.nextBeat = h.mono() + int64(h.cfg.heartbeatEvery)
		h.heartbeat(ctx, true)
	}
}

// heartbeat registers (or, with join false, removes) this instance and
// learns how many instances share the quota.
func (h *Limiter) heartbeat(ctx context.Context, join bool) {
	live := int64(h.cfg.heartbeatEvery/time.Millisecond) * instanceLivenessFactor
	flag := "1"
	if !join {
		flag = "0"
	}
	n, err := global.InstancesScript.Run(ctx, h.client, []string{global.InstancesKey(h.cfg.prefix)}, h.id, live, flag).Int64()
	h.st.roundTrips.Add(1)
	if err == nil && n > 0 {
		h.liveInstances.Store(n)
	}
}

// flush is the syncer's FlushFunc: for every counter of the batch it turns
// what the counter owes or needs into lease-script calls, sends them all in
// one pipeline, and applies the replies. It returns the counters that still
// hold quota, owe something or wait for a reply, to be visited again.
func (h *Limiter) flush(ctx context.Context, batch []*counter) ([]*counter, error) {
	mono := h.mono()
	var (
		ops   []op
		again []*counter
	)
	for _, c := range batch {
		ops = h.plan(ops, c, mono)
	}
	var err error
	if len(ops) > 0 {
		err = h.send(ctx, ops)
	}
	for _, c := range batch {
		c.mu.Lock()
		keep := c.lease.Load() != nil || len(c.debts) > 0 || len(c.pending) > 0
		c.mu.Unlock()
		switch {
		case keep:
			again = append(again, c)
		case c.dead.Load():
			h.fold(c)
		}
	}
	return again, err
}

// plan appends to ops what to send for c: first every call whose reply was
// lost, sent again as it was so that Redis replays instead of applying it
// twice; then one call per window c owes (refund and credit); and, when the
// key is busy and nothing is in doubt, a top-up of its lease, carried by the
// last call.
//
// Replay protection keeps the reply of a key's latest call only, so a call
// sent again after a later one was applied gets the later reply. Only the
// last call of a key may ask for quota, and only when no call is in doubt:
// then a replayed reply can lose a grant (quota counted in Redis and never
// used, the safe side) but never install one twice.
func (h *Limiter) plan(ops []op, c *counter, mono int64) []op {
	c.dirty.Store(false)
	c.touched.Store(false) // its next use tells the LRU table again
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reportLate()
	t := c.takeTick()
	c.allowed.Add(t >> 32)
	used := int64(uint32(t))
	c.rate.store((c.rate.load() + float64(used)) / 2)

	idle := mono-c.lastUse.Load() >= h.periodNS && used == 0
	if idle && !c.dead.Load() {
		if h.table.RemoveIf(c.key, func(v *counter) bool { return v == c }) {
			c.dead.Store(true)
			h.forget(c)
		}
	}

	l := c.lease.Load()
	// While Flush or Close drains, a lease installed since they retired the
	// counters (a top-up reply of the tick they waited for) goes back too.
	if l != nil && (mono >= l.deadline || c.dead.Load() || h.draining.Load() > 0) {
		c.lease.Store(nil)
		if mono >= l.deadline {
			c.nextIdx = max(c.nextIdx, l.idx+1)
		}
		c.drop(l)
		l = nil
	}
	if l != nil {
		if cr := l.credit.Swap(0); cr > 0 {
			c.owe(l.idx, 0, cr)
		}
	}
	inDoubt := len(c.pending) > 0
	for _, p := range c.pending {
		ops = append(ops, op{c: c, args: p})
	}
	newCall := func() global.LeaseArgs {
		return global.LeaseArgs{
			Base: c.base, Algorithm: h.cfg.algorithm, Limit: h.limit,
			RefundIdx: -1, UseIdx: -1, Min: 1, Instances: h.instances(), Instance: h.id,
			// One limiter-wide sequence: a key's counter can be dropped
			// and made again, and Redis must never take the new counter's
			// first call for a replay of the old one's.
			Seq: h.seq.Add(1),
		}
	}
	var calls []global.LeaseArgs
	for _, d := range c.debts {
		a := newCall()
		a.RefundIdx, a.Refund, a.UseIdx, a.Use = d.idx, d.refund, d.idx, d.use
		calls = append(calls, a)
	}
	c.debts = c.debts[:0]
	if !inDoubt && !c.dead.Load() && used > 0 && h.draining.Load() == 0 && h.brk.State() != breaker.Open {
		target := h.target(c)
		var have int64
		if l != nil && l.known {
			have = l.avail.Load()
		}
		if have < target/2+1 {
			if len(calls) == 0 {
				calls = append(calls, newCall())
			}
			calls[len(calls)-1].Want = target - have
		}
	}
	for _, a := range calls {
		c.pending = append(c.pending, a)
		ops = append(ops, op{c: c, args: a})
	}
	return ops
}

// send runs ops in one pipeline (go-redis splits it per Cluster node) and
// applies the replies. Scripts missing after a Redis restart are loaded and
// the pipeline sent again: the calls that did run replay their replies.
func (h *Limiter) send(ctx context.Context, ops []op) error {
	before := h.mono()
	err := h.exec(ctx, ops)
	if isNoScript(err) || anyNoScript(ops) {
		if lerr := global.LeaseScript.Load(ctx, h.client).Err(); lerr == nil {
			before = h.mono()
			err = h.exec(ctx, ops)
		}
	}
	after := h.mono()
	var first error
	for _, o := range ops {
		v, cerr := o.cmd.Result()
		if cerr == nil {
			var res global.Lease
			if res, cerr = global.ParseLease(v); cerr == nil {
				h.applied(o, res, before, after)
				continue
			}
		}
		if first == nil {
			first = cerr
		}
	}
	if first == nil {
		first = err
	}
	if first != nil {
		h.st.flushErrors.Add(1)
		h.brk.Failure()
		h.emit(Event{Kind: EventFlushError, Err: first})
		return first
	}
	h.brk.Success()
	return nil
}

func (h *Limiter) exec(ctx context.Context, ops []op) error {
	pipe := h.client.Pipeline()
	for i := range ops {
		ops[i].cmd = global.LeaseScript.EvalSha(ctx, pipe, ops[i].args.Keys(), ops[i].args.Args()...)
	}
	_, err := pipe.Exec(ctx)
	h.st.roundTrips.Add(1)
	return err
}

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

func anyNoScript(ops []op) bool {
	for _, o := range ops {
		if isNoScript(o.cmd.Err()) {
			return true
		}
	}
	return false
}

// applied handles the reply of a syncer call: the call is no longer pending,
// its refund and credit are in Redis, its grant (if any) tops up the lease.
func (h *Limiter) applied(o op, res global.Lease, before, after int64) {
	c := o.c
	c.mu.Lock()
	for i, p := range c.pending {
		if p.Seq == o.args.Seq {
			c.pending = append(c.pending[:i], c.pending[i+1:]...)
			break
		}
	}
	c.mu.Unlock()
	h.st.refunded.Add(uint64(o.args.Refund))
	h.st.reported.Add(uint64(o.args.Use))
	if res.Superseded {
		return // not this call's reply: its grant, if any, stays unused in Redis
	}
	if !res.Replayed {
		h.observeTime(res.Now, before, after)
	}
	if o.args.Want > 0 {
		if res.Replayed {
			// The reply is as old as the call: its window may be over. The
			// grant is usable only if the window is still the current one.
			res.Reset -= h.startUS + before/1000 + h.offsetUS.Load() - res.Now
			if res.Reset <= 0 {
				c.mu.Lock()
				c.owe(res.Idx, res.Grant, 0)
				c.mu.Unlock()
				h.mark(c)
				return
			}
		}
		h.install(c, res, before, after)
	}
}
