package local

import (
	"context"
	"fmt"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/check"
	"github.com/hybridlimit/ratelimit/internal/memkey"
)

var _ ratelimit.Reserver = (*Limiter)(nil)

// Reserve decides as AllowN(ctx, key, estimate) and returns the decision as
// a ratelimit.Reservation, to be settled with the actual cost (see
// ratelimit.Reservation for the model, docs/algorithms.md for each
// algorithm's rule). Settling takes the key's shard lock once and never
// fails. It returns an error wrapping ratelimit.ErrInvalidAlgorithm for a
// SlidingLog Limiter, whose log of at most Rate events per key cannot hold
// an overdraft.
func (l *Limiter) Reserve(ctx context.Context, key string, estimate int) (*ratelimit.Reservation, error) {
	if l.alg == ratelimit.SlidingLog {
		return nil, fmt.Errorf("%w: SlidingLog cannot be reserved", ratelimit.ErrInvalidAlgorithm)
	}
	if err := check.Key(key); err != nil {
		return nil, err
	}
	if err := check.N(l.limit, l.alg, estimate); err != nil {
		return nil, err
	}
	var buf [memkey.DigestLen]byte
	tk := tableKey(key, &buf)
	now := l.now()
	s := l.table.shard(tk)
	s.mu.Lock()
	d := l.decision()
	l.decide(&d, l.entry(s, tk, now), now, int64(estimate), true)
	s.mu.Unlock()
	return reservation(d, estimate, l, key, now), nil
}

// settleKey applies a settlement to key's state.
func (l *Limiter) settleKey(key string, t0, est, actual int64) {
	var buf [memkey.DigestLen]byte
	key = tableKey(key, &buf)
	now := l.now()
	s := l.table.shard(key)
	s.mu.Lock()
	l.settle(l.entry(s, key, now), now, t0, est, actual)
	s.mu.Unlock()
}

// keySettler is a Limiter or a Multi: what a settlement applies to.
type keySettler interface {
	settleKey(key string, t0, est, actual int64)
}

// settlement settles one reservation of est events admitted at t0 on key;
// it takes the key's shard lock once and never fails.
type settlement struct {
	l       keySettler
	key     string
	t0, est int64
}

func (r *settlement) Settle(_ context.Context, actual int) error {
	r.l.settleKey(r.key, r.t0, r.est, int64(actual))
	return nil
}

// reservation returns the Reservation of decision d, taken at t0.
func reservation(d ratelimit.Decision, estimate int, l keySettler, key string, t0 int64) *ratelimit.Reservation {
	if !d.Allowed {
		return ratelimit.NewReservation(d, estimate, nil)
	}
	return ratelimit.NewReservation(d, estimate, &settlement{l: l, key: key, t0: t0, est: int64(estimate)})
}
