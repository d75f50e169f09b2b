package hybrid

import (
	"context"
	"fmt"
	"time"

	"github.com/hybridlimit/ratelimit"
)

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
	ctx, cancel := context.WithTimeout(ctx, h.cfg.drainTimeout())
	defer cancel()
	h.draining.Add(1)
	defer h.draining.Add(-1)
	lost := h.lostExacts.Load()
	h.retireAll()
	// A pass can leave debts behind (a grant that arrived in it goes back
	// as a debt), and a key whose decision's call is on its way is left
	// for the next pass: run passes until nothing is owed, waiting for
	// those calls between passes, a few at most.
	for i := 0; ; i++ {
		if err := h.syncer.Flush(ctx); err != nil {
			return err
		}
		// An exact call on its way may come back owing (its decision left).
		if h.syncer.Pending() == 0 && h.exacts.Load() == 0 {
			if n := h.lostExacts.Load() - lost; n > 0 {
				return fmt.Errorf("hybrid: flush: %d exact calls got no reply: their units may stay counted in Redis", n)
			}
			return nil
		}
		if i == maxFlushPasses {
			return fmt.Errorf("hybrid: flush: %d keys still owe Redis, %d exact calls unanswered, after %d passes", h.syncer.Pending(), h.exacts.Load(), i+1)
		}
		// Wait until no decision's lease call is queued or on its way.
		for !h.asks.idle() {
			t := time.NewTimer(time.Millisecond)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
		}
	}
}

// retireAll takes every key's leases away: what they hold becomes debts,
// which the syncer sends.
func (h *Limiter) retireAll() {
	now, f := h.mono(), h.facts()
	h.table.Range(func(_ string, c *counter) bool {
		lc := c.lock()
		owes := lc.retireAll(h.p, now, f)
		lc.unlock()
		if owes {
			h.tell(c, visitNow)
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
// side). A call the client itself does not give up on (a Cluster or Ring
// client without ContextTimeoutEnabled waits its ReadTimeout, 3s by
// default) ends on its own after Close returns.
func (h *Limiter) Close() error {
	h.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), h.cfg.drainTimeout())
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
		sctx, scancel := context.WithDeadline(ctx, dl.Add(-h.cfg.callTimeout()))
		h.closeErr = h.syncer.Close(sctx)
		scancel()
		if h.cfg.instances == 0 {
			hctx, hcancel := context.WithTimeout(ctx, h.cfg.timeout)
			h.health.heartbeat(hctx, false)
			hcancel()
		}
		h.stopSpent(ctx)
		h.pipe.runners.stop()
		waitOr(ctx, h.calls.Wait)
	})
	return h.closeErr
}

// waitOr runs wait and returns when it does or when ctx is done.
func waitOr(ctx context.Context, wait func()) {
	done := make(chan struct{})
	go func() { wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}
