// Package check validates the arguments of a decision, the same way in every
// limiter of the module (local, global, hybrid), before any work is done.
package check

import (
	"fmt"

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
