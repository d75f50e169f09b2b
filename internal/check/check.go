// Package check validates the arguments of a decision, the same way in every
// limiter of the module (local, global, hybrid), before any work is done.
package check

import (
	"fmt"
	"time"

	"github.com/hybridlimit/ratelimit"
)

// N validates a request of n events against l for algorithm a: n must be
// > 0 and at most l.Capacity(a) (Rate for the window algorithms, Burst or
// Rate for the buckets). The error wraps ratelimit.ErrInvalidN.
func N(l ratelimit.Limit, a ratelimit.Algorithm, n int) error {
	if n <= 0 {
		return fmt.Errorf("%w: n must be > 0, got %d", ratelimit.ErrInvalidN, n)
	}
	if c := l.Capacity(a); n > c {
		return fmt.Errorf("%w: n = %d exceeds the capacity %d of %v; it could never be admitted", ratelimit.ErrInvalidN, n, c, l)
	}
	return nil
}

// Key validates a key: it must not be empty. The error wraps
// ratelimit.ErrInvalidKey.
func Key(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", ratelimit.ErrInvalidKey)
	}
	return nil
}

// Limits validates the limits of a multi-limit limiter and their
// algorithms, given in the same order: between 1 and ratelimit.MaxLimits
// limits, as many algorithms, each limit valid (Limit.Validate; for GCRA,
// Period in microseconds at least Rate), each algorithm known, and no two
// limits with the same Algorithm and Period (the tighter makes the other
// moot: merge them). It returns an error wrapping ErrInvalidLimit,
// ErrInvalidAlgorithm or ErrInvalidOption that says which limit is wrong.
func Limits(limits []ratelimit.Limit, algs []ratelimit.Algorithm) error {
	switch {
	case len(limits) == 0:
		return fmt.Errorf("%w: no limits", ratelimit.ErrInvalidLimit)
	case len(limits) > ratelimit.MaxLimits:
		return fmt.Errorf("%w: %d limits, at most %d", ratelimit.ErrInvalidLimit, len(limits), ratelimit.MaxLimits)
	case len(algs) != len(limits):
		return fmt.Errorf("%w: %d algorithms for %d limits; give one per limit", ratelimit.ErrInvalidOption, len(algs), len(limits))
	}
	for i, l := range limits {
		a := algs[i]
		if !a.Valid() {
			return fmt.Errorf("%w: limit %d: %v", ratelimit.ErrInvalidAlgorithm, i, a)
		}
		if err := l.ValidateFor(a); err != nil {
			return fmt.Errorf("limit %d: %w", i, err)
		}
		if a == ratelimit.GCRA && int64(l.Period/time.Microsecond) < int64(l.Rate) {
			return fmt.Errorf("%w: limit %d: ratelimit.GCRA needs Period in microseconds >= Rate, got %v", ratelimit.ErrInvalidLimit, i, l)
		}
		for j := range i {
			if algs[j] == a && limits[j].Period == l.Period {
				return fmt.Errorf("%w: limits %d and %d are both %v per %v; merge them into one", ratelimit.ErrInvalidLimit, j, i, a, l.Period)
			}
		}
	}
	return nil
}

// NLimits validates a request of n events against every limit of a
// multi-limit limiter, as N does against one: n must be > 0 and within
// the capacity of each limit.
func NLimits(limits []ratelimit.Limit, algs []ratelimit.Algorithm, n int) error {
	if len(algs) != len(limits) {
		return fmt.Errorf("%w: %d algorithms for %d limits", ratelimit.ErrInvalidOption, len(algs), len(limits))
	}
	for i, l := range limits {
		if err := N(l, algs[i], n); err != nil {
			return err
		}
	}
	return nil
}
