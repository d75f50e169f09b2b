// Package option is the functional-option plumbing that packages local,
// global, hybrid and sync share, so that all four apply their options by one
// rule and report a bad one the same way.
//
// Each of those packages keeps its own exported Option, in the style of
// go.uber.org/ratelimit: an interface whose one method, apply, is
// unexported, so that only the package's With functions make Options. That
// method cannot be named from here, so Apply takes it as a method
// expression:
//
//	type Option interface{ apply(*config) error }
//
//	type optionFunc func(*config) error
//
//	func (f optionFunc) apply(c *config) error { return f(c) }
//
//	func newConfig(opts []Option) (config, error) {
//		cfg := defaultConfig()
//		err := option.Apply(&cfg, opts, Option.apply)
//		return cfg, err
//	}
//
// The policy, the same in every package that uses Apply: options are
// applied in the order given, a later one overriding an earlier one of the
// same kind; a nil Option is ignored; the first Option that returns an
// error stops the application and its error is returned.
package option

import (
	"fmt"

	"github.com/hybridlimit/ratelimit"
)

// Apply applies opts to cfg in order, calling apply(o, cfg) for each, and
// returns the error of the first that fails, without applying the rest. A
// nil Option is skipped. O must be an interface type (a package's Option):
// nil is the nil interface value.
func Apply[C, O any](cfg *C, opts []O, apply func(O, *C) error) error {
	for _, o := range opts {
		if any(o) == nil {
			continue
		}
		if err := apply(o, cfg); err != nil {
			return err
		}
	}
	return nil
}

// Invalid returns the error of an option out of range: one wrapping
// ratelimit.ErrInvalidOption, its text that error's, ": ", and format
// filled with args as by fmt.Sprintf (args may hold an error for %w).
func Invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ratelimit.ErrInvalidOption}, args...)...)
}
