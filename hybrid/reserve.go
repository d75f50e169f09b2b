package hybrid

import (
	"context"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/check"
)

var _ ratelimit.Reserver = (*Limiter)(nil)

// Reserve decides as AllowN(ctx, key, estimate) does and returns the
// decision as a Reservation, to be settled with the actual cost once it is
// known (see ratelimit.Reservation for the model).
//
// A reservation is settled in memory, against the instance's lease: Settle
// never waits on Redis. A smaller actual gives the difference back to the
// lease while its window still counts (FixedWindow: the current window;
// SlidingWindow: the current or the previous one; a bucket: always), where
// the instance's next decisions take it or the syncer refunds it to Redis;
// a window that no longer counts drops it. A larger actual takes the excess
// from the lease in hand and charges the rest to the current window (or
// the bucket) on credit, even past the limit: the syncer reports it, and
// the fleet's next leases are denied until it is paid back. Settle returns
// ratelimit.ErrClosed after Close (the reservation keeps its estimate).
//
// The errors are those of AllowN, with estimate in the place of n.
func (h *Limiter) Reserve(ctx context.Context, key string, estimate int) (*ratelimit.Reservation, error) {
	if h.closed.Load() {
		return nil, ratelimit.ErrClosed
	}
	if key == "" {
		return nil, check.Key(key)
	}
	if estimate <= 0 || int64(estimate) > h.capacity {
		return nil, check.N(h.limit, h.cfg.algorithm, estimate)
	}
	d, l, err := h.take(ctx, h.lookup(key), key, int64(estimate), nil)
	if err != nil {
		return nil, err
	}
	if !d.Allowed || l == nil {
		return ratelimit.NewReservation(d, estimate, nil), nil
	}
	return ratelimit.NewReservation(d, estimate, &settler{h: h, key: key, idx: l.idx, estimate: int64(estimate)}), nil
}

// take decides n for c as AllowN does and returns the lease an admission
// took n from (or holds its credit on).
func (h *Limiter) take(ctx context.Context, c *counter, key string, n int64, expired <-chan struct{}) (ratelimit.Decision, *lease, error) {
	if d, l, ok := h.fast(c, n, h.mono()); ok {
		return d, l, nil
	}
	return h.slow(ctx, c, key, n, expired)
}

// settler settles one admitted reservation of the hybrid: estimate units
// taken in window idx (0 for a bucket) of key.
type settler struct {
	h        *Limiter
	key      string
	idx      int64
	estimate int64
}

func (s *settler) Settle(_ context.Context, actual int) error {
	h := s.h
	if h.closed.Load() {
		return ratelimit.ErrClosed
	}
	c := h.lookup(s.key)
	switch a := int64(actual); {
	case a < s.estimate:
		h.giveBack(c, s.idx, s.estimate-a)
	case a > s.estimate:
		h.charge(c, a-s.estimate)
	}
	return nil
}

// giveBack returns n units a decision took in window idx: into the lease
// in hand when it is of that window (the instance's next decisions take
// them), else as a refund the syncer sends, unless the window no longer
// counts (see moot). Whether the decision took from the lease or on credit,
// the units are the instance's to give: credit is reported to Redis all
// the same.
func (h *Limiter) giveBack(c *counter, idx, n int64) {
	mono := h.mono()
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.cur.Load(); l != nil && l.idx == idx && mono < l.end {
		l.avail.Add(n)
		return
	}
	if h.moot(idx, mono) {
		c.expired += n
		return
	}
	c.owe(idx, n, 0)
	h.mark(c)
}

// charge takes n units for work already done, even past the limit: from
// the lease in hand as far as it goes, the rest on credit against the
// current window (or the bucket), outside any credit budget. The syncer
// reports the credit; Redis then counts the window over its limit (or the
// bucket below empty) and grants nothing until it is paid back.
func (h *Limiter) charge(c *counter, n int64) {
	mono := h.mono()
	if l := c.cur.Load(); l != nil && mono < l.end {
		for {
			a := l.avail.Load()
			t := min(a, n)
			if t <= 0 {
				break
			}
			if l.avail.CompareAndSwap(a, a-t) {
				l.tick.Add(uint64(t))
				n -= t
				break
			}
		}
	}
	if n == 0 {
		return
	}
	l := h.currentLease(c, mono)
	for {
		b := l.borrowed.Load()
		if b >= closedBudget { // replaced meanwhile: charge its successor
			l = h.currentLease(c, mono)
			continue
		}
		if l.borrowed.CompareAndSwap(b, b+n) {
			l.credit.Add(n)
			l.tick.Add(uint64(n))
			break
		}
	}
	h.soon(c)
}
