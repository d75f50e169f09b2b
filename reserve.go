package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Errors of reservations. Test with errors.Is.
var (
	// ErrNotReserved: Settle with an actual > 0 on a Reservation that holds
	// nothing (a denied one, or nil): the work it would charge was not
	// admitted. Charge work done anyway with AllowN.
	ErrNotReserved = errors.New("ratelimit: nothing reserved")
	// ErrSettled: Settle with an actual other than the one a Reservation
	// was already settled with (Cancel is Settle with 0).
	ErrSettled = errors.New("ratelimit: reservation already settled")
)

// Reserver is implemented by limiters that can reserve quota for work whose
// cost is known only after it is done (tokens generated, bytes sent, rows
// scanned).
type Reserver interface {
	// Reserve decides as AllowN(ctx, key, estimate) does and returns the
	// decision as a Reservation, to be settled with the actual cost. The
	// errors are those of AllowN, with estimate in the place of n; a
	// limiter that cannot reserve with one of its algorithms returns an
	// error wrapping ErrInvalidAlgorithm.
	Reserve(ctx context.Context, key string, estimate int) (*Reservation, error)
}

// Settler applies the settlement of one admitted reservation: it is what a
// limiter gives NewReservation, and users never call it. A Reservation
// calls Settle with 0 <= actual <= 2^53 and actual != estimate (or
// after an earlier call failed), never concurrently, and never again once
// a call returned nil. After a call returned an error it may be called
// again, perhaps with another actual: whatever happened to the failed call
// (its reply lost, say), the Settler must apply at most one settlement in
// all, and report with an error wrapping ErrSettled a settlement already
// applied with another actual.
type Settler interface {
	Settle(ctx context.Context, actual int) error
}

// Reservation is quota held for work whose cost is known only after it: an
// estimate, taken when Reserve admitted it, and settled with the actual
// cost once that is known.
//
// The model, for every limiter and algorithm (docs/algorithms.md gives each
// algorithm's rule exactly):
//
//   - Reserve decides as AllowN with the estimate: an admitted reservation
//     consumed the estimate from every limit, a denied one consumed nothing
//     and holds nothing.
//   - Settle(actual) with actual below the estimate gives the difference
//     back to the window or bucket it was taken from, as long as that still
//     counts: a FixedWindow's window while it is the current one, a
//     SlidingWindow's while it is the current or the previous one; a bucket
//     (TokenBucket, GCRA) gets back what it has not refilled by itself
//     since the reservation. Past that, giving back would only add to a
//     later window, and is not done.
//   - Settle with actual above the estimate charges the excess to the
//     current window (or the bucket, now), even past the limit: an
//     overdraft, which denies the next requests until it is paid back (the
//     window ends, or the bucket refills).
//   - Settle is idempotent: a retry after an error (a lost reply, say)
//     applies the settlement at most once; Settle again with the same
//     actual after it succeeded returns nil and does nothing; with another
//     actual it returns an error wrapping ErrSettled.
//   - A reservation never settled keeps its estimate: the safe side.
//   - Cancel gives it all back: it is Settle with an actual of 0.
//
// A denied Reservation holds nothing: Cancel and Settle(ctx, 0) on it
// return nil and do nothing, and Settle with an actual > 0 returns an error
// wrapping ErrNotReserved. So does Settle on a nil *Reservation. The zero
// Reservation is a denied one.
//
// A Reservation is safe for concurrent use; its settlements are serialized.
// Settle with an actual equal to the estimate, before any failed attempt,
// changes nothing and does not call the limiter.
type Reservation struct {
	mu       sync.Mutex
	d        Decision
	estimate int
	s        Settler
	settled  bool // a settlement succeeded, with actual
	tried    bool // a settlement failed and may have been applied
	actual   int
}

// NewReservation returns a Reservation of estimate events decided by d,
// settled through s. Limiters call it from Reserve. s may be nil only when
// d is denied.
func NewReservation(d Decision, estimate int, s Settler) *Reservation {
	return &Reservation{d: d, estimate: estimate, s: s}
}

// OK reports whether the reservation was admitted (its Decision is
// Allowed).
func (r *Reservation) OK() bool { return r != nil && r.d.Allowed }

// Decision returns the decision Reserve took. The zero Decision for a nil
// Reservation.
func (r *Reservation) Decision() Decision {
	if r == nil {
		return Decision{}
	}
	return r.d
}

// Estimate returns the events the reservation asked for.
func (r *Reservation) Estimate() int {
	if r == nil {
		return 0
	}
	return r.estimate
}

// Settled returns the actual the reservation was settled with, and whether
// it was. A Reservation never settled returns (0, false).
func (r *Reservation) Settled() (actual int, ok bool) {
	if r == nil {
		return 0, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.actual, r.settled
}

// Settle settles the reservation with the actual cost of the work, per the
// model of Reservation. It returns an error wrapping ErrInvalidN for an
// actual below 0 or above 2^53; ErrNotReserved for an actual > 0 on a
// denied or nil Reservation; ErrSettled for an actual other than the one
// already settled with; and the limiter's error (Redis', ctx's) when the
// settlement could not be confirmed, in which case Settle may be called
// again and applies it at most once.
func (r *Reservation) Settle(ctx context.Context, actual int) error {
	if actual < 0 || actual > maxExact {
		return fmt.Errorf("%w: actual must be in [0, %d], got %d", ErrInvalidN, maxExact, actual)
	}
	if r == nil {
		if actual == 0 {
			return nil
		}
		return fmt.Errorf("%w: nil Reservation", ErrNotReserved)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case !r.d.Allowed:
		if actual == 0 {
			return nil
		}
		return fmt.Errorf("%w: the reservation of %d was denied; charge work done anyway with AllowN", ErrNotReserved, r.estimate)
	case r.settled:
		if actual == r.actual {
			return nil
		}
		return fmt.Errorf("%w: with %d, not %d", ErrSettled, r.actual, actual)
	case actual == r.estimate && !r.tried:
		r.settled, r.actual = true, actual
		return nil
	case r.s == nil:
		return fmt.Errorf("%w: admitted reservation without a Settler", ErrNotReserved)
	}
	if err := r.s.Settle(ctx, actual); err != nil {
		r.tried = true
		return err
	}
	r.settled, r.actual = true, actual
	return nil
}

// Cancel gives the whole reservation back: it is Settle(ctx, 0).
func (r *Reservation) Cancel(ctx context.Context) error { return r.Settle(ctx, 0) }
