package hybrid

import (
	"context"

	"github.com/hybridlimit/ratelimit"
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
	d, l, err := h.decide(ctx, key, estimate, nil)
	if err != nil {
		return nil, err
	}
	if !d.Allowed || l == nil {
		return ratelimit.NewReservation(d, estimate, nil), nil
	}
	return ratelimit.NewReservation(d, estimate, &settler{h: h, key: key, idx: l.idx, estimate: int64(estimate)}), nil
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
		h.tell(c, c.charge(h.p, a-s.estimate, h.mono(), h.facts()))
	}
	return nil
}
